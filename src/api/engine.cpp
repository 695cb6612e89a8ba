#include "smla/engine.h"

#include <algorithm>
#include <string>

#include "reference/sparse_mla.h"
#include "smla/plan.h"
#if SMLA_HAVE_CUDA
#include "smla/cuda.h"
#endif

namespace smla {
namespace {
std::string s(int64_t v) { return std::to_string(v); }
}  // namespace

Plan::Plan(const PlanConfig& cfg) : cfg_(cfg) {
  SMLA_CHECK(cfg.max_rows >= 1, "PlanConfig.max_rows must be >= 1; got " + s(cfg.max_rows));
  for (int64_t g : cfg.graph_sizes)
    SMLA_CHECK(g >= 1 && g <= cfg.max_rows, "graph size " + s(g) + " must be in [1, max_rows = " + s(cfg.max_rows) + "]");
  const Support sup = backend_support(cfg.backend, cfg.geometry, cfg.device);
  if (!sup.ok()) fail_unsupported(sup.reason);

  // Buckets: powers of two up to max_rows (the last one capped at max_rows) plus graph sizes.
  std::vector<int64_t> buckets;
  for (int64_t b = 1; b < cfg.max_rows; b <<= 1) buckets.push_back(b);
  buckets.push_back(cfg.max_rows);
  buckets.insert(buckets.end(), cfg.graph_sizes.begin(), cfg.graph_sizes.end());
  std::sort(buckets.begin(), buckets.end());
  buckets.erase(std::unique(buckets.begin(), buckets.end()), buckets.end());

  // Each bucket's split is fixed here, at plan time: a run of T rows uses the split of the
  // smallest bucket >= T, so a captured graph replays exactly the schedule it was captured with.
  // The CPU backend never splits.
  const DeviceInfo dev = cfg.backend == Backend::kCuda ? cuda_device(cfg.device) : DeviceInfo{};
  num_sms_ = dev.num_sms;
  // The variant that will run every call of the plan (support passed: there is one).
  const CudaVariant* variant = cfg.backend == Backend::kCuda ? cuda_variant_for(cfg.geometry, dev) : nullptr;
  (void)variant;  // (read by the CUDA backend only)
  for (int64_t b : buckets) {
    Schedule sc;
    sc.bucket = b;
    sc.num_splits = 1;
#if SMLA_HAVE_CUDA
    if (cfg.backend == Backend::kCuda) {
      SparseMlaParams p;
      p.num_tokens = b, p.num_heads = cfg.geometry.num_heads, p.topk = cfg.geometry.topk;
      sc.num_splits = cfg.batch_invariant ? batch_invariant_splits(cfg.geometry.topk)
                                          : cuda::sparse_mla_auto_splits(p, num_sms_);
      // Scratch of the bucket's largest run (every T in the bucket uses this split).
      workspace_bytes_ = std::max(workspace_bytes_, variant->workspace(b, cfg.geometry.num_heads, sc.num_splits));
    }
#endif
    schedules_.push_back(sc);
  }
}

const Schedule& Plan::schedule_for(int64_t num_tokens) const {
  SMLA_CHECK(num_tokens >= 0 && num_tokens <= cfg_.max_rows,
             "T = " + s(num_tokens) + " exceeds the planned max_rows = " + s(cfg_.max_rows) + "; make a larger plan");
  for (const auto& sc : schedules_)
    if (sc.bucket >= num_tokens) return sc;
  return schedules_.back();
}

void Plan::check(const SparseMlaParams& p, size_t workspace_bytes) const {
  const Geometry& g = cfg_.geometry;
  SMLA_CHECK(p.num_heads == g.num_heads, "H = " + s(p.num_heads) + " but the plan was made for H = " + s(g.num_heads));
  SMLA_CHECK(p.rope_dim == g.rope_dim,
             "rope_dim = " + s(p.rope_dim) + " but the plan was made for rope_dim = " + s(g.rope_dim));
  SMLA_CHECK(p.format == g.format, "KV format " + std::string(to_string(p.format)) + " but the plan was made for " +
                                       std::string(to_string(g.format)));
  SMLA_CHECK(p.q_dtype == g.q_dtype, "q dtype " + std::string(to_string(p.q_dtype)) + " but the plan was made for " +
                                         std::string(to_string(g.q_dtype)));
  // Compared resolved (auto is fp8 for an e4m3 q with an fp8 cache, bf16 otherwise): the path that runs.
  const ScorePrecision p_sp = resolve_score_precision(geometry_of(p)), g_sp = resolve_score_precision(g);
  SMLA_CHECK(p_sp == g_sp, "score precision " + std::string(to_string(p.score_precision)) + " (" +
                               std::string(to_string(p_sp)) + " scores) but the plan was made for " +
                               std::string(to_string(g.score_precision)) + " (" + std::string(to_string(g_sp)) +
                               " scores); pass the plan's score precision");
  SMLA_CHECK(p.topk <= g.topk, "K = " + s(p.topk) + " exceeds the planned capacity " + s(g.topk));
  // An empty call may pass null for its empty tensors; only non-empty calls must match pointers.
  const bool lse_on = p.lse != nullptr && p.lse_mode != LseMode::kOff;
  SMLA_CHECK(p.num_tokens == 0 || lse_on == (g.lse_mode != LseMode::kOff) && (!lse_on || p.lse_mode == g.lse_mode),
             std::string("LSE ") + (lse_on ? "base " + std::string(to_string(p.lse_mode)) : "off") +
                 " but the plan was made for LSE " +
                 (g.lse_mode == LseMode::kOff ? "off" : "base " + std::string(to_string(g.lse_mode))));
  SMLA_CHECK(p.num_tokens == 0 || (p.sink != nullptr) == g.sink,
             std::string("sink ") + (p.sink ? "given" : "absent") + " but the plan was made with sink " +
                 (g.sink ? "on" : "off"));
  SMLA_CHECK(p.num_tokens <= cfg_.max_rows,
             "T = " + s(p.num_tokens) + " exceeds the planned max_rows = " + s(cfg_.max_rows) + "; make a larger plan");
  SMLA_CHECK(workspace_bytes >= workspace_bytes_,
             "workspace too small: the plan needs " + s(int64_t(workspace_bytes_)) + " bytes; got " +
                 s(int64_t(workspace_bytes)));
  validate(p);
}

void Plan::run(const SparseMlaParams& p, void* workspace, size_t workspace_bytes, void* stream) const {
  check(p, workspace_bytes);
  SMLA_CHECK(workspace_bytes_ == 0 || workspace != nullptr, "workspace is null but the plan needs " +
                                                                  s(int64_t(workspace_bytes_)) + " bytes");
  if (p.num_tokens == 0) return;  // empty problem: nothing launched
  if (cfg_.backend == Backend::kCpu) {
    reference::sparse_mla(p);
    return;
  }
#if SMLA_HAVE_CUDA
  cuda::sparse_mla(p, workspace, workspace_bytes, stream, schedule_for(p.num_tokens).num_splits, cfg_.batch_invariant);
#else
  (void)stream;
  fail("this build has no CUDA backend");
#endif
}

}  // namespace smla
