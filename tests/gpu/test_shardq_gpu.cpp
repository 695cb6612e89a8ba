// ShardQ prefill over NCCL (DESIGN.md §5b) on one GPU, through a world-1 communicator: the device
// ownership kernels against shardq::make_layout for W = 1..8 (every rank's map computed here), the
// whole step against the float64 reference of the unsharded call for every KV format, bit-identical
// to the unsharded Plan::run when the plan has no padding, requests shorter than 2·W, empty ones,
// T = 0, bad input refused on the host (or, for a malformed cu_seqlens, reported by wait(), the
// communicator left usable), graph capture + replay (one graph serving another cu_seqlens of the same
// T and R), and the watchdog off or the C ABI giving the default's result bit for bit. The W = 2 runs
// and the watchdog against a simulated hang are tests/dist/shardq_multi_gpu.cpp. Skips without an
// SM90 device or without NCCL.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include "../common/gpu_test.h"
#include "../common/shardq_case.h"

#include <random>
#include <string>
#include <vector>

#include "smla/engine.h"
#include "smla/shardq.h"
#include "smla/smla_dist.h"

#if SMLA_HAVE_NCCL
#include "dist/shardq_device.h"
#endif

namespace {

using namespace smla;

#define CUDA_OK(x) ASSERT_EQ((x), cudaSuccess) << #x

#if SMLA_HAVE_NCCL

// Device memory freed at scope end.
struct Dev {
  void* p = nullptr;
  explicit Dev(size_t bytes) { EXPECT_EQ(cudaMalloc(&p, std::max<size_t>(bytes, 16)), cudaSuccess); }
  template <class T>
  explicit Dev(const std::vector<T>& v) : Dev(v.size() * sizeof(T)) {
    if (!v.empty()) {
      EXPECT_EQ(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
    }
  }
  ~Dev() { cudaFree(p); }
  Dev(const Dev&) = delete;
  template <class T>
  T* as() const { return static_cast<T*>(p); }
  template <class T>
  std::vector<T> get(size_t n) const {
    std::vector<T> v(n);
    EXPECT_EQ(cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return v;
  }
};

// One world-1 communicator for the whole binary (made on first use, on device 0).
void* world1_comm() {
  static void* comm = [] {
    cudaSetDevice(0);
    return dist::make_comm(dist::make_unique_id(), 1, 0);
  }();
  return comm;
}

TEST(ShardqGpu, OwnershipKernelMatchesTheHostLayout) {
  REQUIRE_GPU();
  std::mt19937_64 rng(test::fresh_seed());
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreate(&stream));
  for (int trial = 0; trial < 120; ++trial) {
    const int world = 1 + trial % 8;
    // Short (< 2W), empty and long requests; every 10th trial has more than 256 requests (several scan tiles).
    std::vector<int64_t> lens(size_t(trial % 10 == 9 ? 300 + rng() % 200 : 1 + rng() % 12));
    for (auto& n : lens) n = (rng() % 3 == 0) ? int64_t(rng() % (2 * world)) : int64_t(rng() % 700);
    std::vector<int32_t> cu{0};
    for (int64_t n : lens) cu.push_back(int32_t(cu.back() + n));
    const int64_t T = cu.back();
    const int R = int(lens.size());
    if (T == 0) continue;
    const auto l = shardq::make_layout(lens, world);
    const int64_t slots = shardq::max_tokens_per_rank(T, world, R);
    Dev d_cu(cu), status(16), base(size_t(R) * world * 4), dest(size_t(T) * 4), slot_token(size_t(slots) * 4);
    for (int rank = 0; rank < world; ++rank) {
      SCOPED_TRACE("trial " + std::to_string(trial) + " W " + std::to_string(world) + " R " + std::to_string(R) +
                   " rank " + std::to_string(rank));
      dist::detail::shardq_ownership(d_cu.as<int32_t>(), R, T, world, rank, slots, status.as<int32_t>(),
                                     base.as<int32_t>(), dest.as<int32_t>(), slot_token.as<int32_t>(), stream);
      CUDA_OK(cudaStreamSynchronize(stream));
      ASSERT_EQ(status.get<int32_t>(1)[0], 0);
      const auto got_dest = dest.get<int32_t>(size_t(T));
      for (int p = 0; p < world; ++p)
        for (size_t i = 0; i < l.rank_tokens[size_t(p)].size(); ++i)
          ASSERT_EQ(got_dest[size_t(l.rank_tokens[size_t(p)][i])], int32_t(p * slots + int64_t(i)))
              << "token " << l.rank_tokens[size_t(p)][i];
      const auto got_slots = slot_token.get<int32_t>(size_t(slots));
      const auto& mine = l.rank_tokens[size_t(rank)];
      for (int64_t s = 0; s < slots; ++s)
        ASSERT_EQ(got_slots[size_t(s)], s < int64_t(mine.size()) ? int32_t(mine[size_t(s)]) : -1) << "slot " << s;
    }
  }
  // Malformed cu_seqlens: each fault is reported and every token's dest is -1.
  const std::vector<std::pair<std::vector<int32_t>, int32_t>> bad = {
      {{1, 5, 9}, dist::detail::kShardqBadStart},
      {{0, 6, 4, 9}, dist::detail::kShardqDecreasing},
      {{0, 5, 8}, dist::detail::kShardqBadEnd},
  };
  for (const auto& [cu, fault] : bad) {
    Dev d_cu(cu), status(16), base(64), dest(9 * 4), slot_token(9 * 4);
    dist::detail::shardq_ownership(d_cu.as<int32_t>(), int(cu.size()) - 1, 9, 2, 0, 9, status.as<int32_t>(),
                                   base.as<int32_t>(), dest.as<int32_t>(), slot_token.as<int32_t>(), stream);
    CUDA_OK(cudaStreamSynchronize(stream));
    EXPECT_NE(status.get<int32_t>(1)[0] & fault, 0) << "fault " << fault;
    for (int32_t d : dest.get<int32_t>(9)) EXPECT_EQ(d, -1);
  }
  // More tokens for one rank than the slots: reported, not written out of bounds.
  {
    const std::vector<int32_t> cu{0, 40};
    Dev d_cu(cu), status(16), base(64), dest(40 * 4), slot_token(40 * 4);
    dist::detail::shardq_ownership(d_cu.as<int32_t>(), 1, 40, 2, 0, 5, status.as<int32_t>(), base.as<int32_t>(),
                                   dest.as<int32_t>(), slot_token.as<int32_t>(), stream);
    CUDA_OK(cudaStreamSynchronize(stream));
    EXPECT_NE(status.get<int32_t>(1)[0] & dist::detail::kShardqOverSlots, 0);
  }
  cudaStreamDestroy(stream);
}

// The step on device buffers of one case.
struct StepRun {
  const test::ShardqCase& c;
  Dev q, idx, counts, kv, cu, out, lse;
  dist::ShardqStepArgs args;
  StepRun(const test::ShardqCase& cs, int world, int rank)
      : c(cs),
        q(test::local_q(cs, world, rank)),
        idx(cs.host.idx),
        counts(cs.host.counts),
        kv(cs.host.kv),
        cu(cs.cu_seqlens),
        out(size_t(std::max<int64_t>(cs.T, 1)) * (cs.H / world) * 512 * 2),
        lse(size_t(std::max<int64_t>(cs.T, 1)) * (cs.H / world) * 4) {
    const auto& p = cs.host.params;
    args.num_tokens = cs.T, args.num_requests = int(cs.lens.size()), args.cu_seqlens = cu.as<int32_t>();
    args.q = q.p, args.idx = idx.as<int32_t>(), args.idx_stride_t = p.idx_stride_t, args.counts = counts.as<int32_t>();
    args.kv = kv.p, args.num_rows = p.num_rows, args.kv_row_stride_bytes = p.kv_row_stride_bytes;
    args.softmax_scale = p.softmax_scale, args.q_scale = p.q_scale, args.k_scale = p.k_scale;
    args.out = out.p, args.lse = lse.as<float>();
  }
  void poison() const {
    EXPECT_EQ(cudaMemset(out.p, 0xff, size_t(std::max<int64_t>(c.T, 1)) * c.H * 512 * 2), cudaSuccess);
    EXPECT_EQ(cudaMemset(lse.p, 0xff, size_t(std::max<int64_t>(c.T, 1)) * c.H * 4), cudaSuccess);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);  // a nonblocking stream does not wait for the legacy one
  }
  std::vector<uint16_t> out_bits() const { return out.get<uint16_t>(size_t(c.T) * c.H * 512); }
  std::vector<float> lse_values() const { return lse.get<float>(size_t(c.T) * c.H); }
};

struct FormatCase {
  KvFormat format;
  DType q_dtype;
};
std::string name_of(const FormatCase& f) {
  return std::string(to_string(f.format)) + "_q_" + std::string(to_string(f.q_dtype));
}

class ShardqGpuFormats : public ::testing::TestWithParam<FormatCase> {};

TEST_P(ShardqGpuFormats, WorldOneEqualsTheUnshardedCall) {
  REQUIRE_GPU();
  const auto [format, q_dtype] = GetParam();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  // Requests of 37, 1, 0, 2 and 20 tokens (an empty one, and ones shorter than 2·W at W = 2).
  const auto c = test::make_shardq_case(format, q_dtype, 64, {37, 1, 0, 2, 20}, seed);
  void* comm = world1_comm();
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreate(&stream));
  StepRun run(c, 1, 0);

  // Planned for more tokens and requests than the step has: padded slots (count 0) take part.
  {
    dist::ShardQ sq(comm, test::shardq_config(c, 1, 0, format, c.T + 40, 9));
    EXPECT_EQ(sq.device(), 0);
    EXPECT_EQ(sq.slots(), shardq::max_tokens_per_rank(c.T + 40, 1, 9));
    Dev ws(sq.workspace_bytes());
    run.poison();
    sq.step(run.args, ws.p, sq.workspace_bytes(), stream);
    sq.wait(stream, 20000);
    const auto d = test::compare_slice(c, 1, 0, run.out_bits(), run.lse_values());
    EXPECT_LE(d.rel_l2, 1e-2) << name_of(GetParam());
    EXPECT_LE(d.lse_max_abs, 1e-3) << name_of(GetParam());
    std::printf("[ shardq ] W=1 %-26s T=%lld H=%d K=%d slots=%lld: out rel L2 %.3e, lse max abs %.3e\n",
                name_of(GetParam()).c_str(), (long long)c.T, c.H, c.K, (long long)sq.slots(), d.rel_l2,
                d.lse_max_abs);
  }
  // Planned for exactly this step (slots = T): the attention is the unsharded call with the same
  // plan, so out and lse equal Plan::run's bit for bit.
  {
    const auto cfg = test::shardq_config(c, 1, 0, format, c.T, int(c.lens.size()));
    dist::ShardQ sq(comm, cfg);
    ASSERT_EQ(sq.slots(), c.T);
    Dev ws(sq.workspace_bytes());
    run.poison();
    sq.step(run.args, ws.p, sq.workspace_bytes(), stream);
    sq.wait(stream, 20000);
    PlanConfig pc;
    pc.geometry.num_heads = c.H, pc.geometry.format = format, pc.geometry.q_dtype = q_dtype, pc.geometry.topk = c.K;
    pc.geometry.lse_mode = LseMode::kBaseE, pc.max_rows = c.T, pc.backend = Backend::kCuda;
    pc.geometry.score_precision = cfg.score_precision;  // the same score path as the ShardQ's plan
    const Plan plan(pc);
    Dev q_all(c.host.q), out(size_t(c.T) * c.H * 512 * 2), lse(size_t(c.T) * c.H * 4), pws(plan.workspace_bytes());
    SparseMlaParams p = c.host.params;
    p.q = q_all.p, p.idx = run.idx.as<int32_t>(), p.counts = run.counts.as<int32_t>(), p.kv = run.kv.p;
    p.out = out.p, p.lse = lse.as<float>(), p.sink = nullptr, p.score_precision = cfg.score_precision;
    plan.run(p, pws.p, plan.workspace_bytes(), stream);
    CUDA_OK(cudaStreamSynchronize(stream));
    EXPECT_TRUE(run.out_bits() == out.get<uint16_t>(size_t(c.T) * c.H * 512)) << "out differs from Plan::run";
    const auto a = run.lse_values(), b = lse.get<float>(size_t(c.T) * c.H);
    EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * 4)) << "lse differs from Plan::run";
  }
  cudaStreamDestroy(stream);
}

INSTANTIATE_TEST_SUITE_P(
    Formats, ShardqGpuFormats,
    ::testing::Values(FormatCase{KvFormat::kBF16, DType::kBF16}, FormatCase{KvFormat::kFP16, DType::kFP16},
                      FormatCase{KvFormat::kFP8E4M3, DType::kBF16}, FormatCase{KvFormat::kFP8DsMla, DType::kBF16},
                      FormatCase{KvFormat::kNvFP4DsMla, DType::kBF16}, FormatCase{KvFormat::kFP8DsMla, DType::kE4M3}),
    [](const ::testing::TestParamInfo<FormatCase>& i) { return name_of(i.param); });

TEST(ShardqGpu, WithoutLseAndEmptySteps) {
  REQUIRE_GPU();
  // No counts: every row uses all K entries (the case makes none, so no row past a count is poisoned).
  const auto c = test::make_shardq_case(KvFormat::kBF16, DType::kBF16, 32, {5, 0, 9}, test::fresh_seed(), 160, false);
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreate(&stream));
  dist::ShardQ sq(world1_comm(), test::shardq_config(c, 1, 0, KvFormat::kBF16, 64, 4));
  Dev ws(sq.workspace_bytes());
  StepRun run(c, 1, 0);
  run.poison();
  auto a = run.args;
  a.lse = nullptr;  // out only: the LSE is not exchanged, lse untouched
  a.counts = nullptr;
  sq.step(a, ws.p, sq.workspace_bytes(), stream);
  sq.wait(stream, 20000);
  const auto d = test::compare_slice(c, 1, 0, run.out_bits(), {});
  EXPECT_LE(d.rel_l2, 1e-2);
  for (float v : run.lse_values()) EXPECT_TRUE(std::isnan(v));  // still the 0xff poison

  // T = 0 (no requests, or only empty ones): nothing enqueued, nothing written, no error.
  run.poison();
  a = run.args;
  a.num_tokens = 0, a.num_requests = 0;
  sq.step(a, ws.p, sq.workspace_bytes(), stream);
  a.num_requests = 3;
  sq.step(a, ws.p, sq.workspace_bytes(), stream);
  sq.wait(stream, 20000);
  for (uint16_t b : run.out_bits()) ASSERT_EQ(b, 0xffff);
  cudaStreamDestroy(stream);
}

// An Error whose message contains `needle`.
#define EXPECT_ERROR_WITH(stmt, needle)                                                           \
  do {                                                                                            \
    bool thrown_ = false;                                                                         \
    try {                                                                                         \
      stmt;                                                                                       \
    } catch (const smla::Error& e) {                                                              \
      thrown_ = true;                                                                             \
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();               \
    }                                                                                             \
    EXPECT_TRUE(thrown_) << #stmt " did not throw";                                               \
  } while (0)

TEST(ShardqGpu, BadInputRefusedBeforeAnythingRuns) {
  REQUIRE_GPU();
  void* comm = world1_comm();
  const auto c = test::make_shardq_case(KvFormat::kBF16, DType::kBF16, 32, {6, 3}, test::fresh_seed());
  auto cfg = test::shardq_config(c, 1, 0, KvFormat::kBF16, 9, 2);
  {
    auto bad = cfg;
    bad.world = 4, bad.num_heads = 6;
    EXPECT_ERROR_WITH((void)dist::ShardQ(comm, bad), "multiple of world");
    bad = cfg;
    bad.world = 2;  // the communicator has one rank
    EXPECT_ERROR_WITH((void)dist::ShardQ(comm, bad), "the communicator has 1 ranks");
    bad = cfg;
    bad.max_requests = 0;
    EXPECT_ERROR_WITH((void)dist::ShardQ(comm, bad), "max_requests");
    bad = cfg;
    bad.q_dtype = DType::kFP32;
    EXPECT_ERROR_WITH((void)dist::ShardQ(comm, bad), "q must be");
    EXPECT_ERROR_WITH((void)dist::ShardQ(nullptr, cfg), "communicator is null");
  }
  dist::ShardQ sq(comm, cfg);
  Dev ws(sq.workspace_bytes());
  StepRun run(c, 1, 0);
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreate(&stream));
  run.poison();
  auto a = run.args;
  const size_t wsb = sq.workspace_bytes();
  a.num_tokens = 10;
  EXPECT_ERROR_WITH(sq.step(a, ws.p, wsb, stream), "max_tokens");
  a = run.args;
  a.num_requests = 3;
  EXPECT_ERROR_WITH(sq.step(a, ws.p, wsb, stream), "max_requests");
  a.num_requests = 0;
  EXPECT_ERROR_WITH(sq.step(a, ws.p, wsb, stream), "0 requests");
  a = run.args;
  EXPECT_ERROR_WITH(sq.step(a, ws.p, wsb - 1, stream), std::to_string(wsb));
  a.cu_seqlens = nullptr;
  EXPECT_ERROR_WITH(sq.step(a, ws.p, wsb, stream), "must not be null");
  a = run.args;
  a.q = static_cast<const uint8_t*>(a.q) + 2;
  EXPECT_ERROR_WITH(sq.step(a, ws.p, wsb, stream), "16-byte aligned");
  a = run.args;
  a.idx_stride_t = c.K - 1;
  EXPECT_ERROR_WITH(sq.step(a, ws.p, wsb, stream), "idx_stride_t");
  a = run.args;
  a.sink = run.lse.as<float>();
  EXPECT_ERROR_WITH(sq.step(a, ws.p, wsb, stream), "sink");
  a = run.args;
  a.out = const_cast<void*>(a.q);
  EXPECT_ERROR_WITH(sq.step(a, ws.p, wsb, stream), "out overlaps q");
  a = run.args;
  a.lse = static_cast<float*>(ws.p) + 64;
  EXPECT_ERROR_WITH(sq.step(a, ws.p, wsb, stream), "lse overlaps the workspace");
  CUDA_OK(cudaStreamSynchronize(stream));
  for (uint16_t b : run.out_bits()) ASSERT_EQ(b, 0xffff) << "a refused step wrote out";

  // A malformed cu_seqlens cannot be seen on the host: the step runs, writes out 0, and wait() names it.
  const std::vector<int32_t> bad_cu{0, 7, 5};
  CUDA_OK(cudaMemcpy(run.cu.p, bad_cu.data(), 12, cudaMemcpyHostToDevice));
  sq.step(run.args, ws.p, wsb, stream);
  EXPECT_ERROR_WITH(sq.wait(stream, 20000), "cu_seqlens decreases");
  for (uint16_t b : run.out_bits()) ASSERT_EQ(b, 0);
  // A fault of the step's input is no communicator failure: nothing was aborted, the next step runs.
  EXPECT_FALSE(sq.aborted());
  CUDA_OK(cudaMemcpy(run.cu.p, c.cu_seqlens.data(), c.cu_seqlens.size() * 4, cudaMemcpyHostToDevice));
  sq.step(run.args, ws.p, wsb, stream);
  sq.wait(stream, 20000);
  const auto d = test::compare_slice(c, 1, 0, run.out_bits(), run.lse_values());
  EXPECT_LE(d.rel_l2, 1e-2);
  EXPECT_LE(d.lse_max_abs, 1e-3);
  EXPECT_ERROR_WITH(sq.wait(stream, 0), "timeout_ms must be >= 1");
  cudaStreamDestroy(stream);
}

// The watchdog only watches: a ShardQ with it off, and ShardQs made through the C ABI (watchdog 0 and
// 1), give the default's out and lse bit for bit, and none reports an abort after healthy steps.
TEST(ShardqGpu, WatchdogOffAndTheCApiGiveTheSameResult) {
  REQUIRE_GPU();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const auto c = test::make_shardq_case(KvFormat::kBF16, DType::kBF16, 32, {12, 5}, seed);
  void* comm = world1_comm();
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreate(&stream));
  StepRun run(c, 1, 0);
  auto cfg = test::shardq_config(c, 1, 0, KvFormat::kBF16, c.T, 2);
  ASSERT_TRUE(cfg.watchdog);
  dist::ShardQ on(comm, cfg);
  cfg.watchdog = false;
  dist::ShardQ off(comm, cfg);
  ASSERT_EQ(on.workspace_bytes(), off.workspace_bytes());
  Dev ws(on.workspace_bytes());
  run.poison();
  on.step(run.args, ws.p, on.workspace_bytes(), stream);
  on.wait(stream, 20000);
  const auto ref_out = run.out_bits();
  const auto ref_lse = run.lse_values();
  const auto d = test::compare_slice(c, 1, 0, ref_out, ref_lse);
  EXPECT_LE(d.rel_l2, 1e-2);
  EXPECT_LE(d.lse_max_abs, 1e-3);
  run.poison();
  off.step(run.args, ws.p, off.workspace_bytes(), stream);
  off.wait(stream, 20000);
  EXPECT_TRUE(run.out_bits() == ref_out) << "watchdog off: out differs";
  EXPECT_EQ(0, std::memcmp(run.lse_values().data(), ref_lse.data(), ref_lse.size() * 4)) << "watchdog off: lse differs";
  EXPECT_FALSE(on.aborted());
  EXPECT_FALSE(off.aborted());

  for (int32_t watchdog : {0, 1}) {
    SCOPED_TRACE("C ABI, watchdog " + std::to_string(watchdog));
    smla_shardq_config cc;
    smla_shardq_config_init(&cc);
    EXPECT_EQ(cc.watchdog, 1);
    EXPECT_EQ(cc.terminate_on_stuck_call, 1);
    cc.num_heads = c.H, cc.score_precision = SMLA_SCORE_BF16, cc.topk = c.K, cc.max_tokens = c.T, cc.max_requests = 2;
    cc.watchdog = watchdog;
    smla_shardq* h = nullptr;
    ASSERT_EQ(smla_shardq_create(comm, &cc, &h), SMLA_OK) << smla_last_error();
    size_t bytes = 0;
    ASSERT_EQ(smla_shardq_workspace_bytes(h, &bytes), SMLA_OK) << smla_last_error();
    EXPECT_EQ(bytes, on.workspace_bytes());
    smla_shardq_step_args ca;
    smla_shardq_step_args_init(&ca);
    const auto& a = run.args;
    ca.num_tokens = a.num_tokens, ca.num_requests = a.num_requests, ca.cu_seqlens = a.cu_seqlens, ca.q = a.q;
    ca.idx = a.idx, ca.idx_stride_t = a.idx_stride_t, ca.counts = a.counts, ca.kv = a.kv, ca.num_rows = a.num_rows;
    ca.kv_row_stride_bytes = a.kv_row_stride_bytes, ca.softmax_scale = a.softmax_scale, ca.q_scale = a.q_scale;
    ca.k_scale = a.k_scale, ca.out = a.out, ca.lse = a.lse;
    run.poison();
    EXPECT_EQ(smla_shardq_step(h, &ca, ws.p, bytes, stream), SMLA_OK) << smla_last_error();
    EXPECT_EQ(smla_shardq_wait(h, stream, 20000), SMLA_OK) << smla_last_error();
    EXPECT_TRUE(run.out_bits() == ref_out) << "C ABI: out differs";
    EXPECT_EQ(0, std::memcmp(run.lse_values().data(), ref_lse.data(), ref_lse.size() * 4)) << "C ABI: lse differs";
    int32_t aborted = -1;
    EXPECT_EQ(smla_shardq_aborted(h, &aborted), SMLA_OK) << smla_last_error();
    EXPECT_EQ(aborted, 0);
    smla_shardq_destroy(h);
  }
  cudaStreamDestroy(stream);
}

TEST(ShardqGpu, GraphReplayServesAnyCuSeqlensOfTheSameShape) {
  REQUIRE_GPU();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const auto c = test::make_shardq_case(KvFormat::kFP8DsMla, DType::kBF16, 64, {30, 1, 17}, seed);
  auto c2 = c;  // the same tokens cut into other requests
  c2.lens = {2, 0, 46};
  c2.cu_seqlens = {0, 2, 2, 48};
  dist::ShardQ sq(world1_comm(), test::shardq_config(c, 1, 0, KvFormat::kFP8DsMla, 80, 4));
  Dev ws(sq.workspace_bytes());
  StepRun run(c, 1, 0);
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  sq.step(run.args, ws.p, sq.workspace_bytes(), stream);
  sq.wait(stream, 20000);
  const auto eager_out = run.out_bits();
  const auto eager_lse = run.lse_values();

  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  sq.step(run.args, ws.p, sq.workspace_bytes(), stream);
  CUDA_OK(cudaStreamEndCapture(stream, &graph));
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  for (int i = 0; i < 3; ++i) {
    run.poison();
    CUDA_OK(cudaGraphLaunch(exec, stream));
    sq.wait(stream, 20000);
    ASSERT_TRUE(run.out_bits() == eager_out) << "replay " << i;
    const auto l = run.lse_values();
    ASSERT_EQ(0, std::memcmp(l.data(), eager_lse.data(), l.size() * 4)) << "replay " << i;
  }
  // The same graph with the requests cut differently (cu_seqlens rewritten in place; T and R kept):
  // equal to an eager step on the new cut, and the owner of every token is per-token, so the
  // results are the same tokens' results (rows are independent).
  CUDA_OK(cudaMemcpy(run.cu.p, c2.cu_seqlens.data(), 16, cudaMemcpyHostToDevice));
  run.poison();
  CUDA_OK(cudaGraphLaunch(exec, stream));
  sq.wait(stream, 20000);
  const auto replay2 = run.out_bits();
  run.poison();
  sq.step(run.args, ws.p, sq.workspace_bytes(), stream);
  sq.wait(stream, 20000);
  EXPECT_TRUE(run.out_bits() == replay2);
  const auto d = test::compare_slice(c, 1, 0, replay2, run.lse_values());
  EXPECT_LE(d.rel_l2, 1e-2);
  EXPECT_LE(d.lse_max_abs, 1e-3);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

#else

TEST(ShardqGpu, NeedsNccl) { GTEST_SKIP() << "this build has no NCCL: the ShardQ step over NCCL is not built"; }

#endif

}  // namespace
