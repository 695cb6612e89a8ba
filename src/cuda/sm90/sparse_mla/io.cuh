// SM90 sparse MLA, warp-specialized kernel: the consumers' prologue and epilogue. load_q puts the
// block's 64 heads of q into shared memory (both consumer warpgroups); store_o merges the two
// warpgroups' row sums and writes out and LSE (one split) or the split's partials.
#pragma once

#include "cuda/sm90/sparse_mla/dequant.h"
#include "cuda/sm90/sparse_mla/ws_common.cuh"

namespace smla::cuda::sm90::sparse_mla {

// q of head h from unit u of kUnit elements on (u < 512 / kUnit: latent; else RoPE, from q_rope
// when q comes as the (latent, RoPE) pair), as a pointer to elements of type T.
template <typename T, int kUnit>
__device__ __forceinline__ const T* q_src(const KernelParams& p, const WsBlock& w, int h, int u) {
  return (u < kLatent / kUnit || p.q_rope == nullptr)
             ? static_cast<const T*>(p.q) + w.t * p.q_stride_t + h * p.q_stride_h + u * kUnit
             : static_cast<const T*>(p.q_rope) + w.t * p.q_rope_stride_t + h * p.q_rope_stride_h +
                   (u - kLatent / kUnit) * kUnit;
}

// 8 e4m3 bytes of q (8-byte loads when q_vec16, else byte loads).
__device__ __forceinline__ void ld_q_e4m3x8(const KernelParams& p, const uint8_t* src, uint32_t& lo, uint32_t& hi) {
  if (p.q_vec16) {
    const uint2 v = *reinterpret_cast<const uint2*>(src);
    lo = v.x, hi = v.y;
  } else {
    for (int i = 0; i < 4; ++i) lo |= uint32_t(src[i]) << (8 * i), hi |= uint32_t(src[4 + i]) << (8 * i);
  }
}

// Q (64 heads x 576) -> shared memory by both consumer warpgroups (thread tid of 256), as the S
// product reads it. 16-bit caches and the dequantizing path: bf16 / fp16 in the 9 swizzled dim
// blocks, heads from w.head_end on and (D = 512) dim block 8 zero; an e4m3 q widened to bf16
// exactly (q_scale is in scale_log2). The fp8 score path (kQ8): the latent as e4m3 into blocks 0-3, the RoPE into
// block 4 as e4m3 (fp8_e4m3) or widened to bf16 (fp8_ds_mla: its RoPE rows are bf16).
template <KvFormat kFormat, bool kQ8>
__device__ __forceinline__ void load_q(const KernelParams& p, WsSmem<kQ8>& s, const WsBlock& w, int tid) {
  using Cfg = WsConfig;
  if (w.num_tiles == 0) return;
  const uint32_t q_base = ptx::smem_addr(s.q);
  if constexpr (kQ8) {
    constexpr int kGroups = kMaxDim / 8;  // 72 per head
    const int q_groups = 2 * p.k_steps;
    for (int gi = tid; gi < Cfg::kHeadTile * kGroups; gi += kConsumerThreads) {
      const int hr = gi / kGroups, e = 8 * (gi - hr * kGroups);
      const int h = w.head0 + hr;
      uint32_t lo = 0, hi = 0;
      if (h < w.head_end && e < 8 * q_groups) ld_q_e4m3x8(p, q_src<uint8_t, 1>(p, w, h, e), lo, hi);
      const uint32_t row = q_base + uint32_t(hr * 128);
      if (e < kLatent) {
        const uint32_t dst = row + uint32_t((e >> 7) * Cfg::kBlockBytes + ((((e & 127) >> 4) ^ (hr & 7)) << 4) + (e & 8));
        ptx::st_shared_v2(dst, lo, hi);
      } else if constexpr (kFormat == KvFormat::kFP8DsMla) {
        const dq::Chunk v = dq::e4m3x8_fast(lo, hi);  // exact
        ptx::st_shared_v4(row + uint32_t(4 * Cfg::kBlockBytes + ((((e - kLatent) >> 3) ^ (hr & 7)) << 4)), v.w);
      } else {
        const int er = e - kLatent;
        ptx::st_shared_v2(row + uint32_t(4 * Cfg::kBlockBytes + (((er >> 4) ^ (hr & 7)) << 4) + (er & 8)), lo, hi);
      }
    }
    ptx::fence_proxy_async_smem();
    consumers_once(s.q_ready);
  } else {
    constexpr int kChunks = 2 * kMaxDim / 16;  // 72 per head
    const int q_chunks = 2 * p.k_steps;
    for (int ci = tid; ci < Cfg::kHeadTile * kChunks; ci += kConsumerThreads) {
      const int hr = ci / kChunks, ch = ci - hr * kChunks;
      const int h = w.head0 + hr;
      const uint32_t dst =
          q_base + uint32_t((ch >> 3) * Cfg::kBlockBytes + hr * Cfg::kAtomBytes + (swizzle(hr, ch & 7) << 4));
      if (h >= w.head_end || ch >= q_chunks) {
        ptx::st_shared_zero16(dst);
        continue;
      }
      if constexpr (kFormat == KvFormat::kFP8E4M3 || kFormat == KvFormat::kFP8DsMla) {
        if (p.q_e4m3) {  // e4m3 -> bf16 exactly (q_scale is in scale_log2)
          uint32_t lo = 0, hi = 0;
          ld_q_e4m3x8(p, q_src<uint8_t, 8>(p, w, h, ch), lo, hi);
          ptx::st_shared_v4(dst, dq::e4m3x8_fast(lo, hi).w);
          continue;
        }
      }
      const uint16_t* src = q_src<uint16_t, 8>(p, w, h, ch);
      if (p.q_vec16) {
        ptx::cp_async_16(dst, src);
      } else {
        uint16_t e[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) e[i] = src[i];
        const uint32_t v[4] = {e[0] | uint32_t(e[1]) << 16, e[2] | uint32_t(e[3]) << 16, e[4] | uint32_t(e[5]) << 16,
                               e[6] | uint32_t(e[7]) << 16};
        ptx::st_shared_v4(dst, v);
      }
    }
    ptx::cp_async_commit();
    ptx::cp_async_wait<0>();
    ptx::fence_proxy_async_smem();
    consumers_once(s.q_ready);
  }
}

// Consumer kWg's epilogue: row sums (quad, then the two warpgroups, both relative to the scorer's
// final max; consumer 1's are 0, the scorer sums the whole tile), then its 256 output dims from
// the fragments (through shared memory with 16-byte stores was no faster: docs/perf-history.md,
// session 4). One split: out = O / (l + sink term) * out_scale and the LSE; several: the split's
// partial O / l and its natural-log LSE for the merge.
template <typename Elem, int kWg, bool kQ8>
__device__ __forceinline__ void store_o(const KernelParams& p, WsSmem<kQ8>& s, const WsBlock& w, const Frag& fr,
                                        const float (&acc_o)[128], const float (&m_run)[2], float (&l_run)[2]) {
  const int wrow = fr.wrow, g = fr.g, tq = fr.tq;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l_run[r] += __shfl_xor_sync(0xffffffffu, l_run[r], 1);
    l_run[r] += __shfl_xor_sync(0xffffffffu, l_run[r], 2);
  }
  if (tq == 0) {
    s.l_part[kWg][wrow + g] = l_run[0];
    s.l_part[kWg][wrow + g + 8] = l_run[1];
    if constexpr (kWg == 0) {
      s.m_final[wrow + g] = m_run[0];
      s.m_final[wrow + g + 8] = m_run[1];
    }
  }
  consumers_once(s.sums_ready);
  if (kWg == 0 && fr.wt == 0) ws_stamp(p, phase::kRowSums);

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = wrow + g + 8 * r;
    const int h = w.head0 + row;
    const bool valid = h < w.head_end;  // uniform over a quad (one row); the split path shuffles within it
    if (!valid && p.num_splits == 1) continue;
    const float l = s.l_part[0][row] + s.l_part[1][row];
    const float m = kWg == 0 ? m_run[r] : s.m_final[row];
    const float lse_e = l > 0.0f ? (m + log2f(l)) * kLn2 : -INFINITY;
    const int d0 = kWg * 256 + 2 * tq;
    if (p.num_splits == 1) {
      float denom = l;
      if (p.sink != nullptr && l > 0.0f) denom += exp2f(p.sink[h] * kLog2e - m);
      const float inv = l > 0.0f ? p.out_scale / denom : 0.0f;
      auto* out = static_cast<uint16_t*>(p.out) + w.t * p.out_stride_t + int64_t(h) * p.out_stride_h + d0;
#pragma unroll
      for (int j = 0; j < 32; ++j) {
        const uint32_t v = Elem::pack(acc_o[4 * j + 2 * r] * inv, acc_o[4 * j + 2 * r + 1] * inv);
        if (p.out_vec2) {
          *reinterpret_cast<uint32_t*>(out + j * 8) = v;
        } else {
          out[j * 8] = uint16_t(v & 0xffffu);
          out[j * 8 + 1] = uint16_t(v >> 16);
        }
      }
      if (p.lse != nullptr && kWg == 0 && tq == 0)
        p.lse[w.t * p.lse_stride_t + h] = p.lse_base2 ? lse_e * kLog2e : lse_e;
    } else {
      // bf16 partial O / l (smla/workspace.h). Lane tq of a quad holds dims d0 + 8j + {0, 1};
      // a 4x4 transpose of packed pairs within the quad (two xor rounds) gives lane tq the 8
      // contiguous dims of j = 4k + tq: one 16-byte store per 4 j, 64 contiguous bytes per row
      // and quad (full sectors; 4-byte stores would write half sectors).
      const int64_t part = (w.t * p.num_heads + (valid ? h : 0)) * p.num_splits + w.split;
      const float inv = l > 0.0f ? p.out_scale / l : 0.0f;
      uint16_t* po = p.part_out + part * kLatent + kWg * 256;
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        uint32_t a[4];
#pragma unroll
        for (int i = 0; i < 4; ++i)
          a[i] = ptx::Bf16::pack(acc_o[4 * (4 * k + i) + 2 * r] * inv, acc_o[4 * (4 * k + i) + 2 * r + 1] * inv);
#pragma unroll
        for (int b = 1; b <= 2; b <<= 1) {  // a[i] <-> the partner's a[i ^ b] where lane and index bits differ
          const bool hi = (tq & b) != 0;
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            if (i & b) continue;
            const uint32_t send = hi ? a[i] : a[i + b];
            const uint32_t recv = __shfl_xor_sync(0xffffffffu, send, b);
            if (hi) a[i] = recv; else a[i + b] = recv;
          }
        }
        if (valid) *reinterpret_cast<uint4*>(po + (4 * k + tq) * 8) = make_uint4(a[0], a[1], a[2], a[3]);
      }
      if (valid && kWg == 0 && tq == 0) p.part_lse[part] = lse_e;
    }
  }
  if (kWg == 0 && fr.wt == 0) ws_stamp(p, phase::kStored);
}

}  // namespace smla::cuda::sm90::sparse_mla
