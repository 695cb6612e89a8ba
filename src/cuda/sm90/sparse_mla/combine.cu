// Instantiations of the split-K merge (small; both 16-bit output types in one file).
#include "cuda/sm90/sparse_mla/combine.cuh"

namespace smla::cuda::sm90::sparse_mla {
template void launch_combine<ptx::Bf16>(const KernelParams&, cudaStream_t);
template void launch_combine<ptx::Fp16>(const KernelParams&, cudaStream_t);
}  // namespace smla::cuda::sm90::sparse_mla
