// The CPU cache writer: slot -> physical row, skipped slots, and rows equal to encode_row().
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "smla/cache.h"
#include "smla/formats.h"
#include "smla/numeric.h"

namespace {

using namespace smla;

TEST(CacheWriter, SlotToPhysicalRow) {
  CacheWriteParams p;
  p.block_size = 64, p.block_stride_rows = 96, p.num_rows = 96 * 3;
  EXPECT_EQ(p.physical_row(0), 0);
  EXPECT_EQ(p.physical_row(70), 96 + 6);       // block 1, offset 6
  EXPECT_EQ(p.physical_row(130), 2 * 96 + 2);  // block 2, offset 2
  EXPECT_EQ(p.physical_row(-1), -1);
  EXPECT_EQ(p.physical_row(3 * 64), -1);       // block 3 is past the cache
}

TEST(CacheWriter, WritesEncodedRowsAndSkips) {
  const int rb = row_bytes(KvFormat::kFP8DsMla, 64);
  std::vector<uint16_t> latent(2 * 512), rope(2 * 64);
  for (int i = 0; i < 2 * 512; ++i) latent[size_t(i)] = num::f32_to_bf16(float(i % 97) - 40.0f);
  for (int i = 0; i < 2 * 64; ++i) rope[size_t(i)] = num::f32_to_bf16(float(i) * 0.25f);
  const std::vector<int32_t> slots = {5, -3};
  std::vector<uint8_t> cache(size_t(8 * rb), 0xab);
  CacheWriteParams p;
  p.num_tokens = 2, p.latent = latent.data(), p.latent_stride = 512, p.rope = rope.data(), p.rope_stride = 64;
  p.slot_mapping = slots.data(), p.cache = cache.data(), p.num_rows = 8, p.row_stride_bytes = rb;
  p.block_size = 4, p.block_stride_rows = 4, p.format = KvFormat::kFP8DsMla;
  write_cache_reference(p);
  std::vector<float> lat(512), rp(64);
  for (int i = 0; i < 512; ++i) lat[size_t(i)] = num::bf16_to_f32(latent[size_t(i)]);
  for (int i = 0; i < 64; ++i) rp[size_t(i)] = num::bf16_to_f32(rope[size_t(i)]);
  std::vector<uint8_t> expect(static_cast<size_t>(rb));
  encode_row(KvFormat::kFP8DsMla, 64, lat.data(), rp.data(), 1.0f, expect.data());
  EXPECT_EQ(0, std::memcmp(cache.data() + 5 * rb, expect.data(), size_t(rb)));
  for (int r = 0; r < 8; ++r) {
    if (r == 5) continue;
    for (int b = 0; b < rb; ++b) ASSERT_EQ(cache[size_t(r * rb + b)], 0xab) << "row " << r << " was touched";
  }
}

TEST(CacheWriter, RefusesBadArguments) {
  CacheWriteParams p;
  p.num_tokens = 1, p.num_rows = 4, p.row_stride_bytes = 100, p.format = KvFormat::kBF16;
  EXPECT_THROW(validate(p), Error);  // stride below a bf16 row
  p.row_stride_bytes = row_bytes(KvFormat::kBF16, 64), p.src_dtype = DType::kFP32;
  EXPECT_THROW(validate(p), Error);
}

}  // namespace
