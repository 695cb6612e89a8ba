// Instantiation: fp16 cache, head tile 16.
#include "cuda/sm90/sparse_mla/kernel.cuh"

namespace smla::cuda::sm90::sparse_mla {
template void launch_main<ptx::Fp16, 1>(const KernelParams&, cudaStream_t);
}  // namespace smla::cuda::sm90::sparse_mla
