// Index conversion (smla/index.h, DESIGN.md §2 and §5): worked examples of the per-entry rule
// and the CPU conversion (compaction, -1 padding, counts, request mapping, DCP filtering).
#include <gtest/gtest.h>

#include <climits>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "smla/index.h"
#include "smla/types.h"

using smla::logical_to_physical;

namespace {

// DESIGN.md §5, written out here: owner rank and local position of global token i.
int owner_rank(int64_t i, int W, int I) { return int((i / I) % W); }
int64_t local_pos(int64_t i, int W, int I) { return (i / (int64_t(W) * I)) * I + i % I; }

}  // namespace

TEST(Index, WorkedExamples) {
  const int32_t table[] = {7, 3};
  // B = 64, block stride 128 (larger than the block): pos 70 -> block 3, offset 6 -> 3*128+6
  EXPECT_EQ(logical_to_physical(70, table, 2, 64, 128, 1, 0, 1), 390);
  EXPECT_EQ(logical_to_physical(0, table, 2, 64, 128, 1, 0, 1), 896);
  EXPECT_EQ(logical_to_physical(63, table, 2, 64, 128, 1, 0, 1), 959);
  EXPECT_EQ(logical_to_physical(64, table, 2, 64, 128, 1, 0, 1), 384);
  EXPECT_EQ(logical_to_physical(127, table, 2, 64, 128, 1, 0, 1), 447);
  // stride = block size: a plain paged layout
  EXPECT_EQ(logical_to_physical(70, table, 2, 64, 64, 1, 0, 1), 198);
  // negative positions
  EXPECT_EQ(logical_to_physical(-1, table, 2, 64, 128, 1, 0, 1), -1);
  EXPECT_EQ(logical_to_physical(-100, table, 2, 64, 128, 1, 0, 1), -1);
  EXPECT_EQ(logical_to_physical(INT32_MIN, table, 2, 64, 128, 1, 0, 1), -1);
  // past the table
  EXPECT_EQ(logical_to_physical(128, table, 2, 64, 128, 1, 0, 1), -1);
  EXPECT_EQ(logical_to_physical(INT32_MAX, table, 2, 64, 128, 1, 0, 1), -1);
  EXPECT_EQ(logical_to_physical(0, table, 0, 64, 128, 1, 0, 1), -1);
  // negative block id
  const int32_t holes[] = {5, -1, 2};
  EXPECT_EQ(logical_to_physical(64, holes, 3, 64, 64, 1, 0, 1), -1);
  EXPECT_EQ(logical_to_physical(100, holes, 3, 64, 64, 1, 0, 1), -1);
  EXPECT_EQ(logical_to_physical(130, holes, 3, 64, 64, 1, 0, 1), 2 * 64 + 2);
  // a physical row that does not fit int32 is refused, not wrapped
  const int32_t far[] = {1 << 30};
  EXPECT_EQ(logical_to_physical(0, far, 1, 1, 4, 1, 0, 1), -1);
  EXPECT_EQ(logical_to_physical(0, far, 1, 1, 1, 1, 0, 1), 1 << 30);
}

TEST(Index, DcpWorkedExamples) {
  const int32_t table[] = {10, 11, 12, 13};
  // W = 2, I = 1: pos 5 lives on rank 1 at local position 2 (block 10, offset 2 with B = 16)
  EXPECT_EQ(logical_to_physical(5, table, 4, 16, 16, 2, 1, 1), 162);
  EXPECT_EQ(logical_to_physical(5, table, 4, 16, 16, 2, 0, 1), -1);
  EXPECT_EQ(logical_to_physical(4, table, 4, 16, 16, 2, 0, 1), 162);
  EXPECT_EQ(logical_to_physical(4, table, 4, 16, 16, 2, 1, 1), -1);
  // W = 4, I = 64: tokens 0..63 rank 0, 64..127 rank 1, ..., 256..319 rank 0 again (local 64..127)
  EXPECT_EQ(logical_to_physical(63, table, 4, 16, 16, 4, 0, 64), 13 * 16 + 15);  // local 63
  EXPECT_EQ(logical_to_physical(64, table, 4, 16, 16, 4, 1, 64), 160);          // local 0
  EXPECT_EQ(logical_to_physical(64, table, 4, 16, 16, 4, 0, 64), -1);
  EXPECT_EQ(logical_to_physical(300, table, 4, 16, 16, 4, 0, 64), -1);  // local 108: past 4 blocks of 16
  EXPECT_EQ(logical_to_physical(-1, table, 4, 16, 16, 4, 3, 64), -1);
}

TEST(Index, DcpAgainstFormula) {
  const int B = 16;
  const int64_t stride = 40;
  std::vector<int32_t> table(200);
  for (size_t i = 0; i < table.size(); ++i) table[i] = int32_t(3 * i + 1);
  for (auto [W, I] : {std::pair{2, 1}, std::pair{4, 64}, std::pair{3, 5}, std::pair{8, 1}}) {
    std::vector<std::map<int64_t, int>> locals(static_cast<size_t>(W));  // local position -> times seen
    for (int32_t pos = 0; pos < 3000; ++pos) {
      int owners = 0;
      for (int r = 0; r < W; ++r) {
        const int32_t got = logical_to_physical(pos, table.data(), int(table.size()), B, stride, W, r, I);
        if (owner_rank(pos, W, I) != r) {
          ASSERT_EQ(got, -1) << "W=" << W << " I=" << I << " pos=" << pos << " rank=" << r;
          continue;
        }
        ++owners;
        const int64_t l = local_pos(pos, W, I);
        ++locals[size_t(r)][l];
        const int64_t want = l / B < int64_t(table.size()) ? table[size_t(l / B)] * stride + l % B : -1;
        ASSERT_EQ(got, want) << "W=" << W << " I=" << I << " pos=" << pos << " rank=" << r;
      }
      ASSERT_EQ(owners, 1);
    }
    // Each rank's local positions are exactly 0..n-1, each once (a dense shard).
    for (int r = 0; r < W; ++r) {
      int64_t expect = 0;
      for (auto [l, n] : locals[size_t(r)]) {
        ASSERT_EQ(l, expect++) << "W=" << W << " I=" << I << " rank=" << r;
        ASSERT_EQ(n, 1);
      }
    }
  }
}

namespace {

struct Conv {
  int T, K;
  std::vector<int32_t> pos, phys, counts, req, table;
  smla::IndexConvertParams p;
  Conv(int t, int k, int pos_pad = 0, int phys_pad = 0) : T(t), K(k) {
    pos.assign(size_t(T * (K + pos_pad)), -1);
    phys.assign(size_t(T * (K + phys_pad)), 77777);
    counts.assign(size_t(T), 55555);
    p.positions = pos.data();
    p.pos_stride_t = K + pos_pad;
    p.num_tokens = T;
    p.topk = K;
    p.phys = phys.data();
    p.phys_stride_t = K + phys_pad;
    p.counts = counts.data();
  }
  void set_table(int R, int max_blocks, std::vector<int32_t> t, int B, int64_t stride) {
    table = std::move(t);
    p.block_table = table.data();
    p.bt_stride = max_blocks;
    p.num_reqs = R;
    p.max_blocks = max_blocks;
    p.block_size = B;
    p.block_stride_rows = stride;
  }
  int32_t& at(int t, int j) { return pos[size_t(t * p.pos_stride_t + j)]; }
  int32_t out(int t, int j) const { return phys[size_t(t * p.phys_stride_t + j)]; }
};

}  // namespace

TEST(Index, ConvertCompactsPadsAndCounts) {
  Conv c(3, 6, /*pos_pad=*/2, /*phys_pad=*/3);
  // two requests of 2 blocks each, B = 4, block stride 8
  c.set_table(2, 2, {5, 9, 1, -1}, 4, 8);
  c.req = {1, 0, 1};
  c.p.req_of_token = c.req.data();
  // row 0 (request 1: blocks {1, -1}): pos 2 -> 1*8+2 = 10; pos 5 -> block -1; pos 9 -> past
  int32_t r0[] = {-1, 2, 5, 9, 0, -3};
  // row 1 (request 0: blocks {5, 9}): all valid, with a duplicate
  int32_t r1[] = {7, 0, 7, 3, 4, 6};
  // row 2: nothing valid
  int32_t r2[] = {-1, -1, 4, 100, -2, 8};
  for (int j = 0; j < 6; ++j) c.at(0, j) = r0[j], c.at(1, j) = r1[j], c.at(2, j) = r2[j];
  c.at(0, 6) = c.at(0, 7) = 1;  // in the stride gap: must not be read
  smla::convert_indices_reference(c.p);
  const int32_t want0[] = {10, 8, -1, -1, -1, -1};          // pos 2 -> 10, pos 0 -> 8
  const int32_t want1[] = {9 * 8 + 3, 5 * 8 + 0, 9 * 8 + 3, 5 * 8 + 3, 9 * 8 + 0, 9 * 8 + 2};
  const int32_t want2[] = {-1, -1, -1, -1, -1, -1};
  for (int j = 0; j < 6; ++j) {
    EXPECT_EQ(c.out(0, j), want0[j]) << j;
    EXPECT_EQ(c.out(1, j), want1[j]) << j;
    EXPECT_EQ(c.out(2, j), want2[j]) << j;
  }
  EXPECT_EQ(c.counts[0], 2);
  EXPECT_EQ(c.counts[1], 6);
  EXPECT_EQ(c.counts[2], 0);
  for (int t = 0; t < 3; ++t)
    for (int j = 6; j < 9; ++j) EXPECT_EQ(c.out(t, j), 77777) << "stride gap written";
}

TEST(Index, ConvertDefaultRequestMappingAndInvalidRequests) {
  Conv c(4, 3);
  c.set_table(2, 1, {4, 6}, 8, 8);
  for (int t = 0; t < 4; ++t)
    for (int j = 0; j < 3; ++j) c.at(t, j) = j;
  // no req_of_token: row t -> request t; rows 2 and 3 have no request
  smla::convert_indices_reference(c.p);
  for (int j = 0; j < 3; ++j) {
    EXPECT_EQ(c.out(0, j), 32 + j);
    EXPECT_EQ(c.out(1, j), 48 + j);
    EXPECT_EQ(c.out(2, j), -1);
    EXPECT_EQ(c.out(3, j), -1);
  }
  EXPECT_EQ(c.counts[0], 3);
  EXPECT_EQ(c.counts[2], 0);
  EXPECT_EQ(c.counts[3], 0);

  c.req = {-1, 2, 1, INT32_MIN};
  c.p.req_of_token = c.req.data();
  smla::convert_indices_reference(c.p);
  for (int j = 0; j < 3; ++j) {
    EXPECT_EQ(c.out(0, j), -1);
    EXPECT_EQ(c.out(1, j), -1);
    EXPECT_EQ(c.out(2, j), 48 + j);
    EXPECT_EQ(c.out(3, j), -1);
  }
  EXPECT_EQ(c.counts[0], 0);
  EXPECT_EQ(c.counts[1], 0);
  EXPECT_EQ(c.counts[2], 3);
  EXPECT_EQ(c.counts[3], 0);

  // counts may be null
  c.p.counts = nullptr;
  EXPECT_NO_THROW(smla::convert_indices_reference(c.p));
}

TEST(Index, ConvertDcpFiltersAndCompacts) {
  // W = 2, I = 1, one request, B = 4, 2 blocks: rank 1 owns odd positions at local pos / 2.
  Conv c(1, 8);
  c.set_table(1, 2, {3, 5}, 4, 4);
  const int32_t pos[] = {0, 1, 2, 3, 9, 15, -1, 7};
  for (int j = 0; j < 8; ++j) c.at(0, j) = pos[j];
  c.p.dcp_world = 2;
  c.p.dcp_rank = 1;
  smla::convert_indices_reference(c.p);
  // 1 -> local 0 -> 12; 3 -> local 1 -> 13; 9 -> local 4 -> block 5 -> 20; 15 -> local 7 -> 23;
  // 7 -> local 3 -> 15
  const int32_t want[] = {12, 13, 20, 23, 15, -1, -1, -1};
  for (int j = 0; j < 8; ++j) EXPECT_EQ(c.out(0, j), want[j]) << j;
  EXPECT_EQ(c.counts[0], 5);
  c.p.dcp_rank = 0;  // 0 -> 12, 2 -> 13
  smla::convert_indices_reference(c.p);
  const int32_t want0[] = {12, 13, -1, -1, -1, -1, -1, -1};
  for (int j = 0; j < 8; ++j) EXPECT_EQ(c.out(0, j), want0[j]) << j;
  EXPECT_EQ(c.counts[0], 2);
}

TEST(Index, ConvertValidates) {
  auto expect_error = [](smla::IndexConvertParams p, const std::string& needle) {
    try {
      smla::convert_indices_reference(p);
      ADD_FAILURE() << "no error, expected '" << needle << "'";
    } catch (const smla::Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  Conv c(2, 4);
  c.set_table(2, 1, {0, 1}, 4, 4);
  ASSERT_NO_THROW(smla::convert_indices_reference(c.p));
  auto p = c.p;
  p.topk = 0;
  expect_error(p, "K");
  p = c.p;
  p.block_size = 0;
  expect_error(p, "block_size");
  p = c.p;
  p.block_stride_rows = 3;
  expect_error(p, "block_stride_rows");
  p = c.p;
  p.dcp_rank = 2;
  p.dcp_world = 2;
  expect_error(p, "dcp_rank");
  p = c.p;
  p.dcp_interleave = 0;
  expect_error(p, "dcp_interleave");
  p = c.p;
  p.positions = nullptr;
  expect_error(p, "positions");
  p = c.p;
  p.phys_stride_t = 3;
  expect_error(p, "stride");
  p = c.p;
  p.block_table = nullptr;
  expect_error(p, "block_table");
  p = c.p;
  p.num_tokens = -1;
  expect_error(p, "num_tokens");
  // an empty call with null pointers is fine
  smla::IndexConvertParams empty;
  empty.topk = 4;
  empty.block_size = 4;
  empty.block_stride_rows = 4;
  EXPECT_NO_THROW(smla::convert_indices_reference(empty));
}
