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
  /* The score precision defaults to auto (fp8 for an e4m3 q with an fp8 cache, else bf16); the
   * enum's earlier values keep their numbers. */
  EXPECT(cfg.score_precision == SMLA_SCORE_AUTO);
  EXPECT(SMLA_SCORE_BF16 == 0 && SMLA_SCORE_FP8 == 1 && SMLA_SCORE_AUTO == 2);
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
  EXPECT(strstr(smla_last_error(), "SMLA_SCORE_AUTO") != NULL);
  /* auto and bf16 plan a bf16 q; auto, bf16 and fp8 an e4m3 q with an fp8 cache (the CPU backend
   * sums in float64 whatever the precision). */
  {
    const int32_t precisions[] = {SMLA_SCORE_AUTO, SMLA_SCORE_BF16, SMLA_SCORE_FP8};
    for (int i = 0; i < 3; ++i) {
      odd = cfg;
      odd.score_precision = precisions[i];
      if (precisions[i] != SMLA_SCORE_FP8) {
        EXPECT(smla_plan_create(&odd, &p2) == SMLA_OK && p2 != NULL);
        smla_plan_destroy(p2), p2 = NULL;
      }
      odd.q_dtype = SMLA_E4M3, odd.kv_format = SMLA_KV_FP8_DS_MLA;
      EXPECT(smla_plan_create(&odd, &p2) == SMLA_OK && p2 != NULL);
      smla_plan_destroy(p2), p2 = NULL;
    }
  }
  /* HiSparse tiered cache on the CPU backend: K = 3, R = 4 (slots 0..2, 3 the newest), one request. */
  {
    smla_tiered_config tcfg;
    smla_tiered_config_init(&tcfg);
    EXPECT(tcfg.topk == 2048 && tcfg.kv_format == SMLA_KV_FP8_DS_MLA);
    tcfg.kv_format = SMLA_KV_BF16, tcfg.topk = 3, tcfg.hot_slots = 3, tcfg.max_positions = 16;
    smla_tiered_cache* tc = NULL;
    EXPECT(smla_tiered_create(&tcfg, &tc) == SMLA_ERROR_INVALID_ARGUMENT && tc == NULL); /* 1 x 3 + 1 > 3 */
    EXPECT(strstr(smla_last_error(), "at least 4") != NULL);
    tcfg.hot_slots = 4;
    EXPECT(smla_tiered_create(&tcfg, &tc) == SMLA_OK && tc != NULL);
    smla_tiered_sizes sz;
    EXPECT(smla_tiered_get_sizes(tc, &sz) == SMLA_OK && sz.hot_slots == 4 && sz.row_bytes == 1152 && sz.hot_rows == 4);
    static uint8_t tpool[16 * 1152], thot[4 * 1152], tstate[1 << 14];
    for (int i = 0; i < 16 * 1152; ++i) tpool[i] = (uint8_t)(i / 1152 * 3 + 1);
    EXPECT(sz.state_bytes <= sizeof tstate);
    EXPECT(smla_tiered_reset(tc, SMLA_BACKEND_CPU, tstate, sizeof tstate, -1, NULL) == SMLA_OK);
    int32_t tpos[3] = {5, 2, 9}, tlen = 10, ttable[1] = {0}, tphys[3], tcount = 0;
    smla_tiered_step st;
    memset(&st, 0, sizeof st);
    st.num_tokens = 1, st.positions = tpos, st.pos_stride_t = 3, st.topk = 3, st.num_reqs = 1, st.seq_lens = &tlen;
    st.pool = tpool, st.pool_rows = 16, st.pool_row_stride_bytes = 1152;
    st.block_table = ttable, st.bt_stride = 1, st.max_blocks = 1, st.block_size = 16, st.block_stride_rows = 16;
    st.hot = thot, st.hot_bytes = sizeof thot, st.state = tstate, st.state_bytes = sizeof tstate;
    st.phys = tphys, st.phys_stride_t = 3, st.counts = &tcount;
    EXPECT(smla_tiered_resolve(tc, SMLA_BACKEND_CPU, &st, NULL) == SMLA_OK);
    /* 9 is the newest (slot 3); misses 2 and 5 take slots 0 and 1, in position order. */
    EXPECT(tcount == 3 && tphys[0] == 1 && tphys[1] == 0 && tphys[2] == 3);
    EXPECT(thot[0] == 2 * 3 + 1 && thot[1152] == 5 * 3 + 1);
    smla_tiered_counters k;
    EXPECT(smla_tiered_read_counters(tc, SMLA_BACKEND_CPU, tstate, NULL, &k) == SMLA_OK);
    EXPECT(k.misses == 2 && k.hits == 1 && k.steps == 1 && k.bytes == 2 * 1152);
    { /* position 5 forgotten: the next step copies it again */
      const int32_t ireq[1] = {0}, ipos[1] = {5};
      EXPECT(smla_tiered_invalidate(tc, SMLA_BACKEND_CPU, tstate, sizeof tstate, ireq, ipos, 1, NULL) == SMLA_OK);
      EXPECT(smla_tiered_resolve(tc, SMLA_BACKEND_CPU, &st, NULL) == SMLA_OK);
      EXPECT(smla_tiered_read_counters(tc, SMLA_BACKEND_CPU, tstate, NULL, &k) == SMLA_OK && k.misses == 3);
    }
    tlen = 17; /* past max_positions */
    EXPECT(smla_tiered_resolve(tc, SMLA_BACKEND_CPU, &st, NULL) == SMLA_ERROR_INVALID_ARGUMENT);
    EXPECT(strstr(smla_last_error(), "max_positions") != NULL);
    int64_t batch = -1;
    tcfg.max_requests = 1;
    EXPECT(smla_tiered_max_decode_batch(&tcfg, 1 << 20, 0, &batch) == SMLA_OK && batch > 0);
    smla_tiered_destroy(tc);
  }

  printf("%d passed, %d failed\n", g_pass, g_fail);
  return g_fail == 0 ? 0 : 1;
}
