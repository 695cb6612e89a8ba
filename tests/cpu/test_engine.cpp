// Plan / run on the CPU backend: buckets, checks against the plan, concurrent use of one plan.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <thread>
#include <vector>

#include "devtools/testing.h"
#include "smla/engine.h"
#include "smla/support.h"

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

// The plan and the call must agree on the score path that runs: compared resolved, so auto matches
// the explicit precision it resolves to, and differing paths are refused with both named.
TEST(Plan, ScorePrecisionIsComparedResolved) {
  using SP = ScorePrecision;
  struct Row {
    SP plan, call;
    bool ok;
  };
  // An e4m3 q with an fp8_ds_mla cache at H = 64: auto is fp8 (at H <= kSwapAbMaxHeads = 32 it is bf16,
  // the swap-AB kernel's path: smla/support.h resolve_score_precision).
  const Row e4m3_rows[] = {{SP::kAuto, SP::kAuto, true},  {SP::kAuto, SP::kFP8, true},  {SP::kFP8, SP::kAuto, true},
                           {SP::kFP8, SP::kFP8, true},    {SP::kBF16, SP::kBF16, true}, {SP::kAuto, SP::kBF16, false},
                           {SP::kBF16, SP::kAuto, false}, {SP::kFP8, SP::kBF16, false}, {SP::kBF16, SP::kFP8, false}};
  // A bf16 q with a bf16 cache: auto is bf16 (fp8 cannot be planned at all).
  const Row bf16_rows[] = {{SP::kAuto, SP::kAuto, true},
                           {SP::kAuto, SP::kBF16, true},
                           {SP::kBF16, SP::kAuto, true},
                           {SP::kBF16, SP::kBF16, true},
                           {SP::kAuto, SP::kFP8, false},
                           {SP::kBF16, SP::kFP8, false}};
  for (bool e4m3 : {true, false}) {
    smla::testing::ProblemSpec s;
    s.num_tokens = 2;
    if (e4m3)
      s.format = KvFormat::kFP8DsMla, s.q_dtype = DType::kE4M3, s.q_scale = 0.1f,
      s.num_heads = 64;
    auto hp = smla::testing::make_problem(s, 5);
    const auto rows = e4m3 ? std::vector<Row>(std::begin(e4m3_rows), std::end(e4m3_rows))
                           : std::vector<Row>(std::begin(bf16_rows), std::end(bf16_rows));
    for (const Row& r : rows) {
      auto cfg = cpu_config(s, 2);
      cfg.geometry.score_precision = r.plan;
      const Plan plan(cfg);
      SparseMlaParams p = hp.params;
      p.score_precision = r.call;
      const std::string what = std::string(e4m3 ? "e4m3 q: plan " : "bf16 q: plan ") +
                               std::string(to_string(r.plan)) + ", call " + std::string(to_string(r.call));
      if (r.ok) {
        EXPECT_NO_THROW(plan.check(p, 0)) << what;
        continue;
      }
      try {
        plan.check(p, 0);
        ADD_FAILURE() << what << ": expected a score precision mismatch";
      } catch (const Error& e) {
        const std::string m = e.what();
        EXPECT_NE(m.find("score precision " + std::string(to_string(r.call))), std::string::npos) << what << ": " << m;
        EXPECT_NE(m.find("plan was made for " + std::string(to_string(r.plan))), std::string::npos) << what << ": " << m;
      }
    }
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
