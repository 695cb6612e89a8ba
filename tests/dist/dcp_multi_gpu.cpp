// DCP over NCCL on W GPUs, one process per GPU (DESIGN.md §5), forked by dist::run_ranks.
//
//   smla_dcp_multi_gpu [--world W]          correctness: every case vs the float64-free CPU
//                                           reference on the unsharded cache (out rel L2 <= 1e-2,
//                                           LSE abs <= 1e-3), both merge paths, interleave 1 and 64;
//                                           Dcp::device() is the communicator's, a step runs there
//                                           with another device current, and a workspace one byte
//                                           short is refused before anything is enqueued
//   smla_dcp_multi_gpu --world W --fail     failure, default (blocking) communicator: both ranks run
//                                           a step, then rank 1 leaves; rank 0's next step waits on
//                                           the GPU for it, Dcp's watchdog aborts the communicator,
//                                           and rank 0's wait() throws within the timeout + slack
//   ... --fail --nonblocking                failure, nonblocking communicator: rank 1 leaves right
//                                           after joining; rank 0's first NCCL call (connection setup
//                                           to the lost peer) throws within the timeout
//   smla_dcp_multi_gpu --world 1 --watchdog the watchdog on one GPU with a simulated hang: a kernel
//                                           spinning on a host flag holds the step's stream. A step
//                                           held for 0.6 x timeout is not aborted; a step held for
//                                           good is: wait() throws within timeout + slack, the next
//                                           step() throws at once, and after the flag is released
//                                           everything cleans up without a hang; a second Dcp on the
//                                           same communicator throws the same error. Then Dcp::wait's own
//                                           timeout with the watchdog off.
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

#include "../common/dcp_case.h"
#include "devtools/bench_support.h"
#include "devtools/launch.h"
#include "smla/cuda.h"
#include "smla/dcp.h"
#include "smla/dist.h"

namespace {

using namespace smla;

template <class T>
T* upload(const std::vector<T>& v) {
  void* p = nullptr;
  if (cudaMalloc(&p, std::max<size_t>(1, v.size() * sizeof(T))) != cudaSuccess) fail("cudaMalloc");
  if (!v.empty() && cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice) != cudaSuccess) fail("H2D");
  return static_cast<T*>(p);
}

struct Result {
  int passed = 0, failed = 0;
};

// One correctness case on this rank; prints a line per case on rank 0.
void run_case(void* comm, int world, int rank, KvFormat format, int interleave, bool all_to_all, bool capture_graph,
              Result& res) {
  const int Hl = 8, H = Hl * world;
  const auto c = smla::test::make_dcp_case(4242 + interleave, interleave, format, H);
  std::vector<float> ref_out, ref_lse;
  smla::test::dcp_case_reference(c, ref_out, ref_lse);
  const auto shards = dcp::shard_cache(c.req_rows, c.row_bytes, world, interleave, 64, 80);
  const auto& shard = shards[size_t(rank)];

  // This rank's heads of q, dense [T, Hl, 576].
  std::vector<uint16_t> q_local(size_t(c.T * Hl * 576));
  for (int64_t t = 0; t < c.T; ++t)
    std::memcpy(q_local.data() + t * Hl * 576, c.q.data() + (t * H + rank * Hl) * 576, size_t(Hl) * 576 * 2);

  dist::DcpConfig cfg;
  cfg.world = world, cfg.rank = rank, cfg.interleave = interleave, cfg.local_heads = Hl, cfg.format = format;
  cfg.q_dtype = format == KvFormat::kFP16 ? DType::kFP16 : DType::kBF16, cfg.topk = c.K, cfg.max_rows = c.T;
  cfg.all_to_all = all_to_all;
  dist::Dcp dcp(comm, cfg);
  if (dcp.device() != rank) fail("Dcp::device() is " + std::to_string(dcp.device()) + ", not the communicator's " +
                                 std::to_string(rank));
  void* d_ws = nullptr;
  if (cudaMalloc(&d_ws, dcp.workspace_bytes()) != cudaSuccess) fail("cudaMalloc of the DCP workspace");

  auto* d_q = upload(q_local);
  auto* d_pos = upload(c.positions);
  auto* d_req = upload(c.req_of_token);
  auto* d_table = upload(shard.block_table);
  auto* d_kv = upload(shard.rows);
  std::vector<uint16_t> out(size_t(c.T * Hl * 512), 0xffff);
  std::vector<float> lse(size_t(c.T * Hl), NAN);
  auto* d_out = upload(out);
  auto* d_lse = upload(lse);
  dist::DcpStepArgs a;
  a.num_tokens = c.T, a.q = d_q, a.positions = d_pos, a.req_of_token = d_req, a.block_table = d_table;
  a.bt_stride = shard.max_blocks, a.num_reqs = shard.num_reqs, a.max_blocks = shard.max_blocks;
  a.block_size = shard.block_size, a.block_stride_rows = shard.block_stride_rows;
  a.kv = d_kv, a.num_rows = shard.num_rows(), a.kv_row_stride_bytes = shard.row_bytes;
  a.softmax_scale = c.softmax_scale, a.out = d_out, a.lse = d_lse;
  cudaStream_t stream;
  cudaStreamCreate(&stream);
  // A workspace one byte short fails on the host, naming the size, before anything is enqueued.
  bool refused = false;
  try {
    dcp.step(a, d_ws, dcp.workspace_bytes() - 1, stream);
  } catch (const Error& e) {
    refused = std::string(e.what()).find(std::to_string(dcp.workspace_bytes())) != std::string::npos;
  }
  // The step runs on the communicator's device whichever device is current (here another rank's).
  const bool other_current = world > 1 && format == KvFormat::kBF16 && interleave == 1 && !all_to_all;
  if (other_current) cudaSetDevice((rank + 1) % world);
  dcp.step(a, d_ws, dcp.workspace_bytes(), stream);
  if (other_current) cudaSetDevice(rank);
  dcp.wait(stream, 20000);
  cudaMemcpy(out.data(), d_out, out.size() * 2, cudaMemcpyDeviceToHost);
  cudaMemcpy(lse.data(), d_lse, lse.size() * 4, cudaMemcpyDeviceToHost);

  double num2 = 0, den2 = 0, lse_err = 0;
  int64_t bad = 0;
  for (int64_t t = 0; t < c.T; ++t)
    for (int hl = 0; hl < Hl; ++hl) {
      const int64_t gi = t * H + rank * Hl + hl, li = t * Hl + hl;
      for (int d = 0; d < 512; ++d) {
        const uint16_t b = out[size_t(li * 512 + d)];
        const double v = format == KvFormat::kFP16 ? num::fp16_to_f32(b) : num::bf16_to_f32(b);
        const double r = ref_out[size_t(gi * 512 + d)];
        if (!std::isfinite(v)) ++bad;
        num2 += (v - r) * (v - r), den2 += r * r;
      }
      const double rl = ref_lse[size_t(gi)], gl = lse[size_t(li)];
      if (std::isinf(rl)) lse_err = std::max(lse_err, (std::isinf(gl) && gl < 0) ? 0.0 : INFINITY);
      else lse_err = std::max(lse_err, std::isfinite(gl) ? std::fabs(gl - rl) : INFINITY);
    }
  const double rel = bad ? INFINITY : std::sqrt(num2 / den2);
  bool ok = rel <= 1e-2 && lse_err <= 1e-3 && refused;

  // The step captured in a CUDA graph and replayed gives the eager result bit for bit.
  std::string graph_note;
  if (capture_graph) {
    cudaMemset(d_out, 0xff, out.size() * 2);
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    bool graph_ok = cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal) == cudaSuccess;
    if (graph_ok) {
      dcp.step(a, d_ws, dcp.workspace_bytes(), stream);
      graph_ok = cudaStreamEndCapture(stream, &graph) == cudaSuccess &&
                 cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess;
    }
    for (int i = 0; graph_ok && i < 3; ++i) graph_ok = cudaGraphLaunch(exec, stream) == cudaSuccess;
    if (graph_ok) dcp.wait(stream, 20000);
    std::vector<uint16_t> replayed(out.size());
    graph_ok = graph_ok && cudaMemcpy(replayed.data(), d_out, out.size() * 2, cudaMemcpyDeviceToHost) == cudaSuccess &&
               replayed == out;
    graph_note = graph_ok ? "  graph replay bit-identical" : "  graph replay FAILED";
    ok = ok && graph_ok;
    if (exec) cudaGraphExecDestroy(exec);
    if (graph) cudaGraphDestroy(graph);
  }
  ok ? ++res.passed : ++res.failed;
  std::printf("rank %d  W=%d %-12s I=%-3d %-26s out rel L2 %.3e  lse max abs %.3e  %s%s%s%s\n", rank, world,
              std::string(to_string(format)).c_str(), interleave, all_to_all ? "all-to-all" : "all-gather+reduce-scatter",
              rel, lse_err, ok ? "PASS" : "FAIL", graph_note.c_str(), refused ? "" : "  short workspace NOT refused",
              other_current ? "  (stepped with another device current)" : "");
  for (void* p : {static_cast<void*>(d_q), static_cast<void*>(d_pos), static_cast<void*>(d_req),
                  static_cast<void*>(d_table), static_cast<void*>(d_kv), static_cast<void*>(d_out),
                  static_cast<void*>(d_lse), d_ws})
    cudaFree(p);
  cudaStreamDestroy(stream);
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// A small step (8 heads per rank, bf16) on rank `rank` of `world` with its buffers.
struct SmallStep {
  dist::DcpStepArgs a;
  std::vector<void*> owned;
  SmallStep(int world, int rank) {
    const auto c = smla::test::make_dcp_case(7, 1, KvFormat::kBF16, 8 * world);
    const auto shards = dcp::shard_cache(c.req_rows, c.row_bytes, world, 1, 64, 64);
    const auto& sh = shards[size_t(rank)];
    T = c.T, K = c.K;
    a.num_tokens = c.T, a.q = keep(upload(std::vector<uint16_t>(size_t(c.T * 8 * 576), 0)));
    a.positions = keep(upload(c.positions)), a.req_of_token = keep(upload(c.req_of_token));
    a.block_table = keep(upload(sh.block_table)), a.bt_stride = sh.max_blocks, a.num_reqs = sh.num_reqs;
    a.max_blocks = sh.max_blocks, a.block_size = 64, a.block_stride_rows = 64;
    a.kv = keep(upload(sh.rows)), a.num_rows = sh.num_rows(), a.kv_row_stride_bytes = sh.row_bytes;
    a.softmax_scale = 0.1f, a.out = keep(upload(std::vector<uint16_t>(size_t(c.T * 8 * 512))));
  }
  ~SmallStep() {
    for (void* p : owned) cudaFree(p);
  }
  dist::DcpConfig config(int world, int rank, int timeout_ms) const {
    dist::DcpConfig cfg;
    cfg.world = world, cfg.rank = rank, cfg.local_heads = 8, cfg.topk = K, cfg.max_rows = T, cfg.timeout_ms = timeout_ms;
    return cfg;
  }
  template <class P>
  P* keep(P* p) {
    owned.push_back(const_cast<void*>(static_cast<const void*>(p)));
    return p;
  }
  int64_t T = 0;
  int K = 0;
};

// Rank failure on two GPUs. Default (blocking) communicator: both ranks finish one step (every
// connection the step needs is made), then rank 1 leaves; rank 0's next step waits on the GPU for
// it and must end in an error from the watchdog (or NCCL's asynchronous error) within the timeout.
// Nonblocking: rank 1 leaves right after joining; rank 0's first call settles into an error.
int failure_main(int world, int rank, const std::vector<uint8_t>& id, bool nonblocking) {
  void* comm = dist::make_comm(id, world, rank, 60000, nonblocking);
  const int timeout_ms = 3000;
  SmallStep st(world, rank);
  dist::Dcp dcp(comm, st.config(world, rank, timeout_ms));
  void* d_ws = nullptr;
  if (cudaMalloc(&d_ws, dcp.workspace_bytes()) != cudaSuccess) fail("cudaMalloc of the DCP workspace");
  cudaStream_t stream;
  cudaStreamCreate(&stream);
  if (!nonblocking) {
    dcp.step(st.a, d_ws, dcp.workspace_bytes(), stream);
    dcp.wait(stream, 60000);
  }
  if (rank == 1) _exit(0);  // leaves without taking part (and without destroying the communicator)
  const auto t0 = std::chrono::steady_clock::now();
  bool raised = false;
  std::string msg;
  try {
    dcp.step(st.a, d_ws, dcp.workspace_bytes(), stream);
    dcp.wait(stream, 10 * timeout_ms);  // longer than the watchdog's: the watchdog must act first
  } catch (const Error& e) {
    raised = true;
    msg = e.what();
  }
  const double s = seconds_since(t0);
  const bool ok = raised && s < timeout_ms / 1000.0 + 10.0 && msg.find("aborted") != std::string::npos &&
                  dcp.aborted();
  std::printf("rank 0: failure test (%s communicator): %s after %.2f s (%s)%s\n%d passed, %d failed\n",
              nonblocking ? "nonblocking" : "blocking, watchdog", raised ? "error raised" : "NO error", s, msg.c_str(),
              dcp.aborted() ? "" : " [Dcp::aborted() is false]", ok ? 1 : 0, ok ? 0 : 1);
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
  if (cudaHostGetDevicePointer(reinterpret_cast<void**>(&flag_dev), flag, 0) != cudaSuccess) fail("cudaHostGetDevicePointer");
  auto set_flag = [&](uint32_t v) { *reinterpret_cast<volatile uint32_t*>(flag) = v; };
  cudaStream_t stream;
  cudaStreamCreate(&stream);
  SmallStep st(1, 0);
  void* comm = dist::make_comm(id, 1, 0);  // the default: blocking
  {
    dist::Dcp dcp(comm, st.config(1, 0, timeout_ms));
    void* d_ws = nullptr;
    if (cudaMalloc(&d_ws, dcp.workspace_bytes()) != cudaSuccess) fail("cudaMalloc of the DCP workspace");
    const size_t ws = dcp.workspace_bytes();
    // A second step object on the same communicator (the all-to-all merge): it shares the
    // communicator's lock and fate, so the first one's abort must stop it too.
    auto cfg_b = st.config(1, 0, timeout_ms);
    cfg_b.all_to_all = true;
    dist::Dcp other(comm, cfg_b);
    void* d_ws_b = nullptr;
    if (cudaMalloc(&d_ws_b, other.workspace_bytes()) != cudaSuccess) fail("cudaMalloc of the DCP workspace");
    other.step(st.a, d_ws_b, other.workspace_bytes(), stream);

    dcp.step(st.a, d_ws, ws, stream);
    dcp.wait(stream, 20000);
    report(!dcp.aborted(), "a plain step runs");

    // A healthy slow step: the stream is held for 0.6 x timeout after step() enqueued it.
    set_flag(0);
    cuda::gpu_wait_host_flag(flag_dev, stream);
    dcp.step(st.a, d_ws, ws, stream);
    std::this_thread::sleep_for(std::chrono::milliseconds(timeout_ms * 6 / 10));
    set_flag(1);
    bool slow_ok = true;
    std::string slow_msg;
    try {
      dcp.wait(stream, 20000);
      std::this_thread::sleep_for(std::chrono::milliseconds(timeout_ms / 2));  // a late watchdog tick must not fire
      dcp.step(st.a, d_ws, ws, stream);
      dcp.wait(stream, 20000);
    } catch (const Error& e) {
      slow_ok = false;
      slow_msg = e.what();
    }
    report(slow_ok && !dcp.aborted(), "a step held 0.6 x timeout is not aborted" + (slow_msg.empty() ? "" : ": " + slow_msg));

    // A hang: the stream is held until after the checks.
    set_flag(0);
    cuda::gpu_wait_host_flag(flag_dev, stream);
    const auto t0 = std::chrono::steady_clock::now();
    dcp.step(st.a, d_ws, ws, stream);
    std::string msg;
    try {
      dcp.wait(stream, 10 * timeout_ms);  // longer than the watchdog's timeout: the watchdog must act first
    } catch (const Error& e) {
      msg = e.what();
    }
    const double s = seconds_since(t0);
    const bool in_time = !msg.empty() && s >= timeout_ms / 1000.0 && s <= timeout_ms / 1000.0 + slack_s;
    const bool named = msg.find("DCP: rank 0: ") != std::string::npos &&
                       msg.find("did not finish within " + std::to_string(timeout_ms) + " ms") != std::string::npos &&
                       msg.find("the communicator was aborted") != std::string::npos;
    char line[512];
    std::snprintf(line, sizeof line, "a held step: wait() threw after %.2f s (timeout %.1f s + %.1f s slack): %s", s,
                  timeout_ms / 1000.0, slack_s, msg.empty() ? "NO error" : msg.c_str());
    report(in_time && named && dcp.aborted(), line);

    std::string next_msg;
    const auto t1 = std::chrono::steady_clock::now();
    try {
      dcp.step(st.a, d_ws, ws, stream);
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
           "another Dcp on the same communicator throws it too: " + (other_msg.empty() ? "NO error" : other_msg));

    set_flag(1);  // the held kernel ends; what was queued behind it runs (NCCL's part is a copy at W = 1)
    const auto t2 = std::chrono::steady_clock::now();
    const cudaError_t sync = cudaStreamSynchronize(stream);
    report(sync == cudaSuccess && seconds_since(t2) < 5.0,
           std::string("after the release the stream drains: ") + cudaGetErrorString(sync));
    cudaFree(d_ws);
    cudaFree(d_ws_b);
  }  // ~Dcp joins the watchdogs (the abort done)
  dist::destroy_comm(comm);  // already aborted (freed): skipped
  report(true, "Dcp destroyed and destroy_comm returned after the abort");

  // Watchdog off: Dcp::wait's own timeout still bounds a held step.
  {
    void* comm2 = dist::make_comm(dist::make_unique_id(), 1, 0);
    auto cfg = st.config(1, 0, timeout_ms);
    cfg.watchdog = false;
    dist::Dcp dcp(comm2, cfg);
    void* d_ws = nullptr;
    if (cudaMalloc(&d_ws, dcp.workspace_bytes()) != cudaSuccess) fail("cudaMalloc of the DCP workspace");
    set_flag(0);
    cuda::gpu_wait_host_flag(flag_dev, stream);
    dcp.step(st.a, d_ws, dcp.workspace_bytes(), stream);
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
      dcp.wait(stream, 500);
    } catch (const Error& e) {
      msg = e.what();
    }
    const double s = seconds_since(t3);
    releaser.join();
    cudaStreamSynchronize(stream);
    report(msg.find("did not finish within 500 ms") != std::string::npos && s >= 0.5 && s < 1.0 + slack_s &&
               dcp.aborted(),
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
  for (KvFormat f : {KvFormat::kBF16, KvFormat::kFP16, KvFormat::kFP8E4M3, KvFormat::kFP8DsMla, KvFormat::kNvFP4DsMla})
    for (int interleave : {1, 64})
      for (bool a2a : {false, true})
        run_case(comm, world, rank, f, interleave, a2a, /*capture_graph=*/f == KvFormat::kBF16 && interleave == 64, res);
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
  if (watchdog && world != 1) {
    std::printf("--watchdog runs on one GPU: use --world 1\n");
    return 2;
  }
  const int failures = smla::dist::run_ranks(world, [&](int rank, const std::vector<uint8_t>& id) {
    return rank_main(world, rank, id, fail_mode, nonblocking, watchdog);
  });
  if (failures < 0) {
    std::printf("skipped: DCP over NCCL needs %d GPUs (GPU test not run)\n", world);
    return 77;
  }
  std::printf("dcp %s W=%d%s: %s\n", watchdog ? "watchdog test" : fail_mode ? "failure test" : "correctness", world,
              nonblocking ? " (nonblocking communicator)" : "", failures ? "FAILED" : "passed");
  return failures ? 1 : 0;
}
