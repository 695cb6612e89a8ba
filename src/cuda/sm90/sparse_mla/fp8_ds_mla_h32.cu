// Instantiation: fp8_ds_mla cache (dequantized to bf16 in shared memory), head tile 32.
#include "cuda/sm90/sparse_mla/kernel.cuh"

namespace smla::cuda::sm90::sparse_mla {
template void launch_main<ptx::Bf16, 2, RowFormat::kFp8DsMla>(const KernelParams&, cudaStream_t);
}  // namespace smla::cuda::sm90::sparse_mla
