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
//                for it before writing into the peer.
// A converter writes into the peer's buffer only after that (xempty), and into its own once its raw
// rows landed (its producer waited for empty first); its raw staging lies in its own rows of the
// half, which the peer never writes. Both blocks run the same tiles, so every remote write and
// arrival is awaited by the receiving block before it can finish; a cluster barrier after the
// barrier init and one before exit bracket every DSMEM access anyway.
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

// Consumer 1 (ws_consume's kWg = 1 with pv_loop_xo).
template <typename Elem, KvFormat kFormat>
__device__ __forceinline__ void ws_consume_xo(const KernelParams& p, XoSmem& x, const WsBlock& w, int wt,
                                              uint32_t rank) {
  const Frag fr(wt);
  load_q<kFormat, false>(p, x.ws, w, 128 + wt);
  float acc_o[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) acc_o[i] = 0.0f;
  float m_run[2] = {-INFINITY, -INFINITY};
  float l_run[2] = {0.0f, 0.0f};
  pv_loop_xo<Elem, kFormat>(x, w, fr, acc_o, rank);
  if (wt == 0) ws_stamp(p, phase::kLoopDone1);
#if !SMLA_PHASE_TIMER
  if (wt == 0) __threadfence_block();  // as ws_consume (its note on consumer 1's registers)
#endif
  store_o<Elem, 1, false>(p, x.ws, w, fr, acc_o, m_run, l_run);
}

// One cluster of 2 blocks per (token, split): block (2 t + g, split) is head group g = cluster rank.
template <typename Elem, KvFormat kFormat>
__global__ void __cluster_dims__(2, 1, 1) __launch_bounds__(WsConfig::kThreads, 1)
    sparse_mla_ws_kernel_xo(const __grid_constant__ KernelParams p) {
  using Cfg = WsConfig;
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  auto& x = *reinterpret_cast<XoSmem*>(smem_raw);
  auto& s = x.ws;
  if (threadIdx.x == 0) {
    for (int b = 0; b < 2; ++b)
      for (int h = 0; h < 2; ++h) {
        ptx::mbar_init(ws_bar(s.full[b][h]), 128);  // this CTA's converter threads (+ the peer's bytes)
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
    ptx::setmaxnreg_dec<Cfg::kProducerRegs>();
    ws_produce_xo<kFormat>(p, x, w, wt, rank);
  } else if (wg == 0) {
    ptx::setmaxnreg_inc<Cfg::kScorerRegs>();
    ws_consume<Elem, kFormat, 0, false>(p, s, w, wt);
  } else {
    ptx::setmaxnreg_inc<Cfg::kConsumerRegs>();
    ws_consume_xo<Elem, kFormat>(p, x, w, wt, rank);
  }
  ptx::cluster_sync();  // neither block exits while the other may still access its shared memory
}

template <KvFormat kFormat>
void launch_xo(const KernelParams& p, cudaStream_t stream) {
  static_assert(kFormat == KvFormat::kFP8DsMla, "the crossover variant reads fp8_ds_mla rows");
  SMLA_CHECK(p.head_groups == 2, "h128.xo runs 64 < H <= 128 (two head groups); got H = " + std::to_string(p.num_heads));
  constexpr size_t kSmemBytes = sizeof(XoSmem);
  auto* kernel = sparse_mla_ws_kernel_xo<ptx::Bf16, kFormat>;
  static std::atomic<uint64_t> attribute_set{0};  // once per device, as launch_ws
  int dev = 0;
  SMLA_CHECK(cudaGetDevice(&dev) == cudaSuccess, "cudaGetDevice failed");
  const uint64_t bit = uint64_t(1) << (dev & 63);
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
