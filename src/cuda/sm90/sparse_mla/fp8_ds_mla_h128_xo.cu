// Instantiation: fp8_ds_mla cache, the crossover variant (kernel_xo.cuh): a token's two 64-head
// blocks as a cluster of 2, each dequantizing half of every tile for both (opt-in, SMLA_SM90_CROSSOVER=1);
// launch_xo holds both kernels: raw rows staged in shared memory, or (SMLA_SM90_XO_REGS=1) in registers.
#include "cuda/sm90/sparse_mla/kernel_xo.cuh"

namespace smla::cuda::sm90::sparse_mla {
template void launch_xo<KvFormat::kFP8DsMla>(const KernelParams&, cudaStream_t);
}  // namespace smla::cuda::sm90::sparse_mla
