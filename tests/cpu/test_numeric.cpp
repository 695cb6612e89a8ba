// Scalar conversions of smla/numeric.h against independent definitions: every expected value is
// either worked out by hand or computed from the format's bit-field definition and a brute-force
// "nearest representable value, ties to the even code, saturate at the largest finite value"
// search. Nothing here calls the code under test to make an expectation.
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <set>
#include <vector>

#include "smla/numeric.h"

namespace num = smla::num;

namespace {

// ---- definitions of each format from its bit fields (sign, exponent, mantissa) -------------
double e4m3_def(int c) {
  const int s = (c >> 7) & 1, e = (c >> 3) & 0xf, m = c & 7;
  if (e == 15 && m == 7) return NAN;
  const double v = e == 0 ? std::ldexp(m / 8.0, -6) : std::ldexp(1.0 + m / 8.0, e - 7);
  return s ? -v : v;
}
double e2m1_def(int c) {
  const int s = (c >> 3) & 1, e = (c >> 1) & 3, m = c & 1;
  const double v = e == 0 ? m * 0.5 : std::ldexp(1.0 + m / 2.0, e - 1);
  return s ? -v : v;
}
double fp16_def(int c) {
  const int s = (c >> 15) & 1, e = (c >> 10) & 0x1f, m = c & 0x3ff;
  double v;
  if (e == 31) v = m ? NAN : INFINITY;
  else if (e == 0) v = std::ldexp(m / 1024.0, -14);
  else v = std::ldexp(1.0 + m / 1024.0, e - 15);
  return s ? -v : v;
}
double bf16_def(int c) {
  const int s = (c >> 15) & 1, e = (c >> 7) & 0xff, m = c & 0x7f;
  double v;
  if (e == 255) v = m ? NAN : INFINITY;
  else if (e == 0) v = std::ldexp(m / 128.0, -126);
  else v = std::ldexp(1.0 + m / 128.0, e - 127);
  return s ? -v : v;
}

// Non-negative finite values of a format by code 0..n-1 (increasing with the code).
std::vector<double> positive_table(double (*def)(int), int n) {
  std::vector<double> t(static_cast<size_t>(n));
  for (int c = 0; c < n; ++c) t[size_t(c)] = def(c);
  return t;
}

// Code of the value nearest to ax >= 0: ties go to the even code, anything at or past the
// largest value saturates to it.
int nearest_code(double ax, const std::vector<double>& t) {
  if (ax >= t.back()) return int(t.size()) - 1;
  const auto it = std::lower_bound(t.begin(), t.end(), ax);
  const int hi = int(it - t.begin());
  if (t[size_t(hi)] == ax || hi == 0) return hi;
  const int lo = hi - 1;
  const double dlo = ax - t[size_t(lo)], dhi = t[size_t(hi)] - ax;
  if (dlo < dhi) return lo;
  if (dhi < dlo) return hi;
  return (hi % 2 == 0) ? hi : lo;
}

// Reference encoder: sign bit | nearest positive code. NaN is handled by the callers.
uint32_t ref_encode(float x, const std::vector<double>& t, uint32_t sign_bit) {
  const uint32_t s = std::signbit(x) ? sign_bit : 0u;
  return s | uint32_t(nearest_code(std::fabs(double(x)), t));
}

const std::vector<double>& e4m3_table() {
  static const auto t = positive_table(e4m3_def, 0x7f);  // 0x00..0x7e (0x7f is NaN)
  return t;
}
const std::vector<double>& e2m1_table() {
  static const auto t = positive_table(e2m1_def, 8);
  return t;
}
const std::vector<double>& fp16_table() {
  static const auto t = positive_table(fp16_def, 0x7c00);  // 0x0000..0x7bff
  return t;
}
const std::vector<double>& bf16_table() {
  static const auto t = positive_table(bf16_def, 0x7f80);  // 0x0000..0x7f7f
  return t;
}

float p2(int e) { return std::ldexp(1.0f, e); }

// Values that probe every rounding decision of a format: each table value, each midpoint
// between neighbours and one float ulp either side of it (both signs).
std::vector<float> probe_values(const std::vector<double>& t) {
  std::vector<float> v;
  for (size_t i = 0; i < t.size(); ++i) {
    v.push_back(float(t[i]));
    if (i + 1 < t.size()) {
      const float mid = float((t[i] + t[i + 1]) / 2);
      EXPECT_EQ(double(mid), (t[i] + t[i + 1]) / 2) << "midpoint must be exact in fp32";
      v.push_back(mid);
      v.push_back(std::nextafter(mid, 0.0f));
      v.push_back(std::nextafter(mid, INFINITY));
    }
  }
  const size_t n = v.size();
  for (size_t i = 0; i < n; ++i) v.push_back(-v[i]);
  return v;
}

// Log-uniform random floats over [2^lo, 2^hi), both signs.
std::vector<float> random_values(int lo, int hi, int n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(lo, hi);
  std::vector<float> v;
  for (int i = 0; i < n; ++i) {
    const float x = float(std::exp2(u(rng)));
    v.push_back(i % 2 ? -x : x);
  }
  return v;
}

}  // namespace

// ============================== e4m3 ==========================================================
TEST(E4M3, DecodeEveryCodeMatchesDefinition) {
  for (int c = 0; c < 256; ++c) {
    const double want = e4m3_def(c);
    const float got = num::e4m3_to_f32(uint8_t(c));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << c;
    } else {
      EXPECT_EQ(double(got), want) << "code " << c;
    }
  }
  EXPECT_EQ(num::e4m3_to_f32(0x7e), 448.0f);
  EXPECT_EQ(num::e4m3_to_f32(0x01), p2(-9));
  EXPECT_EQ(num::e4m3_to_f32(0x08), p2(-6));
  EXPECT_EQ(num::e4m3_to_f32(0xb8), -1.0f);
}

TEST(E4M3, ExactValues) {
  EXPECT_EQ(num::f32_to_e4m3(0.0f), 0x00);
  EXPECT_EQ(num::f32_to_e4m3(1.0f), 0x38);
  EXPECT_EQ(num::f32_to_e4m3(-1.0f), 0xb8);
  EXPECT_EQ(num::f32_to_e4m3(0.5f), 0x30);
  EXPECT_EQ(num::f32_to_e4m3(-3.0f), 0xc4);
  EXPECT_EQ(num::f32_to_e4m3(240.0f), 0x77);
  EXPECT_EQ(num::f32_to_e4m3(256.0f), 0x78);
  EXPECT_EQ(num::f32_to_e4m3(448.0f), 0x7e);
  EXPECT_EQ(num::f32_to_e4m3(-448.0f), 0xfe);
  EXPECT_EQ(num::f32_to_e4m3(p2(-6)), 0x08);
  EXPECT_EQ(num::f32_to_e4m3(p2(-9)), 0x01);  // smallest subnormal
  EXPECT_EQ(num::f32_to_e4m3(7 * p2(-9)), 0x07);
}

TEST(E4M3, TiesToEven) {
  EXPECT_EQ(num::f32_to_e4m3(1.0625f), 0x38);   // 1 | 1.125 -> 1 (even)
  EXPECT_EQ(num::f32_to_e4m3(1.1875f), 0x3a);   // 1.125 | 1.25 -> 1.25 (even)
  EXPECT_EQ(num::f32_to_e4m3(-1.0625f), 0xb8);
  EXPECT_EQ(num::f32_to_e4m3(400.0f), 0x7c);    // 384 | 416 -> 384 (even)
  EXPECT_EQ(num::f32_to_e4m3(432.0f), 0x7e);    // 416 | 448 -> 448 (even)
  EXPECT_EQ(num::f32_to_e4m3(424.0f), 0x7d);    // nearer 416
  EXPECT_EQ(num::f32_to_e4m3(p2(-10)), 0x00);   // 0 | 2^-9 -> 0
  EXPECT_EQ(num::f32_to_e4m3(-p2(-10)), 0x80);  // -0
  EXPECT_EQ(num::f32_to_e4m3(3 * p2(-10)), 0x02);   // 2^-9 | 2^-8 -> 2^-8
  EXPECT_EQ(num::f32_to_e4m3(15 * p2(-10)), 0x08);  // 7*2^-9 | 2^-6 -> 2^-6
  EXPECT_EQ(num::f32_to_e4m3(std::nextafter(p2(-10), 1.0f)), 0x01);
}

TEST(E4M3, Saturates) {
  EXPECT_EQ(num::f32_to_e4m3(500.0f), 0x7e);
  EXPECT_EQ(num::f32_to_e4m3(464.0f), 0x7e);
  EXPECT_EQ(num::f32_to_e4m3(-500.0f), 0xfe);
  EXPECT_EQ(num::f32_to_e4m3(1e30f), 0x7e);
  EXPECT_EQ(num::f32_to_e4m3(FLT_MAX), 0x7e);
  EXPECT_EQ(num::f32_to_e4m3(INFINITY), 0x7e);
  EXPECT_EQ(num::f32_to_e4m3(-INFINITY), 0xfe);
}

TEST(E4M3, NaNBecomesZeroNeverNaN) {
  EXPECT_EQ(num::f32_to_e4m3(NAN), 0x00);
  EXPECT_EQ(num::f32_to_e4m3(-NAN), 0x00);
  EXPECT_EQ(num::f32_to_e4m3(num::bits_f32(0x7f800001u)), 0x00);
  for (float x : random_values(-20, 40, 20000, 1)) {
    const uint8_t b = num::f32_to_e4m3(x);
    ASSERT_NE(b & 0x7f, 0x7f) << x;
  }
}

TEST(E4M3, RoundTripEveryCode) {
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7f) == 0x7f) continue;  // NaN
    EXPECT_EQ(num::f32_to_e4m3(num::e4m3_to_f32(uint8_t(c))), c) << "code " << c;
  }
}

TEST(E4M3, MatchesNearestSearch) {
  const auto& t = e4m3_table();
  for (float x : probe_values(t)) EXPECT_EQ(num::f32_to_e4m3(x), ref_encode(x, t, 0x80)) << x;
  for (float x : random_values(-14, 10, 50000, 2)) ASSERT_EQ(num::f32_to_e4m3(x), ref_encode(x, t, 0x80)) << x;
}

// ============================== e2m1 ==========================================================
TEST(E2M1, DecodeEveryCode) {
  const float want[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  for (int c = 0; c < 16; ++c) {
    EXPECT_EQ(num::e2m1_to_f32(uint8_t(c)), c < 8 ? want[c] : -want[c - 8]) << c;
    EXPECT_EQ(double(num::e2m1_to_f32(uint8_t(c))), e2m1_def(c)) << c;
  }
}

TEST(E2M1, ExactTiesAndSaturation) {
  EXPECT_EQ(num::f32_to_e2m1(0.0f), 0x0);
  EXPECT_EQ(num::f32_to_e2m1(0.5f), 0x1);
  EXPECT_EQ(num::f32_to_e2m1(1.0f), 0x2);
  EXPECT_EQ(num::f32_to_e2m1(6.0f), 0x7);
  EXPECT_EQ(num::f32_to_e2m1(-6.0f), 0xf);
  EXPECT_EQ(num::f32_to_e2m1(-0.5f), 0x9);
  // ties to even
  EXPECT_EQ(num::f32_to_e2m1(0.25f), 0x0);   // 0 | 0.5 -> 0
  EXPECT_EQ(num::f32_to_e2m1(0.75f), 0x2);   // 0.5 | 1 -> 1
  EXPECT_EQ(num::f32_to_e2m1(1.25f), 0x2);   // 1 | 1.5 -> 1
  EXPECT_EQ(num::f32_to_e2m1(1.75f), 0x4);   // 1.5 | 2 -> 2
  EXPECT_EQ(num::f32_to_e2m1(2.5f), 0x4);    // 2 | 3 -> 2
  EXPECT_EQ(num::f32_to_e2m1(3.5f), 0x6);    // 3 | 4 -> 4
  EXPECT_EQ(num::f32_to_e2m1(5.0f), 0x6);    // 4 | 6 -> 4
  EXPECT_EQ(num::f32_to_e2m1(-0.75f), 0xa);
  EXPECT_EQ(num::f32_to_e2m1(std::nextafter(0.25f, 1.0f)), 0x1);
  EXPECT_EQ(num::f32_to_e2m1(std::nextafter(5.0f, 9.0f)), 0x7);
  // saturation, NaN
  EXPECT_EQ(num::f32_to_e2m1(7.0f), 0x7);
  EXPECT_EQ(num::f32_to_e2m1(-7.0f), 0xf);
  EXPECT_EQ(num::f32_to_e2m1(1e9f), 0x7);
  EXPECT_EQ(num::f32_to_e2m1(INFINITY), 0x7);
  EXPECT_EQ(num::f32_to_e2m1(NAN), 0x0);
}

TEST(E2M1, RoundTripEveryCodeAndNearestSearch) {
  for (int c = 0; c < 16; ++c) EXPECT_EQ(num::f32_to_e2m1(num::e2m1_to_f32(uint8_t(c))), c) << c;
  const auto& t = e2m1_table();
  for (float x : probe_values(t)) EXPECT_EQ(num::f32_to_e2m1(x), ref_encode(x, t, 0x8)) << x;
  for (float x : random_values(-6, 4, 20000, 3)) {
    const uint8_t b = num::f32_to_e2m1(x);
    ASSERT_LT(b, 16);
    ASSERT_EQ(b, ref_encode(x, t, 0x8)) << x;
  }
}

// ============================== fp16 ==========================================================
TEST(FP16, DecodeEveryPatternMatchesDefinition) {
  for (int c = 0; c < 65536; ++c) {
    const double want = fp16_def(c);
    const float got = num::fp16_to_f32(uint16_t(c));
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(got)) << c;
    } else {
      ASSERT_EQ(double(got), want) << c;
    }
  }
}

TEST(FP16, RoundTripEveryFinitePattern) {
  for (int c = 0; c < 65536; ++c) {
    if (((c >> 10) & 0x1f) == 0x1f) continue;
    ASSERT_EQ(num::f32_to_fp16(num::fp16_to_f32(uint16_t(c))), c) << c;
  }
}

TEST(FP16, ExactTiesSubnormalsSaturation) {
  EXPECT_EQ(num::f32_to_fp16(1.0f), 0x3c00);
  EXPECT_EQ(num::f32_to_fp16(-2.0f), 0xc000);
  EXPECT_EQ(num::f32_to_fp16(65504.0f), 0x7bff);
  EXPECT_EQ(num::f32_to_fp16(p2(-14)), 0x0400);
  EXPECT_EQ(num::f32_to_fp16(p2(-24)), 0x0001);            // smallest subnormal
  EXPECT_EQ(num::f32_to_fp16(p2(-25)), 0x0000);            // tie 0 | 2^-24 -> 0
  EXPECT_EQ(num::f32_to_fp16(3 * p2(-25)), 0x0002);        // tie 2^-24 | 2^-23 -> 2^-23
  EXPECT_EQ(num::f32_to_fp16(1.0f + p2(-11)), 0x3c00);     // tie -> even
  EXPECT_EQ(num::f32_to_fp16(1.0f + 3 * p2(-11)), 0x3c02);
  EXPECT_EQ(num::f32_to_fp16(1e6f), 0x7bff);
  EXPECT_EQ(num::f32_to_fp16(-1e6f), 0xfbff);
  EXPECT_EQ(num::f32_to_fp16(65520.0f), 0x7bff);  // IEEE would round to inf; smla saturates
  EXPECT_EQ(num::f32_to_fp16(FLT_MAX), 0x7bff);
}

TEST(FP16, MatchesNearestSearch) {
  const auto& t = fp16_table();
  for (float x : random_values(-28, 17, 100000, 4)) ASSERT_EQ(num::f32_to_fp16(x), ref_encode(x, t, 0x8000)) << x;
  // every midpoint between neighbouring fp16 values (ties) and its float neighbours
  for (size_t i = 0; i + 1 < t.size(); ++i) {
    const float mid = float((t[i] + t[i + 1]) / 2);
    for (float x : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, INFINITY), -mid})
      ASSERT_EQ(num::f32_to_fp16(x), ref_encode(x, t, 0x8000)) << x;
  }
}

// ============================== bf16 ==========================================================
TEST(BF16, DecodeEveryPatternMatchesDefinition) {
  for (int c = 0; c < 65536; ++c) {
    const double want = bf16_def(c);
    const float got = num::bf16_to_f32(uint16_t(c));
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(got)) << c;
    } else {
      ASSERT_EQ(double(got), want) << c;
    }
  }
}

TEST(BF16, RoundTripEveryFinitePattern) {
  for (int c = 0; c < 65536; ++c) {
    if (((c >> 7) & 0xff) == 0xff) continue;
    ASSERT_EQ(num::f32_to_bf16(num::bf16_to_f32(uint16_t(c))), c) << c;
  }
}

TEST(BF16, ExactTiesSubnormalsSaturation) {
  EXPECT_EQ(num::f32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(num::f32_to_bf16(-2.0f), 0xc000);
  EXPECT_EQ(num::f32_to_bf16(0.5f), 0x3f00);
  EXPECT_EQ(num::f32_to_bf16(1.0f + p2(-8)), 0x3f80);      // tie -> even
  EXPECT_EQ(num::f32_to_bf16(1.0f + 3 * p2(-8)), 0x3f82);  // tie -> even
  EXPECT_EQ(num::f32_to_bf16(std::nextafter(1.0f + p2(-8), 2.0f)), 0x3f81);
  EXPECT_EQ(num::f32_to_bf16(p2(-133)), 0x0001);           // smallest bf16 subnormal
  EXPECT_EQ(num::f32_to_bf16(p2(-134)), 0x0000);           // tie 0 | 2^-133 -> 0
  // near FLT_MAX: saturate to the largest finite bf16, never inf
  EXPECT_EQ(num::f32_to_bf16(FLT_MAX), 0x7f7f);
  EXPECT_EQ(num::f32_to_bf16(-FLT_MAX), 0xff7f);
  EXPECT_EQ(num::f32_to_bf16(3.3961e38f), 0x7f7f);
  EXPECT_TRUE(std::isfinite(num::bf16_to_f32(num::f32_to_bf16(FLT_MAX))));
  EXPECT_TRUE(std::isnan(num::bf16_to_f32(num::f32_to_bf16(NAN))));
}

TEST(BF16, MatchesNearestSearchOnRandomBitPatterns) {
  const auto& t = bf16_table();
  std::mt19937 rng(5);
  for (int i = 0; i < 200000; ++i) {
    const uint32_t u = rng();
    if (((u >> 23) & 0xff) == 0xff) continue;  // inf / NaN
    const float x = num::bits_f32(u);
    ASSERT_EQ(num::f32_to_bf16(x), ref_encode(x, t, 0x8000)) << x << " bits " << u;
  }
}

// ============================== writer scale conventions ======================================
TEST(DsMlaTileScale, WorkedExamples) {
  EXPECT_EQ(num::ds_mla_tile_scale(448.0f), 1.0f);
  EXPECT_EQ(num::ds_mla_tile_scale(449.0f), 2.0f);
  EXPECT_EQ(num::ds_mla_tile_scale(896.0f), 2.0f);
  EXPECT_EQ(num::ds_mla_tile_scale(897.0f), 4.0f);
  EXPECT_EQ(num::ds_mla_tile_scale(224.0f), 0.5f);
  EXPECT_EQ(num::ds_mla_tile_scale(1.0f), p2(-8));  // 1/448 -> ceil(log2) = -8
  EXPECT_EQ(num::ds_mla_tile_scale(0.0f), p2(-126));
  EXPECT_EQ(num::ds_mla_tile_scale(NAN), p2(-126));
  EXPECT_EQ(num::ds_mla_tile_scale(FLT_MAX), p2(120));  // log2(FLT_MAX/448) = 119.19...
  // amax so small that amax/448 is below 2^-126 (or underflows to 0 in fp32): clamped
  EXPECT_EQ(num::ds_mla_tile_scale(1e-40f), p2(-126));
  EXPECT_EQ(num::ds_mla_tile_scale(1e-44f), p2(-126));
  EXPECT_EQ(num::ds_mla_tile_scale(std::numeric_limits<float>::denorm_min()), p2(-126));
}

TEST(DsMlaTileScale, SmallestPowerOfTwoCoveringAmax) {
  std::mt19937_64 rng(6);
  std::uniform_real_distribution<double> u(-140, 127);
  for (int i = 0; i < 20000; ++i) {
    const float amax = float(std::exp2(u(rng)));
    const double s = num::ds_mla_tile_scale(amax);
    int e;
    ASSERT_EQ(std::frexp(s, &e), 0.5) << "not a power of two: " << s;
    ASSERT_GE(s, std::ldexp(1.0, -126));
    const double r = double(amax) / 448.0;
    ASSERT_GE(s, r) << amax;                                            // amax / s <= 448
    if (s > std::ldexp(1.0, -126)) {
      ASSERT_LT(s / 2, r) << amax;  // and the smallest such
    }
  }
}

TEST(Nvfp4BlockScale, WorkedExamples) {
  EXPECT_EQ(num::nvfp4_block_scale(6.0f), 0x38);     // 6/6 = 1, exact
  EXPECT_EQ(num::nvfp4_block_scale(12.0f), 0x40);    // 2
  EXPECT_EQ(num::nvfp4_block_scale(6.5f), 0x39);     // 1.0833 rounds up to 1.125 already
  EXPECT_EQ(num::nvfp4_block_scale(6.375f), 0x39);   // 1.0625 ties down to 1.0: bumped to 1.125
  EXPECT_EQ(num::nvfp4_block_scale(6.2f), 0x39);     // 1.0333 rounds to 1.0: bumped to 1.125
  EXPECT_EQ(num::nvfp4_block_scale(0.0f), 0x01);     // e4m3(2^-9)
  EXPECT_EQ(num::nvfp4_block_scale(1e-6f), 0x01);
  EXPECT_EQ(num::nvfp4_block_scale(2688.0f), 0x7e);  // 6 * 448
  EXPECT_EQ(num::nvfp4_block_scale(2700.0f), 0x7e);  // never past 448
  EXPECT_EQ(num::nvfp4_block_scale(1e30f), 0x7e);
  EXPECT_EQ(num::nvfp4_block_scale(INFINITY), 0x7e);
}

TEST(Nvfp4BlockScale, SmallestE4M3AtOrAboveTarget) {
  const auto& t = e4m3_table();
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> u(-14, 13);
  for (int i = 0; i < 20000; ++i) {
    const float amax = float(std::exp2(u(rng)));
    const double target = std::max(double(amax) / 6.0, std::ldexp(1.0, -9));
    int want = int(std::lower_bound(t.begin(), t.end(), target) - t.begin());
    if (want >= int(t.size())) want = int(t.size()) - 1;  // capped at 448
    ASSERT_EQ(num::nvfp4_block_scale(amax), want) << amax;
  }
}

TEST(Nvfp4ScaleOffset, Permutation) {
  EXPECT_EQ(num::nvfp4_scale_offset(0), 320);
  EXPECT_EQ(num::nvfp4_scale_offset(1), 328);
  EXPECT_EQ(num::nvfp4_scale_offset(2), 336);
  EXPECT_EQ(num::nvfp4_scale_offset(3), 344);
  EXPECT_EQ(num::nvfp4_scale_offset(4), 321);
  EXPECT_EQ(num::nvfp4_scale_offset(5), 329);
  EXPECT_EQ(num::nvfp4_scale_offset(31), 351);
  std::set<int> seen;
  for (int s = 0; s < 32; ++s) {
    const int o = num::nvfp4_scale_offset(s);
    EXPECT_GE(o, 320);
    EXPECT_LT(o, 352);
    seen.insert(o);
  }
  EXPECT_EQ(seen.size(), 32u);
}
