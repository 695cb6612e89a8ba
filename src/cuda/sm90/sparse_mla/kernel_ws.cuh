// SM90 sparse MLA, the warp-specialized wgmma kernel for 64-head groups: bf16 / fp16 caches at
// every H (heads past H zero-padded), the quantized formats (raw rows dequantized to bf16 in shared
// memory) and, for an e4m3 q with an fp8 cache and score precision fp8 (kQ8), S on the fp8 tensor
// cores from the raw rows. A file per role:
//   producer.cuh     warpgroup 2: gathers one 64-entry tile at a time into buffer tile % 2
//   scorer.cuh       warpgroup 0: S = Q K^T, the masked online softmax, P and O[:, 0:256) += P V
//   pv_consumer.cuh  warpgroup 1: O[:, 256:512) += P V (P from shared memory), and around it the
//                    dequantization of the next tile (convert.cuh)
//   io.cuh           both consumers: load_q (prologue) and store_o (epilogue)
//   ws_common.cuh    the block's work, named barriers, swizzle, softmax helpers, phase stamps
// The shared-memory plans and register budgets are config.h's WsConfig / WsQ8Config.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <string>

#include "cuda/sm90/sparse_mla/io.cuh"
#include "cuda/sm90/sparse_mla/launcher.h"
#include "cuda/sm90/sparse_mla/producer.cuh"
#include "cuda/sm90/sparse_mla/pv_consumer.cuh"
#include "cuda/sm90/sparse_mla/scorer.cuh"
#include "cuda/sm90/sparse_mla/ws_common.cuh"
#include "smla/types.h"

namespace smla::cuda::sm90::sparse_mla {

// Consumer kWg (0: the scorer) of output dims [256 kWg, 256 kWg + 256).
template <typename Elem, KvFormat kFormat, int kWg, bool kQ8>
__device__ __forceinline__ void ws_consume(const KernelParams& p, WsSmem<kQ8>& s, const WsBlock& w, int wt) {
  const Frag fr(wt);
  load_q<kFormat, kQ8>(p, s, w, kWg * 128 + wt);
  if (kWg == 0 && wt == 0) ws_stamp(p, phase::kQReady);

  float acc_o[128];  // (64 heads, 256 dims of this warpgroup): [n8 block j][C fragment]
#pragma unroll
  for (int i = 0; i < 128; ++i) acc_o[i] = 0.0f;
  float m_run[2] = {-INFINITY, -INFINITY};  // rows wrow + g, wrow + g + 8 (log2 domain)
  float l_run[2] = {0.0f, 0.0f};            // sums over this warpgroup's columns
  if constexpr (kWg == 0) score_loop<Elem, kFormat, kQ8>(p, s, w, fr, ptx::smem_addr(s.q), acc_o, m_run, l_run);
  else if constexpr (kQ8) pv_loop_q8<Elem, kFormat>(s, w, fr, acc_o);
  else pv_loop<Elem, kFormat>(p, s, w, fr, acc_o);
  if (wt == 0) ws_stamp(p, kWg == 0 ? phase::kLoopDone : phase::kLoopDone1);
#if !SMLA_PHASE_TIMER
  // Without the phase stamp here, ptxas allocates consumer 1 of the fp8_ds_mla kernel (216
  // registers: O, and a dequantization batch while its P V runs) with an 8-byte spill; one
  // thread's CTA fence after the loop (a few cycles per block, outside the tile loop) keeps every
  // kernel spill-free. tests/cpu/test_kernel_config.cpp holds every kernel to no local memory.
  if (kWg == 1 && wt == 0) __threadfence_block();
#endif
  store_o<Elem, kWg, kQ8>(p, s, w, fr, acc_o, m_run, l_run);
}

// One block per (token, 64-head group, top-k split), 3 warpgroups (WsConfig): mbarriers, then each
// warpgroup takes its registers (setmaxnreg; the budget is checked on the cubins by
// tests/cpu/test_kernel_config.cpp) and its role.
template <typename Elem, KvFormat kFormat, bool kQ8>
__global__ void __launch_bounds__(WsConfig::kThreads, 1) sparse_mla_ws_kernel(const __grid_constant__ KernelParams p) {
  using Cfg = WsConfig;
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  auto& s = *reinterpret_cast<WsSmem<kQ8>*>(smem_raw);

  if (threadIdx.x == 0) {
    if constexpr (kQ8) {
      for (int b = 0; b < 2; ++b) {
        ptx::mbar_init(ws_bar(s.full[b]), 128);                // every producer thread's copies
        ptx::mbar_init(ws_bar(s.empty[b]), kConsumerThreads);  // scorer after S, consumer 1 after V
      }
      ptx::mbar_init(ws_bar(s.vfull), 128);   // consumer 1, once per tile
      ptx::mbar_init(ws_bar(s.vempty), 128);  // the scorer, once per tile
    } else {
      for (int b = 0; b < 2; ++b)
        for (int h = 0; h < 2; ++h) {
          ptx::mbar_init(ws_bar(s.full[b][h]), 128);  // every producer thread's (16-bit) or consumer 1 thread's arrival
          ptx::mbar_init(ws_bar(s.raw[b][h]), 128);   // quantized: every producer thread's raw bytes landed
          ptx::mbar_init(ws_bar(s.empty[b][h]), kConsumerThreads);  // every consumer thread, once per tile
        }
    }
    ptx::mbar_init(ws_bar(s.q_ready), kConsumerThreads);     // both consumers, once: Q stored
    ptx::mbar_init(ws_bar(s.sums_ready), kConsumerThreads);  // both consumers, once: row sums stored
    ptx::fence_mbar_init();
  }
  if (threadIdx.x == 0) ws_stamp(p, phase::kEntry);
  __syncthreads();
  ptx::pdl_launch_dependents();  // the split merge (a PDL launch) may start its blocks now
  // (A no-op under launch_ws's plain launch; kept so that the kernel is correct as a programmatic
  // dependent too: every input (counts, idx, rows, q) may come from the kernel before it, so nothing
  // global is read or written above this line.)
  ptx::pdl_wait();
  const WsBlock w = block_work(p);

  const int wg = threadIdx.x / 128, wt = threadIdx.x % 128;
  if (wg == 2) {
    ptx::setmaxnreg_dec<Cfg::kProducerRegs>();
    if constexpr (kQ8) ws_produce_q8<kFormat>(p, s, w, wt);
    else if constexpr (!kQuantized<kFormat>) ws_produce(p, s, w, wt);
    else ws_produce_quant<kFormat>(p, s, w, wt);
  } else if (wg == 0) {
    ptx::setmaxnreg_inc<Cfg::kScorerRegs>();
    ws_consume<Elem, kFormat, 0, kQ8>(p, s, w, wt);
  } else {
    ptx::setmaxnreg_inc<Cfg::kConsumerRegs>();
    ws_consume<Elem, kFormat, 1, kQ8>(p, s, w, wt);
  }
}

template <typename Elem, KvFormat kFormat, bool kQ8>
void launch_ws(const KernelParams& p, cudaStream_t stream) {
  using Cfg = WsConfig;  // threads and registers; shared memory from the variant's own plan
  constexpr size_t kSmemBytes = kQ8 ? WsQ8Config::kSmemBytes : WsConfig::kSmemBytes;
  static_assert(!kQ8 || kFormat == KvFormat::kFP8E4M3 || kFormat == KvFormat::kFP8DsMla, "an e4m3 q reads fp8 rows only");
  auto* kernel = sparse_mla_ws_kernel<Elem, kFormat, kQ8>;
  // Raise the dynamic shared-memory limit once per device (a per-launch call costs host time).
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
  // A plain launch (session 11's programmatic dependent launch behind the HiSparse copy kernel made the
  // all-hit decode step slower on the H200: docs/perf-history.md s11-hisparse).
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(unsigned(p.num_tokens * p.head_groups), 1, unsigned(p.num_splits));
  cfg.blockDim = dim3(Cfg::kThreads);
  cfg.dynamicSmemBytes = kSmemBytes;
  cfg.stream = stream;
  const cudaError_t e = cudaLaunchKernelEx(&cfg, kernel, p);
  SMLA_CHECK(e == cudaSuccess, std::string("sparse MLA kernel launch failed: ") + cudaGetErrorString(e));
}

}  // namespace smla::cuda::sm90::sparse_mla
