// Quantized KV caches (fp8_e4m3, fp8_ds_mla, nvfp4_ds_mla) on the SM90 sparse MLA kernel.
//
// Host part (runs without a GPU): the dequantization functions the kernel uses (dequant.h)
// reproduce smla::decode_row bit for bit (rounded to bf16) for every byte value and for encoded
// and arbitrary rows.
// GPU part: the float64 reference on the dequantized rows (DESIGN.md §8: rel L2 <= 1e-2, LSE abs
// <= 1e-3), with fresh random inputs (seed printed on failure), NaN rows that no entry selects and
// poisoned outputs; and a report (printed, not asserted) of what quantization itself costs
// against the same data in a bf16 cache.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include "../common/gpu_test.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "cuda/sm90/sparse_mla/config.h"
#include "cuda/sm90/sparse_mla/dequant.h"
#include "devtools/testing.h"
#include "reference/sparse_mla.h"
#include "smla/api.h"
#include "smla/cuda.h"
#include "smla/formats.h"
#include "smla/numeric.h"

namespace {

using smla::DType;
using smla::KvFormat;
using smla::LseMode;
using smla::testing::ProblemSpec;
using smla::test::fresh_seed;
namespace k = smla::cuda::sm90::sparse_mla;

// ---- host: dequant.h against numeric.h / decode_row ---------------------------------------------

bool same_bf16(uint32_t a, uint32_t b) {
  const bool na = (a & 0x7fffu) > 0x7f80u, nb = (b & 0x7fffu) > 0x7f80u;
  return na || nb ? na == nb : a == b;
}

TEST(QuantDequant, E4m3EveryByte) {
  for (uint32_t b = 0; b < 256; ++b) {
    const uint32_t want = smla::num::f32_to_bf16(smla::num::e4m3_to_f32(uint8_t(b)));
    EXPECT_TRUE(same_bf16(k::dq::e4m3_bf16_bits(b), want)) << "byte 0x" << std::hex << b;
  }
}

TEST(QuantDequant, E2m1EveryCodeAndScale) {
  for (uint32_t sb = 0; sb < 256; ++sb) {
    if ((sb & 0x7f) == 0x7f) continue;  // NaN scale
    const float sf = smla::num::e4m3_to_f32(uint8_t(sb));
    for (uint32_t nib = 0; nib < 16; ++nib) {
      const float want = smla::num::e2m1_to_f32(uint8_t(nib)) * sf;
      const float got = k::dq::e2m1_times(nib, 0.5f * k::dq::e4m3_f32(sb));
      EXPECT_EQ(smla::num::f32_bits(got), smla::num::f32_bits(want)) << "scale 0x" << std::hex << sb << " code " << nib;
      EXPECT_EQ(smla::num::f32_to_bf16(want), smla::num::f32_bits(want) >> 16) << "not exact in bf16";
    }
  }
}

// The table-lookup decode (warp-specialized kernel's producer) against the arithmetic one, for every
// code in every position and every non-NaN scale byte.
TEST(QuantDequant, E2m1LookupEqualsArithmetic) {
  std::mt19937_64 rng(fresh_seed());
  std::vector<uint32_t> words;
  for (uint32_t nib = 0; nib < 16; ++nib) words.push_back(nib * 0x11111111u);
  words.push_back(0x76543210u), words.push_back(0xfedcba98u), words.push_back(0x89abcdefu);
  for (int i = 0; i < 64; ++i) words.push_back(uint32_t(rng()));
  for (uint32_t sb = 0; sb < 256; ++sb) {
    if ((sb & 0x7f) == 0x7f) continue;  // NaN scale
    for (uint32_t w : words) {
      const k::dq::Chunk want = k::dq::e2m1x8_scaled(w, k::dq::e4m3_f32(sb));
      const k::dq::Chunk got = k::dq::e2m1x8_scaled_lut(w, k::dq::e4m3_bf16_bits(sb));
      for (int i = 0; i < 4; ++i)
        ASSERT_EQ(got.w[i], want.w[i]) << "scale 0x" << std::hex << sb << " word 0x" << w << " pair " << i;
    }
  }
}

k::dq::Chunk dequant_chunk(KvFormat f, const uint8_t* raw, int ch) {
  switch (f) {
    case KvFormat::kFP8E4M3: return k::dq::dequant_chunk<KvFormat::kFP8E4M3>(raw, ch);
    case KvFormat::kFP8DsMla: return k::dq::dequant_chunk<KvFormat::kFP8DsMla>(raw, ch);
    default: return k::dq::dequant_chunk<KvFormat::kNvFP4DsMla>(raw, ch);
  }
}

// The row decoded chunk by chunk with dequant.h (the logical bf16 row [D]).
std::vector<uint16_t> dequant_row(KvFormat f, int rope, const uint8_t* row) {
  const int row_chunks = (smla::kLatentDim + rope) * 2 / 16;
  std::vector<uint16_t> out(size_t(row_chunks) * 8);
  for (int ch = 0; ch < row_chunks; ++ch) {
    const k::dq::Chunk c = dequant_chunk(f, row, ch);
    std::memcpy(out.data() + ch * 8, c.w, 16);
  }
  return out;
}

TEST(QuantDequant, RowsMatchDecodeRow) {
  std::mt19937_64 rng(fresh_seed());
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (KvFormat f : {KvFormat::kFP8E4M3, KvFormat::kFP8DsMla, KvFormat::kNvFP4DsMla})
    for (int rope : {64, 0})
      for (int trial = 0; trial < 64; ++trial) {
        const int rb = smla::row_bytes(f, rope), D = smla::kLatentDim + rope;
        std::vector<uint8_t> row(static_cast<size_t>(rb));
        if (trial < 32) {  // encoded rows over a range of magnitudes
          std::vector<float> lat(512), rp(64);
          const float mul = std::ldexp(1.0f, trial % 16 - 8);
          for (auto& v : lat) v = normal(rng) * mul;
          for (auto& v : rp) v = normal(rng) * mul;
          smla::encode_row(f, rope, lat.data(), rp.data(), 1.0f, row.data());
        } else {  // arbitrary bytes, finite scales (fp8_ds_mla: any fp32 scale, not a power of two)
          for (auto& b : row) b = uint8_t(rng());
          for (auto& b : row) b = (b & 0x7f) == 0x7f ? uint8_t(b ^ 1) : b;  // no NaN e4m3 / e2m1 scale
          if (f == KvFormat::kFP8DsMla) {
            constexpr smla::RowLayout l = smla::row_layout(KvFormat::kFP8DsMla);
            for (int i = 0; i < l.num_scales; ++i) {
              const float s = std::exp(float(int(rng() % 2000) - 1000) * 0.01f);
              std::memcpy(row.data() + l.scale_offset + l.scale_bytes * i, &s, sizeof s);
            }
            for (int i = 0; i < smla::kRopeDim; ++i) {  // finite bf16 RoPE
              uint16_t v = smla::num::f32_to_bf16(normal(rng));
              std::memcpy(row.data() + l.rope_offset + 2 * i, &v, 2);
            }
          }
        }
        std::vector<float> want(static_cast<size_t>(D));
        smla::decode_row(f, rope, row.data(), 1.0f, want.data());
        const auto got = dequant_row(f, rope, row.data());
        int bad = 0;
        for (int i = 0; i < D; ++i) bad += !same_bf16(got[size_t(i)], smla::num::f32_to_bf16(want[size_t(i)]));
        EXPECT_EQ(bad, 0) << smla::to_string(f) << " rope " << rope << " trial " << trial;
      }
}

// ---- GPU ---------------------------------------------------------------------------------------

// testing::reference_double on all cores: the same reference::sparse_mla_row_head per (t, h).
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

// Runs spec with the given score precision (the variant table picks h64.ws or h64.ws.q8 by the
// resolved precision; auto must pick h64.ws.q8 for an e4m3 q and h64.ws otherwise) against
// the float64 reference on the dequantized rows (and the same e4m3 q). bf16 scores: DESIGN.md §8's
// bar for quantized caches (rel L2 <= 1e-2, LSE abs <= 1e-3). fp8 scores (products on the fp8
// tensor cores, summed with fewer bits than fp32): §8's fp8-product bar, rel L2 <= 5e-3, LSE abs
// <= 1e-2 and a mean signed LSE error within +-1e-3 (no bias); each case's figures are printed.
// batch_invariant: the call as a batch-invariant plan makes it (the table's kernel at every T); else
// the small-call rule may run h64.ws for swapab (smla/support.h, kSwapAbN32MinRows).
void run_checked_once(const ProblemSpec& spec, const std::string& what, smla::ScorePrecision score, uint64_t seed,
                      bool batch_invariant) {
  auto hp = smla::testing::make_problem(spec, seed);
  hp.params.score_precision = score;
  SCOPED_TRACE(what + " (seed " + std::to_string(seed) + (batch_invariant ? ", batch-invariant" : "") + ")");
  const auto& p = hp.params;
  const smla::CudaVariant* table = smla::cuda_variant_for(smla::geometry_of(p), smla::any_sm90_device());
  const smla::CudaVariant* variant =
      smla::cuda_variant_for(smla::geometry_of(p), smla::any_sm90_device(), p.num_tokens, batch_invariant);
  ASSERT_NE(variant, nullptr) << "no variant supports this case";
  if (variant != table) {  // the small-call rule: a swapab geometry at H > 16 with few rows
    EXPECT_STREQ(table->name, "swapab");
    EXPECT_STREQ(variant->name, "h64.ws");
    EXPECT_GT(p.num_heads, 16);
    EXPECT_LT(p.num_tokens, smla::kSwapAbN32MinRows);
    EXPECT_FALSE(batch_invariant);
  }
  const smla::ScorePrecision resolved = smla::resolve_score_precision(smla::geometry_of(p));
  if (score == smla::ScorePrecision::kAuto) {  // the default: fp8 scores for an e4m3 q (fp8 caches only take one),
    // except fp8_ds_mla at H <= 32, where the swap-AB kernel runs either q with bf16 scores (s11, s14: N = 32
    // above 16 heads); nvfp4_ds_mla on swapab at H <= 16 only
    const bool swapab = p.num_heads <= smla::swapab_max_heads(p.format) &&
                        (p.format == KvFormat::kFP8DsMla || (p.format == KvFormat::kFP8E4M3 && p.q_dtype == DType::kBF16) ||
                         p.format == KvFormat::kNvFP4DsMla);
    EXPECT_STREQ(table->name, swapab ? "swapab" : p.q_dtype == DType::kE4M3 ? "h64.ws.q8" : "h64.ws");
  }
  else
    EXPECT_EQ(resolved, score);
  EXPECT_EQ(variant->score_precision, resolved) << variant->name;
  std::vector<double> ref_out, ref_lse;
  reference(hp, ref_out, ref_lse);
  smla::cuda::sparse_mla_from_host(hp.params, hp.kv_bytes(), batch_invariant);
  const auto d = smla::testing::compare(hp, ref_out, ref_lse);
  EXPECT_EQ(d.nonfinite, 0);
  if (resolved == smla::ScorePrecision::kFP8) {
    double sum = 0;
    int64_t rows = 0;
    if (p.lse != nullptr)
      for (int64_t t = 0; t < p.num_tokens; ++t)
        for (int h = 0; h < p.num_heads; ++h) {
          double got = p.lse[t * p.lse_stride_t + h], want = ref_lse[size_t(t * p.num_heads + h)];
          if (p.lse_mode == LseMode::kBase2) got /= M_LOG2E, want /= M_LOG2E;  // errors in natural-log units
          if (std::isfinite(got) && std::isfinite(want)) sum += got - want, ++rows;
        }
    const double mean = rows ? sum / double(rows) : 0.0;
    std::printf("[ fp8 S    ] %s (%s): out rel L2 %.2e, LSE max abs %.2e, LSE mean signed error %+.2e\n", what.c_str(),
                variant->name, d.rel_l2, d.lse_max_abs, mean);
    EXPECT_LE(d.rel_l2, 5e-3);
    EXPECT_LE(d.lse_max_abs, 1e-2);
    EXPECT_LE(std::fabs(mean), 1e-3) << "the fp8 score sums are biased";
  } else {
    EXPECT_LE(d.rel_l2, 1e-2);
    EXPECT_LE(d.lse_max_abs, 1e-3);
  }

  if (spec.out_head_pad > 0) {  // cells between heads keep their poison
    const auto* o = reinterpret_cast<const uint16_t*>(hp.out.data());
    int64_t touched = 0;
    for (int64_t t = 0; t < p.num_tokens; ++t)
      for (int h = 0; h < p.num_heads; ++h)
        for (int64_t e = smla::kLatentDim; e < p.out_stride_h; ++e)
          touched += o[t * p.out_stride_t + h * p.out_stride_h + e] != 0xffffu;
    EXPECT_EQ(touched, 0) << "cells between heads were written";
  }
  if (spec.lse_mode == LseMode::kOff) {
    int64_t written = 0;
    for (float v : hp.lse) written += !std::isnan(v);
    EXPECT_EQ(written, 0) << "lse written although LSE is off";
  }
  for (int64_t t = 0; t < p.num_tokens; ++t) {  // empty rows: out exactly 0, LSE -inf
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
}

// Each case on the kernel a call of its T runs and, where the small-call rule picks h64.ws instead of
// swapab, again as a batch-invariant plan runs it (swapab at that T), from the same data.
void run_checked(const ProblemSpec& spec, const std::string& what, smla::ScorePrecision score) {
  const uint64_t seed = fresh_seed();
  run_checked_once(spec, what, score, seed, false);
  auto hp = smla::testing::make_problem(spec, seed);
  hp.params.score_precision = score;
  const smla::Geometry g = smla::geometry_of(hp.params);
  if (smla::cuda_variant_for(g, smla::any_sm90_device()) !=
      smla::cuda_variant_for(g, smla::any_sm90_device(), hp.params.num_tokens, false))
    run_checked_once(spec, what, score, seed, true);
}

struct Case {
  std::string name;
  ProblemSpec spec;
  smla::ScorePrecision score = smla::ScorePrecision::kBF16;
};
// GoogleTest prints a parameter in test listings: the case's name, not a dump of its bytes.
void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

const char* short_name(KvFormat f) {
  return f == KvFormat::kFP8E4M3 ? "e4m3" : f == KvFormat::kFP8DsMla ? "dsfp8" : "nvfp4";
}

ProblemSpec base(KvFormat f, int64_t T, int H, int K) {
  ProblemSpec s;
  s.format = f;
  s.num_tokens = T, s.num_heads = H, s.topk = K;
  s.num_rows = K > 1024 ? 16384 : 4096;
  if (f == KvFormat::kFP8E4M3) s.k_scale = 0.37f;  // not a power of two: k_scale folding is exercised
  return s;
}

std::vector<Case> cases() {
  std::vector<Case> v;
  auto add = [&](KvFormat f, std::string name, ProblemSpec s) {
    v.push_back({std::string(short_name(f)) + "_" + name, s});
  };
  for (KvFormat f : {KvFormat::kFP8E4M3, KvFormat::kFP8DsMla, KvFormat::kNvFP4DsMla}) {
    // The grid: H x K x D (T = 2-5: split top-k for K = 2048).
    for (int H : {1, 3, 16, 48, 64, 128})
      for (int K : {77, 2048})
        for (int rope : {64, 0}) {
          auto s = base(f, K > 1024 ? (H >= 48 ? 2 : 3) : 5, H, K);
          s.rope_dim = rope;
          add(f, "T" + std::to_string(s.num_tokens) + "_H" + std::to_string(H) + "_K" + std::to_string(K) + "_D" +
                     std::to_string(512 + rope),
              s);
        }
    {
      auto s = base(f, 7, 3, 300);
      s.use_counts = true, s.sink = true, s.lse_mode = LseMode::kBase2;
      add(f, "T7_H3_K300_counts_sink_lse2", s);
    }
    {
      auto s = base(f, 300, 16, 77);  // no split
      s.sink = true;
      add(f, "T300_H16_K77_sink_nosplit", s);
    }
    {
      auto s = base(f, 140, 128, 77);
      s.rope_dim = 0, s.use_counts = true;
      add(f, "T140_H128_K77_D512_counts_nosplit", s);
    }
    {
      auto s = base(f, 8, 16, 300);
      s.all_invalid_row = true, s.use_counts = true, s.sink = true;
      add(f, "T8_H16_all_invalid_counts_sink", s);
    }
    {
      auto s = base(f, 200, 48, 100);
      s.all_invalid_row = true, s.sink = true;
      add(f, "T200_H48_all_invalid_sink_nosplit", s);
    }
    {
      auto s = base(f, 4, 64, 500);
      s.invalid_fraction = 0.6, s.num_rows = 50;  // many invalid (-1, negative, >= num_rows) and duplicates
      add(f, "T4_H64_invalid_duplicates", s);
    }
    {
      auto s = base(f, 3, 16, 100);
      s.lse_mode = LseMode::kOff;
      add(f, "T3_H16_lse_off", s);
    }
    {
      auto s = base(f, 4, 32, 128);
      s.q_pair = true;
      add(f, "T4_H32_qpair", s);
    }
    {
      auto s = base(f, 6, 20, 130);
      s.q_head_pad = 3, s.out_head_pad = 5;
      add(f, "T6_H20_strides_odd", s);
    }
    {
      auto s = base(f, 65537, 2, 16);
      s.num_rows = 1 << 16;
      add(f, "T65537_H2_K16", s);
    }
    if (f == KvFormat::kFP8DsMla) {  // H > 64: two head groups
      {
        auto s = base(f, 4, 128, 500);
        s.invalid_fraction = 0.6, s.num_rows = 50;  // many invalid (-1, negative, >= num_rows) and duplicates
        add(f, "T4_H128_invalid_duplicates", s);
      }
      {
        auto s = base(f, 8, 96, 300);
        s.all_invalid_row = true, s.use_counts = true, s.sink = true, s.lse_mode = LseMode::kBase2;
        add(f, "T8_H96_K300_all_invalid_counts_sink_lse2", s);
      }
    }
    // The swap-AB kernel's shapes (H <= 16: N = 16; and H = 17, 32 on h64.ws): fp8_ds_mla, and nvfp4_ds_mla
    // (its 8-stage ring wraps at K = 1024, 2048).
    if (f != KvFormat::kFP8E4M3) {
      for (int H : {8, 17, 32}) add(f, "T3_H" + std::to_string(H) + "_K2048_split", base(f, 3, H, 2048));
      add(f, "T1_H16_K2048_split", base(f, 1, 16, 2048));
      add(f, "T1_H32_K2048_D512_split", [&] { auto s = base(f, 1, 32, 2048); s.rope_dim = 0; return s; }());
      {
        auto s = base(f, 5, 16, 500);
        s.invalid_fraction = 0.6, s.num_rows = 50;  // many invalid (-1, negative, >= num_rows) and duplicates
        add(f, "T5_H16_invalid_duplicates", s);
      }
      {
        auto s = base(f, 300, 16, 256);  // no split, 4 tiles: both consumers, the ring wraps
        s.use_counts = true, s.sink = true;
        add(f, "T300_H16_K256_counts_sink_nosplit", s);
      }
      {
        auto s = base(f, 200, 8, 1024);
        s.lse_mode = LseMode::kBase2;
        add(f, "T200_H8_K1024_lse2", s);
      }
    } else {  // fp8_e4m3 at H <= 16 runs swapab by default (s12): its invalid / duplicate / out-of-range
              // indices there, the memcheck case of docs/perf-history.md#s12-swapab-diet
      auto s = base(f, 5, 16, 500);
      s.invalid_fraction = 0.6, s.num_rows = 50;
      add(f, "T5_H16_invalid_duplicates", s);
    }
    if (f != KvFormat::kNvFP4DsMla) {  // h64.ws just past swapab's H <= 16 (session 12's head-group shapes):
      // H not a multiple of 16, sink in the kernel and in the merge, counts
      {
        auto s = base(f, 300, 20, 256);  // no split, 4 tiles per block
        s.use_counts = true, s.sink = true;
        add(f, "T300_H20_K256_counts_sink_nosplit", s);
      }
      {
        auto s = base(f, 3, 31, 2048);  // split: the partials and the merge index the call's heads
        s.sink = true, s.lse_mode = LseMode::kBase2;
        add(f, "T3_H31_K2048_split_sink_lse2", s);
      }
      {
        auto s = base(f, 5, 17, 500);
        s.invalid_fraction = 0.6, s.num_rows = 50;  // many invalid (-1, negative, >= num_rows) and duplicates
        s.all_invalid_row = true;
        add(f, "T5_H17_invalid_duplicates_all_invalid", s);
      }
      {
        auto s = base(f, 200, 32, 1024);
        s.q_pair = true;
        add(f, "T200_H32_K1024_qpair", s);
      }
    }
    if (f != KvFormat::kNvFP4DsMla) {  // swapab N = 32 (17 <= H <= 32; docs/perf-history.md#s14-swapab-n32):
      // odd H, T = 1 (32 splits), D = 512, counts and sink (in the merge and in the kernel), invalid / duplicate /
      // out-of-range indices with an all-invalid row, LSE off, T >= 65536, the ring wrapping without a split
      add(f, "T1_H24_K2048_split", base(f, 1, 24, 2048));
      {
        auto s = base(f, 3, 24, 2048);
        s.rope_dim = 0, s.use_counts = true, s.sink = true;
        add(f, "T3_H24_K2048_D512_split_counts_sink", s);
      }
      {
        auto s = base(f, 300, 32, 256);  // no split, 4 tiles: both consumers, the ring wraps
        s.use_counts = true, s.sink = true, s.lse_mode = LseMode::kBase2;
        add(f, "T300_H32_K256_counts_sink_lse2_nosplit", s);
      }
      {
        auto s = base(f, 5, 32, 500);
        s.invalid_fraction = 0.6, s.num_rows = 50, s.all_invalid_row = true;
        add(f, "T5_H32_invalid_duplicates_all_invalid", s);
      }
      {
        auto s = base(f, 64, 17, 1000);  // the tail tile partly masked, an odd tile count per consumer
        s.lse_mode = LseMode::kOff;
        add(f, "T64_H17_K1000_lse_off", s);
      }
      {
        auto s = base(f, 65537, 24, 16);
        s.num_rows = 1 << 16;
        add(f, "T65537_H24_K16", s);
      }
    }
    // Split top-k at the latency shapes (bf16 partials: perf-history s10-partials): 32 splits at T = 1,
    // 2 at T = 32 (H = 128).
    for (int T : {1, 32}) add(f, "T" + std::to_string(T) + "_H128_K2048_split", base(f, T, 128, 2048));
    if (f == KvFormat::kFP8E4M3) {  // values of large magnitude through out_scale and the bf16 partials
      auto s = base(f, 1, 128, 2048);
      s.k_scale = 1e4f, s.softmax_scale /= 1e4f / 0.37f;  // the cases' scores, rows of std 1e4
      add(f, "T1_H128_K2048_split_kscale1e4", s);
    }
  }
  // The fp8 caches with an e4m3 q (q_scale folded into the score scale), every case with both
  // score precisions: bf16 (h64.ws, q widened exactly) and fp8 (h64.ws.q8, the fp8 tensor cores).
  const size_t first_e4m3_q = v.size();
  for (KvFormat f : {KvFormat::kFP8E4M3, KvFormat::kFP8DsMla}) {
    auto qbase = [&](int64_t T, int H, int K, float q_scale) {
      auto s = base(f, T, H, K);
      s.q_dtype = DType::kE4M3, s.q_scale = q_scale;
      if (f == KvFormat::kFP8E4M3) s.k_scale = 0.5f;  // the rows' values are N(0, k_scale^2): scores of real size
      return s;
    };
    for (int H : {1, 16, 64, 128})
      for (int rope : {64, 0}) {
        auto s = qbase(H >= 64 ? 2 : 5, H, H == 16 ? 2048 : 300, 0.05f);
        s.rope_dim = rope;
        add(f, "qe4m3_T" + std::to_string(s.num_tokens) + "_H" + std::to_string(H) + "_D" + std::to_string(512 + rope),
            s);
      }
    {
      auto s = qbase(3, 128, 2048, 0.05f);  // split top-k, two head groups
      add(f, "qe4m3_T3_H128_K2048", s);
    }
    for (int T : {1, 32}) {  // the latency shapes: 32 / 2 splits
      auto s = qbase(T, 128, 2048, 0.05f);
      add(f, "qe4m3_T" + std::to_string(T) + "_H128_K2048_split", s);
    }
    if (f == KvFormat::kFP8E4M3) {  // rows of std 5e3 (k_scale), the same scores
      auto s = qbase(1, 128, 2048, 0.05f);
      s.k_scale = 5e3f, s.softmax_scale /= 1e4f;
      add(f, "qe4m3_T1_H128_K2048_split_kscale5e3", s);
    }
    {
      auto s = qbase(4, 48, 200, 0.1f);
      s.q_pair = true, s.sink = true;
      add(f, "qe4m3_T4_H48_qpair_sink", s);
    }
    for (int H : {24, 32}) {  // bf16 scores (and fp8_ds_mla's auto): swapab N = 32, the q widened
      auto s = qbase(3, H, 2048, 0.05f);
      s.rope_dim = H == 32 ? 0 : 64, s.sink = true;
      add(f, "qe4m3_T3_H" + std::to_string(H) + "_K2048_D" + std::to_string(512 + s.rope_dim) + "_sink", s);
    }
    {
      auto s = qbase(6, 20, 130, 0.1f);
      s.q_head_pad = 3, s.out_head_pad = 5;  // byte loads of q
      add(f, "qe4m3_T6_H20_strides_odd", s);
    }
    {
      auto s = qbase(7, 3, 300, 0.1f);
      s.use_counts = true, s.sink = true, s.lse_mode = LseMode::kBase2, s.all_invalid_row = true;
      add(f, "qe4m3_T7_H3_counts_sink_lse2_all_invalid", s);
    }
    {
      auto s = qbase(4, 64, 500, 0.1f);
      s.invalid_fraction = 0.6, s.num_rows = 50;
      add(f, "qe4m3_T4_H64_invalid_duplicates", s);
    }
    {
      auto s = qbase(300, 16, 77, 0.1f);  // no split
      s.rope_dim = 0, s.lse_mode = LseMode::kOff;
      add(f, "qe4m3_T300_H16_K77_D512_lse_off", s);
    }
    {
      auto s = qbase(65537, 2, 16, 0.1f);
      s.num_rows = 1 << 16;
      add(f, "qe4m3_T65537_H2_K16", s);
    }
    // Scores of the Python GPU test's size (test_fp8_scores_plan_run_matches_cpu_reference): q N(0, 1) as
    // e4m3 codes of std 20 (q_scale 0.05) and rows of std 2 at DeepSeek's softmax scale, so a row's scores
    // have std ~6.5 and its top ones reach ~20-25. The fp8 tensor cores' sum loses a share of the partial
    // sum (about 2^-13 per k32 step); in the exponent that is an absolute error that grows with the top
    // scores: one chain over the 576 dims (fp8_e4m3 before session 10) strayed 2.4-4.5e-2 in LSE on this
    // data against the cases above (rows of std 0.5-1: scores of std 1.6-3.2) at <= 7.5e-3
    // (docs/perf-history.md#s10-q8-e4m3). What matters is the scores' size, not the codes' (the sum's error
    // is relative): fp8_e4m3 rows of std 2 are written with k_scale 2 (codes N(0, 1)); fp8_ds_mla's rows
    // are N(0, 1) with per-tile scales, so twice the softmax scale gives the same scores as rows of std 2.
    for (const auto& [T, H, K] : {std::array<int, 3>{8, 64, 512}, {3, 128, 2048}, {130, 16, 200}, {65537, 2, 16}}) {
      auto s = qbase(T, H, K, 0.05f);
      if (f == KvFormat::kFP8E4M3) s.k_scale = 2.0f;
      else s.softmax_scale *= 2.0f;
      if (T > 60000) s.num_rows = 1 << 16;
      add(f, "qe4m3_T" + std::to_string(T) + "_H" + std::to_string(H) + "_K" + std::to_string(K) + "_big_scores", s);
    }
  }
  for (size_t i = first_e4m3_q, n = v.size(); i < n; ++i) {
    Case c = v[i];
    c.name.replace(c.name.find("qe4m3_"), 6, "qe4m3_fp8s_");
    c.score = smla::ScorePrecision::kFP8;
    v.push_back(c);
  }
  // The default (auto) with an e4m3 q: the fp8 score path (h64.ws.q8) under the fp8-product bar.
  // (Every case above names its score precision; these leave it at the default.)
  for (size_t i = first_e4m3_q, n = v.size(); i < n; ++i) {
    const std::string& nm = v[i].name;
    if (nm.find("_T3_H128_K2048") == std::string::npos && nm.find("_qpair_sink") == std::string::npos &&
        nm.find("_strides_odd") == std::string::npos && nm.find("_D512_lse_off") == std::string::npos &&
        nm.find("_T3_H32_K2048") == std::string::npos)
      continue;
    if (nm.find("qe4m3_fp8s_") != std::string::npos) continue;
    Case c = v[i];
    c.name.replace(c.name.find("qe4m3_"), 6, "qe4m3_auto_");
    c.score = smla::ScorePrecision::kAuto;
    v.push_back(c);
  }
  // ... and with a bf16 q over each quantized cache: the bf16 path (h64.ws) under the 1e-3 bar.
  for (KvFormat f : {KvFormat::kFP8E4M3, KvFormat::kFP8DsMla, KvFormat::kNvFP4DsMla}) {
    Case c{std::string(short_name(f)) + "_auto_T4_H64_K500", base(f, 4, 64, 500), smla::ScorePrecision::kAuto};
    v.push_back(c);
  }
  return v;
}

class SparseMlaQuant : public ::testing::TestWithParam<Case> {};

TEST_P(SparseMlaQuant, MatchesReferenceOnDequantizedRows) {
  REQUIRE_GPU();
  run_checked(GetParam().spec, GetParam().name, GetParam().score);
}

INSTANTIATE_TEST_SUITE_P(Cases, SparseMlaQuant, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<Case>& i) { return i.param.name; });

// nvfp4_ds_mla rows whose 16-value blocks span magnitudes 2^-14 .. 2^2: subnormal e4m3 block scales and
// the smallest one (2^-9), codes of 0.5 times them (the swap-AB kernel's bf16 subnormals:
// docs/perf-history.md#s12-swapab-nvfp4), on the variant the table picks (h64.ws; swapab at H <= 16),
// against the float64 reference on the dequantized rows (DESIGN.md §8).
TEST(SparseMlaQuantNvfp4, BlockScalesOverTheirRange) {
  REQUIRE_GPU();
  for (const auto& [T, H, K] : {std::array<int, 3>{4, 16, 2048}, {64, 8, 300}, {3, 1, 77}}) {
    const ProblemSpec s = base(KvFormat::kNvFP4DsMla, T, H, K);
    const uint64_t seed = fresh_seed();
    auto hp = smla::testing::make_problem(s, seed);
    const auto& p = hp.params;
    const std::string what = "T" + std::to_string(T) + "_H" + std::to_string(H) + "_K" + std::to_string(K);
    SCOPED_TRACE(what + " (seed " + std::to_string(seed) + ")");
    // Re-encode the selected rows (the others keep their NaN poison).
    std::mt19937_64 rng(seed ^ 0x9e3779b97f4a7c15ull);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<char> selected(size_t(p.num_rows), 0);
    for (int64_t t = 0; t < p.num_tokens; ++t)
      for (int j = 0; j < p.topk; ++j) {
        const int32_t r = p.idx[t * p.idx_stride_t + j];
        if (r >= 0 && r < p.num_rows) selected[size_t(r)] = 1;
      }
    int subnormal_scales = 0;
    std::vector<float> lat(512), rope(64);
    for (int64_t r = 0; r < p.num_rows; ++r) {
      if (!selected[size_t(r)]) continue;
      for (int i = 0; i < 512; ++i) lat[size_t(i)] = normal(rng) * std::ldexp(1.0f, int((i / 16 * 5 + r) % 17) - 14);
      for (auto& v : rope) v = normal(rng) * 0.5f;
      uint8_t* row = hp.kv.data() + r * p.kv_row_stride_bytes;
      smla::encode_row(KvFormat::kNvFP4DsMla, s.rope_dim, lat.data(), rope.data(), 1.0f, row);
      for (int b = 0; b < 32; ++b) subnormal_scales += (row[smla::nvfp4_scale_offset(b)] & 0x78u) == 0;
    }
    EXPECT_GT(subnormal_scales, 0) << "the rows must have subnormal block scales";
    const smla::CudaVariant* variant = smla::cuda_variant_for(smla::geometry_of(p), smla::any_sm90_device());
    ASSERT_NE(variant, nullptr);
    std::vector<double> ref_out, ref_lse;
    reference(hp, ref_out, ref_lse);
    smla::cuda::sparse_mla_from_host(hp.params, hp.kv_bytes());
    const auto d = smla::testing::compare(hp, ref_out, ref_lse);
    std::printf("[ nvfp4    ] %s (%s): block scales 2^-9 .. ~2, %d subnormal: out rel L2 %.2e, LSE max abs %.2e\n",
                what.c_str(), variant->name, subnormal_scales, d.rel_l2, d.lse_max_abs);
    EXPECT_EQ(d.nonfinite, 0);
    EXPECT_LE(d.rel_l2, 1e-2);
    EXPECT_LE(d.lse_max_abs, 1e-3);
  }
}

double rel_l2(const smla::testing::HostProblem& a, const smla::testing::HostProblem& b) {
  double num2 = 0, den2 = 0;
  const auto& p = a.params;
  for (int64_t t = 0; t < p.num_tokens; ++t)
    for (int h = 0; h < p.num_heads; ++h)
      for (int d = 0; d < smla::kLatentDim; ++d) {
        const double x = smla::testing::out_value(a, t, h, d), y = smla::testing::out_value(b, t, h, d);
        num2 += (x - y) * (x - y), den2 += y * y;
      }
  return std::sqrt(num2 / den2);
}

// What quantization itself costs: the same random latent / RoPE stored as bf16 and as each
// format (same q and indices), both run on the GPU. Printed, not asserted.
TEST(SparseMlaQuantReport, ErrorAgainstBf16Cache) {
  REQUIRE_GPU();
  for (int H : {128, 16}) {
    ProblemSpec s;
    s.num_tokens = 4, s.num_heads = H, s.topk = 2048, s.num_rows = 16384;
    s.poison_unselected = false;
    const uint64_t seed = fresh_seed();
    auto bf = smla::testing::make_problem(s, seed);
    smla::cuda::sparse_mla_from_host(bf.params, bf.kv_bytes());
    std::vector<double> ref_out, ref_lse;
    reference(bf, ref_out, ref_lse);
    const auto d_bf = smla::testing::compare(bf, ref_out, ref_lse);
    std::printf("[quant report] H=%d T=4 K=2048 D=576 (seed %llu): bf16 cache vs float64 reference: rel L2 %.3e, "
                "LSE max abs %.3e\n",
                H, (unsigned long long)seed, d_bf.rel_l2, d_bf.lse_max_abs);
    // The bf16 rows as floats.
    const int64_t R = s.num_rows;
    std::vector<float> vals(size_t(R) * 576);
    const int rb16 = smla::row_bytes(KvFormat::kBF16, 64);
    for (int64_t r = 0; r < R; ++r)
      smla::decode_row(KvFormat::kBF16, 64, bf.kv.data() + r * rb16, 1.0f, vals.data() + r * 576);
    float amax = 0;
    for (float x : vals) amax = std::max(amax, std::fabs(x));
    for (KvFormat f : {KvFormat::kFP8E4M3, KvFormat::kFP8DsMla, KvFormat::kNvFP4DsMla}) {
      auto q = bf;
      q.spec.format = f;
      q.spec.k_scale = f == KvFormat::kFP8E4M3 ? amax / 448.0f : 1.0f;  // per-tensor scale from the amax
      const int rb = smla::row_bytes(f, 64);
      q.kv.assign(size_t(R * rb), 0);
      for (int64_t r = 0; r < R; ++r)
        smla::encode_row(f, 64, vals.data() + r * 576, vals.data() + r * 576 + 512, q.spec.k_scale, q.kv.data() + r * rb);
      std::fill(q.out.begin(), q.out.end(), 0xff);
      std::fill(q.lse.begin(), q.lse.end(), NAN);
      q.bind();
      smla::cuda::sparse_mla_from_host(q.params, q.kv_bytes());
      std::vector<double> qref_out, qref_lse;
      reference(q, qref_out, qref_lse);
      const auto d_deq = smla::testing::compare(q, qref_out, qref_lse);
      const auto d_true = smla::testing::compare(q, ref_out, ref_lse);
      double lse_vs_bf = 0;
      for (size_t i = 0; i < q.lse.size(); ++i) lse_vs_bf = std::max(lse_vs_bf, double(std::fabs(q.lse[i] - bf.lse[i])));
      std::printf("[quant report] H=%d %-13s vs dequantized reference: rel L2 %.3e, LSE %.3e | vs bf16 cache on GPU: "
                  "rel L2 %.3e, LSE %.3e | vs float64 reference of the bf16 data: rel L2 %.3e, LSE %.3e\n",
                  H, std::string(smla::to_string(f)).c_str(), d_deq.rel_l2, d_deq.lse_max_abs, rel_l2(q, bf), lse_vs_bf,
                  d_true.rel_l2, d_true.lse_max_abs);
      EXPECT_EQ(d_deq.nonfinite, 0);
    }
  }
}

// swapab's P V on the e4m3 tensor cores (docs/perf-history.md#s13-fp8pv): P^T * scale_j as hi + lo e4m3
// under a power of two per tile and latent tile j from the largest scale_j of the tile's rows. Rows whose
// four tile scales are spread over 2^-6 .. 2^2 of the writer's, times factors that are not powers of two
// (fp8_ds_mla readers take any fp32 scale), so rows of small scale share tiles with rows of large scale:
// against the float64 reference on the dequantized rows within DESIGN.md §8's bf16 bar (the LSE's
// S path is the bf16 one).
TEST(SwapAbFp8Pv, RowScalesOverARange) {
  REQUIRE_GPU();
  constexpr smla::RowLayout l = smla::row_layout(KvFormat::kFP8DsMla);
  // (H = 24, 32: N = 32, whose two P^T buffers take tiles 2, 3 after 0, 1 with their scales re-read:
  // docs/perf-history.md#s14-swapab-n32)
  for (const auto& [T, H, K] : {std::array<int, 3>{4, 16, 2048}, {64, 8, 300}, {300, 16, 256}, {3, 1, 77},
                                {3, 32, 2048}, {300, 24, 256}}) {
    ProblemSpec s = base(KvFormat::kFP8DsMla, T, H, K);
    s.softmax_scale *= 0.25f;  // scores of real size although rows grow up to 4x
    s.use_counts = T == 300;
    const uint64_t seed = fresh_seed();
    auto hp = smla::testing::make_problem(s, seed);
    const auto& p = hp.params;
    const std::string what = "T" + std::to_string(T) + "_H" + std::to_string(H) + "_K" + std::to_string(K);
    SCOPED_TRACE(what + " (seed " + std::to_string(seed) + ")");
    std::mt19937_64 rng(seed ^ 0x51ab8e3779b97f4aull);
    std::uniform_real_distribution<float> u(-6.0f, 2.0f);
    int changed = 0;
    for (int64_t r = 0; r < p.num_rows; ++r) {
      uint8_t* row = hp.kv.data() + r * p.kv_row_stride_bytes;
      for (int i = 0; i < l.num_scales; ++i) {
        float sc;
        std::memcpy(&sc, row + l.scale_offset + l.scale_bytes * i, sizeof sc);
        if (!std::isfinite(sc)) continue;  // the unselected rows' NaN poison stays
        sc *= std::exp2(u(rng)) * 1.37f;
        std::memcpy(row + l.scale_offset + l.scale_bytes * i, &sc, sizeof sc);
        ++changed;
      }
    }
    ASSERT_GT(changed, 0);
    const smla::CudaVariant* variant = smla::cuda_variant_for(smla::geometry_of(p), smla::any_sm90_device());
    ASSERT_NE(variant, nullptr);
    ASSERT_STREQ(variant->name, "swapab");
    std::vector<double> ref_out, ref_lse;
    reference(hp, ref_out, ref_lse);
    smla::cuda::sparse_mla_from_host(hp.params, hp.kv_bytes(), /*batch_invariant=*/true);  // swapab at every T
    const auto d = smla::testing::compare(hp, ref_out, ref_lse);
    std::printf("[ fp8pv    ] %s: row scales x 2^-6 .. 2^2 x 1.37: out rel L2 %.2e, LSE max abs %.2e\n", what.c_str(),
                d.rel_l2, d.lse_max_abs);
    EXPECT_EQ(d.nonfinite, 0);
    EXPECT_LE(d.rel_l2, 1e-2);
    EXPECT_LE(d.lse_max_abs, 1e-3);
  }
}

// swapab's outputs across two binaries (an instruction diet, a scheduling change: anything that must
// not move a bit; docs/perf-history.md#s12-swapab-diet). Fixed seeds, so two builds see the same
// inputs; out and LSE are digested (FNV-1a 64 of their bytes) per case and hold. With
// SMLA_SWAPAB_DIGESTS=FILE: FILE missing -> the digests are written to it and the test is skipped
// (recorded, nothing compared); FILE present -> every case must match it. Run the old binary first,
// then the new one with the same FILE and the same switches. Each case is also held to the float64
// reference (DESIGN.md §8). SMLA_SWAPAB_DIGESTS_LSE_ONLY=1 compares the LSE digests alone (a change that
// moves out's bits but must keep S's: docs/perf-history.md#s13-fp8pv).
uint64_t fnv1a(const void* data, size_t n, uint64_t h = 1469598103934665603ull) {
  const auto* b = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}

TEST(SwapAbDigest, SameBitsAcrossBinaries) {
  REQUIRE_GPU();
  const char* path = std::getenv("SMLA_SWAPAB_DIGESTS");
  if (path == nullptr || *path == '\0')
    GTEST_SKIP() << "set SMLA_SWAPAB_DIGESTS=FILE (the first binary records, the second compares)";
  const char* lo = std::getenv("SMLA_SWAPAB_DIGESTS_LSE_ONLY");
  const bool lse_only = lo != nullptr && std::string(lo) == "1";
  const std::vector<KvFormat> formats = {KvFormat::kFP8DsMla, KvFormat::kFP8E4M3, KvFormat::kNvFP4DsMla};
  std::vector<std::pair<std::string, ProblemSpec>> specs;
  for (KvFormat f : formats) {
    const std::string fn = short_name(f);
    auto s = base(f, 300, 16, 256);  // no split, the ring wraps, counts, sink in the kernel
    s.use_counts = true, s.sink = true;
    specs.push_back({fn + "_T300_H16_K256_counts_sink", s});
    s = base(f, 3, 16, 2048);  // split, sink in the merge, LSE base 2
    s.sink = true, s.lse_mode = LseMode::kBase2;
    specs.push_back({fn + "_T3_H16_K2048_split_sink_lse2", s});
    s = base(f, 5, 16, 500);
    s.invalid_fraction = 0.6, s.num_rows = 50, s.all_invalid_row = true;
    specs.push_back({fn + "_T5_H16_invalid_duplicates", s});
    s = base(f, 1, 8, 2048);
    s.rope_dim = 0;
    specs.push_back({fn + "_T1_H8_K2048_D512", s});
    s = base(f, 200, 3, 1024);
    s.q_pair = true, s.lse_mode = LseMode::kOff;
    specs.push_back({fn + "_T200_H3_K1024_qpair_lse_off", s});
    s = base(f, 64, 16, 1000);  // the tail tile partly masked, odd tile count per consumer
    s.sink = true;
    specs.push_back({fn + "_T64_H16_K1000_sink", s});
    if (f == KvFormat::kFP8DsMla) {  // an e4m3 q (auto: widened on swapab)
      s = base(f, 4, 16, 300);
      s.q_dtype = DType::kE4M3, s.q_scale = 0.1f;
      specs.push_back({fn + "_qe4m3_T4_H16_K300", s});
    }
  }
  std::map<std::string, std::string> got;
  uint64_t seed = 0x5eed0000ull;
  for (const auto& [name, spec] : specs) {
    ++seed;
    {
      auto hp = smla::testing::make_problem(spec, seed);
      // (the "_whole" suffix: the stage hold of session 12's digests, so that a file recorded by a binary of
      // that time still compares; its "_early" lines are not looked up)
      const std::string key = name + "_whole";
      SCOPED_TRACE(key + " (seed " + std::to_string(seed) + ")");
      const smla::CudaVariant* v = smla::cuda_variant_for(smla::geometry_of(hp.params), smla::any_sm90_device());
      ASSERT_NE(v, nullptr);
      ASSERT_STREQ(v->name, "swapab");
      smla::cuda::sparse_mla_from_host(hp.params, hp.kv_bytes());
      std::vector<double> ref_out, ref_lse;
      reference(hp, ref_out, ref_lse);
      const auto diff = smla::testing::compare(hp, ref_out, ref_lse);
      EXPECT_EQ(diff.nonfinite, 0);
      EXPECT_LE(diff.rel_l2, 1e-2);
      EXPECT_LE(diff.lse_max_abs, 1e-3);
      char buf[48];
      std::snprintf(buf, sizeof buf, "%016llx %016llx", (unsigned long long)fnv1a(hp.out.data(), hp.out.size()),
                    (unsigned long long)fnv1a(hp.lse.data(), hp.lse.size() * sizeof(float)));
      got[key] = buf;
    }
  }
  std::ifstream in(path);
  if (!in) {
    std::ofstream o(path);
    ASSERT_TRUE(o.good()) << "cannot write SMLA_SWAPAB_DIGESTS=" << path;
    for (const auto& [key, d] : got) o << key << ' ' << d << '\n';
    GTEST_SKIP() << "recorded " << got.size() << " digests to " << path
                 << " (nothing compared: run the other binary with the same file)";
  }
  std::map<std::string, std::string> want;
  for (std::string line; std::getline(in, line);) {
    std::istringstream ls(line);
    std::string key, a, b;
    if (ls >> key >> a >> b) want[key] = a + ' ' + b;
  }
  for (const auto& [key, d] : got) {
    const auto it = want.find(key);
    if (it == want.end()) {
      ADD_FAILURE() << key << ": not in " << path << " (run both binaries with the same switches)";
      continue;
    }
    if (lse_only) EXPECT_EQ(d.substr(17), it->second.substr(17)) << key << ": LSE digests differ from " << path;
    else EXPECT_EQ(d, it->second) << key << ": out / LSE digests differ from " << path;
  }
  std::printf("[ note     ] %zu swapab cases compared with %s%s\n", got.size(), path, lse_only ? " (LSE only)" : "");
}

}  // namespace
