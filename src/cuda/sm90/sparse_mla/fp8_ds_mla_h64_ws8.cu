// Instantiation: fp8_ds_mla cache with an e4m3 q (S on the fp8 tensor cores, V dequantized to bf16),
// head tile 64, warp-specialized.
#include "cuda/sm90/sparse_mla/kernel_ws.cuh"

namespace smla::cuda::sm90::sparse_mla {
template void launch_ws<ptx::Bf16, KvFormat::kFP8DsMla, true>(const KernelParams&, cudaStream_t);
}  // namespace smla::cuda::sm90::sparse_mla
