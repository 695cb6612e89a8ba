// smla bench: the main job. With a GPU, the DeepSeek-V3.2 geometry on the CUDA backend; without
// one, the CPU backend on a smaller default (and it says so).
#include "bench.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>

#include "smla/api.h"
#include "smla/formats.h"
#include "smla/reference.h"
#include "smla/testing.h"

namespace smla::cli {

double BenchRecord::roofline_fraction() const {
  double floor_s = 0;
  if (copy_tbps > 0) floor_s = std::max(floor_s, bytes / (copy_tbps * 1e12));
  if (gemm_tflops > 0) floor_s = std::max(floor_s, flops / (gemm_tflops * 1e12));
  return floor_s / (median_ms * 1e-3);
}

void print_record(const BenchRecord& r) {
  // The CPU backend runs at GFLOP/s and GB/s: print the unit that keeps three significant digits.
  const bool small = r.tflops() < 0.1;
  std::printf("%-4s %-26s %-12s T=%-6lld H=%-3lld K=%-5lld D=%lld  median %9.4f ms [%8.4f, %8.4f]  %7.2f %s  %6.3f %s",
              r.backend.c_str(), r.kernel.c_str(), r.format.c_str(), r.T, r.H, r.K, r.D, r.median_ms, r.min_ms,
              r.max_ms, small ? r.tflops() * 1e3 : r.tflops(), small ? "GFLOP/s" : "TFLOP/s",
              small ? r.tbps() * 1e3 : r.tbps(), small ? "GB/s" : "TB/s");
  if (r.gemm_tflops > 0)
    std::printf("  %.2f of GEMM  %.2f of copy  roofline %.2f", r.tflops() / r.gemm_tflops, r.tbps() / r.copy_tbps,
                r.roofline_fraction());
  std::printf("\n      repro: %s\n", r.repro.c_str());
}

void write_json(const std::string& path, const std::vector<BenchRecord>& recs, const std::string& device,
                double gemm_tflops, double copy_tbps) {
  std::ofstream f(path);
  SMLA_CHECK(f.good(), "cannot write --json file '" + path + "'");
  f << "{\"device\": \"" << device << "\", \"gemm_tflops\": " << gemm_tflops << ", \"copy_tbps\": " << copy_tbps
    << ", \"cases\": [\n";
  for (size_t i = 0; i < recs.size(); ++i) {
    const auto& r = recs[i];
    f << "  {\"backend\": \"" << r.backend << "\", \"kernel\": \"" << r.kernel << "\", \"format\": \"" << r.format
      << "\", \"T\": " << r.T << ", \"H\": " << r.H << ", \"K\": " << r.K << ", \"D\": " << r.D
      << ", \"median_ms\": " << r.median_ms << ", \"min_ms\": " << r.min_ms << ", \"max_ms\": " << r.max_ms
      << ", \"tflops\": " << r.tflops() << ", \"tbps\": " << r.tbps()
      << ", \"roofline_fraction\": " << (r.gemm_tflops > 0 ? r.roofline_fraction() : 0.0) << ", \"repro\": \""
      << r.repro << "\"}" << (i + 1 < recs.size() ? "," : "") << "\n";
  }
  f << "]}\n";
}

namespace {

int bench_cpu(const Args& a) {
  const auto Ts = a.get_ints("T", {4});
  const auto Hs = a.get_ints("heads", {16});
  const int K = int(a.get_int("topk", 256));
  const KvFormat fmt = parse_kv_format(a.get("format", "bf16"));
  const int reps = int(a.get_int("reps", 3));
  const bool q_e4m3 = a.get("q", "") == "e4m3";
  SMLA_CHECK(!q_e4m3 || fmt == KvFormat::kFP8E4M3 || fmt == KvFormat::kFP8DsMla,
             "--q e4m3 needs --format fp8_e4m3 or fp8_ds_mla");
  SMLA_CHECK(parse_score_precision(a.get("score", "bf16")) == ScorePrecision::kBF16,
             "--score fp8 chooses a CUDA kernel; the CPU reference sums every product in float64");
  std::vector<BenchRecord> recs;
  for (long long H : Hs)
    for (long long T : Ts) {
      testing::ProblemSpec s;
      s.num_tokens = T, s.num_heads = int(H), s.topk = K, s.format = fmt, s.num_rows = 1 << 16;
      s.invalid_fraction = 0, s.poison_unselected = false;
      s.q_dtype = s.out_dtype = fmt == KvFormat::kFP16 ? DType::kFP16 : DType::kBF16;
      if (q_e4m3) s.q_dtype = DType::kE4M3;
      auto hp = testing::make_problem(s, 7);
      std::vector<double> ms;
      for (int i = 0; i < reps; ++i) {
        const auto t0 = std::chrono::steady_clock::now();
        reference::sparse_mla(hp.params);
        ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
      }
      std::sort(ms.begin(), ms.end());
      BenchRecord r;
      r.backend = "cpu", r.kernel = "reference/float64", r.format = std::string(to_string(fmt)) + (q_e4m3 ? "+q_e4m3" : "");
      r.T = T, r.H = H, r.K = K, r.D = 576, r.row_bytes = row_bytes(fmt, 64);
      r.valid_entries = double(T) * K;
      r.median_ms = ms[ms.size() / 2], r.min_ms = ms.front(), r.max_ms = ms.back();
      r.flops = 2.0 * H * r.valid_entries * (576 + 512);
      r.bytes = r.valid_entries * r.row_bytes;
      r.repro = "smla bench --backend cpu --format " + std::string(to_string(fmt)) + (q_e4m3 ? " --q e4m3" : "") + " --heads " + std::to_string(H) + " --T " +
                std::to_string(T) + " --topk " + std::to_string(K);
      print_record(r);
      recs.push_back(r);
    }
  if (a.has("json")) write_json(a.get("json", ""), recs, "cpu", 0, 0);
  return 0;
}

}  // namespace

int cmd_bench(const Args& a) {
  if (a.has("dcp")) {
#if SMLA_HAVE_NCCL
    return bench_dcp(a);
#else
    fail("this build has no NCCL: smla bench --dcp is not available");
#endif
  }
  std::string backend = a.get("backend", "");
  if (backend.empty()) backend = first_cuda_device().present() && built_with_cuda() ? "cuda" : "cpu";
  if (parse_backend(backend) == Backend::kCuda) {
#if SMLA_HAVE_CUDA
    return bench_cuda(a);
#else
    fail("this build has no CUDA backend; run smla bench --backend cpu");
#endif
  }
  if (!a.has("backend"))
    std::printf("smla bench: no usable CUDA device (%s); running the CPU reference backend on a small default "
                "(H=16, T=4, K=256, bf16). The DeepSeek-V3.2 geometry (H=128/16, K=2048) needs the GPU.\n",
                built_with_cuda() ? "none found" : "CUDA backend not built");
  return bench_cpu(a);
}

}  // namespace smla::cli
