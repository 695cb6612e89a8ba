// The CPU reference (src/reference/sparse_mla.h) against DESIGN.md §1: hand-computed small cases for every
// edge rule, and random problems against a straight formula written here (long double, on rows
// decoded with the codecs that test_formats.cpp holds to the byte layouts).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "devtools/testing.h"
#include "reference/sparse_mla.h"
#include "smla/formats.h"
#include "smla/numeric.h"

using smla::DType;
using smla::KvFormat;
using smla::LseMode;
using smla::SparseMlaParams;

namespace {

// ---- straight formula -----------------------------------------------------------------------
float load(const void* base, DType t, int64_t i) {
  switch (t) {
    case DType::kBF16: return smla::num::bf16_to_f32(static_cast<const uint16_t*>(base)[i]);
    case DType::kFP16: return smla::num::fp16_to_f32(static_cast<const uint16_t*>(base)[i]);
    case DType::kE4M3: return smla::num::e4m3_to_f32(static_cast<const uint8_t*>(base)[i]);
    default: return NAN;
  }
}

// out[512] and natural-log LSE of (t, h): w_j = exp(s_j) / (sum_k exp(s_k) + exp(sink)).
void direct(const SparseMlaParams& p, int64_t t, int h, std::vector<double>& out, double& lse) {
  const int D = 512 + p.rope_dim;
  std::vector<long double> q(static_cast<size_t>(D));
  for (int d = 0; d < D; ++d) {
    float v;
    if (p.q_rope && d >= 512) v = load(p.q_rope, p.q_dtype, t * p.q_rope_stride_t + h * p.q_rope_stride_h + d - 512);
    else v = load(p.q, p.q_dtype, t * p.q_stride_t + h * p.q_stride_h + d);
    q[size_t(d)] = (long double)v * p.q_scale;
  }
  int n = p.topk;
  if (p.counts) n = std::min(std::max(p.counts[t], 0), p.topk);
  std::vector<std::vector<float>> rows;
  std::vector<long double> s;
  const int rb = smla::row_bytes(p.format, p.rope_dim);
  for (int j = 0; j < n; ++j) {
    const int64_t r = p.idx[t * p.idx_stride_t + j];
    if (r < 0 || r >= p.num_rows) continue;
    std::vector<uint8_t> bytes(static_cast<size_t>(rb));
    std::memcpy(bytes.data(), static_cast<const uint8_t*>(p.kv) + r * p.kv_row_stride_bytes, size_t(rb));
    std::vector<float> k(static_cast<size_t>(D));
    smla::decode_row(p.format, p.rope_dim, bytes.data(), p.k_scale, k.data());
    long double dot = 0;
    for (int d = 0; d < D; ++d) dot += q[size_t(d)] * k[size_t(d)];
    s.push_back(dot * p.softmax_scale);
    rows.push_back(std::move(k));
  }
  out.assign(512, 0.0);
  if (s.empty()) {
    lse = -INFINITY;
    return;
  }
  long double z = 0;
  for (long double v : s) z += std::exp(v);
  const long double denom = z + (p.sink ? std::exp((long double)p.sink[h]) : 0.0L);
  for (size_t j = 0; j < s.size(); ++j) {
    const long double w = std::exp(s[j]) / denom;
    for (int d = 0; d < 512; ++d) out[size_t(d)] = double(out[size_t(d)] + w * rows[j][size_t(d)]);
  }
  lse = double(std::log(z));
}

// Every (t, h) of a problem against the formula: output within tol * max(1, |ref|); LSE within 1e-5.
void expect_matches_direct(const smla::testing::HostProblem& hp, double out_tol, const std::string& what) {
  const auto& p = hp.params;
  std::vector<double> ref;
  double lse;
  for (int64_t t = 0; t < p.num_tokens; ++t)
    for (int h = 0; h < p.num_heads; ++h) {
      direct(p, t, h, ref, lse);
      for (int d = 0; d < 512; ++d) {
        const double got = smla::testing::out_value(hp, t, h, d);
        ASSERT_TRUE(std::isfinite(got)) << what << " t=" << t << " h=" << h << " d=" << d;
        ASSERT_LE(std::fabs(got - ref[size_t(d)]), out_tol * std::fmax(1.0, std::fabs(ref[size_t(d)])))
            << what << " t=" << t << " h=" << h << " d=" << d;
      }
      if (p.lse && p.lse_mode != LseMode::kOff) {
        const double want = p.lse_mode == LseMode::kBase2 ? lse * M_LOG2E : lse;
        const double got = hp.lse[size_t(t * p.lse_stride_t + h)];
        if (std::isinf(want)) {
          ASSERT_TRUE(std::isinf(got) && got < 0) << what << " t=" << t << " h=" << h << " got " << got;
        } else {
          ASSERT_NEAR(got, want, 1e-5 * std::fmax(1.0, std::fabs(want))) << what << " t=" << t << " h=" << h;
        }
      }
    }
}

// ---- a hand-made problem: bf16 cache, H heads, one row of q per call --------------------------
// Row r of the pool has every latent value equal to row_value[r] and zero RoPE; q[h] is
// q0[h] * e_0, so s_j = softmax_scale * q0[h] * row_value[idx_j].
struct Hand {
  int H = 1;
  std::vector<float> row_value = {1.0f, 2.0f, -1.0f};
  std::vector<float> q0 = {1.0f};
  float softmax_scale = float(M_LN2);
  std::vector<uint8_t> kv;
  std::vector<uint16_t> q;
  std::vector<float> out, lse, sink;
  std::vector<int32_t> idx, counts;

  SparseMlaParams params(const std::vector<int32_t>& entries) {
    const int rb = smla::row_bytes(KvFormat::kBF16, 64);
    kv.assign(row_value.size() * rb, 0);
    std::vector<float> latent(512), rope(64, 0.0f);
    for (size_t r = 0; r < row_value.size(); ++r) {
      std::fill(latent.begin(), latent.end(), row_value[r]);
      smla::encode_row(KvFormat::kBF16, 64, latent.data(), rope.data(), 1.0f, kv.data() + r * rb);
    }
    q.assign(size_t(H) * 576, 0);
    for (int h = 0; h < H; ++h) q[size_t(h) * 576] = smla::num::f32_to_bf16(q0[size_t(h)]);
    idx = entries;
    out.assign(size_t(H) * 512, NAN);
    lse.assign(size_t(H), NAN);
    SparseMlaParams p;
    p.num_tokens = 1;
    p.num_heads = H;
    p.topk = int(entries.size());
    p.q = q.data();
    p.kv = kv.data();
    p.num_rows = int64_t(row_value.size());
    p.idx = idx.data();
    p.softmax_scale = softmax_scale;
    p.out = out.data();
    p.out_dtype = DType::kFP32;
    p.lse = lse.data();
    smla::set_dense_strides(p);
    return p;
  }
};

void expect_all(const std::vector<float>& out, int h, double v, double tol = 1e-6) {
  for (int d = 0; d < 512; ++d) ASSERT_NEAR(out[size_t(h) * 512 + d], v, tol) << "h=" << h << " d=" << d;
}

smla::testing::ProblemSpec f32_spec() {
  smla::testing::ProblemSpec s;
  s.num_tokens = 5;
  s.num_heads = 3;
  s.topk = 37;
  s.num_rows = 200;
  s.invalid_fraction = 0.3;
  s.use_counts = true;
  s.out_dtype = DType::kFP32;
  return s;
}

}  // namespace

// ---- hand-computed cases ------------------------------------------------------------------------
// exp(s) of rows 0 and 1 are 2 and 4 (scale ln 2, q.k = 1 and 2).
TEST(Reference, HandTwoRows) {
  Hand hand;
  auto p = hand.params({0, 1});
  smla::reference::sparse_mla(p, 1);
  expect_all(hand.out, 0, (2 * 1.0 + 4 * 2.0) / 6);  // 5/3
  EXPECT_NEAR(hand.lse[0], std::log(6.0), 1e-6);
}

TEST(Reference, HandInvalidEntriesAreSkipped) {
  // Row 3 exists in memory, holds NaN and lies past num_rows: entry 3 is out of range and must
  // never be read; -1, other negatives and far rows are skipped too.
  Hand hand;
  hand.row_value = {1.0f, 2.0f, -1.0f, NAN};
  auto p = hand.params({-1, 0, 3, 1, -7, 1000000, INT32_MIN});
  p.num_rows = 3;
  smla::reference::sparse_mla(p, 1);
  expect_all(hand.out, 0, 5.0 / 3);
  EXPECT_NEAR(hand.lse[0], std::log(6.0), 1e-6);
}

TEST(Reference, HandDuplicatesCountTwice) {
  Hand hand;
  auto p = hand.params({0, 0, 1});
  smla::reference::sparse_mla(p, 1);
  expect_all(hand.out, 0, (2 + 2 + 4 * 2.0) / 8);  // 1.5
  EXPECT_NEAR(hand.lse[0], std::log(8.0), 1e-6);
}

TEST(Reference, HandSinkInDenominatorOnly) {
  Hand hand;
  hand.H = 2;
  hand.q0 = {1.0f, -1.0f};  // head 1: exp(s) = 1/2 and 1/4
  auto p = hand.params({0, 1});
  hand.sink = {float(std::log(3.0)), float(std::log(0.25))};
  p.sink = hand.sink.data();
  smla::reference::sparse_mla(p, 1);
  expect_all(hand.out, 0, (2 * 1.0 + 4 * 2.0) / (6 + 3));      // 10/9
  expect_all(hand.out, 1, (0.5 * 1.0 + 0.25 * 2.0) / (0.75 + 0.25));  // 1
  EXPECT_NEAR(hand.lse[0], std::log(6.0), 1e-6);   // sink excluded
  EXPECT_NEAR(hand.lse[1], std::log(0.75), 1e-6);
}

TEST(Reference, HandCounts) {
  Hand hand;
  auto p = hand.params({0, 1, 1, 1});
  std::vector<int32_t> counts = {2};
  p.counts = counts.data();
  smla::reference::sparse_mla(p, 1);
  expect_all(hand.out, 0, 5.0 / 3);
  EXPECT_NEAR(hand.lse[0], std::log(6.0), 1e-6);

  counts[0] = 100;  // > K: clamps to K = 4
  smla::reference::sparse_mla(p, 1);
  expect_all(hand.out, 0, (2 * 1.0 + 3 * 4 * 2.0) / 14);
  EXPECT_NEAR(hand.lse[0], std::log(14.0), 1e-6);

  for (int32_t c : {0, -3, INT32_MIN}) {
    counts[0] = c;
    std::fill(hand.out.begin(), hand.out.end(), NAN);
    smla::reference::sparse_mla(p, 1);
    for (float v : hand.out) ASSERT_EQ(v, 0.0f) << "count " << c;
    EXPECT_TRUE(std::isinf(hand.lse[0]) && hand.lse[0] < 0) << "count " << c;
  }
}

TEST(Reference, HandCountsStopReading) {
  // Entries past the count point at a row full of NaN: they must not be read.
  Hand hand;
  hand.row_value = {1.0f, 2.0f, NAN};
  auto p = hand.params({0, 1, 2, 2});
  std::vector<int32_t> counts = {2};
  p.counts = counts.data();
  smla::reference::sparse_mla(p, 1);
  expect_all(hand.out, 0, 5.0 / 3);
}

TEST(Reference, HandLseBase2AndOff) {
  Hand hand;
  auto p = hand.params({0, 1});
  p.lse_mode = LseMode::kBase2;
  smla::reference::sparse_mla(p, 1);
  EXPECT_NEAR(hand.lse[0], std::log2(6.0), 1e-6);
  expect_all(hand.out, 0, 5.0 / 3);

  // lse pointer given but mode off: untouched
  hand.lse[0] = 123.0f;
  p.lse_mode = LseMode::kOff;
  smla::reference::sparse_mla(p, 1);
  EXPECT_EQ(hand.lse[0], 123.0f);
  expect_all(hand.out, 0, 5.0 / 3);

  // lse null: out still right
  p.lse = nullptr;
  p.lse_mode = LseMode::kBaseE;
  std::fill(hand.out.begin(), hand.out.end(), NAN);
  smla::reference::sparse_mla(p, 1);
  expect_all(hand.out, 0, 5.0 / 3);
}

TEST(Reference, HandEmptyRows) {
  for (bool with_sink : {false, true})
    for (LseMode mode : {LseMode::kBaseE, LseMode::kBase2}) {
      Hand hand;
      auto p = hand.params({-1, -1, 5, -2});
      hand.sink = {0.5f};
      if (with_sink) p.sink = hand.sink.data();
      p.lse_mode = mode;
      smla::reference::sparse_mla(p, 1);
      for (float v : hand.out) ASSERT_EQ(v, 0.0f);
      for (float v : hand.out) ASSERT_FALSE(std::signbit(v));
      EXPECT_TRUE(std::isinf(hand.lse[0]) && hand.lse[0] < 0);
    }
  // an empty pool: num_rows = 0 and kv null, every entry is out of range
  Hand hand;
  auto p = hand.params({0, 1, 2});
  p.num_rows = 0;
  p.kv = nullptr;
  smla::reference::sparse_mla(p, 1);
  for (float v : hand.out) ASSERT_EQ(v, 0.0f);
  EXPECT_TRUE(std::isinf(hand.lse[0]) && hand.lse[0] < 0);
}

TEST(Reference, QScaleFoldsIntoSoftmaxScale) {
  // softmax_scale * q_scale: doubling q_scale equals doubling softmax_scale (exact in fp32).
  Hand hand;
  auto p = hand.params({0, 1});
  p.softmax_scale = float(M_LN2) / 2;
  p.q_scale = 2.0f;
  smla::reference::sparse_mla(p, 1);
  expect_all(hand.out, 0, 5.0 / 3);
  EXPECT_NEAR(hand.lse[0], std::log(6.0), 1e-6);
}

// ---- random problems against the straight formula -----------------------------------------------
TEST(Reference, RandomProblemsAllFormatsMatchDirectFormula) {
  const KvFormat formats[] = {KvFormat::kBF16, KvFormat::kFP16, KvFormat::kFP8E4M3, KvFormat::kFP8DsMla,
                              KvFormat::kNvFP4DsMla};
  uint64_t seed = 100;
  for (KvFormat f : formats)
    for (int rope_dim : {64, 0})
      for (bool sink : {false, true}) {
        auto s = f32_spec();
        s.format = f;
        s.rope_dim = rope_dim;
        s.sink = sink;
        s.q_dtype = f == KvFormat::kFP16 ? DType::kFP16 : DType::kBF16;
        s.k_scale = f == KvFormat::kFP8E4M3 ? 0.25f : 1.0f;
        s.all_invalid_row = true;
        auto hp = smla::testing::make_problem(s, seed++);
        smla::reference::sparse_mla(hp.params, 2);
        expect_matches_direct(hp, 1e-6, std::string(smla::to_string(f)) + " rope " + std::to_string(rope_dim));
        // row 0 is all invalid: exactly 0 and -inf
        for (int h = 0; h < s.num_heads; ++h) {
          for (int d = 0; d < 512; ++d) ASSERT_EQ(smla::testing::out_value(hp, 0, h, d), 0.0f);
          ASSERT_TRUE(std::isinf(hp.lse[size_t(h)]) && hp.lse[size_t(h)] < 0);
        }
      }
}

TEST(Reference, PoisonedUnselectedRowsAreNeverRead) {
  // No counts: every entry is read; half are invalid in all three ways (-1, other negatives,
  // >= num_rows); every row that no entry selects is NaN.
  auto s = f32_spec();
  s.use_counts = false;
  s.invalid_fraction = 0.5;
  s.num_rows = 5000;  // most rows unselected (NaN)
  auto hp = smla::testing::make_problem(s, 7);
  int invalid_kinds[3] = {0, 0, 0};
  for (int32_t r : hp.idx) {
    if (r == -1) ++invalid_kinds[0];
    else if (r < 0) ++invalid_kinds[1];
    else if (r >= s.num_rows) ++invalid_kinds[2];
  }
  ASSERT_GT(invalid_kinds[0], 0);
  ASSERT_GT(invalid_kinds[1], 0);
  ASSERT_GT(invalid_kinds[2], 0);
  smla::reference::sparse_mla(hp.params, 1);
  expect_matches_direct(hp, 1e-6, "poisoned");
}

TEST(Reference, LseBase2IsBaseETimesLog2e) {
  auto s = f32_spec();
  auto a = smla::testing::make_problem(s, 21);
  s.lse_mode = LseMode::kBase2;
  auto b = smla::testing::make_problem(s, 21);
  smla::reference::sparse_mla(a.params, 1);
  smla::reference::sparse_mla(b.params, 1);
  ASSERT_EQ(a.out, b.out);
  for (size_t i = 0; i < a.lse.size(); ++i) {
    if (std::isinf(a.lse[i])) {
      EXPECT_EQ(a.lse[i], b.lse[i]);
    } else {
      EXPECT_NEAR(b.lse[i], a.lse[i] * M_LOG2E, 1e-5 * std::fmax(1.0, std::fabs(b.lse[i])));
    }
  }
  expect_matches_direct(b, 1e-6, "base 2");
}

TEST(Reference, LseOffLeavesLseNullAndOutRight) {
  auto s = f32_spec();
  s.lse_mode = LseMode::kOff;
  auto hp = smla::testing::make_problem(s, 22);
  ASSERT_EQ(hp.params.lse, nullptr);
  smla::reference::sparse_mla(hp.params, 1);
  for (float v : hp.lse) EXPECT_TRUE(std::isnan(v));  // the buffer is not touched
  expect_matches_direct(hp, 1e-6, "lse off");
}

TEST(Reference, FreeRowStridesEqualDenseLayout) {
  auto s = f32_spec();
  auto dense = smla::testing::make_problem(s, 31);
  s.q_head_pad = 7;
  s.out_head_pad = 5;
  auto padded = smla::testing::make_problem(s, 31);
  // The same values in both layouts (checked here, not assumed).
  for (int64_t t = 0; t < s.num_tokens; ++t)
    for (int h = 0; h < s.num_heads; ++h)
      for (int d = 0; d < 576; ++d)
        ASSERT_EQ(load(dense.params.q, DType::kBF16, t * dense.params.q_stride_t + h * dense.params.q_stride_h + d),
                  load(padded.params.q, DType::kBF16, t * padded.params.q_stride_t + h * padded.params.q_stride_h + d));
  ASSERT_EQ(dense.kv, padded.kv);
  ASSERT_EQ(dense.idx, padded.idx);
  ASSERT_EQ(padded.params.out_stride_h, 512 + 5);
  smla::reference::sparse_mla(dense.params, 1);
  smla::reference::sparse_mla(padded.params, 1);
  const auto* po = reinterpret_cast<const float*>(padded.out.data());
  for (int64_t t = 0; t < s.num_tokens; ++t)
    for (int h = 0; h < s.num_heads; ++h) {
      for (int d = 0; d < 512; ++d)
        ASSERT_EQ(smla::testing::out_value(dense, t, h, d), smla::testing::out_value(padded, t, h, d));
      for (int d = 512; d < 517; ++d)  // the gap between heads is not written
        ASSERT_TRUE(std::isnan(po[t * padded.params.out_stride_t + h * padded.params.out_stride_h + d]));
    }
  ASSERT_EQ(dense.lse, padded.lse);
  expect_matches_direct(padded, 1e-6, "padded");
}

TEST(Reference, QPairEqualsOneTensor) {
  auto s = f32_spec();
  s.q_pair = true;
  s.q_head_pad = 3;
  auto pair = smla::testing::make_problem(s, 41);
  const auto& pp = pair.params;
  ASSERT_NE(pp.q_rope, nullptr);
  // Concatenate (latent, rope) into one dense [T, H, 576] bf16 tensor.
  std::vector<uint16_t> q(size_t(s.num_tokens * s.num_heads * 576));
  const auto* ql = static_cast<const uint16_t*>(pp.q);
  const auto* qr = static_cast<const uint16_t*>(pp.q_rope);
  for (int64_t t = 0; t < s.num_tokens; ++t)
    for (int h = 0; h < s.num_heads; ++h) {
      for (int d = 0; d < 512; ++d) q[size_t((t * s.num_heads + h) * 576 + d)] = ql[t * pp.q_stride_t + h * pp.q_stride_h + d];
      for (int d = 0; d < 64; ++d)
        q[size_t((t * s.num_heads + h) * 576 + 512 + d)] = qr[t * pp.q_rope_stride_t + h * pp.q_rope_stride_h + d];
    }
  auto one = pair;
  one.bind();
  one.params.q = q.data();
  one.params.q_rope = nullptr;
  one.params.q_stride_h = 576;
  one.params.q_stride_t = 576 * s.num_heads;
  smla::reference::sparse_mla(pair.params, 1);
  smla::reference::sparse_mla(one.params, 1);
  ASSERT_EQ(pair.out, one.out);
  ASSERT_EQ(pair.lse, one.lse);
  expect_matches_direct(pair, 1e-6, "pair");
}

TEST(Reference, EmptyProblemTouchesNothing) {
  auto s = f32_spec();
  auto hp = smla::testing::make_problem(s, 51);
  const auto out0 = hp.out;
  hp.params.num_tokens = 0;
  smla::reference::sparse_mla(hp.params, 4);
  EXPECT_EQ(hp.out, out0);
  for (float v : hp.lse) EXPECT_TRUE(std::isnan(v));
  // and with every pointer null
  SparseMlaParams p;
  p.num_tokens = 0;
  p.num_heads = 8;
  p.topk = 16;
  p.softmax_scale = 0.1f;
  EXPECT_NO_THROW(smla::reference::sparse_mla(p, 1));
}

TEST(Reference, OutDtypes) {
  // bf16 / fp16 outputs are the rounded formula: within half an ulp (plus the fp32 step).
  for (DType od : {DType::kBF16, DType::kFP16}) {
    auto s = f32_spec();
    s.out_dtype = od;
    if (od == DType::kFP16) {
      s.q_dtype = DType::kFP16;
      s.format = KvFormat::kFP16;
    }
    auto hp = smla::testing::make_problem(s, 61);
    smla::reference::sparse_mla(hp.params, 1);
    const double rel = od == DType::kBF16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11);
    std::vector<double> ref;
    double lse;
    for (int64_t t = 0; t < s.num_tokens; ++t)
      for (int h = 0; h < s.num_heads; ++h) {
        direct(hp.params, t, h, ref, lse);
        for (int d = 0; d < 512; ++d) {
          const double got = smla::testing::out_value(hp, t, h, d);
          ASSERT_LE(std::fabs(got - ref[size_t(d)]), rel * std::fabs(ref[size_t(d)]) * (1 + 1e-6) + 1e-7)
              << smla::to_string(od) << " t=" << t << " h=" << h << " d=" << d;
        }
      }
  }
}

TEST(Reference, E4M3QueryWithQScale) {
  for (KvFormat f : {KvFormat::kFP8E4M3, KvFormat::kFP8DsMla}) {
    SCOPED_TRACE(smla::to_string(f));
    auto s = f32_spec();
    s.format = f;
    s.q_dtype = DType::kE4M3;
    s.q_scale = 0.5f;
    if (f == KvFormat::kFP8E4M3) s.k_scale = 0.25f;
    s.sink = true;
    auto hp = smla::testing::make_problem(s, 71);
    smla::reference::sparse_mla(hp.params, 1);
    expect_matches_direct(hp, 1e-6, "e4m3 q");
    // the same problem with q_scale folded into softmax_scale
    auto folded = hp;
    folded.bind();
    folded.params.q_scale = 1.0f;
    folded.params.softmax_scale = s.softmax_scale * 0.5f;  // exact: power of two
    std::fill(folded.out.begin(), folded.out.end(), 0xff);
    smla::reference::sparse_mla(folded.params, 1);
    EXPECT_EQ(folded.out, hp.out);
  }
}

TEST(Reference, ThreadsAreBitIdentical) {
  auto s = f32_spec();
  s.num_tokens = 37;
  s.sink = true;
  auto a = smla::testing::make_problem(s, 81);
  auto b = smla::testing::make_problem(s, 81);
  auto c = smla::testing::make_problem(s, 81);
  smla::reference::sparse_mla(a.params, 1);
  smla::reference::sparse_mla(b.params, 4);
  smla::reference::sparse_mla(c.params, 0);
  EXPECT_EQ(0, std::memcmp(a.out.data(), b.out.data(), a.out.size()));
  EXPECT_EQ(0, std::memcmp(a.lse.data(), b.lse.data(), a.lse.size() * 4));
  EXPECT_EQ(0, std::memcmp(a.out.data(), c.out.data(), a.out.size()));
  EXPECT_EQ(0, std::memcmp(a.lse.data(), c.lse.data(), a.lse.size() * 4));
}

TEST(Reference, RowHeadMatchesFullRun) {
  auto s = f32_spec();
  auto hp = smla::testing::make_problem(s, 91);
  smla::reference::sparse_mla(hp.params, 1);
  std::vector<double> o(512);
  for (int64_t t = 0; t < s.num_tokens; ++t)
    for (int h = 0; h < s.num_heads; ++h) {
      double l;
      const int m = smla::reference::sparse_mla_row_head(hp.params, t, h, o.data(), &l);
      int valid = 0;
      for (int j = 0; j < std::min(std::max(hp.counts[size_t(t)], 0), s.topk); ++j) {
        const int32_t r = hp.idx[size_t(t * s.topk + j)];
        valid += (r >= 0 && r < s.num_rows);
      }
      EXPECT_EQ(m, valid);
      for (int d = 0; d < 512; ++d) ASSERT_EQ(float(o[size_t(d)]), smla::testing::out_value(hp, t, h, d));
      EXPECT_EQ(float(l), hp.lse[size_t(t * s.num_heads + h)]);
    }
}

// ---- validation ---------------------------------------------------------------------------------
namespace {
void expect_error(const SparseMlaParams& p, const std::string& needle, const char* what) {
  try {
    smla::reference::sparse_mla(p, 1);
    ADD_FAILURE() << what << ": no error (expected one mentioning '" << needle << "')";
  } catch (const smla::Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << what << ": message was: " << e.what();
  } catch (...) {
    ADD_FAILURE() << what << ": threw something other than smla::Error";
  }
}
}  // namespace

TEST(Reference, ValidateNamesTheArgument) {
  auto s = f32_spec();
  auto hp = smla::testing::make_problem(s, 101);
  const SparseMlaParams good = hp.params;
  ASSERT_NO_THROW(smla::reference::sparse_mla(good, 1));
  auto bad = [&](auto mutate, const std::string& needle, const char* what) {
    SparseMlaParams p = good;
    mutate(p);
    expect_error(p, needle, what);
  };
  bad([](SparseMlaParams& p) { p.num_tokens = -1; }, "num_tokens", "negative T");
  bad([](SparseMlaParams& p) { p.num_heads = 0; }, "num_heads", "H = 0");
  bad([](SparseMlaParams& p) { p.rope_dim = 32; }, "rope_dim", "rope_dim 32");
  bad([](SparseMlaParams& p) { p.topk = 0; }, "idx", "K = 0");
  bad([](SparseMlaParams& p) { p.q = nullptr; }, "q is null", "null q");
  bad([](SparseMlaParams& p) { p.idx = nullptr; }, "idx is null", "null idx");
  bad([](SparseMlaParams& p) { p.out = nullptr; }, "out is null", "null out");
  bad([](SparseMlaParams& p) { p.kv = nullptr; }, "kv", "null kv");
  bad([](SparseMlaParams& p) { p.q_stride_h = 100; }, "q must be [T, H, 576]", "q head stride");
  bad([](SparseMlaParams& p) { p.idx_stride_t = p.topk - 1; }, "idx row stride", "idx stride");
  bad([](SparseMlaParams& p) { p.out_stride_h = 511; }, "out must be [T, H, 512]", "out head stride");
  bad([](SparseMlaParams& p) { p.out_stride_t = p.out_stride_h; }, "out must be [T, H, 512]", "out row stride");
  bad([](SparseMlaParams& p) { p.lse_stride_t = p.num_heads - 1; }, "lse", "lse stride");
  bad([](SparseMlaParams& p) { p.kv_row_stride_bytes = 1151; }, "kv row stride", "kv stride");
  bad([](SparseMlaParams& p) { p.q_dtype = DType::kFP32; }, "q must be bf16, fp16 or e4m3", "f32 q");
  bad([](SparseMlaParams& p) { p.q_dtype = DType::kE4M3; }, "e4m3 q", "e4m3 q with a bf16 cache");
  bad([](SparseMlaParams& p) { p.q_dtype = DType::kFP16; }, "fp16 q", "fp16 q with a bf16 cache");
  bad([](SparseMlaParams& p) { p.format = KvFormat::kFP16; }, "bf16 q", "bf16 q with an fp16 cache");
  bad([](SparseMlaParams& p) { p.out_dtype = DType::kFP16; }, "out must be", "fp16 out for a bf16 q");
  bad([](SparseMlaParams& p) { p.out_dtype = DType::kI32; }, "out must be", "i32 out");
  bad([](SparseMlaParams& p) { p.softmax_scale = NAN; }, "softmax_scale", "NaN softmax_scale");
  bad([](SparseMlaParams& p) { p.q_scale = 0.0f; }, "q_scale", "q_scale 0");
  bad([](SparseMlaParams& p) { p.k_scale = -1.0f; }, "k_scale", "negative k_scale");
  bad([](SparseMlaParams& p) { p.num_rows = -5; }, "num_rows", "negative num_rows");
  bad([](SparseMlaParams& p) { p.num_rows = (int64_t(1) << 31) + 1; }, "num_rows", "too many rows");
  bad(
      [&](SparseMlaParams& p) {
        p.rope_dim = 0;
        p.q_rope = hp.q.data();
        p.q_stride_h = 512;
      },
      "q_rope", "q_rope without rope");
  bad(
      [&](SparseMlaParams& p) {
        p.q_rope = hp.q.data();
        p.q_stride_h = 576;
        p.q_rope_stride_h = 10;
      },
      "q_rope must be [T, H, 64]", "q_rope stride");
}
