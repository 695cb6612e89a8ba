// A prefill problem for the ShardQ step tests (GPU, W = 1 in smla_gpu_tests; W GPUs in
// smla_shardq_multi_gpu): requests of given lengths back to back, every token's top-k rows of one
// replicated pool (random counts unless told otherwise, an all-invalid row, NaN-poisoned unselected rows), and the
// float64 reference of the unsharded call (all H heads on all T tokens).
#pragma once

#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#include "devtools/testing.h"
#include "smla/dist.h"
#include "smla/numeric.h"

namespace smla::test {

struct ShardqCase {
  smla::testing::HostProblem host;  // q [T, H, D] dense, idx [T, K], counts [T], out / lse unused
  std::vector<int64_t> lens;
  std::vector<int32_t> cu_seqlens;  // [R + 1]
  std::vector<double> ref_out, ref_lse;
  int64_t T = 0;
  int H = 0, K = 0;
  DType out_dtype = DType::kBF16;
};

inline ShardqCase make_shardq_case(KvFormat format, DType q_dtype, int heads, const std::vector<int64_t>& lens,
                                   uint64_t seed, int K = 160, bool use_counts = true) {
  ShardqCase c;
  c.lens = lens;
  c.T = std::accumulate(lens.begin(), lens.end(), int64_t(0));
  c.H = heads, c.K = K;
  c.out_dtype = q_dtype == DType::kFP16 ? DType::kFP16 : DType::kBF16;
  smla::testing::ProblemSpec s;
  s.num_tokens = c.T, s.num_heads = heads, s.topk = K, s.format = format, s.q_dtype = q_dtype;
  s.out_dtype = c.out_dtype, s.num_rows = 3000, s.use_counts = use_counts, s.all_invalid_row = c.T > 0;
  if (q_dtype == DType::kE4M3) s.q_scale = 0.5f;
  c.host = smla::testing::make_problem(s, seed);
  c.host.bind();
  c.cu_seqlens.push_back(0);
  for (int64_t n : lens) c.cu_seqlens.push_back(int32_t(c.cu_seqlens.back() + n));
  if (c.T > 0) smla::testing::reference_double(c.host, c.ref_out, c.ref_lse);
  return c;
}

// Rank r's heads of q: [T, H / W, D] (q_dtype bytes).
inline std::vector<uint8_t> local_q(const ShardqCase& c, int world, int rank) {
  const int64_t eb = dtype_bytes(c.host.spec.q_dtype), D = c.host.params.head_dim(), Hs = c.H / world;
  const int64_t row = Hs * D * eb;
  std::vector<uint8_t> q(size_t(std::max<int64_t>(c.T, 1) * row), 0);
  for (int64_t t = 0; t < c.T; ++t)
    std::memcpy(q.data() + t * row, c.host.q.data() + (t * c.H + rank * Hs) * D * eb, size_t(row));
  return q;
}

struct SliceDiff {
  double rel_l2 = 0, lse_max_abs = 0;
  int64_t nonfinite = 0;
};
// out [T, H / W, 512] (out_dtype bits) and lse [T, H / W] of rank r against the reference's heads
// [r * H / W, (r + 1) * H / W). lse may be empty (not compared).
inline SliceDiff compare_slice(const ShardqCase& c, int world, int rank, const std::vector<uint16_t>& out,
                               const std::vector<float>& lse) {
  const int Hs = c.H / world;
  SliceDiff d;
  double num2 = 0, den2 = 0;
  for (int64_t t = 0; t < c.T; ++t)
    for (int hl = 0; hl < Hs; ++hl) {
      const int64_t gi = t * c.H + rank * Hs + hl, li = t * Hs + hl;
      for (int k = 0; k < kLatentDim; ++k) {
        const uint16_t b = out[size_t(li * kLatentDim + k)];
        const double v = c.out_dtype == DType::kFP16 ? num::fp16_to_f32(b) : num::bf16_to_f32(b);
        const double r = c.ref_out[size_t(gi * kLatentDim + k)];
        if (!std::isfinite(v)) ++d.nonfinite;
        num2 += (v - r) * (v - r), den2 += r * r;
      }
      if (!lse.empty()) {
        const double g = lse[size_t(li)], r = c.ref_lse[size_t(gi)];
        double e;
        if (std::isinf(r) && std::isinf(g) && (r < 0) == (g < 0)) e = 0;
        else if (std::isnan(g) || std::isinf(r) || std::isinf(g)) e = INFINITY;
        else e = std::fabs(g - r);
        d.lse_max_abs = std::max(d.lse_max_abs, e);
      }
    }
  d.rel_l2 = d.nonfinite ? INFINITY : (den2 > 0 ? std::sqrt(num2 / den2) : std::sqrt(num2));
  return d;
}

inline dist::ShardqConfig shardq_config(const ShardqCase& c, int world, int rank, KvFormat format, int64_t max_tokens,
                                        int max_requests) {
  dist::ShardqConfig cfg;
  cfg.world = world, cfg.rank = rank, cfg.num_heads = c.H, cfg.format = format;
  cfg.q_dtype = c.host.spec.q_dtype, cfg.topk = c.K, cfg.max_tokens = max_tokens, cfg.max_requests = max_requests;
  // bf16 scores, explicitly: the tests hold every case to the bf16-score bar (out 1e-2, LSE 1e-3); an
  // e4m3 q with an fp8 cache would otherwise follow the Plan's default, which may pick fp8 scores.
  cfg.score_precision = ScorePrecision::kBF16;
  return cfg;
}

}  // namespace smla::test
