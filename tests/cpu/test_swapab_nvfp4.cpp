// The swap-AB kernel's nvfp4_ds_mla conversion (cuda/sm90/sparse_mla/swapab_nvfp4.h), on the host,
// against the row codec (smla::encode_row / decode_row, the definition): every e2m1 code in both nibbles
// and every byte position, every e4m3 scale byte, and the fragments a lane assembles from the bytes it
// loads (S's K and RoPE, P V's V^T), for encoded rows over a range of magnitudes (subnormal block scales
// included) and for arbitrary bytes. Units: decoded value * 2^-120 (docs/perf-history.md#s12-swapab-nvfp4).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "cuda/sm90/sparse_mla/swapab_nvfp4.h"
#include "smla/formats.h"
#include "smla/numeric.h"

namespace {

namespace nv = smla::cuda::sm90::sparse_mla::swnv;
namespace num = smla::num;
using smla::KvFormat;

// bf16 bits of v * 2^k, asserting that it is exactly a bf16 value (fp32 holds every product here exactly).
uint32_t bf16_exact(float v, int k) {
  const float x = std::ldexp(v, k);
  const uint32_t u = num::f32_bits(x);
  EXPECT_EQ(u & 0xffffu, 0u) << v << " * 2^" << k << " is not a bf16 value";
  return u >> 16;
}
bool nan_scale(uint32_t b) { return (b & 0x7fu) == 0x7fu; }

uint32_t word(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// Every byte (two codes) at every position k of a word, through the selector the kernel uses for it:
// sel2(k, 4 + k) over (word << 4, word) = (low nibble, high nibble) of byte k.
TEST(SwapAbNvfp4, E2m1BitsEveryCodeEveryPosition) {
  std::mt19937 rng(7);
  for (uint32_t k = 0; k < 4; ++k)
    for (uint32_t byte = 0; byte < 256; ++byte)
      for (int trial = 0; trial < 4; ++trial) {
        uint32_t w = rng();  // other bytes arbitrary: they must not leak in
        w = (w & ~(0xffu << (8 * k))) | byte << (8 * k);
        const uint32_t r = nv::e2m1x2_bits(w << 4, w, nv::sel2(k, 4 + k));
        const uint32_t want_lo = bf16_exact(num::e2m1_to_f32(uint8_t(byte & 0xf)), -126);
        const uint32_t want_hi = bf16_exact(num::e2m1_to_f32(uint8_t(byte >> 4)), -126);
        ASSERT_EQ(r & 0xffffu, want_lo) << "byte 0x" << std::hex << byte << " position " << k;
        ASSERT_EQ(r >> 16, want_hi) << "byte 0x" << std::hex << byte << " position " << k;
      }
}

// Every scale byte: the S splat (k_scale, each chunk's byte position) and the V pair (scale2 over two
// words), as sf * 2^6; a NaN byte reads as a finite value.
TEST(SwapAbNvfp4, ScaleEveryByte) {
  for (uint32_t sb = 0; sb < 256; ++sb) {
    for (int c = 0; c < 8; ++c) {
      const uint32_t lo = c < 4 ? sb << (8 * (c & 3)) : 0x5a5a5a5au & ~(0xffu << (8 * (c & 3)));
      const uint32_t hi = c < 4 ? 0xa5a5a5a5u & ~(0xffu << (8 * (c & 3))) : sb << (8 * (c & 3));
      const uint32_t got = nv::k_scale(lo, hi, c);
      if (nan_scale(sb)) {  // finite
        EXPECT_LT(got & 0x7fffu, 0x7f80u) << std::hex << sb;
        EXPECT_LT((got >> 16) & 0x7fffu, 0x7f80u) << std::hex << sb;
        continue;
      }
      const uint32_t want = bf16_exact(num::e4m3_to_f32(uint8_t(sb)), 6);
      ASSERT_EQ(got & 0xffffu, want) << "scale 0x" << std::hex << sb << " chunk " << c;
      ASSERT_EQ(got >> 16, want) << "scale 0x" << std::hex << sb << " chunk " << c;
    }
    for (uint32_t i = 0; i < 4; ++i) {
      const uint32_t other = (sb * 37u + 11u) & 0xffu;
      const uint32_t a = (sb << (8 * i)) | (0x3c3c3c3cu & ~(0xffu << (8 * i)));
      const uint32_t b = other << (8 * i);
      const uint32_t got = nv::scale2(a, b, nv::sel2(i, 4 + i));
      if (!nan_scale(sb)) ASSERT_EQ(got & 0xffffu, bf16_exact(num::e4m3_to_f32(uint8_t(sb)), 6)) << std::hex << sb;
      if (!nan_scale(other))
        ASSERT_EQ(got >> 16, bf16_exact(num::e4m3_to_f32(uint8_t(other)), 6)) << std::hex << other;
    }
  }
}

// Every code (both nibbles of a byte) times every scale byte: the operand the wgmma reads, e2m1 * sf *
// 2^-120, exact; with a NaN scale byte finite (never NaN or inf).
TEST(SwapAbNvfp4, ProductEveryCodeEveryScale) {
  for (uint32_t sb = 0; sb < 256; ++sb) {
    const uint32_t sc = nv::k_scale(sb, 0u, 0);
    for (uint32_t byte = 0; byte < 256; ++byte) {
      const uint32_t got = nv::mul_bf16x2(nv::e2m1x2_bits(byte << 4, byte, nv::sel2(0, 4)), sc);
      if (nan_scale(sb)) {
        ASSERT_LT(got & 0x7fffu, 0x7f80u);
        ASSERT_LT((got >> 16) & 0x7fffu, 0x7f80u);
        continue;
      }
      const float sf = num::e4m3_to_f32(uint8_t(sb));
      ASSERT_EQ(got & 0xffffu, bf16_exact(num::e2m1_to_f32(uint8_t(byte & 0xf)) * sf, -120))
          << "code 0x" << std::hex << (byte & 0xf) << " scale 0x" << sb;
      ASSERT_EQ(got >> 16, bf16_exact(num::e2m1_to_f32(uint8_t(byte >> 4)) * sf, -120))
          << "code 0x" << std::hex << (byte >> 4) << " scale 0x" << sb;
    }
  }
}

// The layout helpers agree with the format: S's lane t reads block 4 c + t at k_bytes(c, t) with its
// scale at k_scales(t) + c; V's lane (w, g) reads block 8 w + g at v_bytes (8 bytes) with its scale at
// v_scale_off; every byte of the latent is read by exactly one lane of each.
TEST(SwapAbNvfp4, LayoutMatchesTheFormat) {
  std::vector<int> k_reads(256, 0), v_reads(256, 0);
  for (int c = 0; c < 8; ++c)
    for (int t = 0; t < 4; ++t) {
      const int blk = 4 * c + t;
      EXPECT_EQ(nv::k_bytes(c, t), 8 * blk);  // block s = latent values 16 s .. 16 s + 15 = bytes 8 s ..
      EXPECT_EQ(nv::k_scales(t) + c, smla::nvfp4_scale_offset(blk));
      for (int b = 0; b < 8; ++b) ++k_reads[size_t(nv::k_bytes(c, t) + b)];
      for (int s = 0; s < 4; ++s)
        for (int r = 0; r < 2; ++r)
          for (int e = 0; e < 2; ++e) EXPECT_EQ(nv::k_dim(4 * c + s, t, r, e) / 16, blk);
    }
  std::vector<int> v_dims(512, 0);
  for (int w = 0; w < 4; ++w)
    for (int g = 0; g < 8; ++g) {
      const int blk = 8 * w + g;
      EXPECT_EQ(nv::v_block(w, g), blk);
      EXPECT_EQ(nv::v_bytes(w, g), 8 * blk);  // block s = bytes 8 s .. 8 s + 7
      EXPECT_EQ(nv::v_bytes(w, g) % 8, 0);    // one 8-byte load
      EXPECT_EQ(nv::v_scale_off(w, g), smla::nvfp4_scale_offset(blk)) << w << g;
      for (int b = 0; b < 8; ++b) ++v_reads[size_t(nv::v_bytes(w, g) + b)];
      for (int j = 0; j < 4; ++j)
        for (int d = 0; d < 4; ++d) {
          EXPECT_EQ(nv::v_dim(j, w, g, d) / 16, blk);
          ++v_dims[size_t(nv::v_dim(j, w, g, d))];
        }
    }
  for (int i = 0; i < 512; ++i) EXPECT_EQ(v_dims[size_t(i)], 1) << "V dim " << i;
  for (int i = 0; i < 256; ++i) EXPECT_EQ(k_reads[size_t(i)], 1) << i;
  for (int i = 0; i < 256; ++i) EXPECT_EQ(v_reads[size_t(i)], 1) << i;
  for (int t = 0; t < 4; ++t) EXPECT_EQ(nv::k_dim(32, t, 0, 0), 512 + 16 * t);  // RoPE chunk
}

// Rows: encoded over a range of magnitudes (blocks of tiny values get subnormal e4m3 scales; 2^-12 rows
// only the smallest scale, 2^-9), and arbitrary bytes with non-NaN scales.
std::vector<std::vector<uint8_t>> test_rows() {
  std::mt19937_64 rng(12345);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<std::vector<uint8_t>> rows;
  for (int trial = 0; trial < 48; ++trial) {
    std::vector<uint8_t> row(nv::kRowBytes);
    if (trial < 32) {
      std::vector<float> lat(512), rp(64);
      for (int i = 0; i < 512; ++i) {  // per-block magnitudes from 2^-14 to 2^9
        const float mul = std::ldexp(1.0f, int((trial * 7 + i / 16 * 5) % 24) - 14);
        lat[size_t(i)] = normal(rng) * mul;
      }
      for (auto& v : rp) v = normal(rng) * std::ldexp(1.0f, trial % 12 - 6);
      smla::encode_row(KvFormat::kNvFP4DsMla, 64, lat.data(), rp.data(), 1.0f, row.data());
    } else {
      for (auto& b : row) b = uint8_t(rng());
      for (int i = 256; i < 352; ++i)  // no NaN e4m3 (RoPE, scales)
        if (nan_scale(row[size_t(i)])) row[size_t(i)] ^= 1u;
    }
    rows.push_back(row);
  }
  int subnormal_scales = 0;
  for (const auto& r : rows)
    for (int s = 0; s < 32; ++s) subnormal_scales += (r[size_t(smla::nvfp4_scale_offset(s))] & 0x78u) == 0;
  EXPECT_GT(subnormal_scales, 100) << "the rows must exercise subnormal block scales";
  return rows;
}

std::vector<float> decoded(const std::vector<uint8_t>& row) {
  std::vector<float> v(576);
  smla::decode_row(KvFormat::kNvFP4DsMla, 64, row.data(), 1.0f, v.data());
  return v;
}

// S: each lane's K fragment (two rows: the fragment's g and g + 8) and RoPE fragment, assembled from the
// bytes it loads, against decode_row * 2^-120 at the dims of swapab's permutation.
TEST(SwapAbNvfp4, KFragmentsMatchDecodeRow) {
  const auto rows = test_rows();
  for (size_t ri = 0; ri < rows.size(); ++ri) {
    const uint8_t* row = rows[ri].data();
    const std::vector<float> want = decoded(rows[ri]);
    for (int t = 0; t < 4; ++t) {
      const uint32_t slo = word(row + nv::k_scales(t)), shi = word(row + nv::k_scales(t) + 4);
      for (int c = 0; c < 8; ++c) {
        uint32_t r[4][2];
        nv::k_chunk(word(row + nv::k_bytes(c, t)), word(row + nv::k_bytes(c, t) + 4), nv::k_scale(slo, shi, c), r);
        for (int s = 0; s < 4; ++s)
          for (int q = 0; q < 2; ++q)
            for (int e = 0; e < 2; ++e) {
              const int d = nv::k_dim(4 * c + s, t, q, e);
              ASSERT_EQ((r[s][q] >> (16 * e)) & 0xffffu, bf16_exact(want[size_t(d)], -120))
                  << "row " << ri << " lane t " << t << " dim " << d;
            }
      }
      uint32_t u[4], r[4][2];
      for (int k = 0; k < 4; ++k) u[k] = word(row + nv::k_rope(t) + 4 * k);
      nv::k_rope_regs(u, r);
      for (int s = 0; s < 4; ++s)
        for (int q = 0; q < 2; ++q)
          for (int e = 0; e < 2; ++e) {
            const int d = nv::k_dim(32 + s, t, q, e);
            ASSERT_EQ((r[s][q] >> (16 * e)) & 0xffffu, bf16_exact(want[size_t(d)], -120))
                << "row " << ri << " lane t " << t << " RoPE dim " << d;
          }
    }
  }
}

// P V: each lane's V^T fragment for two rows (the low and high halves of its registers) and every j,
// from the 8 bytes and the scale byte per row it loads, against decode_row * 2^-120.
TEST(SwapAbNvfp4, VFragmentsMatchDecodeRow) {
  const auto rows = test_rows();
  for (size_t ra = 0; ra < rows.size(); ++ra) {
    const size_t rb = (ra * 7 + 3) % rows.size();
    const uint8_t *a = rows[ra].data(), *b = rows[rb].data();
    const std::vector<float> wa = decoded(rows[ra]), wb = decoded(rows[rb]);
    for (int w = 0; w < 4; ++w)
      for (int g = 0; g < 8; ++g)
        for (int j = 0; j < 4; ++j) {
          const uint32_t va = word(a + nv::v_bytes(w, g) + 4 * (j / 2)), vb = word(b + nv::v_bytes(w, g) + 4 * (j / 2));
          const int so = nv::v_scale_off(w, g);
          const uint32_t sc = nv::v_scale(a[so], b[so]);
          uint32_t r[4];
          nv::v_pair(va, vb, j, sc, r);
          for (int d = 0; d < 4; ++d) {
            const int dim = nv::v_dim(j, w, g, d);
            ASSERT_EQ(r[d] & 0xffffu, bf16_exact(wa[size_t(dim)], -120)) << "row " << ra << " dim " << dim;
            ASSERT_EQ(r[d] >> 16, bf16_exact(wb[size_t(dim)], -120)) << "row " << rb << " dim " << dim;
          }
        }
  }
}

}  // namespace
