// Instantiations of the small-head decode kernel for fp8_ds_mla with a bf16 q: head tiles 16 and 32,
// K converted by bit moves into bf16 or by cvt into f16; for H <= 16 also the deep and team rings.
#include "decode_small_h/src/kernel.cuh"

#include <string>

#include "smla/types.h"

namespace smla::cuda::sm90::decode {

template <int kMT, bool kF16K, int kRing>
void launch_decode(const DecodeParams& p, cudaStream_t stream) {
  using Cfg = DecodeConfig<kMT, kRing>;
  auto* kernel = decode_fp8_ds_mla_kernel<kMT, kF16K, kRing>;
  // Per device: the attribute is a property of the function on the current device.
  static bool attribute_set[64] = {};
  int dev = 0;
  SMLA_CHECK(cudaGetDevice(&dev) == cudaSuccess, "cudaGetDevice failed");
  if (dev >= 64 || !attribute_set[dev]) {
    cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(Cfg::kSmemBytes));
    if (e == cudaSuccess)
      e = cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, int(cudaSharedmemCarveoutMaxShared));
    SMLA_CHECK(e == cudaSuccess, std::string("small-head decode: cannot set shared memory: ") + cudaGetErrorString(e));
    if (dev < 64) attribute_set[dev] = true;
  }
  const int64_t blocks = p.num_tokens * p.num_splits * p.head_groups;
  if (blocks > 0) kernel<<<unsigned(blocks), Cfg::kBlockThreads, Cfg::kSmemBytes, stream>>>(p);
}

template <int kMT, bool kF16K, int kRing>
int blocks_per_sm() {
  launch_decode<kMT, kF16K, kRing>(DecodeParams{}, nullptr);  // T = 0: sets the attributes, launches nothing
  int n = 0;
  using Cfg = DecodeConfig<kMT, kRing>;
  const cudaError_t e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(
      &n, decode_fp8_ds_mla_kernel<kMT, kF16K, kRing>, Cfg::kBlockThreads, Cfg::kSmemBytes);
  SMLA_CHECK(e == cudaSuccess, std::string("small-head decode: occupancy query failed: ") + cudaGetErrorString(e));
  return n;
}

#define SMLA_DECODE_INSTANTIATE(MT, F16K, DEEP)                                      \
  template void launch_decode<MT, F16K, DEEP>(const DecodeParams&, cudaStream_t); \
  template int blocks_per_sm<MT, F16K, DEEP>();
SMLA_DECODE_INSTANTIATE(1, false, 0)
SMLA_DECODE_INSTANTIATE(2, false, 0)
SMLA_DECODE_INSTANTIATE(1, true, 0)
SMLA_DECODE_INSTANTIATE(2, true, 0)
SMLA_DECODE_INSTANTIATE(1, false, 1)
SMLA_DECODE_INSTANTIATE(1, true, 1)
SMLA_DECODE_INSTANTIATE(1, false, 2)
SMLA_DECODE_INSTANTIATE(1, true, 2)
#undef SMLA_DECODE_INSTANTIATE

}  // namespace smla::cuda::sm90::decode
