// `smla replay`: run one dumped attention call (q, kv, idx, counts, sink + string metadata) on a
// backend and return out and lse. Every tensor is checked against the metadata before a
// SparseMlaParams is built, so a wrong dump fails with one line naming the tensor.
#include "devtools/replay.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "smla/formats.h"

namespace smla {
namespace {

[[noreturn]] void bad(const std::string& msg) { fail("replay: " + msg); }

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

std::string describe(const st::Tensor& t) { return t.dtype + " " + shape_str(t.shape); }

// The tensor `name` or null; a File built in code (not parsed) may be inconsistent, so the byte
// count is checked against dtype x shape before anything reads it.
const st::Tensor* find(const st::File& f, const std::string& name) {
  auto it = f.tensors.find(name);
  if (it == f.tensors.end()) return nullptr;
  const st::Tensor& t = it->second;
  int item = 0;
  try {
    item = st::itemsize(t.dtype);
  } catch (const Error&) {
    bad("tensor '" + name + "' has an unknown dtype '" + t.dtype + "'");
  }
  uint64_t n = uint64_t(item);
  for (int64_t d : t.shape) {
    if (d < 0 || (d > 0 && n > (uint64_t(1) << 62) / uint64_t(d)))
      bad("tensor '" + name + "' has an invalid shape " + shape_str(t.shape));
    n *= uint64_t(d);
  }
  if (t.data.size() != n)
    bad("tensor '" + name + "' holds " + std::to_string(t.data.size()) + " bytes but " + describe(t) + " needs " +
        std::to_string(n));
  return &t;
}

const st::Tensor& require(const st::File& f, const std::string& name, const std::string& expect) {
  const st::Tensor* t = find(f, name);
  if (!t) bad("the dump has no tensor '" + name + "'; expected " + expect);
  return *t;
}

// The one number rule for every numeric metadata value (softmax_scale, q_scale, k_scale,
// rope_dim): a string in JSON number syntax, -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?, with
// no spaces, '+', hex, inf or nan; its value must lie in the key's range, and a nonzero literal
// must not round to 0 in float32.
constexpr const char* kNumberRule = "a decimal number in JSON syntax (e.g. 0.1352338, 64, 1e-3; no spaces, '+', hex, inf or nan)";

bool json_number_syntax(const std::string& s, bool& nonzero) {
  size_t i = 0;
  const size_t n = s.size();
  auto digits = [&] {
    const size_t b = i;
    for (; i < n && s[i] >= '0' && s[i] <= '9'; ++i) nonzero |= s[i] != '0';
    return i > b;
  };
  nonzero = false;
  if (i < n && s[i] == '-') ++i;
  if (i < n && s[i] == '0') ++i;
  else if (!(i < n && s[i] >= '1' && s[i] <= '9' && digits())) return false;
  if (i < n && s[i] == '.') {
    ++i;
    if (!digits()) return false;
  }
  if (i < n && (s[i] == 'e' || s[i] == 'E')) {
    ++i;
    if (i < n && (s[i] == '+' || s[i] == '-')) ++i;
    bool exp_nonzero = false;
    std::swap(nonzero, exp_nonzero);
    if (!digits()) return false;
    nonzero = exp_nonzero;  // the exponent's digits do not make the value nonzero
  }
  return i == n;
}

// metadata[key] under the number rule, in [lo, hi] (lo excluded when lo_open); dflt when absent
// (null: required). range names the range in the error.
float meta_number(const st::File& f, const std::string& key, const float* dflt, double lo, double hi, bool lo_open,
                  const std::string& range) {
  auto it = f.metadata.find(key);
  if (it == f.metadata.end()) {
    if (!dflt) bad("metadata '" + key + "' is missing; the dump must state it as " + kNumberRule + ", " + range);
    return *dflt;
  }
  const std::string& s = it->second;
  bool nonzero = false;
  if (!json_number_syntax(s, nonzero))
    bad("metadata '" + key + "' must be " + kNumberRule + ", " + range + "; got '" + s + "'");
  const double v = std::strtod(s.c_str(), nullptr);
  if (!(lo_open ? v > lo : v >= lo) || !(v <= hi))
    bad("metadata '" + key + "' must be " + range + "; got '" + s + "'");
  const float fv = float(v);
  if (nonzero && fv == 0.0f)
    bad("metadata '" + key + "' = '" + s + "' is nonzero but rounds to 0 in float32; must be " + range);
  return fv;
}

template <typename T>
std::vector<T> typed_copy(const st::Tensor& t) {
  std::vector<T> v(t.data.size() / sizeof(T));
  if (!v.empty()) std::memcpy(v.data(), t.data.data(), v.size() * sizeof(T));
  return v;
}

st::Tensor make_tensor(const std::string& dtype, std::vector<int64_t> shape, const void* data, size_t bytes) {
  st::Tensor t;
  t.dtype = dtype;
  t.shape = std::move(shape);
  const auto* b = static_cast<const uint8_t*>(data);
  t.data.assign(b, b + bytes);
  return t;
}

}  // namespace

st::File replay(const st::File& dump, const ReplayOptions& opt) {
  // ---- metadata
  auto fmt_it = dump.metadata.find("format");
  if (fmt_it == dump.metadata.end())
    bad("metadata 'format' is missing; set it to one of bf16, fp16, fp8_e4m3, fp8_ds_mla, nvfp4_ds_mla");
  KvFormat format;
  try {
    format = parse_kv_format(fmt_it->second);
  } catch (const Error& e) {
    bad(std::string("metadata 'format': ") + e.what());
  }
  const float one = 1.0f;
  const double fmax = std::numeric_limits<float>::max();
  const float softmax_scale =
      meta_number(dump, "softmax_scale", nullptr, -kMaxSoftmaxScale, kMaxSoftmaxScale, false, "in [-1e4, 1e4]");
  const float q_scale = meta_number(dump, "q_scale", &one, 0, fmax, true, "> 0 and finite in float32");
  const float k_scale = meta_number(dump, "k_scale", &one, 0, fmax, true, "> 0 and finite in float32");
  LseMode lse_mode = LseMode::kBaseE;
  if (auto it = dump.metadata.find("lse_base"); it != dump.metadata.end()) {
    if (it->second == "2") lse_mode = LseMode::kBase2;
    else if (it->second != "e") bad("metadata 'lse_base' must be 'e' or '2'; got '" + it->second + "'");
  }

  // ---- q [T, H, D]: D = 576 or 512 fixes rope_dim when the metadata leaves it out.
  const st::Tensor& q = require(dump, "q", "q [T, H, 576 or 512] BF16, F16 or F8_E4M3");
  if (q.shape.size() != 3) bad("tensor 'q' must be [T, H, D]; got " + describe(q));
  int rope_dim = q.shape[2] == kLatentDim ? 0 : kRopeDim;
  if (dump.metadata.count("rope_dim")) {
    const float dflt = float(rope_dim);
    const float r = meta_number(dump, "rope_dim", &dflt, 0, kRopeDim, false, "64 or 0");
    if (r != 0.0f && r != float(kRopeDim)) bad("metadata 'rope_dim' must be 64 or 0; got '" + dump.metadata.at("rope_dim") + "'");
    rope_dim = int(r);
  }
  const int D = kLatentDim + rope_dim;
  DType q_dtype;
  if (q.dtype == "BF16") q_dtype = DType::kBF16;
  else if (q.dtype == "F16") q_dtype = DType::kFP16;
  else if (q.dtype == "F8_E4M3" && (format == KvFormat::kFP8E4M3 || format == KvFormat::kFP8DsMla))
    q_dtype = DType::kE4M3;
  else if (q.dtype == "F8_E4M3")
    bad("tensor 'q' is F8_E4M3 but the format is " + std::string(to_string(format)) +
        "; an e4m3 q needs format fp8_e4m3 or fp8_ds_mla (use a BF16 q)");
  else bad("tensor 'q' must be BF16, F16 or F8_E4M3; got " + describe(q));
  if (q.shape[1] < 1 || q.shape[1] > (int64_t(1) << 20) || q.shape[2] != D)
    bad("tensor 'q' must be [T, H, " + std::to_string(D) + "] with H >= 1 (rope_dim " + std::to_string(rope_dim) +
        "); got " + describe(q));
  const int64_t T = q.shape[0];
  const int H = int(q.shape[1]);

  // ---- kv [N, D] 16-bit values, or [N, row_bytes] bytes for the quantized formats
  const int rb = row_bytes(format, rope_dim);
  const st::Tensor& kv = require(dump, "kv", "the KV rows [N, row]");
  std::string kv_want;
  bool kv_ok = kv.shape.size() == 2;
  switch (format) {
    case KvFormat::kBF16:
    case KvFormat::kFP16: {
      const std::string dt = format == KvFormat::kBF16 ? "BF16" : "F16";
      kv_want = dt + " [N, " + std::to_string(D) + "]";
      kv_ok = kv_ok && kv.dtype == dt && kv.shape[1] == D;
      break;
    }
    default:
      kv_want = "F8_E4M3 or U8 [N, " + std::to_string(rb) + "] (row bytes of " + std::string(to_string(format)) + ")";
      kv_ok = kv_ok && (kv.dtype == "F8_E4M3" || kv.dtype == "U8") && kv.shape[1] == rb;
  }
  if (!kv_ok) bad("tensor 'kv' must be " + kv_want + " for format " + std::string(to_string(format)) + "; got " + describe(kv));
  const int64_t N = kv.shape[0];
  if (N > (int64_t(1) << 31)) bad("tensor 'kv' has " + std::to_string(N) + " rows; int32 idx addresses at most 2^31");

  // ---- idx [T, K] I32, counts [T] I32, sink [H] F32
  const st::Tensor& idx_t = require(dump, "idx", "idx [T, K] I32");
  if (idx_t.dtype != "I32" || idx_t.shape.size() != 2 || idx_t.shape[0] != T || idx_t.shape[1] < 1 ||
      idx_t.shape[1] > std::numeric_limits<int>::max())
    bad("tensor 'idx' must be I32 [T, K] with T = " + std::to_string(T) + " (from q) and K >= 1; got " +
        describe(idx_t));
  const int K = int(idx_t.shape[1]);
  const std::vector<int32_t> idx = typed_copy<int32_t>(idx_t);
  std::vector<int32_t> counts;
  const st::Tensor* counts_t = find(dump, "counts");
  if (counts_t) {
    if (counts_t->dtype != "I32" || counts_t->shape != std::vector<int64_t>{T})
      bad("tensor 'counts' must be I32 [T] with T = " + std::to_string(T) + "; got " + describe(*counts_t));
    counts = typed_copy<int32_t>(*counts_t);
  }
  std::vector<float> sink;
  const st::Tensor* sink_t = find(dump, "sink");
  if (sink_t) {
    if (sink_t->dtype != "F32" || sink_t->shape != std::vector<int64_t>{H})
      bad("tensor 'sink' must be F32 [H] with H = " + std::to_string(H) + "; got " + describe(*sink_t));
    sink = typed_copy<float>(*sink_t);
  }

  // ---- outputs: f32 on request, else the 16-bit type that matches q
  DType out_dtype = opt.out_dtype == DType::kFP32 ? DType::kFP32
                    : q_dtype == DType::kFP16     ? DType::kFP16
                                                  : DType::kBF16;
  if (opt.out_dtype != DType::kFP32 && opt.out_dtype != DType::kBF16 && opt.out_dtype != DType::kFP16)
    bad("out dtype must be bf16 or f32; got " + std::string(to_string(opt.out_dtype)));
  std::vector<uint8_t> out(size_t(T) * H * kLatentDim * dtype_bytes(out_dtype));
  std::vector<float> lse(size_t(T) * H);

  SparseMlaParams p;
  p.num_tokens = T;
  p.num_heads = H;
  p.rope_dim = rope_dim;
  p.topk = K;
  p.q = q.data.data();
  p.q_dtype = q_dtype;
  p.kv = N > 0 ? kv.data.data() : nullptr;
  p.num_rows = N;
  p.format = format;
  p.idx = idx.data();
  p.counts = counts_t ? counts.data() : nullptr;
  p.sink = sink_t ? sink.data() : nullptr;
  p.softmax_scale = softmax_scale;
  p.q_scale = q_scale;
  p.k_scale = k_scale;
  p.out = out.data();
  p.out_dtype = out_dtype;
  p.lse = lse.data();
  p.lse_mode = lse_mode;
  set_dense_strides(p);
  check_host_sink(p);  // the sink is host-visible here, whichever backend runs
  run_host(opt.backend, p, kv.data.size());

  st::File result;
  const std::string out_st = out_dtype == DType::kFP32 ? "F32" : out_dtype == DType::kFP16 ? "F16" : "BF16";
  result.tensors["out"] = make_tensor(out_st, {T, H, kLatentDim}, out.data(), out.size());
  result.tensors["lse"] = make_tensor("F32", {T, H}, lse.data(), lse.size() * sizeof(float));
  result.metadata["format"] = std::string(to_string(format));
  result.metadata["backend"] = std::string(to_string(opt.backend));
  result.metadata["lse_base"] = lse_mode == LseMode::kBase2 ? "2" : "e";
  return result;
}

}  // namespace smla
