// The C ABI of the NCCL steps (smla/smla_dist.h): plain structs to smla::dist::ShardQ, exceptions to
// status codes (api/c_guard.h, so smla_last_error() reports these calls too).
#include "smla/smla_dist.h"

#include <cstring>
#include <memory>
#include <string>

#include "api/c_guard.h"
#include "smla/dist.h"
#include "smla/support.h"

struct smla_shardq {
#if SMLA_HAVE_NCCL
  std::unique_ptr<smla::dist::ShardQ> sq;
#endif
};

namespace {

using smla::capi::guarded;

[[maybe_unused]] void require_nccl() {
#if !SMLA_HAVE_NCCL
  smla::fail_unsupported("this build has no NCCL: the ShardQ step over NCCL is not available");
#endif
}

#if SMLA_HAVE_NCCL
smla::dist::ShardqConfig to_config(const smla_shardq_config& c) {
  SMLA_CHECK(c.kv_format >= 0 && c.kv_format <= 4, "kv_format must be an smla_kv_format (0..4); got " + std::to_string(c.kv_format));
  SMLA_CHECK(c.q_dtype == SMLA_BF16 || c.q_dtype == SMLA_FP16 || c.q_dtype == SMLA_E4M3,
             "q_dtype must be SMLA_BF16, SMLA_FP16 or SMLA_E4M3; got " + std::to_string(c.q_dtype));
  // smla_plan_config_init's score precision means "the Plan's default" (smla::Geometry's), whatever it is.
  smla_plan_config plan_defaults;
  smla_plan_config_init(&plan_defaults);
  const bool default_score = c.score_precision == plan_defaults.score_precision;
  SMLA_CHECK(default_score || c.score_precision == SMLA_SCORE_BF16 || c.score_precision == SMLA_SCORE_FP8,
             "score_precision must be an smla_score_precision; got " + std::to_string(c.score_precision));
  SMLA_CHECK(c.sink == 0 || c.sink == 1, "sink must be 0 or 1; got " + std::to_string(c.sink));
  SMLA_CHECK(c.watchdog == 0 || c.watchdog == 1, "watchdog must be 0 or 1; got " + std::to_string(c.watchdog));
  SMLA_CHECK(c.terminate_on_stuck_call == 0 || c.terminate_on_stuck_call == 1,
             "terminate_on_stuck_call must be 0 or 1; got " + std::to_string(c.terminate_on_stuck_call));
  smla::dist::ShardqConfig cfg;
  cfg.world = c.world, cfg.rank = c.rank, cfg.num_heads = c.num_heads, cfg.rope_dim = c.rope_dim;
  cfg.format = smla::KvFormat(c.kv_format);
  cfg.q_dtype = c.q_dtype == SMLA_BF16 ? smla::DType::kBF16 : c.q_dtype == SMLA_FP16 ? smla::DType::kFP16 : smla::DType::kE4M3;
  cfg.score_precision = default_score                         ? smla::Geometry{}.score_precision
                        : c.score_precision == SMLA_SCORE_FP8 ? smla::ScorePrecision::kFP8
                                                              : smla::ScorePrecision::kBF16;
  cfg.sink = c.sink != 0, cfg.topk = c.topk, cfg.max_tokens = c.max_tokens, cfg.max_requests = c.max_requests;
  cfg.timeout_ms = c.timeout_ms, cfg.watchdog = c.watchdog != 0;
  cfg.terminate_on_stuck_call = c.terminate_on_stuck_call != 0;
  return cfg;
}

smla::dist::ShardqStepArgs to_args(const smla_shardq_step_args& a) {
  smla::dist::ShardqStepArgs s;
  s.num_tokens = a.num_tokens, s.num_requests = a.num_requests, s.cu_seqlens = a.cu_seqlens, s.q = a.q;
  s.idx = a.idx, s.idx_stride_t = a.idx_stride_t, s.counts = a.counts, s.sink = a.sink, s.kv = a.kv;
  s.num_rows = a.num_rows, s.kv_row_stride_bytes = a.kv_row_stride_bytes, s.softmax_scale = a.softmax_scale;
  s.q_scale = a.q_scale, s.k_scale = a.k_scale, s.out = a.out, s.lse = a.lse;
  return s;
}
#endif

smla_shardq& handle(smla_shardq* sq) {
  SMLA_CHECK(sq != nullptr, "the smla_shardq handle is null; make one with smla_shardq_create");
  return *sq;
}

}  // namespace

extern "C" {

void smla_shardq_config_init(smla_shardq_config* cfg) {
  if (!cfg) return;
  std::memset(cfg, 0, sizeof *cfg);
  smla_plan_config plan_defaults;  // the score precision a plan gets by default
  smla_plan_config_init(&plan_defaults);
  cfg->world = 1, cfg->num_heads = 128, cfg->rope_dim = 64, cfg->kv_format = SMLA_KV_BF16, cfg->q_dtype = SMLA_BF16;
  cfg->score_precision = plan_defaults.score_precision, cfg->topk = 2048, cfg->max_requests = 1, cfg->max_tokens = 1;
  const smla::dist::ShardqConfig defaults;
  cfg->timeout_ms = defaults.timeout_ms, cfg->watchdog = defaults.watchdog ? 1 : 0;
  cfg->terminate_on_stuck_call = defaults.terminate_on_stuck_call ? 1 : 0;
}

void smla_shardq_step_args_init(smla_shardq_step_args* args) {
  if (!args) return;
  std::memset(args, 0, sizeof *args);
  args->q_scale = 1.0f, args->k_scale = 1.0f;
}

smla_status smla_shardq_create(void* nccl_comm, const smla_shardq_config* cfg, smla_shardq** out) {
  return guarded([&] {
    SMLA_CHECK(out != nullptr, "out (the smla_shardq** to fill) is null");
    *out = nullptr;
    SMLA_CHECK(cfg != nullptr, "cfg is null; fill one with smla_shardq_config_init");
    require_nccl();
#if SMLA_HAVE_NCCL
    auto h = std::make_unique<smla_shardq>();
    h->sq = std::make_unique<smla::dist::ShardQ>(nccl_comm, to_config(*cfg));
    *out = h.release();
#else
    (void)nccl_comm;
#endif
  });
}

void smla_shardq_destroy(smla_shardq* sq) { delete sq; }

smla_status smla_shardq_workspace_bytes(const smla_shardq* sq, size_t* out_bytes) {
  return guarded([&] {
    SMLA_CHECK(out_bytes != nullptr, "out_bytes is null");
    auto& h = handle(const_cast<smla_shardq*>(sq));
    require_nccl();
#if SMLA_HAVE_NCCL
    *out_bytes = h.sq->workspace_bytes();
#else
    (void)h;
#endif
  });
}

smla_status smla_shardq_slots(const smla_shardq* sq, int64_t* out_slots) {
  return guarded([&] {
    SMLA_CHECK(out_slots != nullptr, "out_slots is null");
    auto& h = handle(const_cast<smla_shardq*>(sq));
    require_nccl();
#if SMLA_HAVE_NCCL
    *out_slots = h.sq->slots();
#else
    (void)h;
#endif
  });
}

smla_status smla_shardq_step(smla_shardq* sq, const smla_shardq_step_args* args, void* workspace,
                             size_t workspace_bytes, void* stream) {
  return guarded([&] {
    auto& h = handle(sq);
    SMLA_CHECK(args != nullptr, "args is null; fill one with smla_shardq_step_args_init");
    require_nccl();
#if SMLA_HAVE_NCCL
    h.sq->step(to_args(*args), workspace, workspace_bytes, stream);
#else
    (void)h, (void)workspace, (void)workspace_bytes, (void)stream;
#endif
  });
}

smla_status smla_shardq_wait(smla_shardq* sq, void* stream, int32_t timeout_ms) {
  return guarded([&] {
    auto& h = handle(sq);
    require_nccl();
#if SMLA_HAVE_NCCL
    h.sq->wait(stream, timeout_ms);
#else
    (void)h, (void)stream, (void)timeout_ms;
#endif
  });
}

smla_status smla_shardq_aborted(const smla_shardq* sq, int32_t* out_aborted) {
  return guarded([&] {
    SMLA_CHECK(out_aborted != nullptr, "out_aborted is null");
    auto& h = handle(const_cast<smla_shardq*>(sq));
    require_nccl();
#if SMLA_HAVE_NCCL
    *out_aborted = h.sq->aborted() ? 1 : 0;
#else
    (void)h;
#endif
  });
}

}  // extern "C"
