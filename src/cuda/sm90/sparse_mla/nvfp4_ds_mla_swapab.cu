// Instantiation: the swap-AB small-H kernel (swapab.cuh) for nvfp4_ds_mla rows (e2m1 with a block scale
// per 16 values, applied as K and V are converted: swapab_nvfp4.h; an e4m3 RoPE), N = 16 (H <= 16).
#include "cuda/sm90/sparse_mla/swapab.cuh"

namespace smla::cuda::sm90::sparse_mla {
template void launch_swapab<16, KvFormat::kNvFP4DsMla>(const KernelParams&, cudaStream_t);
}  // namespace smla::cuda::sm90::sparse_mla
