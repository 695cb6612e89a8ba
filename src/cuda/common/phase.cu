// The phase-timing buffer pointer the sparse MLA launcher hands its kernels (cuda/common/phase.h),
// and the one-thread stamp kernel `smla bench --phases` uses around launches.
#include <cuda_runtime.h>

#include <string>

#include "cuda/common/phase.h"
#include "smla/types.h"

namespace smla::cuda::phase {
namespace {
void check_launch(const char* what) {
  const cudaError_t e = cudaGetLastError();
  SMLA_CHECK(e == cudaSuccess, std::string(what) + ": " + cudaGetErrorString(e));
}

uint64_t* g_buffer = nullptr;
__global__ void stamp_kernel(uint64_t* slot) {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;\n" : "=l"(t));
  *slot = t;
}
}  // namespace

void set_buffer(uint64_t* device_words) { g_buffer = device_words; }
uint64_t* buffer() { return g_buffer; }
void stamp(uint64_t* slot, void* stream) {
  stamp_kernel<<<1, 1, 0, static_cast<cudaStream_t>(stream)>>>(slot);
  check_launch("phase stamp");
}

}  // namespace smla::cuda::phase
