// The crossover variant `h128.xo` (fp8_ds_mla, 64 < H <= 128, opt-in SMLA_SM90_CROSSOVER=1;
// kernel_xo.cuh, docs/perf-history.md s12-crossover) against h64.ws, bit for bit: both run the same
// bf16 tiles through the same wgmma order, so one call over H heads must equal, in every output
// bit and every LSE bit, two calls of h64.ws over heads [0, 64) and [64, H) (the same splits; H <= 64
// never runs h128.xo). Without the switch the H-head call is h64.ws too, and the test still holds
// h64.ws to that head-group independence (it says which variant ran). Also: a CUDA graph replays the
// crossover launch bit for bit. The reference comparisons of every fp8_ds_mla case (counts, sink,
// LSE, masking, splits) are test_sparse_mla_quant.cpp's, run with the switch set.
// h128.xo's register-staged mode (SMLA_SM90_XO_REGS=1, docs/perf-history.md s12-flashmla-h128: raw rows
// loaded into the producer's registers and converted there) converts the same bytes in the same way:
// RegisterStagedSameBitsAsStaged holds its output and LSE to the staged mode's bit for bit in one
// process (set_xo_regs_for_testing); SameBitsAsTwo64HeadCalls runs whichever mode the environment picks.
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

void cuda_ok(cudaError_t e, const char* what) { ASSERT_EQ(e, cudaSuccess) << what << ": " << cudaGetErrorString(e); }

// A device copy of a host buffer (nullptr for an empty one), freed on scope exit.
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

struct XoCase {
  std::string name;
  smla::testing::ProblemSpec spec;
  int splits;  // fixed for both runs (0: the launcher's choice for the H-head call)
  smla::ScorePrecision score = smla::ScorePrecision::kBF16;
};

smla::testing::ProblemSpec spec_of(int64_t T, int H, int K) {
  smla::testing::ProblemSpec s;
  s.format = KvFormat::kFP8DsMla;
  s.num_tokens = T, s.num_heads = H, s.topk = K;
  s.num_rows = K > 1024 ? 16384 : 4096;
  return s;
}

std::vector<XoCase> xo_cases() {
  std::vector<XoCase> v;
  {
    auto s = spec_of(3, 128, 2048);  // split top-k, several tiles per block
    s.sink = true;
    v.push_back({"T3_H128_K2048_sink_split4", s, 4});
  }
  v.push_back({"T1_H128_K2048_split32", spec_of(1, 128, 2048), 32});
  {
    auto s = spec_of(140, 128, 77);  // no split, a partial tile, D = 512, counts
    s.rope_dim = 0, s.use_counts = true;
    v.push_back({"T140_H128_K77_D512_counts", s, 1});
  }
  {
    auto s = spec_of(5, 96, 500);  // second head group half padded; many invalid entries and duplicates
    s.invalid_fraction = 0.6, s.num_rows = 50;
    v.push_back({"T5_H96_K500_invalid_duplicates_split2", s, 2});
  }
  {
    auto s = spec_of(8, 128, 300);  // an all-invalid row, counts, sink, LSE base 2
    s.all_invalid_row = true, s.use_counts = true, s.sink = true, s.lse_mode = LseMode::kBase2;
    v.push_back({"T8_H128_K300_all_invalid_counts_sink_lse2", s, 3});
  }
  // 17 heads in the second group (the comparison's second call must stay on h64.ws: H <= 16 runs swapab)
  v.push_back({"T2_H81_K2048_auto_splits", spec_of(2, 81, 2048), 0});
  {
    auto s = spec_of(4, 128, 1000);  // an e4m3 q widened exactly (score precision bf16)
    s.q_dtype = DType::kE4M3, s.q_scale = 0.05f;
    v.push_back({"qe4m3_T4_H128_K1000_bf16_scores", s, 2, smla::ScorePrecision::kBF16});
  }
  return v;
}

class SparseMlaCrossover : public ::testing::TestWithParam<XoCase> {};

TEST_P(SparseMlaCrossover, SameBitsAsTwo64HeadCalls) {
  REQUIRE_GPU();
  const XoCase& c = GetParam();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(c.name + " seed " + std::to_string(seed));
  auto hp = smla::testing::make_problem(c.spec, seed);
  smla::SparseMlaParams p = hp.params;
  p.score_precision = c.score;
  const smla::CudaVariant* variant = smla::cuda_variant_for(smla::geometry_of(p), smla::cuda::device_info(0));
  ASSERT_NE(variant, nullptr);
  EXPECT_STREQ(variant->name, smla::crossover_enabled() ? "h128.xo" : "h64.ws");
  std::printf("[ xo       ] %s runs %s (SMLA_SM90_CROSSOVER %s, SMLA_SM90_XO_REGS %d)\n", c.name.c_str(), variant->name,
              smla::crossover_enabled() ? "on" : "off: h64.ws against itself",
              smla::cuda::sm90::sparse_mla::xo_regs_mode());

  Dev dq(hp.q.data(), hp.q.size()), dkv(hp.kv.data(), hp.kv.size()), didx(hp.idx.data(), hp.idx.size() * 4),
      dcounts(hp.counts.data(), hp.counts.size() * 4), dsink(hp.sink.data(), hp.sink.size() * 4),
      dout(nullptr, hp.out.size()), dlse(nullptr, hp.lse.size() * 4);
  ASSERT_NE(dq.ptr, nullptr);
  ASSERT_NE(dout.ptr, nullptr);
  p.q = dq.ptr, p.kv = dkv.ptr, p.idx = didx.as<const int32_t>();
  p.counts = hp.counts.empty() ? nullptr : dcounts.as<const int32_t>();
  p.sink = hp.sink.empty() ? nullptr : dsink.as<const float>();
  p.out = dout.ptr, p.lse = p.lse != nullptr ? dlse.as<float>() : nullptr;
  const int sms = smla::cuda::device_info(0).num_sms;
  const int splits = c.splits > 0 ? c.splits : smla::cuda::sparse_mla_auto_splits(p, sms);
  // Workspace for the largest of the three calls (the H-head one).
  const size_t wsb = smla::cuda::sparse_mla_workspace_bytes(p, sms, splits);
  Dev dws(nullptr, wsb);
  cudaStream_t st;
  cuda_ok(cudaStreamCreate(&st), "stream");

  auto run = [&](const smla::SparseMlaParams& q) {
    cuda_ok(cudaMemsetAsync(dout.ptr, 0xff, dout.bytes, st), "poison out");
    if (dlse.ptr != nullptr) cuda_ok(cudaMemsetAsync(dlse.ptr, 0xff, dlse.bytes, st), "poison lse");
    smla::cuda::sparse_mla(q, dws.ptr, wsb, st, splits);
    cuda_ok(cudaStreamSynchronize(st), "run");
  };
  auto fetch = [&](std::vector<uint8_t>& out, std::vector<float>& lse) {
    out.resize(dout.bytes), lse.resize(hp.lse.size());
    cudaMemcpy(out.data(), dout.ptr, dout.bytes, cudaMemcpyDeviceToHost);
    if (!lse.empty()) cudaMemcpy(lse.data(), dlse.ptr, dlse.bytes, cudaMemcpyDeviceToHost);
  };
  std::vector<uint8_t> out_xo, out_ws;
  std::vector<float> lse_xo, lse_ws;
  run(p);
  fetch(out_xo, lse_xo);

  // The same heads as two calls over [0, 64) and [64, H): h64.ws (H <= 64), into the same buffers.
  // One memset before both (each call writes only its heads).
  cuda_ok(cudaMemset(dout.ptr, 0xff, dout.bytes), "poison out");
  if (dlse.ptr != nullptr) cuda_ok(cudaMemset(dlse.ptr, 0xff, dlse.bytes), "poison lse");
  const int qb = p.q_dtype == DType::kE4M3 ? 1 : 2;
  for (int h0 = 0; h0 < p.num_heads; h0 += 64) {
    smla::SparseMlaParams g = p;
    g.num_heads = std::min(64, p.num_heads - h0);
    g.q = static_cast<const uint8_t*>(p.q) + h0 * p.q_stride_h * qb;
    g.out = static_cast<uint8_t*>(p.out) + h0 * p.out_stride_h * 2;
    if (p.lse != nullptr) g.lse = p.lse + h0;
    if (p.sink != nullptr) g.sink = p.sink + h0;
    const smla::CudaVariant* gv = smla::cuda_variant_for(smla::geometry_of(g), smla::cuda::device_info(0));
    ASSERT_NE(gv, nullptr);
    ASSERT_STREQ(gv->name, "h64.ws");
    ASSERT_LE(smla::cuda::sparse_mla_workspace_bytes(g, sms, splits), wsb);
    smla::cuda::sparse_mla(g, dws.ptr, wsb, st, splits);
  }
  cuda_ok(cudaStreamSynchronize(st), "h64.ws halves");
  fetch(out_ws, lse_ws);
  int64_t diff_out = 0, diff_lse = 0;
  for (size_t i = 0; i < out_xo.size(); i += 2) diff_out += std::memcmp(&out_xo[i], &out_ws[i], 2) != 0;
  for (size_t i = 0; i < lse_xo.size(); ++i) diff_lse += std::memcmp(&lse_xo[i], &lse_ws[i], 4) != 0;
  EXPECT_EQ(diff_out, 0) << "output elements differing from h64.ws (of " << out_xo.size() / 2 << ")";
  EXPECT_EQ(diff_lse, 0) << "LSE values differing from h64.ws";

  // A graph of the H-head call replays it bit for bit (cluster launch inside a capture).
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  cuda_ok(cudaMemset(dout.ptr, 0xff, dout.bytes), "poison out");
  cuda_ok(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal), "begin capture");
  smla::cuda::sparse_mla(p, dws.ptr, wsb, st, splits);
  cuda_ok(cudaStreamEndCapture(st, &graph), "end capture");
  cuda_ok(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
  for (int rep = 0; rep < 2; ++rep) cuda_ok(cudaGraphLaunch(exec, st), "replay");
  cuda_ok(cudaStreamSynchronize(st), "replay sync");
  std::vector<uint8_t> out_graph;
  std::vector<float> lse_graph;
  fetch(out_graph, lse_graph);
  EXPECT_EQ(std::memcmp(out_graph.data(), out_xo.data(), out_xo.size()), 0) << "graph replay differs";
  EXPECT_EQ(std::memcmp(lse_graph.data(), lse_xo.data(), lse_xo.size() * 4), 0) << "graph replay LSE differs";
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(st);
  cuda_ok(cudaGetLastError(), "last error");
}

// Restores the environment's choice of h128.xo's mode however the test ends.
struct XoRegsGuard {
  ~XoRegsGuard() { smla::cuda::sm90::sparse_mla::set_xo_regs_for_testing(-1); }
};

TEST_P(SparseMlaCrossover, RegisterStagedSameBitsAsStaged) {
  REQUIRE_GPU();
  if (!smla::crossover_enabled()) GTEST_SKIP() << "h128.xo is opt-in: run with SMLA_SM90_CROSSOVER=1 to compare its modes";
  XoRegsGuard guard;
  const XoCase& c = GetParam();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(c.name + " seed " + std::to_string(seed));
  auto hp = smla::testing::make_problem(c.spec, seed);
  smla::SparseMlaParams p = hp.params;
  p.score_precision = c.score;
  const smla::CudaVariant* variant = smla::cuda_variant_for(smla::geometry_of(p), smla::cuda::device_info(0));
  ASSERT_NE(variant, nullptr);
  ASSERT_STREQ(variant->name, "h128.xo");
  Dev dq(hp.q.data(), hp.q.size()), dkv(hp.kv.data(), hp.kv.size()), didx(hp.idx.data(), hp.idx.size() * 4),
      dcounts(hp.counts.data(), hp.counts.size() * 4), dsink(hp.sink.data(), hp.sink.size() * 4),
      dout(nullptr, hp.out.size()), dlse(nullptr, hp.lse.size() * 4);
  ASSERT_NE(dq.ptr, nullptr);
  ASSERT_NE(dout.ptr, nullptr);
  p.q = dq.ptr, p.kv = dkv.ptr, p.idx = didx.as<const int32_t>();
  p.counts = hp.counts.empty() ? nullptr : dcounts.as<const int32_t>();
  p.sink = hp.sink.empty() ? nullptr : dsink.as<const float>();
  p.out = dout.ptr, p.lse = p.lse != nullptr ? dlse.as<float>() : nullptr;
  const int sms = smla::cuda::device_info(0).num_sms;
  const int splits = c.splits > 0 ? c.splits : smla::cuda::sparse_mla_auto_splits(p, sms);
  const size_t wsb = smla::cuda::sparse_mla_workspace_bytes(p, sms, splits);
  Dev dws(nullptr, wsb);
  std::vector<uint8_t> out[2];
  std::vector<float> lse[2];
  for (int mode = 0; mode < 2; ++mode) {
    smla::cuda::sm90::sparse_mla::set_xo_regs_for_testing(mode);
    cuda_ok(cudaMemset(dout.ptr, 0xff, dout.bytes), "poison out");
    if (dlse.ptr != nullptr) cuda_ok(cudaMemset(dlse.ptr, 0xff, dlse.bytes), "poison lse");
    smla::cuda::sparse_mla(p, dws.ptr, wsb, nullptr, splits);
    cuda_ok(cudaDeviceSynchronize(), mode ? "register-staged run" : "staged run");
    out[mode].resize(dout.bytes), lse[mode].resize(hp.lse.size());
    cudaMemcpy(out[mode].data(), dout.ptr, dout.bytes, cudaMemcpyDeviceToHost);
    if (!lse[mode].empty()) cudaMemcpy(lse[mode].data(), dlse.ptr, dlse.bytes, cudaMemcpyDeviceToHost);
  }
  int64_t diff_out = 0, diff_lse = 0;
  for (size_t i = 0; i < out[0].size(); i += 2) diff_out += std::memcmp(&out[0][i], &out[1][i], 2) != 0;
  for (size_t i = 0; i < lse[0].size(); ++i) diff_lse += std::memcmp(&lse[0][i], &lse[1][i], 4) != 0;
  EXPECT_EQ(diff_out, 0) << "output elements of the register-staged mode differing from the staged one (of "
                         << out[0].size() / 2 << ")";
  EXPECT_EQ(diff_lse, 0) << "LSE values differing between the two modes";
  cuda_ok(cudaGetLastError(), "last error");
}

INSTANTIATE_TEST_SUITE_P(Cases, SparseMlaCrossover, ::testing::ValuesIn(xo_cases()),
                         [](const ::testing::TestParamInfo<XoCase>& i) { return i.param.name; });

}  // namespace
