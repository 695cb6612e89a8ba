// smla bench --hisparse: a HiSparse decode step (resolve + attention over the hot buffer) against
// the same step on a resident cache (index conversion + attention over a full device cache), for
// B requests of one token each, K rows per token, and a chosen fraction of each token's rows
// reused from the previous step (the rest are rows no hot buffer holds: every one a miss).
//
// Ceiling measured in the same run: pinned host-to-device cudaMemcpy bandwidth. The miss path's
// bandwidth is the bytes the resolver copied per step over the resolve-only step time (resolve
// steps timed on their own, after the full steps); beside it, a plain gather of as many random
// pool rows (nothing but the copy, spread over every SM) and the ratio resolve / gather; and the
// step against the resident step as "resolver adds N %".
//
// Setup: each request has L = --context positions in a pinned host pool (rows in random order
// through a shuffled block table) and the same rows in a device cache. Fresh positions sweep
// through [0, L - 1) so they are never in a hot buffer (R - 1 = 2K + 126 slots hold about two
// steps); reused positions are a random subset of the previous step's. One line per case.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "bench.h"
#include "devtools/bench_support.h"
#include "cuda/tiered/gather.h"
#include "smla/cuda.h"
#include "smla/cuda_serving.h"
#include "smla/cuda_tiered.h"
#include "smla/engine.h"
#include "smla/formats.h"
#include "smla/tiered.h"

namespace smla::cli {
namespace {

void ck(cudaError_t e, const char* what) { SMLA_CHECK(e == cudaSuccess, std::string(what) + ": " + cudaGetErrorString(e)); }

struct Dev {
  void* p = nullptr;
  explicit Dev(size_t bytes) { ck(cudaMalloc(&p, std::max<size_t>(bytes, 256)), "cudaMalloc"); }
  ~Dev() { cudaFree(p); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  template <class T>
  T* as() const { return static_cast<T*>(p); }
};

struct Pinned {
  void* p = nullptr;
  explicit Pinned(size_t bytes) { ck(cudaHostAlloc(&p, std::max<size_t>(bytes, 256), cudaHostAllocMapped), "cudaHostAlloc"); }
  ~Pinned() { cudaFreeHost(p); }
  Pinned(const Pinned&) = delete;
  Pinned& operator=(const Pinned&) = delete;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

// Times fn(i) for i in [first, first + n), each between its own event pair, queued behind a GPU
// sleep so the events time the GPU, not the host's launch rate. Returns per-call ms.
template <typename Fn>
std::vector<double> time_calls(cudaStream_t s, int first, int n, Fn&& fn) {
  std::vector<cudaEvent_t> ev(size_t(2 * n));
  for (auto& e : ev) ck(cudaEventCreate(&e), "event");
  cuda::gpu_sleep(uint64_t(1'000'000) + uint64_t(n) * 100'000, s);
  for (int i = 0; i < n; ++i) {
    ck(cudaEventRecord(ev[size_t(2 * i)], s), "record");
    fn(first + i);
    ck(cudaEventRecord(ev[size_t(2 * i + 1)], s), "record");
  }
  ck(cudaStreamSynchronize(s), "timed calls");
  std::vector<double> ms;
  for (int i = 0; i < n; ++i) {
    float t = 0;
    ck(cudaEventElapsedTime(&t, ev[size_t(2 * i)], ev[size_t(2 * i + 1)]), "elapsed");
    ms.push_back(t);
  }
  for (auto& e : ev) cudaEventDestroy(e);
  return ms;
}

// Pinned host -> device cudaMemcpy bandwidth (GB/s) over `bytes` of the pool.
double measure_h2d_gbps(const void* pinned, size_t bytes, cudaStream_t s) {
  Dev dst(bytes);
  const auto ms = time_calls(s, 0, 7, [&](int) {
    ck(cudaMemcpyAsync(dst.p, pinned, bytes, cudaMemcpyHostToDevice, s), "cudaMemcpyAsync H2D");
  });
  return double(bytes) / (median(ms) * 1e-3) / 1e9;
}

// Rows of `fmt` encoded from N(0, 1) values by the CPU codec; 4096 distinct rows repeated: the
// values do not change the time.
void fill_pool(uint8_t* pool, int64_t rows, KvFormat fmt) {
  const int rb = row_bytes(fmt, kRopeDim);
  const int64_t n0 = std::min<int64_t>(rows, 4096);
  std::vector<float> lat(kLatentDim), rope(kRopeDim);
  std::normal_distribution<float> nd;
  std::mt19937 rng(7);
  for (int64_t r = 0; r < n0; ++r) {
    for (auto& v : lat) v = nd(rng);
    for (auto& v : rope) v = nd(rng);
    encode_row(fmt, kRopeDim, lat.data(), rope.data(), 1.0f, pool + r * rb);
  }
  for (int64_t done = n0; done < rows;) {
    const int64_t n = std::min(done, rows - done);
    std::memcpy(pool + done * rb, pool, size_t(n * rb));
    done += n;
  }
}

struct Case {
  KvFormat fmt;
  int B;
  int reuse_pct;
};

}  // namespace

int bench_hisparse(const Args& a) {
  SMLA_CHECK(cuda::device_count() > 0, "no CUDA device found; smla bench --hisparse needs a GPU");
  const auto Bs = a.get_ints("B", {1, 32, 128}, 1, 4096);
  const auto reuses = a.get_ints("reuse", {0, 50, 90, 100}, 0, 100);
  const int K = int(a.get_int("topk", 2048, 1, 1 << 20));
  const int H = int(a.get_int("heads", 128, 1, 128));
  const int64_t L = a.get_int("context", 16384, 1, int64_t(1) << 30);
  const int reps = int(a.get_int("reps", 10, 3, 100000));
  // --late-copy: the copy blocks wait for the resolver's end before their first host load (the
  // schedule before s10), for an A/B against the default in one session.
  const bool late_copy = a.has("late-copy");
  // --phases: after each case, `reps` more resolve-only steps, one at a time, with %globaltimer
  // stamps of the resolver's phases and of the copy blocks (medians, µs after the resolver's start).
  const bool phases = a.has("phases");
  cuda::set_tiered_copy_late_for_testing(late_copy);
  const int warmup = 3;
  std::vector<KvFormat> fmts;
  {
    const std::string f = a.get("formats", "fp8_ds_mla,bf16");
    size_t start = 0;
    while (start <= f.size()) {
      size_t end = f.find(',', start);
      if (end == std::string::npos) end = f.size();
      fmts.push_back(parse_kv_format(f.substr(start, end - start)));
      start = end + 1;
    }
  }
  SMLA_CHECK(K >= 1 && L > 4 * int64_t(K), "--context must exceed 4 x --topk so fresh rows are never hot");
  for (long long r : reuses) SMLA_CHECK(r >= 0 && r <= 100, "--reuse takes percentages in [0, 100]");
  const int maxB = int(*std::max_element(Bs.begin(), Bs.end()));
  SMLA_CHECK(maxB >= 1, "--B must be >= 1");
  const DeviceInfo dev = cuda::device_info(0);
  ck(cudaSetDevice(0), "cudaSetDevice");
  cudaStream_t s;
  ck(cudaStreamCreate(&s), "stream");
  constexpr int kBlock = 64;
  const int max_blocks = int((L + kBlock - 1) / kBlock);

  std::printf("smla bench --hisparse on %s (%d SMs): K = %d, H = %d, context %lld tokens per request, %d timed steps "
              "per case%s\n",
              dev.name.c_str(), dev.num_sms, K, H, (long long)L, reps,
              late_copy ? "; --late-copy: host reads start after the resolver's end" : "");
  std::vector<std::string> json;
  for (KvFormat fmt : fmts) {
    const int rb = row_bytes(fmt, kRopeDim);
    const int64_t pool_rows = int64_t(maxB) * max_blocks * kBlock;
    Pinned pool(size_t(pool_rows) * rb);
    fill_pool(static_cast<uint8_t*>(pool.p), pool_rows, fmt);
    Dev resident(size_t(pool_rows) * rb);
    ck(cudaMemcpy(resident.p, pool.p, size_t(pool_rows) * rb, cudaMemcpyHostToDevice), "resident copy");
    const double h2d = measure_h2d_gbps(pool.p, std::min<size_t>(size_t(pool_rows) * rb, size_t(512) << 20), s);
    std::printf("%s: %d-byte rows, host pool %.2f GB pinned; pinned cudaMemcpy H2D %.1f GB/s\n", std::string(to_string(fmt)).c_str(),
                rb, double(pool_rows) * rb / 1e9, h2d);
    // Block table: every request's blocks scattered over the pool.
    std::vector<int32_t> table(size_t(maxB) * max_blocks);
    std::iota(table.begin(), table.end(), 0);
    std::shuffle(table.begin(), table.end(), std::mt19937(11));
    Dev d_table(table.size() * 4);
    ck(cudaMemcpy(d_table.p, table.data(), table.size() * 4, cudaMemcpyHostToDevice), "table");

    for (long long B : Bs) {
      TieredCacheConfig cfg;
      cfg.format = fmt, cfg.topk = K, cfg.max_requests = int(B), cfg.max_positions = L;
      const TieredCache tc(cfg);
      Dev hot(tc.hot_buffer_bytes()), state(tc.state_bytes()), tws(tc.workspace_bytes());
      PlanConfig pc;
      pc.backend = Backend::kCuda, pc.max_rows = B;
      pc.geometry.num_heads = H, pc.geometry.format = fmt, pc.geometry.topk = K, pc.geometry.q_dtype = DType::kBF16;
      const Plan plan(pc);
      Dev aws(plan.workspace_bytes());
      Dev q(size_t(B) * H * 576 * 2), out(size_t(B) * H * kLatentDim * 2), lse(size_t(B) * H * 4);
      cuda::fill_random_16bit(q.p, size_t(B) * H * 576, DType::kBF16, 3, s);
      std::vector<int32_t> lens(static_cast<size_t>(B), static_cast<int32_t>(L));
      Dev d_lens(size_t(B) * 4), phys(size_t(B) * K * 4), counts(size_t(B) * 4), rphys(size_t(B) * K * 4),
          rcounts(size_t(B) * 4);
      ck(cudaMemcpy(d_lens.p, lens.data(), lens.size() * 4, cudaMemcpyHostToDevice), "lens");

      for (long long reuse : reuses) {
        // Positions of every step: warm-up, timed full steps, timed resolve-only steps.
        const int steps = warmup + (phases ? 3 : 2) * reps;
        std::vector<int32_t> pos(size_t(steps) * B * K);
        std::mt19937_64 rng(uint64_t(B) * 1000 + uint64_t(reuse));
        std::vector<int64_t> cursor(static_cast<size_t>(B));
        for (int64_t r = 0; r < B; ++r) cursor[size_t(r)] = (r * 7919) % (L - 1);
        const int keep = int(int64_t(K) * reuse / 100);
        for (int st = 0; st < steps; ++st)
          for (int64_t r = 0; r < B; ++r) {
            int32_t* row = pos.data() + (size_t(st) * B + r) * K;
            int n = 0;
            if (st > 0) {  // a random `keep` of the previous step's positions (the first step is all fresh)
              const int32_t* prev = row - size_t(B) * K;
              std::vector<int32_t> pv(prev, prev + K);
              std::shuffle(pv.begin(), pv.end(), rng);
              for (; n < keep; ++n) row[n] = pv[size_t(n)];
            }
            for (; n < K; ++n) {
              row[n] = int32_t(cursor[size_t(r)]);
              cursor[size_t(r)] = (cursor[size_t(r)] + 1) % (L - 1);
            }
            std::shuffle(row, row + K, rng);
          }
        Dev d_pos(pos.size() * 4);
        ck(cudaMemcpy(d_pos.p, pos.data(), pos.size() * 4, cudaMemcpyHostToDevice), "positions");
        cuda::reset_tiered_state(tc, state.p, tc.state_bytes(), s);

        auto resolve = [&](int st) {
          TieredResolveParams p;
          p.num_tokens = B, p.positions = d_pos.as<int32_t>() + size_t(st) * B * K, p.pos_stride_t = K, p.topk = K;
          p.num_reqs = int(B), p.seq_lens = d_lens.as<int32_t>();
          p.pool = pool.p, p.pool_rows = pool_rows, p.pool_row_stride_bytes = rb;
          p.block_table = d_table.as<int32_t>(), p.bt_stride = max_blocks, p.max_blocks = max_blocks;
          p.block_size = kBlock, p.block_stride_rows = kBlock;
          p.hot = hot.p, p.hot_bytes = tc.hot_buffer_bytes(), p.state = state.p, p.state_bytes = tc.state_bytes();
          p.workspace = tws.p, p.workspace_bytes = tc.workspace_bytes();
          p.phys = phys.as<int32_t>(), p.phys_stride_t = K, p.counts = counts.as<int32_t>();
          cuda::resolve_tiered(tc, p, s);
        };
        auto attend = [&](const void* kv, int64_t rows, const int32_t* idx, const int32_t* cnt) {
          SparseMlaParams p;
          p.num_tokens = B, p.num_heads = H, p.topk = K, p.q = q.p, p.q_dtype = DType::kBF16;
          p.kv = kv, p.num_rows = rows, p.format = fmt, p.idx = idx, p.counts = cnt;
          p.softmax_scale = 0.1352338f, p.out = out.p, p.out_dtype = DType::kBF16;
          p.lse = lse.as<float>(), p.lse_mode = LseMode::kBaseE;
          set_dense_strides(p);
          plan.run(p, aws.p, plan.workspace_bytes(), s);
        };
        auto resident_step = [&](int st) {
          IndexConvertParams ic;
          ic.positions = d_pos.as<int32_t>() + size_t(st) * B * K, ic.pos_stride_t = K, ic.num_tokens = B, ic.topk = K;
          ic.block_table = d_table.as<int32_t>(), ic.bt_stride = max_blocks, ic.num_reqs = int(B);
          ic.max_blocks = max_blocks, ic.block_size = kBlock, ic.block_stride_rows = kBlock;
          ic.phys = rphys.as<int32_t>(), ic.phys_stride_t = K, ic.counts = rcounts.as<int32_t>();
          cuda::convert_indices(ic, s);
          attend(resident.p, pool_rows, rphys.as<int32_t>(), rcounts.as<int32_t>());
        };
        auto tiered_step = [&](int st) {
          resolve(st);
          attend(hot.p, tc.hot_rows(), phys.as<int32_t>(), counts.as<int32_t>());
        };
        for (int st = 0; st < warmup; ++st) tiered_step(st);
        ck(cudaStreamSynchronize(s), "warm-up");
        const double t_step = median(time_calls(s, warmup, reps, tiered_step));
        const TieredCounters c0 = cuda::read_tiered_counters(tc, state.p, s);
        const double t_resolve = median(time_calls(s, warmup + reps, reps, resolve));
        const TieredCounters c1 = cuda::read_tiered_counters(tc, state.p, s);
        const double t_resident = median(time_calls(s, warmup, reps, resident_step));
        SMLA_CHECK(c1.errors == 0, "the resolver counted errors: the benchmark's inputs are wrong");
        std::string phase_line;
        if (phases) {  // fresh steps (they continue the chain), one at a time, stamped
          Dev ph(16 * sizeof(uint64_t));
          cuda::set_tiered_phase_buffer_for_testing(ph.as<uint64_t>());
          std::vector<std::vector<double>> d(16);
          for (int st = warmup + 2 * reps; st < warmup + 3 * reps; ++st) {
            uint64_t init[16] = {};
            init[8] = ~uint64_t(0);
            ck(cudaMemcpyAsync(ph.p, init, sizeof init, cudaMemcpyHostToDevice, s), "phase buffer");
            resolve(st);
            uint64_t got[16];
            ck(cudaMemcpyAsync(got, ph.p, sizeof got, cudaMemcpyDeviceToHost, s), "phase buffer");
            ck(cudaStreamSynchronize(s), "phase step");
            for (int i = 1; i < 14; ++i)
              if (got[i] != 0 && got[i] != ~uint64_t(0)) d[size_t(i)].push_back(double(int64_t(got[i] - got[0])) * 1e-3);
          }
          cuda::set_tiered_phase_buffer_for_testing(nullptr);
          auto f = [&](int i) {
            char b[32];
            if (d[size_t(i)].empty()) std::snprintf(b, sizeof b, "-");
            else std::snprintf(b, sizeof b, "%.1f", median(d[size_t(i)]));
            return std::string(b);
          };
          phase_line = "  phases (us after the resolver's start, median of " + std::to_string(reps) +
                       " single steps): resolver tokens " + f(1) + ", classified " + f(2) + ", keys " + f(13) + ", searched " + f(6) +
                       ", ranked " + f(7) + ", assigned " + f(3) + ", ids " + f(4) + ", end " + f(5) +
                       " | copy blocks: first start " + f(8) + ", last loads issued " + f(9) + ", last flag " + f(10) +
                       ", last wait passed " + f(11) + ", last end " + f(12);
        }
        const double misses = double(c1.misses - c0.misses) / reps, bytes = double(c1.bytes - c0.bytes) / reps;
        const double gbps = bytes / (t_resolve * 1e-3) / 1e9;
        // The plain gather of as many random pool rows (the reference the miss path is held to).
        double t_gather = 0;
        const int64_t n_gather = int64_t(misses + 0.5);
        if (n_gather > 0) {
          std::vector<int32_t> rows(static_cast<size_t>(n_gather));
          for (auto& x : rows) x = int32_t(rng() % uint64_t(pool_rows));
          Dev d_rows(rows.size() * 4), dst(size_t(n_gather) * rb);
          ck(cudaMemcpy(d_rows.p, rows.data(), rows.size() * 4, cudaMemcpyHostToDevice), "gather rows");
          t_gather = median(time_calls(s, 0, reps, [&](int) {
            cuda::gather_rows_from_host(pool.p, rb, d_rows.as<int32_t>(), n_gather, dst.p, rb, rb, s);
          }));
        }
        // #21's two small-step targets, judged in this run: the resolve against the plain gather of
        // as many rows (<= 1.2x), and what the resolver adds to a resident step (<= 5 % at 100 % reuse).
        const double vs_gather = t_gather > 0 ? t_resolve / t_gather : 0.0;
        const double adds_pct = (t_step / t_resident - 1.0) * 100.0;
        char vs[64];
        if (t_gather > 0) std::snprintf(vs, sizeof vs, "x%.2f", vs_gather);
        else std::snprintf(vs, sizeof vs, "no misses");
        char line[1200];
        std::snprintf(line, sizeof line,
                      "hisparse %-10s B %4lld K %d H %d reuse %3lld%%: step %.3f ms (resident %.3f ms, x%.2f, resolver adds "
                      "%+.1f%%) | resolve %.3f ms vs plain gather of the same rows %.3f ms = %s, %.0f misses/step, %.1f "
                      "MB/step, %.1f GB/s = %.2f of pinned H2D | smla bench --hisparse "
                      "--formats %s --B %lld --reuse %lld --topk %d --heads %d --context %lld",
                      std::string(to_string(fmt)).c_str(), B, K, H, reuse, t_step, t_resident, t_step / t_resident,
                      adds_pct, t_resolve, t_gather, vs, misses, bytes / 1e6, gbps, gbps / h2d,
                      std::string(to_string(fmt)).c_str(), B, reuse, K, H, (long long)L);
        std::puts(line);
        std::printf("  resolver: %s\n", cuda::tiered_one_grid_taken(tc, int(B), K, true) ? "one grid (s13)" : "two kernels");
        if (phases) std::puts(phase_line.c_str());
        std::fflush(stdout);
        char js[1024];
        std::snprintf(js, sizeof js,
                      "  {\"format\": \"%s\", \"B\": %lld, \"K\": %d, \"H\": %d, \"reuse_pct\": %lld, \"step_ms\": %.5f, "
                      "\"resident_ms\": %.5f, \"resolve_ms\": %.5f, \"gather_ms\": %.5f, \"misses_per_step\": %.1f, \"bytes_per_step\": %.0f, "
                      "\"miss_gbps\": %.3f, \"pinned_h2d_gbps\": %.3f, \"resolve_over_gather\": %.4f, "
                      "\"step_over_resident\": %.4f}",
                      std::string(to_string(fmt)).c_str(), B, K, H, reuse, t_step, t_resident, t_resolve, t_gather, misses,
                      bytes, gbps, h2d, vs_gather, t_step / t_resident);
        json.push_back(js);
      }
    }
  }
  cudaStreamDestroy(s);
  if (a.has("json")) {
    FILE* f = std::fopen(a.get("json", "").c_str(), "w");
    SMLA_CHECK(f != nullptr, "--json: cannot write " + a.get("json", ""));
    std::fprintf(f, "[\n");
    for (size_t i = 0; i < json.size(); ++i) std::fprintf(f, "%s%s\n", json[i].c_str(), i + 1 < json.size() ? "," : "");
    std::fprintf(f, "]\n");
    std::fclose(f);
  }
  return 0;
}

}  // namespace smla::cli
