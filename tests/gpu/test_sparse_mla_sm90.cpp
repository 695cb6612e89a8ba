// GPU tests of the SM90 sparse MLA kernel (bf16 / fp16 caches) against the float64 reference.
// Fresh random inputs every run (the seed is printed on failure); unselected KV rows are NaN and
// outputs start poisoned, so a kernel that reads a masked row or skips an output fails.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include "../common/gpu_test.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "devtools/testing.h"
#include "smla/api.h"
#include "smla/cuda.h"
#include "smla/numeric.h"
#include "smla/plan.h"

namespace {

using smla::DType;
using smla::KvFormat;
using smla::LseMode;
using smla::testing::ProblemSpec;
using smla::test::fresh_seed;

void cuda_ok(cudaError_t e, const char* what) { ASSERT_EQ(e, cudaSuccess) << what << ": " << cudaGetErrorString(e); }

// Runs spec on the GPU and checks it against the float64 reference, the head padding and the
// empty-row rule. Returns the problem (with the GPU's out / lse) for further checks. kv_mul != 1
// scales every cache element (bf16 / fp16 caches; the NaN poison stays NaN) and the softmax scale
// by its inverse: the same scores over values of another magnitude (out scales with it; §8's bars
// are relative for out, absolute for the LSE, which does not change).
smla::testing::HostProblem run_checked(const ProblemSpec& spec_in, const std::string& what, float kv_mul = 1.0f) {
  const uint64_t seed = fresh_seed();
  ProblemSpec spec = spec_in;
  if (kv_mul != 1.0f) spec.softmax_scale /= kv_mul;
  auto hp = smla::testing::make_problem(spec, seed);
  if (kv_mul != 1.0f) {
    EXPECT_TRUE(spec.format == KvFormat::kBF16 || spec.format == KvFormat::kFP16) << "kv_mul scales 16-bit caches";
    auto* e = reinterpret_cast<uint16_t*>(hp.kv.data());
    for (size_t i = 0; i < hp.kv.size() / 2; ++i)
      e[i] = spec.format == KvFormat::kBF16 ? smla::num::f32_to_bf16(smla::num::bf16_to_f32(e[i]) * kv_mul)
                                            : smla::num::f32_to_fp16(smla::num::fp16_to_f32(e[i]) * kv_mul);
  }
  SCOPED_TRACE(what + " (seed " + std::to_string(seed) + ")");
  std::vector<double> ref_out, ref_lse;
  smla::testing::reference_double(hp, ref_out, ref_lse);
  smla::cuda::sparse_mla_from_host(hp.params, hp.kv_bytes());
  const auto d = smla::testing::compare(hp, ref_out, ref_lse);
  EXPECT_EQ(d.nonfinite, 0);
  EXPECT_LE(d.rel_l2, 1e-2);
  EXPECT_LE(d.lse_max_abs, 1e-3);
  std::printf("[ error    ] %s: out rel L2 %.2e, LSE max abs %.2e\n", what.c_str(), d.rel_l2, d.lse_max_abs);

  const auto& p = hp.params;
  // Cells between heads of a padded out stride keep their poison (0xff bytes).
  if (spec.out_head_pad > 0) {
    const auto* o = reinterpret_cast<const uint16_t*>(hp.out.data());
    int64_t touched = 0;
    for (int64_t t = 0; t < p.num_tokens; ++t)
      for (int h = 0; h < p.num_heads; ++h)
        for (int64_t e = smla::kLatentDim; e < p.out_stride_h; ++e)
          touched += o[t * p.out_stride_t + h * p.out_stride_h + e] != 0xffffu;
    EXPECT_EQ(touched, 0) << "cells between heads were written";
  }
  // LSE off: the lse buffer is never written.
  if (spec.lse_mode == LseMode::kOff) {
    int64_t written = 0;
    for (float v : hp.lse) written += !std::isnan(v);
    EXPECT_EQ(written, 0) << "lse written although LSE is off";
  }
  // Empty rows: out exactly 0, LSE -inf.
  for (int64_t t = 0; t < p.num_tokens; ++t) {
    int active = p.counts ? std::max(0, std::min(p.counts[t], p.topk)) : p.topk, valid = 0;
    for (int j = 0; j < active; ++j) {
      const int32_t r = p.idx[t * p.idx_stride_t + j];
      valid += r >= 0 && r < p.num_rows;
    }
    if (valid != 0) continue;
    int64_t bad = 0;
    for (int h = 0; h < p.num_heads; ++h) {
      for (int e = 0; e < smla::kLatentDim; ++e) bad += smla::testing::out_value(hp, t, h, e) != 0.0f;
      if (p.lse) bad += p.lse[t * p.lse_stride_t + h] != -INFINITY;
    }
    EXPECT_EQ(bad, 0) << "empty row t=" << t << ": out must be exactly 0 and LSE -inf";
  }
  return hp;
}

struct Case {
  std::string name;
  ProblemSpec spec;
  float kv_mul = 1.0f;  // run_checked's cache scale
};
// GoogleTest prints a parameter in test listings: the case's name, not a dump of its bytes.
void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

ProblemSpec base(int64_t T, int H, int K) {
  ProblemSpec s;
  s.num_tokens = T, s.num_heads = H, s.topk = K;
  s.num_rows = 4096;
  return s;
}

std::vector<Case> cases() {
  std::vector<Case> v;
  auto add = [&](std::string name, ProblemSpec s, float kv_mul = 1.0f) { v.push_back({std::move(name), s, kv_mul}); };
  add("T1_H16_K2048_split", base(1, 16, 2048));
  // Split top-k at the latency shapes (the partials are bf16: smla/workspace.h, perf-history
  // s10-partials): T = 1 (32 splits, two head groups), T = 8 / 16 / 32 (fewer, longer splits).
  for (auto [T, H] : {std::pair{1, 128}, {1, 64}, {8, 128}, {16, 64}, {32, 128}, {32, 16}}) {
    auto s = base(T, H, 2048);
    s.num_rows = 16384;
    add("T" + std::to_string(T) + "_H" + std::to_string(H) + "_K2048_split", s);
  }
  // Values of large magnitude through the bf16 partials: 1e4 (the example) and 1e6, where
  // a partial (a softmax-weighted mean of ~64 rows of std 1e6) is far beyond fp16's 65504: an fp16
  // partial would be inf. The fp16 cache: std 4e3 (inf needs 16 sigma; its partials are bf16 too).
  for (auto [T, H, mul] : {std::tuple{1, 128, 1e4f}, {4, 64, 1e6f}, {32, 128, 1e6f}}) {
    auto s = base(T, H, 2048);
    s.num_rows = 16384;
    add("T" + std::to_string(T) + "_H" + std::to_string(H) + "_K2048_split_v1e" + (mul > 1e5f ? "6" : "4"), s, mul);
  }
  {
    auto s = base(2, 64, 2048);
    s.format = KvFormat::kFP16, s.q_dtype = s.out_dtype = DType::kFP16, s.num_rows = 16384;
    add("T2_H64_K2048_fp16_split_v4e3", s, 4e3f);
  }
  add("T3_H128_K2048", base(3, 128, 2048));
  add("T5_H1_K77", base(5, 1, 77));
  {
    auto s = base(7, 3, 300);
    s.use_counts = true, s.sink = true, s.lse_mode = LseMode::kBase2;
    add("T7_H3_K300_counts_sink_lse2", s);
  }
  add("T33_H48_K300", base(33, 48, 300));
  add("T2_H64_K2048", base(2, 64, 2048));
  add("T9_H96_K300", base(9, 96, 300));
  add("T4_H128_K1", base(4, 128, 1));
  {
    auto s = base(140, 128, 77);
    s.rope_dim = 0;
    add("T140_H128_K77_D512_nosplit", s);
  }
  {
    auto s = base(300, 16, 300);
    s.rope_dim = 0, s.format = KvFormat::kFP16, s.q_dtype = s.out_dtype = DType::kFP16;
    add("T300_H16_K300_D512_fp16_nosplit", s);
  }
  {
    auto s = base(5, 64, 300);
    s.format = KvFormat::kFP16, s.q_dtype = s.out_dtype = DType::kFP16, s.sink = true;
    add("T5_H64_K300_fp16_sink", s);
  }
  {
    auto s = base(4, 32, 128);
    s.q_pair = true;
    add("T4_H32_K128_qpair", s);
  }
  {
    auto s = base(6, 48, 200);
    s.q_head_pad = 8, s.out_head_pad = 16, s.q_pair = true;
    add("T6_H48_strides_aligned", s);
  }
  {
    auto s = base(6, 20, 130);
    s.q_head_pad = 3, s.out_head_pad = 5;
    add("T6_H20_strides_odd", s);
  }
  {
    auto s = base(8, 16, 300);
    s.all_invalid_row = true, s.use_counts = true, s.sink = true;
    add("T8_H16_all_invalid_counts_sink", s);
  }
  {
    auto s = base(200, 16, 300);
    s.all_invalid_row = true, s.sink = true;
    add("T200_H16_all_invalid_sink_nosplit", s);
  }
  {
    auto s = base(3, 16, 100);
    s.lse_mode = LseMode::kOff;
    add("T3_H16_lse_off", s);
  }
  {
    auto s = base(4, 64, 500);
    s.invalid_fraction = 0.6, s.num_rows = 50;  // many invalid entries and many duplicates
    add("T4_H64_invalid_duplicates", s);
  }
  {
    auto s = base(150, 16, 2048);
    s.use_counts = true, s.num_rows = 16384;
    add("T150_H16_K2048_counts", s);
  }
  {
    // Sharp scores (softmax scale x 4: std ~19 in log2 units): a row's max often passes the first
    // tile's by more than the 16-bit path's lazy-rescale threshold later on (lazy_rescale.h), so
    // the deferred rescale runs mid-row; 16 tiles per row, bf16 and fp16.
    auto s = base(140, 16, 1024);
    s.softmax_scale *= 4.0f;
    add("T140_H16_K1024_sharp", s);
    s.format = KvFormat::kFP16, s.q_dtype = s.out_dtype = DType::kFP16;
    add("T140_H16_K1024_fp16_sharp", s);
  }
  {
    auto s = base(65537, 2, 16);
    s.num_rows = 1 << 16;
    add("T65537_H2_K16", s);
  }
  return v;
}

class SparseMlaSm90 : public ::testing::TestWithParam<Case> {};

TEST_P(SparseMlaSm90, MatchesReference) {
  REQUIRE_GPU();
  run_checked(GetParam().spec, GetParam().name, GetParam().kv_mul);
}

INSTANTIATE_TEST_SUITE_P(Cases, SparseMlaSm90, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<Case>& i) { return i.param.name; });

TEST(SparseMlaSm90Edge, EmptyProblemLaunchesNothing) {
  REQUIRE_GPU();
  auto hp = smla::testing::make_problem(base(0, 16, 64), fresh_seed());
  EXPECT_NO_THROW(smla::cuda::sparse_mla_from_host(hp.params, hp.kv_bytes()));
  EXPECT_EQ(smla::cuda::sparse_mla_workspace_bytes(hp.params, 132), 0u);
  // T = 0 with device-side nothing at all: no pointers needed.
  smla::SparseMlaParams p;
  p.num_heads = 16, p.topk = 64, p.softmax_scale = 0.1f;
  EXPECT_NO_THROW(smla::cuda::sparse_mla(p, nullptr, 0, nullptr));
}

// The same rows alone (T = 2: the top-k is split) and inside a large batch (no split) agree
// within tolerance; both are checked against the reference by run_checked.
TEST(SparseMlaSm90Edge, SplitAndNoSplitAgree) {
  REQUIRE_GPU();
  const int sms = smla::cuda::device_info(0).num_sms;
  auto big = base(2 * sms, 64, 2048);
  big.num_rows = 16384;
  const uint64_t seed = fresh_seed();
  auto hp = smla::testing::make_problem(big, seed);
  SCOPED_TRACE("seed " + std::to_string(seed));
  ASSERT_EQ(smla::choose_num_splits(hp.params.num_tokens, 1, 2048, sms), 1);
  ASSERT_GT(smla::choose_num_splits(2, 1, 2048, sms), 1);
  smla::cuda::sparse_mla_from_host(hp.params, hp.kv_bytes());
  std::vector<uint8_t> out_big = hp.out;
  std::vector<float> lse_big = hp.lse;
  auto small = hp.params;
  small.num_tokens = 2;
  std::fill(hp.out.begin(), hp.out.end(), 0xff);
  smla::cuda::sparse_mla_from_host(small, hp.kv_bytes());
  double num2 = 0, den2 = 0, lse_diff = 0;
  for (int64_t i = 0; i < 2 * 64 * 512; ++i) {
    const double a = smla::num::bf16_to_f32(reinterpret_cast<const uint16_t*>(hp.out.data())[i]);
    const double b = smla::num::bf16_to_f32(reinterpret_cast<const uint16_t*>(out_big.data())[i]);
    num2 += (a - b) * (a - b), den2 += b * b;
  }
  for (int i = 0; i < 2 * 64; ++i) lse_diff = std::max(lse_diff, double(std::fabs(hp.lse[i] - lse_big[i])));
  EXPECT_LE(std::sqrt(num2 / den2), 1e-2);
  EXPECT_LE(lse_diff, 1e-3);
}

// Two identical runs (split and not split) are bit-identical (bf16 H = 64; fp8_ds_mla H = 16 and
// 32: the swap-AB kernel, N = 16 and N = 32; fp8_e4m3 H = 24: swapab N = 32; nvfp4_ds_mla H = 16: swapab),
// launched as a batch-invariant plan launches them (the table's kernel at every T: swapab at T = 2 too).
TEST(SparseMlaSm90Edge, Deterministic) {
  REQUIRE_GPU();
  for (int64_t T : {int64_t(2), int64_t(300)})
  for (auto [f, H] : {std::pair{KvFormat::kBF16, 64}, std::pair{KvFormat::kFP8DsMla, 16}, std::pair{KvFormat::kFP8DsMla, 32},
                      std::pair{KvFormat::kFP8E4M3, 24}, std::pair{KvFormat::kNvFP4DsMla, 16}}) {
    auto s = base(T, H, 1000);
    s.format = f;
    s.sink = true;
    const uint64_t seed = fresh_seed();
    auto hp = smla::testing::make_problem(s, seed);
    smla::cuda::sparse_mla_from_host(hp.params, hp.kv_bytes(), true);
    const auto out1 = hp.out;
    const auto lse1 = hp.lse;
    smla::cuda::sparse_mla_from_host(hp.params, hp.kv_bytes(), true);
    EXPECT_EQ(std::memcmp(out1.data(), hp.out.data(), out1.size()), 0) << "T=" << T << " seed " << seed;
    EXPECT_EQ(std::memcmp(lse1.data(), hp.lse.data(), lse1.size() * 4), 0) << "T=" << T << " seed " << seed;
  }
}

// A captured graph replays the direct launch bit for bit (no allocation or sync inside): bf16, and
// fp8_ds_mla (H = 16 and 32: the swap-AB kernel, N = 16 and 32), fp8_e4m3 H = 24 (swapab N = 32),
// nvfp4_ds_mla H = 16 (swapab); launched batch-invariant, so T = 3 at H > 16 runs swapab, not h64.ws.
TEST(SparseMlaSm90Edge, GraphCaptureReplays) {
  REQUIRE_GPU();
  for (auto [f, H] : {std::pair{KvFormat::kBF16, 32}, std::pair{KvFormat::kFP8DsMla, 16}, std::pair{KvFormat::kFP8DsMla, 32},
                      std::pair{KvFormat::kFP8E4M3, 24}, std::pair{KvFormat::kNvFP4DsMla, 16}}) {
  SCOPED_TRACE(std::string(smla::to_string(f)) + " H = " + std::to_string(H));
  auto spec = base(3, H, 700);
  spec.format = f;
  auto hp = smla::testing::make_problem(spec, fresh_seed());
  auto p = hp.params;
  void *dq, *dkv, *didx, *dout, *dlse, *dws;
  const size_t qb = hp.q.size(), kvb = hp.kv.size(), ib = hp.idx.size() * 4, ob = hp.out.size(), lb = hp.lse.size() * 4;
  cuda_ok(cudaMalloc(&dq, qb), "malloc");
  cuda_ok(cudaMalloc(&dkv, kvb), "malloc");
  cuda_ok(cudaMalloc(&didx, ib), "malloc");
  cuda_ok(cudaMalloc(&dout, ob), "malloc");
  cuda_ok(cudaMalloc(&dlse, lb), "malloc");
  cudaMemcpy(dq, hp.q.data(), qb, cudaMemcpyHostToDevice);
  cudaMemcpy(dkv, hp.kv.data(), kvb, cudaMemcpyHostToDevice);
  cudaMemcpy(didx, hp.idx.data(), ib, cudaMemcpyHostToDevice);
  p.q = dq, p.kv = dkv, p.idx = static_cast<const int32_t*>(didx), p.out = dout, p.lse = static_cast<float*>(dlse);
  const size_t wsb = smla::cuda::sparse_mla_workspace_bytes(p, smla::cuda::device_info(0).num_sms);
  ASSERT_GT(wsb, 0u);
  cuda_ok(cudaMalloc(&dws, wsb), "malloc");
  cudaStream_t st;
  cuda_ok(cudaStreamCreate(&st), "stream");
  smla::cuda::sparse_mla(p, dws, wsb, st, 0, true);
  cuda_ok(cudaStreamSynchronize(st), "direct run");
  std::vector<uint8_t> out1(ob), out2(ob);
  cudaMemcpy(out1.data(), dout, ob, cudaMemcpyDeviceToHost);
  cudaMemset(dout, 0xff, ob);
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  cuda_ok(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal), "begin capture");
  smla::cuda::sparse_mla(p, dws, wsb, st, 0, true);
  cuda_ok(cudaStreamEndCapture(st, &graph), "end capture");
  cuda_ok(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
  cuda_ok(cudaGraphLaunch(exec, st), "replay");
  cuda_ok(cudaStreamSynchronize(st), "replay sync");
  cudaMemcpy(out2.data(), dout, ob, cudaMemcpyDeviceToHost);
  EXPECT_EQ(std::memcmp(out1.data(), out2.data(), ob), 0);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(st);
  for (void* ptr : {dq, dkv, didx, dout, dlse, dws}) cudaFree(ptr);
  }
}

// Bad arguments are refused with an smla::Error before anything is launched (host pointers
// are never touched: validation comes first).
TEST(SparseMlaSm90Edge, BadArgumentsRefused) {
  REQUIRE_GPU();
  auto hp = smla::testing::make_problem(base(2, 16, 640), fresh_seed());  // T = 2: split top-k
  auto expect_refused = [&](smla::SparseMlaParams p, const char* what) {
    EXPECT_THROW(smla::cuda::sparse_mla(p, nullptr, 0, nullptr), smla::Error) << what;
  };
  auto p = hp.params;
  p.q = nullptr;
  expect_refused(p, "null q");
  p = hp.params, p.idx = nullptr;
  expect_refused(p, "null idx");
  p = hp.params, p.out = nullptr;
  expect_refused(p, "null out");
  p = hp.params, p.q_stride_h = 100;
  expect_refused(p, "q head stride < D");
  p = hp.params, p.out_stride_t = 512;
  expect_refused(p, "overlapping out rows");
  p = hp.params, p.idx_stride_t = 10;
  expect_refused(p, "idx stride < K");
  p = hp.params, p.kv_row_stride_bytes = 1000;
  expect_refused(p, "kv row stride < row bytes");
  p = hp.params, p.kv_row_stride_bytes = 1160;
  expect_refused(p, "kv row stride not a multiple of 16");
  p = hp.params, p.num_heads = 129, p.q_stride_t = 129 * 576, p.out_stride_t = 129 * 512, p.lse_stride_t = 129;
  expect_refused(p, "H > 128");
  p = hp.params, p.topk = 0;
  expect_refused(p, "K = 0");
  p = hp.params, p.format = KvFormat::kFP8E4M3, p.q_dtype = DType::kFP16, p.out_dtype = DType::kFP16;
  try {  // refused for the q dtype itself, before the workspace is looked at
    smla::cuda::sparse_mla(p, nullptr, 0, nullptr);
    ADD_FAILURE() << "an fp16 q on a quantized cache ran";
  } catch (const smla::Error& e) {
    EXPECT_NE(std::string(e.what()).find("got an fp16 q"), std::string::npos) << e.what();
  }
  p = hp.params, p.out_dtype = DType::kFP32;
  expect_refused(p, "fp32 out");
  p = hp.params;
  expect_refused(p, "T = 2 splits the top-k and needs a workspace");
  p = hp.params, p.out_dtype = DType::kFP32;
  EXPECT_THROW(smla::cuda::sparse_mla_from_host(p, hp.kv_bytes()), smla::Error);
}

}  // namespace

// Host-only (no device needed): which variant of the table (smla/support.h) runs each geometry on
// an SM90 GPU: every format and H on the warp-specialized kernel (docs/perf-history.md v6/v7), the
// fp8 tensor-core score path only for an e4m3 q with an fp8 cache (by default: score precision auto).
TEST(SparseMlaSm90Routing, Variants) {
  auto variant = [](KvFormat f, int H, DType q, smla::ScorePrecision score = smla::ScorePrecision::kAuto) {
    smla::Geometry g;
    g.format = f, g.num_heads = H, g.q_dtype = q, g.score_precision = score;
    const smla::CudaVariant* v = smla::cuda_variant_for(g, smla::any_sm90_device());
    return std::string(v != nullptr ? v->name : "none");
  };
  // swapab's H limits: fp8_ds_mla and fp8_e4m3 32 (N = 32 above 16 heads: docs/perf-history.md#s14-swapab-n32),
  // nvfp4_ds_mla 16
  const int hmax = smla::kSwapAbMaxHeads;
  ASSERT_EQ(hmax, 32);
  for (int H : {1, 16, 17, 20, 24, 31, 32, 33, 64, 96, 128}) {
    EXPECT_EQ(variant(KvFormat::kBF16, H, DType::kBF16), "h64.ws") << H;
    EXPECT_EQ(variant(KvFormat::kFP16, H, DType::kFP16), "h64.ws") << H;
    // fp8_e4m3 rows: the swap-AB kernel at H <= 32
    const std::string e4 = H <= hmax ? "swapab" : "h64.ws";
    EXPECT_EQ(variant(KvFormat::kFP8E4M3, H, DType::kBF16), e4) << H;
    // fp8_ds_mla with a bf16 q at H <= 32: the swap-AB kernel.
    const std::string ds = H <= hmax ? "swapab" : "h64.ws";
    EXPECT_EQ(variant(KvFormat::kFP8DsMla, H, DType::kBF16), ds) << H;
    // nvfp4_ds_mla rows: the swap-AB kernel at H <= 16 (session 12)
    const std::string nv = H <= 16 ? "swapab" : "h64.ws";
    EXPECT_EQ(variant(KvFormat::kNvFP4DsMla, H, DType::kBF16), nv) << H;
    EXPECT_EQ(variant(KvFormat::kNvFP4DsMla, H, DType::kBF16, smla::ScorePrecision::kBF16), nv) << H;
    // A 16-bit q: auto and an explicit bf16 are the same path.
    EXPECT_EQ(variant(KvFormat::kFP8DsMla, H, DType::kBF16, smla::ScorePrecision::kBF16), ds) << H;
    EXPECT_EQ(variant(KvFormat::kFP16, H, DType::kFP16, smla::ScorePrecision::kBF16), "h64.ws") << H;
  }
  const auto fp8 = smla::ScorePrecision::kFP8, bf16 = smla::ScorePrecision::kBF16;
  for (int H : {1, 16, 17, 20, 32, 33, 64, 128}) {
    // An e4m3 q: scored on the fp8 tensor cores by default (auto) or on request, widened to bf16
    // exactly when bf16 scores are asked for; fp8_ds_mla at H <= 32: widened on the swap-AB kernel
    // under auto and bf16 (faster there), fp8 tensor cores only on request.
    const bool ds_small = H <= hmax;
    EXPECT_EQ(variant(KvFormat::kFP8E4M3, H, DType::kE4M3), "h64.ws.q8") << H;
    EXPECT_EQ(variant(KvFormat::kFP8DsMla, H, DType::kE4M3), ds_small ? "swapab" : "h64.ws.q8") << H;
    EXPECT_EQ(variant(KvFormat::kFP8E4M3, H, DType::kE4M3, fp8), "h64.ws.q8") << H;
    EXPECT_EQ(variant(KvFormat::kFP8DsMla, H, DType::kE4M3, fp8), "h64.ws.q8") << H;
    EXPECT_EQ(variant(KvFormat::kFP8E4M3, H, DType::kE4M3, bf16),
              H <= hmax ? "swapab" : "h64.ws")
        << H;
    EXPECT_EQ(variant(KvFormat::kFP8DsMla, H, DType::kE4M3, bf16),
              ds_small ? "swapab" : "h64.ws")
        << H;
    // fp8 scores need an e4m3 q (and an e4m3 q an fp8 cache).
    EXPECT_EQ(variant(KvFormat::kFP8DsMla, H, DType::kBF16, fp8), "none") << H;
    EXPECT_EQ(variant(KvFormat::kBF16, H, DType::kBF16, fp8), "none") << H;
    EXPECT_EQ(variant(KvFormat::kNvFP4DsMla, H, DType::kBF16, fp8), "none") << H;
  }
  EXPECT_EQ(variant(KvFormat::kBF16, 129, DType::kBF16), "none");
}
