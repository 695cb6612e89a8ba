// Instantiation: nvfp4_ds_mla cache (gathered raw by the producer, dequantized to bf16 by consumer 1), head tile 64, warp-specialized.
#include "cuda/sm90/sparse_mla/kernel_ws.cuh"

namespace smla::cuda::sm90::sparse_mla {
template void launch_ws<ptx::Bf16, KvFormat::kNvFP4DsMla>(const KernelParams&, cudaStream_t);
}  // namespace smla::cuda::sm90::sparse_mla
