// Host-only helpers from Python: the DCP merge, ShardQ's ownership rules, the CPU row codecs, token -> request, and replay
// with its safetensors plumbing. NumPy arrays in, nothing on a device.
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <map>
#include <tuple>
#include <vector>

#include "bindings.h"
#include "smla/dcp.h"
#include "smla/formats.h"
#include "devtools/replay.h"
#include "devtools/safetensors.h"
#include "smla/serving.h"
#include "smla/shardq.h"

namespace smla::py {
namespace {

using namespace nb::literals;

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
  std::vector<View> ins;
  for (size_t i = 0; i < outs.size(); ++i) {
    const std::string n = "[" + s(int64_t(i)) + "]";
    ins.push_back(view(outs[i], ("outs" + n).c_str()));
    po.push_back(host_f32(ins.back(), {T, H, kLatentDim}, "[T, H, 512]"));
    ins.push_back(view(lses[i], ("lses" + n).c_str()));
    pl.push_back(host_f32(ins.back(), {T, H}, "[T, H]"));
  }
  std::vector<const View*> in_ptrs;
  for (const View& v : ins) in_ptrs.push_back(&v);
  expect_disjoint({&vo, &vl}, in_ptrs);
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
  std::optional<View> vrope;
  if (rope) {
    vrope = view(*rope, "rope");
    rp = host_f32(*vrope, {N, kRopeDim}, "[N, 64]");
  }
  const int rope_dim = rope ? kRopeDim : 0;
  const int rb = row_bytes(fmt, rope_dim);
  const View vr = view(rows, "rows");
  const bool rows_ok = !vr.device.cuda && vr.elem == Elem::kU8 && vr.shape == std::vector<int64_t>{N, rb};
  SMLA_CHECK(rows_ok, "rows must be a host uint8 [N, " + s(rb) + "] array; got " + vr.describe());
  expect_contiguous(vr, "[N, row_bytes]");
  expect_disjoint({&vr}, {&vl, vrope ? &*vrope : nullptr});
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
  expect_inner_contiguous(vr, "[N, >= row_bytes]");
  const int64_t N = vr.shape[0];
  const int D = kLatentDim + rope_dim;
  const View vo = view(out, "out");
  float* dst = const_cast<float*>(host_f32(vo, {N, D}, "[N, 512 + rope_dim]"));
  expect_disjoint({&vo}, {&vr});
  const auto* src = static_cast<const uint8_t*>(vr.data);
  const int64_t st = vr.stride[0];
  nb::gil_scoped_release release;
  for (int64_t i = 0; i < N; ++i) decode_row(fmt, rope_dim, src + i * st, k_scale, dst + i * D);
}

void call_token_to_request(const In& qsl, const Out& out) {
  const View vq = view(qsl, "query_start_loc"), vo = view(out, "out");
  SMLA_CHECK(!vq.device.cuda && !vo.device.cuda, "token_to_request takes host arrays");
  expect_elem(vq, Elem::kI32, "int32 [R + 1]");
  expect_elem(vo, Elem::kI32, "int32 [T]");
  SMLA_CHECK(vq.ndim() == 1 && vq.shape[0] >= 1 && vo.ndim() == 1, "query_start_loc must be int32 [R + 1], out int32 [T]");
  expect_contiguous(vq, "[R + 1]");
  expect_contiguous(vo, "[T]");
  SMLA_CHECK(vq.shape[0] - 1 <= INT32_MAX, "query_start_loc holds more than 2^31 requests");
  expect_disjoint({&vo}, {&vq});
  token_to_request(static_cast<const int32_t*>(vq.data), int(vq.shape[0] - 1), static_cast<int32_t*>(vo.data),
                   vo.shape[0]);
}

// ---- replay / safetensors ---------------------------------------------------------------------

using StTensor = std::tuple<std::string, std::vector<int64_t>, nb::bytes>;
using StDict = std::map<std::string, StTensor>;
using StMeta = std::map<std::string, std::string>;

StDict to_py(const st::File& f) {
  StDict d;
  for (const auto& [name, t] : f.tensors)
    d.emplace(name, StTensor{t.dtype, t.shape, nb::bytes(reinterpret_cast<const char*>(t.data.data()), t.data.size())});
  return d;
}

std::pair<StDict, StMeta> st_parse_bytes(const nb::bytes& data) {
  st::File f = st::parse(reinterpret_cast<const uint8_t*>(data.c_str()), data.size());
  return {to_py(f), f.metadata};
}

nb::bytes st_serialize_py(const StDict& tensors, const StMeta& metadata) {
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

std::pair<StDict, StMeta> call_replay(const nb::bytes& dump, const std::string& backend, const std::string& out_dtype) {
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

}  // namespace

void def_host(nb::module_& m) {
  m.def("_merge_partials", &call_merge_partials, "outs"_a, "lses"_a, "out"_a, "lse"_a);
  // ShardQ's host rules (smla/shardq.h, DESIGN.md §5b): the same functions the NCCL step is held to.
  m.def("shardq_owner_rank", &shardq::owner_rank, "j"_a, "n"_a, "world"_a,
        "ShardQ: the rank that attends token j (0 <= j < n) of a request of n tokens (zigzag: 2·world chunks of "
        "ceil(n / 2·world), rank r owns chunks r and 2·world - 1 - r).");
  m.def("shardq_max_tokens_per_rank", &shardq::max_tokens_per_rank, "max_tokens"_a, "world"_a, "max_requests"_a,
        "ShardQ: the most tokens a rank attends in a step of at most max_tokens tokens in at most max_requests "
        "requests, min(max_tokens, ceil(max_tokens / world) + 2·max_requests): the slots its buffers are padded to.");
  m.def(
      "shardq_layout",
      [](const std::vector<int64_t>& request_lens, int world) { return shardq::make_layout(request_lens, world).rank_tokens; },
      "request_lens"_a, "world"_a,
      "ShardQ: for requests laid out back to back, the ascending global token ids each rank attends (slot i of "
      "rank r holds layout[r][i]).");
  m.def("_encode_rows", &call_encode_rows, "format"_a, "latent"_a, "rope"_a.none(), "k_scale"_a, "rows"_a);
  m.def("_decode_rows", &call_decode_rows, "format"_a, "rows"_a, "rope_dim"_a, "k_scale"_a, "out"_a);
  m.def("reorder_batch_threshold", &reorder_batch_threshold, "num_heads"_a,
        "Decode/prefill split: requests with at most this many query tokens are decode.");
  m.def("_token_to_request", &call_token_to_request, "query_start_loc"_a, "out"_a);
  m.def("_replay", &call_replay, "dump"_a, "backend"_a, "out_dtype"_a);
  m.def("_st_parse", &st_parse_bytes, "data"_a);
  m.def("_st_serialize", &st_serialize_py, "tensors"_a, "metadata"_a);
}

}  // namespace smla::py
