// smla/api.h — backend choice for host-side callers (CLI, replay, C ABI, Python).
#pragma once

#include <cstddef>
#include <string>

#include "smla/cache.h"
#include "smla/cuda_serving.h"
#include "smla/index.h"
#include "smla/params.h"
#include "smla/support.h"

namespace smla {

enum class Backend { kCpu, kCuda };

std::string_view to_string(Backend b);
Backend parse_backend(std::string_view name);  // "cpu" | "cuda"

// Whether this build has the CUDA backend compiled in.
bool built_with_cuda();
// First CUDA device's properties, or an empty DeviceInfo (present() false) when none.
DeviceInfo first_cuda_device();
// CUDA device `ordinal`'s properties (queried once per process), or an empty DeviceInfo when the
// build has no CUDA backend or there is no such device.
DeviceInfo cuda_device(int ordinal);

// Why `backend` cannot run g here (on CUDA device `device`), or OK.
Support backend_support(Backend backend, const Geometry& g, int device = 0);
// The CUDA kernel that runs g on dev (default: any SM90 GPU), "sm90/sparse_mla/<format>_d<D>/<variant>"
// (the first variant of the table that supports g, e.g. ".../bf16_d576/h64.ws"); the format part
// alone when no variant does.
std::string cuda_kernel_for(const Geometry& g, const DeviceInfo& dev = any_sm90_device());
// The same for a call of num_tokens rows (cuda_variant_for's small-call rule; not batch-invariant).
std::string cuda_kernel_for(const Geometry& g, const DeviceInfo& dev, int64_t num_tokens);

// Runs p whose pointers are HOST memory on the chosen backend (the CUDA path copies to and from
// the device and synchronizes). kv_bytes: size of the buffer p.kv points to.
void run_host(Backend backend, const SparseMlaParams& p, size_t kv_bytes);

// The serving kernels on a backend: the CPU reference with host pointers, or the CUDA kernels with
// device pointers on `stream` (a cudaStream_t; the caller has made the pointers' device current).
// Each validates p first and throws Error before touching memory; the CUDA path never allocates
// or synchronizes.
void write_cache(Backend backend, const CacheWriteParams& p, void* stream);
void convert_indices(Backend backend, const IndexConvertParams& p, void* stream);
// Rows with counts[t] <= 0 get out 0 and LSE -inf; no other row is touched.
void finish_empty_rows(Backend backend, const cuda::FinishEmptyParams& p, void* stream);

}  // namespace smla
