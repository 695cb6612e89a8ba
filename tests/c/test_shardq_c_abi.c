/* The ShardQ C ABI (smla/smla_dist.h) from a C program, without a GPU: defaults, and refused calls with
 * their status codes and messages (a null or missing communicator, a bad configuration, null handles).
 * The step itself runs through it in no test yet: it needs a communicator (tests/dist, C++).
 * Prints "N passed, N failed". */
#include <stdio.h>
#include <string.h>

#include "smla/smla_dist.h"

static int g_pass = 0, g_fail = 0;
#define EXPECT(cond)                                                                                    \
  do {                                                                                                  \
    if (cond) {                                                                                         \
      ++g_pass;                                                                                         \
    } else {                                                                                            \
      ++g_fail;                                                                                         \
      fprintf(stderr, "FAILED %s:%d: %s (last error: %s)\n", __FILE__, __LINE__, #cond, smla_last_error()); \
    }                                                                                                   \
  } while (0)

static int has(const char* needle) { return strstr(smla_last_error(), needle) != NULL; }

int main(void) {
  smla_shardq_config cfg;
  smla_shardq_config_init(&cfg);
  EXPECT(cfg.world == 1 && cfg.rank == 0 && cfg.num_heads == 128 && cfg.rope_dim == 64);
  smla_plan_config plan_defaults;
  smla_plan_config_init(&plan_defaults);
  EXPECT(cfg.kv_format == SMLA_KV_BF16 && cfg.q_dtype == SMLA_BF16 && cfg.score_precision == plan_defaults.score_precision);
  EXPECT(cfg.sink == 0 && cfg.topk == 2048 && cfg.max_requests == 1 && cfg.max_tokens == 1 && cfg.timeout_ms == 10000);
  EXPECT(cfg.watchdog == 1 && cfg.terminate_on_stuck_call == 1);
  smla_shardq_step_args args;
  smla_shardq_step_args_init(&args);
  EXPECT(args.num_tokens == 0 && args.q == NULL && args.q_scale == 1.0f && args.k_scale == 1.0f);

  smla_shardq* sq = (smla_shardq*)&cfg; /* must be reset to NULL by a failed create */
#if SMLA_HAVE_NCCL
  EXPECT(smla_shardq_create(NULL, &cfg, &sq) == SMLA_ERROR_INVALID_ARGUMENT && has("communicator is null"));
  EXPECT(sq == NULL);
  cfg.world = 4, cfg.num_heads = 6;
  EXPECT(smla_shardq_create(NULL, &cfg, &sq) == SMLA_ERROR_INVALID_ARGUMENT && has("multiple of world"));
  smla_shardq_config_init(&cfg);
  cfg.kv_format = 9;
  EXPECT(smla_shardq_create(NULL, &cfg, &sq) == SMLA_ERROR_INVALID_ARGUMENT && has("kv_format"));
  smla_shardq_config_init(&cfg);
  cfg.q_dtype = SMLA_FP32;
  EXPECT(smla_shardq_create(NULL, &cfg, &sq) == SMLA_ERROR_INVALID_ARGUMENT && has("q_dtype"));
  smla_shardq_config_init(&cfg);
  cfg.score_precision = 7;
  EXPECT(smla_shardq_create(NULL, &cfg, &sq) == SMLA_ERROR_INVALID_ARGUMENT && has("score_precision"));
  smla_shardq_config_init(&cfg);
  cfg.watchdog = 2;
  EXPECT(smla_shardq_create(NULL, &cfg, &sq) == SMLA_ERROR_INVALID_ARGUMENT && has("watchdog must be 0 or 1"));
  smla_shardq_config_init(&cfg);
  cfg.terminate_on_stuck_call = -1;
  EXPECT(smla_shardq_create(NULL, &cfg, &sq) == SMLA_ERROR_INVALID_ARGUMENT && has("terminate_on_stuck_call"));
  smla_shardq_config_init(&cfg);
  cfg.timeout_ms = 0;
  EXPECT(smla_shardq_create(NULL, &cfg, &sq) == SMLA_ERROR_INVALID_ARGUMENT && has("timeout_ms"));
  smla_shardq_config_init(&cfg);
#else
  EXPECT(smla_shardq_create(NULL, &cfg, &sq) == SMLA_ERROR_UNSUPPORTED && has("no NCCL"));
  EXPECT(sq == NULL);
#endif
  EXPECT(smla_shardq_create(NULL, NULL, &sq) == SMLA_ERROR_INVALID_ARGUMENT && has("cfg is null"));
  EXPECT(smla_shardq_create(NULL, &cfg, NULL) == SMLA_ERROR_INVALID_ARGUMENT && has("out"));
  size_t bytes = 0;
  int64_t slots = 0;
  EXPECT(smla_shardq_workspace_bytes(NULL, &bytes) == SMLA_ERROR_INVALID_ARGUMENT && has("handle is null"));
  EXPECT(smla_shardq_slots(NULL, &slots) == SMLA_ERROR_INVALID_ARGUMENT && has("handle is null"));
  EXPECT(smla_shardq_step(NULL, &args, NULL, 0, NULL) == SMLA_ERROR_INVALID_ARGUMENT && has("handle is null"));
  EXPECT(smla_shardq_wait(NULL, NULL, 100) == SMLA_ERROR_INVALID_ARGUMENT && has("handle is null"));
  int32_t aborted = 7;
  EXPECT(smla_shardq_aborted(NULL, &aborted) == SMLA_ERROR_INVALID_ARGUMENT && has("handle is null") && aborted == 7);
  EXPECT(smla_shardq_aborted(NULL, NULL) == SMLA_ERROR_INVALID_ARGUMENT && has("out_aborted is null"));
  smla_shardq_destroy(NULL); /* a no-op */
  printf("%d passed, %d failed\n", g_pass, g_fail);
  return g_fail ? 1 : 0;
}
