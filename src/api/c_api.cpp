// The C ABI: converts plain structs to the C++ API and exceptions to status codes.
#include "smla/smla.h"

#include <cstring>
#include <exception>
#include <new>
#include <string>

#include "smla/engine.h"
#include "smla/tiered.h"
#include "api/c_guard.h"
#if SMLA_HAVE_CUDA
#include "smla/cuda_tiered.h"
#endif

struct smla_plan {
  smla::Plan plan;
};
struct smla_tiered_cache {
  smla::TieredCache cache;
};

std::string& smla::capi::last_error() {
  thread_local std::string message;
  return message;
}

namespace {

using smla::capi::guarded;

smla::KvFormat to_format(int32_t v) {
  SMLA_CHECK(v >= 0 && v <= 4, "kv_format must be an smla_kv_format (0..4); got " + std::to_string(v));
  return smla::KvFormat(v);
}
smla::DType to_dtype(int32_t v, const char* what) {
  switch (v) {
    case SMLA_BF16: return smla::DType::kBF16;
    case SMLA_FP16: return smla::DType::kFP16;
    case SMLA_FP32: return smla::DType::kFP32;
    case SMLA_E4M3: return smla::DType::kE4M3;
  }
  smla::fail(std::string(what) + " must be an smla_dtype (0..3); got " + std::to_string(v));
}
smla::LseMode to_lse(int32_t v) {
  SMLA_CHECK(v >= 0 && v <= 2, "lse_mode must be an smla_lse_mode (0..2); got " + std::to_string(v));
  return smla::LseMode(v);
}

}  // namespace

extern "C" {

void smla_plan_config_init(smla_plan_config* cfg) {
  if (!cfg) return;
  std::memset(cfg, 0, sizeof(*cfg));
  cfg->num_heads = 128, cfg->rope_dim = 64, cfg->kv_format = SMLA_KV_BF16, cfg->q_dtype = SMLA_BF16;
  cfg->topk = 2048, cfg->lse_mode = SMLA_LSE_BASE_E, cfg->backend = SMLA_BACKEND_CUDA, cfg->max_rows = 1;
  cfg->score_precision = SMLA_SCORE_AUTO;
}

void smla_run_args_init(smla_run_args* a) {
  if (!a) return;
  std::memset(a, 0, sizeof(*a));
  a->q_scale = 1.0f, a->k_scale = 1.0f;
}

smla_status smla_plan_create(const smla_plan_config* cfg, smla_plan** out_plan) {
  return guarded([&] {
    SMLA_CHECK(cfg != nullptr && out_plan != nullptr, "smla_plan_create: cfg and out_plan must not be null");
    *out_plan = nullptr;
    smla::PlanConfig pc;
    pc.geometry.num_heads = cfg->num_heads;
    pc.geometry.rope_dim = cfg->rope_dim;
    pc.geometry.format = to_format(cfg->kv_format);
    pc.geometry.q_dtype = to_dtype(cfg->q_dtype, "q_dtype");
    pc.geometry.topk = cfg->topk;
    pc.geometry.lse_mode = to_lse(cfg->lse_mode);
    pc.geometry.sink = cfg->sink != 0;
    SMLA_CHECK(cfg->score_precision == SMLA_SCORE_BF16 || cfg->score_precision == SMLA_SCORE_FP8 ||
                   cfg->score_precision == SMLA_SCORE_AUTO,
               "score_precision must be SMLA_SCORE_AUTO, SMLA_SCORE_BF16 or SMLA_SCORE_FP8; got " +
                   std::to_string(cfg->score_precision));
    pc.geometry.score_precision = cfg->score_precision == SMLA_SCORE_FP8    ? smla::ScorePrecision::kFP8
                                  : cfg->score_precision == SMLA_SCORE_BF16 ? smla::ScorePrecision::kBF16
                                                                            : smla::ScorePrecision::kAuto;
    pc.batch_invariant = cfg->batch_invariant != 0;
    SMLA_CHECK(cfg->backend == SMLA_BACKEND_CPU || cfg->backend == SMLA_BACKEND_CUDA,
               "backend must be SMLA_BACKEND_CPU or SMLA_BACKEND_CUDA");
    pc.backend = cfg->backend == SMLA_BACKEND_CPU ? smla::Backend::kCpu : smla::Backend::kCuda;
    pc.device = cfg->device;
    pc.max_rows = cfg->max_rows;
    SMLA_CHECK(cfg->num_graph_sizes >= 0 && (cfg->num_graph_sizes == 0 || cfg->graph_sizes),
               "graph_sizes must hold num_graph_sizes entries");
    pc.graph_sizes.assign(cfg->graph_sizes, cfg->graph_sizes + cfg->num_graph_sizes);
    *out_plan = new smla_plan{smla::Plan(pc)};
  });
}

void smla_plan_destroy(smla_plan* plan) { delete plan; }

smla_status smla_plan_workspace_bytes(const smla_plan* plan, size_t* out_bytes) {
  return guarded([&] {
    SMLA_CHECK(plan && out_bytes, "smla_plan_workspace_bytes: plan and out_bytes must not be null");
    *out_bytes = plan->plan.workspace_bytes();
  });
}

smla_status smla_run(const smla_plan* plan, const smla_run_args* a, void* workspace, size_t workspace_bytes,
                     void* stream) {
  return guarded([&] {
    SMLA_CHECK(plan && a, "smla_run: plan and args must not be null");
    const smla::Geometry& g = plan->plan.config().geometry;
    smla::SparseMlaParams p;
    p.num_tokens = a->num_tokens, p.num_heads = g.num_heads, p.rope_dim = g.rope_dim, p.topk = a->topk;
    p.q = a->q, p.q_stride_t = a->q_stride_t, p.q_stride_h = a->q_stride_h;
    p.q_rope = a->q_rope, p.q_rope_stride_t = a->q_rope_stride_t, p.q_rope_stride_h = a->q_rope_stride_h;
    p.q_dtype = g.q_dtype;
    p.kv = a->kv, p.num_rows = a->num_rows, p.kv_row_stride_bytes = a->kv_row_stride_bytes, p.format = g.format;
    p.idx = a->idx, p.idx_stride_t = a->idx_stride_t, p.counts = a->counts, p.sink = a->sink;
    p.softmax_scale = a->softmax_scale, p.q_scale = a->q_scale, p.k_scale = a->k_scale;
    p.out = a->out, p.out_stride_t = a->out_stride_t, p.out_stride_h = a->out_stride_h;
    p.out_dtype = to_dtype(a->out_dtype, "out_dtype");
    p.lse = a->lse, p.lse_stride_t = a->lse_stride_t, p.lse_mode = g.lse_mode;
    p.score_precision = g.score_precision;
    plan->plan.run(p, workspace, workspace_bytes, stream);
  });
}

void smla_tiered_config_init(smla_tiered_config* cfg) {
  if (!cfg) return;
  std::memset(cfg, 0, sizeof(*cfg));
  const smla::TieredCacheConfig d;
  cfg->kv_format = SMLA_KV_FP8_DS_MLA, cfg->rope_dim = d.rope_dim, cfg->topk = d.topk, cfg->hot_slots = d.hot_slots;
  cfg->max_requests = d.max_requests, cfg->max_tokens_per_request = d.max_tokens_per_request;
  cfg->max_positions = d.max_positions, cfg->hot_row_stride_bytes = d.hot_row_stride_bytes;
}

static smla::TieredCacheConfig tiered_config(const smla_tiered_config* c) {
  SMLA_CHECK(c != nullptr, "smla_tiered_config is null");
  smla::TieredCacheConfig t;
  t.format = to_format(c->kv_format), t.rope_dim = c->rope_dim, t.topk = c->topk, t.hot_slots = c->hot_slots;
  t.max_requests = c->max_requests, t.max_tokens_per_request = c->max_tokens_per_request;
  t.max_positions = c->max_positions, t.hot_row_stride_bytes = c->hot_row_stride_bytes;
  return t;
}

static bool tiered_cuda(int32_t backend) {
  SMLA_CHECK(backend == SMLA_BACKEND_CPU || backend == SMLA_BACKEND_CUDA,
             "backend must be SMLA_BACKEND_CPU or SMLA_BACKEND_CUDA; got " + std::to_string(backend));
#if !SMLA_HAVE_CUDA
  SMLA_CHECK(backend == SMLA_BACKEND_CPU, "this build has no CUDA backend; use SMLA_BACKEND_CPU");
#endif
  return backend == SMLA_BACKEND_CUDA;
}

smla_status smla_tiered_create(const smla_tiered_config* cfg, smla_tiered_cache** out_cache) {
  return guarded([&] {
    SMLA_CHECK(out_cache != nullptr, "smla_tiered_create: out_cache must not be null");
    *out_cache = nullptr;
    *out_cache = new smla_tiered_cache{smla::TieredCache(tiered_config(cfg))};
  });
}

void smla_tiered_destroy(smla_tiered_cache* cache) { delete cache; }

smla_status smla_tiered_get_sizes(const smla_tiered_cache* cache, smla_tiered_sizes* out) {
  return guarded([&] {
    SMLA_CHECK(cache && out, "smla_tiered_get_sizes: cache and out_sizes must not be null");
    const smla::TieredCache& c = cache->cache;
    out->hot_slots = c.hot_slots(), out->row_bytes = c.row_bytes();
    out->hot_rows = c.hot_rows(), out->hot_row_stride_bytes = c.hot_row_stride_bytes();
    out->hot_buffer_bytes = c.hot_buffer_bytes(), out->state_bytes = c.state_bytes();
    out->workspace_bytes = c.workspace_bytes(), out->device_bytes = c.device_bytes();
  });
}

smla_status smla_tiered_reset(const smla_tiered_cache* cache, int32_t backend, void* state, size_t state_bytes,
                              int32_t release_req, void* stream) {
  return guarded([&] {
    SMLA_CHECK(cache != nullptr, "smla_tiered_reset: cache is null");
    (void)stream;  // the CPU backend has none
    if (tiered_cuda(backend)) {
#if SMLA_HAVE_CUDA
      if (release_req >= 0) smla::cuda::release_tiered_request(cache->cache, state, state_bytes, release_req, stream);
      else smla::cuda::reset_tiered_state(cache->cache, state, state_bytes, stream);
#endif
      return;
    }
    if (release_req >= 0) smla::release_tiered_request(cache->cache, state, state_bytes, release_req);
    else smla::reset_tiered_state(cache->cache, state, state_bytes);
  });
}

smla_status smla_tiered_invalidate(const smla_tiered_cache* cache, int32_t backend, void* state, size_t state_bytes,
                                   const int32_t* req, const int32_t* pos, int64_t n, void* stream) {
  return guarded([&] {
    SMLA_CHECK(cache != nullptr, "smla_tiered_invalidate: cache is null");
    (void)stream;  // the CPU backend has none
    if (tiered_cuda(backend)) {
#if SMLA_HAVE_CUDA
      smla::cuda::invalidate_tiered_positions(cache->cache, state, state_bytes, req, pos, n, stream);
#endif
      return;
    }
    smla::invalidate_tiered_positions(cache->cache, state, state_bytes, req, pos, n);
  });
}

smla_status smla_tiered_resolve(const smla_tiered_cache* cache, int32_t backend, const smla_tiered_step* a,
                                void* stream) {
  return guarded([&] {
    SMLA_CHECK(cache && a, "smla_tiered_resolve: cache and step must not be null");
    (void)stream;  // the CPU backend has none
    smla::TieredResolveParams p;
    p.num_tokens = a->num_tokens, p.positions = a->positions, p.pos_stride_t = a->pos_stride_t, p.topk = a->topk;
    p.req_of_token = a->req_of_token, p.num_reqs = a->num_reqs, p.seq_lens = a->seq_lens;
    p.pool = a->pool, p.pool_rows = a->pool_rows, p.pool_row_stride_bytes = a->pool_row_stride_bytes;
    p.block_table = a->block_table, p.bt_stride = a->bt_stride, p.max_blocks = a->max_blocks;
    p.block_size = a->block_size, p.block_stride_rows = a->block_stride_rows;
    p.hot = a->hot, p.hot_bytes = a->hot_bytes, p.state = a->state, p.state_bytes = a->state_bytes;
    p.workspace = a->workspace, p.workspace_bytes = a->workspace_bytes;
    p.phys = a->phys, p.phys_stride_t = a->phys_stride_t, p.counts = a->counts;
    if (tiered_cuda(backend)) {
#if SMLA_HAVE_CUDA
      smla::cuda::resolve_tiered(cache->cache, p, stream);
#endif
      return;
    }
    smla::resolve_tiered_reference(cache->cache, p);
  });
}

smla_status smla_tiered_read_counters(const smla_tiered_cache* cache, int32_t backend, const void* state,
                                      void* stream, smla_tiered_counters* out) {
  return guarded([&] {
    SMLA_CHECK(cache && state && out, "smla_tiered_read_counters: cache, state and out must not be null");
    (void)stream;  // the CPU backend has none
    smla::TieredCounters k;
    if (tiered_cuda(backend)) {
#if SMLA_HAVE_CUDA
      k = smla::cuda::read_tiered_counters(cache->cache, state, stream);
#endif
    } else {
      std::memcpy(&k, static_cast<const uint8_t*>(state) + cache->cache.state_layout().counters, sizeof(k));
    }
    out->hits = k.hits, out->misses = k.misses, out->bytes = k.bytes, out->errors = k.errors, out->steps = k.clock;
  });
}

smla_status smla_tiered_max_decode_batch(const smla_tiered_config* cfg, size_t budget_bytes,
                                         size_t attention_workspace_per_row, int64_t* out_batch) {
  return guarded([&] {
    SMLA_CHECK(out_batch != nullptr, "smla_tiered_max_decode_batch: out_batch is null");
    smla::TieredCacheConfig t = tiered_config(cfg);
    t.max_requests = 1;
    *out_batch = smla::max_tiered_decode_batch(
        t, budget_bytes, [&](int64_t rows) { return size_t(rows) * attention_workspace_per_row; });
  });
}

const char* smla_last_error(void) { return smla::capi::last_error().c_str(); }

}  // extern "C"
