// smla bench: the main job. With a GPU, the DeepSeek-V3.2 geometry on the CUDA backend; without
// one, the CPU backend on a smaller default (and it says so).
#include "bench.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "devtools/testing.h"
#include "reference/sparse_mla.h"
#include "smla/api.h"
#include "smla/formats.h"

namespace smla::cli {

double BenchRecord::roofline_fraction() const {
  double floor_s = 0;
  if (copy_tbps > 0) floor_s = std::max(floor_s, bytes / (copy_tbps * 1e12));
  if (gemm_tflops > 0) floor_s = std::max(floor_s, flops / (gemm_tflops * 1e12));
  return floor_s / (median_ms * 1e-3);
}

bool BenchRecord::memory_bound() const {
  const std::string base = format.substr(0, format.find('+'));  // "fp8_e4m3+q_e4m3": the cache's format
  return H <= 64 || format_is_quantized(parse_kv_format(base));
}

double BenchRecord::gather_fraction() const {
  return memory_bound() && gather_ms > 0 && median_ms > 0 ? gather_ms / median_ms : 0.0;
}

std::string format_time(double ms) {
  // µs below a millisecond, ms below a second, else s: three or four significant digits.
  char b[32];
  if (ms < 1.0) std::snprintf(b, sizeof b, "%.1f µs", ms * 1e3);
  else if (ms < 1e3) std::snprintf(b, sizeof b, "%.3f ms", ms);
  else std::snprintf(b, sizeof b, "%.2f s", ms * 1e-3);
  return b;
}

namespace {
// Right-aligns s in `width` columns ("µ" is two bytes but one column).
std::string right(const std::string& s, size_t width) {
  size_t cols = 0;
  for (unsigned char c : s) cols += (c & 0xc0) != 0x80;
  return cols >= width ? s : std::string(width - cols, ' ') + s;
}
}  // namespace

void print_header(bool with_ceilings) {
  std::printf("%-7s %-4s %-26s %-15s %6s %4s %5s %4s %11s  %-25s %-16s %-12s%s\n", "case", "back", "kernel", "format",
              "T", "H", "K", "D", "median", "[min, max]", "compute", "memory",
              with_ceilings ? "  GEMM  copy  roofline gather [its time] (fractions of the ceilings; gather: memory-bound cases)"
                            : "");
  std::fflush(stdout);
}

void print_record(const BenchRecord& r, size_t index, size_t total) {
  // The CPU backend runs at GFLOP/s and GB/s: print the unit that keeps three significant digits.
  const bool small = r.tflops() < 0.1;
  const std::string progress = std::to_string(index + 1) + "/" + std::to_string(total);
  const std::string range = "[" + format_time(r.min_ms) + ", " + format_time(r.max_ms) + "]";
  char rate[32], bw[32];
  std::snprintf(rate, sizeof rate, "%.2f %s", small ? r.tflops() * 1e3 : r.tflops(), small ? "GFLOP/s" : "TFLOP/s");
  std::snprintf(bw, sizeof bw, "%.3f %s", small ? r.tbps() * 1e3 : r.tbps(), small ? "GB/s" : "TB/s");
  std::printf("%-7s %-4s %-26s %-15s %6lld %4lld %5lld %4lld %s  %s %-16s %-12s", progress.c_str(), r.backend.c_str(),
              r.kernel.c_str(), r.format.c_str(), r.T, r.H, r.K, r.D, right(format_time(r.median_ms), 11).c_str(),
              (range + std::string(range.size() < 26 ? 26 - range.size() : 0, ' ')).c_str(), rate, bw);
  if (r.gemm_tflops > 0) {
    std::printf("  %.2f  %.2f  %.2f", r.tflops() / r.gemm_tflops, r.tbps() / r.copy_tbps, r.roofline_fraction());
    if (r.gather_fraction() > 0) std::printf("     %.2f", r.gather_fraction());
    else std::printf("        -");
    if (r.gather_ms > 0) std::printf(" [%s]", format_time(r.gather_ms).c_str());
  }
  std::printf("\n        repro: %s\n", r.repro.c_str());
  std::fflush(stdout);  // a long run shows each case as it finishes
}

void check_json_path(const Args& a) {
  if (!a.has("json")) return;
  const std::string path = a.get("json", "");
  SMLA_CHECK(!path.empty(), "--json needs a file name");
  const bool existed = std::filesystem::exists(path);
  SMLA_CHECK(!std::filesystem::is_directory(path), "--json '" + path + "' is a directory; give a file name");
  {
    std::ofstream f(path, std::ios::app);
    SMLA_CHECK(f.good(), "cannot write --json file '" + path + "' (checked before the run): does its directory exist?");
  }
  if (!existed) std::filesystem::remove(path);
}

void write_json(const std::string& path, const std::vector<BenchRecord>& recs, const std::string& device,
                double gemm_tflops, double copy_tbps, double gather_tbps, int gather_row_bytes) {
  std::ofstream f(path);
  SMLA_CHECK(f.good(), "cannot write --json file '" + path + "'");
  f << "{\"device\": \"" << device << "\", \"gemm_tflops\": " << gemm_tflops << ", \"copy_tbps\": " << copy_tbps
    << ", \"gather_tbps\": " << gather_tbps << ", \"gather_row_bytes\": " << gather_row_bytes << ", \"cases\": [\n";
  for (size_t i = 0; i < recs.size(); ++i) {
    const auto& r = recs[i];
    f << "  {\"backend\": \"" << r.backend << "\", \"kernel\": \"" << r.kernel << "\", \"format\": \"" << r.format
      << "\", \"T\": " << r.T << ", \"H\": " << r.H << ", \"K\": " << r.K << ", \"D\": " << r.D
      << ", \"median_ms\": " << r.median_ms << ", \"min_ms\": " << r.min_ms << ", \"max_ms\": " << r.max_ms
      << ", \"tflops\": " << r.tflops() << ", \"tbps\": " << r.tbps()
      << ", \"roofline_fraction\": " << (r.gemm_tflops > 0 ? r.roofline_fraction() : 0.0)
      << ", \"memory_bound\": " << (r.memory_bound() ? "true" : "false") << ", \"gather_ms\": " << r.gather_ms
      << ", \"gather_fraction\": " << r.gather_fraction() << ", \"repro\": \""
      << r.repro << "\"}" << (i + 1 < recs.size() ? "," : "") << "\n";
  }
  f << "]}\n";
}

namespace {

int bench_cpu(const Args& a) {
  const auto Ts = a.get_ints("T", {4}, 1, 1 << 20);
  const auto Hs = a.get_ints("heads", {16}, 1, 1 << 12);
  const int K = int(a.get_int("topk", 256, 1, 1 << 20));
  const KvFormat fmt = parse_kv_format(a.get("format", "bf16"));
  const int reps = int(a.get_int("reps", 3, 1, 1 << 20));
  const bool q_e4m3 = a.get("q", "") == "e4m3";
  SMLA_CHECK(!q_e4m3 || fmt == KvFormat::kFP8E4M3 || fmt == KvFormat::kFP8DsMla,
             "--q e4m3 needs --format fp8_e4m3 or fp8_ds_mla");
  SMLA_CHECK(parse_score_precision(a.get("score", "auto")) != ScorePrecision::kFP8,
             "--score fp8 chooses a CUDA kernel; the CPU reference sums every product in float64");
  std::vector<BenchRecord> recs;
  print_header(false);
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
      print_record(r, recs.size(), Hs.size() * Ts.size());
      recs.push_back(r);
    }
  if (a.has("json")) write_json(a.get("json", ""), recs, "cpu", 0, 0);
  return 0;
}

}  // namespace

ShardqSetup parse_shardq(const Args& a) {
  ShardqSetup st;
  st.heads = int(a.get_int("heads", 128, 1, kMaxNativeHeads));
  for (long long w : a.get_ints("shardq", {2, 4, 8}, 2, kMaxNativeHeads)) {
    SMLA_CHECK(st.heads % w == 0, "--shardq " + std::to_string(w) + ": W must divide the " + std::to_string(st.heads) +
                                      " query heads (each rank holds H / W of them); use 2, 4 or 8");
    st.worlds.push_back(int(w));
  }
  SMLA_CHECK(!(a.has("format") && a.has("formats")), "give --format F or --formats F[,F...] with --shardq, not both");
  const std::string f = a.has("format") ? a.get("format", "") : a.get("formats", "bf16,fp8_ds_mla");
  for (size_t start = 0; start <= f.size();) {
    size_t end = f.find(',', start);
    if (end == std::string::npos) end = f.size();
    const KvFormat fmt = parse_kv_format(f.substr(start, end - start));
    SMLA_CHECK(fmt == KvFormat::kBF16 || fmt == KvFormat::kFP8DsMla,
               "--shardq times the bf16 and fp8_ds_mla caches (issue #22); got " + std::string(to_string(fmt)) +
                   " in --format(s)");
    st.formats.push_back(fmt);
    start = end + 1;
  }
  st.Ts = a.get_ints("T", {4096, 16384}, 1, 1 << 20);
  st.topk = int(a.get_int("topk", 2048, 1, 1 << 20));
  st.reps = int(a.get_int("reps", 30, 20, 1 << 20));  // >= 20: the spread needs the samples
  st.pool_rows = a.get_int("pool", 1 << 20, 1, int64_t(1) << 31);
  st.a2a_gbps = int(a.get_int("a2a-gbps", 350, 1, 100000));
  check_json_path(a);
  return st;
}

int cmd_bench(const Args& a) {
  // Every flag given is used by the chosen path, or refused (never silently ignored).
  SMLA_CHECK(!a.has("q") || a.get("q", "") == "e4m3",
             "--q must be e4m3 (without it q is bf16, or fp16 for an fp16 cache); got '" + a.get("q", "") + "'");
  if (a.has("hisparse")) {
#if SMLA_HAVE_CUDA
    for (const auto& [key, value] : a.kv)
      SMLA_CHECK(key == "hisparse" || key == "formats" || key == "B" || key == "reuse" || key == "topk" ||
                     key == "heads" || key == "context" || key == "reps" || key == "json" || key == "late-copy" ||
                     key == "phases",
                 "--" + key + " has no effect with --hisparse (it reads --formats, --B, --reuse, --topk, --heads, "
                 "--context, --reps, --late-copy, --phases and --json)");
    return bench_hisparse(a);
#else
    fail("smla bench --hisparse needs the CUDA backend; this build has none (build with nvcc on the PATH)");
#endif
  }
  if (a.has("shardq")) {
    for (const auto& kv : a.kv) {
      const std::string& key = kv.first;
      SMLA_CHECK(key == "shardq" || key == "format" || key == "formats" || key == "T" || key == "heads" ||
                     key == "topk" || key == "reps" || key == "pool" || key == "json" || key == "a2a-gbps",
                 "--" + key + " has no effect with --shardq (it reads --format or --formats, --T, --heads, --topk, "
                 "--reps, --pool, --a2a-gbps and --json)");
    }
    const ShardqSetup setup = parse_shardq(a);  // every argument checked before a device is touched
#if SMLA_HAVE_CUDA
    return bench_shardq(a, setup);
#else
    (void)setup;
    fail("smla bench --shardq needs the CUDA backend; this build has none (build with nvcc on the PATH)");
#endif
  }
  for (const char* key : {"formats", "B", "reuse", "context", "late-copy"})
    SMLA_CHECK(!a.has(key), std::string("--") + key + " is read only with --hisparse or --shardq");
  if (a.has("dcp")) {
    for (const auto& kv : a.kv) {
      const std::string& key = kv.first;
      SMLA_CHECK(key == "dcp" || key == "T" || key == "heads" || key == "topk" || key == "reps" || key == "rows",
                 "--" + key + " has no effect with --dcp (it reads --T, --heads, --topk, --reps and --rows)");
    }
#if SMLA_HAVE_NCCL
    return bench_dcp(a);
#else
    fail("this build has no NCCL: smla bench --dcp is not available");
#endif
  }
  SMLA_CHECK(!a.has("rows"), "--rows is read only with --dcp W (the DCP request's KV rows)");
  std::string backend = a.get("backend", "");
  if (backend.empty()) backend = first_cuda_device().present() && built_with_cuda() ? "cuda" : "cpu";
  if (parse_backend(backend) == Backend::kCuda) {
#if !SMLA_PHASE_TIMER
    // Said before any device is touched: the stamps are compiled out of this build.
    SMLA_CHECK(!a.has("phases"),
               "--phases needs the kernels' phase stamps: configure with -DSMLA_PHASE_TIMER=ON and rebuild");
#endif
    // Same words as smla info: the build, then the device (never a driver message from deep inside).
    const Support s = backend_support(Backend::kCuda, Geometry{});
    SMLA_CHECK(s.ok(), "--backend cuda: " + s.reason);
    check_json_path(a);
#if SMLA_HAVE_CUDA
    return bench_cuda(a);
#else
    fail("this build has no CUDA backend; run smla bench --backend cpu");
#endif
  }
  for (const char* k : {"dim", "pool", "splits", "phases", "graph"})
    SMLA_CHECK(!a.has(k), std::string("--") + k +
                              " applies to the CUDA backend only; the CPU benchmark does not use it (drop it, or run "
                              "--backend cuda on an SM90 GPU)");
  check_json_path(a);
  if (!a.has("backend"))
    std::printf("smla bench: no usable CUDA device (%s); running the CPU reference backend (defaults H=16, T=4, "
                "K=256, bf16). The DeepSeek-V3.2 geometry (H=128/16, K=2048) needs the GPU.\n",
                built_with_cuda() ? "none found" : "CUDA backend not built");
  return bench_cpu(a);
}

}  // namespace smla::cli
