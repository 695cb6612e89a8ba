// Small pieces the GPU benchmarks share (smla bench, smla bench --shardq): checked CUDA calls, a
// device buffer, event timing behind a GPU sleep, the two ceilings of DESIGN.md §7 (cuBLAS bf16
// GEMM rate, device-to-device copy bandwidth) and a pool of quantized rows made on the device.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "devtools/bench_support.h"
#include "smla/formats.h"
#include "smla/types.h"

namespace smla::cli::gpu_bench {

inline void ck(cudaError_t e, const char* what) { SMLA_CHECK(e == cudaSuccess, std::string(what) + ": " + cudaGetErrorString(e)); }
inline void ckb(cublasStatus_t s, const char* what) { SMLA_CHECK(s == CUBLAS_STATUS_SUCCESS, std::string(what) + " failed"); }

struct DevMem {
  void* p = nullptr;
  explicit DevMem(size_t bytes) { ck(cudaMalloc(&p, bytes), "cudaMalloc"); }
  ~DevMem() { cudaFree(p); }
  DevMem(const DevMem&) = delete;
  DevMem& operator=(const DevMem&) = delete;
};

struct Timing {
  double median = 0, min = 0, max = 0;
};

// Times fn(i) (stream work) `reps` times after `warmup` runs, each between its own event pair.
// All reps are queued behind a GPU sleep first, so they run back to back and the events time
// the GPU rather than the host's launch overhead.
template <typename Fn>
Timing time_events(cudaStream_t s, int warmup, int reps, Fn&& fn) {
  for (int i = 0; i < warmup; ++i) fn(i);
  ck(cudaStreamSynchronize(s), "warm-up");
  std::vector<cudaEvent_t> ev(size_t(2 * reps));
  for (auto& e : ev) ck(cudaEventCreate(&e), "event");
  cuda::gpu_sleep(uint64_t(2'000'000) + uint64_t(reps) * 100'000, s);
  for (int i = 0; i < reps; ++i) {
    ck(cudaEventRecord(ev[size_t(2 * i)], s), "record");
    fn(warmup + i);
    ck(cudaEventRecord(ev[size_t(2 * i + 1)], s), "record");
  }
  ck(cudaStreamSynchronize(s), "timed reps");
  std::vector<double> ms;
  for (int i = 0; i < reps; ++i) {
    float t = 0;
    ck(cudaEventElapsedTime(&t, ev[size_t(2 * i)], ev[size_t(2 * i + 1)]), "elapsed");
    ms.push_back(t);
  }
  for (auto& e : ev) cudaEventDestroy(e);
  std::sort(ms.begin(), ms.end());
  return {ms[ms.size() / 2], ms.front(), ms.back()};
}

// Dense bf16 GEMM rate (TFLOP/s) through cuBLAS, 8192^3 on random data.
inline double measure_gemm_tflops(cudaStream_t s) {
  const int n = 8192;
  const size_t elems = size_t(n) * n;
  DevMem A(elems * 2), B(elems * 2), C(elems * 2);
  cuda::fill_random_16bit(A.p, elems, DType::kBF16, 11, s);
  cuda::fill_random_16bit(B.p, elems, DType::kBF16, 12, s);
  cublasHandle_t h;
  ckb(cublasCreate(&h), "cublasCreate");
  ckb(cublasSetStream(h, s), "cublasSetStream");
  const float alpha = 1.0f, beta = 0.0f;
  const Timing t = time_events(s, 3, 15, [&](int) {
    ckb(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &alpha, A.p, CUDA_R_16BF, n, B.p, CUDA_R_16BF, n, &beta,
                     C.p, CUDA_R_16BF, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
        "cublasGemmEx");
  });
  cublasDestroy(h);
  return 2.0 * n * double(n) * n / (t.median * 1e-3) / 1e12;
}

// Device-to-device copy bandwidth (TB/s), counting bytes read plus bytes written.
inline double measure_copy_tbps(cudaStream_t s) {
  const size_t bytes = size_t(2) << 30;
  DevMem src(bytes), dst(bytes);
  ck(cudaMemsetAsync(src.p, 1, bytes, s), "memset");
  const Timing t = time_events(s, 3, 15, [&](int) {
    ck(cudaMemcpyAsync(dst.p, src.p, bytes, cudaMemcpyDeviceToDevice, s), "cudaMemcpyAsync");
  });
  return 2.0 * double(bytes) / (t.median * 1e-3) / 1e12;
}

// A pool of a quantized format: random e4m3 / e2m1 codes of moderate size (e4m3 exponent field
// <= 7: |v| < 2, never NaN), finite scales and RoPE, so no NaN or inf reaches the kernel. Made on
// the host for the first 8192 rows and replicated on the device: the values do not change the time.
inline void fill_quantized_pool(uint8_t* pool, int64_t rows, KvFormat fmt, int rope, cudaStream_t s) {
  const int rb = row_bytes(fmt, rope);
  const int64_t n0 = std::min<int64_t>(rows, 8192);
  std::vector<uint8_t> h(static_cast<size_t>(n0 * rb));
  uint64_t x = 0x9E3779B97F4A7C15ull;
  auto next = [&] {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    return x;
  };
  for (auto& b : h) b = uint8_t(next());
  const RowLayout l = row_layout(fmt);
  for (int64_t r = 0; r < n0; ++r) {
    uint8_t* row = h.data() + r * rb;
    switch (fmt) {
      case KvFormat::kFP8E4M3:
        for (int i = 0; i < rb; ++i) row[i] &= 0xbf;
        break;
      case KvFormat::kFP8DsMla:
        for (int i = 0; i < l.latent_bytes; ++i) row[i] &= 0xbf;
        for (int i = 0; i < l.num_scales; ++i) {
          const float sc = 0.5f + float(next() % 1024) / 1024.0f;  // any finite fp32 scale
          std::memcpy(row + l.scale_offset + l.scale_bytes * i, &sc, sizeof sc);
        }
        for (int i = 0; i < kRopeDim; ++i) {  // bf16 in +-[1, 2)
          const uint16_t v = uint16_t(0x3f80u | (next() & 0x807fu));
          std::memcpy(row + l.rope_offset + 2 * i, &v, 2);
        }
        break;
      case KvFormat::kNvFP4DsMla:
        for (int i = l.rope_offset; i < l.rope_offset + kRopeDim; ++i) row[i] &= 0xbf;  // RoPE e4m3
        for (int i = l.scale_offset; i < l.scale_offset + l.num_scales; ++i)
          row[i] = uint8_t(0x30 | (next() & 0xf));  // scales in [0.5, 2)
        break;
      default: break;
    }
  }
  ck(cudaMemcpyAsync(pool, h.data(), h.size(), cudaMemcpyHostToDevice, s), "pool upload");
  for (int64_t done = n0; done < rows;) {
    const int64_t n = std::min(done, rows - done);
    ck(cudaMemcpyAsync(pool + done * rb, pool, size_t(n * rb), cudaMemcpyDeviceToDevice, s), "pool replicate");
    done += n;
  }
  ck(cudaStreamSynchronize(s), "pool fill");
}

}  // namespace smla::cli::gpu_bench
