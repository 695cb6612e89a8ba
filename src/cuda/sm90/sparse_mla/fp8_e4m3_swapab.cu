// Instantiation: the swap-AB small-H kernel (swapab.cuh) for fp8_e4m3 rows (k_scale in the score and
// output scales, an e4m3 RoPE), N = 16 heads per block (H <= 16).
#include "cuda/sm90/sparse_mla/swapab.cuh"

namespace smla::cuda::sm90::sparse_mla {
template void launch_swapab<16, KvFormat::kFP8E4M3>(const KernelParams&, cudaStream_t);
}  // namespace smla::cuda::sm90::sparse_mla
