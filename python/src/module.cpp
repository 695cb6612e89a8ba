// python/src/module.cpp — the nanobind extension smla._smla.
//
// Thin glue over the public C++ API: arrays arrive through DLPack (zero-copy), are checked once
// (tensors.h), turned into the plain params structs, and handed to the CPU reference (host arrays)
// or the CUDA backend (device arrays). Nothing here allocates device memory: where a convenience
// path needs a workspace, the Python layer passes an `alloc(nbytes)` callable that returns an
// array from the caller's framework. smla::Error becomes smla.SmlaError (a ValueError), and
// Kind::kUnsupported becomes smla.UnsupportedError (a subclass).
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <cmath>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "smla/api.h"
#include "smla/cache.h"
#include "smla/dcp.h"
#include "smla/engine.h"
#include "smla/formats.h"
#include "smla/index.h"
#include "smla/numeric.h"
#include "smla/reference.h"
#include "smla/replay.h"
#include "smla/safetensors.h"
#include "smla/serving.h"
#include "smla/support.h"
#include "tensors.h"
#if SMLA_HAVE_CUDA
#include <cuda_runtime.h>

#include "smla/cuda.h"
#include "smla/cuda_serving.h"
#endif

namespace nb = nanobind;
using namespace nb::literals;

namespace smla::py {
namespace {

PyObject* g_error = nullptr;        // smla.SmlaError(ValueError)
PyObject* g_unsupported = nullptr;  // smla.UnsupportedError(SmlaError)

using OptIn = std::optional<In>;
using OptOut = std::optional<Out>;
using OptStr = std::optional<std::string>;

std::string s(int64_t v) { return std::to_string(v); }

// "e" / "2" (also "E", 2, "base2" spelled as strings by the Python layer); None: LSE off.
LseMode parse_lse_base(const OptStr& base) {
  if (!base) return LseMode::kOff;
  if (*base == "e") return LseMode::kBaseE;
  if (*base == "2") return LseMode::kBase2;
  fail("lse_base must be \"e\" or \"2\" (or None for no LSE); got \"" + *base + "\"");
}

std::optional<DType> parse_hint(const OptStr& name) {
  if (!name) return std::nullopt;
  return parse_dtype(*name);
}

// ---- CUDA glue: device guard and cached device facts ----------------------------------------
#if SMLA_HAVE_CUDA
struct DeviceGuard {
  int prev = -1;
  explicit DeviceGuard(const Device& d) {
    if (!d.cuda) return;
    int cur = 0;
    SMLA_CHECK(cudaGetDevice(&cur) == cudaSuccess, "cannot query the current CUDA device");
    if (cur != d.id) {
      SMLA_CHECK(cudaSetDevice(d.id) == cudaSuccess, "cannot switch to CUDA device " + s(d.id));
      prev = cur;
    }
  }
  ~DeviceGuard() {
    if (prev >= 0) cudaSetDevice(prev);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;
};

// cudaGetDeviceProperties is slow; one query per device per process.
const DeviceInfo& cached_device_info(int id) {
  static std::mutex mu;
  static std::map<int, DeviceInfo> infos;
  std::lock_guard<std::mutex> lock(mu);
  auto it = infos.find(id);
  if (it == infos.end()) it = infos.emplace(id, cuda::device_info(id)).first;
  return it->second;
}
#endif

[[noreturn, maybe_unused]] void no_cuda(const std::string& what) {
  fail_unsupported(what + " got CUDA arrays but this build of smla has no CUDA backend (nvcc was not found at "
                          "build time); pass host arrays or rebuild with nvcc on the PATH");
}

// ---- sparse MLA arguments -------------------------------------------------------------------

struct Bound {
  SparseMlaParams p;
  Device device;
};

Bound bind_sparse_mla(const In& q, const OptIn& q_rope, const In& kv, const In& idx, const OptIn& counts,
                      const OptIn& sink, const Out& out, const OptOut& lse, KvFormat format, int rope_dim,
                      LseMode lse_mode, const std::optional<DType>& q_hint, float softmax_scale, float q_scale,
                      float k_scale) {
  SMLA_CHECK(rope_dim == 0 || rope_dim == kRopeDim, "rope_dim must be 64 (D = 576) or 0 (D = 512); got " + s(rope_dim));
  const int D = kLatentDim + rope_dim;
  Bound b;
  SparseMlaParams& p = b.p;
  const View vq = view(q, "q");
  const std::string q_form = q_rope ? "[T, H, 512] (the latent part; q_rope holds the 64 RoPE dims)"
                                    : "[T, H, " + s(D) + "] for rope_dim = " + s(rope_dim);
  expect_shape(vq, {-1, -1, q_rope ? kLatentDim : D}, q_form);
  expect_inner_contiguous(vq, q_form);
  const int64_t T = vq.shape[0];
  const int64_t H = vq.shape[1];
  SMLA_CHECK(H >= 1 && H <= (1 << 20), "q must have H >= 1 heads; got " + vq.describe());
  p.num_tokens = T;
  p.num_heads = int(H);
  p.rope_dim = rope_dim;
  p.q = vq.data;
  p.q_stride_t = vq.stride[0];
  p.q_stride_h = vq.stride[1];
  p.q_dtype = q_dtype_of(vq, q_hint ? &*q_hint : nullptr);

  std::optional<View> vr;
  if (q_rope) {
    vr = view(*q_rope, "q_rope");
    SMLA_CHECK(rope_dim == kRopeDim, "q_rope is given but rope_dim = 0; pass q alone");
    expect_shape(*vr, {T, H, kRopeDim}, "[T, H, 64] like q");
    expect_inner_contiguous(*vr, "[T, H, 64]");
    SMLA_CHECK(vr->elem == vq.elem, "q_rope must have q's dtype (" + elem_name(vq.elem) + "); got " + vr->describe());
    p.q_rope = vr->data;
    p.q_rope_stride_t = vr->stride[0];
    p.q_rope_stride_h = vr->stride[1];
  }

  const View vk = view(kv, "kv");
  const RowView rows = row_view(vk, row_bytes(format, rope_dim), std::string(to_string(format)));
  p.kv = rows.base;
  p.num_rows = rows.num_rows;
  p.kv_row_stride_bytes = rows.row_stride_bytes;
  p.format = format;

  const View vi = view(idx, "idx");
  expect_shape(vi, {T, -1}, "int32 [T, K] physical rows, -1 padded");
  expect_elem(vi, Elem::kI32, "int32 [T, K] physical rows, -1 padded");
  expect_inner_contiguous(vi, "[T, K]");
  SMLA_CHECK(vi.shape[1] >= 1 && vi.shape[1] <= (int64_t(1) << 30), "idx must be int32 [T, K] with K >= 1; got " + vi.describe());
  p.idx = static_cast<const int32_t*>(vi.data);
  p.idx_stride_t = vi.stride[0];
  p.topk = int(vi.shape[1]);

  std::optional<View> vc, vs, vl;
  if (counts) {
    vc = view(*counts, "counts");
    expect_shape(*vc, {T}, "int32 [T] active lengths");
    expect_elem(*vc, Elem::kI32, "int32 [T] active lengths");
    expect_contiguous(*vc, "[T]");
    p.counts = static_cast<const int32_t*>(vc->data);
  }
  if (sink) {
    vs = view(*sink, "sink");
    expect_shape(*vs, {H}, "float32 [H] per-head sink logits");
    expect_elem(*vs, Elem::kFP32, "float32 [H] per-head sink logits");
    expect_contiguous(*vs, "[H]");
    p.sink = static_cast<const float*>(vs->data);
  }

  const View vo = view(out, "out");
  expect_shape(vo, {T, H, kLatentDim}, "[T, H, 512]");
  expect_inner_contiguous(vo, "[T, H, 512]");
  p.out = vo.data;
  p.out_stride_t = vo.stride[0];
  p.out_stride_h = vo.stride[1];
  p.out_dtype = out_dtype_of(vo, p.q_dtype);
  if (lse) {
    vl = view(*lse, "lse");
    expect_shape(*vl, {T, H}, "float32 [T, H]");
    expect_elem(*vl, Elem::kFP32, "float32 [T, H]");
    expect_inner_contiguous(*vl, "[T, H] with heads contiguous");
    p.lse = static_cast<float*>(vl->data);
    p.lse_stride_t = vl->stride[0];
    p.lse_mode = lse_mode == LseMode::kOff ? LseMode::kBaseE : lse_mode;
  } else {
    p.lse_mode = LseMode::kOff;
  }
  p.softmax_scale = softmax_scale;
  p.q_scale = q_scale;
  p.k_scale = k_scale;

  b.device = common_device({&vq, vr ? &*vr : nullptr, &vk, &vi, vc ? &*vc : nullptr, vs ? &*vs : nullptr, &vo,
                            vl ? &*vl : nullptr});
  return b;
}

// Workspace pointer and size from an optional array on `dev`.
std::pair<void*, size_t> workspace_of(const OptOut& ws, const Device& dev) {
  if (!ws) return {nullptr, 0};
  const View w = view(*ws, "workspace");
  SMLA_CHECK(w.device == dev, "workspace must be on " + to_string(dev) + " like the other tensors; got " + w.describe());
  expect_contiguous(w, "a flat byte buffer");
  return {w.data, size_t(w.numel()) * size_t(w.itemsize)};
}

// The one-call path: validates, runs on the arrays' device. CUDA: `alloc(nbytes)` supplies the
// workspace when none (or too small) was given.
void call_sparse_mla(const In& q, const OptIn& q_rope, const In& kv, const In& idx, const OptIn& counts,
                     const OptIn& sink, const Out& out, const OptOut& lse, const std::string& format,
                     float softmax_scale, float q_scale, float k_scale, int rope_dim, const OptStr& lse_base,
                     const OptStr& q_dtype, const OptOut& workspace, uintptr_t stream, nb::object alloc) {
  const KvFormat fmt = parse_kv_format(format);
  Bound b = bind_sparse_mla(q, q_rope, kv, idx, counts, sink, out, lse, fmt, rope_dim, parse_lse_base(lse_base),
                            parse_hint(q_dtype), softmax_scale, q_scale, k_scale);
  if (!b.device.cuda) {
    validate(b.p);
    nb::gil_scoped_release release;
    reference::sparse_mla(b.p);
    return;
  }
#if SMLA_HAVE_CUDA
  DeviceGuard guard(b.device);
  const Support sup = support_cuda(geometry_of(b.p), cached_device_info(b.device.id), true);
  if (!sup.ok()) fail_unsupported(sup.reason);
  validate(b.p);
  if (b.p.num_tokens == 0) return;
  auto [ws, ws_bytes] = workspace_of(workspace, b.device);
  const size_t need = cuda::sparse_mla_workspace_bytes(b.p, cached_device_info(b.device.id).num_sms);
  nb::object keep;  // the allocated workspace, alive until the launch is enqueued
  if (need > ws_bytes) {
    SMLA_CHECK(!alloc.is_none(), "workspace too small: this call needs " + s(int64_t(need)) + " bytes; got " +
                                     s(int64_t(ws_bytes)));
    keep = alloc(need);
    const Out a = nb::cast<Out>(keep);
    std::tie(ws, ws_bytes) = workspace_of(a, b.device);
    SMLA_CHECK(ws_bytes >= need, "alloc returned " + s(int64_t(ws_bytes)) + " bytes; need " + s(int64_t(need)));
  }
  cuda::sparse_mla(b.p, ws, ws_bytes, reinterpret_cast<void*>(stream));
#else
  (void)workspace, (void)stream, (void)alloc;
  no_cuda("sparse_mla");
#endif
}

// ---- Plan ------------------------------------------------------------------------------------

Bound bind_for_plan(const Plan& plan, const In& q, const OptIn& q_rope, const In& kv, const In& idx,
                    const OptIn& counts, const OptIn& sink, const Out& out, const OptOut& lse, float softmax_scale,
                    float q_scale, float k_scale) {
  const PlanConfig& cfg = plan.config();
  const Geometry& g = cfg.geometry;
  Bound b = bind_sparse_mla(q, q_rope, kv, idx, counts, sink, out, lse, g.format, g.rope_dim,
                            g.lse_mode == LseMode::kOff ? LseMode::kBaseE : g.lse_mode, g.q_dtype, softmax_scale,
                            q_scale, k_scale);
  const bool want_cuda = cfg.backend == Backend::kCuda;
  SMLA_CHECK(b.device.cuda == want_cuda && (!want_cuda || b.device.id == cfg.device),
             "the plan runs on " + std::string(want_cuda ? "cuda:" + s(cfg.device) : "cpu") + " but the tensors are on " +
                 to_string(b.device) + "; make the plan with backend=\"" + (b.device.cuda ? "cuda" : "cpu") + "\"");
  return b;
}

void plan_run(const Plan& plan, const In& q, const In& kv, const In& idx, const Out& out, float softmax_scale,
              const OptIn& q_rope, const OptIn& counts, const OptIn& sink, const OptOut& lse, float q_scale,
              float k_scale, const OptOut& workspace, uintptr_t stream) {
  Bound b = bind_for_plan(plan, q, q_rope, kv, idx, counts, sink, out, lse, softmax_scale, q_scale, k_scale);
  auto [ws, ws_bytes] = workspace_of(workspace, b.device);
  if (!b.device.cuda) {
    nb::gil_scoped_release release;
    plan.run(b.p, ws, ws_bytes, nullptr);
    return;
  }
#if SMLA_HAVE_CUDA
  DeviceGuard guard(b.device);
  plan.run(b.p, ws, ws_bytes, reinterpret_cast<void*>(stream));
#else
  (void)stream;
  no_cuda("Plan.run");
#endif
}

void plan_check(const Plan& plan, const In& q, const In& kv, const In& idx, const Out& out, float softmax_scale,
                const OptIn& q_rope, const OptIn& counts, const OptIn& sink, const OptOut& lse, float q_scale,
                float k_scale, const OptOut& workspace) {
  Bound b = bind_for_plan(plan, q, q_rope, kv, idx, counts, sink, out, lse, softmax_scale, q_scale, k_scale);
  plan.check(b.p, workspace_of(workspace, b.device).second);
}

Geometry make_geometry(int num_heads, int topk, int rope_dim, const std::string& format, const std::string& q_dtype,
                       const OptStr& lse_base, bool sink) {
  Geometry g;
  g.num_heads = num_heads;
  g.topk = topk;
  g.rope_dim = rope_dim;
  g.format = parse_kv_format(format);
  g.q_dtype = parse_dtype(q_dtype);
  g.lse_mode = parse_lse_base(lse_base);
  g.sink = sink;
  return g;
}

// ---- cache writer, index conversion, empty rows ----------------------------------------------

void call_write_cache(const In& latent, const OptIn& rope, const In& slot_mapping, const Out& cache,
                      const std::string& format, float k_scale, std::optional<int> block_size, const OptStr& src_dtype,
                      uintptr_t stream) {
  CacheWriteParams p;
  p.format = parse_kv_format(format);
  p.rope_dim = rope ? kRopeDim : 0;
  const View vl = view(latent, "latent");
  expect_shape(vl, {-1, kLatentDim}, "[N, 512] bf16 or fp16");
  expect_inner_contiguous(vl, "[N, 512]");
  const int64_t N = vl.shape[0];
  const std::optional<DType> hint = parse_hint(src_dtype);
  p.num_tokens = N;
  p.latent = vl.data;
  p.latent_stride = vl.stride[0];
  p.src_dtype = src_dtype_of(vl, hint ? &*hint : nullptr);
  std::optional<View> vr;
  if (rope) {
    vr = view(*rope, "rope");
    expect_shape(*vr, {N, kRopeDim}, "[N, 64] like latent (or None for rope_dim = 0)");
    expect_inner_contiguous(*vr, "[N, 64]");
    SMLA_CHECK(vr->elem == vl.elem, "rope must have latent's dtype (" + elem_name(vl.elem) + "); got " + vr->describe());
    p.rope = vr->data;
    p.rope_stride = vr->stride[0];
  }
  const View vs = view(slot_mapping, "slot_mapping");
  expect_shape(vs, {N}, "int32 [N] slots (block * block_size + offset; negative: skip)");
  expect_elem(vs, Elem::kI32, "int32 [N] slots");
  expect_contiguous(vs, "[N]");
  p.slot_mapping = static_cast<const int32_t*>(vs.data);
  const View vc = view(cache, "cache");
  const RowView rows = row_view(vc, row_bytes(p.format, p.rope_dim), std::string(to_string(p.format)));
  p.cache = rows.base;
  p.num_rows = rows.num_rows;
  p.row_stride_bytes = rows.row_stride_bytes;
  if (vc.ndim() == 3) {
    SMLA_CHECK(!block_size || *block_size == rows.block_size,
               "block_size = " + s(block_size.value_or(0)) + " but cache is " + vc.describe());
    p.block_size = rows.block_size;
    p.block_stride_rows = rows.block_stride_rows;
  } else {
    p.block_size = block_size.value_or(1);
    p.block_stride_rows = p.block_size;
  }
  p.k_scale = k_scale;
  const Device dev = common_device({&vl, vr ? &*vr : nullptr, &vs, &vc});
  validate(p);
  if (!dev.cuda) {
    nb::gil_scoped_release release;
    write_cache_reference(p);
    return;
  }
#if SMLA_HAVE_CUDA
  DeviceGuard guard(dev);
  cuda::write_cache(p, reinterpret_cast<void*>(stream));
#else
  (void)stream;
  no_cuda("write_cache");
#endif
}

void call_convert_indices(const In& positions, const In& block_table, const Out& phys, const OptOut& counts,
                          const OptIn& req_of_token, int block_size, std::optional<int64_t> block_stride_rows,
                          int dcp_world, int dcp_rank, int dcp_interleave, uintptr_t stream) {
  IndexConvertParams p;
  const View vp = view(positions, "positions");
  expect_shape(vp, {-1, -1}, "int32 [T, K] request-local positions, -1 padded");
  expect_elem(vp, Elem::kI32, "int32 [T, K] request-local positions");
  expect_inner_contiguous(vp, "[T, K]");
  const int64_t T = vp.shape[0], K = vp.shape[1];
  SMLA_CHECK(K >= 1 && K <= (int64_t(1) << 30), "positions must be int32 [T, K] with K >= 1; got " + vp.describe());
  p.positions = static_cast<const int32_t*>(vp.data);
  p.pos_stride_t = vp.stride[0];
  p.num_tokens = T;
  p.topk = int(K);
  const View vb = view(block_table, "block_table");
  expect_shape(vb, {-1, -1}, "int32 [num_reqs, max_blocks]");
  expect_elem(vb, Elem::kI32, "int32 [num_reqs, max_blocks]");
  expect_inner_contiguous(vb, "[num_reqs, max_blocks]");
  p.block_table = static_cast<const int32_t*>(vb.data);
  p.bt_stride = vb.stride[0];
  p.num_reqs = int(vb.shape[0]);
  p.max_blocks = int(vb.shape[1]);
  const View vo = view(phys, "phys");
  expect_shape(vo, {T, K}, "int32 [T, K] like positions");
  expect_elem(vo, Elem::kI32, "int32 [T, K]");
  expect_inner_contiguous(vo, "[T, K]");
  p.phys = static_cast<int32_t*>(vo.data);
  p.phys_stride_t = vo.stride[0];
  std::optional<View> vc, vr;
  if (counts) {
    vc = view(*counts, "counts");
    expect_shape(*vc, {T}, "int32 [T]");
    expect_elem(*vc, Elem::kI32, "int32 [T]");
    expect_contiguous(*vc, "[T]");
    p.counts = static_cast<int32_t*>(vc->data);
  }
  if (req_of_token) {
    vr = view(*req_of_token, "req_of_token");
    expect_shape(*vr, {T}, "int32 [T] request of each row");
    expect_elem(*vr, Elem::kI32, "int32 [T] request of each row");
    expect_contiguous(*vr, "[T]");
    p.req_of_token = static_cast<const int32_t*>(vr->data);
  } else {
    SMLA_CHECK(T <= p.num_reqs || T == 0, "req_of_token is None, so row t reads request t, but T = " + s(T) +
                                             " > num_reqs = " + s(p.num_reqs) + "; pass req_of_token");
  }
  p.block_size = block_size;
  p.block_stride_rows = block_stride_rows.value_or(block_size);
  p.dcp_world = dcp_world;
  p.dcp_rank = dcp_rank;
  p.dcp_interleave = dcp_interleave;
  const Device dev = common_device({&vp, &vb, &vo, vc ? &*vc : nullptr, vr ? &*vr : nullptr});
  validate(p);
  if (!dev.cuda) {
    nb::gil_scoped_release release;
    convert_indices_reference(p);
    return;
  }
#if SMLA_HAVE_CUDA
  DeviceGuard guard(dev);
  cuda::convert_indices(p, reinterpret_cast<void*>(stream));
#else
  (void)stream;
  no_cuda("convert_indices");
#endif
}

void call_finish_empty_rows(const In& counts, const Out& out, const OptOut& lse, uintptr_t stream) {
  const View vc = view(counts, "counts");
  expect_elem(vc, Elem::kI32, "int32 [T]");
  SMLA_CHECK(vc.ndim() == 1, "counts must be int32 [T]; got " + vc.describe());
  expect_contiguous(vc, "[T]");
  const int64_t T = vc.shape[0];
  const View vo = view(out, "out");
  expect_shape(vo, {T, -1, kLatentDim}, "[T, H, 512]");
  expect_inner_contiguous(vo, "[T, H, 512]");
  const int64_t H = vo.shape[1];
  const DType od = out_dtype_of(vo, DType::kBF16);
  std::optional<View> vl;
  if (lse) {
    vl = view(*lse, "lse");
    expect_shape(*vl, {T, H}, "float32 [T, H]");
    expect_elem(*vl, Elem::kFP32, "float32 [T, H]");
    expect_inner_contiguous(*vl, "[T, H]");
  }
  const Device dev = common_device({&vc, &vo, vl ? &*vl : nullptr});
  if (!dev.cuda) {
    const int32_t* c = static_cast<const int32_t*>(vc.data);
    const int ob = dtype_bytes(od);
    for (int64_t t = 0; t < T; ++t) {
      if (c[t] > 0) continue;
      for (int64_t h = 0; h < H; ++h) {
        auto* row = static_cast<uint8_t*>(vo.data) + (t * vo.stride[0] + h * vo.stride[1]) * ob;
        std::memset(row, 0, size_t(kLatentDim) * ob);
        if (vl) static_cast<float*>(vl->data)[t * vl->stride[0] + h] = -INFINITY;
      }
    }
    return;
  }
#if SMLA_HAVE_CUDA
  cuda::FinishEmptyParams p;
  p.num_tokens = T;
  p.num_heads = int(H);
  p.counts = static_cast<const int32_t*>(vc.data);
  p.out = vo.data;
  p.out_stride_t = vo.stride[0];
  p.out_stride_h = vo.stride[1];
  p.out_dtype = od;
  if (vl) {
    p.lse = static_cast<float*>(vl->data);
    p.lse_stride_t = vl->stride[0];
  }
  DeviceGuard guard(dev);
  cuda::finish_empty_rows(p, reinterpret_cast<void*>(stream));
#else
  (void)stream;
  no_cuda("finish_empty_rows");
#endif
}

// ---- host-only helpers: DCP merge, row codecs, serving helpers ------------------------------

const float* host_f32(const View& v, const std::vector<int64_t>& shape, const std::string& what) {
  SMLA_CHECK(!v.device.cuda, v.name + " must be a host (NumPy) array; got " + v.describe());
  SMLA_CHECK(v.shape == shape, v.name + " must be " + what + " " + shape_str(shape) + "; got " + v.describe());
  expect_elem(v, Elem::kFP32, "float32 " + what);
  expect_contiguous(v, what);
  return static_cast<const float*>(v.data);
}

void call_merge_partials(const std::vector<In>& outs, const std::vector<In>& lses, const Out& out, const Out& lse) {
  SMLA_CHECK(!outs.empty() && outs.size() == lses.size(),
             "merge_partials needs one (out, lse) pair per rank; got " + s(int64_t(outs.size())) + " outs and " +
                 s(int64_t(lses.size())) + " lses");
  const View vo = view(out, "out"), vl = view(lse, "lse");
  SMLA_CHECK(vo.ndim() == 3 && vo.shape[2] == kLatentDim, "out must be float32 [T, H, 512]; got " + vo.describe());
  const int64_t T = vo.shape[0], H = vo.shape[1];
  float* o = const_cast<float*>(host_f32(vo, {T, H, kLatentDim}, "[T, H, 512]"));
  float* l = const_cast<float*>(host_f32(vl, {T, H}, "[T, H]"));
  std::vector<const float*> po, pl;
  for (size_t i = 0; i < outs.size(); ++i) {
    const std::string n = "[" + s(int64_t(i)) + "]";
    po.push_back(host_f32(view(outs[i], ("outs" + n).c_str()), {T, H, kLatentDim}, "[T, H, 512]"));
    pl.push_back(host_f32(view(lses[i], ("lses" + n).c_str()), {T, H}, "[T, H]"));
  }
  nb::gil_scoped_release release;
  dcp::merge_partials(po, pl, T, int(H), o, l);
}

void call_encode_rows(const std::string& format, const In& latent, const OptIn& rope, float k_scale, const Out& rows) {
  const KvFormat fmt = parse_kv_format(format);
  const View vl = view(latent, "latent");
  SMLA_CHECK(vl.ndim() == 2, "latent must be float32 [N, 512]; got " + vl.describe());
  const int64_t N = vl.shape[0];
  const float* lat = host_f32(vl, {N, kLatentDim}, "[N, 512]");
  const float* rp = nullptr;
  if (rope) rp = host_f32(view(*rope, "rope"), {N, kRopeDim}, "[N, 64]");
  const int rope_dim = rope ? kRopeDim : 0;
  const int rb = row_bytes(fmt, rope_dim);
  const View vr = view(rows, "rows");
  const bool rows_ok = !vr.device.cuda && vr.elem == Elem::kU8 && vr.shape == std::vector<int64_t>{N, rb};
  SMLA_CHECK(rows_ok,
             "rows must be a host uint8 [N, " + s(rb) + "] array; got " + vr.describe());
  expect_contiguous(vr, "[N, row_bytes]");
  auto* dst = static_cast<uint8_t*>(vr.data);
  nb::gil_scoped_release release;
  for (int64_t i = 0; i < N; ++i)
    encode_row(fmt, rope_dim, lat + i * kLatentDim, rp ? rp + i * kRopeDim : nullptr, k_scale, dst + i * rb);
}

void call_decode_rows(const std::string& format, const In& rows, int rope_dim, float k_scale, const Out& out) {
  const KvFormat fmt = parse_kv_format(format);
  SMLA_CHECK(rope_dim == 0 || rope_dim == kRopeDim, "rope_dim must be 64 or 0; got " + s(rope_dim));
  const int rb = row_bytes(fmt, rope_dim);
  const View vr = view(rows, "rows");
  SMLA_CHECK(!vr.device.cuda && vr.ndim() == 2 && vr.itemsize == 1 && vr.shape[1] >= rb,
             "rows must be a host uint8 [N, >= " + s(rb) + "] array; got " + vr.describe());
  const int64_t N = vr.shape[0];
  const int D = kLatentDim + rope_dim;
  float* dst = const_cast<float*>(host_f32(view(out, "out"), {N, D}, "[N, 512 + rope_dim]"));
  const auto* src = static_cast<const uint8_t*>(vr.data);
  const int64_t st = vr.stride[0];
  nb::gil_scoped_release release;
  for (int64_t i = 0; i < N; ++i) decode_row(fmt, rope_dim, src + i * st, k_scale, dst + i * D);
}

// ---- replay / safetensors ---------------------------------------------------------------------

using StTensor = std::tuple<std::string, std::vector<int64_t>, nb::bytes>;
using StDict = std::map<std::string, StTensor>;

StDict to_py(const st::File& f) {
  StDict d;
  for (const auto& [name, t] : f.tensors)
    d.emplace(name, StTensor{t.dtype, t.shape, nb::bytes(reinterpret_cast<const char*>(t.data.data()), t.data.size())});
  return d;
}

std::pair<StDict, std::map<std::string, std::string>> st_parse_bytes(const nb::bytes& data) {
  st::File f = st::parse(reinterpret_cast<const uint8_t*>(data.c_str()), data.size());
  return {to_py(f), f.metadata};
}

nb::bytes st_serialize_py(const StDict& tensors, const std::map<std::string, std::string>& metadata) {
  st::File f;
  f.metadata = metadata;
  for (const auto& [name, t] : tensors) {
    st::Tensor x;
    x.dtype = std::get<0>(t);
    x.shape = std::get<1>(t);
    const nb::bytes& b = std::get<2>(t);
    x.data.assign(reinterpret_cast<const uint8_t*>(b.c_str()), reinterpret_cast<const uint8_t*>(b.c_str()) + b.size());
    f.tensors.emplace(name, std::move(x));
  }
  const std::vector<uint8_t> img = st::serialize(f);
  return nb::bytes(reinterpret_cast<const char*>(img.data()), img.size());
}

std::pair<StDict, std::map<std::string, std::string>> call_replay(const nb::bytes& dump, const std::string& backend,
                                                                  const std::string& out_dtype) {
  st::File in = st::parse(reinterpret_cast<const uint8_t*>(dump.c_str()), dump.size());
  ReplayOptions opt;
  opt.backend = parse_backend(backend);
  opt.out_dtype = parse_dtype(out_dtype);
  st::File res;
  {
    nb::gil_scoped_release release;
    res = replay(in, opt);
  }
  return {to_py(res), res.metadata};
}

[[maybe_unused]] nb::dict device_info_dict(const DeviceInfo& d) {
  nb::dict r;
  r["ordinal"] = d.ordinal;
  r["name"] = d.name;
  r["compute_capability"] = nb::make_tuple(d.cc_major, d.cc_minor);
  r["num_sms"] = d.num_sms;
  r["smem_per_block_optin"] = d.smem_per_block_optin;
  return r;
}

}  // namespace
}  // namespace smla::py

namespace smla::py {
void register_tiered(nb::module_& m);  // python/src/tiered.cpp: smla.TieredCache
}  // namespace smla::py

NB_MODULE(_smla, m) {
  using namespace smla;
  using namespace smla::py;
  m.doc() = "smla: sparse MLA attention (C++ core). Use the `smla` package, not this module.";

  g_error = PyErr_NewExceptionWithDoc("smla.SmlaError",
                                      "An smla call was refused or failed; the message names the argument and the fix.",
                                      PyExc_ValueError, nullptr);
  g_unsupported = PyErr_NewExceptionWithDoc(
      "smla.UnsupportedError", "No backend here supports the request; the message says what to use instead.",
      g_error, nullptr);
  m.attr("SmlaError") = nb::borrow(g_error);
  m.attr("UnsupportedError") = nb::borrow(g_unsupported);
  nb::register_exception_translator([](const std::exception_ptr& ep, void*) {
    try {
      std::rethrow_exception(ep);
    } catch (const Error& e) {
      PyErr_SetString(e.kind() == Error::Kind::kUnsupported ? g_unsupported : g_error, e.what());
    }
  });

  m.attr("LATENT_DIM") = kLatentDim;
  m.attr("ROPE_DIM") = kRopeDim;
  m.def("built_with_cuda", &built_with_cuda);
  m.def("cuda_device_count", []() -> int {
#if SMLA_HAVE_CUDA
    return cuda::device_count();
#else
    return 0;
#endif
  });
  m.def("cuda_device_info", [](int ordinal) -> nb::dict {
#if SMLA_HAVE_CUDA
    return device_info_dict(cuda::device_info(ordinal));
#else
    (void)ordinal;
    fail_unsupported("this build of smla has no CUDA backend");
#endif
  }, "ordinal"_a = 0);
  m.def("row_bytes", [](const std::string& format, int rope_dim) { return row_bytes(parse_kv_format(format), rope_dim); },
        "format"_a, "rope_dim"_a = kRopeDim);

  m.def("_sparse_mla", &call_sparse_mla, "q"_a, "q_rope"_a.none(), "kv"_a, "idx"_a, "counts"_a.none(), "sink"_a.none(),
        "out"_a, "lse"_a.none(), "format"_a, "softmax_scale"_a, "q_scale"_a, "k_scale"_a, "rope_dim"_a,
        "lse_base"_a.none(), "q_dtype"_a.none(), "workspace"_a.none(), "stream"_a, "alloc"_a.none());

  nb::class_<Schedule>(m, "Schedule")
      .def_ro("bucket", &Schedule::bucket)
      .def_ro("num_splits", &Schedule::num_splits)
      .def("__repr__", [](const Schedule& sc) {
        return "Schedule(bucket=" + std::to_string(sc.bucket) + ", num_splits=" + std::to_string(sc.num_splits) + ")";
      });

  nb::class_<Plan>(m, "_Plan")
      .def("__init__",
           [](Plan* self, int num_heads, int topk, int rope_dim, const std::string& format, const std::string& q_dtype,
              const std::optional<std::string>& lse_base, bool sink, int64_t max_rows,
              const std::vector<int64_t>& graph_sizes, bool batch_invariant, const std::string& backend, int device) {
             PlanConfig cfg;
             cfg.geometry = make_geometry(num_heads, topk, rope_dim, format, q_dtype, lse_base, sink);
             cfg.max_rows = max_rows;
             cfg.graph_sizes = graph_sizes;
             cfg.batch_invariant = batch_invariant;
             cfg.backend = parse_backend(backend);
             cfg.device = device;
             new (self) Plan(cfg);
           },
           "num_heads"_a, "topk"_a, "rope_dim"_a, "format"_a, "q_dtype"_a, "lse_base"_a.none(), "sink"_a, "max_rows"_a,
           "graph_sizes"_a, "batch_invariant"_a, "backend"_a, "device"_a)
      .def_prop_ro("workspace_bytes", &Plan::workspace_bytes)
      .def_prop_ro("schedules", &Plan::schedules)
      .def("schedule_for", &Plan::schedule_for, "num_tokens"_a, nb::rv_policy::copy)
      .def_prop_ro("num_heads", [](const Plan& p) { return p.config().geometry.num_heads; })
      .def_prop_ro("topk", [](const Plan& p) { return p.config().geometry.topk; })
      .def_prop_ro("rope_dim", [](const Plan& p) { return p.config().geometry.rope_dim; })
      .def_prop_ro("format", [](const Plan& p) { return std::string(to_string(p.config().geometry.format)); })
      .def_prop_ro("q_dtype", [](const Plan& p) { return std::string(to_string(p.config().geometry.q_dtype)); })
      .def_prop_ro("lse_base", [](const Plan& p) -> std::optional<std::string> {
        const LseMode m = p.config().geometry.lse_mode;
        if (m == LseMode::kOff) return std::nullopt;
        return std::string(m == LseMode::kBase2 ? "2" : "e");
      })
      .def_prop_ro("sink", [](const Plan& p) { return p.config().geometry.sink; })
      .def_prop_ro("max_rows", [](const Plan& p) { return p.config().max_rows; })
      .def_prop_ro("backend", [](const Plan& p) { return std::string(to_string(p.config().backend)); })
      .def_prop_ro("device", [](const Plan& p) { return p.config().device; })
      .def("run", &plan_run, "q"_a, "kv"_a, "idx"_a, "out"_a, "softmax_scale"_a, "q_rope"_a.none(), "counts"_a.none(),
           "sink"_a.none(), "lse"_a.none(), "q_scale"_a, "k_scale"_a, "workspace"_a.none(), "stream"_a)
      .def("check", &plan_check, "q"_a, "kv"_a, "idx"_a, "out"_a, "softmax_scale"_a, "q_rope"_a.none(),
           "counts"_a.none(), "sink"_a.none(), "lse"_a.none(), "q_scale"_a, "k_scale"_a, "workspace"_a.none());

  m.def("_write_cache", &call_write_cache, "latent"_a, "rope"_a.none(), "slot_mapping"_a, "cache"_a, "format"_a,
        "k_scale"_a, "block_size"_a.none(), "src_dtype"_a.none(), "stream"_a);
  m.def("_convert_indices", &call_convert_indices, "positions"_a, "block_table"_a, "phys"_a, "counts"_a.none(),
        "req_of_token"_a.none(), "block_size"_a, "block_stride_rows"_a.none(), "dcp_world"_a, "dcp_rank"_a,
        "dcp_interleave"_a, "stream"_a);
  m.def("_finish_empty_rows", &call_finish_empty_rows, "counts"_a, "out"_a, "lse"_a.none(), "stream"_a);
  m.def("_merge_partials", &call_merge_partials, "outs"_a, "lses"_a, "out"_a, "lse"_a);
  m.def("_encode_rows", &call_encode_rows, "format"_a, "latent"_a, "rope"_a.none(), "k_scale"_a, "rows"_a);
  m.def("_decode_rows", &call_decode_rows, "format"_a, "rows"_a, "rope_dim"_a, "k_scale"_a, "out"_a);

  m.def("_support",
        [](int num_heads, int topk, int rope_dim, const std::string& format, const std::string& q_dtype,
           const std::optional<std::string>& lse_base, bool sink, const std::string& backend) {
          return backend_support(parse_backend(backend),
                                 make_geometry(num_heads, topk, rope_dim, format, q_dtype, lse_base, sink))
              .reason;
        },
        "num_heads"_a, "topk"_a, "rope_dim"_a, "format"_a, "q_dtype"_a, "lse_base"_a.none(), "sink"_a, "backend"_a);
  m.def("_kernel_name",
        [](int num_heads, int topk, int rope_dim, const std::string& format, const std::string& q_dtype) {
          return cuda_kernel_name(make_geometry(num_heads, topk, rope_dim, format, q_dtype, std::string("e"), false));
        },
        "num_heads"_a, "topk"_a, "rope_dim"_a, "format"_a, "q_dtype"_a);

  m.def("reorder_batch_threshold", &reorder_batch_threshold, "num_heads"_a,
        "Decode/prefill split: requests with at most this many query tokens are decode.");
  m.def("_token_to_request", [](const In& qsl, const Out& out) {
    const View vq = view(qsl, "query_start_loc"), vo = view(out, "out");
    SMLA_CHECK(!vq.device.cuda && !vo.device.cuda, "token_to_request takes host arrays");
    expect_elem(vq, Elem::kI32, "int32 [R + 1]");
    expect_elem(vo, Elem::kI32, "int32 [T]");
    SMLA_CHECK(vq.ndim() == 1 && vq.shape[0] >= 1 && vo.ndim() == 1, "query_start_loc must be int32 [R + 1], out int32 [T]");
    expect_contiguous(vq, "[R + 1]");
    expect_contiguous(vo, "[T]");
    token_to_request(static_cast<const int32_t*>(vq.data), int(vq.shape[0] - 1), static_cast<int32_t*>(vo.data),
                     vo.shape[0]);
  }, "query_start_loc"_a, "out"_a);

  m.def("_replay", &call_replay, "dump"_a, "backend"_a, "out_dtype"_a);
  m.def("_st_parse", &st_parse_bytes, "data"_a);
  m.def("_st_serialize", &st_serialize_py, "tensors"_a, "metadata"_a);
  register_tiered(m);
}
