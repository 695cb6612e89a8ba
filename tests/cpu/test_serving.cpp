#include <gtest/gtest.h>

#include <vector>

#include "smla/serving.h"
#include "smla/types.h"

TEST(Serving, ReorderThresholdTable) {
  EXPECT_EQ(smla::reorder_batch_threshold(8), 128);
  EXPECT_EQ(smla::reorder_batch_threshold(16), 128);
  EXPECT_EQ(smla::reorder_batch_threshold(32), 128);
  EXPECT_EQ(smla::reorder_batch_threshold(64), 256);
  EXPECT_EQ(smla::reorder_batch_threshold(128), 1024);
  EXPECT_EQ(smla::reorder_batch_threshold(48), 1024);
}

TEST(Serving, TokenToRequest) {
  const std::vector<int32_t> qsl = {0, 2, 2, 5};
  std::vector<int32_t> out(6, 99);
  smla::token_to_request(qsl.data(), 3, out.data(), 6);
  EXPECT_EQ(out, (std::vector<int32_t>{0, 0, 2, 2, 2, -1}));
  const std::vector<int32_t> bad = {0, 3, 1};
  EXPECT_THROW(smla::token_to_request(bad.data(), 2, out.data(), 3), smla::Error);
}
