// smla/cuda_serving.h — the CUDA serving kernels around the attention call: cache writers, index
// conversion (with the context-parallel filter) and the empty-row finisher. Each equals its CPU
// reference exactly. Device pointers; streams as void* (cudaStream_t). Host code validates the
// params first (throws Error before any launch); nothing allocates or synchronizes.
#pragma once

#include <cstdint>

#include "smla/cache.h"
#include "smla/index.h"
#include "smla/types.h"

namespace smla::cuda {

// Encodes new tokens into their cache rows; bit-identical to write_cache_reference().
void write_cache(const CacheWriteParams& p, void* stream);

// Request-local positions -> physical rows (compacted to the front, -1 after) and valid counts;
// with dcp_world > 1 only this rank's positions, at their local rows. Equal to
// convert_indices_reference().
void convert_indices(const IndexConvertParams& p, void* stream);

struct FinishEmptyParams {
  int64_t num_tokens = 0;
  int num_heads = 0;
  const int32_t* counts = nullptr;  // [T] valid counts
  void* out = nullptr;              // [T, H, 512] out_dtype (bf16, fp16 or fp32)
  int64_t out_stride_t = 0, out_stride_h = 0;
  DType out_dtype = DType::kBF16;
  float* lse = nullptr;             // nullable [T, H], row stride lse_stride_t
  int64_t lse_stride_t = 0;
};
// Rows with counts[t] <= 0 get out 0 and LSE -inf; no other row is touched.
void finish_empty_rows(const FinishEmptyParams& p, void* stream);

}  // namespace smla::cuda
