// DCP over NCCL on W GPUs, one process per GPU (DESIGN.md §5), forked by dist::run_ranks.
//
//   smla_dcp_multi_gpu [--world W]          correctness: every case vs the float64-free CPU
//                                           reference on the unsharded cache (out rel L2 <= 1e-2,
//                                           LSE abs <= 1e-3), both merge paths, interleave 1 and 64;
//                                           Dcp::device() is the communicator's, a step runs there
//                                           with another device current, and a workspace one byte
//                                           short is refused before anything is enqueued
//   smla_dcp_multi_gpu --world W --fail     failure: rank 1 leaves after joining; rank 0's step must
//                                           end in an error within the timeout, not hang
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

#include "../common/dcp_case.h"
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

int rank_main(int world, int rank, const std::vector<uint8_t>& id, bool fail_mode) {
  if (cudaSetDevice(rank) != cudaSuccess) return 1;
  void* comm = dist::make_comm(id, world, rank);
  Result res;
  if (!fail_mode) {
    for (KvFormat f : {KvFormat::kBF16, KvFormat::kFP16, KvFormat::kFP8E4M3, KvFormat::kFP8DsMla, KvFormat::kNvFP4DsMla})
      for (int interleave : {1, 64})
        for (bool a2a : {false, true})
          run_case(comm, world, rank, f, interleave, a2a, /*capture_graph=*/f == KvFormat::kBF16 && interleave == 64, res);
    dist::destroy_comm(comm);
    std::printf("rank %d: %d passed, %d failed\n", rank, res.passed, res.failed);
    return res.failed ? 1 : 0;
  }
  if (rank == 1) _exit(0);  // leaves without taking part (and without destroying the communicator)
  // Rank 0: a step whose collectives wait for the rank that left must end in an error.
  const auto c = smla::test::make_dcp_case(7, 1, KvFormat::kBF16, 8 * world);
  const auto shards = dcp::shard_cache(c.req_rows, c.row_bytes, world, 1, 64, 64);
  const int timeout_ms = 3000;
  dist::DcpConfig cfg;
  cfg.world = world, cfg.rank = 0, cfg.local_heads = 8, cfg.topk = c.K, cfg.max_rows = c.T;
  cfg.timeout_ms = timeout_ms;
  dist::Dcp dcp(comm, cfg);
  void* d_ws = nullptr;
  if (cudaMalloc(&d_ws, dcp.workspace_bytes()) != cudaSuccess) fail("cudaMalloc of the DCP workspace");
  std::vector<uint16_t> out(size_t(c.T * 8 * 512));
  dist::DcpStepArgs a;
  a.num_tokens = c.T, a.q = upload(std::vector<uint16_t>(size_t(c.T * 8 * 576), 0));
  a.positions = upload(c.positions), a.req_of_token = upload(c.req_of_token);
  a.block_table = upload(shards[0].block_table), a.bt_stride = shards[0].max_blocks, a.num_reqs = shards[0].num_reqs;
  a.max_blocks = shards[0].max_blocks, a.block_size = 64, a.block_stride_rows = 64;
  a.kv = upload(shards[0].rows), a.num_rows = shards[0].num_rows(), a.kv_row_stride_bytes = shards[0].row_bytes;
  a.softmax_scale = 0.1f, a.out = upload(out);
  cudaStream_t stream;
  cudaStreamCreate(&stream);
  const auto t0 = std::chrono::steady_clock::now();
  bool raised = false;
  std::string msg;
  try {
    dcp.step(a, d_ws, dcp.workspace_bytes(), stream);
    dcp.wait(stream, timeout_ms);
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
  const int failures = smla::dist::run_ranks(
      world, [&](int rank, const std::vector<uint8_t>& id) { return rank_main(world, rank, id, fail_mode); });
  if (failures < 0) {
    std::printf("skipped: DCP over NCCL needs %d GPUs (GPU test not run)\n", world);
    return 77;
  }
  std::printf("dcp %s W=%d: %s\n", fail_mode ? "failure test" : "correctness", world, failures ? "FAILED" : "passed");
  return failures ? 1 : 0;
}
