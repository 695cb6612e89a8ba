// The serving kernels (cache writers, index conversion, empty-row finisher) against their CPU
// references: bytes must be identical. Skips without a CUDA device.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include "../common/gpu_test.h"

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "smla/cuda.h"
#include "smla/cuda_serving.h"
#include "smla/formats.h"
#include "smla/numeric.h"

// GoogleTest prints parameters in test listings: names, not 1-byte object dumps.
namespace smla {
inline void PrintTo(KvFormat f, std::ostream* os) { *os << to_string(f); }
inline void PrintTo(DType t, std::ostream* os) { *os << to_string(t); }
}  // namespace smla

namespace {

using namespace smla;
using smla::test::fresh_seed;

#define CUDA_OK(x) ASSERT_EQ((x), cudaSuccess) << #x

template <class T>
struct DeviceBuffer {
  T* ptr = nullptr;
  size_t n = 0;
  explicit DeviceBuffer(const std::vector<T>& host) : n(host.size()) {
    EXPECT_EQ(cudaMalloc(&ptr, std::max<size_t>(1, n) * sizeof(T)), cudaSuccess);
    if (n) EXPECT_EQ(cudaMemcpy(ptr, host.data(), n * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  }
  ~DeviceBuffer() { cudaFree(ptr); }
  std::vector<T> to_host() const {
    std::vector<T> h(n);
    if (n) EXPECT_EQ(cudaMemcpy(h.data(), ptr, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return h;
  }
};

class CacheWriter : public ::testing::TestWithParam<std::tuple<KvFormat, int, DType>> {};

TEST_P(CacheWriter, BitIdenticalToCpuEncoder) {
  REQUIRE_GPU();
  const auto [format, rope_dim, src] = GetParam();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal;
  const int64_t N = 300;
  const int B = 16;
  const int64_t block_stride = 24, num_blocks = 40, num_rows = num_blocks * block_stride - 5;
  const int rb = row_bytes(format, rope_dim);
  const int64_t row_stride = rb + 16;
  std::vector<uint16_t> latent(size_t(N * 512)), rope(size_t(N * 64));
  auto enc = [&](float v) { return src == DType::kBF16 ? num::f32_to_bf16(v) : num::f32_to_fp16(v); };
  constexpr int kTile = row_layout(KvFormat::kFP8DsMla).tile_width;  // the first fp8_ds_mla tile
  for (int64_t n = 0; n < N; ++n) {
    const int kind = int(n % 5);
    for (int d = 0; d < 512; ++d) {
      float v = normal(rng);
      if (kind == 1 && d < kTile) v = 0.0f;           // an all-zero tile / blocks
      if (kind == 2) v *= 3000.0f;                    // past e4m3's range before scaling
      if (kind == 3) v *= 1e-6f;                      // tiny values, subnormal scales
      if (kind == 4 && d % 37 == 0) v = 60000.0f;     // one large outlier per block
      latent[size_t(n * 512 + d)] = enc(v);
    }
    for (int d = 0; d < 64; ++d) rope[size_t(n * 64 + d)] = enc(kind == 2 ? normal(rng) * 1000.0f : normal(rng));
  }
  std::vector<int32_t> slots(static_cast<size_t>(N));
  for (int64_t n = 0; n < N; ++n) {
    slots[size_t(n)] = int32_t(rng() % uint64_t(num_blocks * B));
    if (n % 11 == 3) slots[size_t(n)] = -1;                            // skipped token
    if (n % 13 == 4) slots[size_t(n)] = int32_t(num_blocks * B + 7);   // past the cache: skipped
  }
  // Distinct slots so the order of writes does not matter.
  std::vector<uint8_t> used(size_t(num_blocks * B), 0);
  for (auto& s : slots)
    if (s >= 0 && s < num_blocks * B) {
      if (used[size_t(s)]) s = -1;
      else used[size_t(s)] = 1;
    }
  std::vector<uint8_t> cache(size_t(num_rows * row_stride));
  for (auto& b : cache) b = uint8_t(rng());

  DeviceBuffer<uint16_t> d_latent(latent), d_rope(rope);
  DeviceBuffer<int32_t> d_slots(slots);
  DeviceBuffer<uint8_t> d_cache(cache);
  CacheWriteParams p;
  p.num_tokens = N, p.latent_stride = 512, p.rope_stride = 64, p.src_dtype = src;
  p.num_rows = num_rows, p.row_stride_bytes = row_stride, p.block_size = B, p.block_stride_rows = block_stride;
  p.format = format, p.rope_dim = rope_dim, p.k_scale = 0.37f;
  CacheWriteParams dp = p;
  dp.latent = d_latent.ptr, dp.rope = rope_dim ? d_rope.ptr : nullptr, dp.slot_mapping = d_slots.ptr;
  dp.cache = d_cache.ptr;
  cuda::write_cache(dp, nullptr);
  CUDA_OK(cudaDeviceSynchronize());
  const auto got = d_cache.to_host();

  p.latent = latent.data(), p.rope = rope_dim ? rope.data() : nullptr, p.slot_mapping = slots.data();
  p.cache = cache.data();
  write_cache_reference(p);
  ASSERT_EQ(got.size(), cache.size());
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_EQ(int(got[i]), int(cache[i])) << "byte " << i << " (row " << i / row_stride << ", offset " << i % row_stride << ")";
  // Written rows decode to finite values.
  std::vector<float> dec(size_t(512 + rope_dim));
  for (int64_t n = 0; n < N; ++n) {
    const int64_t r = p.physical_row(slots[size_t(n)]);
    if (r < 0) continue;
    decode_row(format, rope_dim, got.data() + r * row_stride, p.k_scale, dec.data());
    for (float v : dec) ASSERT_TRUE(std::isfinite(v)) << "token " << n;
  }
}

INSTANTIATE_TEST_SUITE_P(
    AllFormats, CacheWriter,
    ::testing::Combine(::testing::Values(KvFormat::kBF16, KvFormat::kFP16, KvFormat::kFP8E4M3, KvFormat::kFP8DsMla,
                                         KvFormat::kNvFP4DsMla),
                       ::testing::Values(64, 0), ::testing::Values(DType::kBF16, DType::kFP16)),
    [](const auto& i) {
      return std::string(to_string(std::get<0>(i.param))) + "_rope" + std::to_string(std::get<1>(i.param)) + "_" +
             std::string(to_string(std::get<2>(i.param)));
    });

class ConvertIndices : public ::testing::TestWithParam<std::tuple<int, int, int, bool>> {};

TEST_P(ConvertIndices, EqualsReference) {
  REQUIRE_GPU();
  const auto [K, world, interleave, remap] = GetParam();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const int64_t T = 333;
  const int R = 7, max_blocks = 40, B = 64;
  std::vector<int32_t> table(size_t(R * max_blocks)), req(static_cast<size_t>(T)), pos(size_t(T * K));
  for (auto& b : table) b = (rng() % 10 == 0) ? -1 : int32_t(rng() % 5000);
  for (auto& r : req) r = (rng() % 20 == 0) ? int32_t(R + 3) : int32_t(rng() % R);
  for (auto& p : pos) {
    const int kind = int(rng() % 10);
    p = kind == 0 ? -1 : kind == 1 ? int32_t(max_blocks * B * world + int(rng() % 100)) : int32_t(rng() % uint64_t(max_blocks * B * world));
  }
  std::vector<int32_t> phys(size_t(T * K), 12345), counts(static_cast<size_t>(T), 777);
  std::vector<int32_t> ws_start(static_cast<size_t>(R)), ws_len(static_cast<size_t>(R));
  for (int r = 0, acc = 0; r < R; ++r) {
    ws_len[size_t(r)] = int32_t(rng() % uint64_t(max_blocks * B));
    ws_start[size_t(r)] = acc;
    acc += ws_len[size_t(r)];
  }
  DeviceBuffer<int32_t> d_table(table), d_req(req), d_pos(pos), d_phys(phys), d_counts(counts);
  DeviceBuffer<int32_t> d_start(ws_start), d_len(ws_len);
  for (int rank = 0; rank < world; ++rank) {
    IndexConvertParams p;
    p.pos_stride_t = K, p.num_tokens = T, p.topk = K, p.bt_stride = max_blocks, p.num_reqs = R;
    p.max_blocks = max_blocks, p.block_size = B, p.block_stride_rows = 80, p.phys_stride_t = K;
    p.dcp_world = world, p.dcp_rank = rank, p.dcp_interleave = interleave;
    IndexConvertParams dp = p;
    dp.positions = d_pos.ptr, dp.req_of_token = d_req.ptr, dp.block_table = d_table.ptr;
    dp.phys = d_phys.ptr, dp.counts = d_counts.ptr;
    if (remap) dp.prefill_row_start = d_start.ptr, dp.prefill_req_len = d_len.ptr;
    cuda::convert_indices(dp, nullptr);
    CUDA_OK(cudaDeviceSynchronize());
    p.positions = pos.data(), p.req_of_token = req.data(), p.block_table = table.data();
    p.phys = phys.data(), p.counts = counts.data();
    if (remap) p.prefill_row_start = ws_start.data(), p.prefill_req_len = ws_len.data();
    convert_indices_reference(p);
    EXPECT_EQ(d_phys.to_host(), phys) << "rank " << rank;
    EXPECT_EQ(d_counts.to_host(), counts) << "rank " << rank;
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, ConvertIndices,
                         ::testing::Values(std::make_tuple(1, 1, 1, false), std::make_tuple(77, 1, 1, false),
                                           std::make_tuple(300, 2, 64, false), std::make_tuple(2048, 1, 1, false),
                                           std::make_tuple(2048, 4, 1, false), std::make_tuple(513, 8, 64, false),
                                           std::make_tuple(300, 1, 1, true), std::make_tuple(2048, 2, 64, true)),
                         [](const auto& i) {
                           return "K" + std::to_string(std::get<0>(i.param)) + "_W" + std::to_string(std::get<1>(i.param)) +
                                  "_I" + std::to_string(std::get<2>(i.param)) + (std::get<3>(i.param) ? "_remap" : "");
                         });

TEST(FinishEmptyRows, OnlyEmptyRowsTouched) {
  REQUIRE_GPU();
  const int64_t T = 70;
  const int H = 3;
  const int64_t sh = 520, st = H * sh + 8;
  std::vector<int32_t> counts(static_cast<size_t>(T));
  std::mt19937_64 rng(fresh_seed());
  for (auto& c : counts) c = (rng() % 3 == 0) ? 0 : int32_t(1 + rng() % 50);
  counts[0] = 0, counts[1] = -4;
  std::vector<uint16_t> out(size_t(T * st));
  for (auto& v : out) v = uint16_t(rng());
  std::vector<float> lse(size_t(T * H));
  for (auto& v : lse) v = float(rng() % 1000);
  DeviceBuffer<int32_t> d_counts(counts);
  DeviceBuffer<uint16_t> d_out(out);
  DeviceBuffer<float> d_lse(lse);
  cuda::FinishEmptyParams p;
  p.num_tokens = T, p.num_heads = H, p.counts = d_counts.ptr, p.out = d_out.ptr, p.out_stride_t = st;
  p.out_stride_h = sh, p.out_dtype = DType::kBF16, p.lse = d_lse.ptr, p.lse_stride_t = H;
  cuda::finish_empty_rows(p, nullptr);
  CUDA_OK(cudaDeviceSynchronize());
  const auto got = d_out.to_host();
  const auto got_lse = d_lse.to_host();
  for (int64_t t = 0; t < T; ++t) {
    const bool empty = counts[size_t(t)] <= 0;
    for (int64_t i = t * st; i < (t + 1) * st; ++i) {
      const int64_t in_row = i - t * st, h = in_row / sh, d = in_row % sh;
      const bool payload = h < H && d < 512;
      ASSERT_EQ(got[size_t(i)], (empty && payload) ? uint16_t(0) : out[size_t(i)]) << "t " << t << " elem " << in_row;
    }
    for (int h = 0; h < H; ++h) {
      if (empty) EXPECT_EQ(got_lse[size_t(t * H + h)], -INFINITY);
      else EXPECT_EQ(got_lse[size_t(t * H + h)], lse[size_t(t * H + h)]);
    }
  }
}

}  // namespace
