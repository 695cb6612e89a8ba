// SM90 sparse MLA, warp-specialized kernel: what every role shares. The block's work (token, head
// group, top-k split: the one block-range rule), the named barriers, the 128-byte swizzle, the
// online-softmax helpers and the phase stamps.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "cuda/common/phase.h"
#include "cuda/common/ptx.cuh"
#include "cuda/sm90/sparse_mla/config.h"

namespace smla::cuda::sm90::sparse_mla {

// Named barriers of the kernel (ids 1..15; 0 is __syncthreads). No bare ids elsewhere.
enum class Bar : uint32_t {
  kConsumers = 1,  // swapab's two consumer warpgroups (h64.ws: the q_ready / sums_ready mbarriers)
  kP0 = 2,         // + tile % 2: the scorer arrives with a tile's P and rescale factors stored,
  kP1 = 3,         //   consumer 1 syncs (two ids: the scorer may run a tile ahead)
  kScorer = 4,     // the scorer's 128 threads (its landed test: one path for the warpgroup)
  kConvert = 6,    // consumer 1's 128 threads, dequantizing in place
};
inline constexpr uint32_t kConsumerThreads = 256;  // the two consumer warpgroups
__device__ __forceinline__ Bar bar_p(int b) { return Bar(uint32_t(Bar::kP0) + uint32_t(b)); }
__device__ __forceinline__ void bar_sync(Bar b, uint32_t threads) { ptx::named_sync(uint32_t(b), threads); }
__device__ __forceinline__ void bar_arrive(Bar b, uint32_t threads) { ptx::named_arrive(uint32_t(b), threads); }

// What every warpgroup of a block knows about its work.
struct WsBlock {
  int64_t t;             // token
  int head0;             // first head of the block's head group
  int head_end;          // one past its last real head: min(H, head0 + block_heads)
  int split;             // top-k split
  int begin, end;        // entries [begin, end) of the idx row
  int num_tiles;         // 64-entry tiles in [begin, end): tile i in buffer i % 2
  const int32_t* idx_row;
};

// The block-range rule: block (blockIdx.x = token * head_groups + group, blockIdx.z = split) owns
// the split's whole 64-entry tiles of the token's active top-k (counts[t] clamped to [0, K]).
__device__ __forceinline__ WsBlock block_work(const KernelParams& p) {
  WsBlock w;
  w.t = blockIdx.x / p.head_groups;
  w.head0 = int(blockIdx.x - w.t * p.head_groups) * p.block_heads;
  w.head_end = min(p.num_heads, w.head0 + p.block_heads);
  w.split = blockIdx.z;
  int n = p.topk;
  if (p.counts != nullptr) n = min(max(p.counts[w.t], 0), p.topk);
  int chunk = (n + p.num_splits - 1) / p.num_splits;
  chunk = (chunk + kBlockK - 1) / kBlockK * kBlockK;
  w.begin = min(n, w.split * chunk);
  w.end = min(n, w.begin + chunk);
  w.num_tiles = (w.end - w.begin + kBlockK - 1) / kBlockK;
  w.idx_row = p.idx + w.t * p.idx_stride_t;
  return w;
}

// Physical 16-byte chunk of logical chunk `ch` in row `r` of a 128-byte-swizzled atom: XOR by
// row inside groups of 8 chunks, so 8 consecutive rows at one logical chunk land in 8 different
// bank groups (the wgmma 128-byte swizzle).
__device__ __forceinline__ int swizzle(int r, int ch) { return ch ^ (r & 7); }

__device__ __forceinline__ uint32_t ws_bar(uint64_t& b) { return ptx::smem_addr(&b); }

// The two consumer warpgroups' one-time hand-offs (Q stored; row sums stored) through an mbarrier of
// 256 arrivals, phase 0: each thread's shared-memory stores before its arrival (release) are
// visible to every thread past the wait (acquire). Not named barrier 1: the scorer and consumer 1
// run their own inlined copies of load_q / store_o, so they would meet a named barrier at two
// different instructions, which synccheck reports as divergent and racecheck as unordered (session
// 14 run 0; one code path for both costs the q8 / nvfp4 kernels spills); an mbarrier may be met
// from any instruction (docs/perf-history.md#s14-named-barriers).
__device__ __forceinline__ void consumers_once(uint64_t& bar) {
  ptx::mbar_arrive(ws_bar(bar));
  ptx::mbar_wait(ws_bar(bar), 0);
}

// A phase stamp (cuda/common/phase.h) of this block; the caller picks one thread. Nothing unless
// the build has SMLA_PHASE_TIMER.
__device__ __forceinline__ void ws_stamp(const KernelParams& p, int event) {
#if SMLA_PHASE_TIMER
  const uint32_t block = blockIdx.z * gridDim.x + blockIdx.x;
  if (p.phase != nullptr && block < uint32_t(phase::kAttnBlocks))
    p.phase[block * phase::kAttnEvents + event] = ptx::globaltimer();
#else
  (void)p, (void)event;
#endif
}

namespace ws {
// -inf-safe reference for exp2: a row with no valid entry so far keeps max -inf and reference 0.
__device__ __forceinline__ float ref_of(float m) { return m == -INFINITY ? 0.0f : m; }
// Factor that moves values relative to m_old onto m_new >= m_old (0 when nothing was seen yet:
// whatever was accumulated is 0 then).
__device__ __forceinline__ float rescale(float m_old, float m_new) {
  return m_old == -INFINITY ? 0.0f : ptx::fast_exp2(m_old - ref_of(m_new));
}
}  // namespace ws

// The shared-memory plan of a variant: raw fp8 stages for the fp8 score path, bf16 buffers else.
template <bool kQ8>
using WsSmem = std::conditional_t<kQ8, WsQ8Config::SharedStorage, WsConfig::SharedStorage>;

// A consumer thread's place in its warpgroup's wgmma fragments.
struct Frag {
  int wt;    // thread in the warpgroup (0..127)
  int lane;
  int wrow;  // first of this warp's 16 rows (heads) in the tile
  int g;     // fragment row (rows wrow + g, wrow + g + 8)
  int tq;    // fragment column pair
  __device__ __forceinline__ explicit Frag(int t)
      : wt(t), lane(t & 31), wrow((t >> 5) * 16), g((t & 31) >> 2), tq(t & 3) {}
};

// O *= f per row (acc_o: (64 heads, 256 dims) of a warpgroup, [n8 block j][C fragment]), skipped
// by a warp whose 16 rows all kept their max (after the first tiles, nearly always).
__device__ __forceinline__ void scale_o(float (&acc_o)[128], const float (&f)[2]) {
  if (!__any_sync(0xffffffffu, f[0] != 1.0f || f[1] != 1.0f)) return;
#pragma unroll
  for (int j = 0; j < 32; ++j) {
    acc_o[4 * j] *= f[0];
    acc_o[4 * j + 1] *= f[0];
    acc_o[4 * j + 2] *= f[1];
    acc_o[4 * j + 3] *= f[1];
  }
}

// Descriptor of V for consumer kWg's P V: dim blocks [4 kWg, 4 kWg + 4) of buffer b (the fp8
// score path: of its one bf16 V buffer); k-step kk covers rows [16 kk, 16 kk + 16).
template <int kWg, bool kQ8>
__device__ __forceinline__ uint64_t v_desc_of(WsSmem<kQ8>& s, int b) {
  uint32_t v_base;
  if constexpr (kQ8) v_base = ptx::smem_addr(s.v);
  else v_base = ptx::smem_addr(s.kv[b]);
  return ptx::sw128_desc(v_base + uint32_t(kWg * 4 * WsConfig::kBlockBytes), WsConfig::kBlockBytes, 1024);
}
// Where tile b's P lives: dim block 8 of its buffer (the RoPE block: only S reads K there, and S
// is done before P is stored), or the fp8 score path's own P buffers.
template <bool kQ8>
__device__ __forceinline__ uint32_t p_addr_of(WsSmem<kQ8>& s, int b) {
  if constexpr (kQ8) return ptx::smem_addr(s.p[b]);
  else return ptx::smem_addr(s.kv[b][8]);
}

}  // namespace smla::cuda::sm90::sparse_mla
