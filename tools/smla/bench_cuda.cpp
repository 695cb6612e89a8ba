// smla bench on a GPU: measures the two ceilings of DESIGN.md §7 in the same run (cuBLAS bf16
// GEMM rate, device-to-device copy bandwidth), then times the sparse MLA kernel over a grid of
// heads x rows with K random rows per token from a 1M-row pool made on the device. The third
// ceiling, the gather limit (issue #19), is measured per case: a kernel that only reads the case's
// rows (same pool, same index sets, same reps) — memory-bound cases are quoted against it.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "bench.h"
#include "bench_gpu_common.h"
#include "cuda/common/phase.h"
#include "devtools/bench_support.h"
#include "smla/api.h"
#include "smla/cuda.h"
#include "smla/formats.h"
#include "smla/numeric.h"
#include "smla/plan.h"

namespace smla::cli {
namespace {

using gpu_bench::ck;
using gpu_bench::DevMem;
using gpu_bench::fill_quantized_pool;
using gpu_bench::measure_copy_tbps;
using gpu_bench::measure_gemm_tflops;
using gpu_bench::Timing;
using gpu_bench::time_events;

// --phases: where the last timed call's time went, from the kernels' %globaltimer stamps
// (cuda/common/phase.h), in µs from the stream reaching the call: min / median / max over blocks.
void print_phases(const std::vector<uint64_t>& w) {
  namespace ph = cuda::phase;
  const uint64_t t0 = w[ph::kStreamBase];
  auto row = [&](const char* name, int base, int blocks, int events, int ev) {
    std::vector<double> v;
    for (int b = 0; b < blocks; ++b) {
      const uint64_t t = w[size_t(base + b * events + ev)];
      if (t != 0) v.push_back((double(t) - double(t0)) * 1e-3);
    }
    if (v.empty()) return;
    std::sort(v.begin(), v.end());
    std::printf("      %-30s %8.2f %8.2f %8.2f  (%zu blocks)\n", name, v.front(), v[v.size() / 2], v.back(), v.size());
  };
  std::printf("      phases, µs from the stream reaching the call (min / median / max over blocks):\n");
  const char* attn[] = {"attention: block entry", "Q in shared memory", "tile 0 ids in, copies issued",
                        "tile 0 landed, S issued", "every tile done", "out / partials stored", "producer done",
                        "every tile done (consumer 1)", "row sums exchanged"};
  static_assert(sizeof(attn) / sizeof(attn[0]) == ph::kNumAttnEvents, "a name per stamp");
  for (int e : {0, 2, 6, 1, 3, 4, 7, 8, 5}) row(attn[e], 0, ph::kAttnBlocks, ph::kAttnEvents, e);
  const char* merge[] = {"merge: block entry", "merge: attention grid done", "merge: stored"};
  for (int e = 0; e < 3; ++e) row(merge[e], ph::kMergeBase, ph::kMergeBlocks, ph::kMergeEvents, e);
  std::printf("      %-30s %8.2f\n", "stream: next command", (double(w[ph::kStreamBase + 1]) - double(t0)) * 1e-3);
}

}  // namespace

int bench_cuda(const Args& a) {
  const auto Ts = a.get_ints("T", {1, 32, 128, 512, 4096}, 1, 1 << 22);
  const auto Hs = a.get_ints("heads", {128, 64, 32, 16, 8}, 1, kMaxNativeHeads);
  const int K = int(a.get_int("topk", 2048, 1, 1 << 20));
  const int D = int(a.get_int("dim", 576, 512, 576));
  const int reps = int(a.get_int("reps", 30, 20, 1 << 20));  // >= 20: the spread needs the samples
  const int warmup = 3;
  const int64_t pool_rows = a.get_int("pool", 1 << 20, 1, int64_t(1) << 31);
  // --splits N: every case with N top-k splits instead of the launcher's choice (A/B of the split
  // cost model, plan.h); 0 or absent: the launcher chooses.
  const int forced_splits = int(a.get_int("splits", 0, 0, kMaxSplits));
  SMLA_CHECK(forced_splits >= 0 && forced_splits <= kMaxSplits,
             "--splits must be in [0, " + std::to_string(kMaxSplits) + "] (0: the launcher chooses)");
  // --phases: stamp kernels around each call and phase stamps inside (adds two tiny launches to
  // every timed call), printed per case.
  const bool phases = a.has("phases");
  SMLA_CHECK(!phases || cuda::phase::kEnabled,
             "--phases needs the kernels' phase stamps: configure with -DSMLA_PHASE_TIMER=ON and rebuild");
  // --graph: also time the calls captured into one CUDA graph (per-call mean, printed per case).
  const bool graph = a.has("graph");
  const KvFormat fmt = parse_kv_format(a.get("format", "bf16"));
  SMLA_CHECK(D == 576 || D == 512, "--dim must be 576 or 512");
  SMLA_CHECK(K >= 1, "--topk must be >= 1");
  const DType qt = fmt == KvFormat::kFP16 ? DType::kFP16 : DType::kBF16;  // also the output type
  const bool q_e4m3 = a.get("q", "") == "e4m3";
  // --score: auto (default: the fp8 tensor-core score path for an e4m3 q with an fp8 cache, else bf16),
  // bf16 or fp8 (smla info --score).
  const ScorePrecision score = parse_score_precision(a.get("score", "auto"));
  SMLA_CHECK(!q_e4m3 || fmt == KvFormat::kFP8E4M3 || fmt == KvFormat::kFP8DsMla,
             "--q e4m3 needs --format fp8_e4m3 or fp8_ds_mla");
  const int rope = D - kLatentDim;
  const int rb = row_bytes(fmt, rope);
  const DeviceInfo dev = cuda::device_info(0);
  ck(cudaSetDevice(0), "cudaSetDevice");
  cudaStream_t s;
  ck(cudaStreamCreate(&s), "stream");

  std::printf("measuring the ceilings (cuBLAS bf16 GEMM, device-to-device copy, gather of the rows) ...\n");
  std::fflush(stdout);
  const double gemm = measure_gemm_tflops(s);
  const double copy = measure_copy_tbps(s);
  std::printf("device %s (%d SMs): cuBLAS bf16 GEMM %.1f TFLOP/s, D2D copy %.3f TB/s (read + write)\n",
              dev.name.c_str(), dev.num_sms, gemm, copy);
  std::printf("pool %lld rows x %d B = %.2f GB (made on the device), K = %d random rows per token\n",
              (long long)pool_rows, rb, double(pool_rows) * rb / 1e9, K);

  DevMem phase_words(phases ? size_t(cuda::phase::kWords) * 8 : 8);
  uint64_t* const phase_buf = static_cast<uint64_t*>(phase_words.p);
  cuda::phase::set_buffer(phases ? phase_buf : nullptr);
  DevMem pool(size_t(pool_rows) * rb);
  if (format_is_quantized(fmt)) fill_quantized_pool(static_cast<uint8_t*>(pool.p), pool_rows, fmt, rope, s);
  else cuda::fill_random_16bit(pool.p, size_t(pool_rows) * rb / 2, qt, 1, s);

  // The gather limit's rate for this row size: 8M random rows (T = 4096, K = 2048) of the pool,
  // read only. Each case below measures its own gather time on its own index sets.
  const bool gather = cuda::gather_supports_row_bytes(rb);
  DevMem gather_sink(16);
  double gather_tbps = 0;
  if (gather) {
    const int64_t n = int64_t(1) << 23;
    DevMem gidx(size_t(n) * 4);
    cuda::fill_random_rows(static_cast<int32_t*>(gidx.p), size_t(n), pool_rows, 99, s);
    const Timing tg = time_events(s, 2, 20, [&](int) {
      cuda::gather_rows(pool.p, pool_rows, rb, static_cast<const int32_t*>(gidx.p), n,
                        static_cast<uint32_t*>(gather_sink.p), s);
    });
    gather_tbps = double(n) * rb / (tg.median * 1e-3) / 1e12;
    std::printf("gather limit: %lld random %d-B rows of the pool read (16-byte loads, nothing stored) in %s: "
                "%.3f TB/s (reads only)\n", (long long)n, rb, format_time(tg.median).c_str(), gather_tbps);
  } else {
    std::printf("gather limit: not measured (%d-B rows are not a multiple of 16 B)\n", rb);
  }

  std::vector<BenchRecord> recs;
  uint64_t seed = 100;
  print_header(true);
  for (long long H : Hs)
    for (long long T : Ts) {
      // Index sets rotate so that a small case does not find its rows in L2 from the last rep.
      const double case_bytes = double(T) * K * rb;
      const int rot = case_bytes >= 256e6 ? 1 : warmup + reps;
      const size_t idx_elems = size_t(T) * K;
      DevMem q(size_t(T) * H * D * (q_e4m3 ? 1 : 2)), out(size_t(T) * H * kLatentDim * 2), lse(size_t(T) * H * 4);
      DevMem idx(idx_elems * rot * 4);
      if (q_e4m3) {  // N(0, 1) values as e4m3 codes, made here (q is small)
        std::mt19937_64 rng(++seed);
        std::normal_distribution<float> normal(0.0f, 1.0f);
        std::vector<uint8_t> hq(size_t(T) * H * D);
        for (auto& b : hq) b = num::f32_to_e4m3(normal(rng));
        ck(cudaMemcpyAsync(q.p, hq.data(), hq.size(), cudaMemcpyHostToDevice, s), "q upload");
        ck(cudaStreamSynchronize(s), "q upload");
      } else {
        cuda::fill_random_16bit(q.p, size_t(T) * H * D, qt, ++seed, s);
      }
      cuda::fill_random_rows(static_cast<int32_t*>(idx.p), idx_elems * rot, pool_rows, ++seed, s);

      SparseMlaParams p;
      p.num_tokens = T, p.num_heads = int(H), p.rope_dim = rope, p.topk = K;
      p.q = q.p, p.q_dtype = q_e4m3 ? DType::kE4M3 : qt, p.kv = pool.p, p.num_rows = pool_rows, p.format = fmt;
      p.idx = static_cast<const int32_t*>(idx.p);
      p.softmax_scale = 0.1352338f;
      p.out = out.p, p.out_dtype = qt, p.lse = static_cast<float*>(lse.p), p.lse_mode = LseMode::kBaseE;
      p.score_precision = score;
      set_dense_strides(p);
      const size_t wsb = cuda::sparse_mla_workspace_bytes(p, dev.num_sms, forced_splits);
      DevMem ws(std::max<size_t>(wsb, 256));
      if (phases) ck(cudaMemsetAsync(phase_buf, 0, size_t(cuda::phase::kWords) * 8, s), "phase reset");
      const Timing t = time_events(s, warmup, reps, [&](int i) {
        SparseMlaParams pi = p;
        pi.idx = p.idx + size_t(i % rot) * idx_elems;
        if (phases) cuda::phase::stamp(phase_buf + cuda::phase::kStreamBase, s);
        cuda::sparse_mla(pi, ws.p, wsb, s, forced_splits);
        if (phases) cuda::phase::stamp(phase_buf + cuda::phase::kStreamBase + 1, s);
      });

      // The gather limit of the same rows: the same index sets in the same order, the same reps.
      Timing tgather;
      if (gather)
        tgather = time_events(s, warmup, reps, [&](int i) {
          cuda::gather_rows(pool.p, pool_rows, rb, p.idx + size_t(i % rot) * idx_elems, int64_t(idx_elems),
                            static_cast<uint32_t*>(gather_sink.p), s);
        });

      BenchRecord r;
      r.backend = "cuda";
      Geometry g = geometry_of(p);
      const int splits = forced_splits > 0 ? forced_splits : cuda::sparse_mla_auto_splits(p, dev.num_sms);  // the launcher's
      r.kernel = cuda_kernel_for(g, dev, T) + (splits > 1 ? "/split" + std::to_string(splits) : "");
      r.format = std::string(to_string(fmt)) + (q_e4m3 ? "+q_e4m3" : "");
      r.T = T, r.H = H, r.K = K, r.D = D, r.row_bytes = rb;
      r.valid_entries = double(T) * K;
      r.median_ms = t.median, r.min_ms = t.min, r.max_ms = t.max;
      r.flops = 2.0 * H * r.valid_entries * (D + kLatentDim);
      r.bytes = r.valid_entries * rb;
      r.gemm_tflops = gemm, r.copy_tbps = copy;
      r.gather_ms = tgather.median;
      r.repro = "smla bench --format " + std::string(to_string(fmt)) + (q_e4m3 ? " --q e4m3" : "") +
                (score != ScorePrecision::kAuto ? " --score " + std::string(to_string(score)) : "") + " --heads " + std::to_string(H) + " --T " + std::to_string(T) +
                " --topk " + std::to_string(K) + " --dim " + std::to_string(D) +
                (forced_splits > 0 ? " --splits " + std::to_string(forced_splits) : "");
      print_record(r, recs.size(), Hs.size() * Ts.size());
      if (phases) {
        std::vector<uint64_t> words(size_t(cuda::phase::kWords));
        ck(cudaMemcpy(words.data(), phase_buf, words.size() * 8, cudaMemcpyDeviceToHost), "phase read");
        print_phases(words);
      }
      if (graph) {
        // The same calls (one per index set) captured back to back into one CUDA graph, as a
        // serving engine replays a decode step: launch overhead between calls is the graph's.
        const int calls = std::min(rot, 64);
        cudaGraph_t g = nullptr;
        cudaGraphExec_t ge = nullptr;
        ck(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), "begin capture");
        for (int i = 0; i < calls; ++i) {
          SparseMlaParams pi = p;
          pi.idx = p.idx + size_t(i % rot) * idx_elems;
          cuda::sparse_mla(pi, ws.p, wsb, s, forced_splits);
        }
        ck(cudaStreamEndCapture(s, &g), "end capture");
        ck(cudaGraphInstantiate(&ge, g, 0), "graph instantiate");
        const Timing tg = time_events(s, 2, 9, [&](int) { ck(cudaGraphLaunch(ge, s), "graph launch"); });
        std::printf("      graph: %d calls in one CUDA graph, %.2f us per call (median of 9 replays: %.4f ms)\n", calls,
                    tg.median * 1e3 / calls, tg.median);
        cudaGraphExecDestroy(ge);
        cudaGraphDestroy(g);
      }
      recs.push_back(r);
    }
  cuda::phase::set_buffer(nullptr);
  cudaStreamDestroy(s);
  if (a.has("json")) write_json(a.get("json", ""), recs, dev.name, gemm, copy, gather_tbps, gather ? rb : 0);
  return 0;
}

}  // namespace smla::cli
