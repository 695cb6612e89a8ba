// Error checking for CUDA calls and launches in the serving kernels.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "smla/types.h"

namespace smla::cuda {

inline void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) fail(std::string(what) + ": " + cudaGetErrorString(e));
}
// After a launch: the launch configuration error, if any.
inline void check_launch(const char* kernel) { check_cuda(cudaGetLastError(), kernel); }

}  // namespace smla::cuda
