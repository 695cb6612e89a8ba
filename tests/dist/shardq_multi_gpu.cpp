// ShardQ prefill over NCCL on W GPUs, one process per GPU (DESIGN.md §5b), forked by dist::run_ranks.
//
//   smla_shardq_multi_gpu [--world W]       correctness: every KV format (16-bit q, and an e4m3 q
//                                           with fp8_ds_mla) against the float64 reference of the
//                                           unsharded call (out rel L2 <= 1e-2, LSE abs <= 1e-3 on
//                                           each rank's heads), with requests shorter than 2·W
//                                           tokens and an empty one, padded slots (planned for more
//                                           tokens and requests than the step has); the bf16 case
//                                           also captured in a CUDA graph and replayed bit-identically,
//                                           then replayed on another cut of the same tokens into
//                                           requests; ShardQ::device() is the communicator's, a
//                                           step runs there with another device current, and a
//                                           workspace one byte short is refused before anything
//                                           is enqueued
//   smla_shardq_multi_gpu --world W --fail  failure, default (blocking) communicator: both ranks run
//                                           a step, then rank 1 leaves; rank 0's next step waits on
//                                           the GPU for it, ShardQ's watchdog aborts the communicator,
//                                           and rank 0's wait() throws within the timeout + slack
//   ... --fail --nonblocking                failure, nonblocking communicator: rank 1 leaves right
//                                           after joining; rank 0's first all-to-all (connection
//                                           setup to the lost peer) throws within the timeout
//   smla_shardq_multi_gpu --world 1 --watchdog
//                                           the watchdog on one GPU with a simulated hang (as
//                                           smla_dcp_multi_gpu --world 1 --watchdog): a kernel spinning
//                                           on a host flag holds the step's stream. A step held for
//                                           0.6 x timeout is not aborted; a step held for good is:
//                                           wait() throws within timeout + slack, the next step()
//                                           throws at once, as do another ShardQ and a Dcp on the
//                                           same communicator, and after the flag is released
//                                           everything cleans up without a hang. Then ShardQ::wait's
//                                           own timeout with the watchdog off.
//
// Exit 0 on success, 1 on failure, 77 (CTest: skipped) when fewer than W GPUs are visible.
#include <cuda_runtime.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "../common/shardq_case.h"
#include "devtools/bench_support.h"
#include "devtools/launch.h"
#include "smla/cuda.h"
#include "smla/dist.h"

namespace {

using namespace smla;

void* upload_bytes(const void* src, size_t bytes) {
  void* p = nullptr;
  if (cudaMalloc(&p, std::max<size_t>(bytes, 16)) != cudaSuccess) fail("cudaMalloc");
  if (bytes && cudaMemcpy(p, src, bytes, cudaMemcpyHostToDevice) != cudaSuccess) fail("H2D");
  return p;
}
template <class T>
T* upload(const std::vector<T>& v) {
  return static_cast<T*>(upload_bytes(v.data(), v.size() * sizeof(T)));
}

struct Result {
  int passed = 0, failed = 0;
};

void run_case(void* comm, int world, int rank, KvFormat format, DType q_dtype, bool extras, Result& res) {
  const int H = 16 * world, Hs = H / world;
  // Requests of 37, 1, 0, 2, 3 and 20 tokens: an empty one and three shorter than 2·W (W = 2).
  const auto c = test::make_shardq_case(format, q_dtype, H, {37, 1, 0, 2, 3, 20}, 7000 + uint64_t(format) * 10 +
                                                                                     uint64_t(q_dtype));
  dist::ShardQ sq(comm, test::shardq_config(c, world, rank, format, c.T + 40, 9));
  if (sq.device() != rank) fail("ShardQ::device() is " + std::to_string(sq.device()) + ", not " + std::to_string(rank));
  void* d_ws = nullptr;
  if (cudaMalloc(&d_ws, sq.workspace_bytes()) != cudaSuccess) fail("cudaMalloc of the ShardQ workspace");
  auto* d_q = upload(test::local_q(c, world, rank));
  auto* d_idx = upload(c.host.idx);
  auto* d_counts = upload(c.host.counts);
  auto* d_kv = upload(c.host.kv);
  auto* d_cu = upload(c.cu_seqlens);
  std::vector<uint16_t> out(size_t(c.T * Hs * 512), 0xffff);
  std::vector<float> lse(size_t(c.T * Hs), NAN);
  auto* d_out = upload(out);
  auto* d_lse = upload(lse);
  const auto& hp = c.host.params;
  dist::ShardqStepArgs a;
  a.num_tokens = c.T, a.num_requests = int(c.lens.size()), a.cu_seqlens = d_cu, a.q = d_q, a.idx = d_idx;
  a.idx_stride_t = hp.idx_stride_t, a.counts = d_counts, a.kv = d_kv, a.num_rows = hp.num_rows;
  a.kv_row_stride_bytes = hp.kv_row_stride_bytes, a.softmax_scale = hp.softmax_scale, a.q_scale = hp.q_scale;
  a.k_scale = hp.k_scale, a.out = d_out, a.lse = d_lse;
  cudaStream_t stream;
  cudaStreamCreate(&stream);
  bool refused = false;  // a workspace one byte short fails on the host, naming the size
  try {
    sq.step(a, d_ws, sq.workspace_bytes() - 1, stream);
  } catch (const Error& e) {
    refused = std::string(e.what()).find(std::to_string(sq.workspace_bytes())) != std::string::npos;
  }
  const bool other_current = extras && world > 1;  // the step runs on the communicator's device
  if (other_current) cudaSetDevice((rank + 1) % world);
  sq.step(a, d_ws, sq.workspace_bytes(), stream);
  if (other_current) cudaSetDevice(rank);
  sq.wait(stream, 20000);
  cudaMemcpy(out.data(), d_out, out.size() * 2, cudaMemcpyDeviceToHost);
  cudaMemcpy(lse.data(), d_lse, lse.size() * 4, cudaMemcpyDeviceToHost);
  const auto d = test::compare_slice(c, world, rank, out, lse);
  bool ok = d.rel_l2 <= 1e-2 && d.lse_max_abs <= 1e-3 && refused;

  std::string graph_note;
  if (extras) {  // captured and replayed: bit-identical; then the same graph on another cut of the tokens
    cudaMemset(d_out, 0xff, out.size() * 2);
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    bool graph_ok = cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal) == cudaSuccess;
    if (graph_ok) {
      sq.step(a, d_ws, sq.workspace_bytes(), stream);
      graph_ok = cudaStreamEndCapture(stream, &graph) == cudaSuccess &&
                 cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess;
    }
    for (int i = 0; graph_ok && i < 3; ++i) graph_ok = cudaGraphLaunch(exec, stream) == cudaSuccess;
    if (graph_ok) sq.wait(stream, 20000);
    std::vector<uint16_t> replayed(out.size());
    graph_ok = graph_ok && cudaMemcpy(replayed.data(), d_out, out.size() * 2, cudaMemcpyDeviceToHost) == cudaSuccess &&
               replayed == out;
    // Another cut of the same 63 tokens into 6 requests (T and R kept): other owners and slots, and
    // every token still gets its own result (held to the reference).
    const std::vector<int32_t> cu2 = {0, 3, 3, 40, 41, 62, 63};
    bool cut_ok = graph_ok && cudaMemcpy(d_cu, cu2.data(), cu2.size() * 4, cudaMemcpyHostToDevice) == cudaSuccess &&
                  cudaMemset(d_out, 0xff, out.size() * 2) == cudaSuccess && cudaGraphLaunch(exec, stream) == cudaSuccess;
    if (cut_ok) sq.wait(stream, 20000);
    std::vector<uint16_t> out2(out.size());
    std::vector<float> lse2(lse.size());
    cut_ok = cut_ok && cudaMemcpy(out2.data(), d_out, out2.size() * 2, cudaMemcpyDeviceToHost) == cudaSuccess &&
             cudaMemcpy(lse2.data(), d_lse, lse2.size() * 4, cudaMemcpyDeviceToHost) == cudaSuccess;
    const auto d2 = test::compare_slice(c, world, rank, out2, lse2);
    cut_ok = cut_ok && d2.rel_l2 <= 1e-2 && d2.lse_max_abs <= 1e-3;
    cudaMemcpy(d_cu, c.cu_seqlens.data(), c.cu_seqlens.size() * 4, cudaMemcpyHostToDevice);
    graph_note = std::string(graph_ok ? "  graph replay bit-identical" : "  graph replay FAILED") +
                 (cut_ok ? ", replay on another cut within the bar" : ", replay on another cut FAILED");
    ok = ok && graph_ok && cut_ok;
    if (exec) cudaGraphExecDestroy(exec);
    if (graph) cudaGraphDestroy(graph);
  }
  ok ? ++res.passed : ++res.failed;
  std::printf("rank %d  W=%d %-12s q %-5s T=%lld H=%d slots=%lld  out rel L2 %.3e  lse max abs %.3e  %s%s%s%s\n", rank,
              world, std::string(to_string(format)).c_str(), std::string(to_string(q_dtype)).c_str(), (long long)c.T,
              H, (long long)sq.slots(), d.rel_l2, d.lse_max_abs, ok ? "PASS" : "FAIL", graph_note.c_str(),
              refused ? "" : "  short workspace NOT refused", other_current ? "  (stepped with another device current)" : "");
  for (void* p : {static_cast<void*>(d_q), static_cast<void*>(d_idx), static_cast<void*>(d_counts),
                  static_cast<void*>(d_kv), static_cast<void*>(d_cu), static_cast<void*>(d_out),
                  static_cast<void*>(d_lse), d_ws})
    cudaFree(p);
  cudaStreamDestroy(stream);
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// A small step (16 heads per rank, bf16, requests of 40 and 9 tokens) on rank `rank` of `world`, with
// its buffers.
struct SmallStep {
  test::ShardqCase c;
  dist::ShardqStepArgs a;
  std::vector<void*> owned;
  SmallStep(int world, int rank) : c(test::make_shardq_case(KvFormat::kBF16, DType::kBF16, 16 * world, {40, 9}, 5)) {
    const auto& hp = c.host.params;
    a.num_tokens = c.T, a.num_requests = 2, a.cu_seqlens = keep(upload(c.cu_seqlens));
    a.q = keep(upload(test::local_q(c, world, rank)));
    a.idx = keep(upload(c.host.idx)), a.idx_stride_t = hp.idx_stride_t, a.counts = keep(upload(c.host.counts));
    a.kv = keep(upload(c.host.kv)), a.num_rows = hp.num_rows, a.kv_row_stride_bytes = hp.kv_row_stride_bytes;
    a.softmax_scale = hp.softmax_scale, a.q_scale = hp.q_scale, a.k_scale = hp.k_scale;
    a.out = keep(upload(std::vector<uint16_t>(size_t(c.T * 16 * 512))));
    a.lse = keep(upload(std::vector<float>(size_t(c.T * 16))));
  }
  ~SmallStep() {
    for (void* p : owned) cudaFree(p);
  }
  dist::ShardqConfig config(int world, int rank, int timeout_ms) const {
    auto cfg = test::shardq_config(c, world, rank, KvFormat::kBF16, c.T, 2);
    cfg.timeout_ms = timeout_ms;
    return cfg;
  }
  // This rank's out and lse against the reference of the unsharded call.
  test::SliceDiff check(int world, int rank) const {
    std::vector<uint16_t> out(size_t(c.T * 16 * 512));
    std::vector<float> lse(size_t(c.T * 16));
    cudaMemcpy(out.data(), a.out, out.size() * 2, cudaMemcpyDeviceToHost);
    cudaMemcpy(lse.data(), a.lse, lse.size() * 4, cudaMemcpyDeviceToHost);
    return test::compare_slice(c, world, rank, out, lse);
  }
  template <class P>
  P* keep(P* p) {
    owned.push_back(const_cast<void*>(static_cast<const void*>(p)));
    return p;
  }
};

void* alloc_workspace(size_t bytes) {
  void* p = nullptr;
  if (cudaMalloc(&p, std::max<size_t>(bytes, 16)) != cudaSuccess) fail("cudaMalloc of the ShardQ workspace");
  return p;
}

// Rank failure on two GPUs, as smla_dcp_multi_gpu --fail. Default (blocking) communicator: both
// ranks finish one step (every connection the step needs is made), then rank 1 leaves; rank 0's
// next step waits on the GPU for it and must end in an error from the watchdog (or NCCL's
// asynchronous error) within the timeout. Nonblocking: rank 1 leaves right after joining; rank 0's
// first all-to-all settles into an error.
int failure_main(int world, int rank, const std::vector<uint8_t>& id, bool nonblocking) {
  void* comm = dist::make_comm(id, world, rank, 60000, nonblocking);
  const int timeout_ms = 3000;
  SmallStep st(world, rank);
  dist::ShardQ sq(comm, st.config(world, rank, timeout_ms));
  void* d_ws = alloc_workspace(sq.workspace_bytes());
  cudaStream_t stream;
  cudaStreamCreate(&stream);
  if (!nonblocking) {
    sq.step(st.a, d_ws, sq.workspace_bytes(), stream);
    sq.wait(stream, 60000);
  }
  if (rank == 1) _exit(0);  // leaves without taking part (and without destroying the communicator)
  const auto t0 = std::chrono::steady_clock::now();
  bool raised = false;
  std::string msg;
  try {
    sq.step(st.a, d_ws, sq.workspace_bytes(), stream);
    sq.wait(stream, 10 * timeout_ms);  // longer than the watchdog's: the watchdog (or the settling call) acts first
  } catch (const Error& e) {
    raised = true;
    msg = e.what();
  }
  const double s = seconds_since(t0);
  const bool ok = raised && s < timeout_ms / 1000.0 + 10.0 && msg.find("ShardQ: rank 0: ") != std::string::npos &&
                  msg.find("aborted") != std::string::npos && sq.aborted();
  std::printf("rank 0: failure test (%s communicator): %s after %.2f s (%s)%s\n%d passed, %d failed\n",
              nonblocking ? "nonblocking" : "blocking, watchdog", raised ? "error raised" : "NO error", s, msg.c_str(),
              sq.aborted() ? "" : " [ShardQ::aborted() is false]", ok ? 1 : 0, ok ? 0 : 1);
  std::fflush(stdout);
  _exit(ok ? 0 : 1);  // the aborted communicator and the stuck stream are left to process exit
}

// The watchdog on one GPU (world 1), with a hang simulated by a kernel that spins on a host flag
// ahead of the step on its stream: the step's completion event cannot fire until the flag is set.
int watchdog_main(const std::vector<uint8_t>& id) {
  const int timeout_ms = 2000;
  const double slack_s = 1.0;  // the watchdog polls every timeout/8 (250 ms); the rest is scheduling
  int passed = 0, failed = 0;
  auto report = [&](bool ok, const std::string& what) {
    ok ? ++passed : ++failed;
    std::printf("watchdog: %-4s %s\n", ok ? "PASS" : "FAIL", what.c_str());
    std::fflush(stdout);
  };
  uint32_t* flag = nullptr;
  if (cudaHostAlloc(reinterpret_cast<void**>(&flag), 4, cudaHostAllocMapped) != cudaSuccess) fail("cudaHostAlloc");
  uint32_t* flag_dev = nullptr;
  if (cudaHostGetDevicePointer(reinterpret_cast<void**>(&flag_dev), flag, 0) != cudaSuccess)
    fail("cudaHostGetDevicePointer");
  auto set_flag = [&](uint32_t v) { *reinterpret_cast<volatile uint32_t*>(flag) = v; };
  cudaStream_t stream;
  cudaStreamCreate(&stream);
  SmallStep st(1, 0);
  void* comm = dist::make_comm(id, 1, 0);  // the default: blocking
  {
    dist::ShardQ sq(comm, st.config(1, 0, timeout_ms));
    void* d_ws = alloc_workspace(sq.workspace_bytes());
    const size_t ws = sq.workspace_bytes();
    // Two more step objects on the same communicator: another ShardQ (planned for more tokens) and a
    // Dcp. They share the communicator's lock and fate, so the first one's abort must stop them too.
    auto cfg_b = st.config(1, 0, timeout_ms);
    cfg_b.max_tokens = 2 * st.c.T;
    dist::ShardQ other(comm, cfg_b);
    void* d_ws_b = alloc_workspace(other.workspace_bytes());
    other.step(st.a, d_ws_b, other.workspace_bytes(), stream);
    dist::DcpConfig dcp_cfg;
    dcp_cfg.local_heads = 8, dcp_cfg.topk = 200, dcp_cfg.max_rows = 1, dcp_cfg.timeout_ms = timeout_ms;
    dist::Dcp dcp(comm, dcp_cfg);

    sq.step(st.a, d_ws, ws, stream);
    sq.wait(stream, 20000);
    const auto d = st.check(1, 0);
    char line0[256];
    std::snprintf(line0, sizeof line0, "a plain step runs (out rel L2 %.3e, lse max abs %.3e)", d.rel_l2,
                  d.lse_max_abs);
    report(!sq.aborted() && d.rel_l2 <= 1e-2 && d.lse_max_abs <= 1e-3, line0);

    // A healthy slow step: the stream is held for 0.6 x timeout after step() enqueued it.
    set_flag(0);
    cuda::gpu_wait_host_flag(flag_dev, stream);
    sq.step(st.a, d_ws, ws, stream);
    std::this_thread::sleep_for(std::chrono::milliseconds(timeout_ms * 6 / 10));
    set_flag(1);
    bool slow_ok = true;
    std::string slow_msg;
    try {
      sq.wait(stream, 20000);
      std::this_thread::sleep_for(std::chrono::milliseconds(timeout_ms / 2));  // a late watchdog tick must not fire
      sq.step(st.a, d_ws, ws, stream);
      sq.wait(stream, 20000);
    } catch (const Error& e) {
      slow_ok = false;
      slow_msg = e.what();
    }
    report(slow_ok && !sq.aborted(),
           "a step held 0.6 x timeout is not aborted" + (slow_msg.empty() ? "" : ": " + slow_msg));

    // A hang: the stream is held until after the checks.
    set_flag(0);
    cuda::gpu_wait_host_flag(flag_dev, stream);
    const auto t0 = std::chrono::steady_clock::now();
    sq.step(st.a, d_ws, ws, stream);
    std::string msg;
    try {
      sq.wait(stream, 10 * timeout_ms);  // longer than the watchdog's timeout: the watchdog must act first
    } catch (const Error& e) {
      msg = e.what();
    }
    const double s = seconds_since(t0);
    const bool in_time = !msg.empty() && s >= timeout_ms / 1000.0 && s <= timeout_ms / 1000.0 + slack_s;
    const bool named = msg.find("ShardQ: rank 0: ") != std::string::npos &&
                       msg.find("did not finish within " + std::to_string(timeout_ms) + " ms") != std::string::npos &&
                       msg.find("the communicator was aborted") != std::string::npos;
    char line[512];
    std::snprintf(line, sizeof line, "a held step: wait() threw after %.2f s (timeout %.1f s + %.1f s slack): %s", s,
                  timeout_ms / 1000.0, slack_s, msg.empty() ? "NO error" : msg.c_str());
    report(in_time && named && sq.aborted(), line);

    std::string next_msg;
    const auto t1 = std::chrono::steady_clock::now();
    try {
      sq.step(st.a, d_ws, ws, stream);
    } catch (const Error& e) {
      next_msg = e.what();
    }
    report(next_msg == msg && seconds_since(t1) < 0.1, "the next step() throws the same error at once");
    std::string other_msg;
    try {
      other.step(st.a, d_ws_b, other.workspace_bytes(), stream);
    } catch (const Error& e) {
      other_msg = e.what();
    }
    report(other_msg == msg && other.aborted(),
           "another ShardQ on the same communicator throws it too: " + (other_msg.empty() ? "NO error" : other_msg));
    std::string dcp_msg;
    try {
      dcp.step(dist::DcpStepArgs{}, nullptr, 0, stream);  // an empty step: the recorded failure comes first
    } catch (const Error& e) {
      dcp_msg = e.what();
    }
    report(dcp_msg == msg && dcp.aborted(),
           "a Dcp on the same communicator throws it too: " + (dcp_msg.empty() ? "NO error" : dcp_msg));

    set_flag(1);  // the held kernel ends; what was queued behind it runs (NCCL's part is a copy at W = 1)
    const auto t2 = std::chrono::steady_clock::now();
    const cudaError_t sync = cudaStreamSynchronize(stream);
    report(sync == cudaSuccess && seconds_since(t2) < 5.0,
           std::string("after the release the stream drains: ") + cudaGetErrorString(sync));
    cudaFree(d_ws);
    cudaFree(d_ws_b);
  }  // ~Dcp, ~ShardQ join the watchdogs (the abort done)
  dist::destroy_comm(comm);  // already aborted (freed): skipped
  report(true, "ShardQ destroyed and destroy_comm returned after the abort");

  // Watchdog off: ShardQ::wait's own timeout still bounds a held step.
  {
    void* comm2 = dist::make_comm(dist::make_unique_id(), 1, 0);
    auto cfg = st.config(1, 0, timeout_ms);
    cfg.watchdog = false;
    dist::ShardQ sq(comm2, cfg);
    void* d_ws = alloc_workspace(sq.workspace_bytes());
    set_flag(0);
    cuda::gpu_wait_host_flag(flag_dev, stream);
    sq.step(st.a, d_ws, sq.workspace_bytes(), stream);
    const auto t3 = std::chrono::steady_clock::now();
    // wait() aborts in this thread, and ncclCommAbort may wait for the device to let go of the
    // communicator's memory, which our spinning kernel (unlike NCCL's own) does not do on abort:
    // another thread releases it after 1 s.
    std::thread releaser([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(1000));
      set_flag(1);
    });
    std::string msg;
    try {
      sq.wait(stream, 500);
    } catch (const Error& e) {
      msg = e.what();
    }
    const double s = seconds_since(t3);
    releaser.join();
    cudaStreamSynchronize(stream);
    report(msg.find("did not finish within 500 ms") != std::string::npos && s >= 0.5 && s < 1.0 + slack_s &&
               sq.aborted(),
           "watchdog off: wait(500 ms) throws after " + std::to_string(s) + " s (the abort may wait for the 1 s "
           "release): " + msg);
    cudaFree(d_ws);
    dist::destroy_comm(comm2);
  }
  cudaStreamDestroy(stream);
  cudaFreeHost(flag);
  std::printf("watchdog: %d passed, %d failed\n", passed, failed);
  return failed ? 1 : 0;
}

int rank_main(int world, int rank, const std::vector<uint8_t>& id, bool fail_mode, bool nonblocking, bool watchdog) {
  if (cudaSetDevice(rank) != cudaSuccess) return 1;
  if (watchdog) return watchdog_main(id);
  if (fail_mode) return failure_main(world, rank, id, nonblocking);
  void* comm = dist::make_comm(id, world, rank, 60000, nonblocking);
  Result res;
  const std::pair<KvFormat, DType> cases[] = {
      {KvFormat::kBF16, DType::kBF16},     {KvFormat::kFP16, DType::kFP16},       {KvFormat::kFP8E4M3, DType::kBF16},
      {KvFormat::kFP8DsMla, DType::kBF16}, {KvFormat::kNvFP4DsMla, DType::kBF16}, {KvFormat::kFP8DsMla, DType::kE4M3}};
  for (const auto& [f, q] : cases) run_case(comm, world, rank, f, q, /*extras=*/f == KvFormat::kBF16, res);
  dist::destroy_comm(comm);
  std::printf("rank %d: %d passed, %d failed\n", rank, res.passed, res.failed);
  return res.failed ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  int world = 2;
  bool fail_mode = false, nonblocking = false, watchdog = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--world") && i + 1 < argc) world = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--fail")) fail_mode = true;
    else if (!std::strcmp(argv[i], "--nonblocking")) nonblocking = true;
    else if (!std::strcmp(argv[i], "--watchdog")) watchdog = true;
    else {
      std::printf("unknown argument %s (use --world W, --fail, --nonblocking, --watchdog)\n", argv[i]);
      return 2;
    }
  }
  if (fail_mode && world < 2) {
    std::printf("the failure test needs --world >= 2\n");
    return 2;
  }
  if (watchdog && world != 1) {
    std::printf("--watchdog runs on one GPU: use --world 1\n");
    return 2;
  }
  const int failures = smla::dist::run_ranks(world, [&](int rank, const std::vector<uint8_t>& id) {
    return rank_main(world, rank, id, fail_mode, nonblocking, watchdog);
  });
  if (failures < 0) {
    std::printf("skipped: ShardQ over NCCL needs %d GPUs (GPU test not run)\n", world);
    return 77;
  }
  std::printf("shardq %s W=%d%s: %s\n", watchdog ? "watchdog test" : fail_mode ? "failure test" : "correctness", world,
              nonblocking ? " (nonblocking communicator)" : "", failures ? "FAILED" : "passed");
  return failures ? 1 : 0;
}
