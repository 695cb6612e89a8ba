// smla bench --shardq W[,W...]: the attention part of one TP-W prefill layer on one GPU, with and
// without ShardQ (DESIGN.md §5b, issue #22), so the gain shows without W GPUs.
//
// One prefill request of T tokens, K random rows per token from a pool made on the device (rows
// shared by both variants). Per (format, T, W):
//   head-sharded: what one TP rank does today, H / W heads on all T tokens;
//   ShardQ:       what rank 0 does with ShardQ, all H heads on the tokens it owns under the zigzag
//                 layout (shardq::make_layout), with those tokens' top-k rows.
// Both medians, their ratio (ShardQ / head-sharded; #22's target at W = 8: <= 0.35), and the bytes
// each rank sends in the step's two all-to-alls (exact counts from the layout, no padding), so a
// step time can be predicted from a measured NCCL all-to-all bandwidth. The ceilings of DESIGN.md
// §7 (cuBLAS bf16 GEMM, device-to-device copy) are measured first, in the same run.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "bench.h"
#include "bench_gpu_common.h"
#include "devtools/bench_support.h"
#include "smla/api.h"
#include "smla/cuda.h"
#include "smla/formats.h"
#include "smla/plan.h"
#include "smla/shardq.h"

namespace smla::cli {
namespace {

using gpu_bench::ck;
using gpu_bench::DevMem;
using gpu_bench::Timing;
using gpu_bench::time_events;

constexpr int kD = kLatentDim + kRopeDim;  // 576
constexpr int kQBytes = 2;                 // bf16 q
constexpr int kOutBytes = 2;               // bf16 out

// Bytes one rank sends in one ShardQ step (exact: only the tokens that exist, no slot padding).
struct A2aBytes {
  double q = 0, out = 0, lse = 0;
  double total() const { return q + out + lse; }
};
// Rank r sends every peer p the rows of p's tokens with r's H / W heads (q), then every peer p the
// head block p of r's own tokens (out, LSE).
A2aBytes a2a_bytes(const shardq::Layout& l, int r, int heads) {
  const double hw = double(heads) / l.world;
  const double own = double(l.rank_tokens[size_t(r)].size());
  A2aBytes b;
  b.q = (double(l.num_tokens) - own) * hw * kD * kQBytes;
  b.out = own * (l.world - 1) * hw * kLatentDim * kOutBytes;
  b.lse = own * (l.world - 1) * hw * 4;
  return b;
}

struct Variant {
  Timing t;
  std::string kernel;
  double flops = 0, bytes = 0;
};

}  // namespace

int bench_shardq(const Args& a, const ShardqSetup& st) {
  SMLA_CHECK(cuda::device_count() > 0, "no CUDA device found; smla bench --shardq needs a GPU");
  const int H = st.heads, K = st.topk, reps = st.reps, warmup = 3;
  const int64_t pool_rows = st.pool_rows;
  const DeviceInfo dev = cuda::device_info(0);
  ck(cudaSetDevice(0), "cudaSetDevice");
  cudaStream_t s;
  ck(cudaStreamCreate(&s), "stream");

  std::printf("measuring the ceilings (cuBLAS bf16 GEMM, device-to-device copy) ...\n");
  std::fflush(stdout);
  const double gemm = gpu_bench::measure_gemm_tflops(s);
  const double copy = gpu_bench::measure_copy_tbps(s);
  std::printf("device %s (%d SMs): cuBLAS bf16 GEMM %.1f TFLOP/s, D2D copy %.3f TB/s (read + write)\n",
              dev.name.c_str(), dev.num_sms, gemm, copy);
  std::printf("smla bench --shardq: one prefill request of T tokens, H = %d, K = %d random rows per token of a %lld-row "
              "pool, bf16 q and out, median of %d calls.\n"
              "  head-sharded: H/W heads on all T tokens (one TP rank today); shardq: H heads on rank 0's zigzag tokens.\n"
              "  roofline: max(bytes / copy, flops / GEMM) / time. a2a: bytes one rank sends per step (the max over "
              "ranks), q = other ranks' tokens x H/W heads x %d x 2 B, out = own tokens x (W-1) x H/W x 512 x 2 B, "
              "lse x 4 B.\n",
              H, K, (long long)pool_rows, reps, kD);
  std::fflush(stdout);

  std::vector<std::string> json;
  const size_t total = st.formats.size() * st.Ts.size() * st.worlds.size();
  uint64_t seed = 500;
  for (KvFormat fmt : st.formats) {
    const int rb = row_bytes(fmt, kRopeDim);
    DevMem pool(size_t(pool_rows) * rb);
    if (format_is_quantized(fmt)) gpu_bench::fill_quantized_pool(static_cast<uint8_t*>(pool.p), pool_rows, fmt, kRopeDim, s);
    else cuda::fill_random_16bit(pool.p, size_t(pool_rows) * rb / 2, DType::kBF16, 1, s);
    const std::string fname(to_string(fmt));
    std::printf("%s: %d-byte rows, pool %.2f GB (made on the device)\n", fname.c_str(), rb, double(pool_rows) * rb / 1e9);
    std::fflush(stdout);

    for (long long T : st.Ts) {
      // Index sets rotate so that a small case does not find its rows in L2 from the last rep.
      const int rot = double(T) * K * rb >= 256e6 ? 1 : warmup + reps;
      const size_t idx_elems = size_t(T) * K;
      DevMem idx(idx_elems * rot * 4);
      cuda::fill_random_rows(static_cast<int32_t*>(idx.p), idx_elems * rot, pool_rows, ++seed, s);
      DevMem q(size_t(T) * H * kD * kQBytes), out(size_t(T) * H * kLatentDim * kOutBytes), lse(size_t(T) * H * 4);
      cuda::fill_random_16bit(q.p, size_t(T) * H * kD, DType::kBF16, ++seed, s);

      // One attention call timed: `tokens` rows of q (dense, `heads` heads) against idx rows `idx0`.
      auto time_attention = [&](int64_t tokens, int heads, const int32_t* idx0, size_t idx_set) {
        SparseMlaParams p;
        p.num_tokens = tokens, p.num_heads = heads, p.rope_dim = kRopeDim, p.topk = K;
        p.q = q.p, p.q_dtype = DType::kBF16, p.kv = pool.p, p.num_rows = pool_rows, p.format = fmt;
        p.idx = idx0, p.softmax_scale = 0.1352338f;
        p.out = out.p, p.out_dtype = DType::kBF16, p.lse = static_cast<float*>(lse.p), p.lse_mode = LseMode::kBaseE;
        set_dense_strides(p);
        const size_t wsb = cuda::sparse_mla_workspace_bytes(p, dev.num_sms);
        DevMem ws(std::max<size_t>(wsb, 256));
        Variant v;
        v.t = time_events(s, warmup, reps, [&](int i) {
          SparseMlaParams pi = p;
          pi.idx = idx0 + size_t(i % rot) * idx_set;
          cuda::sparse_mla(pi, ws.p, wsb, s);
        });
        v.kernel = cuda_kernel_for(geometry_of(p), dev);
        const int splits = choose_num_splits(tokens, (heads + 63) / 64, K, dev.num_sms);
        if (splits > 1) v.kernel += "/split" + std::to_string(splits);
        v.flops = 2.0 * heads * double(tokens) * K * (kD + kLatentDim);
        v.bytes = double(tokens) * K * rb;
        return v;
      };
      auto roofline = [&](const Variant& v) {
        const double floor_s = std::max(v.bytes / (copy * 1e12), v.flops / (gemm * 1e12));
        return floor_s / (v.t.median * 1e-3);
      };

      for (int W : st.worlds) {
        const shardq::Layout l = shardq::make_layout({int64_t(T)}, W);
        const int64_t n0 = int64_t(l.rank_tokens[0].size());
        int64_t nmax = 0;
        A2aBytes b;  // the rank that sends the most
        for (int r = 0; r < W; ++r) {
          nmax = std::max<int64_t>(nmax, int64_t(l.rank_tokens[size_t(r)].size()));
          const A2aBytes br = a2a_bytes(l, r, H);
          if (br.total() > b.total()) b = br;
        }
        // Rank 0's tokens' rows of every index set, in the order of its slots (runs of
        // consecutive tokens copied at once).
        DevMem idx_r0(std::max<size_t>(size_t(n0) * K * rot * 4, 4));
        for (int set = 0; set < rot; ++set) {
          const auto& toks = l.rank_tokens[0];
          for (size_t i = 0; i < toks.size();) {
            size_t j = i + 1;
            while (j < toks.size() && toks[j] == toks[j - 1] + 1) ++j;
            ck(cudaMemcpyAsync(static_cast<int32_t*>(idx_r0.p) + (size_t(set) * n0 + i) * K,
                               static_cast<const int32_t*>(idx.p) + size_t(set) * idx_elems + size_t(toks[i]) * K,
                               (j - i) * K * 4, cudaMemcpyDeviceToDevice, s),
               "index copy");
            i = j;
          }
        }
        ck(cudaStreamSynchronize(s), "index copy");
        const Variant hs = time_attention(T, H / W, static_cast<const int32_t*>(idx.p), idx_elems);
        Variant sq;
        if (n0 > 0) sq = time_attention(n0, H, static_cast<const int32_t*>(idx_r0.p), size_t(n0) * K);
        const double ratio = sq.t.median / hs.t.median;
        const std::string repro = "smla bench --shardq " + std::to_string(W) + " --format " + fname + " --T " +
                                  std::to_string(T) + " --heads " + std::to_string(H) + " --topk " + std::to_string(K);
        std::printf("%zu/%zu shardq %-10s T %6lld W %2d | head-sharded H %3d x %6lld tok: %s [%s, %s] %s, roofline %.2f"
                    " | shardq H %d x %6lld tok (max over ranks %lld): %s [%s, %s] %s, roofline %.2f | ratio %.3f%s"
                    " | a2a per rank per step: q %.1f MB, out %.1f MB, lse %.2f MB, total %.1f MB\n"
                    "        repro: %s\n",
                    json.size() + 1, total, fname.c_str(), T, W, H / W, T, format_time(hs.t.median).c_str(),
                    format_time(hs.t.min).c_str(), format_time(hs.t.max).c_str(), hs.kernel.c_str(), roofline(hs), H,
                    (long long)n0, (long long)nmax, format_time(sq.t.median).c_str(), format_time(sq.t.min).c_str(),
                    format_time(sq.t.max).c_str(), sq.kernel.c_str(), n0 > 0 ? roofline(sq) : 0.0, ratio,
                    W == 8 ? (ratio <= 0.35 ? " (<= 0.35: meets #22)" : " (> 0.35: misses #22's target)") : "",
                    b.q / 1e6, b.out / 1e6, b.lse / 1e6, b.total() / 1e6, repro.c_str());
        std::fflush(stdout);  // a long run shows each case as it finishes
        char js[1536];
        std::snprintf(js, sizeof js,
                      "  {\"format\": \"%s\", \"T\": %lld, \"W\": %d, \"H\": %d, \"K\": %d, "
                      "\"head_sharded\": {\"heads\": %d, \"tokens\": %lld, \"median_ms\": %.6f, \"min_ms\": %.6f, "
                      "\"max_ms\": %.6f, \"kernel\": \"%s\", \"roofline_fraction\": %.4f}, "
                      "\"shardq\": {\"heads\": %d, \"tokens\": %lld, \"max_tokens_over_ranks\": %lld, \"median_ms\": %.6f, "
                      "\"min_ms\": %.6f, \"max_ms\": %.6f, \"kernel\": \"%s\", \"roofline_fraction\": %.4f}, "
                      "\"ratio\": %.5f, \"a2a_send_bytes_per_rank\": {\"q\": %.0f, \"out\": %.0f, \"lse\": %.0f, "
                      "\"total\": %.0f}, \"repro\": \"%s\"}",
                      fname.c_str(), T, W, H, K, H / W, T, hs.t.median, hs.t.min, hs.t.max, hs.kernel.c_str(),
                      roofline(hs), H, (long long)n0, (long long)nmax, sq.t.median, sq.t.min, sq.t.max,
                      sq.kernel.c_str(), n0 > 0 ? roofline(sq) : 0.0, ratio, b.q, b.out, b.lse, b.total(),
                      repro.c_str());
        json.push_back(js);
      }
    }
  }
  cudaStreamDestroy(s);
  if (a.has("json")) {
    FILE* f = std::fopen(a.get("json", "").c_str(), "w");
    SMLA_CHECK(f != nullptr, "--json: cannot write " + a.get("json", ""));
    std::fprintf(f, "{\"device\": \"%s\", \"gemm_tflops\": %.3f, \"copy_tbps\": %.4f, \"cases\": [\n", dev.name.c_str(),
                 gemm, copy);
    for (size_t i = 0; i < json.size(); ++i) std::fprintf(f, "%s%s\n", json[i].c_str(), i + 1 < json.size() ? "," : "");
    std::fprintf(f, "]}\n");
    std::fclose(f);
  }
  return 0;
}

}  // namespace smla::cli
