// SM90 sparse MLA, 16-bit caches, wgmma variant for 64-head tiles (H > 32).
//
// Same schedule and masking as kernel.cuh (one block per token x head group x top-k split, tiles
// of 64 entries gathered whole with cp.async into two stages), but the two products run on the
// warpgroup MMA with both operands in shared memory:
//   S(64 x 64)  = Q(64 x D) K^T    warpgroup w: columns [32 w, 32 w + 32), 36 (32) m64n32k16;
//   O(64 x 512) += P(64 x 64) V     warpgroup w: dims [256 w, 256 w + 256), 4 m64n256k16 with V
//                                   read MN-major (transposed) from the same rows as K.
// Softmax is fp32 in the log2 domain; the two warpgroups exchange row maxima and sums through
// shared memory, and P goes through shared memory because each warpgroup needs all 64 columns.
#pragma once

#include "cuda/sm90/sparse_mla/kernel.cuh"

namespace smla::cuda::sm90::sparse_mla {

// Independent S accumulators (v5, docs/perf-notes.md): 4 = the k-steps of one 128-byte dim
// block, so each accumulator reads a fixed 32-byte column group; D = 576 and 512 (the only head
// dims, checked by the launcher's validate) have 9 and 8 dim blocks.
inline constexpr int kSAcc = 4;

template <typename Elem>
__global__ void __launch_bounds__(WgmmaConfig::kThreads, 1)
    sparse_mla_wgmma_kernel(const __grid_constant__ KernelParams p) {
  using Cfg = WgmmaConfig;
  using Smem = Cfg::SharedStorage;
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  Smem& s = *reinterpret_cast<Smem*>(smem_raw);

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wg = warp / 4;                 // warpgroup: score columns, then output dims
  const int wrow = (warp % 4) * 16;        // first of the 16 accumulator rows of this warp
  const int g = lane >> 2, tq = lane & 3;  // fragment row / column pair
  const int64_t t = blockIdx.x / p.head_groups;
  const int head0 = int(blockIdx.x - t * p.head_groups) * Cfg::kHeadTile;
  const int split = blockIdx.z;

  int n = p.topk;
  if (p.counts != nullptr) n = min(max(p.counts[t], 0), p.topk);
  int chunk = (n + p.num_splits - 1) / p.num_splits;
  chunk = (chunk + kBlockK - 1) / kBlockK * kBlockK;
  const int begin = min(n, split * chunk);
  const int end = min(n, begin + chunk);
  const int num_tiles = (end - begin + kBlockK - 1) / kBlockK;
  const int32_t* idx_row = p.idx + t * p.idx_stride_t;

  // Row ids of a tile: lane l of warp w holds entry r = w + 8 l (l < 8), -1 when masked.
  constexpr int kRowsPerWarp = kBlockK / Cfg::kWarps;
  auto load_row_ids = [&](int tile) {
    int row = -1;
    const int e = begin + tile * kBlockK + warp + Cfg::kWarps * lane;
    if (lane < kRowsPerWarp && tile < num_tiles && e < end) {
      row = idx_row[e];
      if (row >= p.num_rows || row < 0) row = -1;
    }
    return row;
  };

  // Gather: one warp per row; lane l copies 16-byte chunks l, l + 32, l + 64 (D = 576), which
  // sit in dim blocks l / 8, l / 8 + 4, l / 8 + 8 at swizzled position (l % 8) ^ (row % 8).
  auto gather = [&](int row_ids, int stage) {
    const uint32_t base = ptx::smem_addr(s.kv[stage]) + uint32_t((lane >> 3) * Cfg::kBlockBytesKV);
    const bool third = lane + 64 < p.row_chunks;
#pragma unroll
    for (int i = 0; i < kRowsPerWarp; ++i) {
      const int r = warp + Cfg::kWarps * i;
      const int row = __shfl_sync(0xffffffffu, row_ids, i);
      const uint32_t dst = base + uint32_t(r * Cfg::kAtomBytes + (swizzle(r, lane & 7) << 4));
      if (row >= 0) {
        const uint8_t* src = p.kv + int64_t(row) * p.kv_row_stride_bytes + lane * 16;
        ptx::cp_async_16(dst, src);
        ptx::cp_async_16(dst + 4 * Cfg::kBlockBytesKV, src + 512);
        if (third) ptx::cp_async_16(dst + 8 * Cfg::kBlockBytesKV, src + 1024);
      } else {
        ptx::st_shared_zero16(dst);
        ptx::st_shared_zero16(dst + 4 * Cfg::kBlockBytesKV);
        if (third) ptx::st_shared_zero16(dst + 8 * Cfg::kBlockBytesKV);
      }
      if (lane == 0) s.col_bias[stage][r] = row >= 0 ? 0.0f : -INFINITY;
    }
  };

  const uint32_t q_base = ptx::smem_addr(s.q), p_base = ptx::smem_addr(s.p);
  // Row ids (one per lane, see load_row_ids) of the tiles gathered 2, 3 and 4 steps from now: a
  // tile's ids are loaded 3 steps before its gather and prefetched into L2 2 steps before it.
  int ids_a = -1, ids_b = -1, ids_c = -1;
  auto prefetch = [&](int row_ids) {
    if (p.l2_prefetch && row_ids >= 0)
      ptx::prefetch_l2_bulk(p.kv + int64_t(row_ids) * p.kv_row_stride_bytes, uint32_t(p.row_chunks * 16));
  };
  if (num_tiles > 0) {
    const int q_chunks = 2 * p.k_steps;
    for (int c = tid; c < Cfg::kHeadTile * q_chunks; c += Cfg::kThreads) {
      const int hr = c / q_chunks, ch = c - hr * q_chunks;
      const int h = head0 + hr;
      const uint32_t dst =
          q_base + uint32_t((ch >> 3) * Cfg::kBlockBytesQ + hr * Cfg::kAtomBytes + (swizzle(hr, ch & 7) << 4));
      if (h >= p.num_heads) {
        ptx::st_shared_zero16(dst);
        continue;
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
        asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(dst), "r"(e[0] | uint32_t(e[1]) << 16),
                     "r"(e[2] | uint32_t(e[3]) << 16), "r"(e[4] | uint32_t(e[5]) << 16),
                     "r"(e[6] | uint32_t(e[7]) << 16)
                     : "memory");
      }
    }
    gather(load_row_ids(0), 0);
    ptx::cp_async_commit();
    gather(load_row_ids(1), 1);
    ptx::cp_async_commit();
    ids_a = load_row_ids(kStages);
    ids_b = load_row_ids(kStages + 1);
    ids_c = load_row_ids(kStages + kL2PrefetchTiles);
    prefetch(ids_a);
    prefetch(ids_b);
  }

  float acc_o[128];  // (64 heads, 256 dims) of this warpgroup: [n8 block j][C fragment]
#pragma unroll
  for (int i = 0; i < 128; ++i) acc_o[i] = 0.0f;
  float m_run[2] = {-INFINITY, -INFINITY};  // rows wrow + g, wrow + g + 8 (log2 domain)
  float l_run[2] = {0.0f, 0.0f};
  const uint64_t q_desc = ptx::sw128_desc(q_base, 16, 1024);
  const uint64_t p_desc = ptx::sw128_desc(p_base, 16, 1024);

  for (int tile = 0; tile < num_tiles; ++tile) {
    const int stage = tile & 1;
    ptx::cp_async_wait<kStages - 1>();
    ptx::fence_proxy_async_smem();  // our cp.async / st.shared writes -> the wgmma (async proxy)
    __syncthreads();                // (A)
    const uint32_t kv_base = ptx::smem_addr(s.kv[stage]);

    // ---- S(64 x 32 per warpgroup) = Q K^T over D in 16-wide k-steps, spread over kSAcc
    // independent accumulators (k-step ks goes to accumulator ks % kSAcc, each one's first
    // wgmma with scale_d = 0) so consecutive wgmmas do not wait on each other; summed after the wait.
    float acc_k[kSAcc][16];
    ptx::wgmma_fence();
    {
      const uint64_t k_desc = ptx::sw128_desc(kv_base + uint32_t(wg * 32 * Cfg::kAtomBytes), 16, 1024);
      // k-steps 4 b .. 4 b + 3 are the four 32-byte column groups of dim block b (same for Q, K).
#pragma unroll
      for (int a = 0; a < kSAcc; ++a)
        ptx::wgmma_m64n32k16<Elem>(acc_k[a], q_desc + uint32_t(a * 2), k_desc + uint32_t(a * 2), 0);
      // Dim blocks 1..7 always (D >= 512), block 8 (the RoPE dims) when D = 576: unrolled, so no
      // loop back-edge sits inside the wgmma batch.
#pragma unroll
      for (int b = 1; b < kMaxDim / 64; ++b) {
        if (b == kLatent / 64 && p.k_steps == kLatent / 16) break;
        const uint32_t off = uint32_t(b * (Cfg::kBlockBytesQ >> 4));
#pragma unroll
        for (int a = 0; a < kSAcc; ++a)
          ptx::wgmma_m64n32k16<Elem>(acc_k[a], q_desc + off + uint32_t(a * 2), k_desc + off + uint32_t(a * 2));
      }
    }
    ptx::wgmma_commit();
    ptx::wgmma_wait<0>();
    float acc_s[16];
#pragma unroll
    for (int a = 0; a < kSAcc; ++a) ptx::fence_operands(acc_k[a]);
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      acc_s[i] = acc_k[0][i];
#pragma unroll
      for (int a = 1; a < kSAcc; ++a) acc_s[i] += acc_k[a][i];
    }

    // ---- masked scores (log2 domain), row maxima of this warpgroup's 32 columns.
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        acc_s[4 * j + i] = acc_s[4 * j + i] * p.scale_log2 + s.col_bias[stage][wg * 32 + 8 * j + 2 * tq + (i & 1)];
        mx[i >> 1] = fmaxf(mx[i >> 1], acc_s[4 * j + i]);
      }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
    }
    if (tq == 0) {
      s.row_part[wg][wrow + g] = mx[0];
      s.row_part[wg][wrow + g + 8] = mx[1];
    }
    __syncthreads();  // (B)

    // ---- online softmax; P (16-bit) -> smem in the K-major swizzled layout of the PV A operand.
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = wrow + g + 8 * r;
      const float tile_max = fmaxf(s.row_part[0][row], s.row_part[1][row]);
      const float m_new = fmaxf(m_run[r], tile_max);
      const float m_use = m_new == -INFINITY ? 0.0f : m_new;
      const float alpha = ptx::fast_exp2(m_run[r] - m_use);
      m_run[r] = m_new;
      float sum = 0.0f;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float p0 = ptx::fast_exp2(acc_s[4 * j + 2 * r] - m_use);
        const float p1 = ptx::fast_exp2(acc_s[4 * j + 2 * r + 1] - m_use);
        sum += p0 + p1;
        const uint32_t addr = p_base + uint32_t(row * (kBlockK * 2) + (swizzle(row, wg * 4 + j) << 4) + tq * 4);
        asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(addr), "r"(Elem::pack(p0, p1)) : "memory");
      }
      l_run[r] = l_run[r] * alpha + sum;
#pragma unroll
      for (int j = 0; j < 32; ++j) {
        acc_o[4 * j + 2 * r] *= alpha;
        acc_o[4 * j + 2 * r + 1] *= alpha;
      }
    }
    ptx::fence_proxy_async_smem();
    __syncthreads();  // (C)

    // ---- O(64 x 256 per warpgroup) += P(64 x 64) V(64 x 256).
    ptx::wgmma_fence();
    {
      const uint64_t v_desc =
          ptx::sw128_desc(kv_base + uint32_t(wg * 4 * Cfg::kBlockBytesKV), Cfg::kBlockBytesKV, 1024);
#pragma unroll
      for (int kk = 0; kk < kBlockK / 16; ++kk)
        ptx::wgmma_m64n256k16_tb<Elem>(acc_o, p_desc + uint32_t((kk * 32) >> 4),
                                       v_desc + uint32_t((kk * 16 * Cfg::kAtomBytes) >> 4));
    }
    ptx::wgmma_commit();
    ptx::wgmma_wait<0>();
    ptx::fence_operands(acc_o);
    __syncthreads();  // (D) stage and P free

    if (tile + kStages < num_tiles) gather(ids_a, stage);
    ptx::cp_async_commit();
    prefetch(ids_c);  // tile + 4
    ids_a = ids_b, ids_b = ids_c, ids_c = load_row_ids(tile + kStages + kL2PrefetchTiles + 1);
  }

  // ---- row sums: quad, then the two warpgroups.
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l_run[r] += __shfl_xor_sync(0xffffffffu, l_run[r], 1);
    l_run[r] += __shfl_xor_sync(0xffffffffu, l_run[r], 2);
  }
  if (tq == 0) {
    s.row_part[wg][wrow + g] = l_run[0];
    s.row_part[wg][wrow + g + 8] = l_run[1];
  }
  __syncthreads();

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = wrow + g + 8 * r;
    const int h = head0 + row;
    if (h >= p.num_heads) continue;
    const float l = s.row_part[0][row] + s.row_part[1][row];
    const float m = m_run[r];
    const float lse_e = l > 0.0f ? (m + log2f(l)) * kLn2 : -INFINITY;
    const int d0 = wg * 256 + 2 * tq;
    if (p.num_splits == 1) {
      float denom = l;
      if (p.sink != nullptr && l > 0.0f) denom += exp2f(p.sink[h] * kLog2e - m);
      const float inv = l > 0.0f ? 1.0f / denom : 0.0f;
      auto* out = static_cast<uint16_t*>(p.out) + t * p.out_stride_t + int64_t(h) * p.out_stride_h + d0;
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
      if (p.lse != nullptr && wg == 0 && tq == 0) p.lse[t * p.lse_stride_t + h] = p.lse_base2 ? lse_e * kLog2e : lse_e;
    } else {
      const int64_t part = (t * p.num_heads + h) * p.num_splits + split;
      const float inv = l > 0.0f ? 1.0f / l : 0.0f;
      float* po = p.part_out + part * kLatent + d0;
#pragma unroll
      for (int j = 0; j < 32; ++j)
        *reinterpret_cast<float2*>(po + j * 8) = make_float2(acc_o[4 * j + 2 * r] * inv, acc_o[4 * j + 2 * r + 1] * inv);
      if (wg == 0 && tq == 0) p.part_lse[part] = lse_e;
    }
  }
}

template <typename Elem>
void launch_wgmma(const KernelParams& p, cudaStream_t stream) {
  using Cfg = WgmmaConfig;
  auto* kernel = sparse_mla_wgmma_kernel<Elem>;
  static std::atomic<uint64_t> attribute_set{0};
  int dev = 0;
  cudaGetDevice(&dev);
  const uint64_t bit = uint64_t(1) << (dev & 63);
  if (!(attribute_set.load(std::memory_order_acquire) & bit)) {
    cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(Cfg::kSmemBytes));
    attribute_set.fetch_or(bit, std::memory_order_release);
  }
  const dim3 grid(unsigned(p.num_tokens * p.head_groups), 1, unsigned(p.num_splits));
  kernel<<<grid, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(p);
}

}  // namespace smla::cuda::sm90::sparse_mla
