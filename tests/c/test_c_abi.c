/* The C ABI from a C program: a CPU plan, a run checked against hand-computed values, and refused
 * calls with their status codes and messages. Prints "N passed, N failed". */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "smla/smla.h"

static int g_pass = 0, g_fail = 0;
#define EXPECT(cond)                                                     \
  do {                                                                   \
    if (cond) { ++g_pass; } else { ++g_fail; fprintf(stderr, "FAILED %s:%d: %s (last error: %s)\n", \
                                                     __FILE__, __LINE__, #cond, smla_last_error()); } \
  } while (0)

/* bf16 bit pattern of a small integer-valued float (exact). */
static uint16_t bf16(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  return (uint16_t)(u >> 16);
}
static float from_bf16(uint16_t b) {
  uint32_t u = (uint32_t)b << 16;
  float x;
  memcpy(&x, &u, 4);
  return x;
}

int main(void) {
  enum { T = 2, H = 2, D = 576, K = 4, N = 3 };
  smla_plan_config cfg;
  smla_plan_config_init(&cfg);
  cfg.backend = SMLA_BACKEND_CPU;
  cfg.num_heads = H;
  cfg.topk = K;
  cfg.max_rows = 8;
  smla_plan* plan = NULL;
  EXPECT(smla_plan_create(&cfg, &plan) == SMLA_OK && plan != NULL);
  size_t ws = 123;
  EXPECT(smla_plan_workspace_bytes(plan, &ws) == SMLA_OK && ws == 0);

  /* q = 0: every score is 0, so out is the plain mean of the valid rows' latent values.
   * Row r holds r + 1 in every element. Row 0 selects {0, 2, -1, 7 (out of range)} -> mean 2,
   * LSE log 2; row 1 selects only invalid entries -> out 0, LSE -inf. */
  static uint16_t q[T * H * D], kv[N * D], out[T * H * 512];
  static float lse[T * H];
  int32_t idx[T * K] = {0, 2, -1, 7, -1, -5, 3, 100};
  for (int r = 0; r < N; ++r)
    for (int d = 0; d < D; ++d) kv[r * D + d] = bf16((float)(r + 1));
  for (int i = 0; i < T * H * 512; ++i) out[i] = 0xffff; /* NaN poison */
  for (int i = 0; i < T * H; ++i) lse[i] = NAN;

  smla_run_args a;
  smla_run_args_init(&a);
  a.num_tokens = T;
  a.q = q, a.q_stride_t = H * D, a.q_stride_h = D;
  a.kv = kv, a.num_rows = N, a.kv_row_stride_bytes = 2 * D;
  a.idx = idx, a.idx_stride_t = K, a.topk = K;
  a.softmax_scale = 0.1352338f;
  a.out = out, a.out_stride_t = H * 512, a.out_stride_h = 512, a.out_dtype = SMLA_BF16;
  a.lse = lse, a.lse_stride_t = H;
  EXPECT(smla_run(plan, &a, NULL, 0, NULL) == SMLA_OK);
  EXPECT(strcmp(smla_last_error(), "") == 0);
  int ok0 = 1, ok1 = 1;
  for (int h = 0; h < H; ++h)
    for (int d = 0; d < 512; ++d) {
      ok0 &= from_bf16(out[(0 * H + h) * 512 + d]) == 2.0f;
      ok1 &= from_bf16(out[(1 * H + h) * 512 + d]) == 0.0f;
    }
  EXPECT(ok0);
  EXPECT(ok1);
  EXPECT(fabsf(lse[0] - logf(2.0f)) < 1e-6f && fabsf(lse[1] - logf(2.0f)) < 1e-6f);
  EXPECT(isinf(lse[2]) && lse[2] < 0 && isinf(lse[3]) && lse[3] < 0);

  /* Refused calls: a null q, a K past the planned capacity, more rows than planned. */
  smla_run_args bad = a;
  bad.q = NULL;
  EXPECT(smla_run(plan, &bad, NULL, 0, NULL) == SMLA_ERROR_INVALID_ARGUMENT);
  EXPECT(strstr(smla_last_error(), "q is null") != NULL);
  bad = a;
  bad.topk = K + 1, bad.idx_stride_t = K + 1;
  EXPECT(smla_run(plan, &bad, NULL, 0, NULL) == SMLA_ERROR_INVALID_ARGUMENT);
  EXPECT(strstr(smla_last_error(), "capacity") != NULL);
  bad = a;
  bad.num_tokens = 9;
  EXPECT(smla_run(plan, &bad, NULL, 0, NULL) == SMLA_ERROR_INVALID_ARGUMENT);
  EXPECT(strstr(smla_last_error(), "max_rows") != NULL);
  EXPECT(smla_run(NULL, &a, NULL, 0, NULL) == SMLA_ERROR_INVALID_ARGUMENT);
  smla_plan_destroy(plan);

  /* An unsupported geometry: head size 600. */
  smla_plan_config odd = cfg;
  odd.rope_dim = 88;
  smla_plan* p2 = NULL;
  EXPECT(smla_plan_create(&odd, &p2) == SMLA_ERROR_UNSUPPORTED && p2 == NULL);
  EXPECT(strstr(smla_last_error(), "576") != NULL);

  /* fp8 scores need an e4m3 q with an fp8 cache; an unknown precision is a bad argument. */
  odd = cfg;
  odd.score_precision = SMLA_SCORE_FP8;
  EXPECT(smla_plan_create(&odd, &p2) == SMLA_ERROR_UNSUPPORTED && p2 == NULL);
  EXPECT(strstr(smla_last_error(), "score precision fp8") != NULL);
  odd.score_precision = 7;
  EXPECT(smla_plan_create(&odd, &p2) == SMLA_ERROR_INVALID_ARGUMENT && p2 == NULL);
  EXPECT(strstr(smla_last_error(), "score_precision") != NULL);

  printf("%d passed, %d failed\n", g_pass, g_fail);
  return g_fail == 0 ? 0 : 1;
}
