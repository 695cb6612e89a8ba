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
/* How q·k is multiplied: bf16 (default; LSE within 1e-3) or, for an e4m3 q with an fp8 cache, on the
 * fp8 tensor cores (faster; LSE within ~1e-2). */
typedef enum smla_score_precision { SMLA_SCORE_BF16 = 0, SMLA_SCORE_FP8 = 1 } smla_score_precision;

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
  int32_t score_precision; /* smla_score_precision (smla_plan_config_init: SMLA_SCORE_BF16) */
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

/* The message of the last failed call on this thread ("" after a success). */
const char* smla_last_error(void);

#ifdef __cplusplus
}
#endif

#endif /* SMLA_SMLA_H_ */
