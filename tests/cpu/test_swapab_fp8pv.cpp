// swapab's P V on the e4m3 tensor cores (cuda/sm90/sparse_mla/swapab_fp8pv.h), on the host: the k order
// of the tile's rows against the wgmma A fragment layout and the P^T stmatrix element, the byte transpose
// that builds V^T's fragments from the words the kernel loads (every lane, m-tile, register and byte, both
// dim mappings), P's hi + lo split for every f16 value, the per-tile power of two, and one tile's P V
// through the whole host model against float64 (docs/perf-history.md#s13-fp8pv).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "cuda/sm90/sparse_mla/swapab_fp8pv.h"
#include "smla/numeric.h"

namespace {

namespace p8 = smla::cuda::sm90::sparse_mla::swp8;
namespace num = smla::num;

uint8_t byte_of(uint32_t w, int b) { return uint8_t(w >> (8 * b)); }

// The A fragment of wgmma m64nNk32 with 8-bit A (CUTLASS ALayout_64x32): register r, byte q of lane
// (g, t) of warp w is M row 16 w + g + 8 (r & 1), k 4 t + q + 16 (r >> 1).
int a_k(int t, int r, int q) { return 4 * t + q + 16 * (r >> 1); }

TEST(SwapAbFp8Pv, TransposeIsTheByteTranspose) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 4096; ++trial) {
    uint32_t w[4];
    for (int c = 0; c < 4; ++c)
      w[c] = trial == 0 ? uint32_t(0x04030201u + 0x04040404u * uint32_t(c)) : uint32_t(rng());  // trial 0: 16 distinct bytes
    uint32_t out[4];
    p8::transpose4(w, out);
    for (int b = 0; b < 4; ++b)
      for (int q = 0; q < 4; ++q)
        ASSERT_EQ(byte_of(out[b], q), byte_of(w[p8::word_of_byte(q)], b)) << "plane " << b << " byte " << q;
  }
}

TEST(SwapAbFp8Pv, KOrderMatchesTheFragmentsAndPT) {
  std::vector<int> seen(64, 0);
  for (int m = 0; m < 64; ++m) {
    const int k = p8::k_of_row(m);
    ASSERT_GE(k, 0);
    ASSERT_LT(k, 64);
    ++seen[size_t(k)];
    // a k16 block of P^T holds the rows of one warp's S^T accumulator
    EXPECT_EQ(k / 16, m / 16) << m;
  }
  for (int k = 0; k < 64; ++k) EXPECT_EQ(seen[size_t(k)], 1) << "k " << k << " must hold exactly one row";
  // stmatrix.trans element of lane (w, g): the b16 pair (k, k + 1) = rows m0 = 16 w + g, m1 = m0 + 8
  for (int w = 0; w < 4; ++w)
    for (int g = 0; g < 8; ++g) {
      EXPECT_EQ(p8::k_of_row(16 * w + g), 16 * w + 2 * g);
      EXPECT_EQ(p8::k_of_row(16 * w + g + 8), 16 * w + 2 * g + 1);
    }
  // byte q of register r of k32 step s (lane t) comes from word word_of_byte(q) of k16 block 2 s + r / 2,
  // whose row sits at the fragment's k
  for (int s = 0; s < 2; ++s)
    for (int t = 0; t < 4; ++t)
      for (int r = 0; r < 4; ++r)
        for (int q = 0; q < 4; ++q) {
          const int m = p8::row_of_word(2 * s + (r >> 1), t, p8::word_of_byte(q));
          EXPECT_EQ(p8::k_of_row(m), 32 * s + a_k(t, r, q)) << "s " << s << " t " << t << " r " << r << " q " << q;
        }
  // slot_of is a permutation of the tile's 64 slots
  std::vector<int> slots(64, 0);
  for (int m = 0; m < 64; ++m) ++slots[size_t(p8::slot_of(m))];
  for (int i = 0; i < 64; ++i) EXPECT_EQ(slots[size_t(i)], 1);
}

// Every byte of every lane's V^T fragments equals the stage byte of the row at its k and the dim of its M
// row, with the words loaded as the kernel loads them; both dim mappings (fp8_ds_mla: dim0 = 128 j + 4 (8 w +
// g), four LDS.32 a row; fp8_e4m3: 16 (8 w + g) + 4 j, one LDS.128).
TEST(SwapAbFp8Pv, VFragmentsMatchTheStage) {
  constexpr int kStride = 672;
  std::mt19937 rng(11);
  std::vector<uint8_t> stage(64 * kStride);
  for (auto& b : stage) b = uint8_t(rng());
  std::vector<int> row_at_k(64);
  for (int m = 0; m < 64; ++m) row_at_k[size_t(p8::k_of_row(m))] = m;
  for (int mapping = 0; mapping < 2; ++mapping) {
    auto dim0 = [&](int j, int w, int g) { return mapping == 0 ? 128 * j + 4 * (8 * w + g) : 16 * (8 * w + g) + 4 * j; };
    for (int w = 0; w < 4; ++w)
      for (int g = 0; g < 8; ++g)
        for (int t = 0; t < 4; ++t)
          for (int s = 0; s < 2; ++s) {
            uint32_t wd[2][4][4];
            for (int half = 0; half < 2; ++half)
              for (int c = 0; c < 4; ++c)
                for (int j = 0; j < 4; ++j) {
                  const int slot = p8::slot_of(p8::row_of_word(2 * s + half, t, c));
                  std::memcpy(&wd[half][c][j], stage.data() + slot * kStride + dim0(j, w, g), 4);
                }
            uint32_t a[8][4];
            p8::v_fragments(wd, a);
            for (int mt = 0; mt < 8; ++mt)
              for (int r = 0; r < 4; ++r)
                for (int q = 0; q < 4; ++q) {
                  const int m = row_at_k[size_t(32 * s + a_k(t, r, q))];
                  const int dim = dim0(mt >> 1, w, g) + 2 * (mt & 1) + (r & 1);  // M row g + 8 (r & 1)
                  ASSERT_EQ(byte_of(a[mt][r], q), stage[size_t(p8::slot_of(m) * kStride + dim)])
                      << "mapping " << mapping << " lane (" << w << "," << g << "," << t << ") s " << s << " mt " << mt
                      << " r " << r << " q " << q;
                }
          }
  }
}

// Every f16 value of magnitude <= 448 (P * scale * F stays under 256; the rest checks the saturating edge):
// v - hi exact in f16, hi + lo within 2^-8 |v| + 2^-10 of v, no NaN code; bytes in element order.
// N = 32's per-tile fragments (swapab.cuh pv8_by_tile, docs/perf-history.md#s14-swapab-n32): for every
// tile j, the same registers as v_fragments' m-tiles 2 j, 2 j + 1, on random words.
TEST(SwapAbFp8Pv, TileFragmentsAreVFragmentsOfTheTile) {
  std::mt19937 rng(32);
  for (int trial = 0; trial < 2048; ++trial) {
    uint32_t wd[2][4][4];
    for (auto& h : wd)
      for (auto& c : h)
        for (auto& x : c) x = rng();
    uint32_t all[8][4];
    p8::v_fragments(wd, all);
    for (int j = 0; j < 4; ++j) {
      uint32_t w[2][4], a[2][4];
      for (int half = 0; half < 2; ++half)
        for (int c = 0; c < 4; ++c) w[half][c] = wd[half][c][j];
      p8::v_fragments_tile(w, a);
      for (int h = 0; h < 2; ++h)
        for (int r = 0; r < 4; ++r) ASSERT_EQ(a[h][r], all[2 * j + h][r]) << "j " << j << " h " << h << " r " << r;
    }
  }
}

TEST(SwapAbFp8Pv, SplitEveryF16) {
  int checked = 0;
  double worst = 0.0;
  for (uint32_t h = 0; h < 0x10000u; ++h) {
    const float v = num::fp16_to_f32(uint16_t(h));
    if (!(std::fabs(v) <= 448.0f)) continue;
    uint32_t hi = 0, lo = 0;
    p8::split_e4m3x4(h | 0x3c00u << 16, 0x4000u | 0xc000u << 16, hi, lo);  // element 0 = v; 1, 2, 3 = 1, 2, -2
    const float fh = num::e4m3_to_f32(byte_of(hi, 0)), fl = num::e4m3_to_f32(byte_of(lo, 0));
    ASSERT_EQ(fh, num::e4m3_to_f32(num::f32_to_e4m3(v))) << "hi of " << v;
    ASSERT_EQ(num::fp16_to_f32(num::f32_to_fp16(v - fh)), v - fh) << "v - hi not exact in f16 for " << v;
    ASSERT_FALSE(std::isnan(fh) || std::isnan(fl)) << v;
    const double err = std::fabs(double(fh) + double(fl) - double(v));
    ASSERT_LE(err, std::ldexp(std::fabs(double(v)), -8) + std::ldexp(1.0, -10)) << "hi + lo of " << v;
    if (std::fabs(v) >= 1.0f) worst = std::max(worst, err / std::fabs(double(v)));
    ASSERT_EQ(num::e4m3_to_f32(byte_of(hi, 1)), 1.0f);
    ASSERT_EQ(num::e4m3_to_f32(byte_of(hi, 2)), 2.0f);
    ASSERT_EQ(num::e4m3_to_f32(byte_of(hi, 3)), -2.0f);
    ASSERT_EQ(byte_of(lo, 1) & 0x7f, 0);
    ++checked;
  }
  EXPECT_GT(checked, 30000);
  EXPECT_LE(worst, std::ldexp(1.0, -8));
  std::printf("[ fp8pv    ] %d f16 values split; worst relative error of hi + lo for |v| >= 1: %.3g (2^%.2f)\n", checked,
              worst, std::log2(worst));
}

TEST(SwapAbFp8Pv, TileFactorBoundsTheProducts) {
  std::mt19937 rng(3);
  for (uint32_t eb = 0; eb < 256; ++eb)
    for (int k = 0; k < 64; ++k) {
      const uint32_t mb = eb << 23 | (k == 0 ? 0u : k == 1 ? 0x7fffffu : uint32_t(rng()) & 0x7fffffu);
      float f = 0.0f, inv = 0.0f;
      p8::tile_factor(mb, f, inv);
      ASSERT_TRUE(std::isnormal(f) && std::isnormal(inv)) << std::hex << mb;
      ASSERT_EQ(f * inv, 1.0f) << std::hex << mb;
      if (eb == 255) continue;  // inf / NaN scales: any finite factor
      const float m = num::bits_f32(mb);
      ASSERT_LT(double(m) * double(f), 256.0) << std::hex << mb;
      if (eb >= 8) ASSERT_GE(double(m) * double(f), 128.0) << std::hex << mb;  // hi's range used: [128, 256)
    }
}

// One tile's P V (64 rows, random P <= 1 with masked rows (P 0, scales 0), four latent tiles j whose fp32 row
// scales spread over 2^±6 and sit 2^-3 j below tile 0's, random e4m3 codes) through the host model of the
// kernel's P^T (F_j from the largest scale_j over the rows; f16 pair of P, f16 pair of scale_j * F_j, their
// product, the split) with exact products, against float64: every tile j within 2^-8 of its own sum of
// |terms|. (One F for all j, from the largest scale over rows and j, fails this: tile 3's values, 2^-9 of tile
// 0's, fall into e4m3's subnormals; docs/perf-history.md#s13-fp8pv.)
TEST(SwapAbFp8Pv, TileModelMatchesFloat64) {
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u01(0.0f, 1.0f);
  double worst[4] = {};
  for (int trial = 0; trial < 200; ++trial) {
    float p[64], sc[64][4];
    uint8_t code[64][16];
    for (int m = 0; m < 64; ++m) {
      const bool valid = (rng() % 8) != 0;
      p[m] = valid ? std::exp2(-20.0f * u01(rng) * u01(rng)) : 0.0f;
      for (int j = 0; j < 4; ++j)  // masked rows: the producer zeroes the slot
        sc[m][j] = valid ? std::exp2(12.0f * u01(rng) - 6.0f - 3.0f * float(j)) * 3e-3f : 0.0f;
      for (auto& b : code[m]) {
        b = uint8_t(rng());
        if ((b & 0x7f) == 0x7f) b ^= 1;
      }
    }
    for (int j = 0; j < 4; ++j) {
      uint32_t mx = 0;
      for (int m = 0; m < 64; ++m) mx = std::max(mx, num::f32_bits(sc[m][j]) & 0x7fffffffu);
      float f = 0.0f, inv = 0.0f;
      p8::tile_factor(mx, f, inv);
      float hi[64], lo[64];
      for (int m = 0; m < 64; m += 2) {  // a pair of rows per f16x2, as a lane's (m0, m1)
        const uint32_t ph = p8::pack_f16x2(p[m], p[m + 1]);
        const uint32_t sp = p8::pack_f16x2(sc[m][j] * f, sc[m + 1][j] * f);
        uint32_t h4 = 0, l4 = 0;
        p8::split_e4m3x4(p8::mul_f16x2(ph, sp), 0u, h4, l4);
        for (int e = 0; e < 2; ++e) {
          hi[m + e] = num::e4m3_to_f32(byte_of(h4, e));
          lo[m + e] = num::e4m3_to_f32(byte_of(l4, e));
          ASSERT_LE(std::fabs(hi[m + e]), 256.0f);
        }
      }
      for (int d = 0; d < 16; ++d) {
        double want = 0.0, got = 0.0, mag = 0.0;
        for (int m = 0; m < 64; ++m) {
          if (p[m] == 0.0f) continue;
          const double vv = num::e4m3_to_f32(code[m][d]);
          want += double(p[m]) * double(sc[m][j]) * vv;
          mag += std::fabs(double(p[m]) * double(sc[m][j]) * vv);
          got += (double(hi[m]) + double(lo[m])) * vv;
        }
        got *= double(inv);
        if (mag > 0.0) worst[j] = std::max(worst[j], std::fabs(got - want) / mag);
      }
    }
  }
  for (int j = 0; j < 4; ++j) {
    EXPECT_LE(worst[j], std::ldexp(1.0, -8)) << "tile " << j;
    std::printf("[ fp8pv    ] tile model, latent tile %d (scales 2^-%d of tile 0's): worst |error| / sum |terms| %.3g "
                "(2^%.2f)\n", j, 3 * j, worst[j], std::log2(worst[j]));
  }
}

}  // namespace
