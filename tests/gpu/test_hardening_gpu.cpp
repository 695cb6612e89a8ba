// Issue #20 on the GPU: what the host refuses is refused before any launch (nothing written, no
// CUDA error left behind: run these under compute-sanitizer too); device-resident sinks give the
// result smla/params.h documents; a huge capacity of invalid entries gives empty rows, quickly.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include "../common/gpu_test.h"

#include <chrono>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "smla/cuda.h"
#include "smla/numeric.h"
#include "reference/sparse_mla.h"
#include "devtools/testing.h"

namespace {

using namespace smla;
using smla::test::fresh_seed;

void cuda_ok(cudaError_t e, const char* what) { ASSERT_EQ(e, cudaSuccess) << what << ": " << cudaGetErrorString(e); }

// One device allocation holding a copy of host bytes (or `fill` bytes).
struct Dev {
  void* p = nullptr;
  size_t n = 0;
  Dev(const void* host, size_t bytes) : n(bytes) {
    cuda_ok(cudaMalloc(&p, std::max<size_t>(bytes, 16)), "cudaMalloc");
    if (bytes) cuda_ok(cudaMemcpy(p, host, bytes, cudaMemcpyHostToDevice), "H2D");
  }
  Dev(size_t bytes, int fill) : n(bytes) {
    cuda_ok(cudaMalloc(&p, std::max<size_t>(bytes, 16)), "cudaMalloc");
    cuda_ok(cudaMemset(p, fill, std::max<size_t>(bytes, 16)), "memset");
  }
  ~Dev() { cudaFree(p); }
  std::vector<uint8_t> host() const {
    std::vector<uint8_t> h(n);
    if (n) cudaMemcpy(h.data(), p, n, cudaMemcpyDeviceToHost);
    return h;
  }
  template <typename T>
  T* as() const { return static_cast<T*>(p); }
};

smla::testing::ProblemSpec small_spec() {
  smla::testing::ProblemSpec s;
  s.num_tokens = 4, s.num_heads = 4, s.topk = 100, s.num_rows = 512, s.sink = true, s.use_counts = true;
  s.all_invalid_row = true;  // row 0 is empty
  return s;
}

// hp's problem on the device; p points at device copies, out poisoned with 0xff.
struct OnDevice {
  Dev q, kv, idx, counts, sink, out, lse;
  SparseMlaParams p;
  explicit OnDevice(const smla::testing::HostProblem& hp)
      : q(hp.q.data(), hp.q.size()), kv(hp.kv.data(), hp.kv.size()), idx(hp.idx.data(), hp.idx.size() * 4),
        counts(hp.counts.data(), hp.counts.size() * 4), sink(hp.sink.data(), hp.sink.size() * 4),
        out(hp.out.size(), 0xff), lse(hp.lse.size() * 4, 0xff) {
    p = hp.params;
    p.q = q.p, p.kv = kv.p, p.idx = idx.as<const int32_t>(), p.counts = hp.params.counts ? counts.as<const int32_t>() : nullptr;
    p.sink = hp.params.sink ? sink.as<const float>() : nullptr, p.out = out.p, p.lse = lse.as<float>();
  }
  void run() {
    const size_t wsb = cuda::sparse_mla_workspace_bytes(p, cuda::device_info(0).num_sms);
    Dev ws(wsb, 0);
    cuda::sparse_mla(p, ws.p, wsb, nullptr);
    cuda_ok(cudaDeviceSynchronize(), "sparse_mla");
  }
};

TEST(HardeningGpu, RefusedBeforeLaunch) {
  REQUIRE_GPU();
  auto hp = smla::testing::make_problem(small_spec(), fresh_seed());
  OnDevice d(hp);
  const size_t wsb = cuda::sparse_mla_workspace_bytes(d.p, cuda::device_info(0).num_sms);
  Dev ws(wsb, 0);
  struct Bad {
    const char* what;
    SparseMlaParams p;
    const char* words;
  };
  std::vector<Bad> bad;
  bad.push_back({"out inside kv", d.p, "out overlaps"});
  bad.back().p.out = d.kv.p;
  bad.push_back({"lse inside out", d.p, "lse overlaps out"});
  bad.back().p.lse = d.out.as<float>() + 100;
  bad.push_back({"out over idx", d.p, "out overlaps"});
  bad.back().p.out = d.idx.p;
  bad.push_back({"softmax_scale 3e38", d.p, "[-1e4, 1e4]"});
  bad.back().p.softmax_scale = 3e38f;
  bad.push_back({"softmax_scale * q_scale 1e6", d.p, "softmax_scale * q_scale"});
  bad.back().p.softmax_scale = 1e3f, bad.back().p.q_scale = 1e3f;
  for (const auto& b : bad) {
    try {
      cuda::sparse_mla(b.p, ws.p, wsb, nullptr);
      ADD_FAILURE() << b.what << ": accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(b.words), std::string::npos) << b.what << ": " << e.what();
    }
    cuda_ok(cudaDeviceSynchronize(), b.what);
    cuda_ok(cudaGetLastError(), b.what);
  }
  // Nothing was launched: out, lse, kv and idx keep their bytes.
  for (uint8_t v : d.out.host()) ASSERT_EQ(v, 0xff) << "out written by a refused call";
  for (uint8_t v : d.lse.host()) ASSERT_EQ(v, 0xff) << "lse written by a refused call";
  EXPECT_EQ(d.kv.host(), hp.kv);
  std::vector<uint8_t> idx_bytes(hp.idx.size() * 4);
  std::memcpy(idx_bytes.data(), hp.idx.data(), idx_bytes.size());
  EXPECT_EQ(d.idx.host(), idx_bytes);
  // Host-visible sinks (the host-pointer entry point) are checked: NaN and +inf refused.
  for (float v : {NAN, INFINITY}) {
    auto h2 = smla::testing::make_problem(small_spec(), 7);
    h2.sink[2] = v;
    EXPECT_THROW(cuda::sparse_mla_from_host(h2.params, h2.kv_bytes()), Error) << v;
  }
}

// Device sinks are not read by the host; params.h documents the result per head: -inf = no sink,
// +inf = out 0 on non-empty rows, NaN = out NaN on non-empty rows; LSE and empty rows unaffected.
TEST(HardeningGpu, DeviceSinkDefinedResults) {
  REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  auto hp = smla::testing::make_problem(small_spec(), seed);
  hp.sink = {1.0f, -INFINITY, INFINITY, NAN};
  OnDevice d(hp);
  d.run();
  const auto out = d.out.host();
  std::vector<float> lse(hp.lse.size());
  std::memcpy(lse.data(), d.lse.host().data(), lse.size() * 4);
  // The reference without a sink: heads 1 (-inf) and, for LSE, every head.
  auto ref = smla::testing::make_problem(small_spec(), seed);
  ref.params.sink = nullptr;
  reference::sparse_mla(ref.params, 1);
  auto outv = [&](const std::vector<uint8_t>& o, int64_t t, int h, int e) {
    uint16_t v;
    std::memcpy(&v, o.data() + ((t * 4 + h) * 512 + e) * 2, 2);
    return num::bf16_to_f32(v);
  };
  for (int64_t t = 0; t < 4; ++t) {
    const bool empty = ref.lse[size_t(t * 4)] == -INFINITY;
    for (int h = 0; h < 4; ++h) {
      const float l = lse[size_t(t * 4 + h)], rl = ref.lse[size_t(t * 4 + h)];
      if (empty) {
        EXPECT_EQ(l, -INFINITY) << "t " << t << " h " << h;
        for (int e = 0; e < 512; ++e) ASSERT_EQ(outv(out, t, h, e), 0.0f) << "empty row t " << t << " h " << h;
        continue;
      }
      EXPECT_NEAR(l, rl, 1e-3) << "LSE excludes the sink: t " << t << " h " << h;
      double num2 = 0, den2 = 0;
      for (int e = 0; e < 512; ++e) {
        const float g = outv(out, t, h, e), r = outv(ref.out, t, h, e);
        if (h == 1) num2 += double(g - r) * (g - r), den2 += double(r) * r;
        if (h == 2) ASSERT_EQ(g, 0.0f) << "+inf sink: out 0 (t " << t << ")";
        if (h == 3) ASSERT_TRUE(std::isnan(g)) << "NaN sink: out NaN (t " << t << ")";
      }
      if (h == 1) EXPECT_LE(std::sqrt(num2 / den2), 1e-2) << "-inf sink is no sink (t " << t << ")";
    }
  }
}

// K = 4M entries per row, all invalid: no row is read, out 0 and LSE -inf, in well under a second.
TEST(HardeningGpu, HugeCapacityOfInvalidEntries) {
  REQUIRE_GPU();
  const int64_t T = 2;
  const int K = 1 << 22;
  std::vector<int32_t> idx(size_t(T) * K, -1);
  std::vector<uint16_t> q(size_t(T) * 16 * 576, 0x3f80), kv(576, 0x3f80);
  Dev dq(q.data(), q.size() * 2), dkv(kv.data(), kv.size() * 2), didx(idx.data(), idx.size() * 4);
  Dev dout(size_t(T) * 16 * 512 * 2, 0xff), dlse(size_t(T) * 16 * 4, 0xff);
  SparseMlaParams p;
  p.num_tokens = T, p.num_heads = 16, p.topk = K, p.num_rows = 1, p.softmax_scale = 0.1f;
  p.q = dq.p, p.kv = dkv.p, p.idx = didx.as<const int32_t>(), p.out = dout.p, p.lse = dlse.as<float>();
  set_dense_strides(p);
  const size_t wsb = cuda::sparse_mla_workspace_bytes(p, cuda::device_info(0).num_sms);
  Dev ws(wsb, 0);
  cuda::sparse_mla(p, ws.p, wsb, nullptr);  // warm-up (module load)
  cuda_ok(cudaDeviceSynchronize(), "sparse_mla");
  cuda_ok(cudaMemset(dout.p, 0xff, dout.n), "memset");
  const auto t0 = std::chrono::steady_clock::now();
  cuda::sparse_mla(p, ws.p, wsb, nullptr);
  cuda_ok(cudaDeviceSynchronize(), "sparse_mla");
  // 32 MB of indices: milliseconds on an H200; the bound leaves room for compute-sanitizer.
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 5.0);
  for (uint8_t v : dout.host()) ASSERT_EQ(v, 0) << "out of an empty row must be 0";
  std::vector<float> lse(size_t(T) * 16);
  std::memcpy(lse.data(), dlse.host().data(), lse.size() * 4);
  for (float l : lse) EXPECT_EQ(l, -INFINITY);
}

}  // namespace
