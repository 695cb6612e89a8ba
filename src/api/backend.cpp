#include <map>
#include <mutex>
#include <string>

#include "reference/sparse_mla.h"
#include "smla/api.h"
#if SMLA_HAVE_CUDA
#include "smla/cuda.h"
#endif

namespace smla {

std::string_view to_string(Backend b) { return b == Backend::kCpu ? "cpu" : "cuda"; }

Backend parse_backend(std::string_view name) {
  if (name == "cpu") return Backend::kCpu;
  if (name == "cuda") return Backend::kCuda;
  fail("unknown backend '" + std::string(name) + "'; use cpu or cuda");
}

bool built_with_cuda() {
#if SMLA_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

DeviceInfo first_cuda_device() { return cuda_device(0); }

DeviceInfo cuda_device(int ordinal) {
#if SMLA_HAVE_CUDA
  // cudaGetDeviceProperties is slow: one query per device per process.
  static std::mutex mu;
  static std::map<int, DeviceInfo> infos;
  std::lock_guard<std::mutex> lock(mu);
  auto it = infos.find(ordinal);
  if (it != infos.end()) return it->second;
  DeviceInfo d;
  if (ordinal >= 0 && ordinal < cuda::device_count()) d = cuda::device_info(ordinal);
  infos.emplace(ordinal, d);
  return d;
#else
  (void)ordinal;
  return {};
#endif
}

std::string cuda_kernel_for(const Geometry& g, const DeviceInfo& dev) {
  const CudaVariant* v = cuda_variant_for(g, dev);
  return cuda_kernel_name(g) + (v != nullptr ? "/" + std::string(v->name) : std::string());
}

std::string cuda_kernel_for(const Geometry& g, const DeviceInfo& dev, int64_t num_tokens) {
  const CudaVariant* v = cuda_variant_for(g, dev, num_tokens, false);
  return cuda_kernel_name(g) + (v != nullptr ? "/" + std::string(v->name) : std::string());
}

Support backend_support(Backend backend, const Geometry& g, int device) {
  if (backend == Backend::kCpu) return support_cpu(g);
  return support_cuda(g, cuda_device(device), built_with_cuda());
}

void run_host(Backend backend, const SparseMlaParams& p, size_t kv_bytes) {
  if (backend == Backend::kCpu) {
    reference::sparse_mla(p);
    return;
  }
  const Support s = backend_support(backend, geometry_of(p));
  SMLA_CHECK(s.ok(), s.reason);
#if SMLA_HAVE_CUDA
  cuda::sparse_mla_from_host(p, kv_bytes);
#else
  (void)kv_bytes;
#endif
}

}  // namespace smla
