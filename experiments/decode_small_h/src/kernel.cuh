// SM90 small-head decode kernel for fp8_ds_mla rows and a bf16 q (H <= 32). The design and its
// bound: docs/perf-decode.md. In short, per block (one token, one split of its top-k):
// - all 256 threads gather the raw 656-byte rows of a 32-entry tile with cp.async into a ring of
//   kStages stages (kStages - 1 tiles in flight), row ids read two tiles ahead;
// - warp w owns latent dims [64 w, 64 w + 64) (one half of latent tile w / 2) and RoPE dims
//   [8 w, 8 w + 8); it holds Q for those dims in registers (bf16, times a per-head power of two)
//   and its part of O;
// - S: each warp reads its 64 raw bytes of every row straight into mma.sync B fragments, turns
//   e4m3 into bf16 by bit moves (the bf16 then holds value * 2^-120), multiplies its partial scores
//   by the row's tile scale, adds the RoPE product (q's RoPE scaled to match), and writes them to
//   shared memory;
// - the partial scores are summed (every thread: one head, 2 or 4 rows), the online softmax runs
//   there, and P is written four times, once per latent tile, times each row's scale * 2^56;
// - O += P V: each warp reads its 64 raw bytes of every row again, interleaves two rows per
//   register (the MMA's reduction runs over rows) and converts by the same bit moves.
// (kF16K converts K instead by cvt.rn.f16x2.e4m3x2 against an f16 q.) Two barriers per tile; at
// H <= 16 the ring can also run pipelined with one barrier per tile, or as two 8-warp teams per
// block on alternate tiles (kRing, params.h). Nothing is dequantized into shared memory; no row byte is read twice
// from DRAM. Range: q is scaled per head by a power of two (any finite bf16 q); tile scales up to
// 2^71 (P carries scale * 2^56 in bf16). Invalid entries are never dereferenced: their slot keeps stale bytes, which the
// bit-move conversion turns into finite values, and their scores and P are selected away (not
// multiplied away: a stale scale may be NaN).
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "cuda/common/ptx.cuh"
#include "decode_small_h/src/params.h"

namespace smla::cuda::sm90::decode {

namespace detail {

// Two e4m3 bytes placed by `sel` as (byte, sign-replicated byte) in each 16-bit half -> bf16x2 whose
// values are the e4m3 values times 2^-120 (exact, subnormals included; never NaN or inf).
template <uint32_t kSel>
__device__ __forceinline__ uint32_t e4m3x2_to_bf16x2_scaled(uint32_t a, uint32_t b) {
  uint32_t r;
  asm("prmt.b32 %0, %1, %2, %3;\n" : "=r"(r) : "r"(a), "r"(b), "n"(kSel));
  return (r << 4) & 0x87f087f0u;
}

__device__ __forceinline__ void mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void mma_f16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Bytes 0, 1 (kHi = false) or 2, 3 of w, two e4m3 values, as an f16x2 (exact).
template <bool kHi>
__device__ __forceinline__ uint32_t e4m3x2_to_f16x2(uint32_t w) {
  uint32_t r;
  const uint16_t h = kHi ? uint16_t(w >> 16) : uint16_t(w);
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;\n" : "=r"(r) : "h"(h));
  return r;
}

__device__ __forceinline__ uint32_t pack_f16(float lo, float hi) {
  const __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

__device__ __forceinline__ uint32_t lds32(uint32_t addr) {
  uint32_t v;
  asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(v) : "r"(addr));
  return v;
}
__device__ __forceinline__ uint2 lds64(uint32_t addr) {
  uint2 v;
  asm volatile("ld.shared.v2.b32 {%0, %1}, [%2];\n" : "=r"(v.x), "=r"(v.y) : "r"(addr));
  return v;
}
__device__ __forceinline__ uint4 lds128(uint32_t addr) {
  uint4 v;
  asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr));
  return v;
}
__device__ __forceinline__ float4 lds128f(uint32_t addr) {
  float4 v;
  asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];\n" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(addr));
  return v;
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// Two consecutive bf16 of q at element offset `off` (even) as one word.
__device__ __forceinline__ uint32_t load_q_raw(const uint16_t* base, int64_t off, bool vec) {
  return vec ? *reinterpret_cast<const uint32_t*>(base + off) : (uint32_t(base[off]) | (uint32_t(base[off + 1]) << 16));
}
__device__ __forceinline__ float bf16_lo(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf16_hi(uint32_t w) { return __uint_as_float(w & 0xffff0000u); }
__device__ __forceinline__ float bf16x2_amax(uint32_t w) { return fmaxf(fabsf(bf16_lo(w)), fabsf(bf16_hi(w))); }
// bf16x2 times a power of two (exact unless out of bf16's range).
__device__ __forceinline__ uint32_t bf16x2_times(uint32_t w, float mul) {
  return pack_bf16(bf16_lo(w) * mul, bf16_hi(w) * mul);
}
__device__ __forceinline__ uint32_t bf16x2_to_f16x2_times(uint32_t w, float mul) {
  return pack_f16(bf16_lo(w) * mul, bf16_hi(w) * mul);
}
// The exponent e in [lo, hi] that takes a head's largest |q| (amax) into [2^target, 2^(target + 1)).
__device__ __forceinline__ int q_exponent(float amax, int target, int lo, int hi) {
  if (!(amax > 0.0f) || !(amax < INFINITY)) return min(max(target, lo), hi);
  return min(max(target - ilogbf(amax), lo), hi);
}

}  // namespace detail

// One block's work, split into its phases. Lane (g, q4) = (lane / 4, lane % 4), the MMA fragment
// coordinates. kF16K: K's latent part converted by cvt.rn.f16x2.e4m3x2 (one instruction per 2
// values; q in f16 under a per-head power-of-two scale, latent products on the f16 MMA) instead
// of the bit moves into bf16 (three instructions per 2 values). V always uses the bit moves.
template <int kMT, bool kF16K, int kRing>
struct DecodeBlock {
  using Cfg = DecodeConfig<kMT, kRing>;
  using Smem = typename Cfg::SharedStorage;
  static constexpr int kStages = Cfg::kStages;
  static constexpr int kHeads = Cfg::kHeads;
  static constexpr int kTeams = Cfg::kTeams;
  static constexpr float k2p56 = 72057594037927936.0f;    // 2^56
  static constexpr float k2p64 = 18446744073709551616.0f;  // 2^64

  const DecodeParams& p;
  Smem& sh;
  const int team, tid, warp, lane, g, q4;  // tid, warp: within the team (the block when kTeams = 1)
  int64_t t;
  int split, h0, begin, end, num_tiles;  // h0: the block's first head
  const int32_t* idx_row;
  uint32_t ring0, p0;

  __device__ __forceinline__ DecodeBlock(const DecodeParams& params, Smem& smem)
      : p(params), sh(smem), team(threadIdx.x / kThreads), tid(threadIdx.x % kThreads),
        warp((threadIdx.x % kThreads) >> 5), lane(threadIdx.x & 31), g((threadIdx.x & 31) >> 2),
        q4(threadIdx.x & 3) {
    const int64_t ts = blockIdx.x / p.head_groups;  // t * num_splits + split
    h0 = int(blockIdx.x - ts * p.head_groups) * kHeads;
    t = ts / p.num_splits;
    split = int(ts - t * p.num_splits);
    int n_t = p.topk;
    if (p.counts != nullptr) n_t = min(max(p.counts[t], 0), p.topk);
    begin = split * p.split_len;
    end = min(n_t, begin + p.split_len);
    num_tiles = end > begin ? (end - begin + kRows - 1) / kRows : 0;
    idx_row = p.idx + t * p.idx_stride_t;
    ring0 = ptx::smem_addr(&sh.ring[0][0]);
    p0 = ptx::smem_addr(&sh.p[0][0][0][0]);
  }

  __device__ __forceinline__ uint32_t stage_addr(int tile) const {
    return ring0 + uint32_t((tile % kStages) * kRows * kRowBytes);
  }
  // The barrier over the threads that share the exchange arrays: the block, or the team.
  __device__ __forceinline__ void team_sync() const {
    if constexpr (kTeams == 1) __syncthreads();
    else ptx::named_sync(1 + team, kThreads);
  }

  // ---- the gather: thread tid copies chunks (tid & 7) + 8 i of tile row tid >> 3.
  // The row id of this thread's entry of `tile` (-1: skipped, never dereferenced).
  __device__ __forceinline__ int load_id(int tile) const {
    const int e = begin + tile * kRows + (tid >> 3);
    if (tile >= num_tiles || e >= end) return -1;
    const int v = idx_row[e];
    return v >= 0 && int64_t(v) < p.num_rows ? v : -1;
  }
  // Copies row `row_id` into its slot of `tile`'s stage; always commits a group (uniform counts).
  __device__ __forceinline__ void issue(int tile, int row_id) {
    const int ld_row = tid >> 3, ld_sub = tid & 7;
    if (tile < num_tiles) {
      const int stage = tile % kStages;
      if (ld_sub == 0) sh.valid[stage][ld_row] = row_id >= 0;
      if (row_id >= 0 && p.mode != 2) {
        const uint8_t* src = p.kv + int64_t(row_id) * p.kv_row_stride_bytes + 16 * ld_sub;
        const uint32_t dst = stage_addr(tile) + uint32_t(ld_row * kRowBytes + 16 * ld_sub);
#pragma unroll
        for (int i = 0; i < (kRowBytes / 16 + 7) / 8; ++i)  // chunk ld_sub + 8 i: immediate offsets
          if (ld_sub + 8 * i < p.row_chunks) ptx::cp_async_16(dst + 128 * i, src + 128 * i);
      }
    }
    ptx::cp_async_commit();
  }

  // ---- Q fragments (A operands, heads as rows), rQ [kMT][k-step 4][4 regs], rQr [kMT][2]: k-step
  // s of the latent covers, for lane (g, q4), dims 64 w + 16 q4 + 4 s + {0, 1} (k = 2 q4, 2 q4 + 1)
  // and + {2, 3} (k = 2 q4 + 8, + 9). RoPE: k = 2 q4, 2 q4 + 1 <-> RoPE dims 8 w + 2 q4 + {0, 1};
  // k >= 8 unused (zero). Loaded raw (bf16 pairs), then scaled per head by a power of two 2^e_h
  // (exact) that takes the head's largest |q| into [2^64, 2^65) for the bit moves (K = value *
  // 2^-120: a warp's partial score is 2^(e_h - 120) (q . k), RoPE q times 2^(e_h - 120) to match)
  // or into [2^14, 2^15) for f16 K (f16 keeps every bf16 q exactly; partial score 2^e_h (q . k)),
  // clamped for extreme q. Returns the factor that turns the reducing thread's partial sums into
  // log2-domain scores.
  __device__ __forceinline__ float load_q(uint32_t (&rQ)[kMT][4][4], uint32_t (&rQr)[kMT][2]) {
    const uint16_t* qt = p.q + t * p.q_stride_t;
    const uint16_t* qrt = p.q_rope != nullptr ? p.q_rope + t * p.q_rope_stride_t : qt + 512;
    const int64_t qr_sh = p.q_rope != nullptr ? p.q_rope_stride_h : p.q_stride_h;
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int h = h0 + mt * 16 + g + 8 * half;
        const bool live = h < p.num_heads;
        const uint16_t* qh = qt + int64_t(h) * p.q_stride_h;
#pragma unroll
        for (int s = 0; s < 4; ++s) {
          const int d0 = 64 * warp + 16 * q4 + 4 * s;
          rQ[mt][s][half] = live ? detail::load_q_raw(qh, d0, p.q_vec) : 0u;
          rQ[mt][s][2 + half] = live ? detail::load_q_raw(qh, d0 + 2, p.q_vec) : 0u;
        }
        rQr[mt][half] = live && p.rope ? detail::load_q_raw(qrt + int64_t(h) * qr_sh, 8 * warp + 2 * q4, p.q_vec) : 0u;
      }
    }
    // Each head's largest |q| over the latent and RoPE, across the 8 warps.
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        float a = detail::bf16x2_amax(rQr[mt][half]);
#pragma unroll
        for (int s = 0; s < 4; ++s)
          a = fmaxf(a, fmaxf(detail::bf16x2_amax(rQ[mt][s][half]), detail::bf16x2_amax(rQ[mt][s][2 + half])));
        a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, 1));
        a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, 2));
        if (q4 == 0) sh.qmax[team][warp][mt * 16 + g + 8 * half] = a;
      }
    __syncthreads();
    auto head_exp = [&](int h) {
      float a = 0.0f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) a = fmaxf(a, sh.qmax[team][w][h]);
      return kF16K ? detail::q_exponent(a, 14, -126, 126) : detail::q_exponent(a, 64, 0, 126);
    };
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int e = head_exp(mt * 16 + g + 8 * half);
        const float mul = ldexpf(1.0f, e);
#pragma unroll
        for (int s = 0; s < 4; ++s) {
          if constexpr (kF16K) {
            rQ[mt][s][half] = detail::bf16x2_to_f16x2_times(rQ[mt][s][half], mul);
            rQ[mt][s][2 + half] = detail::bf16x2_to_f16x2_times(rQ[mt][s][2 + half], mul);
          } else {
            rQ[mt][s][half] = detail::bf16x2_times(rQ[mt][s][half], mul);
            rQ[mt][s][2 + half] = detail::bf16x2_times(rQ[mt][s][2 + half], mul);
          }
        }
        rQr[mt][half] = detail::bf16x2_times(rQr[mt][half], ldexpf(1.0f, kF16K ? e : e - 120));
      }
    const int e = head_exp(rd_head());
    return ldexpf(p.scale_log2, kF16K ? -e : 120 - e);
  }

  // ---- S over this warp's dims for the tile in stage `st`, to sh.red [warp][head][row]. n-tile nt
  // covers tile rows 8 nt + sigma(n), sigma = 0 4 1 5 2 6 3 7, so the two rows of one quarter-warp's
  // 16-byte loads are 64 bytes apart modulo 128 (no bank conflict with the 656-byte pitch); the
  // accumulator rS [kMT][nt][4] then holds, for lane (g, q4), tile rows 8 nt + q4 and 8 nt + q4 + 4.
  __device__ __forceinline__ void score(uint32_t st, int bi, const uint32_t (&rQ)[kMT][4][4],
                                        const uint32_t (&rQr)[kMT][2]) {
    float rS[kMT][4][4];
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) rS[mt][nt][0] = rS[mt][nt][1] = rS[mt][nt][2] = rS[mt][nt][3] = 0.0f;
    const int my_row = (g >> 1) + 4 * (g & 1);  // sigma(g)
#pragma unroll
    for (int nt = 0; nt < 4; ++nt) {
      const uint4 kb = detail::lds128(st + uint32_t((8 * nt + my_row) * kRowBytes + 64 * warp + 16 * q4));
      const uint32_t w4[4] = {kb.x, kb.y, kb.z, kb.w};
#pragma unroll
      for (int s = 0; s < 4; ++s) {
        if constexpr (kF16K) {
          const uint32_t b0 = detail::e4m3x2_to_f16x2<false>(w4[s]);
          const uint32_t b1 = detail::e4m3x2_to_f16x2<true>(w4[s]);
#pragma unroll
          for (int mt = 0; mt < kMT; ++mt) detail::mma_f16(rS[mt][nt], rQ[mt][s], b0, b1);
        } else {
          const uint32_t b0 = detail::e4m3x2_to_bf16x2_scaled<0x9180>(w4[s], 0u);
          const uint32_t b1 = detail::e4m3x2_to_bf16x2_scaled<0xB3A2>(w4[s], 0u);
#pragma unroll
          for (int mt = 0; mt < kMT; ++mt) detail::mma_bf16(rS[mt][nt], rQ[mt][s], b0, b1);
        }
      }
    }
    // Each row's scale of latent tile w / 2 (fp32 as stored).
#pragma unroll
    for (int nt = 0; nt < 4; ++nt) {
      const uint32_t r0 = st + uint32_t((8 * nt + q4) * kRowBytes + kScaleOffset + 4 * (warp >> 1));
      const float s0 = __uint_as_float(detail::lds32(r0));
      const float s1 = __uint_as_float(detail::lds32(r0 + 4 * kRowBytes));
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) rS[mt][nt][0] *= s0, rS[mt][nt][1] *= s1, rS[mt][nt][2] *= s0, rS[mt][nt][3] *= s1;
      // The even warp of each latent tile also lays the scales out by tile for the reduction (its
      // 16-byte reads of 4 rows' scales in the row pitch would hit the same banks 4 ways).
      if ((warp & 1) == 0 && g == 0) sh.scl[bi][warp >> 1][8 * nt + q4] = s0, sh.scl[bi][warp >> 1][8 * nt + q4 + 4] = s1;
    }
    if (p.rope) {
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) {
        const uint32_t b0 =
            detail::lds32(st + uint32_t((8 * nt + my_row) * kRowBytes + kRopeOffset + 2 * (8 * warp + 2 * q4)));
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          const uint32_t a[4] = {rQr[mt][0], rQr[mt][1], 0u, 0u};
          detail::mma_bf16(rS[mt][nt], a, b0, 0u);
        }
      }
    }
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) {
        float* r_lo = &sh.red[bi][warp][mt * 16 + g][8 * nt + q4];
        float* r_hi = &sh.red[bi][warp][mt * 16 + g + 8][8 * nt + q4];
        r_lo[0] = rS[mt][nt][0], r_lo[4] = rS[mt][nt][1];
        r_hi[0] = rS[mt][nt][2], r_hi[4] = rS[mt][nt][3];
      }
  }

  // ---- the reduction: every thread takes head tid / kRedLanes and the kRedCols tile rows from
  // kRedCols (tid % kRedLanes) (H <= 16: 2 rows, 16 lanes per head; H <= 32: 4 rows, 8 lanes). It
  // sums the 8 partial scores, masks invalid entries by selection (a stale slot's bytes may decode
  // to anything), runs the online softmax (log2 domain: m_run, l_run) and writes P four times, once
  // per latent tile i, times each row's scale of tile i and 2^56 (V's bf16 holds value * 2^-120).
  static constexpr int kRedCols = kRows * kHeads / kThreads;
  static constexpr int kRedLanes = kRows / kRedCols;
  static_assert(kRedCols == 2 || kRedCols == 4, "two or four rows per reducing thread");
  __device__ __forceinline__ int rd_head() const { return tid / kRedLanes; }
  __device__ __forceinline__ void softmax(int tile, int bi, float scale, float& m_run, float& l_run) {
    const int head = rd_head(), col = kRedCols * (tid % kRedLanes);
    const float* red = &sh.red[bi][0][head][col];
    float s[kRedCols];
#pragma unroll
    for (int i = 0; i < kRedCols; ++i) s[i] = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const float* r = red + w * kHeads * kRedStride;
      if constexpr (kRedCols == 4) {
        const float4 u = *reinterpret_cast<const float4*>(r);
        s[0] += u.x, s[1] += u.y, s[2] += u.z, s[3] += u.w;
      } else {
        const float2 u = *reinterpret_cast<const float2*>(r);
        s[0] += u.x, s[1] += u.y;
      }
    }
    // The rows' valid flags, one byte each, in one load.
    const uint32_t vbits = kRedCols == 4 ? *reinterpret_cast<const uint32_t*>(&sh.valid[tile % kStages][col])
                                         : *reinterpret_cast<const uint16_t*>(&sh.valid[tile % kStages][col]);
    bool ok[kRedCols];
    float tmax = -INFINITY;
#pragma unroll
    for (int i = 0; i < kRedCols; ++i) {
      ok[i] = ((vbits >> (8 * i)) & 0xffu) != 0u;
      s[i] = ok[i] ? s[i] * scale : -INFINITY;
      tmax = fmaxf(tmax, s[i]);
    }
#pragma unroll
    for (int o = 1; o < kRedLanes; o <<= 1) tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, o));
    const float m_new = fmaxf(m_run, tmax);
    const float m_use = m_new == -INFINITY ? 0.0f : m_new;
    const float alpha = ptx::fast_exp2(m_run - m_use);  // m_run = -inf: 0
    float pr[kRedCols], sum = 0.0f;
#pragma unroll
    for (int i = 0; i < kRedCols; ++i) {
      pr[i] = ok[i] ? ptx::fast_exp2(s[i] - m_use) : 0.0f;
      sum += pr[i];
      pr[i] *= k2p56;
    }
    l_run = l_run * alpha + sum;
    m_run = m_new;
    if (tid % kRedLanes == 0) sh.alpha[bi][head] = alpha;
#pragma unroll
    for (int lt = 0; lt < 4; ++lt) {
      float sc[kRedCols];  // rows col + {0 .. kRedCols - 1}
      if constexpr (kRedCols == 4) {
        const float4 v = *reinterpret_cast<const float4*>(&sh.scl[bi][lt][col]);
        sc[0] = v.x, sc[1] = v.y, sc[2] = v.z, sc[3] = v.w;
      } else {
        const float2 v = *reinterpret_cast<const float2*>(&sh.scl[bi][lt][col]);
        sc[0] = v.x, sc[1] = v.y;
      }
      float x[kRedCols];
#pragma unroll
      for (int i = 0; i < kRedCols; ++i) x[i] = ok[i] ? pr[i] * sc[i] : 0.0f;
      uint16_t* dst = &sh.p[bi][lt][head][col];
      if constexpr (kRedCols == 4) {
        *reinterpret_cast<uint2*>(dst) = make_uint2(detail::pack_bf16(x[0], x[1]), detail::pack_bf16(x[2], x[3]));
      } else {
        *reinterpret_cast<uint32_t*>(dst) = detail::pack_bf16(x[0], x[1]);
      }
    }
  }

  // ---- rO = alpha rO + P V over this warp's dims; rO [kMT][n-tile e][4]: lane (g, q4) holds output
  // dims 64 w + 16 q4 + e (col 2 q4) and 64 w + 16 q4 + 8 + e (col 2 q4 + 1), heads g and g + 8.
  // V's B fragment pairs two rows (the reduction runs over rows): rows r, r + 1, r + 8, r + 9 of
  // 8 dims each per lane, interleaved by the prmt of the bit moves.
  __device__ __forceinline__ void accumulate(uint32_t st, int bi, float (&rO)[kMT][8][4]) {
    float a_lo[kMT], a_hi[kMT];
    bool moved = false;
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
      a_lo[mt] = sh.alpha[bi][mt * 16 + g], a_hi[mt] = sh.alpha[bi][mt * 16 + g + 8];
      moved |= a_lo[mt] != 1.0f || a_hi[mt] != 1.0f;
    }
    if (__any_sync(0xffffffffu, moved)) {  // rare after the first tiles: skip the 32 multiplies
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
        for (int e = 0; e < 8; ++e)
          rO[mt][e][0] *= a_lo[mt], rO[mt][e][1] *= a_lo[mt], rO[mt][e][2] *= a_hi[mt], rO[mt][e][3] *= a_hi[mt];
    }
    const uint32_t pw = p0 + uint32_t(((bi * 4 + (warp >> 1)) * kHeads * kPStride) * 2);
    const uint32_t vcol = st + 64 * warp + 8 * g;
#pragma unroll
    for (int ks = 0; ks < kRows / 16; ++ks) {
      uint32_t a[kMT][4];
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
        const uint32_t base = pw + uint32_t(((mt * 16 + g) * kPStride + ks * 16 + 2 * q4) * 2);
        a[mt][0] = detail::lds32(base);
        a[mt][1] = detail::lds32(base + 8 * kPStride * 2);
        a[mt][2] = detail::lds32(base + 16);
        a[mt][3] = detail::lds32(base + 8 * kPStride * 2 + 16);
      }
      const int r0 = ks * 16 + 2 * q4;
      const uint2 v0 = detail::lds64(vcol + uint32_t(r0 * kRowBytes));
      const uint2 v1 = detail::lds64(vcol + uint32_t((r0 + 1) * kRowBytes));
      const uint2 v2 = detail::lds64(vcol + uint32_t((r0 + 8) * kRowBytes));
      const uint2 v3 = detail::lds64(vcol + uint32_t((r0 + 9) * kRowBytes));
      pv_ntile<0, 0xC480>(a, v0.x, v1.x, v2.x, v3.x, rO);
      pv_ntile<1, 0xD591>(a, v0.x, v1.x, v2.x, v3.x, rO);
      pv_ntile<2, 0xE6A2>(a, v0.x, v1.x, v2.x, v3.x, rO);
      pv_ntile<3, 0xF7B3>(a, v0.x, v1.x, v2.x, v3.x, rO);
      pv_ntile<4, 0xC480>(a, v0.y, v1.y, v2.y, v3.y, rO);
      pv_ntile<5, 0xD591>(a, v0.y, v1.y, v2.y, v3.y, rO);
      pv_ntile<6, 0xE6A2>(a, v0.y, v1.y, v2.y, v3.y, rO);
      pv_ntile<7, 0xF7B3>(a, v0.y, v1.y, v2.y, v3.y, rO);
    }
  }
  // n-tile kE: byte kE % 4 of each row's word (kSel picks it, with its sign copy, from two rows).
  template <int kE, uint32_t kSel>
  __device__ __forceinline__ static void pv_ntile(const uint32_t (&a)[kMT][4], uint32_t w0, uint32_t w1, uint32_t w2,
                                                  uint32_t w3, float (&rO)[kMT][8][4]) {
    const uint32_t b0 = detail::e4m3x2_to_bf16x2_scaled<kSel>(w0, w1);
    const uint32_t b1 = detail::e4m3x2_to_bf16x2_scaled<kSel>(w2, w3);
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) detail::mma_bf16(rO[mt][kE], a[mt], b0, b1);
  }

  // ---- out (or this split's normalized part and LSE) from rO, the row sums and maxima.
  // With two teams, team 1 hands its O over through the ring and team 0 merges the two partial
  // softmaxes (max, sum, O) before writing. Call after every copy into the ring has landed.
  __device__ __forceinline__ void finish(float (&rO)[kMT][8][4], float m_run, float l_run) {
    {
      float l = l_run;
#pragma unroll
      for (int o = 1; o < kRedLanes; o <<= 1) l += __shfl_xor_sync(0xffffffffu, l, o);
      if (tid % kRedLanes == 0) sh.l_fin[team][rd_head()] = l, sh.m_fin[team][rd_head()] = m_run;
    }
    float4* obuf = reinterpret_cast<float4*>(&sh.ring[0][0]);  // [kMT * 8][kThreads] of team 1's O
    if constexpr (kTeams == 2) {
      __syncthreads();  // both teams are done with the ring
      if (team == 1) {
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
          for (int e = 0; e < 8; ++e)
            obuf[(mt * 8 + e) * kThreads + tid] = make_float4(rO[mt][e][0], rO[mt][e][1], rO[mt][e][2], rO[mt][e][3]);
      }
    }
    __syncthreads();
    if (team != 0) return;
    constexpr float kLn2 = 0.6931471805599453f;
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int h = mt * 16 + g + 8 * half;
        float l = sh.l_fin[0][h], m = sh.m_fin[0][h];
        if constexpr (kTeams == 2) {  // team 0's half of the rows and team 1's, relative to their max
          const float l1 = sh.l_fin[1][h], m1 = sh.m_fin[1][h];
          const float mm = fmaxf(m, m1);
          const float f0 = m == -INFINITY ? 0.0f : exp2f(m - mm), f1 = m1 == -INFINITY ? 0.0f : exp2f(m1 - mm);
#pragma unroll
          for (int e = 0; e < 8; ++e) {
            const float4 o1 = obuf[(mt * 8 + e) * kThreads + tid];
            const float a = half ? o1.z : o1.x, b = half ? o1.w : o1.y;
            rO[mt][e][2 * half] = rO[mt][e][2 * half] * f0 + a * f1;
            rO[mt][e][2 * half + 1] = rO[mt][e][2 * half + 1] * f0 + b * f1;
          }
          l = l * f0 + l1 * f1;
          m = mm;
        }
        const int hg = h0 + h;  // the head in q / out / lse / sink
        if (hg >= p.num_heads) continue;
        const int d0 = 64 * warp + 16 * q4;
        if (p.num_splits == 1) {
          float denom = l;
          if (p.sink != nullptr && l > 0.0f) denom += exp2f(p.sink[hg] * 1.4426950408889634f - m);
          const float inv = l > 0.0f ? k2p64 / denom : 0.0f;
          uint32_t w[8];
#pragma unroll
          for (int e = 0; e < 8; e += 2) {
            w[e / 2] = detail::pack_bf16(rO[mt][e][2 * half] * inv, rO[mt][e + 1][2 * half] * inv);
            w[4 + e / 2] = detail::pack_bf16(rO[mt][e][2 * half + 1] * inv, rO[mt][e + 1][2 * half + 1] * inv);
          }
          uint16_t* dst = p.out + t * p.out_stride_t + int64_t(hg) * p.out_stride_h + d0;
          if (p.out_vec) {
            reinterpret_cast<uint4*>(dst)[0] = make_uint4(w[0], w[1], w[2], w[3]);
            reinterpret_cast<uint4*>(dst)[1] = make_uint4(w[4], w[5], w[6], w[7]);
          } else {
#pragma unroll
            for (int i = 0; i < 8; ++i) dst[2 * i] = uint16_t(w[i]), dst[2 * i + 1] = uint16_t(w[i] >> 16);
          }
          if (p.lse != nullptr && warp == 0 && q4 == 0) {
            const float lse2 = l > 0.0f ? m + log2f(l) : -INFINITY;
            p.lse[t * p.lse_stride_t + hg] = p.lse_base2 ? lse2 : lse2 * kLn2;
          }
        } else {
          const float inv = l > 0.0f ? k2p64 / l : 0.0f;
          // bf16 partials, the library's split-K layout (smla/workspace.h) read by its merge
          uint2* d2 = reinterpret_cast<uint2*>(p.part_out + ((t * p.num_heads + hg) * p.num_splits + split) * 512 + d0);
#pragma unroll
          for (int j = 0; j < 4; ++j) {  // dims d0 + 4 j .. + 3: n-tiles 4 (j & 1) .., column 2 q4 + (j >> 1)
            const int e = 4 * (j & 1), c = 2 * half + (j >> 1);
            d2[j] = make_uint2(ptx::Bf16::pack(rO[mt][e][c] * inv, rO[mt][e + 1][c] * inv),
                               ptx::Bf16::pack(rO[mt][e + 2][c] * inv, rO[mt][e + 3][c] * inv));
          }
          if (warp == 0 && q4 == 0)
            p.part_lse[(t * p.num_heads + hg) * p.num_splits + split] = l > 0.0f ? (m + log2f(l)) * kLn2 : -INFINITY;
        }
      }
    }
  }
};

template <int kMT, bool kF16K, int kRing>
__global__ void __launch_bounds__(DecodeConfig<kMT, kRing>::kBlockThreads, DecodeConfig<kMT, kRing>::kBlocksPerSm)
    decode_fp8_ds_mla_kernel(const __grid_constant__ DecodeParams p) {
  using Block = DecodeBlock<kMT, kF16K, kRing>;
  constexpr int kStages = Block::kStages;
  constexpr int kTeams = Block::kTeams;
  constexpr int kLocal = kStages / kTeams;  // stages of this team's tiles
  extern __shared__ __align__(128) uint8_t smem_raw[];
  Block b(p, *reinterpret_cast<typename Block::Smem*>(smem_raw));
  // The team's j-th tile (every tile with one team).
  auto G = [&](int j) { return j * kTeams + b.team; };
  const int n = b.num_tiles;
  const int n_team = (n - b.team + kTeams - 1) / kTeams;

  // The team's tiles 0 .. kLocal - 2 in flight. Row ids are read two tiles ahead of their copies
  // (a tile takes ~1-2 us, about one loaded DRAM latency); the prologue's are all read at once.
  int ids[kLocal + 1];
#pragma unroll
  for (int s = 0; s <= kLocal; ++s) ids[s] = b.load_id(G(s));
#pragma unroll
  for (int s = 0; s < kLocal - 1; ++s) b.issue(G(s), ids[s]);
  int next_id = ids[kLocal - 1], next2_id = ids[kLocal];
  uint32_t rQ[kMT][4][4], rQr[kMT][2];
  const float scale = b.load_q(rQ, rQr);
  float rO[kMT][8][4];
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
    for (int e = 0; e < 8; ++e) rO[mt][e][0] = rO[mt][e][1] = rO[mt][e][2] = rO[mt][e][3] = 0.0f;
  float m_run = -INFINITY, l_run = 0.0f;  // this thread's head in the reduction

  const bool compute = p.mode != 1;
  if constexpr (kRing != 1) {
    // Per tile of the team: scores | barrier | gather, softmax | barrier | P V.
    const int bi = kTeams == 2 ? b.team : 0;
    ptx::cp_async_wait<kLocal - 2>();
    b.team_sync();
#pragma unroll 1
    for (int j = 0; j < n_team; ++j) {
      const uint32_t st = b.stage_addr(G(j));
      if (compute) b.score(st, bi, rQ, rQr);
      b.team_sync();  // partial scores written; every warp is past the P V of the team's tile j - 1
      b.issue(G(j + kLocal - 1), next_id);  // into the stage of tile j - 1, free now
      next_id = next2_id;
      next2_id = b.load_id(G(j + kLocal + 1));
      if (compute) b.softmax(G(j), bi, scale, m_run, l_run);
      ptx::cp_async_wait<kLocal - 2>();  // tile j + 1 landed (this thread's copies)
      b.team_sync();                     // P, alpha and tile j + 1 visible to every warp of the team
      if (compute) b.accumulate(st, bi, rO);
    }
  } else {
    // Phase t: scores of t + 1, softmax of t, P V of t - 1 (exchange buffers alternate by tile) |
    // barrier | gather t + kStages - 1 into the stage of t - 1. Tiles t + 2 .. t + kStages - 2 are
    // in flight during phase t.
    ptx::cp_async_wait<kStages - 2>();  // tile 0
    __syncthreads();
    if (compute && n > 0) b.score(b.stage_addr(0), 0, rQ, rQr);
    ptx::cp_async_wait<kStages - 3>();  // tile 1
    __syncthreads();
#pragma unroll 1
    for (int tile = 0; tile <= n; ++tile) {
      if (compute) {
        if (tile + 1 < n) b.score(b.stage_addr(tile + 1), (tile + 1) & 1, rQ, rQr);
        if (tile < n) b.softmax(tile, tile & 1, scale, m_run, l_run);
        if (tile >= 1) b.accumulate(b.stage_addr(tile - 1), (tile - 1) & 1, rO);
      }
      ptx::cp_async_wait<kStages - 4>();  // tile + 2 landed (this thread's copies)
      __syncthreads();
      b.issue(tile + kStages - 1, next_id);
      next_id = next2_id;
      next2_id = b.load_id(tile + kStages + 1);
    }
  }
  ptx::cp_async_wait<0>();  // nothing left in flight into shared memory
  // The split merge (a programmatic dependent launch) may start its blocks now; they wait for
  // this grid's completion (griddepcontrol.wait) before reading the partials.
  ptx::pdl_launch_dependents();
  b.finish(rO, m_run, l_run);
}

// Host: one launch of the kernel for head tile 16 kMT (decode_fp8_ds_mla.cu instantiates both).
template <int kMT, bool kF16K, int kRing>
void launch_decode(const DecodeParams& p, cudaStream_t stream);
// Resident blocks per SM of that instantiation (cudaOccupancyMaxActiveBlocksPerMultiprocessor).
template <int kMT, bool kF16K, int kRing>
int blocks_per_sm();

}  // namespace smla::cuda::sm90::decode
