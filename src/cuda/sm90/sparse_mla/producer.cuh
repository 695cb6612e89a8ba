// SM90 sparse MLA, warp-specialized kernel: the producer (warpgroup 2). It gathers the rows of one
// 64-entry tile at a time with cp.async into buffer i % 2 for tile i, each buffer in two halves
// (dim blocks 0-3, 4-8) with a "full" mbarrier (cp.async arrivals) and an "empty" mbarrier
// (consumer arrivals); masked entries are zero-filled, never read. Tile i + 1 is gathered while the
// consumers compute tile i. Quantized caches: raw bytes into a staging area of each half, signalled
// on a "raw" mbarrier (consumer 1 dequantizes them in place); the fp8 score path: raw rows in two
// stages, read by the fp8 tensor cores as they are.
#pragma once

#include <type_traits>

#include "cuda/sm90/sparse_mla/ws_common.cuh"

namespace smla::cuda::sm90::sparse_mla {

// Producer: 8 threads per row (thread c copies 16-byte chunk c of each 128-byte dim block), 16
// rows at a time: row r = grp + 16 i of a tile (i < 4), its chunk c at (c ^ r % 8) in the atom.
// D = 512 caches get dim block 8 zero-filled, so S always runs over 9 blocks (the Q block is
// zero too).
__device__ __forceinline__ void ws_produce(const KernelParams& p, WsConfig::SharedStorage& s, const WsBlock& w, int wt) {
  using Cfg = WsConfig;
  const int c = wt & 7, grp = wt >> 3;
  const uint32_t dst0 = uint32_t(grp * Cfg::kAtomBytes + ((c ^ (grp & 7)) << 4));
  const bool rope = p.k_steps > kLatent / 16;
  // Row ids one tile ahead (as ws_produce_quant): tile t + 1's ids are loaded when tile t's rows
  // are taken, so their latency runs under tile t's empty wait and copies, not in front of the
  // next refill (docs/perf-history.md#s13-bf16blk). Rows are kept as ids (-1: masked) and turned
  // into byte offsets at each copy: 4 registers fewer than offsets (the producer has 56).
  int rows[4], next_rows[4];
  auto fetch_rows = [&](int tile) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int e = w.begin + tile * kBlockK + grp + 16 * i;
      next_rows[i] = e < w.end ? __ldg(w.idx_row + e) : -1;  // (e < end: tile < num_tiles)
    }
  };
  auto load_ids = [&](int tile) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int row = next_rows[i];
      rows[i] = (row >= 0 && row < p.num_rows) ? row : -1;
    }
    fetch_rows(tile + 1);
  };
  // Dim blocks [kBlk0, kBlk1) of the tile's rows into the buffer at `base`. L2 fetches are 256
  // bytes (DRAM runs faster than with 128), except a row's last block when it starts a 256-byte
  // segment: its fetch would pull the next 128 bytes (another row's) from DRAM too (ncu, H = 64,
  // T = 512: DRAM reads 1.27 -> 1.21 GB, the rows' own bytes; docs/perf-history.md, session 7).
  auto copy = [&](uint32_t base, auto kblk0, auto kblk1) {
    constexpr int kBlk0 = decltype(kblk0)::value, kBlk1 = decltype(kblk1)::value;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const bool ok = rows[i] >= 0;
      const uint8_t* src =
          ok ? p.kv + int64_t(rows[i]) * p.kv_row_stride_bytes + c * 16 : reinterpret_cast<const uint8_t*>(p.idx);
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
  if (w.num_tiles > 0) {
    fetch_rows(0);
    load_ids(0);
  }
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
    // The next tile's offsets from ids loaded a tile ago, and the ids of the tile after it.
    if (tile + 1 < w.num_tiles) load_ids(tile + 1);
  }
  if (wt == 0) ws_stamp(p, phase::kProducerDone);
}

// Producer for the quantized formats: gathers each half's raw bytes with cp.async into its
// staging area (StageLayout; fp8_ds_mla's bf16 RoPE straight to dim block 8) and signals the
// half's "raw" mbarrier; consumer 1 dequantizes it in place (ws_convert_half).
template <KvFormat kFormat>
__device__ __forceinline__ void ws_produce_quant(const KernelParams& p, WsConfig::SharedStorage& s, const WsBlock& w,
                                                 int wt) {
  using Cfg = WsConfig;
  using L = StageLayout<kFormat>;
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
    constexpr StageHalf st = L::h[kH];
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
      if constexpr (kFormat == KvFormat::kFP8DsMla && kH == 1) {  // bf16 RoPE: straight to block 8
        const bool valid = ok && rope;
        ptx::cp_async_16_zfill(base + uint32_t(8 * Cfg::kBlockBytes + r * Cfg::kAtomBytes + ((c ^ (r & 7)) << 4)),
                               valid ? row + row_layout(kFormat).rope_offset + 16 * c : row, valid);
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

// Producer: 8 threads per row as ws_produce (thread c: 16-byte chunk c of each 128-byte block),
// rows grp + 16 i; the row's e4m3 latent into blocks 0-3 of its stage, its RoPE into block 4
// (fp8_e4m3: 64 e4m3 bytes, chunks 0-3; fp8_ds_mla: 128 bf16 bytes) and (fp8_ds_mla) its four
// tile scales into ks. Masked entries are zero-filled, never read.
template <KvFormat kFormat>
__device__ __forceinline__ void ws_produce_q8(const KernelParams& p, WsQ8Config::SharedStorage& s, const WsBlock& w,
                                              int wt) {
  constexpr bool kDs = kFormat == KvFormat::kFP8DsMla;
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
      constexpr int rope_at = row_layout(kFormat).rope_offset;
      if (kDs || c < 4) {
        const bool valid = ok && rope;
        ptx::cp_async_16_zfill(ptx::smem_addr(s.k[st][4]) + dst, valid ? row + rope_at + 16 * c : row, valid);
      }
      if (kDs && c == 0) ptx::cp_async_16_zfill(ptx::smem_addr(s.ks[st][r]), ok ? row + row_layout(kFormat).scale_offset : row, ok);
    }
    ptx::cp_async_mbar_arrive(ws_bar(s.full[st]));
    if (tile + 1 < w.num_tiles) load_ids(tile + 1);
  }
}

}  // namespace smla::cuda::sm90::sparse_mla
