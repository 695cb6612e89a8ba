// SM90 sparse MLA, the split-K merge: the partial outputs of a row's top-k splits (normalized by
// their own sums) and their LSEs -> the row's output and LSE, with smla::lse_merge's rule.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cmath>
#include <string>

#include "cuda/common/phase.h"
#include "cuda/common/ptx.cuh"
#include "cuda/sm90/sparse_mla/config.h"
#include "cuda/sm90/sparse_mla/launcher.h"
#include "smla/plan.h"
#include "smla/state.h"
#include "smla/types.h"

namespace smla::cuda::sm90::sparse_mla {

// Split-K merge: one block of 128 threads per (token, head), 4 output dims per thread; the partials
// are bf16 (smla/workspace.h), converted exactly to fp32 and summed in fp32. The
// weights follow smla::lse_merge (state.h), the one merge rule of the project, computed by warp 0
// (a lane per split, max and sum over a shuffle tree: a fixed order, so the result is
// deterministic; one thread's serial loop over 32 splits cost ~1 us at T = 1). Every split's partial is loaded before the
// weights are known (all loads in flight at once: one memory latency, not one per split; the
// loop of dependent loads it replaces took 13 us at T = 1, H = 128, 32 splits: perf-notes v8).
// kMaxS (>= num_splits) sizes the register array: 4 keeps the many-block merges of larger T at
// full occupancy, 32 (up to kMaxSplits) serves the few blocks of T = 1..4.
template <typename Elem, int kMaxS>
__global__ void __launch_bounds__(128) combine_kernel(const __grid_constant__ KernelParams p) {
  static_assert(kMaxS <= kMaxSplits, "one uint2 (4 bf16) register pair per split below");
  static_assert(kMaxSplits <= 32, "one lane of warp 0 per split in the LSE merge");
  __shared__ float s_w[kMaxSplits], s_total;
  const int64_t th = blockIdx.x;  // t * H + h
  const int64_t t = th / p.num_heads;
  const int h = int(th - t * p.num_heads);
  const int S = p.num_splits;
  const int d = threadIdx.x * 4;
#if SMLA_PHASE_TIMER
  uint64_t* const stamps = p.phase != nullptr && threadIdx.x == 0 && blockIdx.x < phase::kMergeBlocks
                               ? p.phase + phase::kMergeBase + blockIdx.x * phase::kMergeEvents
                               : nullptr;
#else
  uint64_t* const stamps = nullptr;  // phase stamps compiled out (cuda/common/phase.h)
#endif
  if (stamps != nullptr) stamps[phase::kMergeEntry] = ptx::globaltimer();
  ptx::pdl_wait();  // the partials of the attention grid (a no-op unless launched with PDL)
  if (stamps != nullptr) stamps[phase::kMergeWaited] = ptx::globaltimer();
  const uint16_t* part = p.part_out + th * S * kLatent + d;  // bf16 partials, 4 dims = 8 bytes per split
  uint2 v[kMaxS];
#pragma unroll
  for (int s = 0; s < kMaxS; ++s) v[s] = s < S ? *reinterpret_cast<const uint2*>(part + s * kLatent) : make_uint2(0u, 0u);
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
    const float w = s_w[s];  // bf16 -> fp32 is exact: the bits shifted to the top half
    acc.x += w * __uint_as_float(v[s].x << 16), acc.y += w * __uint_as_float(v[s].x & 0xffff0000u);
    acc.z += w * __uint_as_float(v[s].y << 16), acc.w += w * __uint_as_float(v[s].y & 0xffff0000u);
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

// Launched as a programmatic dependent launch behind the attention kernel (which triggers it
// early): its blocks start while the attention grid's last blocks run and wait in pdl_wait(),
// hiding the launch gap (small T; docs/perf-history.md v8). The shared-memory carveout is the
// attention kernel's: an SM that switches its L1 / shared split between kernels waits for its
// blocks to drain first.
template <typename Elem>
void launch_combine(const KernelParams& p, cudaStream_t stream) {
  static std::atomic<uint64_t> attribute_set{0};
  int dev = 0;
  SMLA_CHECK(cudaGetDevice(&dev) == cudaSuccess, "cudaGetDevice failed");
  const uint64_t bit = uint64_t(1) << (dev & 63);
  if (!(attribute_set.load(std::memory_order_acquire) & bit)) {
    for (auto* k : {combine_kernel<Elem, 4>, combine_kernel<Elem, kMaxSplits>}) {
      const cudaError_t e =
          cudaFuncSetAttribute(k, cudaFuncAttributePreferredSharedMemoryCarveout, int(cudaSharedmemCarveoutMaxShared));
      SMLA_CHECK(e == cudaSuccess, std::string("cannot set the split merge's carveout: ") + cudaGetErrorString(e));
    }
    attribute_set.fetch_or(bit, std::memory_order_release);
  }
  auto* kernel = p.num_splits <= 4 ? combine_kernel<Elem, 4> : combine_kernel<Elem, kMaxSplits>;
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
