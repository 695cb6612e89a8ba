// Instantiation: the swap-AB small-H kernel (swapab.cuh) for fp8_ds_mla rows and a bf16 q, N = 16
// heads per block (H <= 16), with its two timing-only diagnostic modes (SMLA_SM90_SWAPAB_DIAG).
#include "cuda/sm90/sparse_mla/swapab.cuh"

namespace smla::cuda::sm90::sparse_mla {
template void launch_swapab<16, KvFormat::kFP8DsMla>(const KernelParams&, cudaStream_t);
}  // namespace smla::cuda::sm90::sparse_mla
