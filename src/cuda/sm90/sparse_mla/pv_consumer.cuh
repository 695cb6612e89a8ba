// SM90 sparse MLA, warp-specialized kernel: consumer 1 (warpgroup 1). O[:, 256:512) += P V with P
// and the rows' rescale factors from shared memory (the scorer's), and the dequantization of the
// next tile around that product (quantized caches: in place, convert.cuh; the fp8 score path: V
// only, into its one bf16 V buffer).
#pragma once

#include "cuda/sm90/sparse_mla/convert.cuh"
#include "cuda/sm90/sparse_mla/ws_common.cuh"

namespace smla::cuda::sm90::sparse_mla {

// O[:, 256:512) += P V of tile b, P (64 x 64) K-major at p_addr: one commit group.
template <typename Elem, bool kQ8>
__device__ __forceinline__ void issue_pv(WsSmem<kQ8>& s, int b, uint32_t p_addr, float (&acc_o)[128]) {
  using Cfg = WsConfig;
  const uint64_t v_desc = v_desc_of<1, kQ8>(s, b);
  const uint64_t a_desc = ptx::sw128_desc(p_addr, 16, 1024);
  ptx::wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < 4; ++kk)
    ptx::wgmma_m64n256k16_tb<Elem>(acc_o, a_desc + uint32_t((kk * 32) >> 4),
                                   v_desc + uint32_t((kk * 16 * Cfg::kAtomBytes) >> 4));
  ptx::wgmma_commit();
}

// 16-bit and quantized caches. The scorer's next tile is dequantized around this tile's P V:
// dims 0-3 before it (the scorer's S starts there), dims 4-8 while it runs, so this tile's buffer
// is released half a conversion earlier than with both halves first.
template <typename Elem, KvFormat kFormat>
__device__ __forceinline__ void pv_loop(const KernelParams& p, WsConfig::SharedStorage& s, const WsBlock& w,
                                        const Frag& fr, float (&acc_o)[128]) {
  constexpr bool kQuant = kQuantized<kFormat>;
  const int n = w.num_tiles;
  if constexpr (kQuant) {
    if (n > 0) {
      ws_convert<kFormat, 0>(p, s, fr.wt, 0);
      ws_convert<kFormat, 1>(p, s, fr.wt, 0);
    }
  }
  for (int tile = 0; tile < n; ++tile) {
    const int b = tile & 1;
    if constexpr (kQuant) {
      if (tile + 1 < n) ws_convert<kFormat, 0>(p, s, fr.wt, tile + 1);
    }
    bar_sync(bar_p(b), kConsumerThreads);
    ptx::mbar_arrive(ws_bar(s.empty[b][0]));  // never read here
    const float f[2] = {s.f[b][fr.wrow + fr.g], s.f[b][fr.wrow + fr.g + 8]};
    scale_o(acc_o, f);
    issue_pv<Elem, false>(s, b, ptx::smem_addr(s.kv[b][8]), acc_o);
    if constexpr (kQuant) {
      if (tile + 1 < n) ws_convert<kFormat, 1>(p, s, fr.wt, tile + 1);
    }
    ptx::wgmma_wait<0>();
    ptx::fence_operands(acc_o);
    ptx::mbar_arrive(ws_bar(s.empty[b][1]));  // P V done with dims 4-7 and P
  }
}

// The fp8 score path: V of tile + 1 is dequantized around this tile's P V: half 0 once the
// scorer's P V of this tile is done with it (vempty), half 1 after this warpgroup's own; then the
// stage is free (empty: S and both V halves are done with it).
template <typename Elem, KvFormat kFormat>
__device__ __forceinline__ void pv_loop_q8(WsQ8Config::SharedStorage& s, const WsBlock& w, const Frag& fr,
                                           float (&acc_o)[128]) {
  const int n = w.num_tiles;
  if (n > 0) {
    ws_convert_v<kFormat, 0>(s, fr.wt, 0);
    ptx::mbar_arrive(ws_bar(s.vfull));
    ws_convert_v<kFormat, 1>(s, fr.wt, 0);
    ptx::mbar_arrive(ws_bar(s.empty[0]));
  }
  for (int tile = 0; tile < n; ++tile) {
    const int b = tile & 1;
    bar_sync(bar_p(b), kConsumerThreads);  // (also: every thread's V half 1 written)
    const float f[2] = {s.f[b][fr.wrow + fr.g], s.f[b][fr.wrow + fr.g + 8]};
    scale_o(acc_o, f);
    issue_pv<Elem, true>(s, b, p_addr_of<true>(s, b), acc_o);
    if (tile + 1 < n) {
      ptx::mbar_wait(ws_bar(s.vempty), tile & 1);
      ws_convert_v<kFormat, 0>(s, fr.wt, tile + 1);
      ptx::mbar_arrive(ws_bar(s.vfull));
    }
    ptx::wgmma_wait<0>();
    ptx::fence_operands(acc_o);
    if (tile + 1 < n) {
      ws_convert_v<kFormat, 1>(s, fr.wt, tile + 1);
      ptx::mbar_arrive(ws_bar(s.empty[(tile + 1) & 1]));
    }
  }
}

}  // namespace smla::cuda::sm90::sparse_mla
