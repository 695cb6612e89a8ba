// Device queries and the host-pointer convenience entry of the CUDA backend.
#include <cuda_runtime.h>

#include <cstring>
#include <string>

#include "smla/cuda.h"

namespace smla::cuda {
namespace {

void check(cudaError_t e, const char* what) {
  SMLA_CHECK(e == cudaSuccess, std::string(what) + ": " + cudaGetErrorString(e));
}

// One device buffer, freed on scope exit (also when a check throws).
struct DeviceBuffer {
  void* ptr = nullptr;
  DeviceBuffer() = default;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() {
    if (ptr) cudaFree(ptr);
  }
  // Allocates `bytes` and, when src is given, copies them from the host.
  void* make(size_t bytes, const void* src) {
    if (bytes == 0) return nullptr;
    check(cudaMalloc(&ptr, bytes), "cudaMalloc");
    if (src) check(cudaMemcpy(ptr, src, bytes, cudaMemcpyHostToDevice), "copy to device");
    return ptr;
  }
};

// Elements spanned by a [T, H, width] tensor with strides (st, sh): the last element + 1.
size_t span(int64_t T, int H, int64_t st, int64_t sh, int64_t width) {
  if (T <= 0) return 0;
  return size_t((T - 1) * st + int64_t(H - 1) * sh + width);
}

}  // namespace

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

void sparse_mla_from_host(const SparseMlaParams& hp, size_t kv_bytes, bool batch_invariant) {
  validate(hp);
  check_host_sink(hp);  // host pointers: the sink values are visible here
  SMLA_CHECK(hp.out_dtype != DType::kFP32,
             "out_dtype f32 is CPU-only; the CUDA backend writes bf16 (fp16 for an fp16 q)");
  if (hp.num_tokens == 0) return;
  check(cudaSetDevice(0), "cudaSetDevice(0)");
  const int64_t T = hp.num_tokens;
  const int H = hp.num_heads;
  const int qb = dtype_bytes(hp.q_dtype), ob = dtype_bytes(hp.out_dtype);
  const int q_width = hp.q_rope ? kLatentDim : hp.head_dim();

  DeviceBuffer q, q_rope, kv, idx, counts, sink, out, lse, ws;
  SparseMlaParams p = hp;
  p.q = q.make(span(T, H, hp.q_stride_t, hp.q_stride_h, q_width) * qb, hp.q);
  if (hp.q_rope) p.q_rope = q_rope.make(span(T, H, hp.q_rope_stride_t, hp.q_rope_stride_h, kRopeDim) * qb, hp.q_rope);
  p.kv = kv.make(kv_bytes, hp.kv);
  p.idx = static_cast<const int32_t*>(idx.make(span(T, 1, hp.idx_stride_t, 0, hp.topk) * 4, hp.idx));
  if (hp.counts) p.counts = static_cast<const int32_t*>(counts.make(size_t(T) * 4, hp.counts));
  if (hp.sink) p.sink = static_cast<const float*>(sink.make(size_t(H) * 4, hp.sink));
  // out and lse are copied in too, so cells the kernel must not touch come back unchanged.
  const size_t out_bytes = span(T, H, hp.out_stride_t, hp.out_stride_h, kLatentDim) * ob;
  p.out = out.make(out_bytes, hp.out);
  const bool with_lse = hp.lse != nullptr && hp.lse_mode != LseMode::kOff;
  const size_t lse_bytes = with_lse ? span(T, 1, hp.lse_stride_t, 0, H) * 4 : 0;
  p.lse = with_lse ? static_cast<float*>(lse.make(lse_bytes, hp.lse)) : nullptr;
  const size_t ws_bytes = sparse_mla_workspace_bytes(p, device_info(0).num_sms);
  void* w = ws.make(ws_bytes, nullptr);

  sparse_mla(p, w, ws_bytes, nullptr, 0, batch_invariant);
  check(cudaDeviceSynchronize(), "sparse MLA kernel");
  check(cudaMemcpy(hp.out, p.out, out_bytes, cudaMemcpyDeviceToHost), "copy out to host");
  if (with_lse) check(cudaMemcpy(hp.lse, p.lse, lse_bytes, cudaMemcpyDeviceToHost), "copy lse to host");
}

}  // namespace smla::cuda
