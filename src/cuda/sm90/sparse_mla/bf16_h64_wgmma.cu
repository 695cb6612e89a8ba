// Instantiation: bf16 cache, head tile 64, wgmma variant.
#include "cuda/sm90/sparse_mla/kernel_wgmma.cuh"

namespace smla::cuda::sm90::sparse_mla {
template void launch_wgmma<ptx::Bf16>(const KernelParams&, cudaStream_t);
}  // namespace smla::cuda::sm90::sparse_mla
