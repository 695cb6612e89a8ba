// Row codecs (smla/formats.h) against the byte layouts of DESIGN.md §3: hand-computed bytes of
// small rows, decoders on hand-made bytes, round-trip error bounds derived from each format's
// precision, saturation, and the rope_dim = 0 variants.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "smla/formats.h"

using smla::KvFormat;

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
