// The prefill-workspace remap of index conversion: row = start[req] + position, valid below the
// request's length; the block table is not read.
#include <gtest/gtest.h>

#include <vector>

#include "smla/index.h"
#include "smla/types.h"

namespace {

using namespace smla;

TEST(IndexRemap, WorkedExamples) {
  EXPECT_EQ(logical_to_workspace_row(7, 1000, 50, 1, 0, 1), 1007);
  EXPECT_EQ(logical_to_workspace_row(49, 1000, 50, 1, 0, 1), 1049);
  EXPECT_EQ(logical_to_workspace_row(50, 1000, 50, 1, 0, 1), -1);
  EXPECT_EQ(logical_to_workspace_row(-1, 1000, 50, 1, 0, 1), -1);
  // W = 2, I = 1: position 5 lives on rank 1 at local position 2.
  EXPECT_EQ(logical_to_workspace_row(5, 100, 50, 2, 1, 1), 102);
  EXPECT_EQ(logical_to_workspace_row(5, 100, 50, 2, 0, 1), -1);
}

TEST(IndexRemap, ConvertCompactsAndCounts) {
  // Two requests gathered back to back: request 0 rows [0, 3), request 1 rows [3, 8).
  const std::vector<int32_t> start = {0, 3}, len = {3, 5};
  const std::vector<int32_t> pos = {2, -1, 0, 3,   // row 0 (request 0): 3 is past its length
                                    4, 4, 1, 9};   // row 1 (request 1): duplicates kept, 9 past length
  const std::vector<int32_t> req = {0, 1};
  std::vector<int32_t> phys(8, 99), counts(2, 99);
  IndexConvertParams p;
  p.positions = pos.data(), p.pos_stride_t = 4, p.num_tokens = 2, p.topk = 4, p.req_of_token = req.data();
  p.num_reqs = 2, p.block_size = 64, p.block_stride_rows = 64, p.phys = phys.data(), p.phys_stride_t = 4;
  p.counts = counts.data(), p.prefill_row_start = start.data(), p.prefill_req_len = len.data();
  convert_indices_reference(p);
  EXPECT_EQ(phys, (std::vector<int32_t>{2, 0, -1, -1, 7, 7, 4, -1}));
  EXPECT_EQ(counts, (std::vector<int32_t>{2, 3}));
  p.prefill_req_len = nullptr;
  EXPECT_THROW(convert_indices_reference(p), Error);
}

}  // namespace
