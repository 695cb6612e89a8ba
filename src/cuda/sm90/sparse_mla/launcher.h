// Declarations of the instantiated launchers of the SM90 sparse MLA kernel (one .cu per
// instantiation in this folder) and of the host entry that dispatches to them.
#pragma once

#include <cuda_runtime.h>

#include "cuda/common/ptx.cuh"
#include "cuda/sm90/sparse_mla/config.h"

namespace smla::cuda::sm90::sparse_mla {

// kRow: how cache rows are read (config.h); quantized formats use Elem = ptx::Bf16.
template <typename Elem, int kMTiles, RowFormat kRow = RowFormat::kNative16>
void launch_main(const KernelParams& p, cudaStream_t stream);
// Head tile 64, warp-specialized; kQ8: an e4m3 q over fp8 rows (S on the fp8 tensor cores).
template <typename Elem, RowFormat kRow = RowFormat::kNative16, bool kQ8 = false>
void launch_ws(const KernelParams& p, cudaStream_t stream);
template <typename Elem>
void launch_combine(const KernelParams& p, cudaStream_t stream, bool pdl);

}  // namespace smla::cuda::sm90::sparse_mla
