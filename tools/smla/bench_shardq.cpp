// smla bench --shardq W[,W...]: ShardQ prefill (DESIGN.md §5b, issue #22).
//
// On >= W GPUs (W >= 2, NCCL build), first the whole step of dist::ShardQ on W GPUs, one process per
// GPU: its median time, the share of the two all-to-alls, the attention and the rest (ownership,
// packing), the bandwidth the all-to-alls reached (bytes each rank sends its peers, padded slots
// included, per second) against a plain NCCL all-to-all (grouped send / recv) of the same bytes
// measured in the same run.
//
// Then, on one GPU, the attention part of one TP-W prefill layer with and without ShardQ, so the
// gain shows without W GPUs. One prefill request of T tokens, K random rows per token from a pool
// made on the device (rows shared by both variants). Per (format, T, W):
//   head-sharded: what one TP rank does today, H / W heads on all T tokens;
//   ShardQ:       what rank 0 does with ShardQ, all H heads on the tokens it owns under the zigzag
//                 layout (shardq::make_layout), with those tokens' top-k rows.
// Both medians, their ratio (ShardQ / head-sharded; #22's target at W = 8: <= 0.35), and the bytes
// each rank sends in the step's two all-to-alls (exact counts from the layout, no padding). From
// those a predicted ShardQ step per W: attention + all-to-all bytes at the NCCL bandwidth measured
// above for that W (else at the largest W measured, else at --a2a-gbps, an assumption the line states) + the step's
// four copies (pack q, assemble q, split out, unpack out) at the measured copy rate. The ceilings
// of DESIGN.md §7 (cuBLAS bf16 GEMM, device-to-device copy) are measured first, in the same run.
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
#if SMLA_HAVE_NCCL
#include <nccl.h>
#include <unistd.h>

#include "devtools/launch.h"
#include "smla/dist.h"
#endif

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

#if SMLA_HAVE_NCCL
// What rank 0 of a W-GPU step run hands back to the parent (through a pipe), per (format, T).
struct StepResult {
  int format = 0;
  long long T = 0;
  double step_ms = 0, nccl_a2a_gbps = 0;
};

// The whole ShardQ step on W GPUs, rank `rank` of one forked process per GPU. Rank 0 prints.
int step_rank_main(const ShardqSetup& st, int W, int rank, const std::vector<uint8_t>& id, int result_fd) {
  ck(cudaSetDevice(rank), "cudaSetDevice");
  cudaStream_t s;
  ck(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "stream");
  const int H = st.heads, Hs = H / W, K = st.topk, warmup = 3;
  void* comm = dist::make_comm(id, W, rank);
  ncclComm_t nc = static_cast<ncclComm_t>(comm);
  uint64_t seed = 900;
  for (KvFormat fmt : st.formats) {
    const int rb = row_bytes(fmt, kRopeDim);
    DevMem pool(size_t(st.pool_rows) * rb);  // the replicated cache: the same rows on every rank
    if (format_is_quantized(fmt)) gpu_bench::fill_quantized_pool(static_cast<uint8_t*>(pool.p), st.pool_rows, fmt, kRopeDim, s);
    else cuda::fill_random_16bit(pool.p, size_t(st.pool_rows) * rb / 2, DType::kBF16, 1, s);
    for (long long T : st.Ts) {
      DevMem idx(size_t(T) * K * 4), q(size_t(T) * Hs * kD * kQBytes), out(size_t(T) * Hs * kLatentDim * kOutBytes);
      DevMem lse(size_t(T) * Hs * 4), cu(8);
      cuda::fill_random_rows(static_cast<int32_t*>(idx.p), size_t(T) * K, st.pool_rows, ++seed, s);  // same top-k on every rank
      cuda::fill_random_16bit(q.p, size_t(T) * Hs * kD, DType::kBF16, ++seed + uint64_t(rank) * 7919, s);
      const int32_t cu_h[2] = {0, int32_t(T)};
      ck(cudaMemcpy(cu.p, cu_h, 8, cudaMemcpyHostToDevice), "H2D");
      dist::ShardqConfig cfg;
      cfg.world = W, cfg.rank = rank, cfg.num_heads = H, cfg.format = fmt, cfg.topk = K, cfg.max_tokens = T;
      cfg.max_requests = 1, cfg.timeout_ms = 60000;
      dist::ShardQ sq(comm, cfg);
      DevMem ws(std::max<size_t>(sq.workspace_bytes(), 256));
      dist::ShardqStepArgs a;
      a.num_tokens = T, a.num_requests = 1, a.cu_seqlens = static_cast<const int32_t*>(cu.p), a.q = q.p;
      a.idx = static_cast<const int32_t*>(idx.p), a.kv = pool.p, a.num_rows = st.pool_rows, a.kv_row_stride_bytes = rb;
      a.softmax_scale = 0.1352338f, a.out = out.p, a.lse = static_cast<float*>(lse.p);
      const Timing step = time_events(s, warmup, st.reps, [&](int) { sq.step(a, ws.p, sq.workspace_bytes(), s); });
      sq.wait(s, 60000);
      // The parts, from events inside the step (medians over reps steps, each waited for).
      sq.enable_timing(true);
      std::vector<float> a2a_q, a2a_o, attn, other;
      for (int i = 0; i < st.reps; ++i) {
        sq.step(a, ws.p, sq.workspace_bytes(), s);
        sq.wait(s, 60000);
        const auto t = sq.last_timing();
        a2a_q.push_back(t.a2a_q_ms), a2a_o.push_back(t.a2a_out_ms), attn.push_back(t.attn_ms), other.push_back(t.other_ms);
      }
      sq.enable_timing(false);
      auto med = [](std::vector<float> v) {
        std::sort(v.begin(), v.end());
        return double(v[v.size() / 2]);
      };
      // A plain NCCL all-to-all of the same blocks (q, then out + lse), same buffers.
      const size_t qb = sq.a2a_q_bytes() / size_t(W), ob = sq.a2a_out_bytes(false) / size_t(W);
      const size_t lb = (sq.a2a_out_bytes(true) - sq.a2a_out_bytes(false)) / size_t(W);
      DevMem sa(std::max(qb, ob) * W), ra(std::max(qb, ob) * W), sl(std::max<size_t>(lb * W, 16)), rl(std::max<size_t>(lb * W, 16));
      auto a2a = [&](size_t bytes, size_t lbytes) {
        ck(ncclGroupStart() == ncclSuccess ? cudaSuccess : cudaErrorUnknown, "ncclGroupStart");
        for (int p = 0; p < W; ++p) {
          ncclSend(static_cast<uint8_t*>(sa.p) + p * bytes, bytes, ncclUint8, p, nc, s);
          ncclRecv(static_cast<uint8_t*>(ra.p) + p * bytes, bytes, ncclUint8, p, nc, s);
          if (lbytes) {
            ncclSend(static_cast<uint8_t*>(sl.p) + p * lbytes, lbytes, ncclUint8, p, nc, s);
            ncclRecv(static_cast<uint8_t*>(rl.p) + p * lbytes, lbytes, ncclUint8, p, nc, s);
          }
        }
        ncclResult_t r = ncclGroupEnd();
        while (r == ncclInProgress) ncclCommGetAsyncError(nc, &r);
        SMLA_CHECK(r == ncclSuccess, std::string("NCCL all-to-all: ") + ncclGetErrorString(r));
      };
      const Timing ref_q = time_events(s, warmup, st.reps, [&](int) { a2a(qb, 0); });
      const Timing ref_o = time_events(s, warmup, st.reps, [&](int) { a2a(ob, lb); });
      const double peer_q = double(qb) * (W - 1), peer_o = double(ob + lb) * (W - 1);  // bytes to peers per rank
      const double q_ms = med(a2a_q), o_ms = med(a2a_o), at_ms = med(attn), ot_ms = med(other);
      const double sum = q_ms + o_ms + at_ms + ot_ms;
      const double gbps_step = (peer_q + peer_o) / ((q_ms + o_ms) * 1e-3) / 1e9;
      const double gbps_nccl = (peer_q + peer_o) / ((ref_q.median + ref_o.median) * 1e-3) / 1e9;
      if (rank == 0) {
        const std::string fname(to_string(fmt));
        std::printf("step W=%d %-10s T %6lld H %d K %d slots %lld | step %s [%s, %s] | a2a q %.3f ms + out %.3f ms = "
                    "%.0f%% of the parts, attention %.3f ms (%.0f%%), ownership+packing %.3f ms (%.0f%%) | a2a %.1f MB to "
                    "peers per rank at %.1f GB/s; plain NCCL all-to-all of the same bytes %.3f + %.3f ms = %.1f GB/s: "
                    "reached %.2f%s\n        repro: smla bench --shardq %d --format %s --T %lld --heads %d --topk %d\n",
                    W, fname.c_str(), T, H, K, (long long)sq.slots(), format_time(step.median).c_str(),
                    format_time(step.min).c_str(), format_time(step.max).c_str(), q_ms, o_ms, 100 * (q_ms + o_ms) / sum,
                    at_ms, 100 * at_ms / sum, ot_ms, 100 * ot_ms / sum, (peer_q + peer_o) / 1e6, gbps_step, ref_q.median,
                    ref_o.median, gbps_nccl, gbps_step / gbps_nccl,
                    gbps_step / gbps_nccl >= 0.8 ? " (>= 0.8: meets #22)" : " (< 0.8: misses #22's target)", W,
                    fname.c_str(), T, H, K);
        std::fflush(stdout);
        StepResult r;
        r.format = int(fmt), r.T = T, r.step_ms = step.median, r.nccl_a2a_gbps = gbps_nccl;
        SMLA_CHECK(write(result_fd, &r, sizeof r) == ssize_t(sizeof r), "bench: writing a step result failed");
      }
    }
  }
  ck(cudaStreamSynchronize(s), "sync");
  dist::destroy_comm(comm);
  return 0;
}

// Runs the step on W GPUs; returns rank 0's results, or nothing with fewer than W GPUs.
std::vector<StepResult> bench_step(const ShardqSetup& st, int W, bool* ran) {
  int fds[2];
  SMLA_CHECK(pipe(fds) == 0, "bench: pipe failed");
  const int failed = dist::run_ranks(W, [&](int rank, const std::vector<uint8_t>& id) {
    close(fds[0]);
    return step_rank_main(st, W, rank, id, fds[1]);
  });
  close(fds[1]);
  std::vector<StepResult> res;
  StepResult r;
  while (read(fds[0], &r, sizeof r) == ssize_t(sizeof r)) res.push_back(r);
  close(fds[0]);
  *ran = failed >= 0;
  SMLA_CHECK(failed <= 0, "smla bench --shardq " + std::to_string(W) + ": " + std::to_string(failed) +
                              " rank(s) failed the ShardQ step (see their lines above)");
  return res;
}
#endif

}  // namespace

int bench_shardq(const Args& a, const ShardqSetup& st) {
  // The W-GPU steps first: run_ranks forks, and this process must not have touched CUDA before.
  std::vector<std::pair<int, double>> measured_gbps;  // (W, NCCL all-to-all GB/s to peers) from the step runs
#if SMLA_HAVE_NCCL
  for (int W : st.worlds) {
    bool ran = false;
    std::printf("ShardQ step on %d GPUs (one process per GPU) ...\n", W);
    std::fflush(stdout);
    const auto res = bench_step(st, W, &ran);
    if (!ran) {
      std::printf("  fewer than %d GPUs visible: the W = %d step is not run; its time is predicted below\n", W, W);
      continue;
    }
    double g = 0;
    for (const auto& r : res) g = std::max(g, r.nccl_a2a_gbps);  // the largest case's rate is the link's
    if (g > 0) measured_gbps.emplace_back(W, g);
  }
#else
  std::printf("this build has no NCCL: the W-GPU ShardQ step is not run; its time is predicted below\n");
#endif
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
        // The predicted ShardQ step of this W: attention + all-to-alls + the step's four copies.
        // The bandwidth measured at this W, else at the largest W measured (a rank's NVLink rate to its
        // peers hardly depends on how many share it), else the stated assumption.
        double gbps = double(st.a2a_gbps);
        int measured_w = 0;
        for (const auto& [w, g] : measured_gbps)
          if (measured_w != W && (w == W || w > measured_w)) gbps = g, measured_w = w;
        const bool measured = measured_w > 0;
        const std::string source = !measured ? "assumed: no multi-GPU run here; --a2a-gbps sets it"
                                   : measured_w == W
                                       ? "NCCL all-to-all measured on W GPUs in this run"
                                       : "NCCL all-to-all measured on " + std::to_string(measured_w) + " GPUs in this run";
        const double local = double(T) * (H / W);  // (token, head) pairs each rank holds
        const double copies_ms = 4.0 * local * (kD * kQBytes + kLatentDim * kOutBytes) / (copy * 1e12) * 1e3;
        const double a2a_ms = b.total() / (gbps * 1e9) * 1e3;
        const double pred_ms = sq.t.median + a2a_ms + copies_ms;
        std::printf("        predicted ShardQ step at W = %d: attention %.3f + all-to-alls %.3f (%.1f MB at %.0f GB/s, %s) "
                    "+ copies %.3f = %.3f ms vs head-sharded attention %.3f ms: ShardQ %s (%.2fx)\n",
                    W, sq.t.median, a2a_ms, b.total() / 1e6, gbps,
                    source.c_str(),
                    copies_ms, pred_ms, hs.t.median, pred_ms < hs.t.median ? "wins" : "loses", hs.t.median / pred_ms);
        std::fflush(stdout);  // a long run shows each case as it finishes
        char js[2048];
        std::snprintf(js, sizeof js,
                      "  {\"format\": \"%s\", \"T\": %lld, \"W\": %d, \"H\": %d, \"K\": %d, "
                      "\"head_sharded\": {\"heads\": %d, \"tokens\": %lld, \"median_ms\": %.6f, \"min_ms\": %.6f, "
                      "\"max_ms\": %.6f, \"kernel\": \"%s\", \"roofline_fraction\": %.4f}, "
                      "\"shardq\": {\"heads\": %d, \"tokens\": %lld, \"max_tokens_over_ranks\": %lld, \"median_ms\": %.6f, "
                      "\"min_ms\": %.6f, \"max_ms\": %.6f, \"kernel\": \"%s\", \"roofline_fraction\": %.4f}, "
                      "\"ratio\": %.5f, \"a2a_send_bytes_per_rank\": {\"q\": %.0f, \"out\": %.0f, \"lse\": %.0f, "
                      "\"total\": %.0f}, \"predicted_step\": {\"a2a_gbps\": %.1f, \"a2a_gbps_measured\": %s, "
                      "\"a2a_ms\": %.6f, \"copies_ms\": %.6f, \"step_ms\": %.6f}, \"repro\": \"%s\"}",
                      fname.c_str(), T, W, H, K, H / W, T, hs.t.median, hs.t.min, hs.t.max, hs.kernel.c_str(),
                      roofline(hs), H, (long long)n0, (long long)nmax, sq.t.median, sq.t.min, sq.t.max,
                      sq.kernel.c_str(), n0 > 0 ? roofline(sq) : 0.0, ratio, b.q, b.out, b.lse, b.total(), gbps,
                      measured ? "true" : "false", a2a_ms, copies_ms, pred_ms, repro.c_str());
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
