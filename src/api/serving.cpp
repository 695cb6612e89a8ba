// The serving kernels behind one backend switch (smla/api.h): the CPU references with host
// pointers, the CUDA kernels with device pointers. Callers (Python, tools) never pick the
// implementation themselves.
#include <cmath>
#include <cstring>
#include <string>

#include "smla/api.h"
#include "smla/cache.h"
#include "smla/index.h"
#include "smla/numeric.h"

namespace smla {
namespace {

[[noreturn, maybe_unused]] void no_cuda(const char* what) {
  fail_unsupported(std::string(what) + " got CUDA pointers but this build of smla has no CUDA backend (nvcc was not "
                                       "found at build time); pass host memory or rebuild with nvcc on the PATH");
}

void check_finish_empty(const cuda::FinishEmptyParams& p) {
  SMLA_CHECK(p.num_tokens >= 0 && p.num_heads >= 1, "finish_empty_rows: need T >= 0 and H >= 1");
  SMLA_CHECK(p.num_tokens == 0 || (p.counts && p.out), "finish_empty_rows: counts and out must not be null");
  SMLA_CHECK(p.out_dtype == DType::kBF16 || p.out_dtype == DType::kFP16 || p.out_dtype == DType::kFP32,
             "finish_empty_rows: out must be bf16, fp16 or f32");
  SMLA_CHECK(p.out_stride_h >= kLatentDim && p.out_stride_t >= int64_t(p.num_heads - 1) * p.out_stride_h + kLatentDim,
             "finish_empty_rows: out must be [T, H, 512] with non-overlapping rows");
  SMLA_CHECK(!p.lse || p.lse_stride_t >= p.num_heads, "finish_empty_rows: lse row stride must be >= H");
}

// The CPU definition the CUDA finisher matches.
void finish_empty_rows_reference(const cuda::FinishEmptyParams& p) {
  const int ob = dtype_bytes(p.out_dtype);
  for (int64_t t = 0; t < p.num_tokens; ++t) {
    if (p.counts[t] > 0) continue;
    for (int h = 0; h < p.num_heads; ++h) {
      auto* row = static_cast<uint8_t*>(p.out) + (t * p.out_stride_t + h * p.out_stride_h) * ob;
      std::memset(row, 0, size_t(kLatentDim) * ob);
      if (p.lse) p.lse[t * p.lse_stride_t + h] = -INFINITY;
    }
  }
}

}  // namespace

void write_cache(Backend backend, const CacheWriteParams& p, void* stream) {
  validate(p);
  if (backend == Backend::kCpu) return write_cache_reference(p);
#if SMLA_HAVE_CUDA
  cuda::write_cache(p, stream);
#else
  (void)stream;
  no_cuda("write_cache");
#endif
}

void convert_indices(Backend backend, const IndexConvertParams& p, void* stream) {
  validate(p);
  if (backend == Backend::kCpu) return convert_indices_reference(p);
#if SMLA_HAVE_CUDA
  cuda::convert_indices(p, stream);
#else
  (void)stream;
  no_cuda("convert_indices");
#endif
}

void finish_empty_rows(Backend backend, const cuda::FinishEmptyParams& p, void* stream) {
  check_finish_empty(p);
  if (backend == Backend::kCpu) return finish_empty_rows_reference(p);
#if SMLA_HAVE_CUDA
  cuda::finish_empty_rows(p, stream);
#else
  (void)stream;
  no_cuda("finish_empty_rows");
#endif
}

}  // namespace smla
