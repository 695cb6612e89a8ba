// The SM90 small-head decode kernel for fp8_ds_mla (experiments/decode_small_h/src), called through its
// own entry points (decode.h), against the float64 reference on the dequantized rows (DESIGN.md §8:
// rel L2 <= 1e-2, LSE abs <= 1e-3): fresh random inputs (seed printed on failure), NaN rows that no
// entry selects, poisoned outputs, odd shapes, invalid and duplicate indices, counts, sink, LSE
// base 2 / off, D = 512, free strides, T = 0 / 1 / 65537, tile scales that are not powers of two.
//
// Also the benchmark (not a test; disabled unless asked for):
//   build-exp/experiments/decode_small_h/smla_experiment_tests --gtest_also_run_disabled_tests --gtest_filter='DecodeSmallHBench.*'
// (the tests: --gtest_filter='*DecodeSmallH*')
// times this kernel (both K conversions; at H <= 16 also the deep and team rings), cuda::sparse_mla and the
// gather limit of the same rows (K = 2048, 1M-row pool, H = 8 / 16 / 32, T = 1 / 32 / 128 / 4096)
// and prints one line per shape: medians in us, frac = gather time / kernel time (the target is
// >= 0.80), the kernel's memory pipeline alone and its products alone (diagnostic modes), the
// resident blocks per SM, and the worst out rel L2 of the variants against cuda::sparse_mla.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include "common/gpu_test.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "devtools/bench_support.h"
#include "decode_small_h/src/decode.h"
#include "smla/cuda.h"
#include "smla/formats.h"
#include "smla/numeric.h"
#include "smla/plan.h"
#include "reference/sparse_mla.h"
#include "devtools/testing.h"

namespace {

using smla::DType;
using smla::KvFormat;
using smla::LseMode;
using smla::testing::ProblemSpec;
using smla::test::fresh_seed;

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw smla::Error(std::string(what) + ": " + cudaGetErrorString(e));
}

struct DeviceBuffer {
  void* ptr = nullptr;
  DeviceBuffer() = default;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() {
    if (ptr) cudaFree(ptr);
  }
  void* make(size_t bytes, const void* host) {
    if (bytes == 0) return nullptr;
    check(cudaMalloc(&ptr, bytes), "cudaMalloc");
    if (host) check(cudaMemcpy(ptr, host, bytes, cudaMemcpyHostToDevice), "copy to device");
    return ptr;
  }
};

// Elements spanned by a [T, H, width] tensor with strides st, sh.
size_t span(int64_t T, int H, int64_t st, int64_t sh, int64_t width) {
  if (T == 0) return 0;
  return size_t((T - 1) * st + int64_t(H - 1) * sh + width);
}

// Copies the host problem to the device, runs decode_small_h_launch, copies out / lse back.
void run_decode_from_host(const smla::SparseMlaParams& hp, size_t kv_bytes, smla::cuda::DecodeDiag v) {
  const std::string why = smla::cuda::decode_small_h_supports(hp);
  ASSERT_TRUE(why.empty()) << why;
  if (hp.num_tokens == 0) return;
  const int64_t T = hp.num_tokens;
  const int H = hp.num_heads;
  const int q_width = hp.q_rope ? smla::kLatentDim : hp.head_dim();
  DeviceBuffer q, q_rope, kv, idx, counts, sink, out, lse, ws;
  smla::SparseMlaParams p = hp;
  p.q = q.make(span(T, H, hp.q_stride_t, hp.q_stride_h, q_width) * 2, hp.q);
  if (hp.q_rope) p.q_rope = q_rope.make(span(T, H, hp.q_rope_stride_t, hp.q_rope_stride_h, smla::kRopeDim) * 2, hp.q_rope);
  p.kv = kv.make(kv_bytes, hp.kv);
  p.idx = static_cast<const int32_t*>(idx.make(span(T, 1, hp.idx_stride_t, 0, hp.topk) * 4, hp.idx));
  if (hp.counts) p.counts = static_cast<const int32_t*>(counts.make(size_t(T) * 4, hp.counts));
  if (hp.sink) p.sink = static_cast<const float*>(sink.make(size_t(H) * 4, hp.sink));
  const size_t out_bytes = span(T, H, hp.out_stride_t, hp.out_stride_h, smla::kLatentDim) * 2;
  p.out = out.make(out_bytes, hp.out);
  const bool with_lse = hp.lse != nullptr && hp.lse_mode != LseMode::kOff;
  const size_t lse_bytes = with_lse ? span(T, 1, hp.lse_stride_t, 0, H) * 4 : 0;
  p.lse = with_lse ? static_cast<float*>(lse.make(lse_bytes, hp.lse)) : nullptr;
  const size_t ws_bytes = smla::cuda::decode_small_h_workspace_bytes(p, smla::cuda::device_info(0).num_sms);
  void* w = ws.make(ws_bytes, nullptr);
  smla::cuda::decode_small_h_launch_diag(p, w, ws_bytes, nullptr, v);
  check(cudaDeviceSynchronize(), "small-head decode kernel");
  check(cudaMemcpy(hp.out, p.out, out_bytes, cudaMemcpyDeviceToHost), "copy out to host");
  if (with_lse) check(cudaMemcpy(hp.lse, p.lse, lse_bytes, cudaMemcpyDeviceToHost), "copy lse to host");
}

// testing::reference_double on all cores.
void reference(const smla::testing::HostProblem& hp, std::vector<double>& ref_out, std::vector<double>& ref_lse) {
  const auto& p = hp.params;
  const int64_t n = p.num_tokens * p.num_heads;
  ref_out.assign(size_t(n * smla::kLatentDim), 0.0);
  ref_lse.assign(size_t(n), 0.0);
  std::atomic<int64_t> next{0};
  auto work = [&] {
    for (int64_t i; (i = next.fetch_add(1)) < n;) {
      const int64_t t = i / p.num_heads;
      const int h = int(i % p.num_heads);
      double l;
      smla::reference::sparse_mla_row_head(p, t, h, ref_out.data() + i * smla::kLatentDim, &l);
      ref_lse[size_t(i)] = p.lse_mode == LseMode::kBase2 ? l * M_LOG2E : l;
    }
  };
  std::vector<std::thread> pool;
  for (unsigned i = 0; i < std::max(1u, std::thread::hardware_concurrency()); ++i) pool.emplace_back(work);
  for (auto& th : pool) th.join();
}

// Multiplies every finite tile scale of every row by a random factor in [0.55, 1.8): scales that
// are not powers of two, as another writer may store them (DESIGN.md §3: readers use them as is).
void perturb_scales(smla::testing::HostProblem& hp, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> f(0.55f, 1.8f);
  const auto& p = hp.params;
  for (int64_t r = 0; r < p.num_rows; ++r)
    for (int i = 0; i < 4; ++i) {
      float s;
      uint8_t* at = hp.kv.data() + r * p.kv_row_stride_bytes + 512 + 4 * i;
      std::memcpy(&s, at, 4);
      if (!std::isfinite(s)) continue;  // a poisoned (unselected) row stays NaN
      s *= f(rng);
      std::memcpy(at, &s, 4);
    }
}

struct Case {
  std::string name;
  ProblemSpec spec;
  bool odd_scales = false;
  int q_pow2 = 0;  // q times 2^q_pow2 (exact), softmax_scale times 2^-q_pow2: the same scores
};

// Multiplies every bf16 of q (and q_rope) by 2^k: exact while the values stay normal.
void scale_q(smla::testing::HostProblem& hp, int k) {
  for (auto* v : {&hp.q, &hp.q_rope})
    for (size_t i = 0; i + 1 < v->size(); i += 2) {
      uint16_t b;
      std::memcpy(&b, v->data() + i, 2);
      b = smla::num::f32_to_bf16(std::ldexp(smla::num::bf16_to_f32(b), k));
      std::memcpy(v->data() + i, &b, 2);
    }
}

void run_checked(const Case& c, smla::cuda::DecodeDiag v) {
  const uint64_t seed = fresh_seed();
  auto spec = c.spec;
  spec.softmax_scale = std::ldexp(spec.softmax_scale, -c.q_pow2);
  auto hp = smla::testing::make_problem(spec, seed);
  if (c.odd_scales) perturb_scales(hp, seed ^ 0x5bd1e995u);
  if (c.q_pow2 != 0) scale_q(hp, c.q_pow2);
  SCOPED_TRACE(c.name + " ring " + std::to_string(v.ring) + " " + smla::cuda::decode_small_h_variant(hp.params, v.k) +
               " (seed " + std::to_string(seed) + ")");
  std::vector<double> ref_out, ref_lse;
  reference(hp, ref_out, ref_lse);
  run_decode_from_host(hp.params, hp.kv_bytes(), v);
  const auto d = smla::testing::compare(hp, ref_out, ref_lse);
  EXPECT_EQ(d.nonfinite, 0);
  EXPECT_LE(d.rel_l2, 1e-2);
  EXPECT_LE(d.lse_max_abs, 1e-3);
  const auto& p = hp.params;
  if (c.spec.out_head_pad > 0) {  // cells between heads keep their poison
    const auto* o = reinterpret_cast<const uint16_t*>(hp.out.data());
    int64_t touched = 0;
    for (int64_t t = 0; t < p.num_tokens; ++t)
      for (int h = 0; h < p.num_heads; ++h)
        for (int64_t e = smla::kLatentDim; e < p.out_stride_h; ++e)
          touched += o[t * p.out_stride_t + h * p.out_stride_h + e] != 0xffffu;
    EXPECT_EQ(touched, 0) << "cells between heads were written";
  }
  if (c.spec.lse_mode == LseMode::kOff) {
    int64_t written = 0;
    for (float v : hp.lse) written += !std::isnan(v);
    EXPECT_EQ(written, 0) << "lse written although LSE is off";
  }
  for (int64_t t = 0; t < p.num_tokens; ++t) {  // empty rows: out exactly 0, LSE -inf
    const int active = p.counts ? std::max(0, std::min(p.counts[t], p.topk)) : p.topk;
    int valid = 0;
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
}

ProblemSpec base(int64_t T, int H, int K) {
  ProblemSpec s;
  s.format = KvFormat::kFP8DsMla;
  s.num_tokens = T, s.num_heads = H, s.topk = K;
  s.num_rows = K > 1024 ? 16384 : 4096;
  return s;
}

std::vector<Case> cases() {
  std::vector<Case> v;
  auto add = [&](std::string name, ProblemSpec s, bool odd_scales = false, int q_pow2 = 0) {
    v.push_back({name, s, odd_scales, q_pow2});
  };
  // The grid: H x K x D; T = 5 (K = 2048 splits the top-k, K = 77 does not).
  for (int H : {1, 3, 8, 16, 20, 32})
    for (int K : {77, 300, 2048})
      for (int rope : {64, 0}) {
        auto s = base(5, H, K);
        s.rope_dim = rope;
        add("T5_H" + std::to_string(H) + "_K" + std::to_string(K) + "_D" + std::to_string(512 + rope), s);
      }
  add("T1_H16_K2048", base(1, 16, 2048));  // the most splits
  add("T1_H32_K300", base(1, 32, 300));
  {
    auto s = base(7, 3, 300);
    s.use_counts = true, s.sink = true, s.lse_mode = LseMode::kBase2;
    add("T7_H3_K300_counts_sink_lse2", s);
  }
  {
    auto s = base(300, 16, 77);  // no split
    s.sink = true;
    add("T300_H16_K77_sink_nosplit", s);
  }
  {
    auto s = base(200, 32, 100);
    s.rope_dim = 0, s.use_counts = true, s.sink = true, s.lse_mode = LseMode::kBase2;
    add("T200_H32_K100_D512_counts_sink_lse2_nosplit", s);
  }
  {
    auto s = base(8, 16, 300);
    s.all_invalid_row = true, s.use_counts = true, s.sink = true;
    add("T8_H16_all_invalid_counts_sink", s);
  }
  {
    auto s = base(200, 20, 100);
    s.all_invalid_row = true, s.sink = true;
    add("T200_H20_all_invalid_sink_nosplit", s);
  }
  {
    auto s = base(4, 16, 500);
    s.invalid_fraction = 0.6, s.num_rows = 50;  // many invalid (-1, negative, >= num_rows) and duplicates
    add("T4_H16_invalid_duplicates", s);
  }
  {
    auto s = base(3, 32, 2048);
    s.invalid_fraction = 0.3, s.num_rows = 300;  // duplicates across splits
    add("T3_H32_K2048_invalid_duplicates", s);
  }
  {
    auto s = base(3, 16, 100);
    s.lse_mode = LseMode::kOff;
    add("T3_H16_lse_off", s);
  }
  {
    auto s = base(4, 32, 128);
    s.q_pair = true;
    add("T4_H32_qpair", s);
  }
  {
    auto s = base(5, 16, 2048);
    s.q_pair = true, s.rope_dim = 64, s.sink = true;
    add("T5_H16_K2048_qpair_sink_split", s);
  }
  {
    auto s = base(6, 20, 130);
    s.q_head_pad = 3, s.out_head_pad = 5;  // two-byte q loads, two-byte out stores
    add("T6_H20_strides_odd", s);
  }
  {
    auto s = base(6, 32, 2048);
    s.q_head_pad = 1, s.out_head_pad = 3, s.sink = true;  // the same through the split merge
    add("T6_H32_K2048_strides_odd_split_sink", s);
  }
  add("T5_H16_K300_odd_scales", base(5, 16, 300), true);
  add("T4_H16_K300_q_times_2p70", base(4, 16, 300), false, 70);  // per-head q exponents at their clamps
  add("T4_H32_K2048_q_times_2m70", base(4, 32, 2048), false, -70);
  add("T4_H32_K2048_odd_scales", base(4, 32, 2048), true);
  {
    auto s = base(65537, 2, 16);
    s.num_rows = 1 << 16;
    add("T65537_H2_K16", s);
  }
  {
    auto s = base(0, 16, 64);
    add("T0_H16", s);
  }
  return v;
}

// Every case on each variant: K by bit moves / by cvt, the deep ring and the two teams (H <= 16;
// at H > 16 those run head tile 32 like bits), and H > 16 as two 16-head groups on the teams.
enum class Variant { kBits, kF16, kDeepBits, kTeamsBits, kTeamsF16, kSplitTeamsBits };
smla::cuda::DecodeDiag diag_of(Variant v) {
  const bool f16 = v == Variant::kF16 || v == Variant::kTeamsF16;
  const int ring = v == Variant::kDeepBits ? 1 : v == Variant::kBits || v == Variant::kF16 ? 0 : 2;
  return {f16 ? smla::cuda::DecodeK::kF16 : smla::cuda::DecodeK::kBits, ring, 0, v == Variant::kSplitTeamsBits};
}

std::string variant_suffix(Variant v) {
  static const char* const kNames[] = {"_bits", "_f16", "_deep", "_teams", "_teams_f16", "_h16x2_teams"};
  return kNames[int(v)];
}

class DecodeSmallH : public ::testing::TestWithParam<std::tuple<Case, Variant>> {};

TEST_P(DecodeSmallH, MatchesReferenceOnDequantizedRows) {
  REQUIRE_GPU();
  run_checked(std::get<0>(GetParam()), diag_of(std::get<1>(GetParam())));
}

INSTANTIATE_TEST_SUITE_P(Cases, DecodeSmallH,
                         ::testing::Combine(::testing::ValuesIn(cases()),
                                            ::testing::Values(Variant::kBits, Variant::kF16, Variant::kDeepBits,
                                                              Variant::kTeamsBits, Variant::kTeamsF16,
                                                              Variant::kSplitTeamsBits)),
                         [](const ::testing::TestParamInfo<std::tuple<Case, Variant>>& i) {
                           return std::get<0>(i.param).name + variant_suffix(std::get<1>(i.param));
                         });

// What the kernel refuses, with a reason naming the argument (host only: no device needed).
TEST(DecodeSmallHSupport, RefusesWhatItDoesNotRun) {
  auto hp = smla::testing::make_problem(base(2, 16, 64), 1);
  EXPECT_EQ(smla::cuda::decode_small_h_supports(hp.params), "");
  auto h33 = smla::testing::make_problem(base(2, 33, 64), 1);
  EXPECT_NE(smla::cuda::decode_small_h_supports(h33.params).find("H <= 32"), std::string::npos);
  auto p = hp.params;
  auto bf = smla::testing::make_problem([] {
    auto s = base(2, 16, 64);
    s.format = KvFormat::kBF16;
    return s;
  }(), 1);
  EXPECT_NE(smla::cuda::decode_small_h_supports(bf.params).find("fp8_ds_mla"), std::string::npos);
  auto q8 = smla::testing::make_problem([] {
    auto s = base(2, 16, 64);
    s.q_dtype = DType::kE4M3;
    return s;
  }(), 1);
  EXPECT_NE(smla::cuda::decode_small_h_supports(q8.params).find("bf16 q"), std::string::npos);
  p = hp.params;
  p.topk = 0;  // validate()'s own message comes through
  EXPECT_NE(smla::cuda::decode_small_h_supports(p).find("K >= 1"), std::string::npos);
  p = hp.params;
  p.kv_row_stride_bytes = 664;  // >= 656 but not a multiple of 16
  EXPECT_NE(smla::cuda::decode_small_h_supports(p).find("multiple of 16"), std::string::npos);
}

// The split of the top-k (host only): choose_num_splits over two blocks per SM for H <= 16, one for
// H <= 32, then whole 32-entry tiles per split. Worked examples on 132 SMs, K = 2048.
TEST(DecodeSmallHSupport, SplitChoice) {
  auto splits = [](int64_t T, int H, int K) {
    smla::SparseMlaParams p;  // the split depends on T, H and K only
    p.num_tokens = T, p.num_heads = H, p.topk = K, p.format = KvFormat::kFP8DsMla;
    return smla::cuda::decode_small_h_splits(p, 132);
  };
  EXPECT_EQ(splits(1, 16, 2048), 32);    // 32 blocks of 64 entries
  EXPECT_EQ(splits(32, 16, 2048), 8);    // 256 blocks in one wave of 264 slots, 4 tiles each
  EXPECT_EQ(splits(128, 16, 2048), 2);   // 256 blocks of 1,024 entries
  EXPECT_EQ(splits(128, 32, 2048), 1);   // one block per SM: 128 blocks of 2,048 entries
  EXPECT_EQ(splits(4096, 8, 2048), 1);
  EXPECT_EQ(splits(5, 16, 300), 5);      // 64 entries each (the last 44)
  EXPECT_EQ(splits(5, 16, 77), 1);       // 2 tiles unsplit cost as much as 1 tile + the merge
  EXPECT_EQ(splits(0, 16, 2048), 1);
  for (int K : {1, 31, 33, 77, 300, 2048, 5000})
    for (int64_t T : {1, 7, 100})
      for (int H : {1, 16, 32}) {
        const int s = splits(T, H, K);
        EXPECT_GE(s, 1);
        EXPECT_LE(s, smla::kMaxSplits);
      }
}

TEST(DecodeSmallHSupport, WorkspaceTooSmallThrows) {
  REQUIRE_GPU();
  auto hp = smla::testing::make_problem(base(1, 16, 2048), 1);  // T = 1: the top-k is split
  const int sms = smla::cuda::device_info(0).num_sms;
  ASSERT_GT(smla::cuda::decode_small_h_splits(hp.params, sms), 1);
  ASSERT_GT(smla::cuda::decode_small_h_workspace_bytes(hp.params, sms), 0u);
  // Host pointers are never touched: the size check comes before any launch.
  EXPECT_THROW(smla::cuda::decode_small_h_launch(hp.params, nullptr, 0, nullptr), smla::Error);
}

// ---- benchmark ---------------------------------------------------------------------------------

struct Timer {
  cudaEvent_t a, b;
  Timer() { cudaEventCreate(&a), cudaEventCreate(&b); }
  ~Timer() { cudaEventDestroy(a), cudaEventDestroy(b); }
};

// Median of `reps` timed launches of f(rep) (after 3 warm-ups), in microseconds; each launch timed
// alone, queued behind a GPU sleep so the host's launch rate is not measured.
template <typename F>
double median_us(int reps, F&& f) {
  for (int i = 0; i < 3; ++i) f(i);
  check(cudaDeviceSynchronize(), "warm-up");
  Timer tm;
  std::vector<float> ms;
  for (int i = 0; i < reps; ++i) {
    smla::cuda::gpu_sleep(20000, nullptr);
    cudaEventRecord(tm.a);
    f(3 + i);
    cudaEventRecord(tm.b);
    check(cudaEventSynchronize(tm.b), "timed launch");
    float x = 0;
    cudaEventElapsedTime(&x, tm.a, tm.b);
    ms.push_back(x);
  }
  std::sort(ms.begin(), ms.end());
  return 1000.0 * ms[ms.size() / 2];
}

// The benchmark's data: a 1M-row fp8_ds_mla pool tiled from 4096 encoded random rows (real e4m3
// codes and scales), 4096 x 2048 random row ids, a bf16 q for up to 4096 tokens x 32 heads.
struct BenchData {
  static constexpr int64_t kPool = 1 << 20;
  static constexpr int K = 2048;
  static constexpr int64_t kIdxEntries = int64_t(4096) * K;  // the T = 4096 set; smaller T cycle through it
  static constexpr int kMaxH = 32;
  DeviceBuffer kv, idx, q, out, lse, ws, scratch;
  BenchData() {
    std::vector<uint8_t> host(size_t(kPool) * 656);
    std::mt19937_64 rng(7);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> latent(512), rope(64);
    const int distinct = 4096;
    for (int r = 0; r < distinct; ++r) {
      for (auto& x : latent) x = nd(rng);
      for (auto& x : rope) x = nd(rng);
      smla::encode_row(KvFormat::kFP8DsMla, 64, latent.data(), rope.data(), 1.0f, host.data() + size_t(r) * 656);
    }
    for (int64_t r = distinct; r < kPool; ++r)
      std::memcpy(host.data() + size_t(r) * 656, host.data() + size_t(r % distinct) * 656, 656);
    kv.make(host.size(), host.data());
    idx.make(size_t(kIdxEntries) * 4, nullptr);
    smla::cuda::fill_random_rows(static_cast<int32_t*>(idx.ptr), size_t(kIdxEntries), kPool, 11, nullptr);
    q.make(size_t(4096) * kMaxH * 576 * 2, nullptr);
    smla::cuda::fill_random_16bit(q.ptr, size_t(4096) * kMaxH * 576, DType::kBF16, 13, nullptr);
    out.make(size_t(4096) * kMaxH * 512 * 2, nullptr);
    lse.make(size_t(4096) * kMaxH * 4, nullptr);
    scratch.make(4, nullptr);
  }
  smla::SparseMlaParams params(int64_t T, int H) const {
    smla::SparseMlaParams p;
    p.num_tokens = T, p.num_heads = H, p.topk = K, p.rope_dim = 64;
    p.q = q.ptr, p.q_dtype = DType::kBF16;
    p.kv = kv.ptr, p.num_rows = kPool, p.kv_row_stride_bytes = 656, p.format = KvFormat::kFP8DsMla;
    p.idx = static_cast<const int32_t*>(idx.ptr);
    p.softmax_scale = 0.1352338f;
    p.out = out.ptr, p.out_dtype = DType::kBF16, p.lse = static_cast<float*>(lse.ptr);
    smla::set_dense_strides(p);
    return p;
  }
};

// One variant on one shape, for a profiler (not a test; disabled unless asked for):
//   SMLA_DECODE_PROFILE=H,T,ring,k,mode,split_heads  (k: 0 bits, 1 f16; mode: 0 normal, 1 pipe, 2 prod)
//   ncu --kernel-name regex:decode_fp8_ds_mla_kernel --launch-skip 2 --launch-count 1 ... \
//     build-exp/experiments/decode_small_h/smla_experiment_tests --gtest_also_run_disabled_tests --gtest_filter='DecodeSmallHBench.DISABLED_ProfileOne'
// Three launches: two warm-ups, then the one to profile; prints the median of 5 timed ones after.
TEST(DecodeSmallHBench, DISABLED_ProfileOne) {
  REQUIRE_GPU();
  int H = 16, ring = 0, k = 0, mode = 0, split_heads = 0;
  long long T = 4096;
  if (const char* e = std::getenv("SMLA_DECODE_PROFILE"))
    std::sscanf(e, "%d,%lld,%d,%d,%d,%d", &H, &T, &ring, &k, &mode, &split_heads);
  BenchData data;
  auto p = data.params(T, H);
  const int sms = smla::cuda::device_info(0).num_sms;
  const size_t ws_bytes = smla::cuda::decode_small_h_workspace_bytes(p, sms);
  data.ws.make(ws_bytes, nullptr);
  const smla::cuda::DecodeDiag v{k ? smla::cuda::DecodeK::kF16 : smla::cuda::DecodeK::kBits, ring, mode, split_heads != 0};
  for (int i = 0; i < 3; ++i) smla::cuda::decode_small_h_launch_diag(p, data.ws.ptr, ws_bytes, nullptr, v);
  check(cudaDeviceSynchronize(), "profiled launches");
  const double us = median_us(5, [&](int) { smla::cuda::decode_small_h_launch_diag(p, data.ws.ptr, ws_bytes, nullptr, v); });
  std::printf("[ decode   ] H %d T %lld ring %d k %d mode %d split_heads %d: %.1f us, %d blocks/SM\n", H, T, ring, k,
              mode, split_heads, us, smla::cuda::decode_small_h_blocks_per_sm(p, v));
}

TEST(DecodeSmallHBench, DISABLED_Fp8DsMlaVsSparseMlaAndGatherLimit) {
  REQUIRE_GPU();
  constexpr int64_t kPool = BenchData::kPool;
  constexpr int K = BenchData::K;
  constexpr int64_t kIdxEntries = BenchData::kIdxEntries;
  const int sms = smla::cuda::device_info(0).num_sms;
  BenchData data;
  auto& kv = data.kv;
  auto& idx = data.idx;
  auto& ws = data.ws;
  auto& scratch = data.scratch;
  size_t ws_bytes = 0;
  std::vector<smla::SparseMlaParams> all;
  for (int H : {8, 16, 32})
    for (int64_t T : {1, 32, 128, 4096}) {
      const auto p = data.params(T, H);
      ws_bytes = std::max({ws_bytes, smla::cuda::decode_small_h_workspace_bytes(p, sms),
                           smla::cuda::sparse_mla_workspace_bytes(p, sms)});
      all.push_back(p);
    }
  ws.make(ws_bytes, nullptr);
  using smla::cuda::DecodeDiag;
  using smla::cuda::DecodeK;
  std::printf("[ decode   ] fp8_ds_mla, bf16 q, K = %d, %lld-row pool, %d SMs; medians in us; frac = gather limit / time\n",
              K, (long long)kPool, sms);
  std::printf("[ decode   ] variants: bits / f16 = K by bit moves / by cvt (H <= 16: two blocks per SM; H = 32: head tile"
              " 32, one block); deep = one block, 8 stages, pipelined; teams = one block of two 8-warp teams (bits); at"
              " H = 32 deep and teams run two 16-head groups\n");
  std::printf("[ decode   ] diagnostics (bits): pipe = rows gathered, no products; prod = products, no rows gathered\n");
  std::printf("[ decode   ] %4s %5s %6s | %8s %5s | %8s %5s | %8s %5s | %8s %5s | %8s %5s | %10s %5s | %7s %7s %7s %7s | %s\n",
              "H", "T", "splits", "gather", "TB/s", "bits", "frac", "f16", "frac", "deep", "frac", "teams", "frac",
              "sparse_mla", "frac", "pipe", "prod", "tm.pipe", "tm.prod", "blocks/SM bits,deep,teams; rel L2 vs sparse_mla");
  for (auto p : all) {
    const int64_t entries = p.num_tokens * K;
    const int64_t sets = std::max<int64_t>(1, kIdxEntries / entries);  // keep rows out of L2 for small T
    const int reps = p.num_tokens >= 4096 ? 7 : 21;
    const auto* idx0 = static_cast<const int32_t*>(idx.ptr);
    auto at = [&](int rep) { return idx0 + (rep % sets) * entries; };
    const double g = median_us(reps, [&](int rep) {
      smla::cuda::gather_rows_limit(p.kv, 656, kPool, 656, at(rep), entries, static_cast<uint32_t*>(scratch.ptr),
                                    nullptr);
    });
    const bool small = p.num_heads <= 16;
    // Rings 1 and 2 at H > 16 run as two 16-head groups ("h16x2").
    auto variant = [&](DecodeK k, int ring, int mode) { return DecodeDiag{k, ring, mode, !small && ring != 0}; };
    auto decode = [&](DecodeK k, int ring, int mode) {
      return median_us(reps, [&](int rep) {
        p.idx = at(rep);
        smla::cuda::decode_small_h_launch_diag(p, ws.ptr, ws_bytes, nullptr, variant(k, ring, mode));
      });
    };
    const double db = decode(DecodeK::kBits, 0, 0), df = decode(DecodeK::kF16, 0, 0);
    const double dd = decode(DecodeK::kBits, 1, 0), dt = decode(DecodeK::kBits, 2, 0);
    const double pipe = decode(DecodeK::kBits, 0, 1), prod = decode(DecodeK::kBits, 0, 2);
    const double tpipe = decode(DecodeK::kBits, 2, 1), tprod = decode(DecodeK::kBits, 2, 2);
    const double sm = median_us(reps, [&](int rep) {
      p.idx = at(rep);
      smla::cuda::sparse_mla(p, ws.ptr, ws_bytes, nullptr);
    });
    // The same call's outputs agree with cuda::sparse_mla's (a sanity check at full size; the tests
    // above hold both to the float64 reference).
    const size_t n_out = size_t(p.num_tokens) * p.num_heads * 512;
    std::vector<uint16_t> ref(n_out), got(n_out);
    p.idx = at(0);
    smla::cuda::sparse_mla(p, ws.ptr, ws_bytes, nullptr);
    check(cudaMemcpy(ref.data(), p.out, n_out * 2, cudaMemcpyDeviceToHost), "copy out");
    auto rel = [&](DecodeK k, int ring) {
      smla::cuda::decode_small_h_launch_diag(p, ws.ptr, ws_bytes, nullptr, variant(k, ring, 0));
      check(cudaMemcpy(got.data(), p.out, n_out * 2, cudaMemcpyDeviceToHost), "copy out");
      double num = 0, den = 0;
      for (size_t i = 0; i < n_out; ++i) {
        const double a = smla::num::bf16_to_f32(got[i]), b = smla::num::bf16_to_f32(ref[i]);
        num += (a - b) * (a - b), den += b * b;
      }
      return std::sqrt(num / std::max(den, 1e-300));
    };
    const double worst = std::max({rel(DecodeK::kBits, 0), rel(DecodeK::kF16, 0), rel(DecodeK::kBits, 1),
                                   rel(DecodeK::kBits, 2), rel(DecodeK::kF16, 2)});
    auto occ = [&](int ring) { return smla::cuda::decode_small_h_blocks_per_sm(p, variant(DecodeK::kBits, ring, 0)); };
    const double tbs = double(entries) * 656.0 / (g * 1e-6) / 1e12;
    auto fr = [&](double x) { return x > 0 ? g / x : 0.0; };
    std::printf("[ decode   ] %4d %5lld %6d | %8.1f %5.2f | %8.1f %5.2f | %8.1f %5.2f | %8.1f %5.2f | %8.1f %5.2f | %10.1f "
                "%5.2f | %7.1f %7.1f %7.1f %7.1f | %d,%d,%d; %.1e\n",
                p.num_heads, (long long)p.num_tokens, smla::cuda::decode_small_h_splits(p, sms, DecodeDiag{}), g, tbs, db, fr(db),
                df, fr(df), dd, fr(dd), dt, fr(dt), sm, fr(sm), pipe, prod, tpipe, tprod, occ(0), occ(1), occ(2), worst);
    std::fflush(stdout);
  }
}

}  // namespace
