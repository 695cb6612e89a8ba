// The gather-limit kernel of `smla bench` (devtools/bench_support.h, issue #19) reads the rows it is
// given, where they are: it stores nothing but a word written when a thread's checksum of the
// loaded data equals the magic value, so a pool of zero rows with that value planted in one 16-byte
// chunk of one row shows whether that chunk was loaded. For each row size of the KV formats and
// every chunk position: planted row listed once -> the word is written; not listed, or listed only
// through an id outside [0, num_rows) -> it is not. Skips without an SM90 device.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include "../common/gpu_test.h"

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "devtools/bench_support.h"
#include "smla/formats.h"

namespace {

using namespace smla;
using smla::test::fresh_seed;

#define CUDA_OK(x) ASSERT_EQ((x), cudaSuccess) << #x

constexpr uint32_t kMagic = 0x9e3779b9u;  // the value the kernel's checksum is compared with

TEST(GatherLimitGpu, ReadsEveryChunkOfTheListedRowsAndNothingElse) {
  REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const int64_t rows = 3000;  // the pool holds one more row, past num_rows
  const int64_t count = 5000;
  for (KvFormat f : {KvFormat::kBF16, KvFormat::kFP8E4M3, KvFormat::kFP8DsMla, KvFormat::kNvFP4DsMla}) {
    const int rb = row_bytes(f, 64);
    SCOPED_TRACE(std::string(to_string(f)) + ": " + std::to_string(rb) + "-byte rows");
    ASSERT_TRUE(cuda::gather_supports_row_bytes(rb));
    uint8_t* pool = nullptr;
    int32_t* idx = nullptr;
    uint32_t* sink = nullptr;
    CUDA_OK(cudaMalloc(&pool, size_t(rows + 1) * rb));
    CUDA_OK(cudaMalloc(&idx, size_t(count) * 4));
    CUDA_OK(cudaMalloc(&sink, 4));
    CUDA_OK(cudaMemset(pool, 0, size_t(rows + 1) * rb));
    const auto run = [&](const std::vector<int32_t>& ids) {
      uint32_t got = 0;
      EXPECT_EQ(cudaMemcpy(idx, ids.data(), ids.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
      EXPECT_EQ(cudaMemset(sink, 0, 4), cudaSuccess);
      cuda::gather_rows(pool, rows, rb, idx, int64_t(ids.size()), sink, nullptr);
      EXPECT_EQ(cudaMemcpy(&got, sink, 4, cudaMemcpyDeviceToHost), cudaSuccess);
      return got;
    };
    for (int chunk = 0; chunk < rb / 16; ++chunk) {
      const int64_t planted = int64_t(rng() % uint64_t(rows));
      CUDA_OK(cudaMemset(pool, 0, size_t(rows + 1) * rb));
      CUDA_OK(cudaMemcpy(pool + planted * rb + chunk * 16 + 4 * int(rng() % 4), &kMagic, 4, cudaMemcpyHostToDevice));
      // Every other row (zeros), ids outside the pool, and the planted row once at a random place.
      std::vector<int32_t> ids(static_cast<size_t>(count));
      for (auto& v : ids) {
        do v = int32_t(rng() % uint64_t(rows)); while (v == planted);
        if (rng() % 16 == 0) v = rng() % 2 ? -1 : int32_t(rows + rng() % 4);
      }
      std::vector<int32_t> without = ids;
      ids[size_t(rng() % uint64_t(count))] = int32_t(planted);
      EXPECT_EQ(run(ids), kMagic) << "chunk " << chunk << " of row " << planted << " was not read";
      EXPECT_EQ(run(without), 0u) << "chunk " << chunk << ": a row that was not listed was read";
      if (chunk == 0) {
        // Planted in the row past num_rows, listed by its id: skipped, never read.
        CUDA_OK(cudaMemset(pool, 0, size_t(rows + 1) * rb));
        CUDA_OK(cudaMemcpy(pool + rows * rb, &kMagic, 4, cudaMemcpyHostToDevice));
        std::vector<int32_t> past = without;
        past[0] = int32_t(rows);
        EXPECT_EQ(run(past), 0u) << "an id >= num_rows was read";
      }
    }
    CUDA_OK(cudaDeviceSynchronize());
    cudaFree(pool), cudaFree(idx), cudaFree(sink);
  }
}

TEST(GatherLimitGpu, RefusesRowSizesItCannotRead) {
  REQUIRE_GPU();
  for (int rb : {0, 8, 100, cuda::kGatherMaxRowBytes + 16}) {
    EXPECT_FALSE(cuda::gather_supports_row_bytes(rb)) << rb;
    try {
      cuda::gather_rows(nullptr, 1, rb, nullptr, 1, nullptr, nullptr);
      ADD_FAILURE() << rb << "-byte rows were accepted";
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find("row_bytes"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
