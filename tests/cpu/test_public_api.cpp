// A server's view: only the umbrella header smla/smla.hpp and the public libraries, no developer
// tools. The CPU backend runs through Plan (Backend::kCpu) on a problem built by hand with the
// public row codecs, and its result is checked against the definition (DESIGN.md §1) worked out
// here: with one selected row, the output is that row's latent and the LSE is its score.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "smla/smla.hpp"

namespace {

using namespace smla;

TEST(PublicApi, CpuBackendRunsThroughThePlan) {
  constexpr int kH = 2, kK = 4, kRows = 3, kD = kLatentDim + kRopeDim;
  const int row = row_bytes(KvFormat::kBF16, kRopeDim);
  // Row r holds latent values (r + 1) * 2^-6 * (d % 7 - 3) and RoPE values 2^-5 * (d % 3): all exact in bf16.
  std::vector<uint8_t> kv(size_t(kRows) * size_t(row));
  for (int r = 0; r < kRows; ++r) {
    std::vector<float> latent(kLatentDim), rope(kRopeDim);
    for (int d = 0; d < kLatentDim; ++d) latent[size_t(d)] = float(r + 1) * 0.015625f * float(d % 7 - 3);
    for (int d = 0; d < kRopeDim; ++d) rope[size_t(d)] = 0.03125f * float(d % 3);
    encode_row(KvFormat::kBF16, kRopeDim, latent.data(), rope.data(), 1.0f, kv.data() + size_t(r) * size_t(row));
  }
  // q [1, H, 576] bf16: head h is 2^-4 * (h + 1) everywhere.
  std::vector<uint16_t> q(size_t(kH) * kD);
  for (int h = 0; h < kH; ++h)
    for (int d = 0; d < kD; ++d) q[size_t(h * kD + d)] = num::f32_to_bf16(0.0625f * float(h + 1));
  const std::vector<int32_t> idx = {2, -1, -1, -1};  // one valid entry: row 2
  std::vector<uint16_t> out(size_t(kH) * kLatentDim, 0xffff);
  std::vector<float> lse(kH, NAN);

  SparseMlaParams p;
  p.num_tokens = 1, p.num_heads = kH, p.topk = kK;
  p.q = q.data(), p.kv = kv.data(), p.num_rows = kRows, p.kv_row_stride_bytes = row, p.idx = idx.data();
  p.softmax_scale = 0.1f, p.out = out.data(), p.lse = lse.data();
  set_dense_strides(p);

  PlanConfig cfg;
  cfg.backend = Backend::kCpu;
  cfg.geometry = geometry_of(p);
  cfg.max_rows = 8;
  const Plan plan(cfg);
  ASSERT_EQ(plan.workspace_bytes(), 0u);
  plan.run(p, nullptr, 0);

  for (int h = 0; h < kH; ++h) {
    // softmax over one entry is 1: out = row 2's latent, exactly (a bf16 value stays itself).
    for (int d = 0; d < kLatentDim; ++d)
      ASSERT_EQ(num::bf16_to_f32(out[size_t(h * kLatentDim + d)]), 3.0f * 0.015625f * float(d % 7 - 3)) << h << " " << d;
    // LSE = softmax_scale * q . k over the 576 dims of row 2.
    double dot = 0;
    for (int d = 0; d < kLatentDim; ++d) dot += 0.0625 * (h + 1) * 3.0 * 0.015625 * (d % 7 - 3);
    for (int d = 0; d < kRopeDim; ++d) dot += 0.0625 * (h + 1) * 0.03125 * (d % 3);
    EXPECT_NEAR(lse[size_t(h)], 0.1 * dot, 1e-5) << h;
  }
}

}  // namespace
