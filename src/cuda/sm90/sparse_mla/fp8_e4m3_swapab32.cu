// Instantiation: the swap-AB small-H kernel (swapab.cuh) for fp8_e4m3 rows, N = 32 heads per block
// (17 <= H <= 32; docs/perf-history.md#s14-swapab-n32).
#include "cuda/sm90/sparse_mla/swapab.cuh"

namespace smla::cuda::sm90::sparse_mla {
template void launch_swapab<32, KvFormat::kFP8E4M3>(const KernelParams&, cudaStream_t);
}  // namespace smla::cuda::sm90::sparse_mla
