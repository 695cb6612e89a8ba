// Benchmark records shared by the CPU and CUDA benchmarks: one self-describing line per case
// and a JSON array of the same records.
#pragma once

#include <string>
#include <vector>

#include "cli.h"
#include "smla/types.h"

namespace smla::cli {

struct BenchRecord {
  std::string backend, kernel, format;
  long long T = 0, H = 0, K = 0, D = 576, row_bytes = 0;
  double valid_entries = 0;            // sum over rows of valid entries (the n of DESIGN.md §7)
  double median_ms = 0, min_ms = 0, max_ms = 0;
  double flops = 0, bytes = 0;         // DESIGN.md §7 counts
  double gemm_tflops = 0, copy_tbps = 0;  // ceilings measured in the same run (0 on the CPU)
  // The third ceiling (issue #19): a kernel that only reads the same rows (same index sets, 16-byte
  // loads) in the same run, median of the same number of reps; 0: not measured (CPU, odd row size).
  double gather_ms = 0;
  std::string repro;                   // command that reproduces the case
  double tflops() const { return flops / (median_ms * 1e-3) / 1e12; }
  double tbps() const { return bytes / (median_ms * 1e-3) / 1e12; }
  // max(bytes / copy, flops / gemm) / time: 1.0 is the roofline.
  double roofline_fraction() const;
  // Memory-bound cases are quoted against the gather limit: H <= 64, and every quantized format.
  bool memory_bound() const;
  // gather_ms / median_ms for a memory-bound case with a measured gather limit, else 0 (not quoted).
  double gather_fraction() const;
};

// "812.3 µs", "12.345 ms", "1.23 s": the unit that fits.
std::string format_time(double ms);
// The column names, printed once before the first record (with_ceilings: the GPU's fraction columns).
void print_header(bool with_ceilings);
// One case, flushed at once: "index+1/total" first, so a long run shows its progress.
void print_record(const BenchRecord& r, size_t index, size_t total);
// --json FILE: refuses a path that cannot be written, before anything runs.
void check_json_path(const Args& a);
// gather_tbps: the run's gather-limit rate (reads only) of its row size, 0 where none was measured.
void write_json(const std::string& path, const std::vector<BenchRecord>& recs, const std::string& device,
                double gemm_tflops, double copy_tbps, double gather_tbps = 0, int gather_row_bytes = 0);

// smla bench --shardq W[,W...]: what it runs, parsed and checked before any device is touched (in
// every build, so a bad combination is refused the same way with or without CUDA).
struct ShardqSetup {
  std::vector<int> worlds;           // W: tensor-parallel ranks, each dividing `heads`
  std::vector<KvFormat> formats;     // bf16 and / or fp8_ds_mla
  std::vector<long long> Ts;         // tokens of the one prefill request
  int heads = 128, topk = 2048, reps = 30;
  long long pool_rows = 1 << 20;
  int a2a_gbps = 350;  // all-to-all GB/s (bytes a rank sends its peers) assumed for predictions without W GPUs
};
ShardqSetup parse_shardq(const Args& a);

#if SMLA_HAVE_CUDA
// The GPU benchmark (tools/smla/bench_cuda.cpp); returns the process exit code.
int bench_cuda(const Args& a);
#endif
#if SMLA_HAVE_CUDA
// smla bench --hisparse (tools/smla/bench_hisparse.cpp).
int bench_hisparse(const Args& a);
#endif
#if SMLA_HAVE_CUDA
// smla bench --shardq (tools/smla/bench_shardq.cpp).
int bench_shardq(const Args& a, const ShardqSetup& setup);
#endif
#if SMLA_HAVE_NCCL
// smla bench --dcp W (tools/smla/bench_dcp.cpp).
int bench_dcp(const Args& a);
#endif

}  // namespace smla::cli
