// Plan / run on the CUDA backend (issue: serving surface): CUDA-graph capture and replay is
// bit-identical to eager runs, one plan shared by 8 host threads on their own streams, and bad
// calls refused before any launch (also during capture). Skips without a CUDA device.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include "../common/gpu_test.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "devtools/testing.h"
#include "smla/cuda.h"
#include "smla/engine.h"

namespace {

using namespace smla;
using smla::test::fresh_seed;

#define CUDA_OK(x) ASSERT_EQ((x), cudaSuccess) << #x

// A host problem mirrored on the device; params() points at device memory.
struct DeviceProblem {
  smla::testing::HostProblem host;
  void *q = nullptr, *kv = nullptr, *out = nullptr;
  int32_t *idx = nullptr, *counts = nullptr;
  float *lse = nullptr, *sink = nullptr;
  void* ws = nullptr;
  size_t ws_bytes = 0;

  DeviceProblem(const smla::testing::ProblemSpec& s, uint64_t seed, size_t workspace)
      : DeviceProblem(smla::testing::make_problem(s, seed), workspace) {}
  DeviceProblem(smla::testing::HostProblem hp, size_t workspace) : host(std::move(hp)) {
    host.bind();
    auto up = [](const auto& v, auto** dst) {
      const size_t bytes = std::max<size_t>(1, v.size() * sizeof(v[0]));
      EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(dst), bytes), cudaSuccess);
      if (!v.empty()) EXPECT_EQ(cudaMemcpy(*dst, v.data(), v.size() * sizeof(v[0]), cudaMemcpyHostToDevice), cudaSuccess);
    };
    up(host.q, reinterpret_cast<uint8_t**>(&q));
    up(host.kv, reinterpret_cast<uint8_t**>(&kv));
    up(host.out, reinterpret_cast<uint8_t**>(&out));
    up(host.idx, &idx);
    up(host.counts, &counts);
    up(host.lse, &lse);
    up(host.sink, &sink);
    ws_bytes = workspace;
    if (ws_bytes) EXPECT_EQ(cudaMalloc(&ws, ws_bytes), cudaSuccess);
  }
  ~DeviceProblem() {
    for (void* p : {q, kv, out, static_cast<void*>(idx), static_cast<void*>(counts), static_cast<void*>(lse),
                    static_cast<void*>(sink), ws})
      cudaFree(p);
  }
  SparseMlaParams params() const {
    SparseMlaParams p = host.params;
    p.q = q, p.kv = kv, p.out = out, p.idx = idx;
    p.counts = host.params.counts ? counts : nullptr;
    p.sink = host.params.sink ? sink : nullptr;
    p.lse = host.params.lse ? lse : nullptr;
    return p;
  }
  std::vector<uint8_t> out_bytes() const {
    std::vector<uint8_t> h(host.out.size());
    EXPECT_EQ(cudaMemcpy(h.data(), out, h.size(), cudaMemcpyDeviceToHost), cudaSuccess);
    return h;
  }
  std::vector<float> lse_values() const {
    std::vector<float> h(host.lse.size());
    EXPECT_EQ(cudaMemcpy(h.data(), lse, h.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    return h;
  }
  // NaN in out and LSE. cudaMemset runs on the legacy default stream, which the tests' nonblocking
  // streams do not wait for: finish it before anything else is launched (without this a replay
  // could overtake the poison, seen under load on the H200 in session 10).
  void poison_out() const {
    EXPECT_EQ(cudaMemset(out, 0xff, host.out.size()), cudaSuccess);
    EXPECT_EQ(cudaMemset(lse, 0xff, host.lse.size() * 4), cudaSuccess);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  }
};

PlanConfig cuda_config(const smla::testing::ProblemSpec& s, int64_t max_rows) {
  PlanConfig c;
  c.backend = Backend::kCuda;
  c.geometry.num_heads = s.num_heads, c.geometry.rope_dim = s.rope_dim, c.geometry.format = s.format;
  c.geometry.q_dtype = s.q_dtype, c.geometry.topk = s.topk, c.geometry.lse_mode = s.lse_mode, c.geometry.sink = s.sink;
  c.max_rows = max_rows;
  c.graph_sizes = {24};
  return c;
}

smla::testing::ProblemSpec mixed_batch() {
  smla::testing::ProblemSpec s;
  s.num_tokens = 24, s.num_heads = 64, s.topk = 300, s.num_rows = 20000;
  s.use_counts = true, s.sink = true, s.all_invalid_row = true;
  return s;
}

TEST(PlanGpu, GraphReplayIsBitIdenticalToEager) {
  REQUIRE_GPU();
  const auto s = mixed_batch();
  const Plan plan(cuda_config(s, 64));
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  DeviceProblem d(s, seed, plan.workspace_bytes());
  const SparseMlaParams p = d.params();
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

  d.poison_out();
  plan.run(p, d.ws, d.ws_bytes, stream);
  CUDA_OK(cudaStreamSynchronize(stream));
  const auto eager_out = d.out_bytes();
  const auto eager_lse = d.lse_values();
  {  // eager agrees with the float64 reference
    std::vector<double> ref_out, ref_lse;
    smla::testing::reference_double(d.host, ref_out, ref_lse);
    auto got = d.host;
    got.out = eager_out, got.lse = eager_lse;
    got.bind();
    const auto diff = smla::testing::compare(got, ref_out, ref_lse);
    EXPECT_LE(diff.rel_l2, 1e-2);
    EXPECT_LE(diff.lse_max_abs, 1e-3);
  }

  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  plan.run(p, d.ws, d.ws_bytes, stream);
  CUDA_OK(cudaStreamEndCapture(stream, &graph));
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  for (int i = 0; i < 100; ++i) {
    if (i % 25 == 0) d.poison_out();
    CUDA_OK(cudaGraphLaunch(exec, stream));
    if (i % 25 == 0) {
      CUDA_OK(cudaStreamSynchronize(stream));
      ASSERT_EQ(d.out_bytes(), eager_out) << "replay " << i;
      const auto lse = d.lse_values();
      for (size_t k = 0; k < lse.size(); ++k)
        ASSERT_EQ(std::memcmp(&lse[k], &eager_lse[k], sizeof(float)), 0)
            << "replay " << i << ": LSE " << k << " (token " << k / s.num_heads << ", head " << k % s.num_heads
            << ") is " << lse[k] << ", eager " << eager_lse[k];
    }
  }
  CUDA_OK(cudaStreamSynchronize(stream));
  EXPECT_EQ(d.out_bytes(), eager_out);

  // Per-call time, eager vs graph replay (reported, not asserted).
  auto time_us = [&](auto&& launch) {
    for (int i = 0; i < 10; ++i) launch();
    EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < 200; ++i) launch();
    EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / 200;
  };
  const double eager_us = time_us([&] { plan.run(p, d.ws, d.ws_bytes, stream); });
  const double replay_us = time_us([&] { EXPECT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess); });
  std::printf("[ timing ] T=%lld H=%d K=%d: eager %.2f us/call, graph replay %.2f us/call\n", (long long)s.num_tokens,
              s.num_heads, s.topk, eager_us, replay_us);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

// Host cost of one call, eager vs CUDA-graph replay, on a call small enough that the GPU work
// does not hide it (T = 1, H = 16, K = 64). Reported, not asserted.
TEST(PlanGpu, ReplayOverheadOfASmallCall) {
  REQUIRE_GPU();
  smla::testing::ProblemSpec s;
  s.num_tokens = 1, s.num_heads = 16, s.topk = 64, s.num_rows = 4096;
  auto cfg = cuda_config(s, 1);
  cfg.graph_sizes.clear();
  const Plan plan(cfg);
  DeviceProblem d(s, fresh_seed(), plan.workspace_bytes());
  const SparseMlaParams p = d.params();
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  plan.run(p, d.ws, d.ws_bytes, stream);
  CUDA_OK(cudaStreamEndCapture(stream, &graph));
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  auto per_call_us = [&](auto&& launch) {
    for (int i = 0; i < 20; ++i) launch();
    EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < 1000; ++i) launch();
    const double host_us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / 1000;
    EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    const double total_us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / 1000;
    return std::make_pair(host_us, total_us);
  };
  const auto eager = per_call_us([&] { plan.run(p, d.ws, d.ws_bytes, stream); });
  const auto replay = per_call_us([&] { EXPECT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess); });
  std::printf("[ timing ] T=1 H=16 K=64: host time per call: eager %.2f us, graph replay %.2f us; "
              "end to end per call: eager %.2f us, replay %.2f us\n",
              eager.first, replay.first, eager.second, replay.second);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

TEST(PlanGpu, UnplannedCallFailsDuringCaptureWithoutLaunching) {
  REQUIRE_GPU();
  const auto s = mixed_batch();
  const Plan plan(cuda_config(s, 64));
  DeviceProblem d(s, fresh_seed(), plan.workspace_bytes());
  d.poison_out();
  const auto poisoned = d.out_bytes();
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  SparseMlaParams bad = d.params();
  bad.num_heads = 32;
  try {
    plan.run(bad, d.ws, d.ws_bytes, stream);
    ADD_FAILURE() << "an unplanned H ran";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("plan was made for H = 64"), std::string::npos) << e.what();
  }
  cudaGraph_t graph;
  CUDA_OK(cudaStreamEndCapture(stream, &graph));  // the capture is still valid: nothing was launched
  size_t nodes = 99;
  CUDA_OK(cudaGraphGetNodes(graph, nullptr, &nodes));
  EXPECT_EQ(nodes, 0u);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
  EXPECT_EQ(d.out_bytes(), poisoned);
}

TEST(PlanGpu, BadArgumentsRefusedBeforeLaunch) {
  REQUIRE_GPU();
  auto s = mixed_batch();
  s.num_tokens = 200;  // no split: no workspace needed at this T, but the plan sizes for small T
  const Plan plan(cuda_config(s, 256));
  DeviceProblem d(s, fresh_seed(), plan.workspace_bytes());
  d.poison_out();
  const auto poisoned = d.out_bytes();
  auto expect_refused = [&](SparseMlaParams p, size_t ws_bytes, const char* needle) {
    try {
      plan.run(p, d.ws, ws_bytes, nullptr);
      ADD_FAILURE() << "expected refusal containing '" << needle << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  SparseMlaParams p = d.params();
  if (plan.workspace_bytes() > 0) expect_refused(p, plan.workspace_bytes() - 1, "workspace too small");
  p = d.params(), p.q = nullptr, expect_refused(p, d.ws_bytes, "q is null");
  p = d.params(), p.idx_stride_t = 5, expect_refused(p, d.ws_bytes, "idx row stride");
  p = d.params(), p.out_stride_h = 100, expect_refused(p, d.ws_bytes, "out must be");
  p = d.params(), p.num_tokens = 300, expect_refused(p, d.ws_bytes, "max_rows");
  p = d.params(), p.kv_row_stride_bytes = 1000, expect_refused(p, d.ws_bytes, "kv row stride");
  CUDA_OK(cudaDeviceSynchronize());
  EXPECT_EQ(d.out_bytes(), poisoned);
}

// The rows `rows` of a host problem as a problem of their own (same pool, same selections).
smla::testing::HostProblem sub_problem(const smla::testing::HostProblem& full, const std::vector<int64_t>& rows) {
  smla::testing::HostProblem hp = full;
  const auto& s = full.spec;
  const int64_t T = int64_t(rows.size());
  const size_t q_row = full.q.size() / size_t(s.num_tokens), o_row = full.out.size() / size_t(s.num_tokens);
  const size_t K = size_t(s.topk), H = size_t(s.num_heads);
  hp.spec.num_tokens = T;
  hp.q.assign(size_t(T) * q_row, 0), hp.out.assign(size_t(T) * o_row, 0xff);
  hp.idx.assign(size_t(T) * K, -1), hp.counts.assign(size_t(T), 0), hp.lse.assign(size_t(T) * H, NAN);
  for (int64_t i = 0; i < T; ++i) {
    const size_t r = size_t(rows[size_t(i)]);
    std::memcpy(hp.q.data() + size_t(i) * q_row, full.q.data() + r * q_row, q_row);
    std::memcpy(hp.idx.data() + size_t(i) * K, full.idx.data() + r * K, K * 4);
    hp.counts[size_t(i)] = full.counts[r];
  }
  hp.bind();
  return hp;
}

// bf16 at H = 128, and fp8_ds_mla at H = 24 / fp8_e4m3 at H = 32, where a plan that is not batch-invariant runs
// h64.ws for calls of fewer than 32 rows and swapab above (smla/support.h kSwapAbN32MinRows): the batch-invariant
// plan runs swapab for the single rows too, so their bits equal the 200-row batch's.
TEST(PlanGpu, BatchInvariantRowsDoNotDependOnTheBatch) {
  REQUIRE_GPU();
  for (const auto& [format, heads] : {std::pair{smla::KvFormat::kBF16, 128}, std::pair{smla::KvFormat::kFP8DsMla, 24},
                                      std::pair{smla::KvFormat::kFP8E4M3, 32}}) {
  SCOPED_TRACE(std::string(smla::to_string(format)) + " H = " + std::to_string(heads));
  auto s = mixed_batch();
  s.num_tokens = 200, s.topk = 2048, s.num_heads = heads, s.num_rows = 50000;
  s.format = format;
  auto cfg = cuda_config(s, 256);
  cfg.batch_invariant = true;
  cfg.graph_sizes.clear();
  const Plan plan(cfg);
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const auto full_host = smla::testing::make_problem(s, seed);
  DeviceProblem full(full_host, plan.workspace_bytes());
  plan.run(full.params(), full.ws, full.ws_bytes, nullptr);
  CUDA_OK(cudaDeviceSynchronize());
  const auto full_out = full.out_bytes();
  const auto full_lse = full.lse_values();
  const size_t o_row = full_out.size() / size_t(s.num_tokens);
  // The same rows alone, and inside smaller batches, at other positions.
  for (const std::vector<int64_t>& rows : {std::vector<int64_t>{7}, std::vector<int64_t>{0}, std::vector<int64_t>{199},
                                           std::vector<int64_t>{150, 7, 3, 0, 42, 199, 8, 9, 10, 11, 12, 13}}) {
    DeviceProblem sub(sub_problem(full_host, rows), plan.workspace_bytes());
    plan.run(sub.params(), sub.ws, sub.ws_bytes, nullptr);
    CUDA_OK(cudaDeviceSynchronize());
    const auto out = sub.out_bytes();
    const auto lse = sub.lse_values();
    for (size_t i = 0; i < rows.size(); ++i) {
      const size_t r = size_t(rows[i]);
      EXPECT_EQ(0, std::memcmp(out.data() + i * o_row, full_out.data() + r * o_row, o_row))
          << "row " << r << " in a batch of " << rows.size() << " differs from the same row in a batch of 200";
      EXPECT_EQ(0, std::memcmp(lse.data() + i * size_t(s.num_heads), full_lse.data() + r * size_t(s.num_heads),
                               size_t(s.num_heads) * 4))
          << "LSE of row " << r;
    }
  }
  }
}

TEST(PlanGpu, EightThreadsShareOnePlan) {
  REQUIRE_GPU();
  const auto s = mixed_batch();
  const Plan plan(cuda_config(s, 64));
  const uint64_t seed = fresh_seed();
  std::vector<std::vector<uint8_t>> first(8), last(8);
  std::vector<std::thread> threads;
  for (int i = 0; i < 8; ++i)
    threads.emplace_back([&, i] {
      cudaStream_t stream;
      EXPECT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
      DeviceProblem d(s, seed, plan.workspace_bytes());  // same inputs in every thread
      for (int rep = 0; rep < 20; ++rep) {
        plan.run(d.params(), d.ws, d.ws_bytes, stream);
        if (rep == 0) {
          EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
          first[size_t(i)] = d.out_bytes();
        }
      }
      EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
      last[size_t(i)] = d.out_bytes();
      cudaStreamDestroy(stream);
    });
  for (auto& t : threads) t.join();
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(first[size_t(i)], first[0]) << "thread " << i;
    EXPECT_EQ(last[size_t(i)], first[0]) << "thread " << i;
  }
}

}  // namespace
