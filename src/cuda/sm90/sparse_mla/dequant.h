// Dequantization of the quantized KV rows (DESIGN.md §3) to bf16, one 16-byte chunk (8 values
// of the 576-wide row) at a time. Host and device: the kernel dequantizes shared-memory rows with
// these functions, and a host test holds them to smla::decode_row over every byte value.
//
// Exactness: every e4m3 value, and every e2m1 value times an e4m3 block scale, is a bf16 value,
// so fp8_e4m3 (with k_scale folded into the score and output scales), nvfp4_ds_mla and the RoPE
// parts decode bit-exactly; fp8_ds_mla values (e4m3 times an arbitrary fp32 tile scale) are
// rounded to nearest-even bf16 (exact for the writers' power-of-two scales).
#pragma once

#include <cstdint>
#include <cstring>

#include "cuda/sm90/sparse_mla/config.h"
#include "smla/numeric.h"

#if defined(__CUDACC__)
#include <cuda_bf16.h>

#include "cuda/common/ptx.cuh"
#define SMLA_DQ_UNROLL _Pragma("unroll")
#else
#define SMLA_DQ_UNROLL
#endif

namespace smla::cuda::sm90::sparse_mla::dq {

struct Chunk {
  uint32_t w[4];  // 8 bf16, element 2i in the low half of w[i]
};

SMLA_HD uint32_t ld_u32(const uint8_t* p) {  // p: 4-byte aligned
#if defined(__CUDA_ARCH__)
  return *reinterpret_cast<const uint32_t*>(p);
#else
  uint32_t v;
  memcpy(&v, p, 4);
  return v;
#endif
}
SMLA_HD void ld_u32x2(const uint8_t* p, uint32_t& lo, uint32_t& hi) {  // p: 8-byte aligned
#if defined(__CUDA_ARCH__)
  const uint2 v = *reinterpret_cast<const uint2*>(p);
  lo = v.x, hi = v.y;
#else
  memcpy(&lo, p, 4);
  memcpy(&hi, p + 4, 4);
#endif
}

// Two floats -> packed bf16 pair (low half = a), round to nearest even.
SMLA_HD uint32_t pack_bf16x2(float a, float b) {
#if defined(__CUDA_ARCH__)
  __nv_bfloat162 v = __floats2bfloat162_rn(a, b);
  return *reinterpret_cast<uint32_t*>(&v);
#else
  return uint32_t(num::f32_to_bf16(a)) | uint32_t(num::f32_to_bf16(b)) << 16;
#endif
}

// bf16 bits of the e4m3 byte b (low 8 bits), exact; equals f32_to_bf16(e4m3_to_f32(b)) for all
// 256 bytes, NaN included. Normal e4m3 (exponent field e > 0) only moves its fields: the bf16
// exponent is e - 7 + 127; the 7 subnormals m * 2^-9 go through an exact fp32 product.
SMLA_HD uint32_t e4m3_bf16_bits(uint32_t b) {
  const uint32_t sign = (b & 0x80u) << 8, em = b & 0x7fu;
  uint32_t mag = (em + (120u << 3)) << 4;
  if (em < 8u) mag = num::f32_bits(float(em) * 0.001953125f) >> 16;
  if (em == 0x7fu) mag = 0x7fc0u;
  return sign | mag;
}
SMLA_HD float e4m3_f32(uint32_t b) { return num::bits_f32(e4m3_bf16_bits(b) << 16); }

// 8 e4m3 bytes (lo: elements 0-3, hi: 4-7) -> 8 bf16, exact.
SMLA_HD Chunk e4m3x8(uint32_t lo, uint32_t hi) {
  Chunk c;
SMLA_DQ_UNROLL
  for (int i = 0; i < 4; ++i) {
    const uint32_t w = i < 2 ? lo : hi, sh = (i & 1) * 16;
    c.w[i] = e4m3_bf16_bits((w >> sh) & 0xffu) | e4m3_bf16_bits((w >> (sh + 8)) & 0xffu) << 16;
  }
  return c;
}

// 8 e4m3 bytes times the fp32 scale s -> 8 bf16 (fp32 product, then round to nearest even).
SMLA_HD Chunk e4m3x8_scaled(uint32_t lo, uint32_t hi, float s) {
  Chunk c;
SMLA_DQ_UNROLL
  for (int i = 0; i < 4; ++i) {
    const uint32_t w = i < 2 ? lo : hi, sh = (i & 1) * 16;
    c.w[i] = pack_bf16x2(e4m3_f32((w >> sh) & 0xffu) * s, e4m3_f32((w >> (sh + 8)) & 0xffu) * s);
  }
  return c;
}

// e2m1 code (low 4 bits) times sf -> fp32, exact. Nibble k of the constant is twice the
// magnitude of code k (0, .5, 1, 1.5, 2, 3, 4, 6); the sign bit moves to bit 31.
SMLA_HD float e2m1_times(uint32_t nib, float half_sf) {
  const float mag = float((0xC8643210u >> ((nib & 7u) * 4u)) & 0xfu) * half_sf;
  return num::bits_f32(num::f32_bits(mag) ^ ((nib & 8u) << 28));
}

// 8 e2m1 codes (one word, element i in nibble i) times the block scale sf -> 8 bf16, exact.
SMLA_HD Chunk e2m1x8_scaled(uint32_t w, float sf) {
  const float half_sf = 0.5f * sf;
  Chunk c;
SMLA_DQ_UNROLL
  for (int i = 0; i < 4; ++i) c.w[i] = pack_bf16x2(e2m1_times(w >> (8 * i), half_sf), e2m1_times(w >> (8 * i + 4), half_sf));
  return c;
}

#if defined(__CUDACC__)
// Device fast paths (hardware cvt, sm_89+): the same values as e4m3x8 / e4m3x8_scaled (e4m3 ->
// f16 -> f32 is exact; NaN bytes may give a different NaN pattern). Used by the warp-specialized
// kernel's second consumer (convert.cuh), which dequantizes a tile in place.
__device__ __forceinline__ void e4m3x4_f32(uint32_t w, float (&f)[4]) {
  uint32_t h0, h1;
  ptx::cvt_e4m3x4_f16x2(w, h0, h1);
  ptx::cvt_f16x4_f32(h0, h1, f);
}
__device__ __forceinline__ Chunk e4m3x8_scaled_fast(uint32_t lo, uint32_t hi, float s) {
  float a[4], b[4];
  e4m3x4_f32(lo, a);
  e4m3x4_f32(hi, b);
  return Chunk{{pack_bf16x2(a[0] * s, a[1] * s), pack_bf16x2(a[2] * s, a[3] * s), pack_bf16x2(b[0] * s, b[1] * s),
                pack_bf16x2(b[2] * s, b[3] * s)}};
}
__device__ __forceinline__ Chunk e4m3x8_fast(uint32_t lo, uint32_t hi) {
  float a[4], b[4];
  e4m3x4_f32(lo, a);
  e4m3x4_f32(hi, b);
  return Chunk{{pack_bf16x2(a[0], a[1]), pack_bf16x2(a[2], a[3]), pack_bf16x2(b[0], b[1]), pack_bf16x2(b[2], b[3])}};
}
#endif

// __byte_perm on host and device: byte n of the result is byte (s >> 4n) & 7 of {y:x}.
SMLA_HD uint32_t byte_perm(uint32_t x, uint32_t y, uint32_t s) {
#if defined(__CUDA_ARCH__)
  return __byte_perm(x, y, s);
#else
  const uint64_t v = uint64_t(y) << 32 | x;
  uint32_t r = 0;
  for (int n = 0; n < 4; ++n) r |= uint32_t((v >> (8 * ((s >> (4 * n)) & 7u))) & 0xffu) << (8 * n);
  return r;
#endif
}

// Two bf16 multiplied lane-wise, exact products only (the caller's guarantee: e2m1 x e4m3 always is).
SMLA_HD uint32_t mul_bf16x2_exact(uint32_t a, uint32_t b) {
#if defined(__CUDA_ARCH__)
  return ptx::mul_bf16x2(a, b);  // a plain multiply (not an fma with a +0 addend, which would turn -0 into +0)
#else
  const float lo = num::bits_f32(a << 16) * num::bits_f32(b << 16);
  const float hi = num::bits_f32(a & 0xffff0000u) * num::bits_f32(b & 0xffff0000u);
  return num::f32_bits(lo) >> 16 | (num::f32_bits(hi) & 0xffff0000u);
#endif
}

// e2m1x8_scaled by table lookup: the bf16 bits of the 8 magnitudes (0, .5, 1, 1.5, 2, 3, 4, 6) come
// from two byte permutes per 4 codes (high bytes 00 3F 3F 3F 40 40 40 40, low bytes 00 00 80 C0 00
// 40 80 C0), the sign bit is moved over, and the block scale (bf16 bits of an e4m3 value) is
// applied with one bf16x2 multiply, exact because e2m1 x e4m3 needs at most 5 significant bits.
// Same bits as e2m1x8_scaled for every code and non-NaN scale (host test: every pair).
SMLA_HD Chunk e2m1x8_scaled_lut(uint32_t w, uint32_t sf_bf16) {
  const uint32_t sf2 = sf_bf16 | sf_bf16 << 16;
  Chunk c;
SMLA_DQ_UNROLL
  for (int half = 0; half < 2; ++half) {
    const uint32_t v = w >> (16 * half);  // codes 4 half .. 4 half + 3 in nibbles 0-3
    const uint32_t sel = v & 0x7777u;
    const uint32_t hi = byte_perm(0x3F3F3F00u, 0x40404040u, sel), lo = byte_perm(0xC0800000u, 0xC0804000u, sel);
    const uint32_t w01 = byte_perm(lo, hi, 0x5140u) | ((v << 12) & 0x8000u) | ((v << 24) & 0x80000000u);
    const uint32_t w23 = byte_perm(lo, hi, 0x7362u) | ((v << 4) & 0x8000u) | ((v << 16) & 0x80000000u);
    c.w[2 * half] = mul_bf16x2_exact(w01, sf2);
    c.w[2 * half + 1] = mul_bf16x2_exact(w23, sf2);
  }
  return c;
}

// Logical 16-byte chunk `ch` (elements 8 ch .. 8 ch + 7 of the bf16 row: ch < 64 latent,
// 64..71 RoPE) of the raw row at `raw` (16-byte aligned; the bytes a chunk needs only).
// fp8_e4m3: e4m3 without k_scale (the caller folds it into its scales).
template <KvFormat kFormat>
SMLA_HD Chunk dequant_chunk(const uint8_t* raw, int ch) {
  constexpr RowLayout L = row_layout(kFormat);
  uint32_t lo, hi;
  if constexpr (kFormat == KvFormat::kFP8E4M3) {
    ld_u32x2(raw + 8 * ch, lo, hi);
    return e4m3x8(lo, hi);
  } else if constexpr (kFormat == KvFormat::kFP8DsMla) {
    if (ch < kLatent / 8) {
      ld_u32x2(raw + 8 * ch, lo, hi);
      return e4m3x8_scaled(lo, hi, num::bits_f32(ld_u32(raw + L.scale_offset + L.scale_bytes * (ch / (L.tile_width / 8)))));
    }
    const uint8_t* rope = raw + L.rope_offset + 16 * (ch - kLatent / 8);  // bf16 as stored
    Chunk c;
    ld_u32x2(rope, c.w[0], c.w[1]);
    ld_u32x2(rope + 8, c.w[2], c.w[3]);
    return c;
  } else {
    static_assert(kFormat == KvFormat::kNvFP4DsMla, "quantized row formats only");
    if (ch < kLatent / 8) {
      const float sf = e4m3_f32(raw[nvfp4_scale_offset(ch / (L.tile_width / 8))]);
      return e2m1x8_scaled(ld_u32(raw + 4 * ch), sf);
    }
    ld_u32x2(raw + L.rope_offset + 8 * (ch - kLatent / 8), lo, hi);  // RoPE: e4m3, unscaled
    return e4m3x8(lo, hi);
  }
}

}  // namespace smla::cuda::sm90::sparse_mla::dq
