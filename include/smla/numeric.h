// smla/numeric.h — scalar conversions of the KV row formats (DESIGN.md §3).
//
// One definition for host and device: the CPU codecs, the reference and the CUDA cache
// writers all round through these functions, so "bit-identical to the CPU encoder" holds by
// construction. All arithmetic is fp32; rounding is to nearest-even; encoders saturate to
// the format's largest finite value and never produce NaN from a finite input.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "smla/formats.h"

#ifndef SMLA_HD  // also defined, identically, by smla/formats.h
#if defined(__CUDACC__)
#define SMLA_HD __host__ __device__ __forceinline__
#else
#define SMLA_HD inline
#endif
#endif

namespace smla::num {

inline constexpr float kE4M3Max = 448.0f;
inline constexpr float kE2M1Max = 6.0f;
inline constexpr float kFP16Max = 65504.0f;

SMLA_HD uint32_t f32_bits(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  return u;
}
SMLA_HD float bits_f32(uint32_t u) {
  float x;
  memcpy(&x, &u, 4);
  return x;
}

// Rounds |x| (finite, >= 0) to the grid of a float format with `mbits` mantissa bits whose
// smallest normal exponent is `emin`, saturating at `maxv`. Scaling by powers of two is exact,
// so rintf (round-half-even) on x / quantum is the exact RNE of the format.
SMLA_HD float round_to_grid(float ax, int mbits, int emin, float maxv) {
  if (!(ax > 0.0f)) return 0.0f;
  if (ax >= maxv) return maxv;
  int ex;
  frexpf(ax, &ex);  // ax = f * 2^ex, f in [0.5, 1)
  int e = ex - 1;
  if (e < emin) e = emin;  // subnormal range: fixed quantum
  const float q = ldexpf(1.0f, e - mbits);
  const float y = rintf(ax / q) * q;
  return y > maxv ? maxv : y;
}

// ---- bf16 -------------------------------------------------------------------------------
SMLA_HD float bf16_to_f32(uint16_t b) { return bits_f32(uint32_t(b) << 16); }
SMLA_HD uint16_t f32_to_bf16(float x) {
  uint32_t u = f32_bits(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40u);  // NaN stays NaN
  const uint32_t sign = u & 0x80000000u;
  const bool was_inf = (u & 0x7fffffffu) == 0x7f800000u;
  u += 0x7fffu + ((u >> 16) & 1u);
  uint16_t r = uint16_t(u >> 16);
  if (!was_inf && (r & 0x7fffu) == 0x7f80u) r = uint16_t((sign >> 16) | 0x7f7fu);  // saturate
  return r;
}

// ---- fp16 (e5m10, bias 15) ---------------------------------------------------------------
SMLA_HD float fp16_to_f32(uint16_t h) {
  const uint32_t s = h >> 15, e = (h >> 10) & 0x1f, m = h & 0x3ff;
  float v;
  if (e == 0x1f) v = m ? NAN : INFINITY;
  else if (e == 0) v = ldexpf(float(m), -24);
  else v = ldexpf(float(m | 0x400u), int(e) - 25);
  return s ? -v : v;
}
SMLA_HD uint16_t f32_to_fp16(float x) {
  if (x != x) return 0x7e00u;
  const uint16_t s = (f32_bits(x) >> 16) & 0x8000u;
  const float y = round_to_grid(fabsf(x), 10, -14, kFP16Max);
  if (y == 0.0f) return s;
  int ex;
  frexpf(y, &ex);
  const int e = ex - 1;
  if (e < -14) return uint16_t(s | uint16_t(y * 16777216.0f));  // subnormal: y / 2^-24
  const uint32_t m = uint32_t((ldexpf(y, -e) - 1.0f) * 1024.0f);
  return uint16_t(s | uint16_t((e + 15) << 10) | m);
}

// ---- fp8 e4m3 (OCP "fn": bias 7, no inf, max 448, NaN = S.1111.111) ----------------------
SMLA_HD float e4m3_to_f32(uint8_t b) {
  const uint32_t s = b >> 7, e = (b >> 3) & 0xf, m = b & 0x7;
  float v;
  if (e == 0xf && m == 0x7) v = NAN;
  else if (e == 0) v = ldexpf(float(m), -9);
  else v = ldexpf(float(m | 0x8u), int(e) - 10);
  return s ? -v : v;
}
// NaN input maps to 0 (writers never emit NaN); +-inf saturates to +-448.
SMLA_HD uint8_t f32_to_e4m3(float x) {
  if (x != x) return 0;
  const uint8_t s = (f32_bits(x) >> 24) & 0x80u;
  const float y = round_to_grid(fabsf(x), 3, -6, kE4M3Max);
  if (y == 0.0f) return s;
  int ex;
  frexpf(y, &ex);
  const int e = ex - 1;
  if (e < -6) return uint8_t(s | uint8_t(y * 512.0f));  // subnormal: y / 2^-9
  const uint32_t m = uint32_t((ldexpf(y, -e) - 1.0f) * 8.0f);
  return uint8_t(s | uint8_t((e + 7) << 3) | m);
}

// ---- fp4 e2m1 (bias 1, values 0, .5, 1, 1.5, 2, 3, 4, 6) ---------------------------------
SMLA_HD float e2m1_to_f32(uint8_t nib) {
  const uint32_t s = (nib >> 3) & 1, e = (nib >> 1) & 3, m = nib & 1;
  const float v = e == 0 ? 0.5f * float(m) : ldexpf(1.0f + 0.5f * float(m), int(e) - 1);
  return s ? -v : v;
}
SMLA_HD uint8_t f32_to_e2m1(float x) {
  if (x != x) return 0;
  const uint8_t s = (f32_bits(x) >> 28) & 0x8u;
  const float y = round_to_grid(fabsf(x), 1, 0, kE2M1Max);
  if (y == 0.0f) return s;
  if (y < 1.0f) return uint8_t(s | 1u);  // 0.5, the only subnormal
  int ex;
  frexpf(y, &ex);
  const int e = ex - 1;
  const uint32_t m = uint32_t((ldexpf(y, -e) - 1.0f) * 2.0f);
  return uint8_t(s | uint8_t((e + 1) << 1) | m);
}

// ---- scale conventions of the writers ----------------------------------------------------
// fp8_ds_mla tile scale: max(2^ceil(log2(amax / 448)), 2^-126). A power of two, so x / s is
// exact before the e4m3 rounding and every reader reproduces the writer bit for bit.
SMLA_HD float ds_mla_tile_scale(float amax) {
  const float kMin = ldexpf(1.0f, -126);
  if (!(amax > 0.0f)) return kMin;
  const float r = amax / kE4M3Max;
  if (!(r > kMin)) return kMin;  // also when amax / 448 underflows to 0 (frexpf(0) has no exponent)
  int ex;
  const float f = frexpf(r, &ex);  // r = f * 2^ex, f in [0.5,1)
  const float s = f == 0.5f ? ldexpf(1.0f, ex - 1) : ldexpf(1.0f, ex);  // 2^ceil(log2 r)
  return s < kMin ? kMin : s;
}

// nvfp4_ds_mla block scale: e4m3(max(amax/6, 2^-9)), moved up one e4m3 step when that rounding
// landed below the target (never past 448). Returns the e4m3 byte.
SMLA_HD uint8_t nvfp4_block_scale(float amax) {
  float t = amax / kE2M1Max;
  const float kMin = ldexpf(1.0f, -9);
  if (!(t > kMin)) t = kMin;
  uint8_t b = f32_to_e4m3(t);
  if (e4m3_to_f32(b) < t && (b & 0x7f) < 0x7e) b = uint8_t(b + 1);  // next e4m3 value up
  return b;
}

// Byte offset of the e4m3 scale of 16-element latent block s (0..31) in an nvfp4_ds_mla row.
SMLA_HD int nvfp4_scale_offset(int s) { return smla::nvfp4_scale_offset(s); }  // smla/formats.h

}  // namespace smla::num
