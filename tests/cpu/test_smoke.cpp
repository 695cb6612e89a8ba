#include <gtest/gtest.h>

#include "smla/formats.h"

TEST(Smoke, RowBytes) {
  EXPECT_EQ(smla::row_bytes(smla::KvFormat::kBF16, 64), 1152);
  EXPECT_EQ(smla::row_bytes(smla::KvFormat::kFP8DsMla, 64), 656);
  EXPECT_EQ(smla::row_bytes(smla::KvFormat::kNvFP4DsMla, 64), 352);
}
