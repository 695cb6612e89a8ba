// Row codecs (smla/formats.h) against the byte layouts of DESIGN.md §3: hand-computed bytes of
// small rows, decoders on hand-made bytes, round-trip error bounds derived from each format's
// precision, saturation, and the rope_dim = 0 variants; and the row-layout table (row_layout)
// held to §3 part by part, with the codecs and the cache writer reading and writing at its offsets.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "smla/cache.h"
#include "smla/formats.h"
#include "smla/numeric.h"

using smla::KvFormat;
using smla::kRopeDim;

namespace {

constexpr KvFormat kAllFormats[] = {KvFormat::kBF16, KvFormat::kFP16, KvFormat::kFP8E4M3, KvFormat::kFP8DsMla,
                                    KvFormat::kNvFP4DsMla};

uint16_t u16_at(const std::vector<uint8_t>& row, int off) { return uint16_t(row[size_t(off)] | (row[size_t(off) + 1] << 8)); }
uint32_t u32_at(const std::vector<uint8_t>& row, int off) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | row[size_t(off + i)];
  return v;
}
float f32_at(const std::vector<uint8_t>& row, int off) {
  const uint32_t u = u32_at(row, off);
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
void put_f32(std::vector<uint8_t>& row, int off, float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  for (int i = 0; i < 4; ++i) row[size_t(off + i)] = uint8_t(u >> (8 * i));
}

std::vector<uint8_t> encode(KvFormat f, int rope_dim, const std::vector<float>& latent, const std::vector<float>& rope,
                            float k_scale = 1.0f) {
  std::vector<uint8_t> row(size_t(smla::row_bytes(f, rope_dim)), 0xcd);
  smla::encode_row(f, rope_dim, latent.data(), rope_dim ? rope.data() : nullptr, k_scale, row.data());
  return row;
}
std::vector<float> decode(KvFormat f, int rope_dim, const std::vector<uint8_t>& row, float k_scale = 1.0f) {
  std::vector<float> out(size_t(512 + rope_dim));
  smla::decode_row(f, rope_dim, row.data(), k_scale, out.data());
  return out;
}

// Independent e4m3 value of a code (bit fields), for checking decoded scales.
double e4m3_value(int c) {
  const int s = (c >> 7) & 1, e = (c >> 3) & 0xf, m = c & 7;
  const double v = e == 0 ? std::ldexp(m / 8.0, -6) : std::ldexp(1.0 + m / 8.0, e - 7);
  return s ? -v : v;
}

}  // namespace

TEST(Formats, RowBytesTable) {
  EXPECT_EQ(smla::row_bytes(KvFormat::kBF16, 64), 1152);
  EXPECT_EQ(smla::row_bytes(KvFormat::kBF16, 0), 1024);
  EXPECT_EQ(smla::row_bytes(KvFormat::kFP16, 64), 1152);
  EXPECT_EQ(smla::row_bytes(KvFormat::kFP16, 0), 1024);
  EXPECT_EQ(smla::row_bytes(KvFormat::kFP8E4M3, 64), 576);
  EXPECT_EQ(smla::row_bytes(KvFormat::kFP8E4M3, 0), 512);
  EXPECT_EQ(smla::row_bytes(KvFormat::kFP8DsMla, 64), 656);
  EXPECT_EQ(smla::row_bytes(KvFormat::kFP8DsMla, 0), 656);
  EXPECT_EQ(smla::row_bytes(KvFormat::kNvFP4DsMla, 64), 352);
  EXPECT_EQ(smla::row_bytes(KvFormat::kNvFP4DsMla, 0), 352);
  EXPECT_THROW(smla::row_bytes(KvFormat::kBF16, 32), smla::Error);
  EXPECT_FALSE(smla::format_is_quantized(KvFormat::kBF16));
  EXPECT_FALSE(smla::format_is_quantized(KvFormat::kFP16));
  EXPECT_TRUE(smla::format_is_quantized(KvFormat::kFP8E4M3));
  EXPECT_TRUE(smla::format_is_quantized(KvFormat::kFP8DsMla));
  EXPECT_TRUE(smla::format_is_quantized(KvFormat::kNvFP4DsMla));
}

TEST(Formats, Bf16HandBytes) {
  std::vector<float> latent(512, 1.0f), rope(64, -2.0f);
  latent[3] = 0.5f;
  latent[511] = 3.0f;
  rope[63] = 1.0f + std::ldexp(1.0f, -8);  // tie -> 1.0
  const auto row = encode(KvFormat::kBF16, 64, latent, rope);
  ASSERT_EQ(row.size(), 1152u);
  EXPECT_EQ(row[0], 0x80);
  EXPECT_EQ(row[1], 0x3f);
  EXPECT_EQ(u16_at(row, 2), 0x3f80);
  EXPECT_EQ(u16_at(row, 6), 0x3f00);
  EXPECT_EQ(u16_at(row, 1022), 0x4040);
  EXPECT_EQ(u16_at(row, 1024), 0xc000);
  EXPECT_EQ(u16_at(row, 1148), 0xc000);
  EXPECT_EQ(u16_at(row, 1150), 0x3f80);
  const auto back = decode(KvFormat::kBF16, 64, row);
  EXPECT_EQ(back[3], 0.5f);
  EXPECT_EQ(back[511], 3.0f);
  EXPECT_EQ(back[512], -2.0f);
  EXPECT_EQ(back[575], 1.0f);
}

TEST(Formats, Fp16HandBytes) {
  std::vector<float> latent(512, 1.0f), rope(64, -2.0f);
  latent[1] = 0.5f;
  latent[2] = 65504.0f;
  latent[3] = 1e6f;    // saturates
  latent[4] = -1e6f;
  latent[5] = std::ldexp(1.0f, -24);
  const auto row = encode(KvFormat::kFP16, 64, latent, rope);
  EXPECT_EQ(u16_at(row, 0), 0x3c00);
  EXPECT_EQ(u16_at(row, 2), 0x3800);
  EXPECT_EQ(u16_at(row, 4), 0x7bff);
  EXPECT_EQ(u16_at(row, 6), 0x7bff);
  EXPECT_EQ(u16_at(row, 8), 0xfbff);
  EXPECT_EQ(u16_at(row, 10), 0x0001);
  EXPECT_EQ(u16_at(row, 1024), 0xc000);
  EXPECT_EQ(u16_at(row, 1150), 0xc000);
  const auto back = decode(KvFormat::kFP16, 64, row);
  EXPECT_EQ(back[3], 65504.0f);
  EXPECT_EQ(back[5], std::ldexp(1.0f, -24));
  EXPECT_EQ(back[575], -2.0f);
}

TEST(Formats, Fp8E4M3HandBytes) {
  const float ks = 2.0f;
  std::vector<float> latent(512, 0.0f), rope(64, 0.0f);
  latent[0] = 2.0f;                        // 1.0 -> 0x38
  latent[1] = -896.0f;                     // -448 -> 0xfe
  latent[2] = 1000.0f;                     // 500 -> saturates 0x7e
  latent[3] = 2.0f * std::ldexp(1.0f, -9); // 2^-9 -> 0x01
  latent[4] = 3.0f;                        // 1.5 -> 0x3c
  rope[0] = -1.0f;                         // -0.5 -> 0xb0
  rope[63] = 1e9f;                         // saturates
  const auto row = encode(KvFormat::kFP8E4M3, 64, latent, rope, ks);
  ASSERT_EQ(row.size(), 576u);
  EXPECT_EQ(row[0], 0x38);
  EXPECT_EQ(row[1], 0xfe);
  EXPECT_EQ(row[2], 0x7e);
  EXPECT_EQ(row[3], 0x01);
  EXPECT_EQ(row[4], 0x3c);
  EXPECT_EQ(row[5], 0x00);
  EXPECT_EQ(row[512], 0xb0);
  EXPECT_EQ(row[575], 0x7e);
  const auto back = decode(KvFormat::kFP8E4M3, 64, row, ks);
  EXPECT_EQ(back[0], 2.0f);
  EXPECT_EQ(back[1], -896.0f);
  EXPECT_EQ(back[2], 896.0f);
  EXPECT_EQ(back[512], -1.0f);
  EXPECT_EQ(back[575], 896.0f);
  // the decoder multiplies by the k_scale it is given
  EXPECT_EQ(decode(KvFormat::kFP8E4M3, 64, row, 0.25f)[0], 0.25f);
}

TEST(Formats, Fp8DsMlaHandBytes) {
  std::vector<float> latent(512, 0.0f), rope(64, 0.0f);
  for (int i = 0; i < 128; ++i) latent[size_t(i)] = 1.0f;  // tile 0: amax 1 -> s = 2^-8, 1/s = 256
  latent[128] = 448.0f;                                     // tile 1: amax 448 -> s = 1
  latent[129] = -3.0f;
  // tile 2 all zero -> s = 2^-126
  latent[384] = 449.0f;  // tile 3: amax 449 -> s = 2; 224.5 -> 224
  latent[385] = 1.0f;    // 0.5
  rope[0] = 1.0f;
  rope[63] = -2.0f;
  const auto row = encode(KvFormat::kFP8DsMla, 64, latent, rope);
  ASSERT_EQ(row.size(), 656u);
  EXPECT_EQ(row[0], 0x78);    // 256
  EXPECT_EQ(row[127], 0x78);
  EXPECT_EQ(row[128], 0x7e);  // 448
  EXPECT_EQ(row[129], 0xc4);  // -3
  EXPECT_EQ(row[130], 0x00);
  EXPECT_EQ(row[256], 0x00);
  EXPECT_EQ(row[384], 0x76);  // 224
  EXPECT_EQ(row[385], 0x30);  // 0.5
  EXPECT_EQ(u32_at(row, 512), 0x3b800000u);  // 2^-8
  EXPECT_EQ(u32_at(row, 516), 0x3f800000u);  // 1
  EXPECT_EQ(u32_at(row, 520), 0x00800000u);  // 2^-126
  EXPECT_EQ(u32_at(row, 524), 0x40000000u);  // 2
  EXPECT_EQ(u16_at(row, 528), 0x3f80);
  EXPECT_EQ(u16_at(row, 654), 0xc000);
  const auto back = decode(KvFormat::kFP8DsMla, 64, row);
  EXPECT_EQ(back[0], 1.0f);
  EXPECT_EQ(back[128], 448.0f);
  EXPECT_EQ(back[129], -3.0f);
  EXPECT_EQ(back[300], 0.0f);
  EXPECT_EQ(back[384], 448.0f);
  EXPECT_EQ(back[385], 1.0f);
  EXPECT_EQ(back[512], 1.0f);
  EXPECT_EQ(back[575], -2.0f);
}

TEST(Formats, Fp8DsMlaReadsArbitraryStoredScales) {
  // A row from another writer: scales that are not powers of two are used as stored.
  std::vector<uint8_t> row(656, 0);
  row[0] = 0x38;    // 1.0 in tile 0
  row[200] = 0xc0;  // -2.0 in tile 1
  row[300] = 0x30;  // 0.5 in tile 2
  row[511] = 0x7e;  // 448 in tile 3
  put_f32(row, 512, 0.3f);
  put_f32(row, 516, 1.7f);
  put_f32(row, 520, 10.0f);
  put_f32(row, 524, 0.001f);
  row[528] = 0x40;  // bf16 0x4040 = 3.0
  row[529] = 0x40;
  const auto back = decode(KvFormat::kFP8DsMla, 64, row);
  EXPECT_EQ(back[0], 0.3f);
  EXPECT_EQ(back[200], -2.0f * 1.7f);
  EXPECT_EQ(back[300], 5.0f);
  EXPECT_EQ(back[511], 448.0f * 0.001f);
  EXPECT_EQ(back[512], 3.0f);
}

TEST(Formats, Nvfp4DsMlaHandBytes) {
  std::vector<float> latent(512, 0.0f), rope(64, 0.0f);
  // block 0: amax 6 -> scale 1.0 (0x38)
  latent[0] = 1.0f;    // code 2
  latent[1] = -6.0f;   // code 0xf
  latent[2] = 0.25f;   // tie -> 0
  latent[3] = 0.75f;   // tie -> 1.0, code 2
  latent[4] = 1.25f;   // tie -> 1.0, code 2
  latent[5] = 2.5f;    // tie -> 2.0, code 4
  latent[6] = 5.0f;    // tie -> 4.0, code 6
  latent[7] = -0.5f;   // code 9
  // block 1: amax 12 -> scale 2.0 (0x40)
  latent[16] = 12.0f;  // 6 -> code 7
  latent[17] = 3.0f;   // 1.5 -> code 3
  // block 31: amax 6.375 -> 1.0625 ties down to 1.0, moved up to 1.125 (0x39)
  latent[496] = 6.375f;  // 5.667 -> 6, code 7
  rope[0] = 1.0f;
  rope[1] = -448.0f;
  rope[2] = 1000.0f;  // saturates
  rope[63] = 0.5f;
  const auto row = encode(KvFormat::kNvFP4DsMla, 64, latent, rope);
  ASSERT_EQ(row.size(), 352u);
  EXPECT_EQ(row[0], 0xf2);  // low nibble = element 0
  EXPECT_EQ(row[1], 0x20);
  EXPECT_EQ(row[2], 0x42);
  EXPECT_EQ(row[3], 0x96);
  EXPECT_EQ(row[4], 0x00);
  EXPECT_EQ(row[8], 0x37);
  EXPECT_EQ(row[248], 0x07);
  EXPECT_EQ(row[256], 0x38);
  EXPECT_EQ(row[257], 0xfe);
  EXPECT_EQ(row[258], 0x7e);
  EXPECT_EQ(row[319], 0x30);
  EXPECT_EQ(row[320], 0x38);  // scale of block 0
  EXPECT_EQ(row[328], 0x40);  // block 1
  EXPECT_EQ(row[321], 0x01);  // block 4: all zero -> e4m3(2^-9)
  EXPECT_EQ(row[351], 0x39);  // block 31
  // every other block is all zero: scale 2^-9
  for (int off = 320; off < 352; ++off)
    if (off != 320 && off != 328 && off != 351) {
      EXPECT_EQ(row[size_t(off)], 0x01) << off;
    }
  const auto back = decode(KvFormat::kNvFP4DsMla, 64, row);
  EXPECT_EQ(back[0], 1.0f);
  EXPECT_EQ(back[1], -6.0f);
  EXPECT_EQ(back[2], 0.0f);
  EXPECT_EQ(back[3], 1.0f);
  EXPECT_EQ(back[5], 2.0f);
  EXPECT_EQ(back[6], 4.0f);
  EXPECT_EQ(back[7], -0.5f);
  EXPECT_EQ(back[16], 12.0f);
  EXPECT_EQ(back[17], 3.0f);
  EXPECT_EQ(back[496], 6.75f);
  EXPECT_EQ(back[512], 1.0f);
  EXPECT_EQ(back[513], -448.0f);
  EXPECT_EQ(back[514], 448.0f);
  EXPECT_EQ(back[575], 0.5f);
}

TEST(Formats, Nvfp4DsMlaDecodeHandBytes) {
  std::vector<uint8_t> row(352, 0);
  row[0] = 0x72;    // element 0 code 2 (1.0), element 1 code 7 (6.0)
  row[8] = 0xa5;    // elements 16, 17 (block 1): code 5 (3.0), code 0xa (-1.0)
  row[32] = 0x01;   // element 64 (block 4): 0.5
  row[320] = 0x40;  // block 0 scale 2
  row[328] = 0x30;  // block 1 scale 0.5
  row[321] = 0x48;  // block 4 scale 4
  row[256] = 0xc4;  // rope 0: -3
  const auto back = decode(KvFormat::kNvFP4DsMla, 64, row);
  EXPECT_EQ(back[0], 2.0f);
  EXPECT_EQ(back[1], 12.0f);
  EXPECT_EQ(back[16], 1.5f);
  EXPECT_EQ(back[17], -0.5f);
  EXPECT_EQ(back[64], 2.0f);
  EXPECT_EQ(back[512], -3.0f);
}

// Round trip of random data: each decoded value within the rounding bound of its format.
TEST(Formats, RoundTripErrorBounds) {
  std::mt19937_64 rng(11);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> mag(-12.0f, 8.0f);  // nvfp4 saturates past 6 * 448
  for (int trial = 0; trial < 40; ++trial) {
    std::vector<float> latent(512), rope(64);
    // Vary the magnitude per 16-block so the per-tile / per-block scales matter.
    for (int b = 0; b < 32; ++b) {
      const float m = std::exp2(mag(rng));
      for (int i = 16 * b; i < 16 * b + 16; ++i) latent[size_t(i)] = normal(rng) * m;
    }
    for (auto& v : rope) v = normal(rng) * 4.0f;
    for (KvFormat f : kAllFormats) {
      const float ks = f == KvFormat::kFP8E4M3 ? 8.0f : 1.0f;
      if (f == KvFormat::kFP8E4M3 || f == KvFormat::kFP16)  // stay inside the range of these formats
        for (auto& v : latent) v = std::fmax(std::fmin(v, 3000.0f), -3000.0f);
      const auto row = encode(f, 64, latent, rope, ks);
      const auto back = decode(f, 64, row, ks);
      for (int i = 0; i < 576; ++i) {
        const double x = i < 512 ? latent[size_t(i)] : rope[size_t(i - 512)];
        const double y = back[size_t(i)];
        ASSERT_TRUE(std::isfinite(y));
        double bound = 0;
        switch (f) {
          case KvFormat::kBF16: bound = std::ldexp(std::fabs(x), -8); break;
          case KvFormat::kFP16: bound = std::ldexp(std::fabs(x), -11) + std::ldexp(1.0, -25); break;
          case KvFormat::kFP8E4M3: bound = std::ldexp(std::fabs(x), -4) + ks * std::ldexp(1.0, -10); break;
          case KvFormat::kFP8DsMla:
            if (i < 512) {
              const double s = f32_at(row, 512 + 4 * (i / 128));
              bound = std::ldexp(std::fabs(x), -4) + s * std::ldexp(1.0, -10);
            } else {
              bound = std::ldexp(std::fabs(x), -8);
            }
            break;
          case KvFormat::kNvFP4DsMla:
            if (i < 512) {
              const int s = i / 16;
              const double sf = e4m3_value(row[size_t(320 + 8 * (s & 3) + (s >> 2))]);
              double amax = 0;
              for (int k = 16 * s; k < 16 * s + 16; ++k) amax = std::fmax(amax, std::fabs(latent[size_t(k)]));
              ASSERT_GE(sf, amax / 6.0) << "block scale must cover the block";
              // the smallest e4m3 at or above the target: one e4m3 step (1/8 relative, or 2^-9
              // among subnormals) at most
              const double target = std::fmax(amax / 6.0, std::ldexp(1.0, -9));
              ASSERT_LE(sf, std::fmax(target * 1.125, target + std::ldexp(1.0, -9))) << "block scale too coarse";
              bound = 0.25 * std::fmax(sf, std::fabs(x));  // half a step of the e2m1 grid
            } else {
              bound = std::ldexp(std::fabs(x), -4) + std::ldexp(1.0, -10);  // unscaled e4m3
            }
            break;
        }
        ASSERT_LE(std::fabs(x - y), bound * (1 + 1e-6)) << smla::to_string(f) << " i=" << i << " x=" << x;
      }
    }
  }
}

TEST(Formats, ValuesPastRangeSaturateNoNaNFromFiniteInput) {
  std::vector<float> latent(512), rope(64);
  const float extremes[] = {FLT_MAX, -FLT_MAX, 1e30f, -1e30f, 1e6f, FLT_MIN, -FLT_MIN, 1e-45f, 0.0f, -0.0f, 3.0f};
  for (int i = 0; i < 512; ++i) latent[size_t(i)] = extremes[size_t(i) % 11];
  for (int i = 0; i < 64; ++i) rope[size_t(i)] = extremes[size_t(i + 3) % 11];
  for (KvFormat f : kAllFormats)
    for (int rd : {64, 0}) {
      // fp8_ds_mla: a tile holding FLT_MAX decodes to 256 * 2^120 = inf (e4m3 rounds 255.99.. up);
      // it is held to inputs up to 1e38.
      std::vector<float> lat = latent;
      if (f == KvFormat::kFP8DsMla)
        for (auto& v : lat) v = std::fmax(std::fmin(v, 1e38f), -1e38f);
      const auto back = decode(f, rd, encode(f, rd, lat, rope, 1.0f), 1.0f);
      for (int i = 0; i < 512 + rd; ++i) ASSERT_TRUE(std::isfinite(back[size_t(i)])) << smla::to_string(f) << " " << i;
    }
  // saturation values
  std::vector<float> big(512, 1e6f), nbig(64, -1e6f);
  EXPECT_EQ(decode(KvFormat::kFP16, 64, encode(KvFormat::kFP16, 64, big, nbig))[0], 65504.0f);
  EXPECT_EQ(decode(KvFormat::kFP16, 64, encode(KvFormat::kFP16, 64, big, nbig))[575], -65504.0f);
  EXPECT_EQ(decode(KvFormat::kFP8E4M3, 64, encode(KvFormat::kFP8E4M3, 64, big, nbig, 2.0f), 2.0f)[0], 896.0f);
  EXPECT_EQ(decode(KvFormat::kNvFP4DsMla, 64, encode(KvFormat::kNvFP4DsMla, 64, big, nbig))[575], -448.0f);
  // nvfp4 latent: the block scale caps at 448 and e2m1 at 6
  EXPECT_EQ(decode(KvFormat::kNvFP4DsMla, 64, encode(KvFormat::kNvFP4DsMla, 64, big, nbig))[0], 6.0f * 448.0f);
  // fp8_ds_mla keeps the value (the tile scale grows to 4096): 1e6 / 4096 = 244.1 -> 240
  const auto ds = decode(KvFormat::kFP8DsMla, 64, encode(KvFormat::kFP8DsMla, 64, big, nbig));
  EXPECT_EQ(ds[0], 240.0f * 4096.0f);
  EXPECT_TRUE(std::isfinite(ds[575]));
}

TEST(Formats, RopeDimZeroVariants) {
  std::mt19937_64 rng(12);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> latent(512), rope(64);
  for (auto& v : latent) v = normal(rng);
  for (auto& v : rope) v = normal(rng);
  for (KvFormat f : kAllFormats) {
    const auto with = encode(f, 64, latent, rope, 0.5f);
    const auto without = encode(f, 0, latent, rope, 0.5f);
    ASSERT_EQ(int(without.size()), smla::row_bytes(f, 0));
    // the latent part (and for ds_mla formats the scales) is identical; RoPE bytes are zero
    int rope_begin = 0, rope_end = 0;
    switch (f) {
      case KvFormat::kBF16:
      case KvFormat::kFP16: rope_begin = 1024, rope_end = 1024; break;
      case KvFormat::kFP8E4M3: rope_begin = 512, rope_end = 512; break;
      case KvFormat::kFP8DsMla: rope_begin = 528, rope_end = 656; break;
      case KvFormat::kNvFP4DsMla: rope_begin = 256, rope_end = 320; break;
    }
    for (int i = 0; i < int(without.size()); ++i) {
      if (i >= rope_begin && i < rope_end) {
        EXPECT_EQ(without[size_t(i)], 0) << smla::to_string(f) << " " << i;
      } else {
        EXPECT_EQ(without[size_t(i)], with[size_t(i)]) << smla::to_string(f) << " " << i;
      }
    }
    // decoding writes exactly 512 values
    std::vector<float> out(576, 12345.0f);
    smla::decode_row(f, 0, without.data(), 0.5f, out.data());
    const auto full = decode(f, 64, with, 0.5f);
    for (int i = 0; i < 512; ++i) ASSERT_EQ(out[size_t(i)], full[size_t(i)]);
    for (int i = 512; i < 576; ++i) ASSERT_EQ(out[size_t(i)], 12345.0f);
  }
}

// ---------------------------------------------------------------------------------------------
// The row-layout table (smla::row_layout) held to DESIGN.md §3. Everything expected below is
// written from the text of §3, not from the code: the parts of each row, then the bytes the
// writer conventions give for inputs whose codes are exact.

namespace {

using smla::DType;

struct Part {
  int begin, end;  // [begin, end) bytes from the row's start; begin == end: none
  int size() const { return end - begin; }
};
struct DesignRow {
  KvFormat format;
  int bytes, bytes_no_rope;
  Part latent;       // the 512 latent values
  DType latent_dtype;
  Part scales;       // per-row scales
  int num_scales, scale_bytes, values_per_scale;
  Part rope;         // the 64 RoPE values
  DType rope_dtype;
};

// DESIGN.md §3, table "KV row formats (byte-exact)".
const DesignRow kDesign[] = {
    // bf16 / fp16: 1152 (1024 no-rope); [0,1024) 512 latent values, [1024,1152) 64 RoPE values
    {KvFormat::kBF16, 1152, 1024, {0, 1024}, DType::kBF16, {0, 0}, 0, 0, 0, {1024, 1152}, DType::kBF16},
    {KvFormat::kFP16, 1152, 1024, {0, 1024}, DType::kFP16, {0, 0}, 0, 0, 0, {1024, 1152}, DType::kFP16},
    // fp8_e4m3: 576 (512); e4m3 of x / k_scale for all values
    {KvFormat::kFP8E4M3, 576, 512, {0, 512}, DType::kE4M3, {0, 0}, 0, 0, 0, {512, 576}, DType::kE4M3},
    // fp8_ds_mla: 656; [0,512) e4m3 latent, tile i = dims 128i..128i+127; [512,528) 4 fp32 s_i;
    // [528,656) 64 bf16 RoPE
    {KvFormat::kFP8DsMla, 656, 656, {0, 512}, DType::kE4M3, {512, 528}, 4, 4, 128, {528, 656}, DType::kBF16},
    // nvfp4_ds_mla: 352; [0,256) e2m1 two per byte; [256,320) 64 e4m3 RoPE; [320,352) 32 e4m3
    // scales, one per 16 latent values
    {KvFormat::kNvFP4DsMla, 352, 352, {0, 256}, DType::kU8, {320, 352}, 32, 1, 16, {256, 320}, DType::kE4M3},
};

// §3: the scale of nvfp4 block s sits at byte 320 + 8*(s&3) + (s>>2).
int design_nvfp4_scale_at(int s) { return 320 + 8 * (s & 3) + (s >> 2); }

int stored_bytes(DType t) { return t == DType::kBF16 || t == DType::kFP16 ? 2 : 1; }

// Inputs whose encodings are exact, so §3's conventions give the bytes by hand (k_scale 2 for
// fp8_e4m3). Even elements positive, odd ones negative, so a swapped pair or nibble shows.
constexpr float kKScale = 2.0f;
float e4m3_code_value(int c) { return float(e4m3_value(c)); }
float latent_input(KvFormat f, int i) {
  const bool even = i % 2 == 0;
  switch (f) {
    case KvFormat::kFP8DsMla: {  // tile t = i / 128: amax 28 * 4^t -> s_t = 2^(2t-4); x / s = 448 or -224
      const float unit = std::ldexp(1.0f, 2 * (i / 128) - 4);
      return even ? 448.0f * unit : -224.0f * unit;
    }
    case KvFormat::kNvFP4DsMla: {  // block b = i / 16: sf_b = e4m3 code 0x28 + b; x / sf = 6 or -1.5
      const float sf = e4m3_code_value(0x28 + i / 16);
      return even ? 6.0f * sf : -1.5f * sf;
    }
    default: return even ? 1.0f : -2.0f;
  }
}
float rope_input(int j) { return j % 2 == 0 ? 0.5f : -0.5f; }

// The row DESIGN.md §3 prescribes for those inputs, built at kDesign's offsets.
std::vector<uint8_t> design_row(const DesignRow& d, int rope_dim) {
  std::vector<uint8_t> row(size_t(rope_dim ? d.bytes : d.bytes_no_rope), 0);
  auto put16 = [&](int off, uint32_t v) {
    row[size_t(off)] = uint8_t(v), row[size_t(off + 1)] = uint8_t(v >> 8);
  };
  auto put32 = [&](int off, uint32_t v) {
    for (int k = 0; k < 4; ++k) row[size_t(off + k)] = uint8_t(v >> (8 * k));
  };
  const int rope = rope_dim ? 64 : 0;
  switch (d.format) {
    case KvFormat::kBF16:  // 1.0 = 0x3f80, -2.0 = 0xc000, 0.5 = 0x3f00, -0.5 = 0xbf00
      for (int i = 0; i < 512; ++i) put16(d.latent.begin + 2 * i, i % 2 ? 0xc000 : 0x3f80);
      for (int j = 0; j < rope; ++j) put16(d.rope.begin + 2 * j, j % 2 ? 0xbf00 : 0x3f00);
      break;
    case KvFormat::kFP16:  // 1.0 = 0x3c00, -2.0 = 0xc000, 0.5 = 0x3800, -0.5 = 0xb800
      for (int i = 0; i < 512; ++i) put16(d.latent.begin + 2 * i, i % 2 ? 0xc000 : 0x3c00);
      for (int j = 0; j < rope; ++j) put16(d.rope.begin + 2 * j, j % 2 ? 0xb800 : 0x3800);
      break;
    case KvFormat::kFP8E4M3:  // / k_scale 2: 0.5 = 0x30, -1 = 0xb8, 0.25 = 0x28, -0.25 = 0xa8
      for (int i = 0; i < 512; ++i) row[size_t(d.latent.begin + i)] = i % 2 ? 0xb8 : 0x30;
      for (int j = 0; j < rope; ++j) row[size_t(d.rope.begin + j)] = j % 2 ? 0xa8 : 0x28;
      break;
    case KvFormat::kFP8DsMla: {  // 448 = 0x7e, -224 = 0xf6; s_t = 2^-4, 2^-2, 1, 4 as fp32
      const uint32_t scale_bits[4] = {0x3d800000u, 0x3e800000u, 0x3f800000u, 0x40800000u};
      for (int i = 0; i < 512; ++i) row[size_t(d.latent.begin + i)] = i % 2 ? 0xf6 : 0x7e;
      for (int t = 0; t < 4; ++t) put32(d.scales.begin + 4 * t, scale_bits[t]);
      for (int j = 0; j < rope; ++j) put16(d.rope.begin + 2 * j, j % 2 ? 0xbf00 : 0x3f00);
      break;
    }
    case KvFormat::kNvFP4DsMla:  // e2m1 6 = 0x7 (low nibble, even), -1.5 = 0xb (high nibble, odd)
      for (int k = 0; k < 256; ++k) row[size_t(d.latent.begin + k)] = 0xb7;
      for (int b = 0; b < 32; ++b) row[size_t(design_nvfp4_scale_at(b))] = uint8_t(0x28 + b);
      for (int j = 0; j < rope; ++j) row[size_t(d.rope.begin + j)] = j % 2 ? 0xb0 : 0x30;  // e4m3, unscaled
      break;
  }
  return row;
}

std::vector<float> latent_inputs(KvFormat f) {
  std::vector<float> v(512);
  for (int i = 0; i < 512; ++i) v[size_t(i)] = latent_input(f, i);
  return v;
}
std::vector<float> rope_inputs() {
  std::vector<float> v(64);
  for (int j = 0; j < 64; ++j) v[size_t(j)] = rope_input(j);
  return v;
}

}  // namespace

TEST(RowLayout, TableIsDesignSection3) {
  for (const DesignRow& d : kDesign) {
    SCOPED_TRACE(std::string(smla::to_string(d.format)));
    const smla::RowLayout l = smla::row_layout(d.format);
    EXPECT_EQ(l.bytes, d.bytes);
    EXPECT_EQ(l.bytes_no_rope, d.bytes_no_rope);
    EXPECT_EQ(d.latent.begin, 0);  // the table's latent starts every row
    EXPECT_EQ(l.latent_bytes, d.latent.size());
    EXPECT_EQ(l.latent_bits, d.latent.size() * 8 / 512);
    EXPECT_EQ(smla::to_string(l.latent_dtype), smla::to_string(d.latent_dtype));
    EXPECT_EQ(l.num_scales, d.num_scales);
    EXPECT_EQ(l.scale_bytes, d.scale_bytes);
    EXPECT_EQ(l.num_scales * l.scale_bytes, d.scales.size());
    if (d.num_scales > 0) {
      EXPECT_EQ(l.scale_offset, d.scales.begin);
    }
    EXPECT_EQ(l.tile_width, d.values_per_scale);
    EXPECT_EQ(l.rope_offset, d.rope.begin);
    EXPECT_EQ(smla::to_string(l.rope_dtype), smla::to_string(d.rope_dtype));
    EXPECT_EQ(64 * stored_bytes(l.rope_dtype), d.rope.size());
    EXPECT_EQ(smla::row_bytes(d.format, 64), d.bytes);
    EXPECT_EQ(smla::row_bytes(d.format, 0), d.bytes_no_rope);
    // The parts cover the row, each byte once.
    std::vector<int> cover(size_t(d.bytes), 0);
    for (const Part& p : {d.latent, d.scales, d.rope})
      for (int b = p.begin; b < p.end; ++b) ++cover[size_t(b)];
    for (int b = 0; b < d.bytes; ++b) EXPECT_EQ(cover[size_t(b)], 1) << "byte " << b;
  }
  // nvfp4 scale s: the permuted position of §3, a permutation of the scale bytes.
  std::vector<int> seen(352, 0);
  for (int s = 0; s < 32; ++s) {
    EXPECT_EQ(smla::nvfp4_scale_offset(s), design_nvfp4_scale_at(s)) << s;
    EXPECT_EQ(smla::num::nvfp4_scale_offset(s), design_nvfp4_scale_at(s)) << s;
    ++seen[size_t(design_nvfp4_scale_at(s))];
  }
  for (int b = 320; b < 352; ++b) EXPECT_EQ(seen[size_t(b)], 1) << b;
}

// encode_row of known values: each part at the table's offset with the table's size holds the
// bytes §3 prescribes, every other byte is zero, and decode_row gives the inputs back.
TEST(RowLayout, EncodedPartsLandAtTableOffsets) {
  const auto rope = rope_inputs();
  for (const DesignRow& d : kDesign)
    for (int rope_dim : {64, 0}) {
      SCOPED_TRACE(std::string(smla::to_string(d.format)) + " rope_dim " + std::to_string(rope_dim));
      const smla::RowLayout l = smla::row_layout(d.format);
      const auto latent = latent_inputs(d.format);
      const float ks = d.format == KvFormat::kFP8E4M3 ? kKScale : 1.0f;
      const auto row = encode(d.format, rope_dim, latent, rope, ks);
      const auto want = design_row(d, rope_dim);
      ASSERT_EQ(row.size(), want.size());
      ASSERT_EQ(int(row.size()), rope_dim ? l.bytes : l.bytes_no_rope);
      auto same = [&](int begin, int size, const char* part) {
        ASSERT_LE(begin + size, int(row.size())) << part;
        for (int b = begin; b < begin + size; ++b)
          ASSERT_EQ(int(row[size_t(b)]), int(want[size_t(b)])) << part << " byte " << b;
      };
      std::vector<int> cover(row.size(), 0);
      auto mark = [&](int begin, int size) {
        for (int b = begin; b < begin + size && b < int(row.size()); ++b) ++cover[size_t(b)];
      };
      same(0, l.latent_bytes, "latent");
      mark(0, l.latent_bytes);
      if (l.num_scales > 0) {
        same(l.scale_offset, l.num_scales * l.scale_bytes, "scales");
        mark(l.scale_offset, l.num_scales * l.scale_bytes);
      }
      const int rope_size = kRopeDim * stored_bytes(l.rope_dtype);
      if (rope_dim || l.bytes_no_rope == l.bytes) {  // ds_mla rows keep their RoPE bytes (zero)
        same(l.rope_offset, rope_size, "rope");
        mark(l.rope_offset, rope_size);
      } else {
        EXPECT_EQ(l.rope_offset, int(row.size()));  // the row ends where RoPE would start
      }
      for (size_t b = 0; b < row.size(); ++b) EXPECT_EQ(cover[b], 1) << "byte " << b << " in no part or in two";
      for (size_t b = 0; b < row.size(); ++b) ASSERT_EQ(int(row[b]), int(want[b])) << "byte " << b;
      // The inputs are exact in every format: the decoder reads them back from the same places.
      const auto back = decode(d.format, rope_dim, row, ks);
      for (int i = 0; i < 512; ++i) ASSERT_EQ(back[size_t(i)], latent[size_t(i)]) << "latent " << i;
      for (int j = 0; j < rope_dim; ++j) ASSERT_EQ(back[size_t(512 + j)], rope[size_t(j)]) << "rope " << j;
    }
}

// The cache writer (CPU reference; the CUDA writers are held to it byte for byte by the GPU test
// AllFormats/CacheWriter*) writes row_bytes = the table's size per slot: the §3 bytes, nothing
// past them; validate() asks for exactly that stride.
TEST(RowLayout, CacheWriterWritesTableRows) {
  std::vector<uint16_t> latent(2 * 512), rope(2 * 64);
  for (const DesignRow& d : kDesign)
    for (int rope_dim : {64, 0}) {
      SCOPED_TRACE(std::string(smla::to_string(d.format)) + " rope_dim " + std::to_string(rope_dim));
      const smla::RowLayout l = smla::row_layout(d.format);
      const int rb = rope_dim ? l.bytes : l.bytes_no_rope;
      ASSERT_EQ(smla::row_bytes(d.format, rope_dim), rb);
      for (int n = 0; n < 2; ++n) {  // bf16 inputs: every test value is exact in bf16
        for (int i = 0; i < 512; ++i) latent[size_t(n * 512 + i)] = smla::num::f32_to_bf16(latent_input(d.format, i));
        for (int j = 0; j < 64; ++j) rope[size_t(n * 64 + j)] = smla::num::f32_to_bf16(rope_input(j));
      }
      const int stride = rb + 16;
      std::vector<uint8_t> cache(size_t(3 * stride), 0xab);
      const std::vector<int32_t> slots = {2, 0};
      smla::CacheWriteParams p;
      p.num_tokens = 2, p.latent = latent.data(), p.latent_stride = 512;
      p.rope = rope_dim ? rope.data() : nullptr, p.rope_stride = 64, p.rope_dim = rope_dim;
      p.slot_mapping = slots.data(), p.cache = cache.data(), p.num_rows = 3, p.row_stride_bytes = stride;
      p.format = d.format, p.k_scale = d.format == KvFormat::kFP8E4M3 ? kKScale : 1.0f;
      smla::write_cache_reference(p);
      const auto want = design_row(d, rope_dim);
      for (int r = 0; r < 3; ++r)
        for (int b = 0; b < stride; ++b) {
          const int expect = r != 1 && b < rb ? int(want[size_t(b)]) : 0xab;  // row 1 and the gaps untouched
          ASSERT_EQ(int(cache[size_t(r * stride + b)]), expect) << "row " << r << " byte " << b;
        }
      p.row_stride_bytes = rb;
      EXPECT_NO_THROW(smla::validate(p));
      p.row_stride_bytes = rb - 1;
      EXPECT_THROW(smla::validate(p), smla::Error);
    }
}
