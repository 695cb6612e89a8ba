// Row codecs of DESIGN.md §3. Straight loops; the scalar rounding lives in smla/numeric.h.
#include "smla/formats.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "smla/numeric.h"

namespace smla {

int row_bytes(KvFormat format, int rope_dim) {
  SMLA_CHECK(rope_dim == 0 || rope_dim == kRopeDim, "rope_dim must be 64 or 0");
  const RowLayout l = row_layout(format);
  SMLA_CHECK(l.bytes > 0, "unknown KV format");
  return rope_dim == 0 ? l.bytes_no_rope : l.bytes;
}

bool format_is_quantized(KvFormat format) {
  return format != KvFormat::kBF16 && format != KvFormat::kFP16;
}

namespace {

// What the straight loops below assume of the table: 16- and 8-bit formats store every value in
// order from byte 0 (latent, then RoPE); the ds_mla formats' latent starts the row, packed
// value-after-value, with one scale per tile_width values.
constexpr bool dense(KvFormat f, int bits) {
  const RowLayout l = row_layout(f);
  return l.latent_bits == bits && l.latent_bytes == kLatentDim * bits / 8 && l.rope_offset == l.latent_bytes &&
         l.num_scales == 0 && l.bytes == l.rope_offset + kRopeDim * bits / 8;
}
static_assert(dense(KvFormat::kBF16, 16) && dense(KvFormat::kFP16, 16) && dense(KvFormat::kFP8E4M3, 8));
constexpr bool tiled(KvFormat f, int bits, int scale_bytes) {
  const RowLayout l = row_layout(f);
  return l.latent_bits == bits && l.latent_bytes == kLatentDim * bits / 8 && l.scale_bytes == scale_bytes &&
         l.num_scales * l.tile_width == kLatentDim;
}
static_assert(tiled(KvFormat::kFP8DsMla, 8, sizeof(float)) && tiled(KvFormat::kNvFP4DsMla, 4, 1));

void put_u16(uint8_t* p, uint16_t v) { std::memcpy(p, &v, 2); }
uint16_t get_u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

}  // namespace

void encode_row(KvFormat format, int rope_dim, const float* latent, const float* rope, float k_scale,
                uint8_t* row) {
  const int nbytes = row_bytes(format, rope_dim);
  std::memset(row, 0, size_t(nbytes));
  auto value = [&](int i) { return i < kLatentDim ? latent[i] : rope[i - kLatentDim]; };
  const int d = kLatentDim + rope_dim;
  switch (format) {
    case KvFormat::kBF16:
      for (int i = 0; i < d; ++i) put_u16(row + 2 * i, num::f32_to_bf16(value(i)));
      return;
    case KvFormat::kFP16:
      for (int i = 0; i < d; ++i) put_u16(row + 2 * i, num::f32_to_fp16(value(i)));
      return;
    case KvFormat::kFP8E4M3:
      SMLA_CHECK(std::isfinite(k_scale) && k_scale > 0, "k_scale must be finite and > 0");
      for (int i = 0; i < d; ++i) row[i] = num::f32_to_e4m3(value(i) / k_scale);
      return;
    case KvFormat::kFP8DsMla: {
      constexpr RowLayout l = row_layout(KvFormat::kFP8DsMla);
      for (int tile = 0; tile < l.num_scales; ++tile) {
        const int begin = l.tile_width * tile, end = begin + l.tile_width;
        float amax = 0.0f;
        for (int i = begin; i < end; ++i) amax = std::max(amax, std::fabs(latent[i]));
        const float s = num::ds_mla_tile_scale(amax);
        std::memcpy(row + l.scale_offset + l.scale_bytes * tile, &s, sizeof s);
        for (int i = begin; i < end; ++i) row[i] = num::f32_to_e4m3(latent[i] / s);
      }
      for (int i = 0; i < rope_dim; ++i) put_u16(row + l.rope_offset + 2 * i, num::f32_to_bf16(rope[i]));
      return;
    }
    case KvFormat::kNvFP4DsMla: {
      constexpr RowLayout l = row_layout(KvFormat::kNvFP4DsMla);
      for (int blk = 0; blk < l.num_scales; ++blk) {
        const int begin = l.tile_width * blk, end = begin + l.tile_width;
        float amax = 0.0f;
        for (int i = begin; i < end; ++i) amax = std::max(amax, std::fabs(latent[i]));
        const uint8_t sb = num::nvfp4_block_scale(amax);
        row[nvfp4_scale_offset(blk)] = sb;
        const float sf = num::e4m3_to_f32(sb);
        for (int i = begin; i < end; i += 2) {
          const uint8_t lo = num::f32_to_e2m1(latent[i] / sf);
          const uint8_t hi = num::f32_to_e2m1(latent[i + 1] / sf);
          row[i / 2] = uint8_t(lo | (hi << 4));
        }
      }
      for (int i = 0; i < rope_dim; ++i) row[l.rope_offset + i] = num::f32_to_e4m3(rope[i]);
      return;
    }
  }
}

void decode_row(KvFormat format, int rope_dim, const uint8_t* row, float k_scale, float* out) {
  const int d = kLatentDim + rope_dim;
  switch (format) {
    case KvFormat::kBF16:
      for (int i = 0; i < d; ++i) out[i] = num::bf16_to_f32(get_u16(row + 2 * i));
      return;
    case KvFormat::kFP16:
      for (int i = 0; i < d; ++i) out[i] = num::fp16_to_f32(get_u16(row + 2 * i));
      return;
    case KvFormat::kFP8E4M3:
      for (int i = 0; i < d; ++i) out[i] = num::e4m3_to_f32(row[i]) * k_scale;
      return;
    case KvFormat::kFP8DsMla: {
      constexpr RowLayout l = row_layout(KvFormat::kFP8DsMla);
      for (int tile = 0; tile < l.num_scales; ++tile) {
        float s;
        std::memcpy(&s, row + l.scale_offset + l.scale_bytes * tile, sizeof s);
        const int begin = l.tile_width * tile, end = begin + l.tile_width;
        for (int i = begin; i < end; ++i) out[i] = num::e4m3_to_f32(row[i]) * s;
      }
      for (int i = 0; i < rope_dim; ++i) out[kLatentDim + i] = num::bf16_to_f32(get_u16(row + l.rope_offset + 2 * i));
      return;
    }
    case KvFormat::kNvFP4DsMla: {
      constexpr RowLayout l = row_layout(KvFormat::kNvFP4DsMla);
      for (int blk = 0; blk < l.num_scales; ++blk) {
        const float sf = num::e4m3_to_f32(row[nvfp4_scale_offset(blk)]);
        const int begin = l.tile_width * blk, end = begin + l.tile_width;
        for (int i = begin; i < end; ++i) {
          const uint8_t byte = row[i / 2];
          out[i] = num::e2m1_to_f32((i & 1) ? uint8_t(byte >> 4) : uint8_t(byte & 0xf)) * sf;
        }
      }
      for (int i = 0; i < rope_dim; ++i) out[kLatentDim + i] = num::e4m3_to_f32(row[l.rope_offset + i]);
      return;
    }
  }
  fail("unknown KV format");
}

}  // namespace smla
