// smla bench --dcp W: one decode step of DCP over NCCL on W GPUs (one process per GPU) against one
// GPU holding the same total KV. Every token draws K random positions of one long request; the
// pool (rows of random bf16) is made on the GPU. Reports the median step time of each, and the
// share of the DCP step spent outside attention (index conversion, q all-gather, merge), in three
// modes side by side: a blocking communicator without a watchdog, the default (blocking + Dcp's
// watchdog thread), and a nonblocking communicator (every NCCL call polled on the host). At W = 1
// NCCL runs collectives as local copies without its per-call thread, so the nonblocking mode
// costs only the all-to-all's group there; the watchdog's own cost is measured at any W.
#include <cuda_runtime.h>

#include <sys/mman.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "bench.h"
#include "devtools/bench_support.h"
#include "devtools/launch.h"
#include "smla/cuda.h"
#include "smla/cuda_serving.h"
#include "smla/dist.h"
#include "smla/formats.h"

namespace smla::cli {
namespace {

void ck(cudaError_t e, const char* what) { SMLA_CHECK(e == cudaSuccess, std::string(what) + ": " + cudaGetErrorString(e)); }

template <class T>
T* dalloc(size_t n) {
  void* p = nullptr;
  ck(cudaMalloc(&p, std::max<size_t>(n * sizeof(T), 16)), "cudaMalloc");
  return static_cast<T*>(p);
}

enum class Mode { kBlocking, kWatchdog, kNonblocking };
constexpr Mode kModes[] = {Mode::kBlocking, Mode::kWatchdog, Mode::kNonblocking};
const char* mode_name(Mode m) {
  return m == Mode::kBlocking ? "blocking, no watchdog" : m == Mode::kWatchdog ? "default (watchdog)" : "nonblocking (polled)";
}

struct Setup {
  int world, heads, topk, reps;
  int64_t T, total_rows;
  Mode mode;
  bool one_gpu;          // also time the one-GPU step (rank 0)
  double* step_ms_out;   // [2] shared with the parent (MAP_SHARED): the median step per merge path
};

// A one-request paged cache of `rows` rows (identity block table), random bf16 contents.
struct Shard {
  uint8_t* kv;
  int32_t* table;
  int max_blocks;
};
Shard make_shard(int64_t rows, uint64_t seed, cudaStream_t s) {
  constexpr int kB = 64;
  Shard sh;
  sh.max_blocks = int((rows + kB - 1) / kB);
  constexpr int kRowBytes = row_layout(KvFormat::kBF16).bytes;
  sh.kv = dalloc<uint8_t>(size_t(sh.max_blocks) * kB * kRowBytes);
  cuda::fill_random_16bit(sh.kv, size_t(sh.max_blocks) * kB * kRowBytes / 2, DType::kBF16, seed, s);
  std::vector<int32_t> table(size_t(sh.max_blocks));
  for (int b = 0; b < sh.max_blocks; ++b) table[size_t(b)] = b;
  sh.table = dalloc<int32_t>(table.size());
  ck(cudaMemcpy(sh.table, table.data(), table.size() * 4, cudaMemcpyHostToDevice), "H2D");
  return sh;
}

template <class Fn>
double median_ms(cudaStream_t s, int reps, Fn&& fn) {
  cudaEvent_t a, b;
  ck(cudaEventCreate(&a), "event");
  ck(cudaEventCreate(&b), "event");
  for (int i = 0; i < 3; ++i) fn();
  std::vector<double> ms;
  for (int i = 0; i < reps; ++i) {
    ck(cudaEventRecord(a, s), "record");
    fn();
    ck(cudaEventRecord(b, s), "record");
    ck(cudaEventSynchronize(b), "sync");
    float t = 0;
    ck(cudaEventElapsedTime(&t, a, b), "elapsed");
    ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

int rank_main(const Setup& su, int rank, const std::vector<uint8_t>& id) {
  ck(cudaSetDevice(rank), "cudaSetDevice");
  cudaStream_t s;
  ck(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "stream");
  const int W = su.world, Hl = su.heads / W, K = su.topk;
  const int64_t T = su.T;
  auto* positions = dalloc<int32_t>(size_t(T * K));
  cuda::fill_random_rows(positions, size_t(T * K), su.total_rows, 99, s);  // same on every rank
  std::vector<int32_t> zeros(size_t(T), 0);
  auto* req = dalloc<int32_t>(size_t(T));
  ck(cudaMemcpy(req, zeros.data(), zeros.size() * 4, cudaMemcpyHostToDevice), "H2D");
  auto* q = dalloc<uint16_t>(size_t(T * Hl * 576));
  cuda::fill_random_16bit(q, size_t(T * Hl * 576), DType::kBF16, 7 + rank, s);
  auto* out = dalloc<uint16_t>(size_t(T * Hl * 512));
  auto* lse = dalloc<float>(size_t(T * Hl));

  double one_gpu_ms = 0;
  if (rank == 0 && su.one_gpu) {  // the same step on one GPU holding the whole KV
    const Shard full = make_shard(su.total_rows, 1, s);
    auto* idx = dalloc<int32_t>(size_t(T * K));
    auto* counts = dalloc<int32_t>(size_t(T));
    auto* q_all = dalloc<uint16_t>(size_t(T * su.heads * 576));
    cuda::fill_random_16bit(q_all, size_t(T * su.heads * 576), DType::kBF16, 5, s);
    auto* out_all = dalloc<uint16_t>(size_t(T * su.heads * 512));
    auto* lse_all = dalloc<float>(size_t(T * su.heads));
    IndexConvertParams ic;
    ic.positions = positions, ic.pos_stride_t = K, ic.num_tokens = T, ic.topk = K, ic.req_of_token = req;
    ic.block_table = full.table, ic.bt_stride = full.max_blocks, ic.num_reqs = 1, ic.max_blocks = full.max_blocks;
    ic.block_size = 64, ic.block_stride_rows = 64, ic.phys = idx, ic.phys_stride_t = K, ic.counts = counts;
    SparseMlaParams p;
    p.num_tokens = T, p.num_heads = su.heads, p.topk = K, p.q = q_all, p.kv = full.kv;
    p.num_rows = int64_t(full.max_blocks) * 64, p.format = KvFormat::kBF16, p.idx = idx, p.counts = counts;
    p.softmax_scale = 0.1352338f, p.out = out_all, p.lse = lse_all;
    set_dense_strides(p);
    const size_t ws_bytes = cuda::sparse_mla_workspace_bytes(p, cuda::device_info(rank).num_sms);
    void* ws = ws_bytes ? dalloc<uint8_t>(ws_bytes) : nullptr;
    one_gpu_ms = median_ms(s, su.reps, [&] {
      cuda::convert_indices(ic, s);
      cuda::sparse_mla(p, ws, ws_bytes, s);
    });
    for (void* ptr : {static_cast<void*>(full.kv), static_cast<void*>(full.table), static_cast<void*>(idx),
                      static_cast<void*>(counts), static_cast<void*>(q_all), static_cast<void*>(out_all),
                      static_cast<void*>(lse_all), ws})
      cudaFree(ptr);
  }

  const int64_t local_rows = (su.total_rows + W - 1) / W;
  const Shard shard = make_shard(local_rows, 11 + rank, s);
  void* comm = dist::make_comm(id, W, rank, 60000, /*nonblocking=*/su.mode == Mode::kNonblocking);
  for (bool a2a : {false, true}) {
    dist::DcpConfig cfg;
    cfg.world = W, cfg.rank = rank, cfg.local_heads = Hl, cfg.topk = K, cfg.max_rows = T, cfg.all_to_all = a2a;
    cfg.watchdog = su.mode != Mode::kBlocking;
    dist::Dcp dcp(comm, cfg);
    auto* ws = dalloc<uint8_t>(dcp.workspace_bytes());
    dist::DcpStepArgs a;
    a.num_tokens = T, a.q = q, a.positions = positions, a.req_of_token = req, a.block_table = shard.table;
    a.bt_stride = shard.max_blocks, a.num_reqs = 1, a.max_blocks = shard.max_blocks, a.block_size = 64;
    a.block_stride_rows = 64, a.kv = shard.kv, a.num_rows = int64_t(shard.max_blocks) * 64;
    a.kv_row_stride_bytes = row_layout(KvFormat::kBF16).bytes, a.softmax_scale = 0.1352338f, a.out = out, a.lse = lse;
    const double step_ms = median_ms(s, su.reps, [&] { dcp.step(a, ws, dcp.workspace_bytes(), s); });
    dcp.enable_timing(true);
    dcp.step(a, ws, dcp.workspace_bytes(), s);
    dcp.wait(s, 60000);
    const auto tm = dcp.last_timing();
    if (rank == 0) {
      su.step_ms_out[a2a ? 1 : 0] = step_ms;
      char base[64] = "";
      if (su.one_gpu) std::snprintf(base, sizeof base, "1 GPU %8.4f ms | ", one_gpu_ms);
      std::printf("dcp  W=%d %-25s T=%-5lld H=%-3d K=%d total KV %lld rows, %-21s: %sDCP step %8.4f ms, "
                  "attention %.4f ms, index+comm+merge %.4f ms = %.0f%% of the step\n",
                  W, a2a ? "all-to-all" : "all-gather+reduce-scatter", (long long)T, su.heads, K,
                  (long long)su.total_rows, mode_name(su.mode), base, step_ms, tm.attn_ms, tm.comm_ms,
                  100.0 * tm.comm_ms / std::max(1e-9f, tm.total_ms));
    }
    ck(cudaFree(ws), "cudaFree");
  }
  ck(cudaStreamSynchronize(s), "sync");
  dist::destroy_comm(comm);
  return 0;
}

}  // namespace

int bench_dcp(const Args& a) {
  Setup su;
  su.world = int(a.get_int("dcp", 2, 1, 64));
  su.topk = int(a.get_int("topk", 2048, 1, 1 << 20));
  su.reps = int(a.get_int("reps", 20, 1, 1 << 20));
  su.total_rows = a.get_int("rows", 1 << 21, 1, int64_t(1) << 31);
  const auto Ts = a.get_ints("T", {1, 32, 128}, 1, 1 << 22);
  const auto Hs = a.get_ints("heads", {128}, 1, 1 << 12);
  // The ranks are forked processes: rank 0 leaves its medians here for the comparison line.
  void* shared = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  SMLA_CHECK(shared != MAP_FAILED, "smla bench --dcp: mmap of the result page failed");
  auto* ms = static_cast<double*>(shared);
  int failed = 0;
  for (long long H : Hs)
    for (long long T : Ts) {
      su.heads = int(H), su.T = T;
      SMLA_CHECK(su.heads % su.world == 0, "--heads must be a multiple of --dcp");
      double med[3][2] = {};
      for (int m = 0; m < 3; ++m) {  // one communicator per mode (blocking is fixed at init): one launch each
        su.mode = kModes[m], su.one_gpu = m == 0, su.step_ms_out = ms;
        ms[0] = ms[1] = 0;
        const int f = dist::run_ranks(su.world, [&](int rank, const std::vector<uint8_t>& id) { return rank_main(su, rank, id); });
        SMLA_CHECK(f >= 0, "smla bench --dcp " + std::to_string(su.world) + " needs " + std::to_string(su.world) + " GPUs");
        failed += f;
        med[m][0] = ms[0], med[m][1] = ms[1];
      }
      for (int p = 0; p < 2; ++p) {
        const double b = med[0][p];
        auto rel = [&](double x) { return b > 0 && x > 0 ? 100.0 * (x / b - 1.0) : 0.0; };
        std::printf("dcp  W=%d %-25s T=%-5lld H=%-3lld: blocking %.4f ms | default (watchdog) %.4f ms (%+.1f%%) | "
                    "nonblocking (polled) %.4f ms (%+.1f%%)\n"
                    "      repro: smla bench --dcp %d --T %lld --heads %lld --topk %d --rows %lld --reps %d\n",
                    su.world, p ? "all-to-all" : "all-gather+reduce-scatter", T, H, b, med[1][p], rel(med[1][p]),
                    med[2][p], rel(med[2][p]), su.world, T, H, su.topk, (long long)su.total_rows, su.reps);
      }
    }
  munmap(shared, 4096);
  return failed ? 1 : 0;
}

}  // namespace smla::cli
