// Instantiation: the swap-AB small-H kernel (swapab.cuh) for fp8_ds_mla rows and a bf16 q, N = 16
// heads per block (H <= 16; more blocks per token under SMLA_SM90_SWAPAB_HGROUPS), with its two
// timing-only modes and the early stage hold (SMLA_SM90_SWAPAB_HOLD=early).
#include "cuda/sm90/sparse_mla/swapab.cuh"

namespace smla::cuda::sm90::sparse_mla {
template void launch_swapab<16, KvFormat::kFP8DsMla>(const KernelParams&, cudaStream_t);
}  // namespace smla::cuda::sm90::sparse_mla
