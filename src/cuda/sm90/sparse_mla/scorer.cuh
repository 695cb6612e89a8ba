// SM90 sparse MLA, warp-specialized kernel: the scorer (consumer warpgroup 0). Per tile: S = Q K^T
// of the whole tile (64 heads x 64 entries), the masked online softmax, P (bf16) and each row's O
// rescale factor into shared memory for consumer 1, and O[:, 0:256) += P V with P from registers;
// the next tile's S is issued behind that P V.
#pragma once

#include "cuda/sm90/sparse_mla/lazy_rescale.h"
#include "cuda/sm90/sparse_mla/ws_common.cuh"

namespace smla::cuda::sm90::sparse_mla {

// S (64 heads x 64 entries) = Q K^T over the 9 dim blocks of buffer tile % 2 (dims 0-3 as soon as
// they land, then 4-8), two commit groups (a commit group per half: no spin loop inside a group,
// or ptxas serializes).
template <typename Elem>
__device__ __forceinline__ void issue_scores(WsConfig::SharedStorage& s, uint32_t q_base, int tile, float (&acc_s)[32]) {
  using Cfg = WsConfig;
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
  ptx::wgmma_commit();
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

// The fp8 score path: S of stage tile % 2 on the fp8 tensor cores (m64n64k32 e4m3), summed in fp32
// every 128 dims (fp8_ds_mla, one chain per scale tile) or every 64 (fp8_e4m3, since session 11:
// its LSE reached 1.02e-2 of §8's 1e-2 on one seed with 128; 4.3e-3 with 64, for 1-2 % more time) (DESIGN.md §8). Why: the tensor core multiplies two e4m3 exactly, but inside a chain
// of wgmma instructions (each accumulating into the D of the one before) it adds each k32 step's
// products to D by aligning all of them, D included, to the largest exponent and keeping about 13
// bits below it, truncated toward zero (DeepSeek-V3's "about 14 bits"; FP22, e8m13). Each step thus
// drops up to ~2^-13 of the largest partial sum of the chain, and the drops add up, biased toward 0:
// over 576 dims in one chain (18 steps) the top scores of a row lose ~1e-3 of themselves. In the
// exponent that is an absolute error: at DeepSeek's softmax scale with rows of std 2 (the Python
// GPU test) the top logits are ~20 and fp8_e4m3's LSE strayed 2.4-4.5e-2 (§8 allows 1e-2; session 9
// run 8). A fresh chain (scale_d = 0) starts from an exact 0, so one chain per 128-dim tile keeps
// every drop below 2^-13 of that tile's partial sum (four steps each), and fp32 adds the five
// partials (tools/accuracy/fp8_accum.py models both: LSE ~2.4-3.5e-2 for one chain, ~5-6e-3 per
// 128). Every path: tile 0 into acc_s; tiles 1-3 (and fp8_e4m3's e4m3 RoPE, two k32 steps) into
// t_acc, each added to acc_s once done, while the next chain waits for t_acc (a third accumulator
// does not fit the scorer's 232 registers beside O). fp8_ds_mla adds each tile times its rows' tile
// scales and runs the bf16 RoPE last (m64n64k16 into acc_s, Q's RoPE widened exactly: bf16
// products, fp32 accumulation). `pv_pending`: a P V group was committed before; it is done when
// `release` runs. fp8_e4m3 returns with no group in flight, fp8_ds_mla with the RoPE group.
template <typename Elem, KvFormat kFormat, typename Release>
__device__ __forceinline__ void issue_scores_q8(WsQ8Config::SharedStorage& s, uint32_t q_base, int tq, int tile,
                                                bool pv_pending, Release&& release, float (&acc_s)[32]) {
  using Cfg = WsConfig;
  constexpr bool kE4m3 = kFormat == KvFormat::kFP8E4M3;
  const int b = tile & 1;
  const uint64_t q_desc = ptx::sw128_desc(q_base, 16, 1024);
  const uint64_t k_desc = ptx::sw128_desc(ptx::smem_addr(s.k[b]), 16, 1024);
  constexpr uint32_t kBlk = uint32_t(Cfg::kBlockBytes >> 4);
  ptx::mbar_wait(ws_bar(s.full[b]), (tile >> 1) & 1);
  ptx::wgmma_fence();
  float t_acc[32];
  // One chain: block blk's k32 steps (4: 128 e4m3 dims; fp8_e4m3's RoPE block: 2, its 64 bytes;
  // D = 512: Q's and K's RoPE blocks are zero), starting from 0.
  // fp8_e4m3 (no tile scales) runs chains of 64 dims (two k32 steps): chain c covers block c / kSplit.
  constexpr int kSplit = kE4m3 ? 2 : 1;
  auto chain = [&](float (&d)[32], int c) {
    const int blk = c / kSplit;
    const int steps = blk < 4 ? 4 / kSplit : 2;
    const int a0 = blk < 4 ? (c % kSplit) * (4 / kSplit) : 0;
#pragma unroll
    for (int a = 0; a < steps; ++a)
      ptx::wgmma_m64n64k32_e4m3(d, q_desc + blk * kBlk + uint32_t((a0 + a) * 2),
                                k_desc + blk * kBlk + uint32_t((a0 + a) * 2), a == 0 ? 0 : 1);
    ptx::wgmma_commit();
  };
  // acc_s (+)= d (fp8_ds_mla: times the tile scales of its columns 8 j + 2 tq + u).
  auto add = [&](const float (&d)[32], int blk, bool first) {
#pragma unroll
    for (int i = 0; i < 32; ++i) {
      if constexpr (kE4m3) {
        acc_s[i] += d[i];
      } else {
        const float sc = s.ks[b][8 * (i >> 2) + 2 * tq + (i & 1)][blk];
        acc_s[i] = first ? d[i] * sc : fmaf(d[i], sc, acc_s[i]);
      }
    }
  };
  constexpr int kLastChain = kE4m3 ? 4 * kSplit : 3;  // fp8_e4m3's RoPE block is a chain of its own
  chain(acc_s, 0);
  if (pv_pending) {  // P's registers free before t_acc is needed
    ptx::wgmma_wait<1>();
    release();
  }
  ptx::wgmma_fence();
  chain(t_acc, 1);
  ptx::wgmma_wait<1>();
  ptx::fence_operands(acc_s);
  if constexpr (!kE4m3) add(acc_s, 0, true);
#pragma unroll
  for (int c = 1; c <= kLastChain; ++c) {
    ptx::wgmma_wait<0>();
    ptx::fence_operands(t_acc);
    add(t_acc, c / kSplit, false);
    if (c < kLastChain) {
      ptx::wgmma_fence();
      chain(t_acc, c + 1);
    }
  }
  if constexpr (!kE4m3) {
    ptx::wgmma_fence();
#pragma unroll
    for (int a = 0; a < 4; ++a)  // (D = 512: Q's and K's RoPE blocks are zero)
      ptx::wgmma_m64n64k16<Elem>(acc_s, q_desc + 4 * kBlk + uint32_t(a * 2), k_desc + 4 * kBlk + uint32_t(a * 2));
    ptx::wgmma_commit();
  }
}

// Row ids of a tile's entries lane and lane + 32 (each warp takes the tile's 64), turned into
// valid bits by valid_bits once needed.
__device__ __forceinline__ void tile_ids(const WsBlock& w, int lane, int tile, int (&ids)[2]) {
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    const int e = w.begin + tile * kBlockK + 32 * hf + lane;
    ids[hf] = (tile < w.num_tiles && e < w.end) ? __ldg(w.idx_row + e) : -1;
  }
}

// Valid-entry bits of this thread's 16 score columns 8 j + 2 tq + u (bit 2 j + u), from the
// warp's two ballots of the tile's 64 entries.
__device__ __forceinline__ uint32_t valid_bits(const KernelParams& p, int tq, const int (&ids)[2]) {
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
}

// The tile's row maxima of the masked scores in the log2 domain (quad-reduced). With a positive
// scale (every real model) S stays unscaled, masked entries -inf, and the scale is applied to the
// max here and inside the exponent's FMA; otherwise (scale <= 0, where max(scale s) is not
// scale max(s)) S is scaled first.
__device__ __forceinline__ void mask_and_max(const KernelParams& p, bool scale_pos, uint32_t bits, float (&acc_s)[32],
                                             float (&mx)[2]) {
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
}

// P = 2^(S - ref(m)) as the A fragments of the tile's four k-steps (k-step kk: entries
// [16 kk, 16 kk + 16) = n8 blocks 2 kk and 2 kk + 1); row sums into `sum`.
template <typename Elem>
__device__ __forceinline__ void softmax_pack(const KernelParams& p, bool scale_pos, const float (&m)[2],
                                             float (&acc_s)[32], float (&sum)[2], uint32_t (&a_p)[4][4]) {
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
}

// The packed P -> shared memory at p_addr (64 x 64, K-major, swizzled), visible to wgmma. One
// stmatrix per k-step: matrices (rows 0-7 | 8-15 of the warp) x (n8 blocks 2 kk | 2 kk + 1) are
// a_p[kk][0..3]; lane l addresses row l % 8 of matrix l / 8.
__device__ __forceinline__ void store_p(uint32_t p_addr, const Frag& fr, const uint32_t (&a_p)[4][4]) {
  const int row = fr.wrow + (fr.lane & 7) + 8 * ((fr.lane >> 3) & 1);
#pragma unroll
  for (int kk = 0; kk < 4; ++kk)
    ptx::stmatrix_x4(p_addr + uint32_t(row * (kBlockK * 2) + (swizzle(row, 2 * kk + (fr.lane >> 4)) << 4)), a_p[kk]);
  ptx::fence_proxy_async_smem();
}

// The registers of this thread's P V (O and P) are final: the wgmma reading them is done.
__device__ __forceinline__ void fence_pv(float (&acc_o)[128], uint32_t (&a_p)[4][4]) {
  ptx::fence_operands(acc_o);
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) ptx::fence_operands(a_p[kk]);
}

// 16-bit caches (docs/perf-history.md#s13-bf16blk): of the two cases at the end of the next paragraph,
// always the second (no landed test); m_run is the lazy reference of lazy_rescale.h.
// The scorer's tile loop. Every path through the loop body ends with no wgmma in flight (a group
// pending across the back edge makes ptxas serialize them, C7515); the next tile's S still runs
// behind this tile's P V. Release of a tile's halves (16-bit and dequantized rows): dims 4-8 once
// S is done (consumer 1's P V releases them too), dims 0-3 after this P V. The next tile's S goes
// behind this P V when its rows are all there; otherwise dims 0-3 are released first, so that the
// next gather into this buffer never waits for the one before it.
template <typename Elem, KvFormat kFormat, bool kQ8>
__device__ __forceinline__ void score_loop(const KernelParams& p, WsSmem<kQ8>& s, const WsBlock& w, const Frag& fr,
                                           uint32_t q_base, float (&acc_o)[128], float (&m_run)[2],
                                           float (&l_run)[2]) {
  using Cfg = WsConfig;
  const int n = w.num_tiles;
  const bool scale_pos = p.scale_log2 > 0.0f;
  // 16-bit caches: the lazy O rescale (lazy_rescale.h): m_run is the rows' reference, moved only when
  // a tile's max passes it by more than kLazyRescaleLog2; the quantized paths keep the running max.
  constexpr bool kLazy = !kQ8 && !kQuantized<kFormat>;
  float acc_s[32];
  uint32_t a_p[4][4];
  uint32_t bits = 0;
  if (n > 0) {
    int ids[2];
    tile_ids(w, fr.lane, 0, ids);
    if constexpr (kQ8) issue_scores_q8<Elem, kFormat>(s, q_base, fr.tq, 0, false, [] {}, acc_s);
    else issue_scores<Elem>(s, q_base, 0, acc_s);
    if (fr.wt == 0) ws_stamp(p, phase::kTile0Landed);
    bits = valid_bits(p, fr.tq, ids);
    ptx::wgmma_wait<0>();
    ptx::fence_operands(acc_s);
  }
  for (int tile = 0; tile < n; ++tile) {
    const int b = tile & 1;
    if constexpr (kQ8) ptx::mbar_arrive(ws_bar(s.empty[b]));  // S is done with the stage (and its scales)
    else ptx::mbar_arrive(ws_bar(s.empty[b][1]));  // S is done with dims 4-8 (consumer 1's P V releases them)
    float mx[2], f[2], sum[2];
    mask_and_max(p, scale_pos, bits, acc_s, mx);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float m_new = kLazy ? lazy_ref(m_run[r], mx[r]) : fmaxf(m_run[r], mx[r]);
      f[r] = m_new == m_run[r] ? 1.0f : ws::rescale(m_run[r], m_new);
      m_run[r] = m_new;
    }
    softmax_pack<Elem>(p, scale_pos, m_run, acc_s, sum, a_p);
#pragma unroll
    for (int r = 0; r < 2; ++r) l_run[r] = l_run[r] * f[r] + sum[r];
    scale_o(acc_o, f);
    // fp8 scores: V half 0 dequantized. (It also orders this tile's P and f stores below after
    // consumer 1's P V of tile - 1, which read the same P buffer: consumer 1 dequantized this
    // tile's V after that product finished.)
    if constexpr (kQ8) ptx::mbar_wait(ws_bar(s.vfull), tile & 1);
    {  // own P V first: P's stores for consumer 1 then run behind it
      const uint64_t v_desc = v_desc_of<0, kQ8>(s, b);
      ptx::wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < 4; ++kk)
        ptx::wgmma_m64n256k16_rs_tb<Elem>(acc_o, a_p[kk], v_desc + uint32_t((kk * 16 * Cfg::kAtomBytes) >> 4));
      ptx::wgmma_commit();
    }
    store_p(p_addr_of<kQ8>(s, b), fr, a_p);
    if (fr.tq == 0) {
      s.f[b][fr.wrow + fr.g] = f[0];
      s.f[b][fr.wrow + fr.g + 8] = f[1];
    }
    bar_arrive(bar_p(b), kConsumerThreads);  // P and f of this tile ready
    if (kQ8 && tile + 1 < n) {
      if constexpr (kQ8) {
        // The next tile's S behind this P V (the stage is not the V buffer: no landed test); its
        // row ids load under the products (fp8_e4m3's S returns with no group in flight).
        int ids[2];
        tile_ids(w, fr.lane, tile + 1, ids);
        issue_scores_q8<Elem, kFormat>(
            s, q_base, fr.tq, tile + 1, true,
            [&] {
              fence_pv(acc_o, a_p);
              ptx::mbar_arrive(ws_bar(s.vempty));
            },
            acc_s);
        bits = valid_bits(p, fr.tq, ids);
        ptx::wgmma_wait<0>();
        ptx::fence_operands(acc_s);
      }
    } else if (tile + 1 < n) {
      if constexpr (!kQ8) {
        // The same path in all four warps (wgmma is warpgroup-wide): the barrier ANDs their tests.
        const int b1 = (tile + 1) & 1;
        const uint32_t parity1 = ((tile + 1) >> 1) & 1;
        // 16-bit caches: no test, the not-landed path always (it was taken in 97 % of tiles, and the
        // test cost ~10 % of the loop: docs/perf-history.md#s13-bf16blk); the same bits.
        const bool landed =
            kQuantized<kFormat> &&
            ptx::named_sync_and(
                uint32_t(Bar::kScorer), 128,
                ptx::mbar_test(ws_bar(s.full[b1][0]), parity1) && ptx::mbar_test(ws_bar(s.full[b1][1]), parity1));
        if (!landed) {
          ptx::wgmma_wait<0>();  // P V done
          fence_pv(acc_o, a_p);
          ptx::mbar_arrive(ws_bar(s.empty[b][0]));
        }
        issue_scores<Elem>(s, q_base, tile + 1, acc_s);
        int ids[2];
        tile_ids(w, fr.lane, tile + 1, ids);  // (its two loads behind the products)
        if (landed) {
          ptx::wgmma_wait<2>();  // P V done (the two groups of S may still run)
          fence_pv(acc_o, a_p);
          ptx::mbar_arrive(ws_bar(s.empty[b][0]));
        }
        bits = valid_bits(p, fr.tq, ids);
        ptx::wgmma_wait<0>();
        ptx::fence_operands(acc_s);
      }
    } else {
      ptx::wgmma_wait<0>();
      fence_pv(acc_o, a_p);
      if constexpr (kQ8) ptx::mbar_arrive(ws_bar(s.vempty));
      else ptx::mbar_arrive(ws_bar(s.empty[b][0]));
    }
  }
}

}  // namespace smla::cuda::sm90::sparse_mla
