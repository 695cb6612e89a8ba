// Declarations of the instantiated launchers of the SM90 sparse MLA kernels (one .cu per
// instantiation in this folder) and of the host entry that dispatches to them.
#pragma once

#include <cuda_runtime.h>

#include "cuda/common/ptx.cuh"
#include "cuda/sm90/sparse_mla/config.h"

namespace smla::cuda::sm90::sparse_mla {

// Head tile 64, warp-specialized, over rows of format kFormat (quantized formats use Elem =
// ptx::Bf16); kQ8: an e4m3 q over fp8 rows (S on the fp8 tensor cores, score precision fp8).
template <typename Elem, KvFormat kFormat, bool kQ8 = false>
void launch_ws(const KernelParams& p, cudaStream_t stream);
// The small-H swap-AB kernel (swapab.cuh): fp8_ds_mla, fp8_e4m3 or nvfp4_ds_mla rows, a bf16 (or e4m3,
// widened; fp8 rows) q, kN (16, or 32 for fp8_ds_mla / fp8_e4m3) heads per block, H <= kN (p.head_groups = 1).
template <int kN, KvFormat kFormat>
void launch_swapab(const KernelParams& p, cudaStream_t stream);
// The split-K merge, a programmatic dependent launch behind launch_ws.
template <typename Elem>
void launch_combine(const KernelParams& p, cudaStream_t stream);

}  // namespace smla::cuda::sm90::sparse_mla
