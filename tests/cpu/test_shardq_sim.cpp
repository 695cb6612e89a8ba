// ShardQ prefill (DESIGN.md §5b) on the CPU: the zigzag ownership and the per-rank bound against
// their definitions, the all-to-all packing, and the simulated step of W = 1..8 ranks against the
// unsharded reference (every (token, head) attends the same rows, so the results are equal bit for
// bit), with requests shorter than 2·W tokens, empty requests and T = 0.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "smla/formats.h"
#include "smla/numeric.h"
#include "reference/sparse_mla.h"
#include "smla/dist.h"
#include "smla/shardq.h"
#include "dist/shardq_rule.h"

namespace {

using namespace smla;

// Ownership written from DESIGN.md §5b's words: 2W chunks of c = ceil(n / 2W) tokens, chunk k is
// [k c, min((k + 1) c, n)); rank r owns chunks r and 2W - 1 - r.
std::vector<int> owners_from_chunks(int64_t n, int world) {
  std::vector<int> owner(size_t(n), -1);
  if (n == 0) return owner;
  const int64_t c = (n + 2 * world - 1) / (2 * world);
  for (int k = 0; k < 2 * world; ++k)
    for (int64_t j = k * c; j < std::min<int64_t>((k + 1) * c, n); ++j) owner[size_t(j)] = k < world ? k : 2 * world - 1 - k;
  return owner;
}

TEST(ShardqOwnership, ZigzagChunksAsDesigned) {
  for (int world = 1; world <= 8; ++world)
    for (int64_t n = 0; n <= 70; ++n) {
      const auto want = owners_from_chunks(n, world);
      for (int64_t j = 0; j < n; ++j) {
        ASSERT_NE(want[size_t(j)], -1);
        ASSERT_EQ(shardq::owner_rank(j, n, world), want[size_t(j)]) << "n " << n << " W " << world << " j " << j;
      }
    }
  // The header's example: n = 10, W = 2 -> rank 0 owns 0-2 and 9, rank 1 owns 3-8.
  const auto l = shardq::make_layout({10}, 2);
  EXPECT_EQ(l.rank_tokens[0], (std::vector<int64_t>{0, 1, 2, 9}));
  EXPECT_EQ(l.rank_tokens[1], (std::vector<int64_t>{3, 4, 5, 6, 7, 8}));
  EXPECT_THROW(shardq::owner_rank(5, 5, 2), Error);
  EXPECT_THROW(shardq::chunk_tokens(4, 0), Error);
}

TEST(ShardqOwnership, EveryTokenOnceAndWithinThePlannedBound) {
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 400; ++trial) {
    const int world = 1 + int(rng() % 8);
    const int nreq = int(rng() % 9);
    std::vector<int64_t> lens(static_cast<size_t>(nreq));
    for (auto& n : lens) n = (rng() % 4 == 0) ? int64_t(rng() % 3) : int64_t(rng() % 300);  // short and empty ones too
    const int64_t T = std::accumulate(lens.begin(), lens.end(), int64_t(0));
    const auto l = shardq::make_layout(lens, world);
    ASSERT_EQ(l.num_tokens, T);
    std::vector<int> seen(size_t(T), 0);
    for (int r = 0; r < world; ++r) {
      const auto& toks = l.rank_tokens[size_t(r)];
      ASSERT_LE(int64_t(toks.size()), shardq::max_tokens_per_rank(T, world, nreq)) << "rank " << r;
      for (size_t i = 0; i < toks.size(); ++i) {
        if (i) ASSERT_LT(toks[i - 1], toks[i]);
        ++seen[size_t(toks[i])];
      }
    }
    for (int64_t t = 0; t < T; ++t) ASSERT_EQ(seen[size_t(t)], 1) << "token " << t;
  }
  EXPECT_EQ(shardq::max_tokens_per_rank(4096, 8, 1), 514);
  EXPECT_EQ(shardq::max_tokens_per_rank(10, 8, 4), 10);  // never more than the step has
}

TEST(ShardqPacking, BothAllToAllsRoundTrip) {
  const int world = 3;
  const std::vector<int64_t> lens = {7, 0, 2, 11};
  const auto l = shardq::make_layout(lens, world);
  const int64_t T = l.num_tokens, row = 5, slots = shardq::max_tokens_per_rank(T, world, 4);
  // Rank s's local rows: byte b of token t = t * 16 + s * 4 + b % 4 (distinct per token and rank).
  std::vector<std::vector<uint8_t>> local(world, std::vector<uint8_t>(size_t(T * row)));
  std::vector<std::vector<uint8_t>> send(static_cast<size_t>(world)), recv(static_cast<size_t>(world));
  for (int s = 0; s < world; ++s)
    for (int64_t t = 0; t < T; ++t)
      for (int b = 0; b < row; ++b) local[size_t(s)][size_t(t * row + b)] = uint8_t(t * 16 + s * 4 + b % 4);
  for (int s = 0; s < world; ++s) {
    send[size_t(s)].assign(size_t(world * slots * row), 0xEE);
    shardq::pack_by_owner(l, slots, local[size_t(s)].data(), row, row, send[size_t(s)].data());
  }
  for (int r = 0; r < world; ++r) {
    recv[size_t(r)].resize(size_t(world * slots * row));
    for (int p = 0; p < world; ++p)
      std::memcpy(recv[size_t(r)].data() + p * slots * row, send[size_t(p)].data() + r * slots * row, size_t(slots * row));
    std::vector<uint8_t> full(size_t(slots * world * row), 0xEE);
    shardq::gather_heads(l, r, slots, recv[size_t(r)].data(), row, full.data());
    const auto& toks = l.rank_tokens[size_t(r)];
    for (size_t i = 0; i < toks.size(); ++i)
      for (int p = 0; p < world; ++p)
        for (int b = 0; b < row; ++b)
          ASSERT_EQ(full[i * world * row + p * row + b], uint8_t(toks[i] * 16 + p * 4 + b % 4));
    // And back: split by heads, exchange, unpack -> each rank's own rows again.
    std::vector<uint8_t> back(size_t(world * slots * row), 0);
    shardq::split_heads(l, r, slots, full.data(), row, back.data());
    for (int p = 0; p < world; ++p)
      for (size_t i = 0; i < toks.size(); ++i)
        ASSERT_EQ(0, std::memcmp(back.data() + (p * slots + int64_t(i)) * row, local[size_t(p)].data() + toks[i] * row,
                                 size_t(row)));
  }
  EXPECT_THROW(shardq::pack_by_owner(l, 1, local[0].data(), row, row, send[0].data()), Error);  // too few slots
}

struct Problem {
  int64_t T = 0;
  int H = 0, K = 96;
  std::vector<uint8_t> kv;
  std::vector<uint16_t> q;
  std::vector<int32_t> idx, counts;
  std::vector<float> sink;
  int64_t rows = 300;
};

Problem make_problem(uint64_t seed, int64_t T, int H) {
  Problem p;
  p.T = T, p.H = H;
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal;
  const int rb = row_bytes(KvFormat::kBF16, 64);
  p.kv.assign(size_t(p.rows * rb), 0);
  std::vector<float> latent(512), rope(64);
  for (int64_t r = 0; r < p.rows; ++r) {
    for (auto& v : latent) v = normal(rng);
    for (auto& v : rope) v = normal(rng);
    encode_row(KvFormat::kBF16, 64, latent.data(), rope.data(), 1.0f, p.kv.data() + r * rb);
  }
  p.q.resize(size_t(std::max<int64_t>(T, 1) * H * 576));
  for (auto& v : p.q) v = num::f32_to_bf16(normal(rng));
  p.idx.resize(size_t(std::max<int64_t>(T, 1) * p.K));
  for (auto& v : p.idx) v = (rng() % 11 == 0) ? -1 : int32_t(rng() % uint64_t(p.rows));
  p.counts.resize(size_t(std::max<int64_t>(T, 1)));
  for (auto& c : p.counts) c = int32_t(rng() % uint64_t(p.K + 1));
  if (T > 2) p.counts[2] = 0;  // an empty row: out 0, LSE -inf
  p.sink.resize(size_t(H));
  for (auto& s : p.sink) s = normal(rng);
  return p;
}

SparseMlaParams params_of(Problem& pr) {
  SparseMlaParams p;
  p.num_tokens = pr.T, p.num_heads = pr.H, p.topk = pr.K, p.rope_dim = 64;
  p.q = pr.q.data(), p.q_dtype = DType::kBF16, p.format = KvFormat::kBF16;
  p.kv = pr.kv.data(), p.num_rows = pr.rows, p.kv_row_stride_bytes = row_bytes(KvFormat::kBF16, 64);
  p.idx = pr.idx.data(), p.counts = pr.counts.data(), p.sink = pr.sink.data();
  p.softmax_scale = 0.0625f;
  set_dense_strides(p);
  return p;
}

class ShardqSim : public ::testing::TestWithParam<int> {};

TEST_P(ShardqSim, EqualsUnshardedReference) {
  const int world = GetParam();
  const int H = 2 * world;
  // Requests longer than, shorter than and equal to 2W tokens, and an empty one.
  const std::vector<int64_t> lens = {int64_t(5 * world + 3), 1, 0, int64_t(2 * world), int64_t(world + 1)};
  const int64_t T = std::accumulate(lens.begin(), lens.end(), int64_t(0));
  Problem pr = make_problem(100 + uint64_t(world), T, H);
  SparseMlaParams p = params_of(pr);

  std::vector<float> ref_out(size_t(T * H * 512)), ref_lse(size_t(T * H));
  SparseMlaParams r = p;
  r.out = ref_out.data(), r.out_dtype = DType::kFP32, r.lse = ref_lse.data(), r.lse_mode = LseMode::kBaseE;
  set_dense_strides(r);
  reference::sparse_mla(r);

  std::vector<float> out(ref_out.size(), NAN), lse(ref_lse.size(), NAN);
  shardq::simulate_prefill(p, lens, world, out.data(), lse.data());
  for (size_t i = 0; i < out.size(); ++i) ASSERT_EQ(out[i], ref_out[i]) << "element " << i;
  for (size_t i = 0; i < lse.size(); ++i) ASSERT_EQ(lse[i], ref_lse[i]) << "row/head " << i;
  for (int h = 0; h < H; ++h) EXPECT_EQ(lse[size_t(2 * H + h)], -INFINITY);  // the empty row
}

INSTANTIATE_TEST_SUITE_P(Worlds, ShardqSim, ::testing::Range(1, 9),
                         [](const ::testing::TestParamInfo<int>& i) { return "W" + std::to_string(i.param); });

TEST(ShardqSimEdge, EmptyStepAndBadShapes) {
  Problem pr = make_problem(5, 0, 4);
  SparseMlaParams p = params_of(pr);
  std::vector<float> out(1, 7.0f), lse(1, 7.0f);
  shardq::simulate_prefill(p, {0, 0}, 2, out.data(), lse.data());  // T = 0: nothing written
  EXPECT_EQ(out[0], 7.0f);
  Problem pr2 = make_problem(6, 4, 6);
  SparseMlaParams p2 = params_of(pr2);
  std::vector<float> out2(size_t(4 * 6 * 512)), lse2(size_t(4 * 6));
  EXPECT_THROW(shardq::simulate_prefill(p2, {4}, 4, out2.data(), lse2.data()), Error);  // H = 6, W = 4
  EXPECT_THROW(shardq::simulate_prefill(p2, {3}, 2, out2.data(), lse2.data()), Error);  // lengths != T
}

// The arithmetic the NCCL step's ownership kernels run (dist/shardq_rule.h, compiled for host and
// device) against the host spec: owner of every token, its index among the owner's tokens of the
// request, and each rank's count; then the slots it gives (earlier requests' counts + index) equal
// the slot order of shardq::make_layout, for W = 1..8 and random batches with short and empty
// requests.
TEST(ShardqDeviceRule, MatchesTheHostOwnershipAndSlots) {
  for (int world = 1; world <= 8; ++world)
    for (int64_t n = 0; n <= 70; ++n) {
      std::vector<int64_t> seen(size_t(world), 0);
      for (int64_t j = 0; j < n; ++j) {
        int owner = -1;
        int64_t index = -1;
        dist::detail::shardq_owner_of(j, n, world, &owner, &index);
        ASSERT_EQ(owner, shardq::owner_rank(j, n, world)) << "n " << n << " W " << world << " j " << j;
        ASSERT_EQ(index, seen[size_t(owner)]++) << "n " << n << " W " << world << " j " << j;  // ascending, no gaps
      }
      for (int p = 0; p < world; ++p) ASSERT_EQ(dist::detail::shardq_owned_count(n, world, p), seen[size_t(p)]);
    }
  std::mt19937_64 rng(11);
  for (int trial = 0; trial < 300; ++trial) {
    const int world = 1 + int(rng() % 8);
    std::vector<int64_t> lens(size_t(1 + rng() % 8));
    for (auto& n : lens) n = (rng() % 3 == 0) ? int64_t(rng() % 4) : int64_t(rng() % 200);
    const auto l = shardq::make_layout(lens, world);
    std::vector<int64_t> base(size_t(world), 0);  // slots taken by earlier requests, per rank
    int64_t start = 0;
    for (int64_t n : lens) {
      for (int64_t j = 0; j < n; ++j) {
        int owner = -1;
        int64_t index = -1;
        dist::detail::shardq_owner_of(j, n, world, &owner, &index);
        const int64_t slot = base[size_t(owner)] + index;
        ASSERT_LT(slot, int64_t(l.rank_tokens[size_t(owner)].size()));
        ASSERT_EQ(l.rank_tokens[size_t(owner)][size_t(slot)], start + j) << "trial " << trial;
      }
      for (int p = 0; p < world; ++p) base[size_t(p)] += dist::detail::shardq_owned_count(n, world, p);
      start += n;
    }
  }
}

// ShardqConfig is checked on the host before anything touches a device or NCCL (ShardQ's
// constructor calls check_config); each bad field gets an error that names it.
TEST(ShardqConfigCheck, NamesTheBadField) {
  dist::ShardqConfig ok;
  ok.world = 4, ok.rank = 3, ok.num_heads = 64, ok.max_tokens = 4096, ok.max_requests = 8;
  EXPECT_NO_THROW(dist::check_config(ok));
  auto expect_error = [&](auto mutate, const std::string& needle) {
    dist::ShardqConfig c = ok;
    mutate(c);
    try {
      dist::check_config(c);
      ADD_FAILURE() << "no error; expected one containing '" << needle << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_error([](dist::ShardqConfig& c) { c.timeout_ms = 0; }, "timeout_ms must be >= 1");
  expect_error([](dist::ShardqConfig& c) { c.timeout_ms = -5; }, "got -5");
  expect_error([](dist::ShardqConfig& c) { c.world = 17, c.num_heads = 17; }, "world must be in [1, 16]");
  expect_error([](dist::ShardqConfig& c) { c.rank = 4; }, "rank must be in [0, world = 4)");
  expect_error([](dist::ShardqConfig& c) { c.num_heads = 129; }, "num_heads (H, all heads) must be in [1, 128]");
  expect_error([](dist::ShardqConfig& c) { c.num_heads = 6; }, "must be a multiple of world W = 4");
  expect_error([](dist::ShardqConfig& c) { c.q_dtype = DType::kFP32; }, "q must be bf16, fp16 or e4m3");
  expect_error([](dist::ShardqConfig& c) { c.topk = 0; }, "topk must be >= 1");
  expect_error([](dist::ShardqConfig& c) { c.max_tokens = int64_t(1) << 29; }, "max_tokens * world < 2^31");
  expect_error([](dist::ShardqConfig& c) { c.max_requests = 0; }, "max_requests must be >= 1");
  // The defaults, as DcpConfig's: the watchdog on, 10 s, a stuck blocking call ends the process.
  const dist::ShardqConfig d;
  EXPECT_TRUE(d.watchdog);
  EXPECT_TRUE(d.terminate_on_stuck_call);
  EXPECT_EQ(d.timeout_ms, 10000);
  EXPECT_NO_THROW(dist::check_config(d));
}

}  // namespace
