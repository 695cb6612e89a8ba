// Issue #20 (hardening) on the core: the CPU reference's memory follows the valid entries and its
// worker errors reach the caller; outputs that overlap inputs or each other are refused;
// non-finite sinks and out-of-range scales are refused with messages that say the accepted range.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "reference/sparse_mla.h"
#include "smla/serving.h"
#include "devtools/testing.h"

namespace {

using namespace smla;

// Runs fn in a forked child whose address space is capped at `limit_bytes`, and returns the
// child's exit code (128 + signal when it died of one, e.g. 134 for std::terminate's abort). A
// CPU reference that sized its buffers by K would need ~10 GB below and fail here, not swap the
// machine.
template <typename Fn>
int run_with_memory_limit(size_t limit_bytes, Fn&& fn) {
  fflush(nullptr);
  const pid_t pid = fork();
  if (pid == 0) {
    rlimit r{limit_bytes, limit_bytes};
    setrlimit(RLIMIT_AS, &r);
    _exit(fn());
  }
  int status = 0;
  waitpid(pid, &status, 0);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return WEXITSTATUS(status);
}

constexpr size_t kLimit = size_t(3) << 30;  // 3 GiB of address space for the whole test process
constexpr int kHugeK = 1 << 22;             // 4M entries per row: K x 576 floats = 9.7 GB per row

// T rows of K = 4M entries, each `fill` (-1: invalid; 0: valid, row 0), with a tiny pool.
struct HugeK {
  int64_t T;
  std::vector<int32_t> idx;
  std::vector<uint16_t> q, kv, out;
  std::vector<float> lse;
  SparseMlaParams p;
  HugeK(int64_t t, int32_t fill) : T(t), idx(size_t(t) * kHugeK, fill), q(size_t(t) * 576, 0x3f80),
                                    kv(576, 0x3f80), out(size_t(t) * 512, 0x7fc0), lse(size_t(t), NAN) {
    p.num_tokens = T, p.num_heads = 1, p.topk = kHugeK;
    p.q = q.data(), p.kv = kv.data(), p.num_rows = 1, p.idx = idx.data();
    p.out = out.data(), p.lse = lse.data(), p.softmax_scale = 0.1f;
    set_dense_strides(p);
  }
};

TEST(ReferenceMemory, HugeCapacityOfInvalidEntriesIsFastAndSmall) {
  for (int threads : {1, 4}) {
    const int rc = run_with_memory_limit(kLimit, [&] {
      HugeK h(4, -1);
      const auto t0 = std::chrono::steady_clock::now();
      try {
        reference::sparse_mla(h.p, threads);
      } catch (...) {
        return 3;
      }
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      for (int64_t t = 0; t < h.T; ++t) {
        if (h.lse[size_t(t)] != -INFINITY) return 4;  // empty row: LSE -inf
        for (int d = 0; d < 512; ++d)
          if (h.out[size_t(t) * 512 + d] != 0) return 5;  // and out 0
      }
      return s < 5.0 ? 0 : 6;
    });
    EXPECT_EQ(rc, 0) << "threads " << threads
                     << ": 3 = threw, 4/5 = wrong empty-row result, 6 = slow, >= 128 = died of a signal";
  }
}

TEST(ReferenceMemory, WorkerOutOfMemoryReachesTheCallerAsError) {
  // Valid entries that cannot fit: every worker's allocation fails; the caller gets one Error.
  for (int threads : {1, 4}) {
    const int rc = run_with_memory_limit(kLimit, [&] {
      HugeK h(4, 0);
      try {
        reference::sparse_mla(h.p, threads);
      } catch (const Error& e) {
        const std::string m = e.what();
        return m.find("CPU reference") != std::string::npos && m.find('\n') == std::string::npos ? 0 : 7;
      } catch (...) {
        return 8;
      }
      return 9;
    });
    EXPECT_EQ(rc, 0) << "threads " << threads
                     << ": 7 = unclear message, 8 = not an Error, 9 = no error, >= 128 = died (std::terminate)";
  }
}

// ---- overlapping outputs --------------------------------------------------------------------

smla::testing::HostProblem small_problem() {
  smla::testing::ProblemSpec s;
  s.num_tokens = 3, s.num_heads = 2, s.topk = 5, s.num_rows = 16;
  return smla::testing::make_problem(s, 11);
}

std::string error_of(const SparseMlaParams& p) {
  try {
    validate(p);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

void expect_overlap(const SparseMlaParams& p, const char* a, const char* b) {
  const std::string m = error_of(p);
  ASSERT_NE(m, "") << a << " inside " << b << " accepted";
  EXPECT_NE(m.find(std::string(a) + " overlaps " + b), std::string::npos) << m;
  // The CPU backend refuses it too (it validates first) and leaves the buffers alone.
  EXPECT_THROW(reference::sparse_mla(p, 1), Error);
}

TEST(Overlap, OutputsInsideInputsOrEachOtherAreRefused) {
  auto hp = small_problem();
  ASSERT_EQ(error_of(hp.params), "");
  SparseMlaParams p = hp.params;
  // lse inside out's buffer (the last head's row of the last token).
  p.lse = reinterpret_cast<float*>(static_cast<uint8_t*>(hp.params.out) + hp.out.size() - 64);
  p.lse_stride_t = 2;
  expect_overlap(p, "lse", "out");
  // out inside the KV rows (the pool is 16 x 1152 bytes; out is 3 x 2 x 512 bf16 = 6 KiB).
  p = hp.params;
  p.out = const_cast<void*>(p.kv);
  expect_overlap(p, "out", "kv");
  // out over the indices, over q, over counts / sink.
  std::vector<uint8_t> big(1 << 16);
  p = hp.params;
  p.out = big.data() + 4096;
  p.idx = reinterpret_cast<const int32_t*>(big.data() + 4096 + 6000);
  expect_overlap(p, "out", "idx");
  p = hp.params;
  p.out = const_cast<void*>(p.q);
  expect_overlap(p, "out", "q");
  p = hp.params;
  p.sink = reinterpret_cast<const float*>(hp.params.lse + 1);
  expect_overlap(p, "lse", "sink");
  // Touching (end == begin) is not overlapping: out right after lse in one buffer.
  p = hp.params;
  p.lse = reinterpret_cast<float*>(big.data());
  p.out = big.data() + 3 * 2 * 4;
  EXPECT_EQ(error_of(p), "");
  // lse off: its pointer is not an output.
  p = hp.params;
  p.lse = static_cast<float*>(p.out);
  p.lse_mode = LseMode::kOff;
  EXPECT_EQ(error_of(p), "");
}

TEST(Overlap, StridesReachingPastTheAddressSpaceAreRefused) {
  auto hp = small_problem();
  SparseMlaParams p = hp.params;
  p.q_stride_t = int64_t(1) << 62;
  const std::string m = error_of(p);
  EXPECT_NE(m.find("q strides"), std::string::npos) << m;
}

// ---- sink and scales ------------------------------------------------------------------------

TEST(Sink, NanOrPlusInfinityRefusedOnHostMinusInfinityMeansNone) {
  smla::testing::ProblemSpec s;
  s.num_tokens = 2, s.num_heads = 3, s.topk = 7, s.sink = true, s.num_rows = 32;
  for (float bad : {NAN, INFINITY}) {
    auto hp = smla::testing::make_problem(s, 5);
    hp.sink[1] = bad;
    try {
      reference::sparse_mla(hp.params, 1);
      ADD_FAILURE() << "sink " << bad << " accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("sink[1]"), std::string::npos) << e.what();
    }
  }
  // -inf: exactly the result without a sink.
  auto a = smla::testing::make_problem(s, 5), b = smla::testing::make_problem(s, 5);
  for (auto& v : a.sink) v = -INFINITY;
  b.params.sink = nullptr;
  reference::sparse_mla(a.params, 1);
  reference::sparse_mla(b.params, 1);
  EXPECT_EQ(a.out, b.out);
  EXPECT_EQ(a.lse, b.lse);
  for (int64_t t = 0; t < s.num_tokens; ++t)
    for (int h = 0; h < s.num_heads; ++h)
      for (int d = 0; d < 512; ++d) ASSERT_FALSE(std::isnan(smla::testing::out_value(a, t, h, d)));
}

TEST(Scale, HugeOrNonFiniteScalesSayTheAcceptedRange) {
  auto hp = small_problem();
  for (float v : {3e38f, INFINITY, NAN, -2e4f}) {
    SparseMlaParams p = hp.params;
    p.softmax_scale = v;
    const std::string m = error_of(p);
    EXPECT_NE(m.find("softmax_scale must be finite and in [-1e4, 1e4]"), std::string::npos) << v << ": " << m;
  }
  // Each scale in range, the product not.
  SparseMlaParams p = hp.params;
  p.softmax_scale = 1e3f, p.q_scale = 1e3f;
  EXPECT_NE(error_of(p).find("softmax_scale * q_scale must lie in [-1e4, 1e4]"), std::string::npos) << error_of(p);
  p.softmax_scale = 1e4f, p.q_scale = 1.0f;
  EXPECT_EQ(error_of(p), "");
  // The edge of the range gives finite LSE on data of unit size.
  p.softmax_scale = 1e4f;
  reference::sparse_mla(p, 1);
  for (float l : hp.lse) EXPECT_TRUE(std::isfinite(l) || l == -INFINITY) << l;
}

}  // namespace

// ---- the empty-row finisher's shapes: the error blames the mismatch, naming both -------------

namespace {
TEST(FinishEmptyShapes, MismatchNamesCountsAndOut) {
  try {
    smla::check_finish_empty_shapes(5, 3, -1);
    ADD_FAILURE() << "5 counts for 3 rows accepted";
  } catch (const smla::Error& e) {
    EXPECT_NE(std::string(e.what()).find("counts has 5 entries but out has 3 rows"), std::string::npos) << e.what();
  }
  EXPECT_THROW(smla::check_finish_empty_shapes(3, 3, 2), smla::Error);
  EXPECT_NO_THROW(smla::check_finish_empty_shapes(3, 3, 3));
  EXPECT_NO_THROW(smla::check_finish_empty_shapes(0, 0, -1));
}
}  // namespace
