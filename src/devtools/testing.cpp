#include "devtools/testing.h"

#include <cmath>
#include <cstring>
#include <random>

#include "reference/sparse_mla.h"
#include "smla/formats.h"
#include "smla/numeric.h"

namespace smla::testing {
namespace {

void store_q(std::vector<uint8_t>& buf, DType t, int64_t i, float v) {
  switch (t) {
    case DType::kBF16: reinterpret_cast<uint16_t*>(buf.data())[i] = num::f32_to_bf16(v); break;
    case DType::kFP16: reinterpret_cast<uint16_t*>(buf.data())[i] = num::f32_to_fp16(v); break;
    case DType::kE4M3: buf[size_t(i)] = num::f32_to_e4m3(v); break;
    default: fail("q dtype must be bf16, fp16 or e4m3");
  }
}

// Fills one row with bytes that decode to NaN in `format`.
void poison_row(KvFormat format, uint8_t* row, int nbytes) {
  switch (format) {
    case KvFormat::kBF16:
    case KvFormat::kFP16: std::memset(row, 0xff, size_t(nbytes)); break;  // 0xffff: NaN in both
    case KvFormat::kFP8E4M3: std::memset(row, 0x7f, size_t(nbytes)); break;
    case KvFormat::kFP8DsMla: {
      constexpr RowLayout l = row_layout(KvFormat::kFP8DsMla);
      std::memset(row, 0x7f, size_t(nbytes));
      const float nan = NAN;
      for (int i = 0; i < l.num_scales; ++i) std::memcpy(row + l.scale_offset + l.scale_bytes * i, &nan, sizeof nan);
      std::memset(row + l.rope_offset, 0xff, size_t(l.bytes - l.rope_offset));  // bf16 0xffff: NaN
      break;
    }
    case KvFormat::kNvFP4DsMla: std::memset(row, 0x7f, size_t(nbytes)); break;  // scales 0x7f = NaN
  }
}

}  // namespace

void HostProblem::bind() {
  const ProblemSpec& s = spec;
  SparseMlaParams p;
  p.num_tokens = s.num_tokens;
  p.num_heads = s.num_heads;
  p.rope_dim = s.rope_dim;
  p.topk = s.topk;
  p.q = q.data();
  p.q_rope = s.q_pair ? q_rope.data() : nullptr;
  p.q_dtype = s.q_dtype;
  p.kv = kv.data();
  p.num_rows = s.num_rows;
  p.format = s.format;
  p.idx = idx.data();
  p.counts = s.use_counts ? counts.data() : nullptr;
  p.sink = s.sink ? sink.data() : nullptr;
  p.softmax_scale = s.softmax_scale;
  p.q_scale = s.q_scale;
  p.k_scale = s.k_scale;
  p.out = out.data();
  p.out_dtype = s.out_dtype;
  p.lse = s.lse_mode == LseMode::kOff ? nullptr : lse.data();
  p.lse_mode = s.lse_mode;
  set_dense_strides(p);
  p.q_stride_h += s.q_head_pad;
  p.q_stride_t = p.q_stride_h * s.num_heads;
  p.out_stride_h += s.out_head_pad;
  p.out_stride_t = p.out_stride_h * s.num_heads;
  params = p;
}

HostProblem make_problem(const ProblemSpec& s, uint64_t seed) {
  HostProblem hp;
  hp.spec = s;
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<double> uni(0.0, 1.0);
  const int D = kLatentDim + s.rope_dim;
  const int64_t T = s.num_tokens, H = s.num_heads, K = s.topk;

  // q (optionally split into the latent/RoPE pair), with free head strides.
  const int qw = s.q_pair ? kLatentDim : D;
  const int64_t qsh = qw + s.q_head_pad;
  const int qb = dtype_bytes(s.q_dtype);
  hp.q.assign(size_t(T * H * qsh * qb), 0);
  hp.q_rope.assign(s.q_pair ? size_t(T * H * kRopeDim * qb) : 0, 0);
  const float qmul = s.q_dtype == DType::kE4M3 ? 1.0f / s.q_scale : 1.0f;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h) {
      for (int d = 0; d < qw; ++d) store_q(hp.q, s.q_dtype, (t * H + h) * qsh + d, normal(rng) * qmul);
      if (s.q_pair)
        for (int d = 0; d < kRopeDim; ++d) store_q(hp.q_rope, s.q_dtype, (t * H + h) * kRopeDim + d, normal(rng) * qmul);
    }

  // idx: random rows, some invalid; remember which rows are selected.
  hp.idx.assign(size_t(T * K), -1);
  hp.counts.assign(size_t(T), int32_t(K));
  std::vector<uint8_t> selected(size_t(s.num_rows), 0);
  for (int64_t t = 0; t < T; ++t) {
    const int n = s.use_counts ? int(rng() % uint64_t(K + 1)) : int(K);
    hp.counts[size_t(t)] = n;
    for (int64_t j = 0; j < K; ++j) {
      int32_t r;
      const double u = uni(rng);
      if (s.num_rows == 0 || u < s.invalid_fraction) {
        const int kind = int(rng() % 3);
        r = kind == 0 ? -1 : kind == 1 ? -int32_t(1 + rng() % 1000) : int32_t(s.num_rows + int64_t(rng() % 1000));
      } else {
        r = int32_t(rng() % uint64_t(s.num_rows));
        if (!s.duplicates) r = int32_t((t * 7919 + j) % s.num_rows);
      }
      if (s.all_invalid_row && t == 0) r = -1;
      hp.idx[size_t(t * K + j)] = r;
      if (j < n && r >= 0 && r < s.num_rows) selected[size_t(r)] = 1;
    }
  }

  // KV pool: selected rows hold encoded random data; the rest NaN (or random when not poisoning).
  const int rb = row_bytes(s.format, s.rope_dim);
  hp.kv.assign(size_t(s.num_rows * rb), 0);
  std::vector<float> latent(kLatentDim), rope(kRopeDim);
  for (int64_t r = 0; r < s.num_rows; ++r) {
    uint8_t* row = hp.kv.data() + r * rb;
    if (s.poison_unselected && !selected[size_t(r)]) {
      poison_row(s.format, row, rb);
      continue;
    }
    const float tile_mul = s.format == KvFormat::kFP8E4M3 ? s.k_scale : 1.0f;
    for (int d = 0; d < kLatentDim; ++d) latent[size_t(d)] = normal(rng) * tile_mul;
    for (int d = 0; d < s.rope_dim; ++d) rope[size_t(d)] = normal(rng) * tile_mul;
    encode_row(s.format, s.rope_dim, latent.data(), rope.data(), s.k_scale, row);
  }

  hp.sink.resize(size_t(H));
  for (auto& v : hp.sink) v = normal(rng);
  hp.lse.assign(size_t(T * H), NAN);
  const int64_t osh = kLatentDim + s.out_head_pad;
  hp.out.assign(size_t(T * H * osh * dtype_bytes(s.out_dtype)), 0xff);  // NaN in bf16/fp16/f32
  hp.bind();
  return hp;
}

void reference_double(const HostProblem& hp, std::vector<double>& ref_out, std::vector<double>& ref_lse) {
  const auto& p = hp.params;
  ref_out.assign(size_t(p.num_tokens * p.num_heads * kLatentDim), 0.0);
  ref_lse.assign(size_t(p.num_tokens * p.num_heads), 0.0);
  for (int64_t t = 0; t < p.num_tokens; ++t)
    for (int h = 0; h < p.num_heads; ++h) {
      double l;
      reference::sparse_mla_row_head(p, t, h, ref_out.data() + (t * p.num_heads + h) * kLatentDim, &l);
      ref_lse[size_t(t * p.num_heads + h)] = p.lse_mode == LseMode::kBase2 ? l * M_LOG2E : l;
    }
}

float out_value(const HostProblem& hp, int64_t t, int h, int d) {
  const auto& p = hp.params;
  const int64_t i = t * p.out_stride_t + h * p.out_stride_h + d;
  switch (p.out_dtype) {
    case DType::kBF16: return num::bf16_to_f32(reinterpret_cast<const uint16_t*>(hp.out.data())[i]);
    case DType::kFP16: return num::fp16_to_f32(reinterpret_cast<const uint16_t*>(hp.out.data())[i]);
    case DType::kFP32: return reinterpret_cast<const float*>(hp.out.data())[i];
    default: fail("bad out dtype");
  }
}

Diff compare(const HostProblem& got, const std::vector<double>& ref_out, const std::vector<double>& ref_lse) {
  const auto& p = got.params;
  Diff d;
  double num2 = 0, den2 = 0;
  for (int64_t t = 0; t < p.num_tokens; ++t)
    for (int h = 0; h < p.num_heads; ++h) {
      for (int k = 0; k < kLatentDim; ++k) {
        const double v = out_value(got, t, h, k);
        const double r = ref_out[size_t((t * p.num_heads + h) * kLatentDim + k)];
        if (!std::isfinite(v)) ++d.nonfinite;
        num2 += (v - r) * (v - r);
        den2 += r * r;
      }
      if (p.lse) {
        const double g = got.lse[size_t(t * p.lse_stride_t + h)];
        const double r = ref_lse[size_t(t * p.num_heads + h)];
        double e;
        if (std::isinf(r) && std::isinf(g) && (r < 0) == (g < 0)) e = 0;
        else if (std::isnan(g) || std::isinf(r) || std::isinf(g)) e = INFINITY;
        else e = std::fabs(g - r);
        d.lse_max_abs = std::max(d.lse_max_abs, e);
      }
    }
  d.rel_l2 = den2 > 0 ? std::sqrt(num2 / den2) : std::sqrt(num2);
  if (d.nonfinite) d.rel_l2 = INFINITY;
  return d;
}

}  // namespace smla::testing
