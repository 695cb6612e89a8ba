// The CPU simulation of decode context parallelism (DESIGN.md §5) against the reference on an
// unsharded, logically ordered cache: W = 1..8, interleave 1 and 64.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "smla/dcp.h"
#include "smla/formats.h"
#include "smla/numeric.h"
#include "smla/reference.h"

namespace {

using namespace smla;

struct Case {
  std::vector<std::vector<uint8_t>> req_rows;  // per request, [len][row_bytes]
  std::vector<int64_t> req_offset;             // first flat row of each request
  std::vector<uint8_t> flat;                   // all requests' rows back to back
  std::vector<uint16_t> q;                     // [T,H,576] bf16
  std::vector<int32_t> positions, req_of_token;
  int64_t T = 6;
  int H = 4, K = 200;
};

Case make_case(uint64_t seed, int interleave) {
  Case c;
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal;
  const int rb = row_bytes(KvFormat::kBF16, 64);
  const std::vector<int64_t> lens = {1300, 700, 90};
  std::vector<float> latent(512), rope(64);
  for (int64_t len : lens) {
    c.req_offset.push_back(int64_t(c.flat.size()) / rb);
    std::vector<uint8_t> rows(size_t(len * rb));
    for (int64_t i = 0; i < len; ++i) {
      for (auto& v : latent) v = normal(rng);
      for (auto& v : rope) v = normal(rng);
      encode_row(KvFormat::kBF16, 64, latent.data(), rope.data(), 1.0f, rows.data() + i * rb);
    }
    c.flat.insert(c.flat.end(), rows.begin(), rows.end());
    c.req_rows.push_back(std::move(rows));
  }
  c.q.resize(size_t(c.T * c.H * 576));
  for (auto& v : c.q) v = num::f32_to_bf16(normal(rng));
  c.positions.assign(size_t(c.T * c.K), -1);
  c.req_of_token.resize(size_t(c.T));
  for (int64_t t = 0; t < c.T; ++t) {
    const int req = int(t % 3);
    c.req_of_token[size_t(t)] = req;
    for (int j = 0; j < c.K; ++j) {
      int32_t pos = int32_t(rng() % uint64_t(lens[size_t(req)]));
      if (t == 1) pos = int32_t(rng() % uint64_t(interleave));  // every entry on rank 0
      if (j % 17 == 5) pos = -1;                                  // padding
      if (j % 29 == 7) pos = 1 << 24;                             // past every block table
      c.positions[size_t(t * c.K + j)] = pos;
    }
  }
  for (int j = 0; j < c.K; ++j) c.positions[size_t(5 * c.K + j)] = -1;  // an all-empty row
  return c;
}

SparseMlaParams base_params(const Case& c) {
  SparseMlaParams p;
  p.num_tokens = c.T, p.num_heads = c.H, p.topk = c.K, p.rope_dim = 64;
  p.q = c.q.data(), p.q_dtype = DType::kBF16, p.format = KvFormat::kBF16;
  p.softmax_scale = 0.1352338f;
  set_dense_strides(p);
  return p;
}

class DcpSim : public ::testing::TestWithParam<std::tuple<int, int>> {};

TEST_P(DcpSim, EqualsUnshardedReference) {
  const auto [world, interleave] = GetParam();
  const Case c = make_case(1000 + world * 7 + interleave, interleave);
  const int rb = row_bytes(KvFormat::kBF16, 64);

  // Reference: flat logical cache, idx = request offset + position (invalid stays invalid).
  std::vector<int32_t> idx(c.positions.size());
  for (int64_t t = 0; t < c.T; ++t)
    for (int j = 0; j < c.K; ++j) {
      const int32_t pos = c.positions[size_t(t * c.K + j)];
      const int req = c.req_of_token[size_t(t)];
      const int64_t len = int64_t(c.req_rows[size_t(req)].size()) / rb;
      idx[size_t(t * c.K + j)] = (pos >= 0 && pos < len) ? int32_t(c.req_offset[size_t(req)] + pos) : -1;
    }
  SparseMlaParams p = base_params(c);
  p.kv = c.flat.data(), p.num_rows = int64_t(c.flat.size()) / rb, p.kv_row_stride_bytes = rb;
  p.idx = idx.data();
  std::vector<float> ref_out(size_t(c.T * c.H * 512)), ref_lse(size_t(c.T * c.H));
  p.out = ref_out.data(), p.out_dtype = DType::kFP32, p.lse = ref_lse.data();
  reference::sparse_mla(p);

  const auto caches = dcp::shard_cache(c.req_rows, rb, world, interleave, 64, 96);
  std::vector<float> out(ref_out.size(), NAN), lse(ref_lse.size(), NAN);
  dcp::simulate_decode(base_params(c), caches, c.positions.data(), c.req_of_token.data(), world, interleave,
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
                         ::testing::Combine(::testing::Range(1, 9), ::testing::Values(1, 64)));

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

}  // namespace
