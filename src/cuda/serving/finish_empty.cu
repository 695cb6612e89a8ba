// The empty-row finisher: rows whose count is 0 get out 0 and LSE -inf; other rows are untouched.
// One block of 128 threads per row; a row with entries returns at once.
#include <cuda_runtime.h>

#include "check.cuh"
#include "smla/cuda_serving.h"
#include "smla/params.h"

namespace smla::cuda {
namespace {

constexpr int kThreads = 128;

__global__ void __launch_bounds__(kThreads) finish_empty_kernel(FinishEmptyParams p, int elem_bytes) {
  const int64_t t = blockIdx.x;
  if (p.counts[t] > 0) return;
  for (int h = 0; h < p.num_heads; ++h) {
    char* o = static_cast<char*>(p.out) + (t * p.out_stride_t + h * p.out_stride_h) * elem_bytes;
    for (int i = int(threadIdx.x); i < kLatentDim * elem_bytes / 4; i += kThreads) reinterpret_cast<uint32_t*>(o)[i] = 0u;
  }
  if (p.lse)
    for (int h = int(threadIdx.x); h < p.num_heads; h += kThreads) p.lse[t * p.lse_stride_t + h] = -INFINITY;
}

}  // namespace

void finish_empty_rows(const FinishEmptyParams& p, void* stream) {
  SMLA_CHECK(p.num_tokens >= 0 && p.num_heads >= 1, "finish_empty_rows: need T >= 0 and H >= 1");
  if (p.num_tokens == 0) return;
  SMLA_CHECK(p.num_tokens <= 0x7fffffffLL, "finish_empty_rows: at most 2^31 - 1 rows per call");
  SMLA_CHECK(p.counts && p.out, "finish_empty_rows: counts and out must not be null");
  SMLA_CHECK(p.out_dtype == DType::kBF16 || p.out_dtype == DType::kFP16 || p.out_dtype == DType::kFP32,
             "finish_empty_rows: out must be bf16, fp16 or f32");
  SMLA_CHECK(p.out_stride_h >= kLatentDim && p.out_stride_t >= int64_t(p.num_heads - 1) * p.out_stride_h + kLatentDim,
             "finish_empty_rows: out must be [T, H, 512] with non-overlapping rows");
  const int eb = dtype_bytes(p.out_dtype);
  SMLA_CHECK((p.out_stride_h * eb) % 4 == 0 && (p.out_stride_t * eb) % 4 == 0 &&
                 reinterpret_cast<uintptr_t>(p.out) % 4 == 0,
             "finish_empty_rows: out rows must be 4-byte aligned");
  SMLA_CHECK(!p.lse || p.lse_stride_t >= p.num_heads, "finish_empty_rows: lse row stride must be >= H");
  finish_empty_kernel<<<unsigned(p.num_tokens), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(p, eb);
  check_launch("finish_empty_kernel");
}

}  // namespace smla::cuda
