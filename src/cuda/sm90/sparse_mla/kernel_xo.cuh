// SM90 sparse MLA, the crossover variant of the warp-specialized kernel (`h128.xo`): fp8_ds_mla at
// 64 < H <= 128, opt-in (SMLA_SM90_CROSSOVER=1; docs/perf-history.md s12-crossover). A token's two
// 64-head blocks (the same split) run as a cluster of 2, cluster rank = head group. Each gathers raw
// and dequantizes only rows [32 rank, 32 rank + 32) of every tile (xo_layout.h), and writes every
// bf16 chunk twice: into its own tile buffer and, over distributed shared memory (st.async), into
// the peer's. So each block converts half of what h64.ws converts, and reads half the raw bytes.
// The scorer, consumer 1's P V and the epilogue are h64.ws's code on the same bf16 tiles, in the
// same wgmma order: the output is h64.ws's, bit for bit.
//
// Barriers per tile buffer b and half h (dim blocks 0-3 | 4-8), in each CTA:
//   raw[b][h]    this CTA's raw rows of the half landed (its 128 producer threads' cp.async)
//   full[b][h]   all 64 bf16 rows of the half there: this CTA's 128 converter arrivals, and the
//                peer's 16 KiB of st.async bytes (converter thread 0 adds them to the phase)
//   empty[b][h]  this CTA's consumers are done with the half (256 arrivals, as h64.ws)
//   xempty[b][h] the peer's consumers are done with the peer's copy: one remote arrival from the
//                peer's producer once the peer's empty[b][h] completed. This CTA's converter waits
//                for it before writing into the peer. It carries no data, only write-after-read
//                (ptx::mbar_arrive_remote: no cluster-scope fence in the producer's path).
// A converter writes into the peer's buffer only after that (xempty), and into its own once its raw
// rows landed (its producer waited for empty first); its raw staging lies in its own rows of the
// half, which the peer never writes. Both blocks run the same tiles, so every remote write and
// arrival is awaited by the receiving block before it can finish; a cluster barrier after the
// barrier init and one before exit bracket every DSMEM access anyway.
//
// Register-staged mode (kRegs: SMLA_SM90_XO_REGS=1 with the crossover on; docs/perf-history.md
// s12-flashmla-h128), FlashMLA's division of labour: no raw byte passes through shared memory and
// consumer 1 converts nothing. The producer warpgroup is the converter (ws_produce_xr): it loads its
// 32 rows' e4m3 bytes and tile scales straight from global memory into registers a tile ahead
// (ld.global.nc), and per half, once this CTA's copy is free (empty) and the peer's (xempty), writes
// the bf16 chunks here and into the peer, gathers the half's bf16 RoPE (half 1) by cp.async and arrives
// on full; consumer 1 runs the bf16 P V loop. full[b][1] then counts 256 arrivals (the producer
// threads' conversion and their RoPE copies landing). Registers 232 / 168 / 104 (XrRegs). The same
// bytes reach the same conversion and the same wgmma order: the same bits.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <string>
#include <type_traits>

#include "cuda/sm90/sparse_mla/kernel_ws.cuh"
#include "cuda/sm90/sparse_mla/xo_layout.h"

namespace smla::cuda::sm90::sparse_mla {

// h64.ws's shared-memory plan and the four xempty barriers.
struct XoSmem {
  WsConfig::SharedStorage ws;
  uint64_t xempty[2][2];  // [buffer][half], see above
};
static_assert(sizeof(XoSmem) <= kSmemLimit, "crossover variant: shared memory over 227 KiB");

// Producer (warpgroup 2): row ids and offsets of all 64 rows of the tile (8 threads per row as
// ws_produce_quant: thread c, rows grp + 16 i); the latent and scales of this CTA's 32 rows into its
// staging (xo::copy_dst), the bf16 RoPE of all 64 rows straight to dim block 8 (not exchanged:
// block 8 is this CTA's, and holds P after S). Masked entries are zero-filled, never read. After
// each empty wait, thread 0 tells the peer (xempty) that this CTA's copy of the half is free.
template <KvFormat kFormat>
__device__ __forceinline__ void ws_produce_xo(const KernelParams& p, XoSmem& x, const WsBlock& w, int wt,
                                              uint32_t rank) {
  static_assert(kFormat == KvFormat::kFP8DsMla, "the crossover variant reads fp8_ds_mla rows");
  using Cfg = WsConfig;
  constexpr RowLayout L = row_layout(kFormat);
  auto& s = x.ws;
  const int c = wt & 7, grp = wt >> 3;
  const uint32_t kv_base0 = ptx::smem_addr(s.kv[0]), kv_base1 = ptx::smem_addr(s.kv[1]);
  const bool rope = p.k_steps > kLatent / 16;
  const int row_bytes = p.raw_chunks * 16;  // bytes of a stored row the kernel may read
  const uint32_t peer = rank ^ 1u;
  int64_t off[4];  // byte offsets of rows grp + 16 i of the next tile (-1: masked)
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
  auto issue = [&](uint32_t base, auto kh) {
    constexpr int kH = decltype(kh)::value;
#pragma unroll
    for (int i = 0; i < 2; ++i) {  // this CTA's local row rl = grp + 16 i (tile row 32 rank + rl)
      const int rl = grp + 16 * i;
      const int64_t o = rank != 0 ? off[2 + i] : off[i];
      const bool ok = o >= 0;
      const uint8_t* row = ok ? p.kv + o : reinterpret_cast<const uint8_t*>(p.idx);
#pragma unroll
      for (int k = c; k < xo::kStageCopies; k += 8) {
        const int src_off = xo::copy_src(kH, k, L.scale_offset);
        const bool valid = ok && src_off < row_bytes;
        ptx::cp_async_16_zfill(base + uint32_t(xo::copy_dst(kH, int(rank), rl, k)), valid ? row + src_off : row, valid);
      }
    }
    if constexpr (kH == 1) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int r = grp + 16 * i;
        const bool ok = off[i] >= 0;
        const uint8_t* row = ok ? p.kv + off[i] : reinterpret_cast<const uint8_t*>(p.idx);
        const bool valid = ok && rope;
        ptx::cp_async_16_zfill(base + uint32_t(8 * Cfg::kBlockBytes + r * Cfg::kAtomBytes + ((c ^ (r & 7)) << 4)),
                               valid ? row + L.rope_offset + 16 * c : row, valid);
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
    if (wt == 0) ptx::mbar_arrive_remote(ptx::mapa_shared(ws_bar(x.xempty[b][0]), peer));
    issue(base, I0{});
    ptx::cp_async_mbar_arrive(ws_bar(s.raw[b][0]));
    ptx::mbar_wait(ws_bar(s.empty[b][1]), parity);
    if (wt == 0) ptx::mbar_arrive_remote(ptx::mapa_shared(ws_bar(x.xempty[b][1]), peer));
    issue(base, I1{});
    ptx::cp_async_mbar_arrive(ws_bar(s.raw[b][1]));
  }
  if (wt == 0) ws_stamp(p, phase::kProducerDone);
}

// Consumer 1 dequantizes half kH of buffer kB for both CTAs: this CTA's 32 rows (thread wt: local
// rows grp + 16 i, i < 2, chunk c of each of the half's four latent blocks), read from its staging
// into registers, the warpgroup synced (every raw byte read before any is overwritten), then each
// bf16 chunk stored here and, once the peer's copy is free (xempty), st.async'd into the peer,
// completing bytes on the peer's full barrier. Arrives on this CTA's full barrier.
template <KvFormat kFormat, int kB, int kH>
__device__ __forceinline__ void ws_convert_half_xo(XoSmem& x, int wt, uint32_t parity, uint32_t rank) {
  auto& s = x.ws;
  const int c = wt & 7, grp = wt >> 3;
  ptx::mbar_wait(ws_bar(s.raw[kB][kH]), parity);
  const uint8_t* buf = reinterpret_cast<const uint8_t*>(s.kv[kB]);
  uint32_t lo[2][4], hi[2][4];
  float sc[2][4];
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int rl = grp + 16 * i, blk = 4 * kH + j;
      dq::ld_u32x2(buf + xo::stage_chunk(kH, int(rank), rl, blk, c), lo[i][j], hi[i][j]);
      sc[i][j] = num::bits_f32(dq::ld_u32(buf + xo::stage_scale_of(kH, int(rank), rl, blk)));
    }
  bar_sync(Bar::kConvert, 128);
  const uint32_t full = ws_bar(s.full[kB][kH]);
  ptx::mbar_wait_cluster(ws_bar(x.xempty[kB][kH]), parity);  // the peer's copy of the half is free
  if (wt == 0) ptx::mbar_expect_tx(full, xo::kPeerBytesPerHalf);  // the peer's rows, into this phase
  const uint32_t peer = rank ^ 1u;
  const uint32_t local = ptx::smem_addr(s.kv[kB]) + uint32_t(xo::bf16_chunk(xo::row_of(int(rank), grp), 0, c));
  const uint32_t remote = ptx::mapa_shared(local, peer), remote_full = ptx::mapa_shared(full, peer);
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const dq::Chunk v = dq::e4m3x8_scaled_fast(lo[i][j], hi[i][j], sc[i][j]);
      const uint32_t o = uint32_t((4 * kH + j) * WsConfig::kBlockBytes + 16 * i * WsConfig::kAtomBytes);
      ptx::st_shared_v4(local + o, v.w);
      ptx::st_async_v4(remote + o, v.w, remote_full);
    }
  ptx::fence_proxy_async_smem();
  ptx::mbar_arrive(full);
}

// Half kH of `tile` (buffer tile % 2).
template <KvFormat kFormat, int kH>
__device__ __forceinline__ void ws_convert_xo(XoSmem& x, int wt, int tile, uint32_t rank) {
  const uint32_t parity = (tile >> 1) & 1;
  if (tile & 1) ws_convert_half_xo<kFormat, 1, kH>(x, wt, parity, rank);
  else ws_convert_half_xo<kFormat, 0, kH>(x, wt, parity, rank);
}

// ---- Register-staged mode (kRegs): the producer converts from registers.
// Registers (setmaxnreg) of the mode: consumer 1 only multiplies (O, the loop and the epilogue: 168,
// the launch allocation; 160 spilled 60 bytes), the producer holds two halves of raw rows a tile ahead
// besides its copies' addresses (104; 96 spilled 16 bytes).
struct XrRegs {
  static constexpr int kScorer = WsConfig::kScorerRegs;
  static constexpr int kConsumer = WsConfig::kLaunchRegs;  // 168
  static constexpr int kProducer = 104;
};
static_assert(XrRegs::kScorer + XrRegs::kConsumer + XrRegs::kProducer ==
                  WsConfig::kScorerRegs + WsConfig::kConsumerRegs + WsConfig::kProducerRegs,
              "register-staged crossover: the setmaxnreg total must stay WsConfig's (the launch allocation)");

// This thread's raw bytes of one half of a tile: e4m3 bytes of bf16 chunk c of block 4h + j of its
// local rows grp + 16 i (tile rows 32 rank + grp + 16 i), and the half's two tile scales of each row.
struct XrHalf {
  uint32_t lo[2][4], hi[2][4];
  float sc[2][2];
};

// Issues the loads of half kH of the rows `ids` (ld.global.nc, 8 bytes each); a masked row (id out of
// range) gives zeros, as the staged mode's zero-filled copies. Read a tile later, by xr_convert_half.
template <KvFormat kFormat, int kH>
__device__ __forceinline__ void xr_load(const KernelParams& p, int c, const int (&ids)[2], XrHalf& r) {
  constexpr RowLayout L = row_layout(kFormat);
  const int row_bytes = p.raw_chunks * 16;  // (an fp8_ds_mla row's latent and scales always lie inside it)
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const bool ok = ids[i] >= 0 && ids[i] < p.num_rows;
    const uint8_t* row = p.kv + (ok ? int64_t(ids[i]) * p.kv_row_stride_bytes : int64_t(0));
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int src = xo::reg_src(4 * kH + j, c);
      if (ok && (src & ~15) < row_bytes) ptx::ld_global_nc_v2(r.lo[i][j], r.hi[i][j], row + src);
      else r.lo[i][j] = r.hi[i][j] = 0u;
    }
    const int ssrc = xo::reg_scales_src(kH, L.scale_offset);
    uint32_t s0 = 0u, s1 = 0u;
    if (ok && (ssrc & ~15) < row_bytes) ptx::ld_global_nc_v2(s0, s1, row + ssrc);
    r.sc[i][0] = num::bits_f32(s0), r.sc[i][1] = num::bits_f32(s1);
  }
}

// ws_convert_half_xo from registers, by the producer after its empty wait: waits for the peer's copy of
// the half (xempty), converts and stores here and into the peer, and arrives on this CTA's full barrier.
// No warpgroup barrier: nothing is overwritten that another thread has yet to read.
template <int kH>
__device__ __forceinline__ void xr_convert_half(XoSmem& x, int wt, int b, uint32_t parity, uint32_t rank,
                                                const XrHalf& r) {
  auto& s = x.ws;
  const int c = wt & 7, grp = wt >> 3;
  const uint32_t full = ws_bar(s.full[b][kH]);
  ptx::mbar_wait_cluster(ws_bar(x.xempty[b][kH]), parity);  // the peer's copy of the half is free
  if (wt == 0) ptx::mbar_expect_tx(full, xo::kPeerBytesPerHalf);
  const uint32_t peer = rank ^ 1u;
  const uint32_t local = ptx::smem_addr(s.kv[b]) + uint32_t(xo::bf16_chunk(xo::row_of(int(rank), grp), 0, c));
  const uint32_t remote = ptx::mapa_shared(local, peer), remote_full = ptx::mapa_shared(full, peer);
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const dq::Chunk v = dq::e4m3x8_scaled_fast(r.lo[i][j], r.hi[i][j], r.sc[i][xo::reg_scale_slot(kH, 4 * kH + j)]);
      const uint32_t o = uint32_t((4 * kH + j) * WsConfig::kBlockBytes + 16 * i * WsConfig::kAtomBytes);
      ptx::st_shared_v4(local + o, v.w);
      ptx::st_async_v4(remote + o, v.w, remote_full);
    }
  ptx::fence_proxy_async_smem();
  ptx::mbar_arrive(full);
}

// The producer of the register-staged mode (warpgroup 2; 8 threads per row as ws_produce_xo: thread c,
// rows grp + 16 i of each tile, i < 4; this CTA's converted rows are i = 2 rank, 2 rank + 1). Per tile u
// and half h: wait until this CTA's copy is free (empty), tell the peer (xempty), half 1: the RoPE of the
// 64 rows by cp.async to dim block 8 (arriving on full when landed), convert the half of tile u from
// registers, then load the half of tile u + 1 into them. Row ids two tiles ahead, so no id latency
// sits in front of a load.
template <KvFormat kFormat>
__device__ __forceinline__ void ws_produce_xr(const KernelParams& p, XoSmem& x, const WsBlock& w, int wt,
                                              uint32_t rank) {
  static_assert(kFormat == KvFormat::kFP8DsMla, "the crossover variant reads fp8_ds_mla rows");
  using Cfg = WsConfig;
  constexpr RowLayout L = row_layout(kFormat);
  auto& s = x.ws;
  const int c = wt & 7, grp = wt >> 3;
  const bool rope = p.k_steps > kLatent / 16;
  const uint32_t peer = rank ^ 1u;
  const int n = w.num_tiles;
  auto fetch = [&](int tile, int (&ids)[4]) {  // row ids of rows grp + 16 i of `tile` (-1: none)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int e = w.begin + tile * kBlockK + grp + 16 * i;
      ids[i] = (tile < n && e < w.end) ? __ldg(w.idx_row + e) : -1;
    }
  };
  auto mine = [&](const int (&ids)[4], int (&m)[2]) {  // this CTA's two rows of them
    m[0] = rank != 0 ? ids[2] : ids[0];
    m[1] = rank != 0 ? ids[3] : ids[1];
  };
  int ids0[4], ids1[4], ids2[4];  // tiles u, u + 1, u + 2
  XrHalf r0, r1;                  // halves 0 / 1 of tile u (loaded during tile u - 1)
  fetch(0, ids0);
  fetch(1, ids1);
  {
    int m[2];
    mine(ids0, m);
    xr_load<kFormat, 0>(p, c, m, r0);
    xr_load<kFormat, 1>(p, c, m, r1);
  }
  for (int tile = 0; tile < n; ++tile) {
    const int b = tile & 1;
    const uint32_t parity = ((tile >> 1) & 1) ^ 1, xparity = (tile >> 1) & 1;
    fetch(tile + 2, ids2);
    int m1[2];
    mine(ids1, m1);
    ptx::mbar_wait(ws_bar(s.empty[b][0]), parity);
    if (wt == 0) ptx::mbar_arrive_remote(ptx::mapa_shared(ws_bar(x.xempty[b][0]), peer));
    xr_convert_half<0>(x, wt, b, xparity, rank, r0);
    if (tile + 1 < n) xr_load<kFormat, 0>(p, c, m1, r0);
    ptx::mbar_wait(ws_bar(s.empty[b][1]), parity);
    if (wt == 0) ptx::mbar_arrive_remote(ptx::mapa_shared(ws_bar(x.xempty[b][1]), peer));
    const uint32_t base = ptx::smem_addr(s.kv[b]);
#pragma unroll
    for (int i = 0; i < 4; ++i) {  // the bf16 RoPE of the tile's 64 rows, straight to dim block 8
      const int r = grp + 16 * i;
      const bool ok = ids0[i] >= 0 && ids0[i] < p.num_rows;
      const uint8_t* row = ok ? p.kv + int64_t(ids0[i]) * p.kv_row_stride_bytes : reinterpret_cast<const uint8_t*>(p.idx);
      const bool valid = ok && rope;
      ptx::cp_async_16_zfill(base + uint32_t(8 * Cfg::kBlockBytes + r * Cfg::kAtomBytes + ((c ^ (r & 7)) << 4)),
                             valid ? row + L.rope_offset + 16 * c : row, valid);
    }
    ptx::cp_async_mbar_arrive(ws_bar(s.full[b][1]));  // (full[b][1] counts these 128 arrivals too)
    xr_convert_half<1>(x, wt, b, xparity, rank, r1);
    if (tile + 1 < n) xr_load<kFormat, 1>(p, c, m1, r1);
#pragma unroll
    for (int i = 0; i < 4; ++i) ids0[i] = ids1[i], ids1[i] = ids2[i];
  }
  if (wt == 0) ws_stamp(p, phase::kProducerDone);
}

// pv_loop (pv_consumer.cuh) of a quantized cache with the crossover's conversion: the next tile's
// dims 0-3 before this tile's P V, dims 4-8 while it runs.
template <typename Elem, KvFormat kFormat>
__device__ __forceinline__ void pv_loop_xo(XoSmem& x, const WsBlock& w, const Frag& fr, float (&acc_o)[128],
                                           uint32_t rank) {
  auto& s = x.ws;
  const int n = w.num_tiles;
  if (n > 0) {
    ws_convert_xo<kFormat, 0>(x, fr.wt, 0, rank);
    ws_convert_xo<kFormat, 1>(x, fr.wt, 0, rank);
  }
  for (int tile = 0; tile < n; ++tile) {
    const int b = tile & 1;
    if (tile + 1 < n) ws_convert_xo<kFormat, 0>(x, fr.wt, tile + 1, rank);
    bar_sync(bar_p(b), kConsumerThreads);
    ptx::mbar_arrive(ws_bar(s.empty[b][0]));  // never read here
    const float f[2] = {s.f[b][fr.wrow + fr.g], s.f[b][fr.wrow + fr.g + 8]};
    scale_o(acc_o, f);
    issue_pv<Elem, false>(s, b, ptx::smem_addr(s.kv[b][8]), acc_o);
    if (tile + 1 < n) ws_convert_xo<kFormat, 1>(x, fr.wt, tile + 1, rank);
    ptx::wgmma_wait<0>();
    ptx::fence_operands(acc_o);
    ptx::mbar_arrive(ws_bar(s.empty[b][1]));  // P V done with dims 4-7 and P
  }
}

// Consumer 1 (ws_consume's kWg = 1 with pv_loop_xo; the register-staged mode: the 16-bit caches' P V
// loop, nothing to convert).
template <typename Elem, KvFormat kFormat, bool kRegs>
__device__ __forceinline__ void ws_consume_xo(const KernelParams& p, XoSmem& x, const WsBlock& w, int wt,
                                              uint32_t rank) {
  const Frag fr(wt);
  load_q<kFormat, false>(p, x.ws, w, 128 + wt);
  float acc_o[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) acc_o[i] = 0.0f;
  float m_run[2] = {-INFINITY, -INFINITY};
  float l_run[2] = {0.0f, 0.0f};
  if constexpr (kRegs) pv_loop<Elem, KvFormat::kBF16>(p, x.ws, w, fr, acc_o);  // (the format only gates conversion)
  else pv_loop_xo<Elem, kFormat>(x, w, fr, acc_o, rank);
  if (wt == 0) ws_stamp(p, phase::kLoopDone1);
#if !SMLA_PHASE_TIMER
  if (wt == 0) __threadfence_block();  // as ws_consume (its note on consumer 1's registers)
#endif
  store_o<Elem, 1, false>(p, x.ws, w, fr, acc_o, m_run, l_run);
}

// One cluster of 2 blocks per (token, split): block (2 t + g, split) is head group g = cluster rank.
template <typename Elem, KvFormat kFormat, bool kRegs>
__global__ void __cluster_dims__(2, 1, 1) __launch_bounds__(WsConfig::kThreads, 1)
    sparse_mla_ws_kernel_xo(const __grid_constant__ KernelParams p) {
  using Cfg = WsConfig;
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  auto& x = *reinterpret_cast<XoSmem*>(smem_raw);
  auto& s = x.ws;
  if (threadIdx.x == 0) {
    for (int b = 0; b < 2; ++b)
      for (int h = 0; h < 2; ++h) {
        // this CTA's converter threads (+ the peer's bytes); kRegs, half 1: + the producer's RoPE copies
        ptx::mbar_init(ws_bar(s.full[b][h]), kRegs && h == 1 ? 256 : 128);
        ptx::mbar_init(ws_bar(s.raw[b][h]), 128);   // this CTA's producer threads
        ptx::mbar_init(ws_bar(s.empty[b][h]), kConsumerThreads);
        ptx::mbar_init(ws_bar(x.xempty[b][h]), 1);  // the peer's producer thread 0
      }
    ptx::fence_mbar_init();
  }
  if (threadIdx.x == 0) ws_stamp(p, phase::kEntry);
  ptx::cluster_sync();  // both blocks' barriers initialized before any remote arrival (and __syncthreads)
  ptx::pdl_launch_dependents();
  ptx::pdl_wait();  // (as sparse_mla_ws_kernel: nothing global read or written above)
  const WsBlock w = block_work(p);
  const uint32_t rank = ptx::cluster_ctarank();

  const int wg = threadIdx.x / 128, wt = threadIdx.x % 128;
  if (wg == 2) {
    if constexpr (kRegs) {
      ptx::setmaxnreg_dec<XrRegs::kProducer>();
      ws_produce_xr<kFormat>(p, x, w, wt, rank);
    } else {
      ptx::setmaxnreg_dec<Cfg::kProducerRegs>();
      ws_produce_xo<kFormat>(p, x, w, wt, rank);
    }
  } else if (wg == 0) {
    ptx::setmaxnreg_inc<Cfg::kScorerRegs>();
    ws_consume<Elem, kFormat, 0, false, true>(p, s, w, wt);  // (full: cluster-scope acquire, proxy fence)
  } else {
    // (kRegs: consumer 1 keeps the launch allocation, XrRegs::kConsumer; no setmaxnreg)
    if constexpr (!kRegs) ptx::setmaxnreg_inc<Cfg::kConsumerRegs>();
    ws_consume_xo<Elem, kFormat, kRegs>(p, x, w, wt, rank);
  }
  ptx::cluster_sync();  // neither block exits while the other may still access its shared memory
}

template <KvFormat kFormat>
void launch_xo(const KernelParams& p, cudaStream_t stream) {
  static_assert(kFormat == KvFormat::kFP8DsMla, "the crossover variant reads fp8_ds_mla rows");
  SMLA_CHECK(p.head_groups == 2, "h128.xo runs 64 < H <= 128 (two head groups); got H = " + std::to_string(p.num_heads));
  constexpr size_t kSmemBytes = sizeof(XoSmem);
  // SMLA_SM90_XO_REGS=1 (xo_regs_mode(), launcher.cu): the register-staged mode, a kernel of its own.
  const bool regs = xo_regs_mode() != 0;
  auto* kernel = regs ? sparse_mla_ws_kernel_xo<ptx::Bf16, kFormat, true> : sparse_mla_ws_kernel_xo<ptx::Bf16, kFormat, false>;
  static std::atomic<uint64_t> attribute_set{0};  // once per device and kernel, as launch_ws
  int dev = 0;
  SMLA_CHECK(cudaGetDevice(&dev) == cudaSuccess, "cudaGetDevice failed");
  const uint64_t bit = uint64_t(1) << ((2 * dev + (regs ? 1 : 0)) & 63);
  if (!(attribute_set.load(std::memory_order_acquire) & bit)) {
    const cudaError_t ea = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kSmemBytes));
    SMLA_CHECK(ea == cudaSuccess, std::string("cannot raise the sparse MLA kernel's shared memory to ") +
                                      std::to_string(kSmemBytes) + " bytes: " + cudaGetErrorString(ea));
    attribute_set.fetch_or(bit, std::memory_order_release);
  }
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(unsigned(p.num_tokens * p.head_groups), 1, unsigned(p.num_splits));  // cluster (2, 1, 1)
  cfg.blockDim = dim3(WsConfig::kThreads);
  cfg.dynamicSmemBytes = kSmemBytes;
  cfg.stream = stream;
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = &attr;
  cfg.numAttrs = attention_pdl_enabled() ? 1 : 0;
  const cudaError_t e = cudaLaunchKernelEx(&cfg, kernel, p);
  SMLA_CHECK(e == cudaSuccess, std::string("sparse MLA crossover kernel launch failed: ") + cudaGetErrorString(e));
}

}  // namespace smla::cuda::sm90::sparse_mla
