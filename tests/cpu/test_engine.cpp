// Plan / run on the CPU backend: buckets, checks against the plan, concurrent use of one plan.
#include <gtest/gtest.h>

#include <cstring>
#include <thread>
#include <vector>

#include "devtools/testing.h"
#include "smla/engine.h"

namespace {

using namespace smla;

PlanConfig cpu_config(const smla::testing::ProblemSpec& s, int64_t max_rows) {
  PlanConfig c;
  c.backend = Backend::kCpu;
  c.geometry.num_heads = s.num_heads;
  c.geometry.rope_dim = s.rope_dim;
  c.geometry.format = s.format;
  c.geometry.q_dtype = s.q_dtype;
  c.geometry.topk = s.topk;
  c.geometry.lse_mode = s.lse_mode;
  c.geometry.sink = s.sink;
  c.max_rows = max_rows;
  return c;
}

TEST(Plan, BucketsArePowersOfTwoPlusGraphSizes) {
  smla::testing::ProblemSpec s;
  auto cfg = cpu_config(s, 100);
  cfg.graph_sizes = {3, 48};
  const Plan plan(cfg);
  std::vector<int64_t> buckets;
  for (const auto& sc : plan.schedules()) buckets.push_back(sc.bucket);
  EXPECT_EQ(buckets, (std::vector<int64_t>{1, 2, 3, 4, 8, 16, 32, 48, 64, 100}));
  EXPECT_EQ(plan.schedule_for(5).bucket, 8);
  EXPECT_EQ(plan.schedule_for(33).bucket, 48);
  EXPECT_EQ(plan.schedule_for(100).bucket, 100);
  EXPECT_THROW(plan.schedule_for(101), Error);
  EXPECT_EQ(plan.workspace_bytes(), 0u);
}

TEST(Plan, RefusesWhatWasNotPlanned) {
  smla::testing::ProblemSpec s;
  s.num_tokens = 4;
  const Plan plan(cpu_config(s, 4));
  auto expect_msg = [&](SparseMlaParams p, const char* needle) {
    try {
      plan.run(p, nullptr, 0);
      ADD_FAILURE() << "expected an error containing '" << needle << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  auto hp = smla::testing::make_problem(s, 1);
  SparseMlaParams p = hp.params;
  p.num_heads = 8, expect_msg(p, "plan was made for H = 16");
  p = hp.params, p.topk = 65, p.idx_stride_t = 65, expect_msg(p, "capacity");
  p = hp.params, p.lse = nullptr, expect_msg(p, "LSE off");
  p = hp.params, p.sink = hp.sink.data(), expect_msg(p, "sink given");
  p = hp.params, p.format = KvFormat::kFP8E4M3, expect_msg(p, "KV format");
  auto big = s;
  big.num_tokens = 5;
  auto hp5 = smla::testing::make_problem(big, 1);
  expect_msg(hp5.params, "max_rows");
  // Unsupported geometry: the plan itself is refused with the reason.
  auto bad = cpu_config(s, 4);
  bad.geometry.rope_dim = 32;
  try {
    Plan p2(bad);
    ADD_FAILURE() << "expected an unsupported-geometry error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), Error::Kind::kUnsupported);
  }
}

TEST(Plan, EmptyRunTouchesNothing) {
  smla::testing::ProblemSpec s;
  s.num_tokens = 0;
  const Plan plan(cpu_config(s, 4));
  auto hp = smla::testing::make_problem(s, 2);
  EXPECT_NO_THROW(plan.run(hp.params, nullptr, 0));
}

TEST(Plan, SharedByEightThreads) {
  smla::testing::ProblemSpec s;
  s.num_tokens = 3, s.num_heads = 5, s.topk = 40, s.sink = true, s.use_counts = true;
  const Plan plan(cpu_config(s, 8));
  auto base = smla::testing::make_problem(s, 3);
  const auto reference_out = [&] {
    auto hp = base;
    hp.bind();
    plan.run(hp.params, nullptr, 0);
    return hp.out;
  }();
  std::vector<std::vector<uint8_t>> outs(8);
  std::vector<std::thread> threads;
  for (int i = 0; i < 8; ++i)
    threads.emplace_back([&, i] {
      const Plan own(cpu_config(s, 8));  // planning concurrently with the other threads' runs
      for (int rep = 0; rep < 5; ++rep) {
        auto hp = base;
        hp.bind();
        (rep % 2 ? own : plan).run(hp.params, nullptr, 0);
        outs[size_t(i)] = hp.out;
      }
    });
  for (auto& t : threads) t.join();
  for (const auto& o : outs) EXPECT_EQ(o, reference_out);
}

}  // namespace
