// The SM90 kernels' shared-memory plans, checked by the host compiler: config.h static_asserts
// every plan against the 227 KiB opt-in limit, so including it here makes the CPU build (CI) fail
// on an over-budget change before any GPU sees it. The runtime checks pin the head-tile heuristics.
#include <gtest/gtest.h>

#include "cuda/sm90/sparse_mla/config.h"

namespace k = smla::cuda::sm90::sparse_mla;

TEST(KernelConfig, SharedMemoryPlansFitSm90) {
  EXPECT_LE(k::Config<1>::kSmemBytes, k::kSmemLimit);
  EXPECT_LE(k::Config<2>::kSmemBytes, k::kSmemLimit);
  EXPECT_LE(k::Config<4>::kSmemBytes, k::kSmemLimit);
  EXPECT_LE(k::WsConfig::kSmemBytes, k::kSmemLimit);
  EXPECT_EQ(k::kSmemLimit, 227u * 1024u);
}

TEST(KernelConfig, HeadTilesAndGroups) {
  // H <= 16 -> one 16-head tile (every row gathered once per token); <= 32 -> 32; else 64-head groups.
  EXPECT_EQ(k::head_tile_for(1), 16);
  EXPECT_EQ(k::head_tile_for(16), 16);
  EXPECT_EQ(k::head_tile_for(17), 32);
  EXPECT_EQ(k::head_tile_for(33), 64);
  EXPECT_EQ(k::head_groups_for(64), 1);
  EXPECT_EQ(k::head_groups_for(65), 2);
  EXPECT_EQ(k::head_groups_for(128), 2);
}
