// The serving kernels from Python: the cache writer, index conversion and the empty-row finisher.
// Each binds its arrays into the C++ params struct and calls smla/api.h's function for the arrays'
// backend, which validates and dispatches.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include "bindings.h"

namespace smla::py {
namespace {

using namespace nb::literals;

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
  expect_cache_elem(vc, p.format);
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
  expect_disjoint({&vc}, {&vl, vr ? &*vr : nullptr, &vs});
  DeviceGuard guard(dev);
  nb::gil_scoped_release release;  // the CPU writer runs without the GIL; a launch does not need it
  write_cache(backend_of(dev), p, reinterpret_cast<void*>(stream));
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
  SMLA_CHECK(vb.shape[0] <= INT32_MAX && vb.shape[1] <= INT32_MAX,
             "block_table must be int32 [num_reqs, max_blocks] with both below 2^31; got " + vb.describe());
  p.block_table = static_cast<const int32_t*>(vb.data);
  p.bt_stride = vb.stride[0];
  p.num_reqs = int(vb.shape[0]);
  p.max_blocks = int(vb.shape[1]);
  const View vo = view(phys, "phys");
  expect_shape(vo, {T, K}, "int32 [T, K] like positions");
  expect_elem(vo, Elem::kI32, "int32 [T, K]");
  expect_inner_contiguous(vo, "[T, K]");
  expect_no_self_overlap(vo);
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
  expect_disjoint({&vo, vc ? &*vc : nullptr}, {&vp, &vb, vr ? &*vr : nullptr});
  DeviceGuard guard(dev);
  nb::gil_scoped_release release;
  convert_indices(backend_of(dev), p, reinterpret_cast<void*>(stream));
}

void call_finish_empty_rows(const In& counts, const Out& out, const OptOut& lse, uintptr_t stream) {
  // out fixes T and H; counts is checked against them (a mismatch blames counts).
  const View vo = view(out, "out");
  expect_shape(vo, {-1, -1, kLatentDim}, "[T, H, 512]");
  expect_inner_contiguous(vo, "[T, H, 512]");
  expect_no_self_overlap(vo);
  const int64_t T = vo.shape[0], H = vo.shape[1];
  SMLA_CHECK(H >= 1 && H <= (1 << 20), "out must be [T, H, 512] with H >= 1; got " + vo.describe());
  const View vc = view(counts, "counts");
  expect_shape(vc, {T}, "int32 [T] with T = " + s(T) + " (out's rows)");
  expect_elem(vc, Elem::kI32, "int32 [T]");
  expect_contiguous(vc, "[T]");
  std::optional<View> vl;
  if (lse) {
    vl = view(*lse, "lse");
    expect_shape(*vl, {T, H}, "float32 [T, H] like out");
    expect_elem(*vl, Elem::kFP32, "float32 [T, H]");
    expect_inner_contiguous(*vl, "[T, H]");
    expect_no_self_overlap(*vl);
  }
  cuda::FinishEmptyParams p;
  p.num_tokens = T;
  p.num_heads = int(H);
  p.counts = static_cast<const int32_t*>(vc.data);
  p.out = vo.data;
  p.out_stride_t = vo.stride[0];
  p.out_stride_h = vo.stride[1];
  p.out_dtype = out_dtype_of(vo, DType::kBF16);
  if (vl) {
    p.lse = static_cast<float*>(vl->data);
    p.lse_stride_t = vl->stride[0];
  }
  const Device dev = common_device({&vc, &vo, vl ? &*vl : nullptr});
  expect_disjoint({&vo, vl ? &*vl : nullptr}, {&vc});
  DeviceGuard guard(dev);
  nb::gil_scoped_release release;
  finish_empty_rows(backend_of(dev), p, reinterpret_cast<void*>(stream));
}

}  // namespace

void def_serving(nb::module_& m) {
  m.def("_write_cache", &call_write_cache, "latent"_a, "rope"_a.none(), "slot_mapping"_a, "cache"_a, "format"_a,
        "k_scale"_a, "block_size"_a.none(), "src_dtype"_a.none(), "stream"_a);
  m.def("_convert_indices", &call_convert_indices, "positions"_a, "block_table"_a, "phys"_a, "counts"_a.none(),
        "req_of_token"_a.none(), "block_size"_a, "block_stride_rows"_a.none(), "dcp_world"_a, "dcp_rank"_a,
        "dcp_interleave"_a, "stream"_a);
  m.def("_finish_empty_rows", &call_finish_empty_rows, "counts"_a, "out"_a, "lse"_a.none(), "stream"_a);
}

}  // namespace smla::py
