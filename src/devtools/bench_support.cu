// Device-side random fills for benchmarks: counter-based (splitmix64 of seed and index), so the
// data does not depend on the launch shape.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "devtools/bench_support.h"

namespace smla::cuda {
namespace {

__device__ __forceinline__ uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Sum of two uniforms in [-1, 1) (variance 2/3), times sqrt(3/2): unit variance.
__device__ __forceinline__ float unit_noise(uint64_t h) {
  const float a = float(uint32_t(h) >> 8) * (1.0f / 8388608.0f) - 1.0f;
  const float b = float(uint32_t(h >> 32) >> 8) * (1.0f / 8388608.0f) - 1.0f;
  return (a + b) * 1.2247449f;
}

template <bool kBf16>
__global__ void fill_16bit_kernel(uint16_t* dst, size_t count, uint64_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < count; i += size_t(gridDim.x) * blockDim.x) {
    const float v = unit_noise(splitmix64(seed ^ (i * 0x2545f4914f6cdd1dull)));
    if constexpr (kBf16) {
      __nv_bfloat16 b = __float2bfloat16_rn(v);
      dst[i] = *reinterpret_cast<uint16_t*>(&b);
    } else {
      __half b = __float2half_rn(v);
      dst[i] = *reinterpret_cast<uint16_t*>(&b);
    }
  }
}

__global__ void fill_rows_kernel(int32_t* dst, size_t count, int64_t num_rows, uint64_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < count; i += size_t(gridDim.x) * blockDim.x)
    dst[i] = int32_t(splitmix64(seed ^ (i * 0x9e3779b97f4a7c15ull)) % uint64_t(num_rows));
}

__global__ void sleep_kernel(uint64_t ns) {
  uint64_t t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do {
    __nanosleep(1000);
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  } while (t - t0 < ns);
}

// Spins until the host-mapped word becomes nonzero (volatile: every read goes to host memory).
__global__ void wait_flag_kernel(const volatile uint32_t* flag) {
  while (*flag == 0) __nanosleep(2000);
}

// The gather limit. Each warp step reads `rows` rows at once: lane l < rows fetches the id of row
// l, then every lane issues up to kGatherLoads independent 16-byte loads (chunk i * 32 + lane of
// the step's rows * chunks), so about 9 KB per warp are in flight. The loads fold into one word per
// thread. One instantiation serves every row size.
constexpr int kGatherLoads = 18;
constexpr int kGatherStepChunks = kGatherLoads * 32;  // 576 chunks of 16 B: 8 bf16 rows, 14 fp8_ds_mla rows
static_assert(kGatherMaxRowBytes == kGatherStepChunks * 16);
constexpr uint32_t kGatherMagic = 0x9e3779b9u;

__global__ void __launch_bounds__(256, 2) gather_rows_kernel(const uint8_t* pool, int64_t num_rows, int chunks,
                                                             int rows, const int32_t* idx, int64_t count,
                                                             uint32_t* sink) {
  const int lane = threadIdx.x & 31;
  const int64_t warp = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int64_t warps = (int64_t(gridDim.x) * blockDim.x) >> 5;
  uint32_t acc = 0;
  for (int64_t base = warp * rows; base < count; base += warps * rows) {
    const int32_t id = lane < rows && base + lane < count ? __ldg(idx + base + lane) : -1;
    uint4 v[kGatherLoads];
#pragma unroll
    for (int i = 0; i < kGatherLoads; ++i) {
      const int flat = i * 32 + lane;
      const int r = flat / chunks, c = flat - r * chunks;
      const int32_t row = __shfl_sync(0xffffffffu, id, r < rows ? r : 0);
      v[i] = make_uint4(0, 0, 0, 0);
      if (r < rows && row >= 0 && row < num_rows)
        v[i] = __ldg(reinterpret_cast<const uint4*>(pool + int64_t(row) * chunks * 16) + c);
    }
#pragma unroll
    for (int i = 0; i < kGatherLoads; ++i) acc ^= v[i].x ^ v[i].y ^ v[i].z ^ v[i].w;
  }
  if (acc == kGatherMagic) *sink = acc;
}

void check_launch(const char* what) {
  const cudaError_t e = cudaGetLastError();
  SMLA_CHECK(e == cudaSuccess, std::string(what) + ": " + cudaGetErrorString(e));
}

}  // namespace

void fill_random_16bit(void* dst, size_t count, DType type, uint64_t seed, void* stream) {
  SMLA_CHECK(type == DType::kBF16 || type == DType::kFP16, "fill_random_16bit: type must be bf16 or fp16");
  if (count == 0) return;
  auto s = static_cast<cudaStream_t>(stream);
  if (type == DType::kBF16) fill_16bit_kernel<true><<<4096, 256, 0, s>>>(static_cast<uint16_t*>(dst), count, seed);
  else fill_16bit_kernel<false><<<4096, 256, 0, s>>>(static_cast<uint16_t*>(dst), count, seed);
  check_launch("fill_random_16bit");
}

void fill_random_rows(int32_t* dst, size_t count, int64_t num_rows, uint64_t seed, void* stream) {
  SMLA_CHECK(num_rows > 0, "fill_random_rows: num_rows must be > 0");
  if (count == 0) return;
  fill_rows_kernel<<<4096, 256, 0, static_cast<cudaStream_t>(stream)>>>(dst, count, num_rows, seed);
  check_launch("fill_random_rows");
}

bool gather_supports_row_bytes(int row_bytes) {
  return row_bytes > 0 && row_bytes % 16 == 0 && row_bytes <= kGatherMaxRowBytes;
}

void gather_rows(const void* pool, int64_t num_rows, int row_bytes, const int32_t* idx, int64_t count, uint32_t* sink,
                 void* stream) {
  SMLA_CHECK(gather_supports_row_bytes(row_bytes), "gather_rows: row_bytes " + std::to_string(row_bytes) +
                                                       " must be a positive multiple of 16 up to " +
                                                       std::to_string(kGatherMaxRowBytes));
  SMLA_CHECK(reinterpret_cast<uintptr_t>(pool) % 16 == 0, "gather_rows: the pool must be 16-byte aligned");
  SMLA_CHECK(sink != nullptr, "gather_rows: sink must be a device word");
  if (count == 0) return;
  const int chunks = row_bytes / 16;
  const int rows = std::min(32, kGatherStepChunks / chunks);
  // Enough blocks to fill every SM a few times over: the scheduler balances the tail.
  static const int blocks = [] {
    int dev = 0, sms = 0, per_sm = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    if (e == cudaSuccess) e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, gather_rows_kernel, 256, 0);
    SMLA_CHECK(e == cudaSuccess, std::string("gather_rows: cannot query the device: ") + cudaGetErrorString(e));
    return std::max(1, sms * std::max(1, per_sm) * 4);
  }();
  gather_rows_kernel<<<blocks, 256, 0, static_cast<cudaStream_t>(stream)>>>(static_cast<const uint8_t*>(pool),
                                                                           num_rows, chunks, rows, idx, count, sink);
  check_launch("gather_rows");
}

void gpu_sleep(uint64_t ns, void* stream) {
  sleep_kernel<<<1, 1, 0, static_cast<cudaStream_t>(stream)>>>(ns);
  check_launch("gpu_sleep");
}

void gpu_wait_host_flag(const volatile uint32_t* flag_device_ptr, void* stream) {
  wait_flag_kernel<<<1, 1, 0, static_cast<cudaStream_t>(stream)>>>(flag_device_ptr);
  check_launch("gpu_wait_host_flag");
}

}  // namespace smla::cuda
