// SM90 sparse MLA, warp-specialized wgmma kernel for 64-head groups: bf16 / fp16 caches at every H
// (heads past H zero-padded), and the quantized formats through a dequantizing producer
// (ws_produce_quant: the launcher routes every quantized format here by default).
//
// One block per (token, 64-head group, top-k split); 3 warpgroups (WsConfig in config.h):
//   producer (warpgroup 2): gathers the rows of two 64-entry tiles per step with cp.async into
//     buffers 0 and 1, each buffer in two halves (dim blocks 0-3, 4-8) with a "full" mbarrier
//     (cp.async arrivals) and an "empty" mbarrier (consumer arrivals); masked entries are
//     zero-filled, never read.
//   consumer w (warpgroup 0 / 1): S_w = Q K_w^T for the tile in buffer w (64 x 64, m64n64k16, Q
//     and K in shared memory), masked online softmax, then its 256 output dims of both tiles:
//     O_w += P_w V_w (P from registers) + P_other V_other (P from shared memory).
// Both tiles' P of a step must share one reference max per row: consumer 0 publishes its max m0,
// consumer 1 takes m1 = max(m0, its own) and publishes it, consumer 0 rescales its P by
// 2^(m0 - m1) before handing it over (and its O before the second product). The exchange runs on
// named barriers between the two consumer warpgroups:
//   kBarM0 (0 -> 1: m0 in m_share), kBarM1 (1 -> 0: m1 in m_share), kBarP0 (0 -> 1: P0 stored),
//   kBarP1 (1 -> 0: P1 stored), kBarConsumers (both: Q loaded, row sums exchanged).
// Release order of the halves (each consumer arrives once its wgmmas reading it completed):
//   buffer 0 dims 0-3: consumer 0 after P0 V0; buffer 1 dims 4-8: consumer 1 after P1 V1;
//   buffer 0 dims 4-8: consumer 1 after P0 V0; buffer 1 dims 0-3: consumer 0 after P1 V1 —
// the order in which the producer refills them.
#pragma once

#include <string>
#include <type_traits>

#include "smla/types.h"

#include "cuda/sm90/sparse_mla/dequant.h"
#include "cuda/sm90/sparse_mla/kernel.cuh"

namespace smla::cuda::sm90::sparse_mla {

namespace ws {
inline constexpr uint32_t kBarConsumers = 1, kBarM0 = 2, kBarM1 = 3, kBarP0 = 4, kBarP1 = 5;
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
  int num_tiles;         // 64-entry tiles in [begin, end)
  int num_steps;         // tile pairs: tile 2 i in buffer 0, 2 i + 1 in buffer 1
  const int32_t* idx_row;
  bool pair;             // pair_share on a 16-bit cache: gathering shared with the other head group
  uint32_t rank;         // pair: this block's rank in its cluster (= head group); else 0
};

__device__ __forceinline__ uint32_t ws_bar(uint64_t& b) { return ptx::smem_addr(&b); }

// Producer: 8 threads per row (thread c copies 16-byte chunk c of each 128-byte dim block); its
// row groups take rows grp, grp + G, grp + 2 G, ... of a tile, chunk c at (c ^ r % 8) in the atom.
// Alone, the 128 producer threads gather all 64 rows of a tile (G = 16). With pair_share the two
// blocks of a token (head groups 0 and 1, one cluster) read the same rows: warps 0-2 of each
// gather rows [32 rank, 32 rank + 32) of every tile (G = 12) and warp 3 forwards them to the other
// block (ws_forward), so every row crosses from L2 once per token instead of twice.
// D = 512 caches get dim block 8 zero-filled, so S always runs over 9 blocks (the Q block is
// zero too) and consumer 0's P can overlay buffer 0's block 8 whatever D is.
namespace ws {
inline constexpr int kPairGatherThreads = 96;  // warps 0-2 of the producer with pair_share
inline constexpr int kPairRows = 32;           // rows of a tile each block of a pair gathers
}  // namespace ws

__device__ __forceinline__ void ws_produce(const KernelParams& p, WsConfig::SharedStorage& s, const WsBlock& w, int wt) {
  using Cfg = WsConfig;
  const bool pair = w.pair;
  const int G = (pair ? ws::kPairGatherThreads : 128) / 8;
  const int nrows = pair ? ws::kPairRows : kBlockK;
  const int row0 = pair ? ws::kPairRows * w.rank : 0;
  const int c = wt & 7, grp = wt >> 3;
  const uint32_t kv_base0 = ptx::smem_addr(s.kv[0]), kv_base1 = ptx::smem_addr(s.kv[1]);
  const bool rope = p.k_steps > kLatent / 16;
  int64_t off[2][4];  // byte offsets of this thread's rows in the step's two tiles (-1: masked)
  auto mine = [&](int i) { return grp + G * i < nrows; };
  auto load_ids = [&](int step) {
#pragma unroll
    for (int b = 0; b < 2; ++b)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int e = w.begin + (2 * step + b) * kBlockK + row0 + grp + G * i;
        const int row = (mine(i) && e < w.end) ? __ldg(w.idx_row + e) : -1;
        off[b][i] = (row >= 0 && row < p.num_rows) ? int64_t(row) * p.kv_row_stride_bytes : int64_t(-1);
      }
  };
  // L2 bulk prefetch of a step's rows (one thread per row), l2_prefetch_steps ahead of its gather.
  auto prefetch = [&](int step) {
    if (!p.l2_prefetch || c != 0 || step >= w.num_steps) return;
#pragma unroll
    for (int b = 0; b < 2; ++b)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int e = w.begin + (2 * step + b) * kBlockK + row0 + grp + G * i;
        const int row = (mine(i) && e < w.end) ? __ldg(w.idx_row + e) : -1;
        if (row >= 0 && row < p.num_rows)
          ptx::prefetch_l2_bulk(p.kv + int64_t(row) * p.kv_row_stride_bytes, uint32_t(p.row_chunks * 16));
      }
  };
  // Dim blocks [kBlk0, kBlk1) of buffer kB's rows.
  auto copy = [&](auto kb, auto kblk0, auto kblk1) {
    constexpr int kB = decltype(kb)::value, kBlk0 = decltype(kblk0)::value, kBlk1 = decltype(kblk1)::value;
    const uint32_t base = kB == 0 ? kv_base0 : kv_base1;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      if (!mine(i)) continue;
      const int r = row0 + grp + G * i;
      const bool ok = off[kB][i] >= 0;
      const uint8_t* src = ok ? p.kv + off[kB][i] + c * 16 : reinterpret_cast<const uint8_t*>(p.idx);
      const uint32_t dst = base + uint32_t(r * Cfg::kAtomBytes + ((c ^ (r & 7)) << 4));
#pragma unroll
      for (int blk = kBlk0; blk < kBlk1; ++blk) {
        const bool ok_blk = ok && (blk < 8 || rope);
        ptx::cp_async_16_zfill(dst + uint32_t(blk * Cfg::kBlockBytes), ok_blk ? src + blk * 128 : src, ok_blk);
      }
    }
  };
  auto landed = [&](int b, int h) {
    ptx::cp_async_mbar_arrive(ws_bar(s.full[b][h]));
    if (pair) ptx::cp_async_mbar_arrive(ws_bar(s.landed[b][h]));
  };
  using I0 = std::integral_constant<int, 0>;
  using I1 = std::integral_constant<int, 1>;
  using I4 = std::integral_constant<int, 4>;
  using I9 = std::integral_constant<int, 9>;
  uint32_t phase = 0;
  if (w.num_steps > 0) load_ids(0);
  for (int step = 1; step < p.l2_prefetch_steps; ++step) prefetch(step);
  for (int step = 0; step < w.num_steps; ++step) {
    ptx::mbar_wait(ws_bar(s.empty[0][0]), phase ^ 1);
    copy(I0{}, I0{}, I4{});
    landed(0, 0);
    ptx::mbar_wait(ws_bar(s.empty[1][1]), phase ^ 1);
    copy(I1{}, I4{}, I9{});
    landed(1, 1);
    ptx::mbar_wait(ws_bar(s.empty[0][1]), phase ^ 1);
    copy(I0{}, I4{}, I9{});
    landed(0, 1);
    ptx::mbar_wait(ws_bar(s.empty[1][0]), phase ^ 1);
    copy(I1{}, I0{}, I4{});
    landed(1, 0);
    // The next step's row ids now (cp.async once their buffers free up); L2 prefetch ahead.
    if (step + 1 < w.num_steps) load_ids(step + 1);
    prefetch(step + p.l2_prefetch_steps);
    phase ^= 1;
  }
}

// pair_share, one thread (warp 3 of the producer): as each half of a buffer lands here, copies
// this block's 32 rows of it (one 4 KiB bulk copy per dim block; the layouts are identical) into
// the other block, completing bytes on that block's full barrier, and arrives on this block's
// full barrier expecting the other block's 32 rows.
// The other block's half is free: the gatherers waited on this block's empty barrier, which both
// blocks' consumers arrive on. Consumer 0's P overlays buffer 0's block 8 only after full, so
// never before the bulk copy has read it.
__device__ __forceinline__ void ws_forward(WsConfig::SharedStorage& s, const WsBlock& w) {
  using Cfg = WsConfig;
  const uint32_t peer = w.rank ^ 1u;
  constexpr uint32_t kRowsBytes = ws::kPairRows * Cfg::kAtomBytes;  // 4 KiB of one dim block
  uint32_t phase = 0;
  for (int step = 0; step < w.num_steps; ++step) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int b = j & 1, h = (j == 1 || j == 2) ? 1 : 0;
      const int blk0 = h == 0 ? 0 : 4, blk1 = h == 0 ? 4 : 9;
      ptx::mbar_wait(ws_bar(s.landed[b][h]), phase);
      ptx::fence_proxy_async_smem();  // the cp.async writes, before the bulk copy reads them
      const uint32_t remote_full = ptx::mapa(ws_bar(s.full[b][h]), peer);
      for (int blk = blk0; blk < blk1; ++blk) {
        const uint32_t src = ptx::smem_addr(s.kv[b][blk]) + uint32_t(ws::kPairRows * w.rank) * Cfg::kAtomBytes;
        ptx::bulk_copy_s2cluster(ptx::mapa(src, peer), src, kRowsBytes, remote_full);
      }
      ptx::bulk_commit();
      // Only buffer 0's dims 4-8 need the source read first: consumer 0's P overlays its block 8
      // once full. Any other half is rewritten only after both blocks released it, and the other
      // block releases it only after these copies completed there.
      if (b == 0 && h == 1) ptx::bulk_wait_read_all();
      ptx::mbar_arrive_expect_tx(ws_bar(s.full[b][h]), uint32_t(blk1 - blk0) * kRowsBytes);
    }
    phase ^= 1;
  }
}

// Producer for the quantized formats. Each half of a buffer is gathered raw with cp.async into a
// staging area inside that half (StageLayout below), then dequantized in place: every producer
// thread reads its raw bytes into registers, the producer warpgroup syncs (kBarProducer), and
// the bf16 chunks are written to their swizzled places. While one half is dequantized the next
// one is already in flight when its buffer is free (one half of look-ahead).
namespace ws {
inline constexpr uint32_t kBarProducer = 6;
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

template <RowFormat kRow>
__device__ __forceinline__ void ws_produce_quant(const KernelParams& p, WsConfig::SharedStorage& s, const WsBlock& w,
                                                 int wt) {
  using Cfg = WsConfig;
  using L = ws::StageLayout<kRow>;
  const int c = wt & 7, grp = wt >> 3;
  const uint32_t kv_base0 = ptx::smem_addr(s.kv[0]), kv_base1 = ptx::smem_addr(s.kv[1]);
  const bool rope = p.k_steps > kLatent / 16;
  const int row_bytes = p.raw_chunks * 16;  // bytes of a stored row the kernel may read
  int64_t off[2][4];                        // byte offsets of this thread's rows (-1: masked)
  auto load_ids = [&](int step) {
#pragma unroll
    for (int b = 0; b < 2; ++b)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int e = w.begin + (2 * step + b) * kBlockK + grp + 16 * i;
        const int row = e < w.end ? __ldg(w.idx_row + e) : -1;
        off[b][i] = (row >= 0 && row < p.num_rows) ? int64_t(row) * p.kv_row_stride_bytes : int64_t(-1);
      }
  };
  // cp.async of half kH of buffer kB (one commit group).
  auto issue = [&](auto kb, auto kh) {
    constexpr int kB = decltype(kb)::value, kH = decltype(kh)::value;
    constexpr ws::StageHalf st = L::h[kH];
    const uint32_t base = kB == 0 ? kv_base0 : kv_base1;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int r = grp + 16 * i;
      const bool ok = off[kB][i] >= 0;
      const uint8_t* row = ok ? p.kv + off[kB][i] : reinterpret_cast<const uint8_t*>(p.idx);
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
    ptx::cp_async_commit();
  };
  // Dequantize half kH of buffer kB once its copies landed (kPending groups issued after it).
  auto convert = [&](auto kb, auto kh, auto kpending) {
    constexpr int kB = decltype(kb)::value, kH = decltype(kh)::value;
    constexpr ws::StageHalf st = L::h[kH];
    constexpr int kBlk0 = kH == 0 ? 0 : 4;
    constexpr int kNb = kH == 0 ? 4 : (kRow == RowFormat::kFp8DsMla ? 4 : 5);  // ds_mla RoPE is in place
    ptx::cp_async_wait<decltype(kpending)::value>();
    ptx::named_sync(ws::kBarProducer, 128);
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
    ptx::named_sync(ws::kBarProducer, 128);  // every raw byte read before any is overwritten
    const uint32_t base = (kB == 0 ? kv_base0 : kv_base1) + uint32_t(grp * Cfg::kAtomBytes + ((c ^ (grp & 7)) << 4));
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
  };

  using I0 = std::integral_constant<int, 0>;
  using I1 = std::integral_constant<int, 1>;
  // Halves in order: (buffer 0, dims 0-3), (1, 4-8), (0, 4-8), (1, 0-3) per step, as the
  // consumers release them. Half q is issued, then half q - 1 dequantized.
  const int num_halves = 4 * w.num_steps;
  auto wait_empty = [&](int q) {
    const int j = q & 3;
    const int b = j & 1, h = (j == 1 || j == 2) ? 1 : 0;
    ptx::mbar_wait(ws_bar(s.empty[b][h]), ((q >> 2) & 1) ^ 1);
  };
  auto issue_q = [&](int q) {
    switch (q & 3) {
      case 0: load_ids(q >> 2); issue(I0{}, I0{}); break;
      case 1: issue(I1{}, I1{}); break;
      case 2: issue(I0{}, I1{}); break;
      default: issue(I1{}, I0{}); break;
    }
  };
  auto convert_q = [&](int q, bool next_issued) {
    switch (q & 3) {
      case 0: next_issued ? convert(I0{}, I0{}, I1{}) : convert(I0{}, I0{}, I0{}); break;
      case 1: next_issued ? convert(I1{}, I1{}, I1{}) : convert(I1{}, I1{}, I0{}); break;
      case 2: next_issued ? convert(I0{}, I1{}, I1{}) : convert(I0{}, I1{}, I0{}); break;
      default: next_issued ? convert(I1{}, I0{}, I1{}) : convert(I1{}, I0{}, I0{}); break;
    }
  };
  if (num_halves > 0) {
    wait_empty(0);
    issue_q(0);
  }
  for (int q = 0; q < num_halves; ++q) {
    // Issue the next half first when its buffer is free already; never wait for it here: the
    // consumers may need this half before they free the next one.
    bool next_issued = false;
    if (q + 1 < num_halves) {
      const int j = (q + 1) & 3;
      const int b = j & 1, h = (j == 1 || j == 2) ? 1 : 0;
      // Lane 0 decides for its warp: the convert() instantiations have their own (aligned)
      // bar.sync instructions, which all lanes of a warp must reach together. Warps may differ:
      // each thread's cp.async groups and waits are its own.
      int free_now = 0;
      if ((wt & 31) == 0) free_now = ptx::mbar_test(ws_bar(s.empty[b][h]), (((q + 1) >> 2) & 1) ^ 1);
      if (__shfl_sync(0xffffffffu, free_now, 0) != 0) {
        issue_q(q + 1);
        next_issued = true;
      }
    }
    convert_q(q, next_issued);
    if (q + 1 < num_halves && !next_issued) {
      wait_empty(q + 1);
      issue_q(q + 1);
    }
  }
}

// Consumer kWg: scores buffer kWg, owns output dims [256 kWg, 256 kWg + 256).
template <typename Elem, int kWg>
__device__ __forceinline__ void ws_consume(const KernelParams& p, WsConfig::SharedStorage& s, const WsBlock& w,
                                           int wt) {
  using Cfg = WsConfig;
  const int warp = wt >> 5, lane = wt & 31;
  const int wrow = warp * 16;              // first of this warp's 16 rows (heads) in the tile
  const int g = lane >> 2, tq = lane & 3;  // fragment row / column pair
  const int tid = kWg * 128 + wt;

  // Q (64 heads x 576) -> shared memory, swizzled 128-byte atoms; heads past H and (D = 512)
  // dim block 8 are zero.
  const uint32_t q_base = ptx::smem_addr(s.q);
  if (w.num_tiles > 0) {
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

  float acc_o[128];  // (64 heads, 256 dims of this warpgroup): [n8 block j][C fragment]
#pragma unroll
  for (int i = 0; i < 128; ++i) acc_o[i] = 0.0f;
  float m_run[2] = {-INFINITY, -INFINITY};  // rows wrow + g, wrow + g + 8 (log2 domain)
  float l_run[2] = {0.0f, 0.0f};

  const uint32_t kv_own = ptx::smem_addr(s.kv[kWg]), kv_peer = ptx::smem_addr(s.kv[kWg ^ 1]);
  const uint32_t p0_addr = ptx::smem_addr(s.kv[0][8]), p1_addr = ptx::smem_addr(s.p1);
  const uint32_t p_own = kWg == 0 ? p0_addr : p1_addr, p_peer = kWg == 0 ? p1_addr : p0_addr;

  // S(64 x 64) = Q K^T over dim blocks [kBlk0, kBlk1) of this warpgroup's buffer.
  float acc_s[32];
  auto score = [&](auto kblk0, auto kblk1, bool first) {
    constexpr int kBlk0 = decltype(kblk0)::value, kBlk1 = decltype(kblk1)::value;
    const uint64_t q_desc = ptx::sw128_desc(q_base, 16, 1024);
    const uint64_t k_desc = ptx::sw128_desc(kv_own, 16, 1024);
#pragma unroll
    for (int b = kBlk0; b < kBlk1; ++b) {
      const uint32_t off = uint32_t(b * (Cfg::kBlockBytes >> 4));
#pragma unroll
      for (int a = 0; a < 4; ++a)
        ptx::wgmma_m64n64k16<Elem>(acc_s, q_desc + off + uint32_t(a * 2), k_desc + off + uint32_t(a * 2),
                                   (first && b == kBlk0 && a == 0) ? 0 : 1);
    }
  };
  using I0 = std::integral_constant<int, 0>;
  using I4 = std::integral_constant<int, 4>;
  using I9 = std::integral_constant<int, 9>;
  // Two commit groups, one per half (consumer 1 starts with its right half, filled first).
  auto issue_scores = [&](uint32_t phase) {
    ptx::mbar_wait(ws_bar(s.full[kWg][kWg]), phase);
    ptx::wgmma_fence();
    if constexpr (kWg == 0) score(I0{}, I4{}, true);
    else score(I4{}, I9{}, true);
    ptx::wgmma_commit();
    ptx::mbar_wait(ws_bar(s.full[kWg][kWg ^ 1]), phase);
    ptx::wgmma_fence();
    if constexpr (kWg == 0) score(I4{}, I9{}, false);
    else score(I0{}, I4{}, false);
    ptx::wgmma_commit();
  };
  // Valid-entry bits of this thread's 16 score columns 8 j + 2 tq + u (bit 2 j + u) of a tile.
  auto column_mask = [&](int tile) {
    uint32_t bits = 0;
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int u = 0; u < 2; ++u) {
        const int e = w.begin + tile * kBlockK + 8 * j + 2 * tq + u;
        if (e < w.end) {
          const int row = __ldg(w.idx_row + e);
          if (row >= 0 && row < p.num_rows) bits |= 1u << (2 * j + u);
        }
      }
    return bits;
  };
  // Masked scores in the log2 domain and the tile's row maxima (quad-reduced).
  auto mask_and_max = [&](uint32_t bits, float (&mx)[2]) {
    mx[0] = mx[1] = -INFINITY;
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const bool ok = (bits >> (2 * j + (i & 1))) & 1u;
        acc_s[4 * j + i] = ok ? acc_s[4 * j + i] * p.scale_log2 : -INFINITY;
        mx[i >> 1] = fmaxf(mx[i >> 1], acc_s[4 * j + i]);
      }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
    }
  };
  // P = 2^(S - ref(m)) in place (fp32); row sums into `sum`.
  auto exponentiate = [&](const float (&m)[2], float (&sum)[2]) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float ref = ws::ref_of(m[r]);
      sum[r] = 0.0f;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        acc_s[4 * j + 2 * r] = ptx::fast_exp2(acc_s[4 * j + 2 * r] - ref);
        acc_s[4 * j + 2 * r + 1] = ptx::fast_exp2(acc_s[4 * j + 2 * r + 1] - ref);
        sum[r] += acc_s[4 * j + 2 * r] + acc_s[4 * j + 2 * r + 1];
      }
    }
  };
  auto scale_o = [&](const float (&f)[2]) {
#pragma unroll
    for (int j = 0; j < 32; ++j) {
      acc_o[4 * j] *= f[0];
      acc_o[4 * j + 1] *= f[0];
      acc_o[4 * j + 2] *= f[1];
      acc_o[4 * j + 3] *= f[1];
    }
  };
  // P (times f per row) as the A fragments of the four k-steps: k-step kk covers columns
  // [16 kk, 16 kk + 16) = n8 blocks 2 kk and 2 kk + 1.
  uint32_t a_p[4][4];
  auto pack_p = [&](const float (&f)[2]) {
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      a_p[kk][0] = Elem::pack(acc_s[8 * kk + 0] * f[0], acc_s[8 * kk + 1] * f[0]);
      a_p[kk][1] = Elem::pack(acc_s[8 * kk + 2] * f[1], acc_s[8 * kk + 3] * f[1]);
      a_p[kk][2] = Elem::pack(acc_s[8 * kk + 4] * f[0], acc_s[8 * kk + 5] * f[0]);
      a_p[kk][3] = Elem::pack(acc_s[8 * kk + 6] * f[1], acc_s[8 * kk + 7] * f[1]);
    }
  };
  auto fence_a_p = [&]() {
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) ptx::fence_operands(a_p[kk]);
  };
  // The packed P -> shared memory (64 x 64, K-major, swizzled) for the other warpgroup.
  auto store_p = [&]() {
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int row = wrow + g + 8 * r;
        const uint32_t row_base = p_own + uint32_t(row * (kBlockK * 2) + tq * 4);
        asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(row_base + (swizzle(row, 2 * kk) << 4)), "r"(a_p[kk][r])
                     : "memory");
        asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(row_base + (swizzle(row, 2 * kk + 1) << 4)),
                     "r"(a_p[kk][2 + r])
                     : "memory");
      }
  };
  // O += P_own V_own (P from registers) / P_peer V_peer (P from shared memory), this warpgroup's dims.
  auto pv_own = [&]() {
    const uint64_t v_desc = ptx::sw128_desc(kv_own + uint32_t(kWg * 4 * Cfg::kBlockBytes), Cfg::kBlockBytes, 1024);
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
      ptx::wgmma_m64n256k16_rs_tb<Elem>(acc_o, a_p[kk], v_desc + uint32_t((kk * 16 * Cfg::kAtomBytes) >> 4));
  };
  auto pv_peer = [&]() {
    const uint64_t v_desc = ptx::sw128_desc(kv_peer + uint32_t(kWg * 4 * Cfg::kBlockBytes), Cfg::kBlockBytes, 1024);
    const uint64_t a_desc = ptx::sw128_desc(p_peer, 16, 1024);
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
      ptx::wgmma_m64n256k16_tb<Elem>(acc_o, a_desc + uint32_t((kk * 32) >> 4),
                                     v_desc + uint32_t((kk * 16 * Cfg::kAtomBytes) >> 4));
  };
  const float one[2] = {1.0f, 1.0f};

  // A half of a buffer is free for the producer: every thread here has seen its wgmmas reading
  // it complete. With pair_share the other block's producer writes into it too, so each warp
  // also arrives (once) on the other block's empty barrier.
  auto release = [&](int b, int h) {
    ptx::mbar_arrive(ws_bar(s.empty[b][h]));
    if (w.pair) {
      __syncwarp();
      if (lane == 0) ptx::mbar_arrive_cluster(ptx::mapa(ws_bar(s.empty[b][h]), w.rank ^ 1u));
    }
  };

  uint32_t phase = 0;
  if constexpr (kWg == 0) {
    uint32_t bits = 0;
    if (w.num_steps > 0) {
      issue_scores(phase);
      bits = column_mask(0);
      ptx::wgmma_wait<0>();
      ptx::fence_operands(acc_s);
    }
    for (int step = 0; step < w.num_steps; ++step) {
      float mx[2], m0[2], sum[2], f[2];
      mask_and_max(bits, mx);
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        m0[r] = fmaxf(m_run[r], mx[r]);
        f[r] = ws::rescale(m_run[r], m0[r]);
      }
      if (tq == 0) {
        s.m_share[wrow + g] = m0[0];
        s.m_share[wrow + g + 8] = m0[1];
      }
      ptx::named_arrive(ws::kBarM0, ws::kConsumerThreads);
      scale_o(f);
      exponentiate(m0, sum);
#pragma unroll
      for (int r = 0; r < 2; ++r) l_run[r] = l_run[r] * f[r] + sum[r];
      pack_p(one);
      // O += P0 V0 (dims 0-255 of buffer 0); then buffer 0's dims 0-3 are free.
      ptx::wgmma_fence();
      pv_own();
      ptx::wgmma_commit();
      ptx::wgmma_wait<0>();
      ptx::fence_operands(acc_o);
      fence_a_p();
      release(0, 0);
      // Consumer 1's max m1 >= m0: move P0, O and the sum onto it, hand P0 over.
      ptx::named_sync(ws::kBarM1, ws::kConsumerThreads);
      float m1[2];
      m1[0] = s.m_share[wrow + g];
      m1[1] = s.m_share[wrow + g + 8];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        f[r] = ws::rescale(m0[r], m1[r]);
        m_run[r] = m1[r];
        l_run[r] *= f[r];
      }
      pack_p(f);
      store_p();
      ptx::fence_proxy_async_smem();
      ptx::named_arrive(ws::kBarP0, ws::kConsumerThreads);
      scale_o(f);
      ptx::named_sync(ws::kBarP1, ws::kConsumerThreads);
      // O += P1 V1 (dims 0-255 of buffer 1), the next step's S behind it.
      ptx::wgmma_fence();
      pv_peer();
      ptx::wgmma_commit();
      if (step + 1 < w.num_steps) {
        phase ^= 1;
        issue_scores(phase);
        bits = column_mask(2 * (step + 1));
        ptx::wgmma_wait<2>();  // P1 V1 done (the two score groups may still run)
        ptx::fence_operands(acc_o);
        release(1, 0);
        ptx::wgmma_wait<0>();
        ptx::fence_operands(acc_s);
      } else {
        ptx::wgmma_wait<0>();
        ptx::fence_operands(acc_o);
        release(1, 0);
      }
    }
  } else {
    for (int step = 0; step < w.num_steps; ++step) {
      issue_scores(phase);
      const uint32_t bits = column_mask(2 * step + 1);
      ptx::wgmma_wait<0>();
      ptx::fence_operands(acc_s);
      float mx[2], m1[2], sum[2], f[2];
      mask_and_max(bits, mx);
      ptx::named_sync(ws::kBarM0, ws::kConsumerThreads);
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        m1[r] = fmaxf(s.m_share[wrow + g + 8 * r], mx[r]);
        f[r] = ws::rescale(m_run[r], m1[r]);
        m_run[r] = m1[r];
      }
      if (tq == 0) {
        s.m_share[wrow + g] = m1[0];
        s.m_share[wrow + g + 8] = m1[1];
      }
      ptx::named_arrive(ws::kBarM1, ws::kConsumerThreads);
      scale_o(f);
      exponentiate(m1, sum);
#pragma unroll
      for (int r = 0; r < 2; ++r) l_run[r] = l_run[r] * f[r] + sum[r];
      pack_p(one);
      // O += P1 V1 (dims 256-511 of buffer 1), then P1 to shared memory and O += P0 V0.
      ptx::wgmma_fence();
      pv_own();
      ptx::wgmma_commit();
      store_p();
      ptx::fence_proxy_async_smem();
      ptx::named_sync(ws::kBarP0, ws::kConsumerThreads);
      ptx::wgmma_fence();
      pv_peer();
      ptx::wgmma_commit();
      ptx::named_arrive(ws::kBarP1, ws::kConsumerThreads);
      ptx::wgmma_wait<1>();
      fence_a_p();
      release(1, 1);
      ptx::wgmma_wait<0>();
      ptx::fence_operands(acc_o);
      release(0, 1);
      phase ^= 1;
    }
  }

  // ---- row sums: quad, then the two warpgroups (both relative to the same final max).
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l_run[r] += __shfl_xor_sync(0xffffffffu, l_run[r], 1);
    l_run[r] += __shfl_xor_sync(0xffffffffu, l_run[r], 2);
  }
  if (tq == 0) {
    s.l_part[kWg][wrow + g] = l_run[0];
    s.l_part[kWg][wrow + g + 8] = l_run[1];
  }
  ptx::named_sync(ws::kBarConsumers, ws::kConsumerThreads);

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = wrow + g + 8 * r;
    const int h = w.head0 + row;
    if (h >= p.num_heads) continue;
    const float l = s.l_part[0][row] + s.l_part[1][row];
    const float m = m_run[r];
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
}

template <typename Elem, RowFormat kRow>
__global__ void __launch_bounds__(WsConfig::kThreads, 1) sparse_mla_ws_kernel(const __grid_constant__ KernelParams p) {
  using Cfg = WsConfig;
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  auto& s = *reinterpret_cast<Cfg::SharedStorage*>(smem_raw);

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
  w.num_steps = (w.num_tiles + 1) / 2;
  w.idx_row = p.idx + w.t * p.idx_stride_t;

  const bool pair = kRow == RowFormat::kNative16 && p.pair_share;
  w.pair = pair;
  w.rank = pair ? ptx::cluster_ctarank() : 0u;
  if (threadIdx.x == 0) {
    for (int b = 0; b < 2; ++b)
      for (int h = 0; h < 2; ++h) {
        // full: every gathering producer thread's cp.async arrival (+ the forwarder's, expecting
        // the other block's rows); empty: every thread of the releasing consumer (+ one per warp
        // of the other block's); landed: the gatherers' own rows (pair_share).
        ptx::mbar_init(ws_bar(s.full[b][h]), pair ? ws::kPairGatherThreads + 1 : 128);
        ptx::mbar_init(ws_bar(s.empty[b][h]), pair ? 128 + 4 : 128);
        ptx::mbar_init(ws_bar(s.landed[b][h]), ws::kPairGatherThreads);
      }
    ptx::fence_mbar_init();
  }
  // With pair_share the other block arrives on these barriers: both must be initialized first.
  if (pair) ptx::cluster_sync();
  else __syncthreads();
  ptx::pdl_launch_dependents();  // the split merge (if PDL-launched) may start its blocks now

  const int wg = threadIdx.x / 128, wt = threadIdx.x % 128;
  if (wg == 2) {
    ptx::setmaxnreg_dec<Cfg::kProducerRegs>();
    if constexpr (kRow == RowFormat::kNative16) {
      if (!pair || wt < ws::kPairGatherThreads) ws_produce(p, s, w, wt);
      else if (wt == ws::kPairGatherThreads) ws_forward(s, w);
    } else {
      ws_produce_quant<kRow>(p, s, w, wt);
    }
  } else {
    ptx::setmaxnreg_inc<Cfg::kConsumerRegs>();
    if (wg == 0) ws_consume<Elem, 0>(p, s, w, wt);
    else ws_consume<Elem, 1>(p, s, w, wt);
  }
  // No block of a pair leaves while the other may still copy into it or arrive on its barriers.
  if (pair) {
    __syncwarp();
    ptx::cluster_sync();
  }
}

template <typename Elem, RowFormat kRow>
void launch_ws(const KernelParams& p, cudaStream_t stream) {
  using Cfg = WsConfig;
  auto* kernel = sparse_mla_ws_kernel<Elem, kRow>;
  static std::atomic<uint64_t> attribute_set{0};
  int dev = 0;
  SMLA_CHECK(cudaGetDevice(&dev) == cudaSuccess, "cudaGetDevice failed");
  const uint64_t bit = uint64_t(1) << (dev & 63);
  if (!(attribute_set.load(std::memory_order_acquire) & bit)) {
    const cudaError_t ea = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(Cfg::kSmemBytes));
    SMLA_CHECK(ea == cudaSuccess, std::string("cannot raise the sparse MLA kernel's shared memory to ") +
                                      std::to_string(Cfg::kSmemBytes) + " bytes: " + cudaGetErrorString(ea));
    // The setmaxnreg budget (config.h) assumes this allocation; another one would make the
    // consumers wait forever for registers, so refuse to launch instead.
    cudaFuncAttributes attr{};
    const cudaError_t e = cudaFuncGetAttributes(&attr, kernel);
    SMLA_CHECK(e == cudaSuccess && attr.numRegs == Cfg::kLaunchRegs,
               "warp-specialized sparse MLA kernel compiled with " + std::to_string(attr.numRegs) +
                   " registers per thread, its register reallocation needs " + std::to_string(Cfg::kLaunchRegs) +
                   "; rebuild, or set SMLA_SM90_KERNEL=mma");
    attribute_set.fetch_or(bit, std::memory_order_release);
  }
  const dim3 grid(unsigned(p.num_tokens * p.head_groups), 1, unsigned(p.num_splits));
  if (!p.pair_share) {
    kernel<<<grid, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(p);
    return;
  }
  // The two head groups of a token (adjacent on grid.x) as one cluster.
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = dim3(Cfg::kThreads);
  cfg.dynamicSmemBytes = Cfg::kSmemBytes;
  cfg.stream = stream;
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim.x = 2, attr.val.clusterDim.y = 1, attr.val.clusterDim.z = 1;
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
  const cudaError_t e = cudaLaunchKernelEx(&cfg, kernel, p);
  SMLA_CHECK(e == cudaSuccess, std::string("sparse MLA kernel launch (cluster of 2) failed: ") + cudaGetErrorString(e));
}

}  // namespace smla::cuda::sm90::sparse_mla
