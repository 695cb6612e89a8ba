// Device queries and host entry points of the CUDA backend.
#include <cuda_runtime.h>

#include <string>

#include "smla/cuda.h"

namespace smla::cuda {

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device / no driver" error
    return 0;
  }
  return n;
}

DeviceInfo device_info(int ordinal) {
  cudaDeviceProp prop;
  const cudaError_t e = cudaGetDeviceProperties(&prop, ordinal);
  SMLA_CHECK(e == cudaSuccess, "CUDA device " + std::to_string(ordinal) + ": " + cudaGetErrorString(e));
  DeviceInfo d;
  d.ordinal = ordinal;
  d.cc_major = prop.major;
  d.cc_minor = prop.minor;
  d.num_sms = prop.multiProcessorCount;
  d.smem_per_block_optin = prop.sharedMemPerBlockOptin;
  d.name = prop.name;
  return d;
}

size_t sparse_mla_workspace_bytes(const SparseMlaParams&, int) { return 0; }

void sparse_mla(const SparseMlaParams&, void*, size_t, void*) { fail("the SM90 sparse MLA kernel is not built yet"); }

void sparse_mla_from_host(const SparseMlaParams&, size_t) { fail("the SM90 sparse MLA kernel is not built yet"); }

}  // namespace smla::cuda
