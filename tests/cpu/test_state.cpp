// The attention-state merge (smla/state.h, DESIGN.md §5): worked examples, the NaN / +inf / all
// -inf rules, and merging partial reference results of split top-k rows.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "devtools/testing.h"
#include "reference/sparse_mla.h"
#include "smla/state.h"

namespace {
bool is_neg_inf(float x) { return std::isinf(x) && x < 0; }
}  // namespace

TEST(LseMerge, TwoEqualParts) {
  const float l[] = {0.0f, 0.0f};
  float w[2];
  EXPECT_NEAR(smla::lse_merge(l, 2, w), std::log(2.0), 1e-7);
  EXPECT_NEAR(w[0], 0.5f, 1e-7);
  EXPECT_NEAR(w[1], 0.5f, 1e-7);
}

TEST(LseMerge, EmptyPartContributesNothing) {
  const float l[] = {-INFINITY, 3.0f};
  float w[2];
  EXPECT_FLOAT_EQ(smla::lse_merge(l, 2, w), 3.0f);
  EXPECT_EQ(w[0], 0.0f);
  EXPECT_FLOAT_EQ(w[1], 1.0f);
}

TEST(LseMerge, NaNAndPlusInfCountAsMinusInf) {
  for (float bad : {NAN, -NAN, INFINITY}) {
    const float l[] = {bad, 1.5f, -INFINITY};
    float w[3] = {-7, -7, -7};
    EXPECT_FLOAT_EQ(smla::lse_merge(l, 3, w), 1.5f) << bad;
    EXPECT_EQ(w[0], 0.0f) << bad;
    EXPECT_FLOAT_EQ(w[1], 1.0f) << bad;
    EXPECT_EQ(w[2], 0.0f) << bad;
  }
}

TEST(LseMerge, AllEmpty) {
  for (int n : {1, 2, 4}) {
    std::vector<float> l(size_t(n), -INFINITY), w(size_t(n), 9.0f);
    if (n == 4) l[1] = NAN, l[2] = INFINITY;
    const float L = smla::lse_merge(l.data(), n, w.data());
    EXPECT_TRUE(is_neg_inf(L)) << n;
    for (float x : w) EXPECT_EQ(x, 0.0f) << n;
  }
  float none = 0;
  EXPECT_TRUE(is_neg_inf(smla::lse_merge(nullptr, 0, &none)));
}

TEST(LseMerge, ThreePartsAgainstFormula) {
  const float l[] = {1.0f, 2.0f, 3.0f};
  float w[3];
  const double L = std::log(std::exp(1.0) + std::exp(2.0) + std::exp(3.0));
  EXPECT_NEAR(smla::lse_merge(l, 3, w), L, 1e-6);
  double sum = 0;
  for (int i = 0; i < 3; ++i) {
    EXPECT_NEAR(w[i], std::exp(l[i] - L), 1e-6);
    sum += w[i];
  }
  EXPECT_NEAR(sum, 1.0, 1e-6);
  // large magnitudes do not overflow
  const float big[] = {1000.0f, 1000.0f};
  float wb[2];
  EXPECT_NEAR(smla::lse_merge(big, 2, wb), 1000.0 + std::log(2.0), 1e-3);
  EXPECT_NEAR(wb[0], 0.5f, 1e-6);
  const float small[] = {-1000.0f, -1000.0f};
  EXPECT_NEAR(smla::lse_merge(small, 2, wb), -1000.0 + std::log(2.0), 1e-3);
  EXPECT_NEAR(wb[1], 0.5f, 1e-6);
}

// Splitting each row's entries into parts, running the reference on each part and merging by LSE
// gives the unsplit result (DESIGN.md §4 split over top-k, §5 DCP merge).
TEST(LseMerge, MergedSplitsEqualUnsplitReference) {
  smla::testing::ProblemSpec s;
  s.num_tokens = 6;
  s.num_heads = 4;
  s.topk = 48;
  s.num_rows = 300;
  s.invalid_fraction = 0.2;
  s.all_invalid_row = true;  // row 0: every part is empty
  s.out_dtype = smla::DType::kFP32;
  auto full = smla::testing::make_problem(s, 5);
  smla::reference::sparse_mla(full.params, 1);
  const int64_t T = s.num_tokens, H = s.num_heads, K = s.topk;
  const auto* full_out = reinterpret_cast<const float*>(full.out.data());

  // Splits: contiguous halves, strided thirds, and "everything / nothing" (an empty part).
  enum Kind { kHalves, kThirds, kAllAndEmpty };
  for (Kind kind : {kHalves, kThirds, kAllAndEmpty}) {
    const int P = kind == kThirds ? 3 : 2;
    std::vector<smla::testing::HostProblem> parts;
    for (int part = 0; part < P; ++part) {
      auto hp = smla::testing::make_problem(s, 5);
      for (int64_t t = 0; t < T; ++t)
        for (int64_t j = 0; j < K; ++j) {
          int owner = 0;
          if (kind == kHalves) owner = j < K / 2 ? 0 : 1;
          if (kind == kThirds) owner = int(j % 3);
          if (kind == kAllAndEmpty) owner = 0;
          if (owner != part) hp.idx[size_t(t * K + j)] = -1;
        }
      smla::reference::sparse_mla(hp.params, 1);
      parts.push_back(std::move(hp));
    }
    for (int64_t t = 0; t < T; ++t)
      for (int h = 0; h < H; ++h) {
        std::vector<float> l(static_cast<size_t>(P)), w(static_cast<size_t>(P));
        for (int i = 0; i < P; ++i) l[size_t(i)] = parts[size_t(i)].lse[size_t(t * H + h)];
        const float L = smla::lse_merge(l.data(), P, w.data());
        const float want_l = full.lse[size_t(t * H + h)];
        if (is_neg_inf(want_l)) {
          EXPECT_TRUE(is_neg_inf(L));
        } else {
          EXPECT_NEAR(L, want_l, 1e-5 * std::fmax(1.0, std::fabs(want_l))) << "t=" << t << " h=" << h;
        }
        for (int d = 0; d < 512; ++d) {
          double merged = 0;
          for (int i = 0; i < P; ++i)
            merged += double(w[size_t(i)]) *
                      reinterpret_cast<const float*>(parts[size_t(i)].out.data())[(t * H + h) * 512 + d];
          const double want = full_out[(t * H + h) * 512 + d];
          ASSERT_NEAR(merged, want, 1e-6) << "kind=" << kind << " t=" << t << " h=" << h << " d=" << d;
          if (t == 0) {
            ASSERT_EQ(merged, 0.0);  // all-empty row: exactly 0
          }
        }
      }
  }
}
