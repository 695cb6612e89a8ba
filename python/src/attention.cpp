// Sparse MLA from Python: the one-call path and Plan. Both bind the arrays into one
// SparseMlaParams and run it through smla::Plan, which owns the support check, the schedule and
// the workspace size for every backend and device; nothing here picks a kernel or sizes memory.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <tuple>
#include <vector>

#include "bindings.h"
#include "smla/engine.h"

namespace smla::py {
namespace {

using namespace nb::literals;

struct Bound {
  SparseMlaParams p;
  Device device;
  std::vector<View> views;  // every array of the call, for the workspace's overlap check
};

// Checks every array once and fills the params; the C++ validate() (inside Plan::run) checks the
// rest.
Bound bind_sparse_mla(const In& q, const OptIn& q_rope, const In& kv, const In& idx, const OptIn& counts,
                      const OptIn& sink, const Out& out, const OptOut& lse, KvFormat format, int rope_dim,
                      LseMode lse_mode, const std::optional<DType>& q_hint, ScorePrecision score_precision,
                      float softmax_scale, float q_scale, float k_scale) {
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
  p.score_precision = score_precision;

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
  expect_cache_elem(vk, format);
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
  expect_no_self_overlap(vo);
  p.out = vo.data;
  p.out_stride_t = vo.stride[0];
  p.out_stride_h = vo.stride[1];
  p.out_dtype = out_dtype_of(vo, p.q_dtype);
  if (lse) {
    vl = view(*lse, "lse");
    expect_shape(*vl, {T, H}, "float32 [T, H]");
    expect_elem(*vl, Elem::kFP32, "float32 [T, H]");
    expect_inner_contiguous(*vl, "[T, H] with heads contiguous");
    expect_no_self_overlap(*vl);
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
  expect_disjoint({&vo, vl ? &*vl : nullptr},
                  {&vq, vr ? &*vr : nullptr, &vk, &vi, vc ? &*vc : nullptr, vs ? &*vs : nullptr});
  for (const std::optional<View>& v : {std::optional<View>(vq), vr, std::optional<View>(vk), std::optional<View>(vi),
                                       vc, vs, std::optional<View>(vo), vl})
    if (v) b.views.push_back(*v);
  return b;
}

// Workspace pointer and size from an optional array on `dev`, checked against the params' arrays.
std::pair<void*, size_t> workspace_of(const OptOut& ws, const Bound& b) {
  if (!ws) return {nullptr, 0};
  const View w = view(*ws, "workspace");
  SMLA_CHECK(w.device == b.device,
             "workspace must be on " + to_string(b.device) + " like the other tensors; got " + w.describe());
  expect_contiguous(w, "a flat byte buffer");
  // The split-K partials overwrite the workspace: it must not alias any array of the call.
  std::vector<const View*> others;
  for (const View& v : b.views) others.push_back(&v);
  expect_disjoint({&w}, others);
  return {w.data, size_t(w.numel()) * size_t(w.itemsize)};
}

// The one-call path: a plan made for exactly this call (the support check, the schedule and the
// workspace size all come from smla::Plan), run on the arrays' device. The workspace is the
// caller's: `workspace` when it is large enough, else one buffer from `alloc(nbytes)` (the
// caller's framework, on the arrays' device), alive until the launch is enqueued.
void call_sparse_mla(const In& q, const OptIn& q_rope, const In& kv, const In& idx, const OptIn& counts,
                     const OptIn& sink, const Out& out, const OptOut& lse, const std::string& format,
                     float softmax_scale, float q_scale, float k_scale, int rope_dim, const OptStr& lse_base,
                     const OptStr& q_dtype, const std::string& score_precision, const OptOut& workspace,
                     uintptr_t stream, nb::object alloc) {
  const KvFormat fmt = parse_kv_format(format);
  const ScorePrecision sp = parse_score(score_precision);
  Bound b = bind_sparse_mla(q, q_rope, kv, idx, counts, sink, out, lse, fmt, rope_dim, parse_lse_base(lse_base),
                            parse_hint(q_dtype), sp, softmax_scale, q_scale, k_scale);
  DeviceGuard guard(b.device);
  PlanConfig cfg;
  cfg.geometry = geometry_of(b.p);
  cfg.max_rows = std::max<int64_t>(b.p.num_tokens, 1);
  cfg.backend = backend_of(b.device);
  cfg.device = b.device.id;
  const Plan plan(cfg);
  auto [ws, ws_bytes] = workspace_of(workspace, b);
  const size_t need = b.p.num_tokens == 0 ? 0 : plan.workspace_bytes();
  nb::object keep;
  if (need > ws_bytes) {
    SMLA_CHECK(!alloc.is_none(), "workspace too small: this call needs " + s(int64_t(need)) + " bytes; got " +
                                     s(int64_t(ws_bytes)));
    keep = alloc(need);
    std::tie(ws, ws_bytes) = workspace_of(nb::cast<Out>(keep), b);
    SMLA_CHECK(ws_bytes >= need, "alloc returned " + s(int64_t(ws_bytes)) + " bytes; need " + s(int64_t(need)));
  }
  if (!b.device.cuda) {
    nb::gil_scoped_release release;
    plan.run(b.p, ws, ws_bytes, nullptr);
    return;
  }
  plan.run(b.p, ws, ws_bytes, reinterpret_cast<void*>(stream));
}

Bound bind_for_plan(const Plan& plan, const In& q, const OptIn& q_rope, const In& kv, const In& idx,
                    const OptIn& counts, const OptIn& sink, const Out& out, const OptOut& lse, float softmax_scale,
                    float q_scale, float k_scale) {
  const PlanConfig& cfg = plan.config();
  const Geometry& g = cfg.geometry;
  Bound b = bind_sparse_mla(q, q_rope, kv, idx, counts, sink, out, lse, g.format, g.rope_dim,
                            g.lse_mode == LseMode::kOff ? LseMode::kBaseE : g.lse_mode, g.q_dtype,
                            g.score_precision, softmax_scale, q_scale, k_scale);
  const bool want_cuda = cfg.backend == Backend::kCuda;
  SMLA_CHECK(b.device.cuda == want_cuda && (!want_cuda || b.device.id == cfg.device),
             "the plan runs on " + std::string(want_cuda ? "cuda:" + s(cfg.device) : "cpu") + " but the tensors are on " +
                 to_string(b.device) + "; make the plan with backend=\"" + (b.device.cuda ? "cuda" : "cpu") + "\"" +
                 (b.device.cuda ? ", device=" + s(b.device.id) : ""));
  return b;
}

void plan_run(const Plan& plan, const In& q, const In& kv, const In& idx, const Out& out, float softmax_scale,
              const OptIn& q_rope, const OptIn& counts, const OptIn& sink, const OptOut& lse, float q_scale,
              float k_scale, const OptOut& workspace, uintptr_t stream) {
  Bound b = bind_for_plan(plan, q, q_rope, kv, idx, counts, sink, out, lse, softmax_scale, q_scale, k_scale);
  auto [ws, ws_bytes] = workspace_of(workspace, b);
  DeviceGuard guard(b.device);
  if (!b.device.cuda) {
    nb::gil_scoped_release release;
    plan.run(b.p, ws, ws_bytes, nullptr);
    return;
  }
  plan.run(b.p, ws, ws_bytes, reinterpret_cast<void*>(stream));
}

void plan_check(const Plan& plan, const In& q, const In& kv, const In& idx, const Out& out, float softmax_scale,
                const OptIn& q_rope, const OptIn& counts, const OptIn& sink, const OptOut& lse, float q_scale,
                float k_scale, const OptOut& workspace) {
  Bound b = bind_for_plan(plan, q, q_rope, kv, idx, counts, sink, out, lse, softmax_scale, q_scale, k_scale);
  plan.check(b.p, workspace_of(workspace, b).second);
}

Geometry make_geometry(int num_heads, int topk, int rope_dim, const std::string& format, const std::string& q_dtype,
                       const OptStr& lse_base, bool sink, const std::string& score_precision) {
  Geometry g;
  g.num_heads = num_heads;
  g.topk = topk;
  g.rope_dim = rope_dim;
  g.format = parse_kv_format(format);
  g.q_dtype = parse_dtype(q_dtype);
  g.lse_mode = parse_lse_base(lse_base);
  g.sink = sink;
  g.score_precision = parse_score(score_precision);
  return g;
}

}  // namespace

void def_attention(nb::module_& m) {
  m.def("_sparse_mla", &call_sparse_mla, "q"_a, "q_rope"_a.none(), "kv"_a, "idx"_a, "counts"_a.none(), "sink"_a.none(),
        "out"_a, "lse"_a.none(), "format"_a, "softmax_scale"_a, "q_scale"_a, "k_scale"_a, "rope_dim"_a,
        "lse_base"_a.none(), "q_dtype"_a.none(), "score_precision"_a, "workspace"_a.none(), "stream"_a,
        "alloc"_a.none());

  nb::class_<Schedule>(m, "Schedule")
      .def_ro("bucket", &Schedule::bucket)
      .def_ro("num_splits", &Schedule::num_splits)
      .def("__repr__", [](const Schedule& sc) {
        return "Schedule(bucket=" + std::to_string(sc.bucket) + ", num_splits=" + std::to_string(sc.num_splits) + ")";
      });

  nb::class_<Plan>(m, "_Plan")
      .def("__init__",
           [](Plan* self, int num_heads, int topk, int rope_dim, const std::string& format, const std::string& q_dtype,
              const OptStr& lse_base, bool sink, const std::string& score_precision, int64_t max_rows,
              const std::vector<int64_t>& graph_sizes, bool batch_invariant, const std::string& backend, int device) {
             PlanConfig cfg;
             cfg.geometry = make_geometry(num_heads, topk, rope_dim, format, q_dtype, lse_base, sink, score_precision);
             cfg.max_rows = max_rows;
             cfg.graph_sizes = graph_sizes;
             cfg.batch_invariant = batch_invariant;
             cfg.backend = parse_backend(backend);
             cfg.device = device;
             new (self) Plan(cfg);
           },
           "num_heads"_a, "topk"_a, "rope_dim"_a, "format"_a, "q_dtype"_a, "lse_base"_a.none(), "sink"_a,
           "score_precision"_a, "max_rows"_a, "graph_sizes"_a, "batch_invariant"_a, "backend"_a, "device"_a)
      .def_prop_ro("workspace_bytes", &Plan::workspace_bytes)
      .def_prop_ro("schedules", &Plan::schedules)
      .def("schedule_for", &Plan::schedule_for, "num_tokens"_a, nb::rv_policy::copy)
      .def_prop_ro("num_heads", [](const Plan& p) { return p.config().geometry.num_heads; })
      .def_prop_ro("topk", [](const Plan& p) { return p.config().geometry.topk; })
      .def_prop_ro("rope_dim", [](const Plan& p) { return p.config().geometry.rope_dim; })
      .def_prop_ro("format", [](const Plan& p) { return std::string(to_string(p.config().geometry.format)); })
      .def_prop_ro("q_dtype", [](const Plan& p) { return std::string(to_string(p.config().geometry.q_dtype)); })
      .def_prop_ro("lse_base", [](const Plan& p) -> OptStr {
        const LseMode lm = p.config().geometry.lse_mode;
        if (lm == LseMode::kOff) return std::nullopt;
        return std::string(lm == LseMode::kBase2 ? "2" : "e");
      })
      .def_prop_ro("sink", [](const Plan& p) { return p.config().geometry.sink; })
      .def_prop_ro("score_precision",
                   [](const Plan& p) { return std::string(to_string(p.config().geometry.score_precision)); })
      .def_prop_ro("max_rows", [](const Plan& p) { return p.config().max_rows; })
      .def_prop_ro("backend", [](const Plan& p) { return std::string(to_string(p.config().backend)); })
      .def_prop_ro("device", [](const Plan& p) { return p.config().device; })
      .def("run", &plan_run, "q"_a, "kv"_a, "idx"_a, "out"_a, "softmax_scale"_a, "q_rope"_a.none(), "counts"_a.none(),
           "sink"_a.none(), "lse"_a.none(), "q_scale"_a, "k_scale"_a, "workspace"_a.none(), "stream"_a)
      .def("check", &plan_check, "q"_a, "kv"_a, "idx"_a, "out"_a, "softmax_scale"_a, "q_rope"_a.none(),
           "counts"_a.none(), "sink"_a.none(), "lse"_a.none(), "q_scale"_a, "k_scale"_a, "workspace"_a.none());

  m.def("_support",
        [](int num_heads, int topk, int rope_dim, const std::string& format, const std::string& q_dtype,
           const OptStr& lse_base, bool sink, const std::string& score_precision, const std::string& backend,
           int device) {
          return backend_support(parse_backend(backend),
                                 make_geometry(num_heads, topk, rope_dim, format, q_dtype, lse_base, sink,
                                               score_precision),
                                 device)
              .reason;
        },
        "num_heads"_a, "topk"_a, "rope_dim"_a, "format"_a, "q_dtype"_a, "lse_base"_a.none(), "sink"_a,
        "score_precision"_a, "backend"_a, "device"_a = 0);
  m.def("_kernel_name",
        [](int num_heads, int topk, int rope_dim, const std::string& format, const std::string& q_dtype) {
          return cuda_kernel_name(
              make_geometry(num_heads, topk, rope_dim, format, q_dtype, std::string("e"), false, "bf16"));
        },
        "num_heads"_a, "topk"_a, "rope_dim"_a, "format"_a, "q_dtype"_a);
  // The kernel and variant that would run the geometry on CUDA device `device` (None: any SM90
  // GPU), "sm90/sparse_mla/<format>_d<D>/<variant>"; the family alone when no variant runs it.
  m.def("_kernel_for",
        [](int num_heads, int topk, int rope_dim, const std::string& format, const std::string& q_dtype,
           const OptStr& lse_base, bool sink, const std::string& score_precision, std::optional<int> device) {
          const Geometry g =
              make_geometry(num_heads, topk, rope_dim, format, q_dtype, lse_base, sink, score_precision);
          return device ? cuda_kernel_for(g, cuda_device(*device)) : cuda_kernel_for(g);
        },
        "num_heads"_a, "topk"_a, "rope_dim"_a, "format"_a, "q_dtype"_a, "lse_base"_a.none(), "sink"_a,
        "score_precision"_a, "device"_a.none());
}

}  // namespace smla::py
