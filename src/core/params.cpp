// Host-side validation of SparseMlaParams: the one place user input is checked.
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <initializer_list>
#include <string>
#include <utility>

#include "smla/formats.h"
#include "smla/params.h"

namespace smla {
namespace {
std::string num(int64_t v) { return std::to_string(v); }

std::string fnum(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%g", v);
  return b;
}

std::string hex(uintptr_t v) {
  char b[32];
  std::snprintf(b, sizeof b, "%llx", static_cast<unsigned long long>(v));
  return b;
}

// The bytes a strided tensor can touch: [begin, end) from its base, its extent along each
// dimension (sizes >= 1, strides >= 0, in elements) and the contiguous last dimension.
struct Extent {
  const char* name = "";
  uintptr_t begin = 0, end = 0;  // end == begin: empty (nothing to compare)
};

Extent extent(const char* name, const void* base, int elem_bytes, std::initializer_list<std::pair<int64_t, int64_t>> dims,
              int64_t last) {
  // Sizes are bounded by validate()'s checks, but strides are the caller's: compute in 128 bits.
  __int128 span = last;
  for (const auto& [size, stride] : dims) span += __int128(size - 1) * stride;
  span *= elem_bytes;
  const auto b = reinterpret_cast<uintptr_t>(base);
  SMLA_CHECK(span <= __int128(UINTPTR_MAX - b),
             std::string(name) + " strides reach past the end of the address space; check its shape and strides");
  return {name, b, b + uintptr_t(span)};
}

// Outputs must not share a byte with an input or another output: the kernels read inputs after
// outputs are written (and the CPU reference writes rows while other threads read).
void check_disjoint(const Extent& out, const Extent& other) {
  if (out.begin == out.end || other.begin == other.end) return;
  if (out.begin < other.end && other.begin < out.end)
    fail(std::string(out.name) + " overlaps " + other.name + " in memory (bytes [0x" + hex(out.begin) + ", 0x" +
         hex(out.end) + ") and [0x" + hex(other.begin) + ", 0x" + hex(other.end) +
         ")); give " + out.name + " its own buffer");
}
}  // namespace

void validate(const SparseMlaParams& p) {
  SMLA_CHECK(p.num_tokens >= 0, "num_tokens (T) must be >= 0; got " + num(p.num_tokens));
  SMLA_CHECK(p.num_heads >= 1, "num_heads (H) must be >= 1; got " + num(p.num_heads));
  SMLA_CHECK(p.rope_dim == 0 || p.rope_dim == kRopeDim,
             "rope_dim must be 64 (D = 576) or 0 (D = 512); got " + num(p.rope_dim));
  SMLA_CHECK(p.topk >= 1, "idx must be int32 [T, K] with K >= 1; got K = " + num(p.topk));
  SMLA_CHECK(p.q_dtype == DType::kBF16 || p.q_dtype == DType::kFP16 || p.q_dtype == DType::kE4M3,
             "q must be bf16, fp16 or e4m3; got " + std::string(to_string(p.q_dtype)));
  SMLA_CHECK(p.q_dtype != DType::kE4M3 || p.format == KvFormat::kFP8E4M3 || p.format == KvFormat::kFP8DsMla,
             "an e4m3 q needs an fp8 cache format (fp8_e4m3 or fp8_ds_mla, with q_scale); use a bf16 q for " +
                 std::string(to_string(p.format)));
  SMLA_CHECK(p.q_dtype != DType::kFP16 || p.format == KvFormat::kFP16 || format_is_quantized(p.format),
             "an fp16 q needs an fp16 (or quantized) cache; got a bf16 cache: cast q to bf16");
  SMLA_CHECK(p.q_dtype != DType::kBF16 || p.format != KvFormat::kFP16,
             "a bf16 q needs a bf16 (or quantized) cache; got an fp16 cache: cast q to fp16");
  SMLA_CHECK(std::isfinite(p.softmax_scale) && std::fabs(p.softmax_scale) <= kMaxSoftmaxScale,
             "softmax_scale must be finite and in [-1e4, 1e4] (DeepSeek-V3.2 uses 0.1352338); got " +
                 fnum(p.softmax_scale));
  SMLA_CHECK(std::isfinite(p.q_scale) && p.q_scale > 0, "q_scale must be finite and > 0; got " + fnum(p.q_scale));
  SMLA_CHECK(std::isfinite(p.k_scale) && p.k_scale > 0, "k_scale must be finite and > 0; got " + fnum(p.k_scale));
  {
    // The score scale the kernels apply: softmax_scale * q_scale (* k_scale for fp8_e4m3 rows).
    const double k = p.format == KvFormat::kFP8E4M3 ? double(p.k_scale) : 1.0;
    const double c = double(p.softmax_scale) * double(p.q_scale) * k;
    SMLA_CHECK(std::fabs(c) <= kMaxSoftmaxScale,
               "softmax_scale * q_scale" + std::string(p.format == KvFormat::kFP8E4M3 ? " * k_scale" : "") +
                   " must lie in [-1e4, 1e4]; got " + fnum(c) + ": check the scales");
  }
  SMLA_CHECK(p.num_rows >= 0 && p.num_rows <= (int64_t(1) << 31),
             "num_rows must be in [0, 2^31] (idx is int32); got " + num(p.num_rows));
  const int rb = row_bytes(p.format, p.rope_dim);
  SMLA_CHECK(p.num_rows == 0 || p.kv != nullptr, "kv is null but num_rows = " + num(p.num_rows));
  SMLA_CHECK(p.num_rows == 0 || p.kv_row_stride_bytes >= rb,
             "kv row stride must be >= " + num(rb) + " bytes for " + std::string(to_string(p.format)) +
                 "; got " + num(p.kv_row_stride_bytes));
  SMLA_CHECK(p.out_dtype == DType::kFP32 || (p.q_dtype == DType::kFP16) == (p.out_dtype == DType::kFP16),
             "out must be fp16 for an fp16 q and bf16 otherwise (or f32 on the CPU backend); got " +
                 std::string(to_string(p.out_dtype)));
  SMLA_CHECK(p.out_dtype == DType::kBF16 || p.out_dtype == DType::kFP16 || p.out_dtype == DType::kFP32,
             "out must be bf16, fp16 or f32");
  if (p.num_tokens == 0) return;  // empty problem: nothing is read or written
  const int D = p.head_dim();
  const int q_width = p.q_rope ? kLatentDim : D;
  SMLA_CHECK(p.q != nullptr, "q is null");
  SMLA_CHECK(p.q_stride_h >= q_width && p.q_stride_t >= 0,
             "q must be [T, H, " + num(q_width) + "] with head stride >= " + num(q_width) + "; got " +
                 num(p.q_stride_h));
  if (p.q_rope) {
    SMLA_CHECK(p.rope_dim == kRopeDim, "q_rope is given but rope_dim = 0; pass q alone");
    SMLA_CHECK(p.q_rope_stride_h >= kRopeDim && p.q_rope_stride_t >= 0,
               "q_rope must be [T, H, 64] with head stride >= 64; got " + num(p.q_rope_stride_h));
  }
  SMLA_CHECK(p.idx != nullptr, "idx is null");
  SMLA_CHECK(p.idx_stride_t >= p.topk,
             "idx row stride must be >= K = " + num(p.topk) + "; got " + num(p.idx_stride_t));
  SMLA_CHECK(p.out != nullptr, "out is null");
  SMLA_CHECK(p.out_stride_h >= kLatentDim &&
                 p.out_stride_t >= int64_t(p.num_heads - 1) * p.out_stride_h + kLatentDim,
             "out must be [T, H, 512] with non-overlapping rows (head stride >= 512, row stride >= "
             "(H-1)*head stride + 512)");
  SMLA_CHECK(p.lse == nullptr || p.lse_stride_t >= p.num_heads,
             "lse must be fp32 [T, H] with row stride >= H; got " + num(p.lse_stride_t));

  // ---- outputs share no byte with an input or with each other (extents from shape and strides)
  const int64_t T = p.num_tokens, H = p.num_heads;
  const int qb = dtype_bytes(p.q_dtype);
  // A fixed array, not a vector: validate() runs inside Plan::run, which never allocates.
  std::array<Extent, 6> inputs;
  size_t n_inputs = 0;
  inputs[n_inputs++] = extent("q", p.q, qb, {{T, p.q_stride_t}, {H, p.q_stride_h}}, q_width);
  inputs[n_inputs++] = extent("idx", p.idx, 4, {{T, p.idx_stride_t}}, p.topk);
  if (p.q_rope)
    inputs[n_inputs++] = extent("q_rope", p.q_rope, qb, {{T, p.q_rope_stride_t}, {H, p.q_rope_stride_h}}, kRopeDim);
  if (p.num_rows > 0) inputs[n_inputs++] = extent("kv", p.kv, 1, {{p.num_rows, p.kv_row_stride_bytes}}, rb);
  if (p.counts) inputs[n_inputs++] = extent("counts", p.counts, 4, {}, T);
  if (p.sink) inputs[n_inputs++] = extent("sink", p.sink, 4, {}, H);
  const Extent out = extent("out", p.out, dtype_bytes(p.out_dtype), {{T, p.out_stride_t}, {H, p.out_stride_h}}, kLatentDim);
  for (size_t i = 0; i < n_inputs; ++i) check_disjoint(out, inputs[i]);
  if (p.lse != nullptr && p.lse_mode != LseMode::kOff) {
    const Extent lse = extent("lse", p.lse, 4, {{T, p.lse_stride_t}}, H);
    check_disjoint(lse, out);
    for (size_t i = 0; i < n_inputs; ++i) check_disjoint(lse, inputs[i]);
  }
}

void check_host_sink(const SparseMlaParams& p) {
  if (p.sink == nullptr) return;
  for (int h = 0; h < p.num_heads; ++h)
    SMLA_CHECK(!std::isnan(p.sink[h]) && p.sink[h] != INFINITY,
               "sink[" + num(h) + "] is " + fnum(p.sink[h]) +
                   "; sink must hold finite fp32 logits (-inf: no sink for that head)");
}

void set_dense_strides(SparseMlaParams& p) {
  const int qw = p.q_rope ? kLatentDim : p.head_dim();
  p.q_stride_h = qw;
  p.q_stride_t = int64_t(p.num_heads) * qw;
  p.q_rope_stride_h = kRopeDim;
  p.q_rope_stride_t = int64_t(p.num_heads) * kRopeDim;
  if (p.kv_row_stride_bytes == 0) p.kv_row_stride_bytes = row_bytes(p.format, p.rope_dim);
  p.idx_stride_t = p.topk;
  p.out_stride_h = kLatentDim;
  p.out_stride_t = int64_t(p.num_heads) * kLatentDim;
  p.lse_stride_t = p.num_heads;
}

}  // namespace smla
