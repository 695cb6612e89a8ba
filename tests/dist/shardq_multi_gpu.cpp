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
//   smla_shardq_multi_gpu --world W --fail  failure (nonblocking communicator): rank 1 leaves after
//                                           joining; rank 0's step must end in an error within the
//                                           timeout, not hang
//
// Exit 0 on success, 1 on failure, 77 (CTest: skipped) when fewer than W GPUs are visible.
#include <cuda_runtime.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "../common/shardq_case.h"
#include "devtools/launch.h"
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

int rank_main(int world, int rank, const std::vector<uint8_t>& id, bool fail_mode) {
  if (cudaSetDevice(rank) != cudaSuccess) return 1;
  // The failure test asks for a nonblocking communicator, whose every call ShardQ bounds by its
  // timeout (a peer lost during connection setup included), whatever make_comm's default is.
  void* comm = fail_mode ? dist::make_comm(id, world, rank, 60000, /*nonblocking=*/true) : dist::make_comm(id, world, rank);
  Result res;
  if (!fail_mode) {
    const std::pair<KvFormat, DType> cases[] = {
        {KvFormat::kBF16, DType::kBF16},     {KvFormat::kFP16, DType::kFP16},       {KvFormat::kFP8E4M3, DType::kBF16},
        {KvFormat::kFP8DsMla, DType::kBF16}, {KvFormat::kNvFP4DsMla, DType::kBF16}, {KvFormat::kFP8DsMla, DType::kE4M3}};
    for (const auto& [f, q] : cases) run_case(comm, world, rank, f, q, /*extras=*/f == KvFormat::kBF16, res);
    dist::destroy_comm(comm);
    std::printf("rank %d: %d passed, %d failed\n", rank, res.passed, res.failed);
    return res.failed ? 1 : 0;
  }
  if (rank == 1) _exit(0);  // leaves without taking part (and without destroying the communicator)
  // Rank 0: a step whose all-to-all waits for the rank that left must end in an error.
  const auto c = test::make_shardq_case(KvFormat::kBF16, DType::kBF16, 16 * world, {40, 9}, 5);
  const int timeout_ms = 3000;
  auto cfg = test::shardq_config(c, world, 0, KvFormat::kBF16, c.T, 2);
  cfg.timeout_ms = timeout_ms;
  dist::ShardQ sq(comm, cfg);
  void* d_ws = nullptr;
  if (cudaMalloc(&d_ws, sq.workspace_bytes()) != cudaSuccess) fail("cudaMalloc of the ShardQ workspace");
  const auto& hp = c.host.params;
  dist::ShardqStepArgs a;
  a.num_tokens = c.T, a.num_requests = 2, a.cu_seqlens = upload(c.cu_seqlens), a.q = upload(test::local_q(c, world, 0));
  a.idx = upload(c.host.idx), a.idx_stride_t = hp.idx_stride_t, a.kv = upload(c.host.kv), a.num_rows = hp.num_rows;
  a.kv_row_stride_bytes = hp.kv_row_stride_bytes, a.softmax_scale = hp.softmax_scale;
  a.out = upload(std::vector<uint16_t>(size_t(c.T * 16 * 512)));
  cudaStream_t stream;
  cudaStreamCreate(&stream);
  const auto t0 = std::chrono::steady_clock::now();
  bool raised = false;
  std::string msg;
  try {
    sq.step(a, d_ws, sq.workspace_bytes(), stream);
    sq.wait(stream, timeout_ms);
  } catch (const Error& e) {
    raised = true;
    msg = e.what();
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const bool ok = raised && s < timeout_ms / 1000.0 + 10.0;
  std::printf("rank 0: failure test: %s after %.2f s (%s)\n%d passed, %d failed\n", raised ? "error raised" : "NO error",
              s, msg.c_str(), ok ? 1 : 0, ok ? 0 : 1);
  std::fflush(stdout);
  _exit(ok ? 0 : 1);  // the aborted communicator and the stuck stream are left to process exit
}

}  // namespace

int main(int argc, char** argv) {
  int world = 2;
  bool fail_mode = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--world") && i + 1 < argc) world = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--fail")) fail_mode = true;
  }
  if (fail_mode && world < 2) {
    std::printf("the failure test needs --world >= 2\n");
    return 1;
  }
  const int failures = smla::dist::run_ranks(
      world, [&](int rank, const std::vector<uint8_t>& id) { return rank_main(world, rank, id, fail_mode); });
  if (failures < 0) {
    std::printf("skipped: ShardQ over NCCL needs %d GPUs (GPU test not run)\n", world);
    return 77;
  }
  std::printf("shardq %s W=%d: %s\n", fail_mode ? "failure test" : "correctness", world, failures ? "FAILED" : "passed");
  return failures ? 1 : 0;
}
