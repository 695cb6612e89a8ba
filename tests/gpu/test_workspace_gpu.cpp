// The workspace layout of smla/workspace.h on the device: a Plan asks for exactly the largest
// layout of its buckets, and a split launch writes its partials inside the layout it was handed
// (both parts, nothing past the end) and still matches the float64 reference. Skips without an
// SM90 device.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include "../common/gpu_test.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "devtools/testing.h"
#include "smla/cuda.h"
#include "smla/engine.h"
#include "smla/numeric.h"
#include "smla/workspace.h"

namespace {

using namespace smla;
using smla::test::fresh_seed;

#define CUDA_OK(x) ASSERT_EQ((x), cudaSuccess) << #x

TEST(WorkspaceGpu, PlanAsksForTheLargestBucketLayout) {
  REQUIRE_GPU();
  for (int heads : {16, 64, 128})
    for (bool invariant : {false, true}) {
      PlanConfig c;
      c.geometry.num_heads = heads, c.geometry.topk = 2048;
      c.max_rows = 300, c.graph_sizes = {3, 24}, c.batch_invariant = invariant;
      const Plan plan(c);
      size_t want = 0;
      for (const auto& sc : plan.schedules())
        want = std::max(want, sparse_mla_workspace(sc.bucket, heads, sc.num_splits).bytes);
      EXPECT_EQ(plan.workspace_bytes(), want) << "H " << heads << (invariant ? " batch-invariant" : "");
      EXPECT_GT(want, 0u) << "some bucket of T <= 300 splits";
    }
}

TEST(WorkspaceGpu, PlanForAMissingDeviceIsRefused) {
  REQUIRE_GPU();
  PlanConfig c;
  c.device = cuda::device_count();  // one past the last device
  EXPECT_THROW(Plan{c}, Error);
  c.device = -1;
  EXPECT_THROW(Plan{c}, Error);
}

// A split launch handed exactly the layout's bytes, inside a larger poisoned buffer: the partial
// outputs and LSEs land in their parts, the guard past the layout keeps its poison, the result
// matches the reference.
TEST(WorkspaceGpu, SplitLaunchStaysInsideItsLayout) {
  REQUIRE_GPU();
  smla::testing::ProblemSpec s;
  s.num_tokens = 3, s.num_heads = 64, s.topk = 1000, s.num_rows = 4096;
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  auto hp = smla::testing::make_problem(s, seed);
  constexpr int kSplits = 4;
  const SparseMlaWorkspace layout = sparse_mla_workspace(s.num_tokens, s.num_heads, kSplits);
  ASSERT_GT(layout.part_lse.bytes, 0u);
  constexpr size_t kGuard = 1 << 16;
  constexpr unsigned char kPoison = 0x5a;

  SparseMlaParams p = hp.params;
  void *dq, *dkv, *didx, *dout, *dlse, *dws;
  CUDA_OK(cudaMalloc(&dq, hp.q.size()));
  CUDA_OK(cudaMalloc(&dkv, hp.kv.size()));
  CUDA_OK(cudaMalloc(&didx, hp.idx.size() * 4));
  CUDA_OK(cudaMalloc(&dout, hp.out.size()));
  CUDA_OK(cudaMalloc(&dlse, hp.lse.size() * 4));
  CUDA_OK(cudaMalloc(&dws, layout.bytes + kGuard));
  CUDA_OK(cudaMemcpy(dq, hp.q.data(), hp.q.size(), cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(dkv, hp.kv.data(), hp.kv.size(), cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(didx, hp.idx.data(), hp.idx.size() * 4, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemset(dws, kPoison, layout.bytes + kGuard));
  p.q = dq, p.kv = dkv, p.idx = static_cast<const int32_t*>(didx), p.out = dout, p.lse = static_cast<float*>(dlse);
  cuda::sparse_mla(p, dws, layout.bytes, nullptr, kSplits);
  CUDA_OK(cudaDeviceSynchronize());

  std::vector<unsigned char> ws(layout.bytes + kGuard);
  CUDA_OK(cudaMemcpy(ws.data(), dws, ws.size(), cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(hp.out.data(), dout, hp.out.size(), cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(hp.lse.data(), dlse, hp.lse.size() * 4, cudaMemcpyDeviceToHost));
  for (void* ptr : {dq, dkv, didx, dout, dlse, dws}) cudaFree(ptr);

  auto untouched = [&](size_t from, size_t to) {
    return size_t(std::count(ws.begin() + ptrdiff_t(from), ws.begin() + ptrdiff_t(to), kPoison));
  };
  EXPECT_EQ(untouched(layout.bytes, ws.size()), kGuard) << "the launch wrote past its workspace layout";
  // Every partial LSE is written (4 bytes of poison in a row would be a 0x5a5a5a5a float, ~1.5e16).
  const auto* lse = reinterpret_cast<const float*>(ws.data() + layout.part_lse.offset);
  int64_t lse_poisoned = 0;
  for (size_t i = 0; i < layout.part_lse.bytes / 4; ++i) {
    uint32_t u;
    std::memcpy(&u, lse + i, 4);
    lse_poisoned += u == 0x5a5a5a5au;
  }
  EXPECT_EQ(lse_poisoned, 0) << "partial LSEs not where the layout puts them";
  // The partial outputs are bf16 (smla/workspace.h), every one written: no 0x5a5a word (~1.5e16 as
  // bf16) is left, and each is a finite normalized output O / l, so within the rows' range (N(0, 1)
  // values: |x| < 16; an fp32 store, or bf16 halves in the wrong place, would not be).
  ASSERT_EQ(layout.part_out.bytes, size_t(s.num_tokens) * s.num_heads * kSplits * smla::kLatentDim * 2);
  int64_t out_poisoned = 0, out_bad = 0;
  for (size_t i = 0; i < layout.part_out.bytes / 2; ++i) {
    uint16_t u;
    std::memcpy(&u, ws.data() + layout.part_out.offset + 2 * i, 2);
    out_poisoned += u == 0x5a5au;
    const float x = smla::num::bf16_to_f32(u);
    out_bad += !(std::fabs(x) < 16.0f);
  }
  EXPECT_EQ(out_poisoned, 0) << "partial outputs not where the layout puts them";
  EXPECT_EQ(out_bad, 0) << "partial outputs that are not bf16 values of the rows' range";

  std::vector<double> ref_out, ref_lse;
  smla::testing::reference_double(hp, ref_out, ref_lse);
  const auto d = smla::testing::compare(hp, ref_out, ref_lse);
  EXPECT_EQ(d.nonfinite, 0);
  EXPECT_LE(d.rel_l2, 1e-2);
  EXPECT_LE(d.lse_max_abs, 1e-3);
}

}  // namespace
