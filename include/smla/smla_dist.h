/* smla/smla_dist.h — the C ABI of smla's NCCL steps (link smla_dist): ShardQ prefill (DESIGN.md §5b,
 * the C++ class smla::dist::ShardQ of smla/dist.h). Same conventions as smla/smla.h: opaque handles,
 * plain structs, status codes, smla_last_error(). The communicator is the caller's ncclComm_t, passed
 * as void*; every pointer in a step is a device pointer of the communicator's device. In a build
 * without NCCL every function returns SMLA_ERROR_UNSUPPORTED.
 */
#ifndef SMLA_SMLA_DIST_H_
#define SMLA_SMLA_DIST_H_

#include <stddef.h>
#include <stdint.h>

#include "smla/smla.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct smla_shardq smla_shardq; /* opaque; one per (communicator, configuration) */

typedef struct smla_shardq_config {
  int32_t world;           /* W ranks */
  int32_t rank;
  int32_t num_heads;       /* H, all heads; a multiple of W (each rank holds H / W); <= 128 */
  int32_t rope_dim;        /* 64 or 0 */
  int32_t kv_format;       /* smla_kv_format */
  int32_t q_dtype;         /* smla_dtype: bf16, fp16 or e4m3; out is fp16 for an fp16 q, else bf16 */
  int32_t score_precision; /* smla_score_precision (init: smla_plan_config_init's, the Plan's default) */
  int32_t sink;            /* 0 or 1: the step takes sink [H] */
  int32_t topk;            /* K */
  int32_t max_requests;    /* most requests in a step */
  int64_t max_tokens;      /* largest T of a step */
  int32_t timeout_ms;      /* a peer that stops taking part gives an error after this long (from the step's enqueue) */
  int32_t watchdog;        /* 0 or 1 (init 1): the handle's watchdog thread aborts the communicator when a step has
                              not finished timeout_ms after smla_shardq_step; 0: only smla_shardq_wait bounds a step */
  int32_t terminate_on_stuck_call; /* 0 or 1 (init 1): on a blocking communicator, a host call stuck in NCCL past
                              timeout_ms ends the process (reason on stderr) instead of waiting for NCCL's timeouts */
} smla_shardq_config;

typedef struct smla_shardq_step_args {
  int64_t num_tokens;          /* T, the same on every rank */
  int32_t num_requests;        /* R, the same on every rank; >= 1 when T > 0 */
  const int32_t* cu_seqlens;   /* [R + 1]: cu[0] = 0, non-decreasing, cu[R] = T */
  const void* q;               /* [T, H / W, D] dense, 16-byte aligned: this rank's heads */
  const int32_t* idx;          /* [T, K] physical rows of the replicated cache, -1 padded */
  int64_t idx_stride_t;        /* 0: K */
  const int32_t* counts;       /* nullable [T] */
  const float* sink;           /* [H] when the config has sink */
  const void* kv;              /* row r at kv + r * kv_row_stride_bytes */
  int64_t num_rows, kv_row_stride_bytes;
  float softmax_scale, q_scale, k_scale;
  void* out;                   /* [T, H / W, 512] dense, 16-byte aligned */
  float* lse;                  /* nullable [T, H / W], natural log */
} smla_shardq_step_args;

/* Defaults: world 1, rank 0, H 128, rope 64, bf16 cache and q, a plan's default scores, no sink, K 2048,
 * 1 request, 1 token, timeout 10 s, watchdog on, terminate_on_stuck_call on (as smla::dist::ShardqConfig). */
void smla_shardq_config_init(smla_shardq_config* cfg);
/* Zeros, with q_scale = k_scale = 1. */
void smla_shardq_step_args_init(smla_shardq_step_args* args);
smla_status smla_shardq_create(void* nccl_comm, const smla_shardq_config* cfg, smla_shardq** out);
void smla_shardq_destroy(smla_shardq* sq);
/* Device workspace bytes a step needs, and the token slots per rank it is padded to. */
smla_status smla_shardq_workspace_bytes(const smla_shardq* sq, size_t* out_bytes);
smla_status smla_shardq_slots(const smla_shardq* sq, int64_t* out_slots);
/* Enqueues one step on `stream` (a cudaStream_t); allocation-free, legal in CUDA-graph capture. */
smla_status smla_shardq_step(smla_shardq* sq, const smla_shardq_step_args* args, void* workspace,
                             size_t workspace_bytes, void* stream);
/* Waits for `stream`; an NCCL error, the watchdog's abort, a step past timeout_ms or a malformed cu_seqlens
 * is an error. */
smla_status smla_shardq_wait(smla_shardq* sq, void* stream, int32_t timeout_ms);
/* *out_aborted = 1 once the communicator was aborted (a peer stopped taking part): every later step and wait
 * fails; make a new communicator and handle. ncclCommAbort freed the aborted one: do not ncclCommDestroy it. */
smla_status smla_shardq_aborted(const smla_shardq* sq, int32_t* out_aborted);

#ifdef __cplusplus
}
#endif

#endif /* SMLA_SMLA_DIST_H_ */
