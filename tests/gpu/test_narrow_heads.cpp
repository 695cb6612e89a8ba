// SMLA_SM90_NARROW_HEADS (opt-in; docs/perf-history.md#s12-latency-budget): h64.ws runs fewer real
// heads per 64-row block (32 or 16, narrow_block_heads) where a call leaves SMs idle (T = 1 at
// K = 2048; small T with few splits), the split unchanged. Every head's row of S, its softmax, P V and
// partial are computed by the same wgmma instructions over the same tile as in its 64-head block, only
// at another row of the tile, and the merge is unchanged, so the switch must give the default's output
// and LSE bit for bit (both modes run in one process: set_narrow_heads_for_testing). Each case also
// checks the narrow run against the float64 reference (so a bit difference, if the hardware's rows were
// not independent, would still say whether the result is right), that the case really runs narrow
// blocks, and a CUDA graph replay.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include "../common/gpu_test.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "cuda/sm90/sparse_mla/config.h"
#include "devtools/testing.h"
#include "smla/cuda.h"
#include "smla/support.h"

namespace {

using smla::DType;
using smla::KvFormat;
using smla::LseMode;
using smla::test::fresh_seed;
namespace k = smla::cuda::sm90::sparse_mla;

void cuda_ok(cudaError_t e, const char* what) { ASSERT_EQ(e, cudaSuccess) << what << ": " << cudaGetErrorString(e); }

struct Dev {
  void* ptr = nullptr;
  size_t bytes = 0;
  Dev() = default;
  Dev(const void* host, size_t n) : bytes(n) {
    if (n == 0) return;
    if (cudaMalloc(&ptr, n) != cudaSuccess) ptr = nullptr;
    if (ptr != nullptr && host != nullptr) cudaMemcpy(ptr, host, n, cudaMemcpyHostToDevice);
  }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  ~Dev() {
    if (ptr != nullptr) cudaFree(ptr);
  }
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr);
  }
};

// Restores the environment's choice however the test ends.
struct NarrowGuard {
  ~NarrowGuard() { k::set_narrow_heads_for_testing(-1); }
};

struct NarrowCase {
  std::string name;
  smla::testing::ProblemSpec spec;
  int splits;         // 0: the launcher's choice
  int expect_narrow;  // heads per block the switch gives on a 132-SM H200 (64: the case checks it stays)
};

smla::testing::ProblemSpec spec_of(KvFormat f, int64_t T, int H, int K) {
  smla::testing::ProblemSpec s;
  s.format = f;
  if (f == KvFormat::kFP16) s.q_dtype = DType::kFP16, s.out_dtype = DType::kFP16;
  s.num_tokens = T, s.num_heads = H, s.topk = K;
  s.num_rows = K > 1024 ? 16384 : 4096;
  return s;
}

std::vector<NarrowCase> narrow_cases() {
  std::vector<NarrowCase> v;
  v.push_back({"bf16_T1_H128_K2048", spec_of(KvFormat::kBF16, 1, 128, 2048), 0, 32});
  v.push_back({"bf16_T1_H64_K2048", spec_of(KvFormat::kBF16, 1, 64, 2048), 0, 16});
  {
    auto s = spec_of(KvFormat::kBF16, 1, 96, 2048);  // a group with 32 real heads of 96
    s.sink = true, s.lse_mode = LseMode::kBase2;
    v.push_back({"bf16_T1_H96_K2048_sink_lse2", s, 0, 32});
  }
  {
    auto s = spec_of(KvFormat::kBF16, 1, 37, 2048);  // the last 16-head group has 5 real heads; counts
    s.use_counts = true, s.sink = true, s.invalid_fraction = 0.4;
    v.push_back({"bf16_T1_H37_K2048_counts_sink_invalid", s, 0, 16});
  }
  {
    auto s = spec_of(KvFormat::kBF16, 1, 128, 2048);  // D = 512, q as a (latent, RoPE) pair is D = 576 only
    s.rope_dim = 0, s.out_head_pad = 8, s.q_head_pad = 8, s.lse_mode = LseMode::kOff;
    v.push_back({"bf16_T1_H128_K2048_D512_padded_strides_nolse", s, 16, 16});
  }
  {
    auto s = spec_of(KvFormat::kBF16, 1, 128, 2048);
    s.q_pair = true;
    v.push_back({"bf16_T1_H128_K2048_qpair", s, 0, 32});
  }
  {
    auto s = spec_of(KvFormat::kBF16, 3, 128, 77);  // no split (outputs written by the blocks), a partial tile
    s.use_counts = true, s.sink = true, s.all_invalid_row = true;
    v.push_back({"bf16_T3_H128_K77_nosplit_counts_sink_all_invalid", s, 0, 16});
  }
  v.push_back({"fp16_T1_H64_K2048", spec_of(KvFormat::kFP16, 1, 64, 2048), 0, 16});
  v.push_back({"fp8_ds_mla_T1_H128_K2048", spec_of(KvFormat::kFP8DsMla, 1, 128, 2048), 0, 32});
  {
    auto s = spec_of(KvFormat::kFP8DsMla, 1, 64, 2048);
    s.use_counts = true;
    v.push_back({"fp8_ds_mla_T1_H64_K2048_counts", s, 0, 16});
  }
  v.push_back({"fp8_e4m3_T1_H128_K2048", spec_of(KvFormat::kFP8E4M3, 1, 128, 2048), 0, 32});
  v.push_back({"nvfp4_ds_mla_T1_H128_K2048", spec_of(KvFormat::kNvFP4DsMla, 1, 128, 2048), 0, 32});
  // Shapes the switch leaves alone (already one block per SM or more): the same launch both ways.
  v.push_back({"bf16_T4_H128_K2048_unchanged", spec_of(KvFormat::kBF16, 4, 128, 2048), 0, 64});
  v.push_back({"bf16_T1_H16_K2048_unchanged", spec_of(KvFormat::kBF16, 1, 16, 2048), 0, 64});
  return v;
}

class NarrowHeads : public ::testing::TestWithParam<NarrowCase> {};

TEST_P(NarrowHeads, SameBitsAsDefault) {
  REQUIRE_GPU();
  NarrowGuard guard;
  const NarrowCase& c = GetParam();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(c.name + " seed " + std::to_string(seed));
  auto hp = smla::testing::make_problem(c.spec, seed);
  smla::SparseMlaParams p = hp.params;
  const smla::CudaVariant* variant = smla::cuda_variant_for(smla::geometry_of(p), smla::cuda::device_info(0));
  ASSERT_NE(variant, nullptr);
  ASSERT_STREQ(variant->name, "h64.ws") << "the switch applies to h64.ws only";
  const int sms = smla::cuda::device_info(0).num_sms;
  const int splits = c.splits > 0 ? c.splits : smla::cuda::sparse_mla_auto_splits(p, sms);
  const int hb = k::narrow_block_heads(p.num_tokens, p.num_heads, splits, sms);
  std::printf("[ narrow   ] %s: %d splits, %d heads per block with the switch (%d SMs)\n", c.name.c_str(), splits, hb,
              sms);
  if (sms == 132) EXPECT_EQ(hb, c.expect_narrow) << "the case no longer runs the blocks it was written for";

  Dev dq(hp.q.data(), hp.q.size()), dqr(hp.q_rope.data(), hp.q_rope.size()), dkv(hp.kv.data(), hp.kv.size()),
      didx(hp.idx.data(), hp.idx.size() * 4), dcounts(hp.counts.data(), hp.counts.size() * 4),
      dsink(hp.sink.data(), hp.sink.size() * 4), dout(nullptr, hp.out.size()), dlse(nullptr, hp.lse.size() * 4);
  ASSERT_NE(dq.ptr, nullptr);
  ASSERT_NE(dout.ptr, nullptr);
  p.q = dq.ptr, p.kv = dkv.ptr, p.idx = didx.as<const int32_t>();
  if (p.q_rope != nullptr) p.q_rope = dqr.ptr;
  p.counts = hp.counts.empty() ? nullptr : dcounts.as<const int32_t>();
  p.sink = hp.sink.empty() ? nullptr : dsink.as<const float>();
  p.out = dout.ptr, p.lse = p.lse != nullptr ? dlse.as<float>() : nullptr;
  const size_t wsb = smla::cuda::sparse_mla_workspace_bytes(p, sms, splits);
  Dev dws(nullptr, std::max<size_t>(wsb, 16));
  cudaStream_t st;
  cuda_ok(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), "stream");

  auto poison = [&] {
    cuda_ok(cudaMemsetAsync(dout.ptr, 0xff, dout.bytes, st), "poison out");
    if (dlse.ptr != nullptr) cuda_ok(cudaMemsetAsync(dlse.ptr, 0xff, dlse.bytes, st), "poison lse");
  };
  auto fetch = [&](std::vector<uint8_t>& out, std::vector<float>& lse) {
    cuda_ok(cudaStreamSynchronize(st), "run");
    out.resize(dout.bytes), lse.resize(hp.lse.size());
    cuda_ok(cudaMemcpy(out.data(), dout.ptr, dout.bytes, cudaMemcpyDeviceToHost), "out");
    if (!lse.empty()) cuda_ok(cudaMemcpy(lse.data(), dlse.ptr, dlse.bytes, cudaMemcpyDeviceToHost), "lse");
  };
  std::vector<uint8_t> out[2];
  std::vector<float> lse[2];
  for (int mode = 0; mode < 2; ++mode) {
    k::set_narrow_heads_for_testing(mode);
    poison();
    smla::cuda::sparse_mla(p, dws.ptr, wsb, st, splits);
    fetch(out[mode], lse[mode]);
  }
  int64_t diff_out = 0, diff_lse = 0;
  for (size_t i = 0; i < out[0].size(); i += 2) diff_out += std::memcmp(&out[0][i], &out[1][i], 2) != 0;
  for (size_t i = 0; i < lse[0].size(); ++i) diff_lse += std::memcmp(&lse[0][i], &lse[1][i], 4) != 0;
  EXPECT_EQ(diff_out, 0) << "output elements (padding included) differing from the default (of " << out[0].size() / 2
                         << ")";
  EXPECT_EQ(diff_lse, 0) << "LSE values differing from the default";

  // The narrow run against the float64 reference (§8's bars for bf16 scores).
  std::vector<double> ref_out, ref_lse;
  smla::testing::reference_double(hp, ref_out, ref_lse);
  std::memcpy(hp.out.data(), out[1].data(), hp.out.size());
  if (!hp.lse.empty()) std::memcpy(hp.lse.data(), lse[1].data(), hp.lse.size() * 4);
  const auto d = smla::testing::compare(hp, ref_out, ref_lse);
  EXPECT_EQ(d.nonfinite, 0);
  EXPECT_LE(d.rel_l2, 1e-2);
  EXPECT_LE(d.lse_max_abs, 1e-3);
  std::printf("[ error    ] %s narrow: out rel L2 %.2e, LSE max abs %.2e\n", c.name.c_str(), d.rel_l2, d.lse_max_abs);

  // A captured graph of the narrow call replays it bit for bit.
  k::set_narrow_heads_for_testing(1);
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  poison();
  cuda_ok(cudaStreamSynchronize(st), "poison");
  cuda_ok(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal), "begin capture");
  smla::cuda::sparse_mla(p, dws.ptr, wsb, st, splits);
  cuda_ok(cudaStreamEndCapture(st, &graph), "end capture");
  cuda_ok(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
  for (int rep = 0; rep < 3; ++rep) cuda_ok(cudaGraphLaunch(exec, st), "replay");
  std::vector<uint8_t> out_graph;
  std::vector<float> lse_graph;
  fetch(out_graph, lse_graph);
  EXPECT_EQ(std::memcmp(out_graph.data(), out[0].data(), out[0].size()), 0) << "graph replay differs";
  EXPECT_EQ(std::memcmp(lse_graph.data(), lse[0].data(), lse[0].size() * 4), 0) << "graph replay LSE differs";
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(st);
  cuda_ok(cudaGetLastError(), "last error");
}

INSTANTIATE_TEST_SUITE_P(Cases, NarrowHeads, ::testing::ValuesIn(narrow_cases()),
                         [](const ::testing::TestParamInfo<NarrowCase>& i) { return i.param.name; });

}  // namespace
