// Instantiation: fp16 cache, head tile 64, warp-specialized wgmma variant.
#include "cuda/sm90/sparse_mla/kernel_ws.cuh"

namespace smla::cuda::sm90::sparse_mla {
template void launch_ws<ptx::Fp16, KvFormat::kFP16>(const KernelParams&, cudaStream_t);
}  // namespace smla::cuda::sm90::sparse_mla
