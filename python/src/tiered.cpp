// python/src/tiered.cpp — the HiSparse tiered cache in smla._smla (smla/tiered.h,
// smla/cuda_tiered.h): the plan class and the per-step calls. Host arrays run the CPU reference;
// CUDA arrays the CUDA resolver, with the host pool in (pinned) host memory. Registered from
// module.cpp by register_tiered(m).
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/function.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <cstring>
#include <functional>
#include <optional>
#include <string>

#include "smla/cache.h"
#include "smla/formats.h"
#include "smla/tiered.h"
#include "tensors.h"
#if SMLA_HAVE_CUDA
#include <cuda_runtime.h>

#include "smla/cuda_tiered.h"
#endif

namespace smla::py {
namespace {

using namespace nb::literals;
using OptIn = std::optional<In>;
using OptOut = std::optional<Out>;

std::string s(int64_t v) { return std::to_string(v); }

#if SMLA_HAVE_CUDA
struct TieredDeviceGuard {
  int prev = -1;
  explicit TieredDeviceGuard(const Device& d) {
    if (!d.cuda) return;
    int cur = 0;
    SMLA_CHECK(cudaGetDevice(&cur) == cudaSuccess, "cannot query the current CUDA device");
    if (cur != d.id) {
      SMLA_CHECK(cudaSetDevice(d.id) == cudaSuccess, "cannot switch to CUDA device " + s(d.id));
      prev = cur;
    }
  }
  ~TieredDeviceGuard() {
    if (prev >= 0) cudaSetDevice(prev);
  }
  TieredDeviceGuard(const TieredDeviceGuard&) = delete;
  TieredDeviceGuard& operator=(const TieredDeviceGuard&) = delete;
};
#endif

[[noreturn, maybe_unused]] void no_cuda_tiered(const std::string& what) {
  fail_unsupported(what + " got CUDA arrays but this build of smla has no CUDA backend; pass host arrays");
}

// A contiguous byte buffer (hot buffer, state, workspace): its pointer and size.
View bytes_view(const Out& a, const char* name) {
  View v = view(a, name);
  expect_contiguous(v, std::string("a contiguous buffer (") + name + ")");
  return v;
}

// Positions-like int32 [T, K], inner contiguous.
View int32_2d(const In& a, const char* name, const std::string& what) {
  View v = view(a, name);
  expect_shape(v, {-1, -1}, what);
  expect_elem(v, Elem::kI32, what);
  expect_inner_contiguous(v, what);
  return v;
}

View int32_1d(const In& a, const char* name, int64_t n, const std::string& what) {
  View v = view(a, name);
  expect_shape(v, {n}, what);
  expect_elem(v, Elem::kI32, what);
  expect_contiguous(v, what);
  return v;
}

TieredCounters counters_of(const TieredCache& c, const Out& state, uintptr_t stream) {
  const View v = bytes_view(state, "state");
  SMLA_CHECK(v.span_bytes() >= int64_t(c.state_bytes()),
             "state must hold state_bytes = " + s(int64_t(c.state_bytes())) + " bytes; got " + v.describe());
  if (!v.device.cuda) {
    TieredCounters k;
    std::memcpy(&k, static_cast<const uint8_t*>(v.data) + c.state_layout().counters, sizeof(k));
    return k;
  }
#if SMLA_HAVE_CUDA
  TieredDeviceGuard g(v.device);
  return cuda::read_tiered_counters(c, v.data, reinterpret_cast<void*>(stream));
#else
  (void)stream;
  no_cuda_tiered("TieredCache.counters");
#endif
}

void tiered_reset(const TieredCache& c, const Out& state, std::optional<int> release_req, uintptr_t stream) {
  const View v = bytes_view(state, "state");
  const size_t bytes = size_t(v.span_bytes());
  if (!v.device.cuda) {
    if (release_req) release_tiered_request(c, v.data, bytes, *release_req);
    else reset_tiered_state(c, v.data, bytes);
    return;
  }
#if SMLA_HAVE_CUDA
  TieredDeviceGuard g(v.device);
  if (release_req) cuda::release_tiered_request(c, v.data, bytes, *release_req, reinterpret_cast<void*>(stream));
  else cuda::reset_tiered_state(c, v.data, bytes, reinterpret_cast<void*>(stream));
#else
  (void)stream;
  no_cuda_tiered("TieredCache.reset");
#endif
}

void tiered_invalidate(const TieredCache& c, const Out& state, const In& req, const In& pos, uintptr_t stream) {
  const View vs = bytes_view(state, "state");
  const View vq = view(req, "req");
  expect_shape(vq, {-1}, "int32 [n] request of each position");
  const int64_t n = vq.shape[0];
  expect_elem(vq, Elem::kI32, "int32 [n] request of each position");
  expect_contiguous(vq, "[n]");
  const View vp = int32_1d(pos, "positions", n, "int32 [n] positions (like req)");
  const Device dev = common_device({&vs, &vq, &vp});
  const auto* q = static_cast<const int32_t*>(vq.data);
  const auto* x = static_cast<const int32_t*>(vp.data);
  if (!dev.cuda) {
    invalidate_tiered_positions(c, vs.data, size_t(vs.span_bytes()), q, x, n);
    return;
  }
#if SMLA_HAVE_CUDA
  TieredDeviceGuard g(dev);
  cuda::invalidate_tiered_positions(c, vs.data, size_t(vs.span_bytes()), q, x, n, reinterpret_cast<void*>(stream));
#else
  (void)stream;
  no_cuda_tiered("TieredCache.invalidate");
#endif
}

void tiered_resolve(const TieredCache& c, const In& positions, const In& seq_lens, const In& pool,
                    const In& block_table, int block_size, std::optional<int64_t> block_stride_rows, const Out& hot,
                    const Out& state, const std::optional<Out>& workspace, const Out& phys, const OptOut& counts,
                    const OptIn& req_of_token, uintptr_t stream) {
  TieredResolveParams p;
  const View vp = int32_2d(positions, "positions", "int32 [T, K] request-local top-k positions, -1 padded");
  const int64_t T = vp.shape[0], K = vp.shape[1];
  p.num_tokens = T, p.positions = static_cast<const int32_t*>(vp.data), p.pos_stride_t = vp.stride[0];
  p.topk = int(K);
  const View vb = int32_2d(block_table, "block_table", "int32 [num_reqs, max_blocks] host-pool blocks");
  p.num_reqs = int(vb.shape[0]), p.block_table = static_cast<const int32_t*>(vb.data), p.bt_stride = vb.stride[0];
  p.max_blocks = int(vb.shape[1]);
  const View vl = int32_1d(seq_lens, "seq_lens", p.num_reqs, "int32 [num_reqs] request lengths (like block_table)");
  p.seq_lens = static_cast<const int32_t*>(vl.data);
  const View vpool = view(pool, "pool");
  const RowView rows = row_view(vpool, c.row_bytes(), std::string(to_string(c.config().format)));
  p.pool = rows.base, p.pool_rows = rows.num_rows, p.pool_row_stride_bytes = rows.row_stride_bytes;
  if (vpool.ndim() == 3) {
    SMLA_CHECK(block_size == rows.block_size, "block_size = " + s(block_size) + " but pool is " + vpool.describe());
    p.block_size = rows.block_size, p.block_stride_rows = rows.block_stride_rows;
  } else {
    p.block_size = block_size, p.block_stride_rows = block_stride_rows.value_or(block_size);
  }
  const View vh = bytes_view(hot, "hot");
  p.hot = vh.data, p.hot_bytes = size_t(vh.span_bytes());
  const View vs = bytes_view(state, "state");
  p.state = vs.data, p.state_bytes = size_t(vs.span_bytes());
  std::optional<View> vw;
  if (workspace) {
    vw = bytes_view(*workspace, "workspace");
    p.workspace = vw->data, p.workspace_bytes = size_t(vw->span_bytes());
  }
  const View vo = view(phys, "phys");
  expect_shape(vo, {T, K}, "int32 [T, K] like positions");
  expect_elem(vo, Elem::kI32, "int32 [T, K]");
  expect_inner_contiguous(vo, "[T, K]");
  p.phys = static_cast<int32_t*>(vo.data), p.phys_stride_t = vo.stride[0];
  std::optional<View> vc, vr;
  if (counts) {
    vc = view(*counts, "counts");
    expect_shape(*vc, {T}, "int32 [T]");
    expect_elem(*vc, Elem::kI32, "int32 [T]");
    expect_contiguous(*vc, "[T]");
    p.counts = static_cast<int32_t*>(vc->data);
  }
  if (req_of_token) {
    vr = int32_1d(*req_of_token, "req_of_token", T, "int32 [T] request of each token");
    p.req_of_token = static_cast<const int32_t*>(vr->data);
  }
  const Device dev = common_device({&vp, &vb, &vl, &vh, &vs, vw ? &*vw : nullptr, &vo, vc ? &*vc : nullptr,
                                    vr ? &*vr : nullptr});
  SMLA_CHECK(!vpool.device.cuda, "pool is the HOST pool: pass host memory (pinned for the CUDA resolver, e.g. "
                                 "torch.empty(..., pin_memory=True)); got " + vpool.describe());
  if (!dev.cuda) {
    nb::gil_scoped_release release;
    resolve_tiered_reference(c, p);
    return;
  }
#if SMLA_HAVE_CUDA
  TieredDeviceGuard g(dev);
  cuda::resolve_tiered(c, p, reinterpret_cast<void*>(stream));
#else
  (void)stream;
  no_cuda_tiered("TieredCache.resolve");
#endif
}

// New tokens into the host pool and, where hot_rows[n] >= 0, into that hot-buffer row.
void tiered_write(const TieredCache& c, const In& latent, const OptIn& rope, const In& slot_mapping, const Out& pool,
                  int block_size, const Out& hot, const OptIn& hot_rows, float k_scale, bool src_fp16,
                  uintptr_t stream) {
  CacheWriteParams p;
  p.format = c.config().format, p.rope_dim = c.config().rope_dim, p.k_scale = k_scale;
  const View vl = view(latent, "latent");
  expect_shape(vl, {-1, kLatentDim}, "[N, 512] bf16 or fp16");
  expect_inner_contiguous(vl, "[N, 512]");
  const int64_t N = vl.shape[0];
  const DType hint = DType::kFP16;
  p.num_tokens = N, p.latent = vl.data, p.latent_stride = vl.stride[0];
  p.src_dtype = src_dtype_of(vl, src_fp16 ? &hint : nullptr);
  std::optional<View> vr;
  if (rope) {
    vr = view(*rope, "rope");
    expect_shape(*vr, {N, kRopeDim}, "[N, 64] like latent (None for rope_dim = 0)");
    expect_inner_contiguous(*vr, "[N, 64]");
    p.rope = vr->data, p.rope_stride = vr->stride[0];
  }
  const View vs = int32_1d(slot_mapping, "slot_mapping", N, "int32 [N] host-pool slots (negative: skip)");
  p.slot_mapping = static_cast<const int32_t*>(vs.data);
  const View vpool = view(pool, "pool");
  const RowView rows = row_view(vpool, c.row_bytes(), std::string(to_string(p.format)));
  p.cache = rows.base, p.num_rows = rows.num_rows, p.row_stride_bytes = rows.row_stride_bytes;
  if (vpool.ndim() == 3) p.block_size = rows.block_size, p.block_stride_rows = rows.block_stride_rows;
  else p.block_size = block_size, p.block_stride_rows = block_size;
  const View vh = bytes_view(hot, "hot");
  std::optional<View> vhr;
  if (hot_rows) vhr = int32_1d(*hot_rows, "hot_rows", N, "int32 [N] hot-buffer row per token (negative: none)");
  SMLA_CHECK(!vpool.device.cuda, "pool is the HOST pool: pass host memory; got " + vpool.describe());
  const Device dev = common_device({&vl, vr ? &*vr : nullptr, &vs, &vh, vhr ? &*vhr : nullptr});
  validate(p);
  SMLA_CHECK(vh.span_bytes() >= int64_t(c.hot_buffer_bytes()),
             "hot buffer too small: it needs " + s(int64_t(c.hot_buffer_bytes())) + " bytes; got " + vh.describe());
  if (!dev.cuda) {
    nb::gil_scoped_release release;
    write_cache_reference(p);
    if (!vhr) return;
    const auto* hr = static_cast<const int32_t*>(vhr->data);
    for (int64_t n = 0; n < N; ++n) {
      const int64_t src = p.physical_row(p.slot_mapping[n]);
      if (src < 0 || hr[n] < 0 || hr[n] >= c.hot_rows()) continue;
      std::memcpy(static_cast<uint8_t*>(vh.data) + int64_t(hr[n]) * c.hot_row_stride_bytes(),
                  static_cast<const uint8_t*>(p.cache) + src * p.row_stride_bytes, size_t(c.row_bytes()));
    }
    return;
  }
#if SMLA_HAVE_CUDA
  TieredDeviceGuard g(dev);
  cuda::write_cache_tiered(c, p, vhr ? static_cast<const int32_t*>(vhr->data) : nullptr, vh.data,
                           size_t(vh.span_bytes()), reinterpret_cast<void*>(stream));
#else
  (void)stream;
  no_cuda_tiered("TieredCache.write");
#endif
}

TieredCacheConfig make_config(const std::string& format, int topk, int max_requests, int max_tokens_per_request,
                              int64_t max_positions, int hot_slots, int rope_dim, int64_t hot_row_stride_bytes) {
  TieredCacheConfig cfg;
  cfg.format = parse_kv_format(format), cfg.topk = topk, cfg.max_requests = max_requests;
  cfg.max_tokens_per_request = max_tokens_per_request, cfg.max_positions = max_positions, cfg.hot_slots = hot_slots;
  cfg.rope_dim = rope_dim, cfg.hot_row_stride_bytes = hot_row_stride_bytes;
  return cfg;
}

}  // namespace

void register_tiered(nb::module_& m) {
  nb::class_<TieredCache>(m, "_TieredCache")
      .def(
          "__init__",
          [](TieredCache* self, const std::string& format, int topk, int max_requests, int max_tokens_per_request,
             int64_t max_positions, int hot_slots, int rope_dim, int64_t hot_row_stride_bytes) {
            new (self) TieredCache(make_config(format, topk, max_requests, max_tokens_per_request, max_positions,
                                               hot_slots, rope_dim, hot_row_stride_bytes));
          },
          "format"_a, "topk"_a, "max_requests"_a, "max_tokens_per_request"_a, "max_positions"_a, "hot_slots"_a,
          "rope_dim"_a, "hot_row_stride_bytes"_a)
      .def_prop_ro("format", [](const TieredCache& c) { return std::string(to_string(c.config().format)); })
      .def_prop_ro("topk", [](const TieredCache& c) { return c.config().topk; })
      .def_prop_ro("rope_dim", [](const TieredCache& c) { return c.config().rope_dim; })
      .def_prop_ro("max_requests", [](const TieredCache& c) { return c.config().max_requests; })
      .def_prop_ro("max_tokens_per_request", [](const TieredCache& c) { return c.config().max_tokens_per_request; })
      .def_prop_ro("max_positions", [](const TieredCache& c) { return c.config().max_positions; })
      .def_prop_ro("hot_slots", &TieredCache::hot_slots)
      .def_prop_ro("row_bytes", &TieredCache::row_bytes)
      .def_prop_ro("hot_row_stride_bytes", &TieredCache::hot_row_stride_bytes)
      .def_prop_ro("hot_rows", &TieredCache::hot_rows)
      .def_prop_ro("hot_buffer_bytes", &TieredCache::hot_buffer_bytes)
      .def_prop_ro("state_bytes", &TieredCache::state_bytes)
      .def_prop_ro("workspace_bytes", &TieredCache::workspace_bytes)
      .def_prop_ro("device_bytes", &TieredCache::device_bytes)
      .def("hot_row", &TieredCache::hot_row, "req"_a, "slot"_a)
      .def("newest_hot_row", &TieredCache::newest_hot_row, "req"_a)
      .def("reset", &tiered_reset, "state"_a, "release_req"_a.none(), "stream"_a)
      .def("invalidate", &tiered_invalidate, "state"_a, "req"_a, "positions"_a, "stream"_a)
      .def("resolve", &tiered_resolve, "positions"_a, "seq_lens"_a, "pool"_a, "block_table"_a, "block_size"_a,
           "block_stride_rows"_a.none(), "hot"_a, "state"_a, "workspace"_a.none(), "phys"_a, "counts"_a.none(),
           "req_of_token"_a.none(), "stream"_a)
      .def("write", &tiered_write, "latent"_a, "rope"_a.none(), "slot_mapping"_a, "pool"_a, "block_size"_a, "hot"_a,
           "hot_rows"_a.none(), "k_scale"_a, "src_fp16"_a, "stream"_a)
      .def(
          "counters",
          [](const TieredCache& c, const Out& state, uintptr_t stream) {
            const TieredCounters k = counters_of(c, state, stream);
            nb::dict d;
            d["hits"] = k.hits, d["misses"] = k.misses, d["bytes"] = k.bytes, d["errors"] = k.errors;
            d["steps"] = k.clock;
            return d;
          },
          "state"_a, "stream"_a);
  m.def(
      "_max_tiered_decode_batch",
      [](const std::string& format, int topk, int max_tokens_per_request, int64_t max_positions, int hot_slots,
         int rope_dim, int64_t budget_bytes, std::optional<std::function<int64_t(int64_t)>> attention_workspace) {
        SMLA_CHECK(budget_bytes >= 0, "budget_bytes must be >= 0");
        const TieredCacheConfig cfg = make_config(format, topk, 1, max_tokens_per_request, max_positions, hot_slots,
                                                  rope_dim, 0);
        std::function<size_t(int64_t)> ws;
        if (attention_workspace) ws = [f = *attention_workspace](int64_t rows) { return size_t(f(rows)); };
        return max_tiered_decode_batch(cfg, size_t(budget_bytes), ws);
      },
      "format"_a, "topk"_a, "max_tokens_per_request"_a, "max_positions"_a, "hot_slots"_a, "rope_dim"_a,
      "budget_bytes"_a, "attention_workspace"_a.none());
}

}  // namespace smla::py
