// SM90 sparse MLA: one block per (token, head group, top-k split).
//
// A block owns kHeadTile heads of one token and walks that token's selected rows in tiles of
// kBlockK = 64 entries. Each tile is gathered whole (1152-byte rows, 16-byte cp.async) into one
// of two shared-memory stages while the other is computed, so every KV row crosses the memory
// bus once per head group (once per token for H <= 64).
//
// Quantized caches (kRow != kNative16) use the same pipeline with bf16 MMAs: each raw row
// (656 / 576 / 512 / 352 bytes) is gathered into the tail of its 1152-byte slot, and when its
// tile has landed the warp that gathered it rewrites the slot as the swizzled bf16 row (all raw
// bytes a lane needs are read into registers before any lane writes). An e4m3 q is widened to
// bf16 on load; fp8_e4m3's k_scale multiplies the score and output scales instead of the values.
//
// Warp roles, 4 warps per 16-head MMA tile (mw = warp / 4, wq = warp % 4):
//   scores  S(16 x 64) = Q(16 x D) K^T: warp wq computes columns [16 wq, 16 wq + 16);
//   softmax the 4 warps of a head tile exchange row maxima through shared memory, so every warp
//           of the tile rescales with the same running max and row sums can stay per warp;
//   output  O(16 x 512) += P(16 x 64) V(64 x 512): warp wq owns dims [128 wq, 128 wq + 128).
// All softmax math is fp32 in the log2 domain (scores pre-multiplied by log2 e).
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <string>

#include "cuda/common/phase.h"
#include "cuda/common/ptx.cuh"
#include "cuda/sm90/sparse_mla/config.h"
#include "cuda/sm90/sparse_mla/dequant.h"
#include "cuda/sm90/sparse_mla/launcher.h"
#include "smla/plan.h"
#include "smla/state.h"
#include "smla/types.h"

namespace smla::cuda::sm90::sparse_mla {

inline constexpr float kLog2e = 1.4426950408889634f;
inline constexpr float kLn2 = 0.6931471805599453f;

// Physical 16-byte chunk of logical chunk `ch` in row `r`: XOR by row inside groups of 8 chunks
// (128 bytes), so 8 consecutive rows at one logical chunk land in 8 different bank groups.
// Equal to ch ^ (r & 7): the XOR touches the low 3 bits only, so offsets of a lane whose rows
// share r & 7 are per-lane constants plus multiples of 128 bytes (precomputed below).
__device__ __forceinline__ int swizzle(int r, int ch) { return ch ^ (r & 7); }

template <typename Elem, int kMTiles, RowFormat kRow>
__global__ void __launch_bounds__(Config<kMTiles>::kThreads, 1)
    sparse_mla_kernel(const __grid_constant__ KernelParams p) {
  using Cfg = Config<kMTiles>;
  constexpr bool kQuant = kRow != RowFormat::kNative16;
  using Smem = typename Cfg::SharedStorage;
  extern __shared__ __align__(128) uint8_t smem_raw[];
  Smem& s = *reinterpret_cast<Smem*>(smem_raw);

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int mw = warp / kWarpsPerMTile;  // head MMA tile of this warp
  const int wq = warp % kWarpsPerMTile;  // score-column quarter, then output-dim quarter
  const int g = lane >> 2, tq = lane & 3;  // MMA fragment row / column-pair of this lane
  const int64_t t = blockIdx.x / p.head_groups;
  const int head0 = int(blockIdx.x - t * p.head_groups) * Cfg::kHeadTile;
  const int split = blockIdx.z;

  // ---- this block's entry range [begin, end) of the token's active top-k.
  int n = p.topk;
  if (p.counts != nullptr) n = min(max(p.counts[t], 0), p.topk);
  int chunk = (n + p.num_splits - 1) / p.num_splits;
  chunk = (chunk + kBlockK - 1) / kBlockK * kBlockK;  // whole tiles per split
  const int begin = min(n, split * chunk);
  const int end = min(n, begin + chunk);
  const int num_tiles = (end - begin + kBlockK - 1) / kBlockK;
  const int32_t* idx_row = p.idx + t * p.idx_stride_t;

  // Row ids of a tile, one load per lane: lane l of warp w holds the row of tile entry
  // r = w + kWarps * l (l < kRowsPerWarp), or -1 when the entry is masked (past `end`, negative
  // or >= num_rows). Loaded one pipeline step ahead, so the gather never waits on idx.
  constexpr int kRowsPerWarp = kBlockK / Cfg::kWarps;
  auto load_row_ids = [&](int tile) {
    int row = -1;
    const int e = begin + tile * kBlockK + warp + Cfg::kWarps * lane;
    if (lane < kRowsPerWarp && tile < num_tiles && e < end) {
      row = idx_row[e];
      if (row >= p.num_rows) row = -1;
      if (row < 0) row = -1;
    }
    return row;
  };

  // Gathers a tile into stage `stage`: one warp per row, 32 lanes over its 16-byte chunks. A
  // masked entry is never dereferenced: its smem row is zero-filled and its score column gets a
  // -inf bias.
  auto gather = [&](int row_ids, int stage) {
    const uint32_t stage_base = ptx::smem_addr(s.kv[stage]);
#pragma unroll
    for (int i = 0; i < kRowsPerWarp; ++i) {
      const int r = warp + Cfg::kWarps * i;
      const int row = __shfl_sync(0xffffffffu, row_ids, i);
      // Lane l copies chunks l, l + 32 and (D = 576) l + 64; swizzled, they land 512 B apart.
      const uint32_t dst = stage_base + uint32_t(r * kRowBytesMax + swizzle(r, lane) * 16);
      const bool third = lane + 64 < p.row_chunks;
      if (kQuant && row >= 0) {
        // Raw row, unswizzled, at the end of the slot (raw_chunks <= 41: two chunks per lane).
        const uint8_t* src = p.kv + int64_t(row) * p.kv_row_stride_bytes + lane * 16;
        const uint32_t raw = stage_base + uint32_t(r * kRowBytesMax + p.raw_offset + lane * 16);
        if (lane < p.raw_chunks) ptx::cp_async_16(raw, src);
        if (lane + 32 < p.raw_chunks) ptx::cp_async_16(raw + 512, src + 512);
      } else if (row >= 0) {
        const uint8_t* src = p.kv + int64_t(row) * p.kv_row_stride_bytes + lane * 16;
        ptx::cp_async_16(dst, src);
        ptx::cp_async_16(dst + 512, src + 512);
        if (third) ptx::cp_async_16(dst + 1024, src + 1024);
      } else {
        ptx::st_shared_zero16(dst);
        ptx::st_shared_zero16(dst + 512);
        if (third) ptx::st_shared_zero16(dst + 1024);
      }
      if (lane == 0) s.col_bias[stage][r] = row >= 0 ? 0.0f : -INFINITY;
    }
  };

  // Row ids (one per lane, see load_row_ids) of the tiles gathered 2, 3 and 4 steps from now: a
  // tile's ids are loaded 3 steps before its gather and prefetched into L2 2 steps before it.
  int ids_a = -1, ids_b = -1, ids_c = -1;
  auto prefetch = [&](int row_ids) {
    if (p.l2_prefetch && row_ids >= 0)
      ptx::prefetch_l2_bulk(p.kv + int64_t(row_ids) * p.kv_row_stride_bytes, uint32_t(p.raw_chunks * 16));
  };

  // Quantized caches: rewrites this warp's gathered rows of `stage` as bf16 rows, in place, in
  // passes of 32 chunks (512 bytes): lane l produces chunk 32 j + l of pass j. Each pass reads all
  // its raw bytes (into registers) before any lane writes, and its writes [512 j, 512 j + 512)
  // never cover raw bytes of a later pass: the raw row ends at the slot end, so pass 1 reads only
  // above byte 512 and pass 2 (RoPE) only above 1024 (emulated on the host by test_sparse_mla_quant).
  // kDqRows rows go through a pass together, for loads in flight; masked rows were zero-filled by
  // the gather and are only skipped at the store.
  auto dequant_stage = [&](int stage) {
    if constexpr (kQuant) {
      constexpr int kDqRows = kMTiles == 4 ? 1 : 4;
      static_assert(kRowsPerWarp % kDqRows == 0, "rows per warp split into dequant batches");
      __syncwarp();  // the raw bytes every lane of this warp copied are visible to the warp
      uint8_t* stage_ptr = reinterpret_cast<uint8_t*>(s.kv[stage]);
#pragma unroll 1
      for (int i0 = 0; i0 < kRowsPerWarp; i0 += kDqRows) {
#pragma unroll(kMTiles == 4 ? 1 : 3)
        for (int j = 0; j < 3; ++j) {
          const int ch = 32 * j + lane;
          if (j == 2 && p.row_chunks <= 64) break;  // D = 512: two passes (warp-uniform)
          const bool mine = ch < p.row_chunks;
          dq::Chunk c[kDqRows];
#pragma unroll
          for (int b = 0; b < kDqRows; ++b) {
            const int r = warp + Cfg::kWarps * (i0 + b);
            if (mine) c[b] = dq::dequant_chunk<kRow>(stage_ptr + r * kRowBytesMax + p.raw_offset, ch);
          }
          __syncwarp();  // every lane holds this pass's values before any lane overwrites raw bytes
#pragma unroll
          for (int b = 0; b < kDqRows; ++b) {
            const int r = warp + Cfg::kWarps * (i0 + b);
            if (mine && s.col_bias[stage][r] == 0.0f)
              *reinterpret_cast<uint4*>(stage_ptr + r * kRowBytesMax + 512 * j + swizzle(r, lane) * 16) =
                  make_uint4(c[b].w[0], c[b].w[1], c[b].w[2], c[b].w[3]);
          }
          __syncwarp();  // the next pass reads after these writes in every lane
        }
      }
    }
  };
  if (num_tiles > 0) {
    // ---- Q (kHeadTile, D) -> smem, heads past H zero; with 16-byte-aligned q it rides in the
    // first cp.async group together with tile 0.
    const int q_chunks = 2 * p.k_steps;
    for (int c = tid; c < Cfg::kHeadTile * q_chunks; c += Cfg::kThreads) {
      const int hr = c / q_chunks, ch = c - hr * q_chunks;
      const int h = head0 + hr;
      const uint32_t dst = ptx::smem_addr(s.q) + uint32_t(hr * kRowBytesMax + swizzle(hr, ch) * 16);
      if (h >= p.num_heads) {
        ptx::st_shared_zero16(dst);
        continue;
      }
      if constexpr (kRow == RowFormat::kFp8E4M3 || kRow == RowFormat::kFp8DsMla) {
        if (p.q_e4m3) {  // e4m3 -> bf16 exactly; q_scale is in scale_log2
          const uint8_t* src = (ch < kLatent / 8 || p.q_rope == nullptr)
                                   ? static_cast<const uint8_t*>(p.q) + t * p.q_stride_t + h * p.q_stride_h + ch * 8
                                   : static_cast<const uint8_t*>(p.q_rope) + t * p.q_rope_stride_t +
                                         h * p.q_rope_stride_h + (ch - kLatent / 8) * 8;
          uint32_t lo, hi;
          if (p.q_vec16) {
            const uint2 v = *reinterpret_cast<const uint2*>(src);
            lo = v.x, hi = v.y;
          } else {
            lo = src[0] | uint32_t(src[1]) << 8 | uint32_t(src[2]) << 16 | uint32_t(src[3]) << 24;
            hi = src[4] | uint32_t(src[5]) << 8 | uint32_t(src[6]) << 16 | uint32_t(src[7]) << 24;
          }
          const dq::Chunk c = dq::e4m3x8(lo, hi);
          *reinterpret_cast<uint4*>(reinterpret_cast<uint8_t*>(s.q) + hr * kRowBytesMax + swizzle(hr, ch) * 16) =
              make_uint4(c.w[0], c.w[1], c.w[2], c.w[3]);
          continue;
        }
      }
      const uint16_t* src = (ch < kLatent / 8 || p.q_rope == nullptr)
                                ? static_cast<const uint16_t*>(p.q) + t * p.q_stride_t + h * p.q_stride_h + ch * 8
                                : static_cast<const uint16_t*>(p.q_rope) + t * p.q_rope_stride_t +
                                      h * p.q_rope_stride_h + (ch - kLatent / 8) * 8;
      if (p.q_vec16) {
        ptx::cp_async_16(dst, src);
      } else {
        uint16_t e[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) e[i] = src[i];
        *reinterpret_cast<uint4*>(reinterpret_cast<uint8_t*>(s.q) + hr * kRowBytesMax + swizzle(hr, ch) * 16) =
            make_uint4(e[0] | uint32_t(e[1]) << 16, e[2] | uint32_t(e[3]) << 16, e[4] | uint32_t(e[5]) << 16,
                       e[6] | uint32_t(e[7]) << 16);
      }
    }
    gather(load_row_ids(0), 0);
    ptx::cp_async_commit();
    gather(load_row_ids(1), 1);  // all masked rows when there is no tile 1: nothing is read
    ptx::cp_async_commit();
    ids_a = load_row_ids(kStages);
    ids_b = load_row_ids(kStages + 1);
    ids_c = load_row_ids(kStages + kL2PrefetchTiles);
    prefetch(ids_a);
    prefetch(ids_b);
  }

  float acc_o[kOutColsPerWarp / 8][4];  // (16 heads, 128 dims): 16 n-tiles of the C fragment
#pragma unroll
  for (int j = 0; j < kOutColsPerWarp / 8; ++j) acc_o[j][0] = acc_o[j][1] = acc_o[j][2] = acc_o[j][3] = 0.0f;
  float m_run[2] = {-INFINITY, -INFINITY};  // running max of rows g, g + 8 (log2 domain)
  float l_run[2] = {0.0f, 0.0f};            // this lane's share of the row sums

  const uint32_t q_base = ptx::smem_addr(s.q), p_base = ptx::smem_addr(s.p);
  const int a_row = mw * 16 + (lane & 15);  // ldmatrix row of an A (16 x 16) operand
  const int a_sel = lane >> 4;              // its 8-column half
  const int kb_row = wq * 16 + (lane & 7) + ((lane >> 4) << 3);  // K rows: n of B (QK^T)
  const int kb_sel = (lane >> 3) & 1;
  const int vb_row = (lane & 7) + (((lane >> 3) & 1) << 3);  // V rows: k of B (PV), + 16 kk
  const int vb_sel = lane >> 4;
  // Every ldmatrix row of this lane has row % 8 == lane % 8, so the swizzled offset of the u-th
  // 16-wide k-step inside a 128-byte group is a per-lane constant.
  uint32_t a_off[4], kb_off[4], vb_off[4];
#pragma unroll
  for (int u = 0; u < 4; ++u) {
    a_off[u] = uint32_t(swizzle(lane, 2 * u + a_sel) * 16);
    kb_off[u] = uint32_t(swizzle(lane, 2 * u + kb_sel) * 16);
    vb_off[u] = uint32_t(swizzle(lane, 2 * u + vb_sel) * 16);
  }
  const uint32_t qa = q_base + a_row * kRowBytesMax;
  const uint32_t pa = p_base + a_row * (kBlockK * 2);

  for (int tile = 0; tile < num_tiles; ++tile) {
    const int stage = tile & 1;
    ptx::cp_async_wait<kStages - 1>();
    dequant_stage(stage);
    __syncthreads();  // (A) this tile's rows, Q and col_bias are visible to every warp
    const uint32_t kv_base = ptx::smem_addr(s.kv[stage]);

    // ---- S(16 x 16 per warp) = Q K^T; two accumulator sets break the MMA dependency chain.
    float acc_s[2][2][4] = {};  // [k-step parity][n-tile][C fragment]
    {
      const uint32_t kb = kv_base + kb_row * kRowBytesMax;
      // 128-byte groups of 4 k-steps: 9 (D = 576) or 8 (D = 512); unrolled so every ldmatrix
      // address is a register plus an immediate.
#pragma unroll
      for (int grp = 0; grp < kMaxDim / 64; ++grp) {
        if (grp * 4 >= p.k_steps) break;
#pragma unroll
        for (int u = 0; u < 4; ++u) {
          uint32_t a[4], b[4];
          ptx::ldmatrix_x4(a, qa + a_off[u] + grp * 128);
          ptx::ldmatrix_x4(b, kb + kb_off[u] + grp * 128);
          ptx::mma_16816<Elem>(acc_s[u & 1][0], a, b[0], b[1]);
          ptx::mma_16816<Elem>(acc_s[u & 1][1], a, b[2], b[3]);
        }
      }
    }

    // ---- scores (log2 domain) with the mask; this warp's row maxima -> shared memory.
    float sc[2][4];
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i)
        sc[nt][i] = (acc_s[0][nt][i] + acc_s[1][nt][i]) * p.scale_log2 +
                    s.col_bias[stage][wq * 16 + nt * 8 + 2 * tq + (i & 1)];
    float mx[2] = {fmaxf(fmaxf(sc[0][0], sc[0][1]), fmaxf(sc[1][0], sc[1][1])),
                   fmaxf(fmaxf(sc[0][2], sc[0][3]), fmaxf(sc[1][2], sc[1][3]))};
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
    }
    if (tq == 0) {
      s.row_part[wq][mw * 16 + g] = mx[0];
      s.row_part[wq][mw * 16 + g + 8] = mx[1];
    }
    __syncthreads();  // (B) row maxima of all 4 column warps

    // ---- online softmax: P = exp2(S - m) as 16-bit into smem, rescale O and the row sums.
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = mw * 16 + g + 8 * r;
      float tile_max = s.row_part[0][row];
#pragma unroll
      for (int w = 1; w < kWarpsPerMTile; ++w) tile_max = fmaxf(tile_max, s.row_part[w][row]);
      const float m_new = fmaxf(m_run[r], tile_max);
      const float m_use = m_new == -INFINITY ? 0.0f : m_new;  // all masked so far: avoid inf - inf
      const float alpha = ptx::fast_exp2(m_run[r] - m_use);
      m_run[r] = m_new;
      float sum = 0.0f;
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
        const float p0 = ptx::fast_exp2(sc[nt][2 * r] - m_use), p1 = ptx::fast_exp2(sc[nt][2 * r + 1] - m_use);
        sum += p0 + p1;
        const int chunk16 = wq * 2 + nt;  // 16-byte chunk of the 64-wide P row
        *reinterpret_cast<uint32_t*>(reinterpret_cast<uint8_t*>(s.p) + row * (kBlockK * 2) +
                                     swizzle(row, chunk16) * 16 + tq * 4) = Elem::pack(p0, p1);
      }
      l_run[r] = l_run[r] * alpha + sum;
#pragma unroll
      for (int j = 0; j < kOutColsPerWarp / 8; ++j) {
        acc_o[j][2 * r] *= alpha;
        acc_o[j][2 * r + 1] *= alpha;
      }
    }
    __syncthreads();  // (C) P of all 64 columns is in smem

    // ---- O(16 x 128 per warp) += P(16 x 64) V(64 x 128). Not unrolled over kk for the 64-head
    // tile: at its 128-register cap, unrolling hoists loads and spills.
    const uint32_t vb = kv_base + vb_row * kRowBytesMax + wq * (kOutColsPerWarp * 2);
#pragma unroll(kMTiles == 4 ? 1 : kBlockK / 16)
    for (int kk = 0; kk < kBlockK / 16; ++kk) {
      uint32_t a[4];
      ptx::ldmatrix_x4(a, pa + swizzle(lane, 2 * kk + a_sel) * 16);  // kk may be a run-time index
      const uint32_t vk = vb + kk * 16 * kRowBytesMax;
#pragma unroll
      for (int np = 0; np < kOutColsPerWarp / 16; ++np) {
        uint32_t b[4];
        ptx::ldmatrix_x4_trans(b, vk + vb_off[np & 3] + (np >> 2) * 128);
        ptx::mma_16816<Elem>(acc_o[2 * np], a, b[0], b[1]);
        ptx::mma_16816<Elem>(acc_o[2 * np + 1], a, b[2], b[3]);
      }
    }
    __syncthreads();  // (D) every warp is done with this stage and with P

    if (tile + kStages < num_tiles) gather(ids_a, stage);
    ptx::cp_async_commit();  // possibly empty: keeps "wait for all but the newest group" exact
    prefetch(ids_c);  // tile + 4
    ids_a = ids_b, ids_b = ids_c, ids_c = load_row_ids(tile + kStages + kL2PrefetchTiles + 1);
  }

  // ---- row sums: lanes of a quad, then the 4 column warps of the head tile.
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l_run[r] += __shfl_xor_sync(0xffffffffu, l_run[r], 1);
    l_run[r] += __shfl_xor_sync(0xffffffffu, l_run[r], 2);
  }
  if (tq == 0) {
    s.row_part[wq][mw * 16 + g] = l_run[0];
    s.row_part[wq][mw * 16 + g + 8] = l_run[1];
  }
  __syncthreads();

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = mw * 16 + g + 8 * r;
    const int h = head0 + row;
    if (h >= p.num_heads) continue;
    float l = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarpsPerMTile; ++w) l += s.row_part[w][row];
    const float m = m_run[r];  // finite whenever l > 0
    // Natural-log LSE of this block's entries; -inf when it saw no valid entry.
    const float lse_e = l > 0.0f ? (m + log2f(l)) * kLn2 : -INFINITY;
    const int d0 = wq * kOutColsPerWarp + 2 * tq;
    if (p.num_splits == 1) {
      float denom = l;
      if (p.sink != nullptr && l > 0.0f) denom += exp2f(p.sink[h] * kLog2e - m);
      float inv = l > 0.0f ? 1.0f / denom : 0.0f;  // empty row: exactly 0
      if constexpr (kQuant) inv *= p.out_scale;
      auto* out = static_cast<uint16_t*>(p.out) + t * p.out_stride_t + int64_t(h) * p.out_stride_h + d0;
#pragma unroll
      for (int j = 0; j < kOutColsPerWarp / 8; ++j) {
        const uint32_t v = Elem::pack(acc_o[j][2 * r] * inv, acc_o[j][2 * r + 1] * inv);
        if (p.out_vec2) {
          *reinterpret_cast<uint32_t*>(out + j * 8) = v;
        } else {
          out[j * 8] = uint16_t(v & 0xffffu);
          out[j * 8 + 1] = uint16_t(v >> 16);
        }
      }
      if (p.lse != nullptr && wq == 0 && tq == 0)
        p.lse[t * p.lse_stride_t + h] = p.lse_base2 ? lse_e * kLog2e : lse_e;
    } else {
      const int64_t part = (t * p.num_heads + h) * p.num_splits + split;
      float inv = l > 0.0f ? 1.0f / l : 0.0f;
      if constexpr (kQuant) inv *= p.out_scale;
      float* po = p.part_out + part * kLatent + d0;
#pragma unroll
      for (int j = 0; j < kOutColsPerWarp / 8; ++j)
        *reinterpret_cast<float2*>(po + j * 8) = make_float2(acc_o[j][2 * r] * inv, acc_o[j][2 * r + 1] * inv);
      if (wq == 0 && tq == 0) p.part_lse[part] = lse_e;
    }
  }
}

// Split-K merge: one block of 128 threads per (token, head), 4 output dims per thread. The
// weights follow smla::lse_merge (state.h), the one merge rule of the project, computed by warp 0
// (a lane per split, max and sum over a shuffle tree: a fixed order, so the result is
// deterministic; one thread's serial loop over 32 splits cost ~1 us at T = 1). Every split's partial is loaded before the
// weights are known (all loads in flight at once: one memory latency, not one per split; the
// loop of dependent loads it replaces took 13 us at T = 1, H = 128, 32 splits: perf-notes v8).
// kMaxS (>= num_splits) sizes the register array: 4 keeps the many-block merges of larger T at
// full occupancy, 32 (up to kMaxSplits) serves the few blocks of T = 1..4.
template <typename Elem, int kMaxS>
__global__ void __launch_bounds__(128) combine_kernel(const __grid_constant__ KernelParams p) {
  static_assert(kMaxS <= kMaxSplits, "one float4 register set per split below");
  static_assert(kMaxSplits <= 32, "one lane of warp 0 per split in the LSE merge");
  __shared__ float s_w[kMaxSplits], s_total;
  const int64_t th = blockIdx.x;  // t * H + h
  const int64_t t = th / p.num_heads;
  const int h = int(th - t * p.num_heads);
  const int S = p.num_splits;
  const int d = threadIdx.x * 4;
  uint64_t* const stamps = p.phase != nullptr && threadIdx.x == 0 && blockIdx.x < phase::kMergeBlocks
                               ? p.phase + phase::kMergeBase + blockIdx.x * phase::kMergeEvents
                               : nullptr;
  if (stamps != nullptr) stamps[phase::kMergeEntry] = ptx::globaltimer();
  ptx::pdl_wait();  // the partials of the attention grid (a no-op unless launched with PDL)
  if (stamps != nullptr) stamps[phase::kMergeWaited] = ptx::globaltimer();
  const float* part = p.part_out + th * S * kLatent + d;
  float4 v[kMaxS];
#pragma unroll
  for (int s = 0; s < kMaxS; ++s)
    v[s] = s < S ? *reinterpret_cast<const float4*>(part + s * kLatent) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  if (threadIdx.x < 32) {  // warp 0, lane i: split i (S <= 32); lse_merge's rule, summed as a tree
    const float l = threadIdx.x < S ? lse_sanitize(p.part_lse[th * S + threadIdx.x]) : -INFINITY;
    float m = l;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    if (m == -INFINITY) m = 0.0f;
    const float e = expf(l - m);
    float sum = e;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    const float w = e / sum;  // all parts empty: 0 / 0, zeroed as in lse_merge
    if (threadIdx.x < S) s_w[threadIdx.x] = (w == w && w != INFINITY) ? w : 0.0f;
    if (threadIdx.x == 0) s_total = m + logf(sum);
  }
  __syncthreads();
  const float total = s_total;  // natural log; -inf when the row is empty
  float scale = 1.0f;
  if (p.sink != nullptr && total != -INFINITY) scale = 1.0f / (1.0f + expf(p.sink[h] - total));
  float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
  for (int s = 0; s < kMaxS; ++s) {
    if (s >= S) break;
    const float w = s_w[s];
    acc.x += w * v[s].x, acc.y += w * v[s].y, acc.z += w * v[s].z, acc.w += w * v[s].w;
  }
  auto* out = static_cast<uint16_t*>(p.out) + t * p.out_stride_t + int64_t(h) * p.out_stride_h + d;
  const uint32_t v01 = Elem::pack(acc.x * scale, acc.y * scale), v23 = Elem::pack(acc.z * scale, acc.w * scale);
  if (p.out_vec2) {
    reinterpret_cast<uint32_t*>(out)[0] = v01;
    reinterpret_cast<uint32_t*>(out)[1] = v23;
  } else {
    out[0] = uint16_t(v01), out[1] = uint16_t(v01 >> 16), out[2] = uint16_t(v23), out[3] = uint16_t(v23 >> 16);
  }
  if (p.lse != nullptr && threadIdx.x == 0) p.lse[t * p.lse_stride_t + h] = p.lse_base2 ? total * kLog2e : total;
  if (stamps != nullptr) stamps[phase::kMergeDone] = ptx::globaltimer();
}

// ---- launchers (instantiated once each in the .cu files of this folder).
template <typename Elem, int kMTiles, RowFormat kRow>
void launch_main(const KernelParams& p, cudaStream_t stream) {
  using Cfg = Config<kMTiles>;
  auto* kernel = sparse_mla_kernel<Elem, kMTiles, kRow>;
  // Raise the dynamic shared-memory limit once per device (a per-launch call costs host time).
  static std::atomic<uint64_t> attribute_set{0};
  int dev = 0;
  SMLA_CHECK(cudaGetDevice(&dev) == cudaSuccess, "cudaGetDevice failed");
  const uint64_t bit = uint64_t(1) << (dev & 63);
  if (!(attribute_set.load(std::memory_order_acquire) & bit)) {
    const cudaError_t ea = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(Cfg::kSmemBytes));
    SMLA_CHECK(ea == cudaSuccess, std::string("cannot raise the sparse MLA kernel's shared memory to ") +
                                      std::to_string(Cfg::kSmemBytes) + " bytes: " + cudaGetErrorString(ea));
    attribute_set.fetch_or(bit, std::memory_order_release);
  }
  const dim3 grid(unsigned(p.num_tokens * p.head_groups), 1, unsigned(p.num_splits));
  kernel<<<grid, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(p);
}

template <typename Elem>
void launch_combine(const KernelParams& p, cudaStream_t stream, bool pdl) {
  // The same shared-memory carveout as the attention kernels around it (SMLA_SM90_COMBINE_CARVEOUT=0
  // leaves the driver's choice; A/B runs): an SM switching its L1 / shared split between kernels
  // waits for its blocks to drain first.
  static const bool carveout = [] {
    const char* e = std::getenv("SMLA_SM90_COMBINE_CARVEOUT");
    return e == nullptr || std::string(e) != "0";
  }();
  static std::atomic<uint64_t> attribute_set{0};
  int dev = 0;
  SMLA_CHECK(cudaGetDevice(&dev) == cudaSuccess, "cudaGetDevice failed");
  const uint64_t bit = uint64_t(1) << (dev & 63);
  if (carveout && !(attribute_set.load(std::memory_order_acquire) & bit)) {
    for (auto* k : {combine_kernel<Elem, 4>, combine_kernel<Elem, kMaxSplits>}) {
      const cudaError_t e =
          cudaFuncSetAttribute(k, cudaFuncAttributePreferredSharedMemoryCarveout, int(cudaSharedmemCarveoutMaxShared));
      SMLA_CHECK(e == cudaSuccess, std::string("cannot set the split merge's carveout: ") + cudaGetErrorString(e));
    }
    attribute_set.fetch_or(bit, std::memory_order_release);
  }
  auto* kernel = p.num_splits <= 4 ? combine_kernel<Elem, 4> : combine_kernel<Elem, kMaxSplits>;
  if (!pdl) {
    kernel<<<unsigned(p.num_tokens * p.num_heads), 128, 0, stream>>>(p);
    return;
  }
  // Programmatic dependent launch: its blocks start as the attention grid's last blocks run and
  // wait in pdl_wait(), hiding the launch gap (small T; docs/perf-notes.md).
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(unsigned(p.num_tokens * p.num_heads));
  cfg.blockDim = dim3(128);
  cfg.stream = stream;
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
  const cudaError_t e = cudaLaunchKernelEx(&cfg, kernel, p);
  SMLA_CHECK(e == cudaSuccess, std::string("split merge launch (PDL) failed: ") + cudaGetErrorString(e));
}

}  // namespace smla::cuda::sm90::sparse_mla
