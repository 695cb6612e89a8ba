/* smla/smla.h — the C ABI of smla, for FFI callers (Rust, Go, C servers).
 *
 * Opaque handles, plain C structs, status codes and a per-thread last-error message. No C++ type
 * crosses this boundary. Pointers in smla_run_args are device pointers for the CUDA backend and
 * host pointers for the CPU backend; strides are in elements.
 */
#ifndef SMLA_SMLA_H_
#define SMLA_SMLA_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum smla_status {
  SMLA_OK = 0,
  SMLA_ERROR_INVALID_ARGUMENT = 1, /* bad shape, dtype, stride, pointer or workspace size */
  SMLA_ERROR_UNSUPPORTED = 2,      /* the geometry has no backend here: the message says what to use */
  SMLA_ERROR_INTERNAL = 3
} smla_status;

typedef enum smla_kv_format {
  SMLA_KV_BF16 = 0, SMLA_KV_FP16 = 1, SMLA_KV_FP8_E4M3 = 2, SMLA_KV_FP8_DS_MLA = 3, SMLA_KV_NVFP4_DS_MLA = 4
} smla_kv_format;
typedef enum smla_dtype { SMLA_BF16 = 0, SMLA_FP16 = 1, SMLA_FP32 = 2, SMLA_E4M3 = 3 } smla_dtype;
typedef enum smla_lse_mode { SMLA_LSE_OFF = 0, SMLA_LSE_BASE_E = 1, SMLA_LSE_BASE_2 = 2 } smla_lse_mode;
typedef enum smla_backend { SMLA_BACKEND_CPU = 0, SMLA_BACKEND_CUDA = 1 } smla_backend;
/* How q·k is multiplied: bf16 (LSE within 1e-3) or, for an e4m3 q with an fp8 cache, on the fp8 tensor
 * cores (faster; LSE within ~1e-2). SMLA_SCORE_AUTO (the default) picks fp8 for an e4m3 q with an fp8
 * cache and bf16 otherwise. */
typedef enum smla_score_precision {
  SMLA_SCORE_BF16 = 0, SMLA_SCORE_FP8 = 1, SMLA_SCORE_AUTO = 2
} smla_score_precision;

typedef struct smla_plan smla_plan; /* opaque, immutable, thread-safe */

typedef struct smla_plan_config {
  int32_t num_heads;
  int32_t rope_dim;     /* 64 or 0 */
  int32_t kv_format;    /* smla_kv_format */
  int32_t q_dtype;      /* smla_dtype: bf16, fp16 or e4m3 */
  int32_t topk;         /* capacity K */
  int32_t lse_mode;     /* smla_lse_mode */
  int32_t sink;         /* 0 or 1 */
  int32_t batch_invariant;
  int32_t backend;      /* smla_backend */
  int32_t device;
  int64_t max_rows;
  const int64_t* graph_sizes; /* nullable, num_graph_sizes entries */
  int32_t num_graph_sizes;
  int32_t score_precision; /* smla_score_precision (smla_plan_config_init: SMLA_SCORE_AUTO) */
} smla_plan_config;

typedef struct smla_run_args {
  int64_t num_tokens;
  const void* q;        /* [T, H, D] (or [T, H, 512] with q_rope) */
  int64_t q_stride_t, q_stride_h;
  const void* q_rope;   /* nullable [T, H, 64] */
  int64_t q_rope_stride_t, q_rope_stride_h;
  const void* kv;       /* row r at kv + r * kv_row_stride_bytes */
  int64_t num_rows, kv_row_stride_bytes;
  const int32_t* idx;   /* [T, K] */
  int64_t idx_stride_t;
  int32_t topk;
  const int32_t* counts; /* nullable [T] */
  const float* sink;     /* nullable [H] */
  float softmax_scale, q_scale, k_scale;
  void* out;             /* [T, H, 512] */
  int64_t out_stride_t, out_stride_h;
  int32_t out_dtype;     /* smla_dtype */
  float* lse;            /* nullable [T, H] */
  int64_t lse_stride_t;
} smla_run_args;

/* Fills *cfg with defaults: H 128, D 576, bf16, K 2048, LSE base e, bf16 scores, CUDA backend, max_rows 1. */
void smla_plan_config_init(smla_plan_config* cfg);
/* Fills *args with zeros and scales of 1 (softmax_scale 0: the caller must set it). */
void smla_run_args_init(smla_run_args* args);

smla_status smla_plan_create(const smla_plan_config* cfg, smla_plan** out_plan);
void smla_plan_destroy(smla_plan* plan);
smla_status smla_plan_workspace_bytes(const smla_plan* plan, size_t* out_bytes);
/* stream: a cudaStream_t (NULL: the default stream); ignored by the CPU backend. */
smla_status smla_run(const smla_plan* plan, const smla_run_args* args, void* workspace, size_t workspace_bytes,
                     void* stream);

/* ---- HiSparse: the host-backed tiered KV cache (C++ smla/tiered.h, DESIGN.md 4b).
 * A plan of a tiered cache (sizes of the hot buffer, state and workspace the caller allocates),
 * the per-step resolver on the CPU reference (host pointers) or the CUDA backend (device pointers;
 * the host pool pinned), state reset and the device counters. */
typedef struct smla_tiered_cache smla_tiered_cache; /* opaque, immutable */

typedef struct smla_tiered_config {
  int32_t kv_format;              /* smla_kv_format */
  int32_t rope_dim;               /* 64 or 0 */
  int32_t topk;                   /* K */
  int32_t hot_slots;              /* R per request; 0: round_up(2K + 1, 128) */
  int32_t max_requests;
  int32_t max_tokens_per_request; /* refused unless max_tokens_per_request * K + 1 <= R */
  int64_t max_positions;          /* longest request */
  int64_t hot_row_stride_bytes;   /* 0: the row bytes */
} smla_tiered_config;

typedef struct smla_tiered_sizes {
  int32_t hot_slots, row_bytes;
  int64_t hot_rows, hot_row_stride_bytes; /* the hot buffer: hot_rows rows (num_rows for smla_run) */
  size_t hot_buffer_bytes, state_bytes, workspace_bytes, device_bytes;
} smla_tiered_sizes;

/* One step; mirrors smla::TieredResolveParams (strides in elements). */
typedef struct smla_tiered_step {
  int64_t num_tokens;
  const int32_t* positions; /* [T, K] request-local, -1 padded */
  int64_t pos_stride_t;
  int32_t topk;
  const int32_t* req_of_token; /* nullable [T] */
  int32_t num_reqs;
  const int32_t* seq_lens;  /* [num_reqs] */
  const void* pool;         /* host pool, row r at pool + r * pool_row_stride_bytes */
  int64_t pool_rows, pool_row_stride_bytes;
  const int32_t* block_table; /* [num_reqs, max_blocks] */
  int64_t bt_stride;
  int32_t max_blocks, block_size;
  int64_t block_stride_rows;
  void* hot;
  size_t hot_bytes;
  void* state;
  size_t state_bytes;
  void* workspace; /* CUDA only */
  size_t workspace_bytes;
  int32_t* phys;   /* [T, K] out */
  int64_t phys_stride_t;
  int32_t* counts; /* nullable [T] out */
} smla_tiered_step;

typedef struct smla_tiered_counters {
  uint64_t hits, misses, bytes, errors;
  uint32_t steps;
} smla_tiered_counters;

/* Defaults: fp8_ds_mla, rope 64, K 2048, R default, 1 request, 1 token, 131072 positions. */
void smla_tiered_config_init(smla_tiered_config* cfg);
smla_status smla_tiered_create(const smla_tiered_config* cfg, smla_tiered_cache** out_cache);
void smla_tiered_destroy(smla_tiered_cache* cache);
smla_status smla_tiered_get_sizes(const smla_tiered_cache* cache, smla_tiered_sizes* out_sizes);
/* backend: smla_backend (CPU: host state; CUDA: device state, memsets on stream). release_req < 0:
 * reset the whole state; otherwise forget that request's hot rows. */
smla_status smla_tiered_reset(const smla_tiered_cache* cache, int32_t backend, void* state, size_t state_bytes,
                              int32_t release_req, void* stream);
/* Forgets the hot rows of single positions (req[i], pos[i]; negative: skipped), e.g. after
 * rejected speculative tokens were overwritten in the pool. */
smla_status smla_tiered_invalidate(const smla_tiered_cache* cache, int32_t backend, void* state, size_t state_bytes,
                                   const int32_t* req, const int32_t* pos, int64_t n, void* stream);
smla_status smla_tiered_resolve(const smla_tiered_cache* cache, int32_t backend, const smla_tiered_step* step,
                                void* stream);
/* Copies the counters (CUDA: synchronizes stream). */
smla_status smla_tiered_read_counters(const smla_tiered_cache* cache, int32_t backend, const void* state,
                                      void* stream, smla_tiered_counters* out_counters);
/* The largest decode batch whose tiered device bytes plus attention_workspace_per_row * rows fit
 * budget_bytes (cfg->max_requests ignored); 0 when none. */
smla_status smla_tiered_max_decode_batch(const smla_tiered_config* cfg, size_t budget_bytes,
                                         size_t attention_workspace_per_row, int64_t* out_batch);

/* The message of the last failed call on this thread ("" after a success). */
const char* smla_last_error(void);

#ifdef __cplusplus
}
#endif

#endif /* SMLA_SMLA_H_ */
