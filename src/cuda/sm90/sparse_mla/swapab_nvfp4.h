// nvfp4_ds_mla rows on the swap-AB kernel (swapab.cuh): where a lane's bytes sit in a row, and their
// conversion to the lane's bf16 wgmma A fragments (K for S^T, V^T for O^T) with the block scale applied,
// as bit manipulation on 32-bit words. Host and device: smla_cpu_tests holds them to smla::decode_row for
// every code and scale byte (tests/cpu/test_swapab_nvfp4.cpp; docs/perf-history.md#s12-swapab-nvfp4).
//
// Units: every operand is the decoded value times 2^-120, swapab's unit for e4m3 (swab::e4m3x2_bits), so
// Q^T, its per-head power of two and the e4m3 RoPE chain are those of the fp8 rows. Exact:
//   e2m1 code -> bf16 bits of code * 2^-126 (sign, then e1 e0 m in the exponent's two low bits and the
//     mantissa's top bit; code 0.5 becomes the bf16 subnormal 2^-127);
//   e4m3 scale sf -> bf16 sf * 2^-120 (swapab's bit moves, subnormals included), times 2^126 -> sf * 2^6
//     (normal for every e4m3 >= 2^-9);
//   their bf16 product = code * sf * 2^-120: code * sf has at most 6 significant bits and is a multiple
//     of 2^-10, so the product is a multiple of 2^-130, on bf16's grid (subnormal steps 2^-133).
// The device products rely on mul.rn.bf16x2 keeping subnormal inputs and outputs (no flush; SASS HMUL2's
// default) and on wgmma reading bf16 subnormals (as the fp8 rows' conversion already does).
// NaN scale bytes (0x7f, 0xff; no writer makes them) read as 480 (finite), as swapab's e4m3 does.
#pragma once

#include <cstdint>

#include "smla/formats.h"
#include "smla/numeric.h"

namespace smla::cuda::sm90::sparse_mla::swnv {

// ---- where a lane's bytes are (row-relative byte offsets; the stage rows are 352 bytes apart).
inline constexpr int kRowBytes = 352;
inline constexpr int kRopeOffset = 256;   // 64 e4m3, unscaled
inline constexpr int kScaleOffset = 320;  // 32 e4m3 block scales, block s at 320 + 8 (s & 3) + (s >> 2)
static_assert(row_layout(KvFormat::kNvFP4DsMla).bytes == kRowBytes &&
              row_layout(KvFormat::kNvFP4DsMla).rope_offset == kRopeOffset &&
              row_layout(KvFormat::kNvFP4DsMla).scale_offset == kScaleOffset);

// S^T (swapab's K permutation): lane t (= lane % 4) owns dims [16 t, 16 t + 16) of 64-dim chunk c, the
// 16-value block 4 c + t: its e2m1 bytes (8: two words, dims 16 t + 0-7 and + 8-15), and the row's eight
// scales of the lane's blocks (chunk c at byte k_scales(t) + c), and its 16 RoPE bytes.
SMLA_HD constexpr int k_bytes(int c, int t) { return 32 * c + 8 * t; }
SMLA_HD constexpr int k_scales(int t) { return kScaleOffset + 8 * t; }
SMLA_HD constexpr int k_rope(int t) { return kRopeOffset + 16 * t; }
// Dim (0..575) of register half e of lane t's fragment register r (0: a[ks][0|1], 1: a[ks][2|3]) of
// k-step ks (0..35; chunk ks / 4, 8 = RoPE): swab::dim_of's permutation (checked against it in swapab.cuh).
SMLA_HD constexpr int k_dim(int ks, int t, int r, int e) { return 64 * (ks >> 2) + 16 * t + 4 * (ks & 3) + 2 * r + e; }

// O^T = V^T P^T (swapab's V mapping for nvfp4_ds_mla, one P^T for every m-tile): lane (w, g) of a
// warpgroup holds block v_block(w, g) = 8 w + g of each row it reads, dims 16 (8 w + g) + 4 j + 0..3 for
// m-tiles 2 j, 2 j + 1 (j = 0..3): its 8 bytes at v_bytes(w, g) (one 8-byte load; j's are bytes 2 (j % 2),
// 2 (j % 2) + 1 of word j / 2) and its one scale byte at v_scale_off(w, g) (docs/perf-history.md#s12-swapab-diet).
SMLA_HD constexpr int v_block(int w, int g) { return 8 * w + g; }
SMLA_HD constexpr int v_bytes(int w, int g) { return 8 * v_block(w, g); }
SMLA_HD constexpr int v_scale_off(int w, int g) {
  return kScaleOffset + 8 * (v_block(w, g) & 3) + (v_block(w, g) >> 2);
}
SMLA_HD constexpr int v_dim(int j, int w, int g, int d) { return 16 * v_block(w, g) + 4 * j + d; }

// ---- bit manipulation.
// prmt.b32 (default mode): byte n of the result is byte i = (sel >> 4n) & 7 of {b:a} (a = bytes 0-3), or,
// when bit 3 of that selector nibble is set, bit 7 of byte i copied into all eight bits.
SMLA_HD uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) {
#if defined(__CUDA_ARCH__)
  uint32_t r;
  asm("prmt.b32 %0, %1, %2, %3;\n" : "=r"(r) : "r"(a), "r"(b), "r"(sel));
  return r;
#else
  const uint64_t v = uint64_t(b) << 32 | a;
  uint32_t r = 0;
  for (int n = 0; n < 4; ++n) {
    const uint32_t s = (sel >> (4 * n)) & 0xfu;
    uint32_t byte = uint32_t(v >> (8 * (s & 7u))) & 0xffu;
    if (s & 8u) byte = (byte & 0x80u) ? 0xffu : 0u;
    r |= byte << (8 * n);
  }
  return r;
#endif
}
// The selector of two 16-bit halves [byte i0, its sign], [byte i1, its sign] (i: 0-3 of a, 4-7 of b).
SMLA_HD constexpr uint32_t sel2(uint32_t i0, uint32_t i1) { return i0 | (8u | i0) << 4 | i1 << 8 | (8u | i1) << 12; }

// Two codes (bits 7-4 of the bytes sel picks) -> bf16x2 of code * 2^-126. A byte's high nibble is its
// odd element; its low nibble (the even element) is bits 7-4 of the word shifted left by 4.
SMLA_HD uint32_t e2m1x2_bits(uint32_t a, uint32_t b, uint32_t sel) { return (prmt(a, b, sel) << 2) & 0x81c081c0u; }
// Two e4m3 bytes -> bf16x2 of value * 2^-120 (swab::e4m3x2_bits; never NaN or inf).
SMLA_HD uint32_t e4m3x2_bits(uint32_t a, uint32_t b, uint32_t sel) { return (prmt(a, b, sel) << 4) & 0x87f087f0u; }

// a * b lane-wise on bf16 pairs, round to nearest even (the products here are exact).
SMLA_HD uint32_t mul_bf16x2(uint32_t a, uint32_t b) {
#if defined(__CUDA_ARCH__)
  uint32_t r;
  asm("mul.rn.bf16x2 %0, %1, %2;\n" : "=r"(r) : "r"(a), "r"(b));
  return r;
#else
  const float lo = num::bits_f32(a << 16) * num::bits_f32(b << 16);
  const float hi = num::bits_f32(a & 0xffff0000u) * num::bits_f32(b & 0xffff0000u);
  return uint32_t(num::f32_to_bf16(lo)) | uint32_t(num::f32_to_bf16(hi)) << 16;
#endif
}
inline constexpr uint32_t kTwo126x2 = 0x7E807E80u;  // bf16x2 (2^126, 2^126)

// Two e4m3 block scales (the bytes sel picks) -> bf16x2 of sf * 2^6.
SMLA_HD uint32_t scale2(uint32_t a, uint32_t b, uint32_t sel) { return mul_bf16x2(e4m3x2_bits(a, b, sel), kTwo126x2); }

// S^T: the scale register of chunk c (both halves the row's scale of the lane's block 4 c + t) from the
// row's 8 scale bytes at k_scales(t) (lo: chunks 0-3, hi: 4-7).
SMLA_HD uint32_t k_scale(uint32_t lo, uint32_t hi, int c) {
  const uint32_t i = uint32_t(c & 3);
  return scale2(c < 4 ? lo : hi, 0u, sel2(i, i));
}
// S^T: one row's 8 registers of lane t for chunk c from its 8 bytes at k_bytes(c, t) (w0: bytes 0-3) and
// the chunk's scale register: r[s][0] = dims 4 s, 4 s + 1, r[s][1] = dims 4 s + 2, 4 s + 3 (of the lane's
// 16; k-step s of the chunk), i.e. a[s][0] / a[s][2] for the fragment's row g, a[s][1] / a[s][3] for g + 8.
SMLA_HD void k_chunk(uint32_t w0, uint32_t w1, uint32_t sc, uint32_t (&r)[4][2]) {
  const uint32_t l0 = w0 << 4, l1 = w1 << 4;
  // byte k of a word: dims 2k (low nibble, from the shifted word) and 2k + 1
  r[0][0] = mul_bf16x2(e2m1x2_bits(l0, w0, sel2(0, 4)), sc);
  r[0][1] = mul_bf16x2(e2m1x2_bits(l0, w0, sel2(1, 5)), sc);
  r[1][0] = mul_bf16x2(e2m1x2_bits(l0, w0, sel2(2, 6)), sc);
  r[1][1] = mul_bf16x2(e2m1x2_bits(l0, w0, sel2(3, 7)), sc);
  r[2][0] = mul_bf16x2(e2m1x2_bits(l1, w1, sel2(0, 4)), sc);
  r[2][1] = mul_bf16x2(e2m1x2_bits(l1, w1, sel2(1, 5)), sc);
  r[3][0] = mul_bf16x2(e2m1x2_bits(l1, w1, sel2(2, 6)), sc);
  r[3][1] = mul_bf16x2(e2m1x2_bits(l1, w1, sel2(3, 7)), sc);
}
// S^T: the RoPE's 4 words of lane t (bytes k_rope(t)) -> r[k][0] dims 4 k, 4 k + 1, r[k][1] dims 4 k + 2,
// 4 k + 3 of the lane's 16 RoPE dims (k-step k of the RoPE chunk), e4m3 * 2^-120.
SMLA_HD void k_rope_regs(const uint32_t (&u)[4], uint32_t (&r)[4][2]) {
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int k = 0; k < 4; ++k) {
    r[k][0] = e4m3x2_bits(u[k], u[k], sel2(0, 1));
    r[k][1] = e4m3x2_bits(u[k], u[k], sel2(2, 3));
  }
}

// O^T: the scale pair (row a, row b) of the lane's block: sa / sb = each row's scale byte (bits 0-7).
SMLA_HD uint32_t v_scale(uint32_t sa, uint32_t sb) { return scale2(sa, sb, sel2(0, 4)); }
// O^T: two rows' words j / 2 of their 8 bytes at v_bytes (wa, wb) and their scale pair -> r[d] = dim
// v_dim(j, w, g, d) of rows (a, b): a[2 j + d / 2][d % 2] (rows 2t, 2t + 1) or [2 + d % 2] (rows 2t + 8,
// 2t + 9). (wa << 4 is shared by the two j of a word.)
SMLA_HD void v_pair(uint32_t wa, uint32_t wb, int j, uint32_t sc, uint32_t (&r)[4]) {
  const uint32_t la = wa << 4, lb = wb << 4, k = 2u * uint32_t(j & 1);
  r[0] = mul_bf16x2(e2m1x2_bits(la, lb, sel2(k, 4 + k)), sc);
  r[1] = mul_bf16x2(e2m1x2_bits(wa, wb, sel2(k, 4 + k)), sc);
  r[2] = mul_bf16x2(e2m1x2_bits(la, lb, sel2(k + 1, 5 + k)), sc);
  r[3] = mul_bf16x2(e2m1x2_bits(wa, wb, sel2(k + 1, 5 + k)), sc);
}

#if defined(__CUDACC__)
// Device only: the shared-memory loads of the fragments' bytes (addresses of the shared window).
__device__ __forceinline__ void lds64(uint32_t (&v)[2], uint32_t addr) {
  asm volatile("ld.shared.v2.b32 {%0, %1}, [%2];\n" : "=r"(v[0]), "=r"(v[1]) : "r"(addr));
}
__device__ __forceinline__ uint32_t lds8(uint32_t addr) {  // zero-extended
  uint32_t v;
  asm volatile("ld.shared.u8 %0, [%1];\n" : "=r"(v) : "r"(addr));
  return v;
}
#endif

}  // namespace smla::cuda::sm90::sparse_mla::swnv
