// The CPU simulation of decode context parallelism (DESIGN.md §5) against the reference on an
// unsharded, logically ordered cache: W = 1..8, interleave 1 and 64.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "../common/dcp_case.h"
#include "reference/sparse_mla.h"
#include "smla/dcp.h"
#include "smla/dist.h"
#include "smla/formats.h"
#include "smla/numeric.h"

namespace {

using namespace smla;

class DcpSim : public ::testing::TestWithParam<std::tuple<int, int>> {};

TEST_P(DcpSim, EqualsUnshardedReference) {
  const auto [world, interleave] = GetParam();
  const auto c = smla::test::make_dcp_case(1000 + world * 7 + interleave, interleave, KvFormat::kBF16, 4);
  const int rb = c.row_bytes;
  std::vector<float> ref_out, ref_lse;
  smla::test::dcp_case_reference(c, ref_out, ref_lse);

  const auto caches = dcp::shard_cache(c.req_rows, rb, world, interleave, 64, 96);
  std::vector<float> out(ref_out.size(), NAN), lse(ref_lse.size(), NAN);
  dcp::simulate_decode(smla::test::dcp_case_params(c), caches, c.positions.data(), c.req_of_token.data(), world, interleave,
                       out.data(), lse.data());

  double num = 0, den = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    ASSERT_TRUE(std::isfinite(out[i])) << "element " << i;
    num += (out[i] - ref_out[i]) * (out[i] - ref_out[i]);
    den += ref_out[i] * ref_out[i];
  }
  EXPECT_LE(std::sqrt(num / den), 1e-5);
  for (size_t i = 0; i < lse.size(); ++i) {
    if (std::isinf(ref_lse[i])) {
      EXPECT_TRUE(std::isinf(lse[i]) && lse[i] < 0) << "row/head " << i;
    } else {
      EXPECT_NEAR(lse[i], ref_lse[i], 1e-5) << "row/head " << i;
    }
  }
  // Row 5 selects nothing: out exactly 0, LSE -inf.
  for (int h = 0; h < c.H; ++h) {
    EXPECT_EQ(lse[size_t(5 * c.H + h)], -INFINITY);
    for (int d = 0; d < 512; ++d) ASSERT_EQ(out[size_t((5 * c.H + h) * 512 + d)], 0.0f);
  }
}

INSTANTIATE_TEST_SUITE_P(WorldsAndInterleaves, DcpSim,
                         ::testing::Combine(::testing::Range(1, 9), ::testing::Values(1, 64)),
                         [](const auto& i) {
                           return "W" + std::to_string(std::get<0>(i.param)) + "_I" + std::to_string(std::get<1>(i.param));
                         });

TEST(DcpMerge, EdgeRules) {
  // Two ranks, one (t, h): rank 0 empty (-inf), rank 1 NaN LSE -> both ignored: out 0, LSE -inf.
  std::vector<float> o0(512, 5.0f), o1(512, 7.0f), out(512, NAN);
  float l0 = -INFINITY, l1 = NAN, lse = 0;
  dcp::merge_partials({o0.data(), o1.data()}, {&l0, &l1}, 1, 1, out.data(), &lse);
  EXPECT_EQ(lse, -INFINITY);
  for (float v : out) EXPECT_EQ(v, 0.0f);
  // Equal LSEs: the mean of the two outputs, LSE + log 2.
  l0 = 1.0f, l1 = 1.0f;
  dcp::merge_partials({o0.data(), o1.data()}, {&l0, &l1}, 1, 1, out.data(), &lse);
  EXPECT_NEAR(lse, 1.0 + std::log(2.0), 1e-6);
  for (float v : out) EXPECT_NEAR(v, 6.0f, 1e-5);
}

TEST(DcpSharding, OwnerAndLocalPosition) {
  // W = 2, I = 64 (the worked example in smla/dcp.h), checked by direct enumeration.
  EXPECT_EQ(dcp::owner_rank(63, 2, 64), 0);
  EXPECT_EQ(dcp::owner_rank(64, 2, 64), 1);
  EXPECT_EQ(dcp::local_position(64, 2, 64), 0);
  EXPECT_EQ(dcp::owner_rank(128, 2, 64), 0);
  EXPECT_EQ(dcp::local_position(128, 2, 64), 64);
  // Every rank's local positions are 0, 1, 2, ... in order of the global positions it owns.
  for (int W : {1, 3, 8})
    for (int I : {1, 5, 64}) {
      std::vector<int64_t> next(size_t(W), 0);
      for (int64_t i = 0; i < 2000; ++i) {
        const int r = dcp::owner_rank(i, W, I);
        ASSERT_EQ(dcp::local_position(i, W, I), next[size_t(r)]++) << "W=" << W << " I=" << I << " i=" << i;
      }
    }
}

// DcpConfig is checked on the host before anything touches a device or NCCL; each bad field gets
// an error that names it (and the value that was given).
TEST(DcpConfigCheck, NamesTheBadField) {
  dist::DcpConfig ok;
  ok.world = 2, ok.rank = 1, ok.local_heads = 64;
  EXPECT_NO_THROW(dist::check_config(ok));
  auto expect_error = [&](auto mutate, const std::string& needle) {
    dist::DcpConfig c = ok;
    mutate(c);
    try {
      dist::check_config(c);
      ADD_FAILURE() << "no error; expected one containing '" << needle << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_error([](dist::DcpConfig& c) { c.timeout_ms = 0; }, "timeout_ms must be >= 1");
  expect_error([](dist::DcpConfig& c) { c.timeout_ms = -5; }, "got -5");
  expect_error([](dist::DcpConfig& c) { c.world = 17, c.local_heads = 1; }, "world must be in [1, 16]");
  expect_error([](dist::DcpConfig& c) { c.rank = 2; }, "rank must be in [0, world = 2)");
  expect_error([](dist::DcpConfig& c) { c.local_heads = 65; }, "local_heads * world must be in [1, 128]");
  expect_error([](dist::DcpConfig& c) { c.interleave = 0; }, "interleave must be >= 1");
  expect_error([](dist::DcpConfig& c) { c.q_dtype = DType::kFP32; }, "q must be bf16 or fp16");
  expect_error([](dist::DcpConfig& c) { c.max_rows = 0; }, "max_rows and topk must be >= 1");
  // The defaults: the watchdog on, 10 s, a stuck blocking call ends the process.
  const dist::DcpConfig d;
  EXPECT_TRUE(d.watchdog);
  EXPECT_TRUE(d.terminate_on_stuck_call);
  EXPECT_EQ(d.timeout_ms, 10000);
  EXPECT_NO_THROW(dist::check_config(d));
}

}  // namespace
