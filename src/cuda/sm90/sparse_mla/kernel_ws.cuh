// SM90 sparse MLA, warp-specialized wgmma kernel for 64-head groups: bf16 / fp16 caches at every H
// (heads past H zero-padded), and the quantized formats (raw rows gathered by ws_produce_quant,
// dequantized in place by consumer 1: the launcher routes every quantized format here by default).
//
// One block per (token, 64-head group, top-k split); 3 warpgroups (WsConfig in config.h):
//   producer (warpgroup 2): gathers the rows of one 64-entry tile at a time with cp.async into
//     buffer i % 2 for tile i, each buffer in two halves (dim blocks 0-3, 4-8) with a "full"
//     mbarrier (cp.async arrivals) and an "empty" mbarrier (consumer arrivals); masked entries are
//     zero-filled, never read. Tile i + 1 is gathered while the consumers compute tile i.
//     Quantized formats: raw bytes into a staging area of each half, signalled on a "raw"
//     mbarrier; consumer 1 dequantizes them in place and arrives on "full".
//   consumer 0 (warpgroup 0, the scorer): S = Q K^T of the whole tile (64 heads x 64 entries,
//     m64n64k16, Q and K in shared memory, Q read once per tile), masked online softmax, P (bf16)
//     and each row's O rescale factor into shared memory (P into the tile's dim block 8, the
//     RoPE block, which only S reads), then O[:, 0:256) += P V from registers.
//   consumer 1 (warpgroup 1): O[:, 256:512) += P V with P and the factors from shared memory;
//     for the quantized formats it dequantizes tile i + 1 around that product (ws_convert).
// Release of a tile's halves (each consumer thread arrives once per half and tile): dims 0-3
// after consumer 0's P V (consumer 1 never reads them), dims 4-8 after consumer 0's S and
// consumer 1's P V (which also reads P there). The scorer issues the next tile's S behind its
// P V only when that tile has landed; otherwise it releases dims 0-3 first, so that the next
// gather into this buffer never waits for the one before it.
// Named barriers: kBarP0 + tile % 2 (consumer 0 arrives with P stored, consumer 1 syncs),
// kBarConsumers (Q loaded, row sums exchanged), kBarScorer (the scorer's landed test),
// kBarConvert (consumer 1's dequantization).
//
// kQ8 (an e4m3 q over fp8_e4m3 / fp8_ds_mla rows, WsConfig's warp roles over WsQ8Config's plan):
// the rows stay raw in two stages and S runs on the fp8 tensor cores from them (fp8_ds_mla: one
// accumulator per 128-dim tile, added times the rows' tile scales; its bf16 RoPE in bf16);
// consumer 1 dequantizes only V, into one bf16 buffer: half 0 of tile + 1 once the scorer's P V
// of tile is done with it (vempty -> vfull), half 1 after its own P V; a stage is free once S
// and both halves are done with it (empty).
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cmath>
#include <string>
#include <type_traits>

#include "cuda/common/phase.h"
#include "cuda/common/ptx.cuh"
#include "cuda/sm90/sparse_mla/config.h"
#include "cuda/sm90/sparse_mla/dequant.h"
#include "cuda/sm90/sparse_mla/launcher.h"
#include "smla/types.h"

namespace smla::cuda::sm90::sparse_mla {

// Physical 16-byte chunk of logical chunk `ch` in row `r` of a 128-byte-swizzled atom: XOR by
// row inside groups of 8 chunks, so 8 consecutive rows at one logical chunk land in 8 different
// bank groups (the wgmma 128-byte swizzle).
__device__ __forceinline__ int swizzle(int r, int ch) { return ch ^ (r & 7); }

namespace ws {
// kBarP0 + tile % 2: consumer 0 arrives when a tile's P and rescale factors are stored, consumer 1
// syncs (two ids: consumer 0 may run a tile ahead).
inline constexpr uint32_t kBarConsumers = 1, kBarP0 = 2;
inline constexpr uint32_t kBarScorer = 4;  // the scorer's 128 threads (one path for the warpgroup)
inline constexpr uint32_t kConsumerThreads = 256;
// -inf-safe reference for exp2: a row with no valid entry so far keeps max -inf and reference 0.
__device__ __forceinline__ float ref_of(float m) { return m == -INFINITY ? 0.0f : m; }
// Factor that moves values relative to m_old onto m_new >= m_old (0 when nothing was seen yet:
// whatever was accumulated is 0 then).
__device__ __forceinline__ float rescale(float m_old, float m_new) {
  return m_old == -INFINITY ? 0.0f : ptx::fast_exp2(m_old - ref_of(m_new));
}
}  // namespace ws

// What every warpgroup of a block knows about its work.
struct WsBlock {
  int64_t t;             // token
  int head0;             // first head of the 64-head group
  int split;             // top-k split
  int begin, end;        // entries [begin, end) of the idx row
  int num_tiles;         // 64-entry tiles in [begin, end): tile i in buffer i % 2
  const int32_t* idx_row;
};

__device__ __forceinline__ uint32_t ws_bar(uint64_t& b) { return ptx::smem_addr(&b); }

// A phase stamp (cuda/common/phase.h) of this block; the caller picks one thread.
__device__ __forceinline__ void ws_stamp(const KernelParams& p, int event) {
  const uint32_t block = blockIdx.z * gridDim.x + blockIdx.x;
  if (p.phase != nullptr && block < uint32_t(phase::kAttnBlocks))
    p.phase[block * phase::kAttnEvents + event] = ptx::globaltimer();
}

// Producer: 8 threads per row (thread c copies 16-byte chunk c of each 128-byte dim block), 16
// rows at a time: row r = grp + 16 i of a tile (i < 4), its chunk c at (c ^ r % 8) in the atom.
// D = 512 caches get dim block 8 zero-filled, so S always runs over 9 blocks (the Q block is
// zero too).
__device__ __forceinline__ void ws_produce(const KernelParams& p, WsConfig::SharedStorage& s, const WsBlock& w, int wt) {
  using Cfg = WsConfig;
  const int c = wt & 7, grp = wt >> 3;
  const uint32_t dst0 = uint32_t(grp * Cfg::kAtomBytes + ((c ^ (grp & 7)) << 4));
  const bool rope = p.k_steps > kLatent / 16;
  int64_t off[4];  // byte offsets of this thread's rows in the next tile (-1: masked)
  auto load_ids = [&](int tile) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int e = w.begin + tile * kBlockK + grp + 16 * i;
      const int row = e < w.end ? __ldg(w.idx_row + e) : -1;
      off[i] = (row >= 0 && row < p.num_rows) ? int64_t(row) * p.kv_row_stride_bytes : int64_t(-1);
    }
  };
  // Dim blocks [kBlk0, kBlk1) of the tile's rows into the buffer at `base`. L2 fetches are 256
  // bytes (DRAM runs faster than with 128), except a row's last block when it starts a 256-byte
  // segment: its fetch would pull the next 128 bytes (another row's) from DRAM too (ncu, H = 64,
  // T = 512: DRAM reads 1.27 -> 1.21 GB, the rows' own bytes; docs/perf-notes.md, session 7).
  auto copy = [&](uint32_t base, auto kblk0, auto kblk1) {
    constexpr int kBlk0 = decltype(kblk0)::value, kBlk1 = decltype(kblk1)::value;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const bool ok = off[i] >= 0;
      const uint8_t* src = ok ? p.kv + off[i] + c * 16 : reinterpret_cast<const uint8_t*>(p.idx);
      const uint32_t dst = base + dst0 + uint32_t(16 * i * Cfg::kAtomBytes);
      const uint32_t seg = uint32_t(reinterpret_cast<uintptr_t>(src) >> 7) & 1;  // block 0 in a segment's 2nd half
#pragma unroll
      for (int blk = kBlk0; blk < kBlk1; ++blk) {
        const bool ok_blk = ok && (blk < 8 || rope);
        const bool last = blk == 8 || (blk == 7 && !rope);
        const bool fetch_128 = last && ((seg ^ uint32_t(blk)) & 1) == 0;
        ptx::cp_async_16_zfill_l2(dst + uint32_t(blk * Cfg::kBlockBytes), ok_blk ? src + blk * 128 : src, ok_blk,
                                  fetch_128);
      }
    }
  };
  using I0 = std::integral_constant<int, 0>;
  using I4 = std::integral_constant<int, 4>;
  using I9 = std::integral_constant<int, 9>;
  if (w.num_tiles > 0) load_ids(0);
  for (int tile = 0; tile < w.num_tiles; ++tile) {
    const int b = tile & 1;
    const uint32_t parity = ((tile >> 1) & 1) ^ 1;
    const uint32_t base = ptx::smem_addr(s.kv[b]);
    ptx::mbar_wait(ws_bar(s.empty[b][0]), parity);
    copy(base, I0{}, I4{});
    if (tile == 0 && wt == 0) ws_stamp(p, phase::kIdsIssued);
    ptx::cp_async_mbar_arrive(ws_bar(s.full[b][0]));
    ptx::mbar_wait(ws_bar(s.empty[b][1]), parity);
    copy(base, I4{}, I9{});
    ptx::cp_async_mbar_arrive(ws_bar(s.full[b][1]));
    // The next tile's row ids now (cp.async once its buffer frees up).
    if (tile + 1 < w.num_tiles) load_ids(tile + 1);
  }
  if (wt == 0) ws_stamp(p, phase::kProducerDone);
}

// Quantized formats. Each half of a buffer is gathered raw with cp.async by the producer into a
// staging area inside that half (StageLayout below), then dequantized in place by consumer 1,
// which is otherwise idle while the scorer computes S and the softmax: each of its threads reads
// its raw bytes into registers, the warpgroup syncs (kBarConvert), and the bf16 chunks are
// written to their swizzled places. Tile t + 1 is dequantized while the scorer works on tile t.
namespace ws {
inline constexpr uint32_t kBarConvert = 6;  // consumer 1's 128 threads, dequantizing
// Raw bytes of half h (0: dims 0-255, 1: dims 256-511 and the RoPE block) staged as segment 0
// then segment 1, `bytes` per row, rows 'bytes' apart from dim block `block` of the half's buffer.
struct StageHalf {
  int block, bytes, off0, len0, off1;  // segment 1 = [off1, off1 + bytes - len0)
};
template <RowFormat kRow>
struct StageLayout;
template <>
struct StageLayout<RowFormat::kFp8E4M3> {  // [0,512) e4m3 latent, [512,576) e4m3 RoPE
  static constexpr StageHalf h[2] = {{2, 256, 0, 256, 0}, {6, 320, 256, 320, 0}};
};
template <>
struct StageLayout<RowFormat::kFp8DsMla> {  // [0,512) e4m3, [512,528) 4 fp32 scales, [528,656) bf16 RoPE
  static constexpr StageHalf h[2] = {{1, 272, 0, 256, 512}, {5, 272, 256, 256, 512}};
};
template <>
struct StageLayout<RowFormat::kNvFp4DsMla> {  // [0,256) e2m1, [256,320) e4m3 RoPE, [320,352) e4m3 scales
  static constexpr StageHalf h[2] = {{2, 160, 0, 128, 320}, {6, 224, 128, 224, 0}};
};
}  // namespace ws

// Dequantizes half kH of buffer kB in place, by consumer 1's 128 threads (thread wt: rows
// grp + 16 i, 16-byte chunk c of each dim block, as the producer's copies): waits for the raw
// bytes (the producer's "raw" mbarrier, phase `parity`), reads this thread's raw bytes into
// registers, syncs the warpgroup (every raw byte read before any is overwritten), writes the
// bf16 chunks to their swizzled places and arrives on the half's "full" mbarrier.
template <RowFormat kRow, int kB, int kH>
__device__ __forceinline__ void ws_convert_half(const KernelParams& p, WsConfig::SharedStorage& s, int wt,
                                                uint32_t parity) {
  using Cfg = WsConfig;
  constexpr ws::StageHalf st = ws::StageLayout<kRow>::h[kH];
  constexpr int kBlk0 = kH == 0 ? 0 : 4;
  constexpr int kNb = kH == 0 ? 4 : (kRow == RowFormat::kFp8DsMla ? 4 : 5);  // ds_mla RoPE is in place
  const int c = wt & 7, grp = wt >> 3;
  const bool rope = p.k_steps > kLatent / 16;
  ptx::mbar_wait(ws_bar(s.raw[kB][kH]), parity);
  const uint8_t* stage = reinterpret_cast<const uint8_t*>(s.kv[kB][st.block]);
  uint32_t lo[4][kNb], hi[4][kNb];  // raw bytes of chunk (row i, block kBlk0 + j)
  float sc[4][kNb];                 // its scale (fp8_ds_mla tile scale, nvfp4 block scale)
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint8_t* sr = stage + (grp + 16 * i) * st.bytes;
#pragma unroll
    for (int j = 0; j < kNb; ++j) {
      const int blk = kBlk0 + j;
      if constexpr (kRow == RowFormat::kFp8E4M3) {
        dq::ld_u32x2(sr + (blk - kBlk0) * 64 + c * 8, lo[i][j], hi[i][j]);
        sc[i][j] = 1.0f;
      } else if constexpr (kRow == RowFormat::kFp8DsMla) {
        dq::ld_u32x2(sr + (blk - kBlk0) * 64 + c * 8, lo[i][j], hi[i][j]);
        sc[i][j] = num::bits_f32(dq::ld_u32(sr + 256 + 4 * (blk >> 1)));
      } else {
        if (blk < 8) {
          const int ch = blk * 8 + c;  // latent chunk: bytes 4 ch .. 4 ch + 3 of the row
          lo[i][j] = dq::ld_u32(sr + 4 * ch - (kH == 0 ? 0 : 128));
          const int scale_at = num::nvfp4_scale_offset(ch >> 1);
          hi[i][j] = sr[kH == 0 ? scale_at - 320 + 128 : scale_at - 128];  // the e4m3 block scale byte
          sc[i][j] = 1.0f;
        } else {
          dq::ld_u32x2(sr + 128 + 8 * c, lo[i][j], hi[i][j]);  // RoPE, e4m3 unscaled
          sc[i][j] = 1.0f;
        }
      }
    }
  }
  ptx::named_sync(ws::kBarConvert, 128);  // every raw byte read before any is overwritten
  const uint32_t base = ptx::smem_addr(s.kv[kB]) + uint32_t(grp * Cfg::kAtomBytes + ((c ^ (grp & 7)) << 4));
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < kNb; ++j) {
      const int blk = kBlk0 + j;
      dq::Chunk v;
      if constexpr (kRow == RowFormat::kFp8E4M3) v = dq::e4m3x8_fast(lo[i][j], hi[i][j]);
      else if constexpr (kRow == RowFormat::kFp8DsMla) v = dq::e4m3x8_scaled_fast(lo[i][j], hi[i][j], sc[i][j]);
      else
        v = blk < 8 ? dq::e2m1x8_scaled_lut(lo[i][j], dq::e4m3_bf16_bits(hi[i][j])) : dq::e4m3x8_fast(lo[i][j], hi[i][j]);
      if (blk == 8 && !rope) v = dq::Chunk{{0u, 0u, 0u, 0u}};
      const uint32_t dst = base + uint32_t(blk * Cfg::kBlockBytes + 16 * i * Cfg::kAtomBytes);
      asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(dst), "r"(v.w[0]), "r"(v.w[1]), "r"(v.w[2]),
                   "r"(v.w[3])
                   : "memory");
    }
  ptx::fence_proxy_async_smem();
  ptx::mbar_arrive(ws_bar(s.full[kB][kH]));
}

// Half kH of `tile` (buffer tile % 2).
template <RowFormat kRow, int kH>
__device__ __forceinline__ void ws_convert(const KernelParams& p, WsConfig::SharedStorage& s, int wt, int tile) {
  const uint32_t parity = (tile >> 1) & 1;
  if (tile & 1) ws_convert_half<kRow, 1, kH>(p, s, wt, parity);
  else ws_convert_half<kRow, 0, kH>(p, s, wt, parity);
}

// Producer for the quantized formats: gathers each half's raw bytes with cp.async into its
// staging area (StageLayout; fp8_ds_mla's bf16 RoPE straight to dim block 8) and signals the
// half's "raw" mbarrier; consumer 1 dequantizes it in place (ws_convert_half).
template <RowFormat kRow>
__device__ __forceinline__ void ws_produce_quant(const KernelParams& p, WsConfig::SharedStorage& s, const WsBlock& w,
                                                 int wt) {
  using Cfg = WsConfig;
  using L = ws::StageLayout<kRow>;
  const int c = wt & 7, grp = wt >> 3;
  const uint32_t kv_base0 = ptx::smem_addr(s.kv[0]), kv_base1 = ptx::smem_addr(s.kv[1]);
  const bool rope = p.k_steps > kLatent / 16;
  const int row_bytes = p.raw_chunks * 16;  // bytes of a stored row the kernel may read
  int64_t off[4];                           // byte offsets of this thread's rows in the next tile (-1: masked)
  // Row ids one tile ahead: tile t's are loaded when tile t - 1's offsets are formed.
  int next_rows[4];
  auto fetch_rows = [&](int tile) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int e = w.begin + tile * kBlockK + grp + 16 * i;
      next_rows[i] = (tile < w.num_tiles && e < w.end) ? __ldg(w.idx_row + e) : -1;
    }
  };
  fetch_rows(0);
  auto load_ids = [&](int tile) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int row = next_rows[i];
      off[i] = (row >= 0 && row < p.num_rows) ? int64_t(row) * p.kv_row_stride_bytes : int64_t(-1);
    }
    fetch_rows(tile + 1);
  };
  // cp.async of half kH of the buffer at `base`.
  auto issue = [&](uint32_t base, auto kh) {
    constexpr int kH = decltype(kh)::value;
    constexpr ws::StageHalf st = L::h[kH];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int r = grp + 16 * i;
      const bool ok = off[i] >= 0;
      const uint8_t* row = ok ? p.kv + off[i] : reinterpret_cast<const uint8_t*>(p.idx);
      const uint32_t dst = base + uint32_t(st.block * Cfg::kBlockBytes + r * st.bytes);
#pragma unroll
      for (int k = c; k < st.bytes / 16; k += 8) {
        const int src_off = 16 * k < st.len0 ? st.off0 + 16 * k : st.off1 + 16 * k - st.len0;
        const bool valid = ok && src_off < row_bytes;
        ptx::cp_async_16_zfill(dst + uint32_t(16 * k), valid ? row + src_off : row, valid);
      }
      if constexpr (kRow == RowFormat::kFp8DsMla && kH == 1) {  // bf16 RoPE: straight to block 8
        const bool valid = ok && rope;
        ptx::cp_async_16_zfill(base + uint32_t(8 * Cfg::kBlockBytes + r * Cfg::kAtomBytes + ((c ^ (r & 7)) << 4)),
                               valid ? row + 528 + 16 * c : row, valid);
      }
    }
  };
  using I0 = std::integral_constant<int, 0>;
  using I1 = std::integral_constant<int, 1>;
  for (int tile = 0; tile < w.num_tiles; ++tile) {
    const int b = tile & 1;
    const uint32_t parity = ((tile >> 1) & 1) ^ 1;
    const uint32_t base = b ? kv_base1 : kv_base0;
    load_ids(tile);
    ptx::mbar_wait(ws_bar(s.empty[b][0]), parity);
    issue(base, I0{});
    ptx::cp_async_mbar_arrive(ws_bar(s.raw[b][0]));
    ptx::mbar_wait(ws_bar(s.empty[b][1]), parity);
    issue(base, I1{});
    ptx::cp_async_mbar_arrive(ws_bar(s.raw[b][1]));
  }
}

// ---- e4m3 q over fp8 rows (WsQ8Config): rows stay raw for the fp8 score product; only V is
// dequantized.
//
// Producer: 8 threads per row as ws_produce (thread c: 16-byte chunk c of each 128-byte block),
// rows grp + 16 i; the row's e4m3 latent into blocks 0-3 of its stage, its RoPE into block 4
// (fp8_e4m3: 64 e4m3 bytes, chunks 0-3; fp8_ds_mla: 128 bf16 bytes) and (fp8_ds_mla) its four
// tile scales into ks. Masked entries are zero-filled, never read.
template <RowFormat kRow>
__device__ __forceinline__ void ws_produce_q8(const KernelParams& p, WsQ8Config::SharedStorage& s, const WsBlock& w,
                                              int wt) {
  constexpr bool kDs = kRow == RowFormat::kFp8DsMla;
  const int c = wt & 7, grp = wt >> 3;
  const bool rope = p.k_steps > kLatent / 16;
  int64_t off[4];
  auto load_ids = [&](int tile) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int e = w.begin + tile * kBlockK + grp + 16 * i;
      const int row = e < w.end ? __ldg(w.idx_row + e) : -1;
      off[i] = (row >= 0 && row < p.num_rows) ? int64_t(row) * p.kv_row_stride_bytes : int64_t(-1);
    }
  };
  if (w.num_tiles > 0) load_ids(0);
  for (int tile = 0; tile < w.num_tiles; ++tile) {
    const int st = tile & 1;
    ptx::mbar_wait(ws_bar(s.empty[st]), ((tile >> 1) & 1) ^ 1);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int r = grp + 16 * i;
      const bool ok = off[i] >= 0;
      const uint8_t* row = ok ? p.kv + off[i] : reinterpret_cast<const uint8_t*>(p.idx);
      const uint32_t dst = uint32_t(r * 128 + ((c ^ (r & 7)) << 4));
#pragma unroll
      for (int lb = 0; lb < 4; ++lb)
        ptx::cp_async_16_zfill(ptx::smem_addr(s.k[st][lb]) + dst, ok ? row + lb * 128 + 16 * c : row, ok);
      const int rope_at = kDs ? 528 : 512;
      if (kDs || c < 4) {
        const bool valid = ok && rope;
        ptx::cp_async_16_zfill(ptx::smem_addr(s.k[st][4]) + dst, valid ? row + rope_at + 16 * c : row, valid);
      }
      if (kDs && c == 0) ptx::cp_async_16_zfill(ptx::smem_addr(s.ks[st][r]), ok ? row + 512 : row, ok);
    }
    ptx::cp_async_mbar_arrive(ws_bar(s.full[st]));
    if (tile + 1 < w.num_tiles) load_ids(tile + 1);
  }
}

// V half kH (dims 256 kH .. 256 kH + 255) of `tile` -> bf16 in s.v, by consumer 1's 128 threads
// (thread wt: rows grp + 16 i, 16-byte chunk c of latent blocks 2 kH and 2 kH + 1, written as two
// bf16 chunks). fp8_e4m3 stays unscaled (k_scale is applied to the output), fp8_ds_mla takes its
// tile scale. Half 0 first waits for the stage's rows. Ends with the writes visible to wgmma.
template <RowFormat kRow, int kH>
__device__ __forceinline__ void ws_convert_v(WsQ8Config::SharedStorage& s, int wt, int tile) {
  const int st = tile & 1;
  if constexpr (kH == 0) ptx::mbar_wait(ws_bar(s.full[st]), (tile >> 1) & 1);
  const int c = wt & 7, grp = wt >> 3;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int r = grp + 16 * i;
#pragma unroll
    for (int lb = 2 * kH; lb < 2 * kH + 2; ++lb) {
      uint32_t x[4];
      asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                   : "=r"(x[0]), "=r"(x[1]), "=r"(x[2]), "=r"(x[3])
                   : "r"(ptx::smem_addr(s.k[st][lb]) + uint32_t(r * 128 + ((c ^ (r & 7)) << 4))));
      dq::Chunk v[2];
      if constexpr (kRow == RowFormat::kFp8DsMla) {
        const float sc = s.ks[st][r][lb];
        v[0] = dq::e4m3x8_scaled_fast(x[0], x[1], sc);
        v[1] = dq::e4m3x8_scaled_fast(x[2], x[3], sc);
      } else {
        v[0] = dq::e4m3x8_fast(x[0], x[1]);
        v[1] = dq::e4m3x8_fast(x[2], x[3]);
      }
      const uint32_t blk = ptx::smem_addr(s.v[2 * lb + (c >> 2)]) + uint32_t(r * 128);
#pragma unroll
      for (int u = 0; u < 2; ++u)
        asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(blk + uint32_t(((2 * (c & 3) + u) ^ (r & 7)) << 4)),
                     "r"(v[u].w[0]), "r"(v[u].w[1]), "r"(v[u].w[2]), "r"(v[u].w[3])
                     : "memory");
    }
  }
  ptx::fence_proxy_async_smem();
}

// Consumer kWg (0: the scorer) of output dims [256 kWg, 256 kWg + 256). kQ8: an e4m3 q over fp8
// rows (WsQ8Config: S on the fp8 tensor cores from the raw stages, V dequantized by consumer 1).
template <typename Elem, RowFormat kRow, int kWg, bool kQ8 = false>
__device__ __forceinline__ void ws_consume(const KernelParams& p,
                                           std::conditional_t<kQ8, WsQ8Config::SharedStorage, WsConfig::SharedStorage>& s,
                                           const WsBlock& w, int wt) {
  using Cfg = WsConfig;
  const int warp = wt >> 5, lane = wt & 31;
  const int wrow = warp * 16;              // first of this warp's 16 rows (heads) in the tile
  const int g = lane >> 2, tq = lane & 3;  // fragment row / column pair
  const int tid = kWg * 128 + wt;

  // Q (64 heads x 576) -> shared memory, swizzled 128-byte atoms; heads past H and (D = 512)
  // dim block 8 are zero.
  const uint32_t q_base = ptx::smem_addr(s.q);
  if constexpr (kQ8) {
    if (w.num_tiles > 0) {
      // e4m3 q: 8 elements per step; the latent as e4m3 into blocks 0-3, the RoPE into block 4 as
      // e4m3 (fp8_e4m3) or widened to bf16 (fp8_ds_mla: its RoPE rows are bf16). q_scale is in
      // scale_log2.
      constexpr int kGroups = kMaxDim / 8;  // 72 per head
      const int q_groups = 2 * p.k_steps;
      for (int gi = tid; gi < Cfg::kHeadTile * kGroups; gi += ws::kConsumerThreads) {
        const int hr = gi / kGroups, e = 8 * (gi - hr * kGroups);
        const int h = w.head0 + hr;
        uint32_t lo = 0, hi = 0;
        if (h < p.num_heads && e < 8 * q_groups) {
          const uint8_t* src = (e < kLatent || p.q_rope == nullptr)
                                   ? static_cast<const uint8_t*>(p.q) + w.t * p.q_stride_t + h * p.q_stride_h + e
                                   : static_cast<const uint8_t*>(p.q_rope) + w.t * p.q_rope_stride_t +
                                         h * p.q_rope_stride_h + (e - kLatent);
          if (p.q_vec16) {
            const uint2 v = *reinterpret_cast<const uint2*>(src);
            lo = v.x, hi = v.y;
          } else {
            for (int i = 0; i < 4; ++i) lo |= uint32_t(src[i]) << (8 * i), hi |= uint32_t(src[4 + i]) << (8 * i);
          }
        }
        const uint32_t row = q_base + uint32_t(hr * 128);
        if (e < kLatent) {
          const uint32_t dst = row + uint32_t((e >> 7) * Cfg::kBlockBytes + ((((e & 127) >> 4) ^ (hr & 7)) << 4) + (e & 8));
          asm volatile("st.shared.v2.u32 [%0], {%1, %2};\n" ::"r"(dst), "r"(lo), "r"(hi) : "memory");
        } else if constexpr (kRow == RowFormat::kFp8DsMla) {
          const dq::Chunk v = dq::e4m3x8_fast(lo, hi);  // exact
          const uint32_t dst = row + uint32_t(4 * Cfg::kBlockBytes + ((((e - kLatent) >> 3) ^ (hr & 7)) << 4));
          asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(dst), "r"(v.w[0]), "r"(v.w[1]), "r"(v.w[2]),
                       "r"(v.w[3])
                       : "memory");
        } else {
          const int er = e - kLatent;
          const uint32_t dst = row + uint32_t(4 * Cfg::kBlockBytes + (((er >> 4) ^ (hr & 7)) << 4) + (er & 8));
          asm volatile("st.shared.v2.u32 [%0], {%1, %2};\n" ::"r"(dst), "r"(lo), "r"(hi) : "memory");
        }
      }
      ptx::fence_proxy_async_smem();
      ptx::named_sync(ws::kBarConsumers, ws::kConsumerThreads);
    }
  } else if (w.num_tiles > 0) {
    constexpr int kChunks = 2 * kMaxDim / 16;  // 72 per head
    const int q_chunks = 2 * p.k_steps;
    for (int ci = tid; ci < Cfg::kHeadTile * kChunks; ci += ws::kConsumerThreads) {
      const int hr = ci / kChunks, ch = ci - hr * kChunks;
      const int h = w.head0 + hr;
      const uint32_t dst =
          q_base + uint32_t((ch >> 3) * Cfg::kBlockBytes + hr * Cfg::kAtomBytes + (swizzle(hr, ch & 7) << 4));
      if (h >= p.num_heads || ch >= q_chunks) {
        ptx::st_shared_zero16(dst);
        continue;
      }
      if constexpr (kRow == RowFormat::kFp8E4M3 || kRow == RowFormat::kFp8DsMla) {
        if (p.q_e4m3) {  // e4m3 -> bf16 exactly (q_scale is in scale_log2)
          const uint8_t* src = (ch < kLatent / 8 || p.q_rope == nullptr)
                                   ? static_cast<const uint8_t*>(p.q) + w.t * p.q_stride_t + h * p.q_stride_h + ch * 8
                                   : static_cast<const uint8_t*>(p.q_rope) + w.t * p.q_rope_stride_t +
                                         h * p.q_rope_stride_h + (ch - kLatent / 8) * 8;
          uint32_t lo = 0, hi = 0;
          if (p.q_vec16) {
            const uint2 v = *reinterpret_cast<const uint2*>(src);
            lo = v.x, hi = v.y;
          } else {
            for (int i = 0; i < 4; ++i) lo |= uint32_t(src[i]) << (8 * i), hi |= uint32_t(src[4 + i]) << (8 * i);
          }
          const dq::Chunk c = dq::e4m3x8_fast(lo, hi);
          asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(dst), "r"(c.w[0]), "r"(c.w[1]), "r"(c.w[2]),
                       "r"(c.w[3])
                       : "memory");
          continue;
        }
      }
      const uint16_t* src = (ch < kLatent / 8 || p.q_rope == nullptr)
                                ? static_cast<const uint16_t*>(p.q) + w.t * p.q_stride_t + h * p.q_stride_h + ch * 8
                                : static_cast<const uint16_t*>(p.q_rope) + w.t * p.q_rope_stride_t +
                                      h * p.q_rope_stride_h + (ch - kLatent / 8) * 8;
      if (p.q_vec16) {
        ptx::cp_async_16(dst, src);
      } else {
        uint16_t e[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) e[i] = src[i];
        asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(dst), "r"(e[0] | uint32_t(e[1]) << 16),
                     "r"(e[2] | uint32_t(e[3]) << 16), "r"(e[4] | uint32_t(e[5]) << 16),
                     "r"(e[6] | uint32_t(e[7]) << 16)
                     : "memory");
      }
    }
    ptx::cp_async_commit();
    ptx::cp_async_wait<0>();
    ptx::fence_proxy_async_smem();
    ptx::named_sync(ws::kBarConsumers, ws::kConsumerThreads);
  }
  if (kWg == 0 && wt == 0) ws_stamp(p, phase::kQReady);

  float acc_o[128];  // (64 heads, 256 dims of this warpgroup): [n8 block j][C fragment]
#pragma unroll
  for (int i = 0; i < 128; ++i) acc_o[i] = 0.0f;
  float m_run[2] = {-INFINITY, -INFINITY};  // rows wrow + g, wrow + g + 8 (log2 domain)
  float l_run[2] = {0.0f, 0.0f};            // sums over this warpgroup's columns

  // ---- consumer 0 (the scorer): S of the whole tile, softmax, P V for dims [0, 256).
  // ---- consumer 1: P V for dims [256, 512), P and the rescale factors from shared memory.
  // P of tile i goes to dim block 8 of its buffer (the RoPE block: only S reads K there, and S
  // is done before P is stored; the half is refilled only after consumer 1's product read P).
  float acc_s[32];
  // S (64 heads x 64 entries) = Q K^T over the 9 dim blocks of buffer b (dims 0-3 as soon as
  // they land, then 4-8), two commit groups.
  auto issue_scores = [&](int tile) {
    if constexpr (!kQ8) {
      const int b = tile & 1;
      const uint32_t parity = (tile >> 1) & 1;
      const uint64_t q_desc = ptx::sw128_desc(q_base, 16, 1024);
      const uint64_t k_desc = ptx::sw128_desc(ptx::smem_addr(s.kv[b]), 16, 1024);
      ptx::mbar_wait(ws_bar(s.full[b][0]), parity);
      ptx::wgmma_fence();
#pragma unroll
      for (int blk = 0; blk < 4; ++blk) {
        const uint32_t off = uint32_t(blk * (Cfg::kBlockBytes >> 4));
#pragma unroll
        for (int a = 0; a < 4; ++a)
          ptx::wgmma_m64n64k16<Elem>(acc_s, q_desc + off + uint32_t(a * 2), k_desc + off + uint32_t(a * 2),
                                     (blk == 0 && a == 0) ? 0 : 1);
      }
      ptx::wgmma_commit();  // (a commit group per half: no spin loop inside a group, or ptxas serializes)
      ptx::mbar_wait(ws_bar(s.full[b][1]), parity);
      ptx::wgmma_fence();
#pragma unroll
      for (int blk = 4; blk < 9; ++blk) {
        const uint32_t off = uint32_t(blk * (Cfg::kBlockBytes >> 4));
#pragma unroll
        for (int a = 0; a < 4; ++a)
          ptx::wgmma_m64n64k16<Elem>(acc_s, q_desc + off + uint32_t(a * 2), k_desc + off + uint32_t(a * 2), 1);
      }
      ptx::wgmma_commit();
    }
  };
  // kQ8: S of stage tile % 2 on the fp8 tensor cores (m64n64k32 e4m3). fp8_e4m3: one group over
  // the 576 dims. fp8_ds_mla: each 128-dim tile's product goes to its own accumulator and is added
  // times the rows' tile scales (acc_s for tile 0, then t_acc), the bf16 RoPE product last
  // (m64n64k16, Q's RoPE widened exactly). `pv_pending`: a P V group was committed before; it is
  // done when `release` runs. Returns with at most the last group in flight.
  auto issue_scores_q8 = [&](int tile, bool pv_pending, auto&& release) {
    if constexpr (kQ8) {
      const int b = tile & 1;
      const uint64_t q_desc = ptx::sw128_desc(q_base, 16, 1024);
      const uint64_t k_desc = ptx::sw128_desc(ptx::smem_addr(s.k[b]), 16, 1024);
      constexpr uint32_t kBlk = uint32_t(Cfg::kBlockBytes >> 4);
      ptx::mbar_wait(ws_bar(s.full[b]), (tile >> 1) & 1);
      ptx::wgmma_fence();
      if constexpr (kRow == RowFormat::kFp8E4M3) {
#pragma unroll
        for (int blk = 0; blk < 4; ++blk)
#pragma unroll
          for (int a = 0; a < 4; ++a)
            ptx::wgmma_m64n64k32_e4m3(acc_s, q_desc + blk * kBlk + uint32_t(a * 2), k_desc + blk * kBlk + uint32_t(a * 2),
                                      (blk == 0 && a == 0) ? 0 : 1);
#pragma unroll
        for (int a = 0; a < 2; ++a)  // (D = 512: Q's and K's RoPE blocks are zero)
          ptx::wgmma_m64n64k32_e4m3(acc_s, q_desc + 4 * kBlk + uint32_t(a * 2), k_desc + 4 * kBlk + uint32_t(a * 2));
        ptx::wgmma_commit();
        if (pv_pending) {
          ptx::wgmma_wait<1>();
          release();
        }
      } else {
        float t_acc[32];
        auto tile_product = [&](float (&d)[32], int blk) {
#pragma unroll
          for (int a = 0; a < 4; ++a)
            ptx::wgmma_m64n64k32_e4m3(d, q_desc + blk * kBlk + uint32_t(a * 2), k_desc + blk * kBlk + uint32_t(a * 2),
                                      a == 0 ? 0 : 1);
          ptx::wgmma_commit();
        };
        // acc_s (+)= t_acc times the tile scales of its columns 8 j + 2 tq + u.
        auto add_scaled = [&](const float (&d)[32], int blk, bool first) {
#pragma unroll
          for (int i = 0; i < 32; ++i) {
            const float sc = s.ks[b][8 * (i >> 2) + 2 * tq + (i & 1)][blk];
            acc_s[i] = first ? d[i] * sc : fmaf(d[i], sc, acc_s[i]);
          }
        };
        tile_product(acc_s, 0);
        if (pv_pending) {  // P's registers free before t_acc is needed
          ptx::wgmma_wait<1>();
          release();
        }
        ptx::wgmma_fence();
        tile_product(t_acc, 1);
        ptx::wgmma_wait<1>();
        ptx::fence_operands(acc_s);
        add_scaled(acc_s, 0, true);
#pragma unroll
        for (int blk = 1; blk < 4; ++blk) {
          ptx::wgmma_wait<0>();
          ptx::fence_operands(t_acc);
          add_scaled(t_acc, blk, false);
          if (blk < 3) {
            ptx::wgmma_fence();
            tile_product(t_acc, blk + 1);
          }
        }
        ptx::wgmma_fence();
#pragma unroll
        for (int a = 0; a < 4; ++a)  // (D = 512: Q's and K's RoPE blocks are zero)
          ptx::wgmma_m64n64k16<Elem>(acc_s, q_desc + 4 * kBlk + uint32_t(a * 2), k_desc + 4 * kBlk + uint32_t(a * 2));
        ptx::wgmma_commit();
      }
    }
  };
  // Row ids of a tile's entries lane and lane + 32 (each warp takes the tile's 64), turned into
  // valid bits by valid_bits once needed.
  auto tile_ids = [&](int tile, int (&ids)[2]) {
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int e = w.begin + tile * kBlockK + 32 * hf + lane;
      ids[hf] = (tile < w.num_tiles && e < w.end) ? __ldg(w.idx_row + e) : -1;
    }
  };
  // Valid-entry bits of this thread's 16 score columns 8 j + 2 tq + u (bit 2 j + u), from the
  // warp's two ballots of the tile's 64 entries.
  auto valid_bits = [&](const int (&ids)[2]) {
    uint32_t m[2];
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) m[hf] = __ballot_sync(0xffffffffu, ids[hf] >= 0 && ids[hf] < p.num_rows);
    uint32_t bits = 0;
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const uint32_t v = m[hf] >> (2 * tq);  // columns 32 hf + 8 j + 2 tq + u -> bits 8 j + u
#pragma unroll
      for (int j = 0; j < 4; ++j) bits |= ((v >> (8 * j)) & 3u) << (8 * hf + 2 * j);
    }
    return bits;
  };
  // O *= f per row, skipped by a warp whose 16 rows all kept their max (after the first tiles,
  // nearly always).
  auto scale_o = [&](const float (&f)[2]) {
    if (!__any_sync(0xffffffffu, f[0] != 1.0f || f[1] != 1.0f)) return;
#pragma unroll
    for (int j = 0; j < 32; ++j) {
      acc_o[4 * j] *= f[0];
      acc_o[4 * j + 1] *= f[0];
      acc_o[4 * j + 2] *= f[1];
      acc_o[4 * j + 3] *= f[1];
    }
  };
  // P V over a tile's 64 rows for this warpgroup's 256 dims (one commit group): V = dim blocks
  // [4 kWg, 4 kWg + 4) of buffer b; k-step kk covers rows [16 kk, 16 kk + 16).
  auto v_desc_of = [&](int b) {
    uint32_t v_base;
    if constexpr (kQ8) v_base = ptx::smem_addr(s.v);  // one V buffer
    else v_base = ptx::smem_addr(s.kv[b]);
    return ptx::sw128_desc(v_base + uint32_t(kWg * 4 * Cfg::kBlockBytes), Cfg::kBlockBytes, 1024);
  };
  auto p_addr_of = [&](int b) {
    if constexpr (kQ8) return ptx::smem_addr(s.p[b]);
    else return ptx::smem_addr(s.kv[b][8]);
  };

  const int n = w.num_tiles;
  if constexpr (kWg == 0) {
    // The tile's row maxima of the masked scores in the log2 domain (quad-reduced). With a
    // positive scale (every real model) S stays unscaled, masked entries -inf, and the scale is
    // applied to the max here and inside the exponent's FMA; otherwise (scale <= 0, where
    // max(scale s) is not scale max(s)) S is scaled first.
    const bool scale_pos = p.scale_log2 > 0.0f;
    auto mask_and_max = [&](uint32_t bits, float (&mx)[2]) {
      if (!scale_pos) {
#pragma unroll
        for (int i = 0; i < 32; ++i) acc_s[i] *= p.scale_log2;
      }
      if (bits != 0xffffu) {  // some entry of the tile masked
#pragma unroll
        for (int j = 0; j < 8; ++j)
#pragma unroll
          for (int i = 0; i < 4; ++i)
            if (!((bits >> (2 * j + (i & 1))) & 1u)) acc_s[4 * j + i] = -INFINITY;
      }
      // Per row: a tree over the thread's 16 values, then the quad.
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        float t[8];
#pragma unroll
        for (int j = 0; j < 8; ++j) t[j] = fmaxf(acc_s[4 * j + 2 * r], acc_s[4 * j + 2 * r + 1]);
#pragma unroll
        for (int w2 = 4; w2 >= 1; w2 >>= 1)
#pragma unroll
          for (int j = 0; j < w2; ++j) t[j] = fmaxf(t[j], t[j + w2]);
        mx[r] = t[0];
      }
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
        if (scale_pos) mx[r] *= p.scale_log2;  // -inf stays -inf
      }
    };
    // P = 2^(S - ref(m)) as the A fragments of the tile's four k-steps (k-step kk: entries
    // [16 kk, 16 kk + 16) = n8 blocks 2 kk and 2 kk + 1); row sums into `sum`.
    uint32_t a_p[4][4];
    auto softmax_pack = [&](const float (&m)[2], float (&sum)[2]) {
      float nref[2];
#pragma unroll
      for (int r = 0; r < 2; ++r) nref[r] = -ws::ref_of(m[r]);
      if (scale_pos) {  // (the scale straight from the constant bank into the FMA)
#pragma unroll
        for (int i = 0; i < 32; ++i) acc_s[i] = ptx::fast_exp2(fmaf(acc_s[i], p.scale_log2, nref[(i >> 1) & 1]));
      } else {
#pragma unroll
        for (int i = 0; i < 32; ++i) acc_s[i] = ptx::fast_exp2(acc_s[i] + nref[(i >> 1) & 1]);
      }
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        float t[8];
#pragma unroll
        for (int j = 0; j < 8; ++j) t[j] = acc_s[4 * j + 2 * r] + acc_s[4 * j + 2 * r + 1];
#pragma unroll
        for (int w2 = 4; w2 >= 1; w2 >>= 1)
#pragma unroll
          for (int j = 0; j < w2; ++j) t[j] += t[j + w2];
        sum[r] = t[0];
      }
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        a_p[kk][0] = Elem::pack(acc_s[8 * kk + 0], acc_s[8 * kk + 1]);
        a_p[kk][1] = Elem::pack(acc_s[8 * kk + 2], acc_s[8 * kk + 3]);
        a_p[kk][2] = Elem::pack(acc_s[8 * kk + 4], acc_s[8 * kk + 5]);
        a_p[kk][3] = Elem::pack(acc_s[8 * kk + 6], acc_s[8 * kk + 7]);
      }
    };
    // The packed P -> dim block 8 of buffer b (64 x 64, K-major, swizzled), visible to wgmma.
    // One stmatrix per k-step: matrices (rows 0-7 | 8-15 of the warp) x (n8 blocks 2 kk | 2 kk + 1)
    // are a_p[kk][0..3]; lane l addresses row l % 8 of matrix l / 8.
    auto store_p = [&](int b) {
      const uint32_t p_addr = p_addr_of(b);
      const int row = wrow + (lane & 7) + 8 * ((lane >> 3) & 1);
#pragma unroll
      for (int kk = 0; kk < 4; ++kk)
        ptx::stmatrix_x4(p_addr + uint32_t(row * (kBlockK * 2) + (swizzle(row, 2 * kk + (lane >> 4)) << 4)), a_p[kk]);
      ptx::fence_proxy_async_smem();
    };

    // Every path through the loop body ends with no wgmma in flight (a group pending across the
    // back edge makes ptxas serialize them, C7515); the next tile's S still runs behind this P V.
    uint32_t bits = 0;
    if (n > 0) {
      int ids[2];
      tile_ids(0, ids);
      if constexpr (kQ8) issue_scores_q8(0, false, [] {});
      else issue_scores(0);
      if (wt == 0) ws_stamp(p, phase::kTile0Landed);
      bits = valid_bits(ids);
      ptx::wgmma_wait<0>();
      ptx::fence_operands(acc_s);
    }
    for (int tile = 0; tile < n; ++tile) {
      const int b = tile & 1;
      if constexpr (kQ8) ptx::mbar_arrive(ws_bar(s.empty[b]));  // S is done with the stage (and its scales)
      else ptx::mbar_arrive(ws_bar(s.empty[b][1]));  // S is done with dims 4-8 (consumer 1's P V releases them)
      float mx[2], f[2], sum[2];
      mask_and_max(bits, mx);
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const float m_new = fmaxf(m_run[r], mx[r]);
        f[r] = m_new == m_run[r] ? 1.0f : ws::rescale(m_run[r], m_new);
        m_run[r] = m_new;
      }
      softmax_pack(m_run, sum);
#pragma unroll
      for (int r = 0; r < 2; ++r) l_run[r] = l_run[r] * f[r] + sum[r];
      scale_o(f);
      // kQ8: V half 0 dequantized. (It also orders this tile's P and f stores below after
      // consumer 1's P V of tile - 1, which read the same P buffer: consumer 1 dequantized this
      // tile's V after that product finished.)
      if constexpr (kQ8) ptx::mbar_wait(ws_bar(s.vfull), tile & 1);
      {  // own P V first: P's stores for consumer 1 then run behind it
        const uint64_t v_desc = v_desc_of(b);
        ptx::wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < 4; ++kk)
          ptx::wgmma_m64n256k16_rs_tb<Elem>(acc_o, a_p[kk], v_desc + uint32_t((kk * 16 * Cfg::kAtomBytes) >> 4));
        ptx::wgmma_commit();
      }
      store_p(b);
      if (tq == 0) {
        s.f[b][wrow + g] = f[0];
        s.f[b][wrow + g + 8] = f[1];
      }
      ptx::named_arrive(ws::kBarP0 + b, ws::kConsumerThreads);  // P and f of this tile ready
      if (kQ8 && tile + 1 < n) {
        // The next tile's S behind this P V (the stage is not the V buffer: no landed test).
        issue_scores_q8(tile + 1, true, [&] {
          ptx::fence_operands(acc_o);
#pragma unroll
          for (int kk = 0; kk < 4; ++kk) ptx::fence_operands(a_p[kk]);
          if constexpr (kQ8) ptx::mbar_arrive(ws_bar(s.vempty));
        });
        int ids[2];
        tile_ids(tile + 1, ids);
        bits = valid_bits(ids);
        ptx::wgmma_wait<0>();
        ptx::fence_operands(acc_s);
      } else if (tile + 1 < n) {
        if constexpr (!kQ8) {
          // The next tile's S goes behind this P V when its rows are all there; otherwise this
          // tile's dims 0-3 are released first (their next gather must not wait for the rows of
          // tile + 1 to land: that would put one whole gather in series per tile). The same path
          // in all four warps (wgmma is warpgroup-wide): the barrier ANDs their tests.
          const int b1 = (tile + 1) & 1;
          const uint32_t parity1 = ((tile + 1) >> 1) & 1;
          const bool landed = ptx::named_sync_and(
              ws::kBarScorer, 128,
              ptx::mbar_test(ws_bar(s.full[b1][0]), parity1) && ptx::mbar_test(ws_bar(s.full[b1][1]), parity1));
          auto release_dims_0_3 = [&] {
            ptx::fence_operands(acc_o);
#pragma unroll
            for (int kk = 0; kk < 4; ++kk) ptx::fence_operands(a_p[kk]);
            ptx::mbar_arrive(ws_bar(s.empty[b][0]));
          };
          if (!landed) {
            ptx::wgmma_wait<0>();  // P V done
            release_dims_0_3();
          }
          issue_scores(tile + 1);
          int ids[2];
          tile_ids(tile + 1, ids);  // (its two loads behind the products)
          if (landed) {
            ptx::wgmma_wait<2>();  // P V done (the two groups of S may still run)
            release_dims_0_3();
          }
          bits = valid_bits(ids);
          ptx::wgmma_wait<0>();
          ptx::fence_operands(acc_s);
        }
      } else {
        ptx::wgmma_wait<0>();
        ptx::fence_operands(acc_o);
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) ptx::fence_operands(a_p[kk]);
        if constexpr (kQ8) ptx::mbar_arrive(ws_bar(s.vempty));
        else ptx::mbar_arrive(ws_bar(s.empty[b][0]));
      }
    }
  } else if constexpr (kQ8) {
    // V of tile + 1 is dequantized around this tile's P V: half 0 once the scorer's P V of this
    // tile is done with it (vempty), half 1 after this warpgroup's own; then the stage is free.
    if (n > 0) {
      ws_convert_v<kRow, 0>(s, wt, 0);
      ptx::mbar_arrive(ws_bar(s.vfull));
      ws_convert_v<kRow, 1>(s, wt, 0);
      ptx::mbar_arrive(ws_bar(s.empty[0]));
    }
    for (int tile = 0; tile < n; ++tile) {
      const int b = tile & 1;
      ptx::named_sync(ws::kBarP0 + b, ws::kConsumerThreads);  // (also: every thread's V half 1 written)
      const float f[2] = {s.f[b][wrow + g], s.f[b][wrow + g + 8]};
      scale_o(f);
      const uint64_t v_desc = v_desc_of(b);
      const uint64_t a_desc = ptx::sw128_desc(p_addr_of(b), 16, 1024);
      ptx::wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < 4; ++kk)
        ptx::wgmma_m64n256k16_tb<Elem>(acc_o, a_desc + uint32_t((kk * 32) >> 4),
                                       v_desc + uint32_t((kk * 16 * Cfg::kAtomBytes) >> 4));
      ptx::wgmma_commit();
      if (tile + 1 < n) {
        ptx::mbar_wait(ws_bar(s.vempty), tile & 1);
        ws_convert_v<kRow, 0>(s, wt, tile + 1);
        ptx::mbar_arrive(ws_bar(s.vfull));
      }
      ptx::wgmma_wait<0>();
      ptx::fence_operands(acc_o);
      if (tile + 1 < n) {
        ws_convert_v<kRow, 1>(s, wt, tile + 1);
        ptx::mbar_arrive(ws_bar(s.empty[(tile + 1) & 1]));
      }
    }
  } else {
    constexpr bool kQuant = kRow != RowFormat::kNative16;
    if constexpr (kQuant) {
      if (n > 0) {
        ws_convert<kRow, 0>(p, s, wt, 0);
        ws_convert<kRow, 1>(p, s, wt, 0);
      }
    }
    for (int tile = 0; tile < n; ++tile) {
      const int b = tile & 1;
      // The scorer's next tile is dequantized around this tile's P V: dims 0-3 before it (the
      // scorer's S starts there), dims 4-8 while it runs, so this tile's buffer is released half
      // a conversion earlier than with both halves first.
      if constexpr (kQuant) {
        if (tile + 1 < n) ws_convert<kRow, 0>(p, s, wt, tile + 1);
      }
      ptx::named_sync(ws::kBarP0 + b, ws::kConsumerThreads);
      ptx::mbar_arrive(ws_bar(s.empty[b][0]));  // never read here
      const float f[2] = {s.f[b][wrow + g], s.f[b][wrow + g + 8]};
      scale_o(f);
      const uint64_t v_desc = v_desc_of(b);
      const uint64_t a_desc = ptx::sw128_desc(ptx::smem_addr(s.kv[b][8]), 16, 1024);
      ptx::wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < 4; ++kk)
        ptx::wgmma_m64n256k16_tb<Elem>(acc_o, a_desc + uint32_t((kk * 32) >> 4),
                                       v_desc + uint32_t((kk * 16 * Cfg::kAtomBytes) >> 4));
      ptx::wgmma_commit();
      if constexpr (kQuant) {
        if (tile + 1 < n) ws_convert<kRow, 1>(p, s, wt, tile + 1);
      }
      ptx::wgmma_wait<0>();
      ptx::fence_operands(acc_o);
      ptx::mbar_arrive(ws_bar(s.empty[b][1]));  // P V done with dims 4-7 and P
    }
  }

  if (wt == 0) ws_stamp(p, kWg == 0 ? phase::kLoopDone : phase::kLoopDone1);
  // ---- row sums: quad, then the two warpgroups (both relative to the same final max).
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l_run[r] += __shfl_xor_sync(0xffffffffu, l_run[r], 1);
    l_run[r] += __shfl_xor_sync(0xffffffffu, l_run[r], 2);
  }
  if (tq == 0) {
    s.l_part[kWg][wrow + g] = l_run[0];  // (consumer 1's: 0; consumer 0 sums the whole tile)
    s.l_part[kWg][wrow + g + 8] = l_run[1];
    if constexpr (kWg == 0) {
      s.m_final[wrow + g] = m_run[0];
      s.m_final[wrow + g + 8] = m_run[1];
    }
  }
  ptx::named_sync(ws::kBarConsumers, ws::kConsumerThreads);
  if (kWg == 0 && wt == 0) ws_stamp(p, phase::kRowSums);

  // ---- outputs, from the fragments (through shared memory with 16-byte stores was no faster:
  // docs/perf-notes.md, session 4).
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = wrow + g + 8 * r;
    const int h = w.head0 + row;
    if (h >= p.num_heads) continue;
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
      const int64_t part = (w.t * p.num_heads + h) * p.num_splits + w.split;
      const float inv = l > 0.0f ? p.out_scale / l : 0.0f;
      float* po = p.part_out + part * kLatent + d0;
#pragma unroll
      for (int j = 0; j < 32; ++j)
        *reinterpret_cast<float2*>(po + j * 8) = make_float2(acc_o[4 * j + 2 * r] * inv, acc_o[4 * j + 2 * r + 1] * inv);
      if (kWg == 0 && tq == 0) p.part_lse[part] = lse_e;
    }
  }
  if (kWg == 0 && wt == 0) ws_stamp(p, phase::kStored);
}

template <typename Elem, RowFormat kRow, bool kQ8>
__global__ void __launch_bounds__(WsConfig::kThreads, 1) sparse_mla_ws_kernel(const __grid_constant__ KernelParams p) {
  using Cfg = WsConfig;
  using Smem = std::conditional_t<kQ8, WsQ8Config::SharedStorage, WsConfig::SharedStorage>;
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  auto& s = *reinterpret_cast<Smem*>(smem_raw);

  WsBlock w;
  w.t = blockIdx.x / p.head_groups;
  w.head0 = int(blockIdx.x - w.t * p.head_groups) * Cfg::kHeadTile;
  w.split = blockIdx.z;
  int n = p.topk;
  if (p.counts != nullptr) n = min(max(p.counts[w.t], 0), p.topk);
  int chunk = (n + p.num_splits - 1) / p.num_splits;
  chunk = (chunk + kBlockK - 1) / kBlockK * kBlockK;
  w.begin = min(n, w.split * chunk);
  w.end = min(n, w.begin + chunk);
  w.num_tiles = (w.end - w.begin + kBlockK - 1) / kBlockK;
  w.idx_row = p.idx + w.t * p.idx_stride_t;

  if (threadIdx.x == 0) {
    if constexpr (kQ8) {
      for (int b = 0; b < 2; ++b) {
        ptx::mbar_init(ws_bar(s.full[b]), 128);                    // every producer thread's copies
        ptx::mbar_init(ws_bar(s.empty[b]), ws::kConsumerThreads);  // scorer after S, consumer 1 after V
      }
      ptx::mbar_init(ws_bar(s.vfull), 128);   // consumer 1, once per tile
      ptx::mbar_init(ws_bar(s.vempty), 128);  // the scorer, once per tile
    } else {
      for (int b = 0; b < 2; ++b)
        for (int h = 0; h < 2; ++h) {
          ptx::mbar_init(ws_bar(s.full[b][h]), 128);  // every producer thread's (16-bit) or consumer 1 thread's arrival
          ptx::mbar_init(ws_bar(s.raw[b][h]), 128);   // quantized: every producer thread's raw bytes landed
          ptx::mbar_init(ws_bar(s.empty[b][h]), ws::kConsumerThreads);  // every consumer thread, once per tile
        }
    }
    ptx::fence_mbar_init();
  }
  if (threadIdx.x == 0) ws_stamp(p, phase::kEntry);
  __syncthreads();
  ptx::pdl_launch_dependents();  // the split merge (if PDL-launched) may start its blocks now

  const int wg = threadIdx.x / 128, wt = threadIdx.x % 128;
  if (wg == 2) {
    ptx::setmaxnreg_dec<Cfg::kProducerRegs>();
    if constexpr (kQ8) ws_produce_q8<kRow>(p, s, w, wt);
    else if constexpr (kRow == RowFormat::kNative16) ws_produce(p, s, w, wt);
    else ws_produce_quant<kRow>(p, s, w, wt);
  } else if (wg == 0) {
    ptx::setmaxnreg_inc<Cfg::kScorerRegs>();
    ws_consume<Elem, kRow, 0, kQ8>(p, s, w, wt);
  } else {
    ptx::setmaxnreg_inc<Cfg::kConsumerRegs>();
    ws_consume<Elem, kRow, 1, kQ8>(p, s, w, wt);
  }
}

template <typename Elem, RowFormat kRow, bool kQ8>
void launch_ws(const KernelParams& p, cudaStream_t stream) {
  using Cfg = WsConfig;  // threads and registers; shared memory from the variant's own plan
  constexpr size_t kSmemBytes = kQ8 ? WsQ8Config::kSmemBytes : WsConfig::kSmemBytes;
  static_assert(!kQ8 || kRow == RowFormat::kFp8E4M3 || kRow == RowFormat::kFp8DsMla, "an e4m3 q reads fp8 rows only");
  auto* kernel = sparse_mla_ws_kernel<Elem, kRow, kQ8>;
  static std::atomic<uint64_t> attribute_set{0};
  int dev = 0;
  SMLA_CHECK(cudaGetDevice(&dev) == cudaSuccess, "cudaGetDevice failed");
  const uint64_t bit = uint64_t(1) << (dev & 63);
  if (!(attribute_set.load(std::memory_order_acquire) & bit)) {
    const cudaError_t ea = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kSmemBytes));
    SMLA_CHECK(ea == cudaSuccess, std::string("cannot raise the sparse MLA kernel's shared memory to ") +
                                      std::to_string(kSmemBytes) + " bytes: " + cudaGetErrorString(ea));
    attribute_set.fetch_or(bit, std::memory_order_release);
  }
  const dim3 grid(unsigned(p.num_tokens * p.head_groups), 1, unsigned(p.num_splits));
  kernel<<<grid, Cfg::kThreads, kSmemBytes, stream>>>(p);
}

}  // namespace smla::cuda::sm90::sparse_mla
