// swapab's O^T = V^T P^T on the e4m3 tensor cores (fp8_ds_mla and fp8_e4m3 rows; swapab.cuh,
// docs/perf-history.md#s13-fp8pv): where a tile row sits on the k axis, the V^T fragments of an
// m64nNk32 .e4m3 wgmma as a byte transpose of the words swapab loads, and P's split into two e4m3
// halves. Host and device: smla_cpu_tests holds them to their definitions, exhaustively where the
// domain allows (tests/cpu/test_swapab_fp8pv.cpp).
//
// The k axis: logical tile row m = 16 w + g + 8 r (the S^T accumulator's rows of lane (w, g, t)) sits
// at k = 16 w + 2 g + r, so the two rows a lane holds are one b16 pair of P^T (one stmatrix.trans
// element). A register of the A fragment holds 4 consecutive k of one latent dim (CUTLASS's
// ALayout_64x32: a0 = (M row g, k 4 t .. 4 t + 3), a1 = (g + 8, same k), a2 / a3 the same at k + 16),
// i.e. rows 2 t, 2 t + 8, 2 t + 1, 2 t + 9 of a 16-row block: the four words swapab's bf16 path
// already loads (c = 0, 2, 1, 3 of row_of_word), so the loads and their bank pattern are unchanged.
//
// P's split: v = P * scale * F (f16x2, |v| <= 256), hi = e4m3_rn(v), lo = e4m3_rn(v - hi) with v - hi
// exact in f16: hi + lo keeps ~9 significant bits of v (bf16 keeps 8). Both go to P^T in shared
// memory (hi at k, lo at 64 + k of each head's 128-byte row) and into the same accumulator.
#pragma once

#include <cstdint>

#include "cuda/sm90/sparse_mla/swapab_nvfp4.h"  // swnv::prmt (host and device)
#include "smla/numeric.h"

namespace smla::cuda::sm90::sparse_mla::swp8 {

// Slot (row of the stage) of logical row m of a tile (swab::slot_of's definition: m = 16 s + 8 hi +
// 2 tt + e -> 16 s + 4 (e + 2 hi) + (tt + 2 e) % 4; conflict-free shared loads).
SMLA_HD constexpr int slot_of(int m) {
  const int e = m & 1, tt = (m >> 1) & 3, hi = (m >> 3) & 1;
  return (m & ~15) + 4 * (e + 2 * hi) + ((tt + 2 * e) & 3);
}
// k position (0..63) of logical tile row m in P^T (hi at k, lo at 64 + k).
SMLA_HD constexpr int k_of_row(int m) { return (m & ~15) | (m & 7) << 1 | ((m >> 3) & 1); }
// The logical row pv's word c (0..3) of k16 block kk (0..3) comes from, for lane t (= lane % 4).
SMLA_HD constexpr int row_of_word(int kk, int t, int c) { return 16 * kk + 2 * t + (c & 1) + 8 * (c >> 1); }
// The word (c) whose rows fill byte q of an A register: k = 4 t + q <-> rows 2 t, 2 t + 8, 2 t + 1, 2 t + 9.
SMLA_HD constexpr int word_of_byte(int q) { return (q & 1) << 1 | q >> 1; }

// 4 x 4 byte transpose (8 prmt): w[c] = 4 consecutive latent dims of row row_of_word(.., c);
// out[b] = dim b of the four rows in A's k order: bytes (w[0].b, w[2].b, w[1].b, w[3].b).
SMLA_HD void transpose4(const uint32_t (&w)[4], uint32_t (&out)[4]) {
  const uint32_t x0 = swnv::prmt(w[0], w[2], 0x5140u), y0 = swnv::prmt(w[1], w[3], 0x5140u);
  const uint32_t x1 = swnv::prmt(w[0], w[2], 0x7362u), y1 = swnv::prmt(w[1], w[3], 0x7362u);
  out[0] = swnv::prmt(x0, y0, 0x5410u);
  out[1] = swnv::prmt(x0, y0, 0x7632u);
  out[2] = swnv::prmt(x1, y1, 0x5410u);
  out[3] = swnv::prmt(x1, y1, 0x7632u);
}

// The A fragments of k32 step s for the 8 m-tiles from the words of k16 blocks 2 s (wd[0]) and 2 s + 1
// (wd[1]), wd[half][c][j] = the 4 bytes at latent dims dim0(j) .. + 3 of row row_of_word(2 s + half, t, c):
// m-tile 2 j + h, fragment row g + 8 r' is dim dim0(j) + 2 h + r' (swapab's P V mapping), so
// a[2 j + h][2 half + r'] = byte plane 2 h + r' of the transpose.
SMLA_HD void v_fragments(const uint32_t (&wd)[2][4][4], uint32_t (&a)[8][4]) {
#pragma unroll
  for (int j = 0; j < 4; ++j)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const uint32_t w[4] = {wd[half][0][j], wd[half][1][j], wd[half][2][j], wd[half][3][j]};
      uint32_t o[4];
      transpose4(w, o);
      a[2 * j][2 * half] = o[0];
      a[2 * j][2 * half + 1] = o[1];
      a[2 * j + 1][2 * half] = o[2];
      a[2 * j + 1][2 * half + 1] = o[3];
    }
}

// N = 32's P V, one latent tile j at a time (swapab.cuh pv8_by_tile): the A fragments of k32 step s for
// m-tiles 2 j, 2 j + 1 from the words of k16 blocks 2 s (w[0]) and 2 s + 1 (w[1]) at tile j's dims,
// w[half][c] = wd[half][c][j] of v_fragments: a[h] = v_fragments' a[2 j + h].
SMLA_HD void v_fragments_tile(const uint32_t (&w)[2][4], uint32_t (&a)[2][4]) {
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    uint32_t o[4];
    transpose4(w[half], o);
    a[0][2 * half] = o[0];
    a[0][2 * half + 1] = o[1];
    a[1][2 * half] = o[2];
    a[1][2 * half + 1] = o[3];
  }
}

// f16x2 of (lo, hi): lo in bits 0-15 (cvt.rn.f16x2.f32).
SMLA_HD uint32_t pack_f16x2(float lo, float hi) {
#if defined(__CUDA_ARCH__)
  uint32_t r;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
#else
  return uint32_t(num::f32_to_fp16(lo)) | uint32_t(num::f32_to_fp16(hi)) << 16;
#endif
}
// f16x2 product, round to nearest (mul.rn.f16x2; subnormals kept).
SMLA_HD uint32_t mul_f16x2(uint32_t a, uint32_t b) {
#if defined(__CUDA_ARCH__)
  uint32_t r;
  asm("mul.rn.f16x2 %0, %1, %2;\n" : "=r"(r) : "r"(a), "r"(b));
  return r;
#else
  uint32_t r = 0;
  for (int h = 0; h < 2; ++h) {
    const float x = num::fp16_to_f32(uint16_t(a >> (16 * h))) * num::fp16_to_f32(uint16_t(b >> (16 * h)));
    r |= uint32_t(num::f32_to_fp16(x)) << (16 * h);  // the f32 product of two f16 is exact: one rounding
  }
  return r;
#endif
}

// Two f16x2 values v0 (element 0 of each b16 pair: bits 0-15 / 16-31 -> bytes 0-1 / 2-3) -> hi and lo,
// each e4m3 x 4: hi = e4m3_rn_satfinite(v), lo = e4m3_rn_satfinite(f16(v - hi)); bytes 0-1 from v0,
// 2-3 from v1 (byte 2 e of the word = element e of its f16x2). The device's cvt / sub are the host's
// roundings: e4m3 RNE saturating at 448 (smla::num::f32_to_e4m3), f16 RNE (v - hi is exact in f16
// whenever |v| <= 448: the CPU test checks every f16).
SMLA_HD void split_e4m3x4(uint32_t v0, uint32_t v1, uint32_t& hi, uint32_t& lo) {
#if defined(__CUDA_ARCH__)
  asm("{\n.reg .b16 h0, h1, l0, l1;\n.reg .b32 b0, b1, r0, r1;\n"
      "cvt.rn.satfinite.e4m3x2.f16x2 h0, %2;\n"
      "cvt.rn.satfinite.e4m3x2.f16x2 h1, %3;\n"
      "cvt.rn.f16x2.e4m3x2 b0, h0;\n"
      "cvt.rn.f16x2.e4m3x2 b1, h1;\n"
      "sub.rn.f16x2 r0, %2, b0;\n"
      "sub.rn.f16x2 r1, %3, b1;\n"
      "cvt.rn.satfinite.e4m3x2.f16x2 l0, r0;\n"
      "cvt.rn.satfinite.e4m3x2.f16x2 l1, r1;\n"
      "mov.b32 %0, {h0, h1};\n"
      "mov.b32 %1, {l0, l1};\n}\n"
      : "=r"(hi), "=r"(lo)
      : "r"(v0), "r"(v1));
#else
  hi = lo = 0;
  const uint32_t v[2] = {v0, v1};
  for (int k = 0; k < 4; ++k) {
    const float x = num::fp16_to_f32(uint16_t(v[k >> 1] >> (16 * (k & 1))));
    const uint8_t h = num::f32_to_e4m3(x);
    const float r = num::fp16_to_f32(num::f32_to_fp16(x - num::e4m3_to_f32(h)));  // (x - hi exact in f32)
    hi |= uint32_t(h) << (8 * k);
    lo |= uint32_t(num::f32_to_e4m3(r)) << (8 * k);
  }
#endif
}

// The power of two F = 2^(7 - floor(log2 m)) that puts P * scale * F under 256 for every scale of
// magnitude <= m (P <= 1), from m's float bits (a max of positive floats' bits), and its inverse; the
// exponent clamped so both are normal floats (m below 2^-119: F = 2^126, products below 2^7).
SMLA_HD void tile_factor(uint32_t max_bits, float& f, float& inv_f) {
  uint32_t e = max_bits & 0x7f800000u;  // 2^floor(log2 m) (NaN / inf: exponent 255)
  e = e < (8u << 23) ? 8u << 23 : e;
  const uint32_t inv = e - (7u << 23);  // 2^(floor(log2 m) - 7), normal
  inv_f = num::bits_f32(inv);
  f = num::bits_f32((254u << 23) - inv);  // its exact inverse
}

}  // namespace smla::cuda::sm90::sparse_mla::swp8
