// Benchmark support on the device: random data (large pools are made on the GPU, not copied from the
// host). Host-callable, no CUDA headers: streams travel as void* (a cudaStream_t).
#pragma once

#include <cstddef>
#include <cstdint>

#include "smla/types.h"

namespace smla::cuda {

// count 16-bit values (bf16 or fp16) of a zero-mean, unit-variance-ish distribution
// (sum of two uniforms, scaled), a pure function of (seed, index).
void fill_random_16bit(void* dst, size_t count, DType type, uint64_t seed, void* stream);

// count int32 row ids uniform in [0, num_rows).
void fill_random_rows(int32_t* dst, size_t count, int64_t num_rows, uint64_t seed, void* stream);

// Keeps `stream` busy for about `ns` nanoseconds, so that the host can queue timed launches
// behind it and event timings measure the GPU, not the host's launch rate.
void gpu_sleep(uint64_t ns, void* stream);

// Keeps `stream` busy until the host sets a word to nonzero: flag_device_ptr is the device view
// (cudaHostGetDevicePointer) of pinned, mapped host memory (cudaHostAllocMapped). Simulates a step
// that never finishes (a peer that stopped taking part) for the watchdog tests.
void gpu_wait_host_flag(const volatile uint32_t* flag_device_ptr, void* stream);

// The gather limit of a sparse-attention case (issue #19): reads the row_bytes-byte rows
// pool[idx[i]], i < count, with 16-byte loads and several rows in flight per warp, and stores
// nothing but a word in `sink` (one device uint32, written only when the loaded data's checksum hits
// a magic value, so the loads cannot be removed). Ids outside [0, num_rows) are skipped. row_bytes:
// a multiple of 16 up to kGatherMaxRowBytes; pool 16-byte aligned.
inline constexpr int kGatherMaxRowBytes = 9216;
bool gather_supports_row_bytes(int row_bytes);
void gather_rows(const void* pool, int64_t num_rows, int row_bytes, const int32_t* idx, int64_t count, uint32_t* sink,
                 void* stream);

}  // namespace smla::cuda
