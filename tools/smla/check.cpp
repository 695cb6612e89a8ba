// smla check: random problems through every available backend, compared with the float64
// reference (DESIGN.md §8 tolerances: out relative L2 <= 1e-2, LSE abs <= 1e-3; where the CUDA backend
// runs fp8 scores — an e4m3 q under the default score precision auto — §8's fp8-product bar: out
// relative L2 <= 5e-3, LSE abs <= 1e-2).
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "cli.h"
#include "devtools/testing.h"
#include "smla/api.h"

namespace smla::cli {
namespace {

struct Case {
  const char* name;
  testing::ProblemSpec spec;
  ScorePrecision score = ScorePrecision::kAuto;
};

std::vector<Case> cases(bool quick) {
  std::vector<Case> v;
  auto add = [&](const char* name, auto&& edit, ScorePrecision score = ScorePrecision::kAuto) {
    testing::ProblemSpec s;
    edit(s);
    v.push_back({name, s, score});
  };
  for (KvFormat f : {KvFormat::kBF16, KvFormat::kFP16, KvFormat::kFP8E4M3, KvFormat::kFP8DsMla, KvFormat::kNvFP4DsMla}) {
    add("H=16 K=64", [&](auto& s) {
      s.format = f;
      s.q_dtype = f == KvFormat::kFP16 ? DType::kFP16 : DType::kBF16;
      s.out_dtype = f == KvFormat::kFP16 ? DType::kFP16 : DType::kBF16;
    });
  }
  for (KvFormat f : {KvFormat::kFP8E4M3, KvFormat::kFP8DsMla}) {  // an e4m3 q (the serving path of fp8 caches)
    auto e4m3_q = [&](auto& s) {
      s.format = f, s.num_heads = 64, s.topk = 300, s.q_dtype = DType::kE4M3, s.q_scale = 0.05f;
    };
    add("H=64 K=300 e4m3 q", e4m3_q);                                   // auto: fp8 scores on CUDA
    add("H=64 K=300 e4m3 q bf16 S", e4m3_q, ScorePrecision::kBF16);  // q widened to bf16
  }
  add("H=3 K=77 counts sink lse2", [](auto& s) {
    s.num_heads = 3, s.topk = 77, s.use_counts = true, s.sink = true, s.lse_mode = LseMode::kBase2;
  });
  add("H=128 K=128 D=512", [](auto& s) { s.num_heads = 128, s.topk = 128, s.rope_dim = 0, s.num_tokens = 2; });
  add("all-invalid row, q pair", [](auto& s) { s.all_invalid_row = true, s.q_pair = true; });
  if (!quick) {
    add("H=48 K=300 T=33", [](auto& s) { s.num_heads = 48, s.topk = 300, s.num_tokens = 33; });
    add("H=128 K=2048 T=3", [](auto& s) { s.num_heads = 128, s.topk = 2048, s.num_tokens = 3, s.num_rows = 8192; });
  }
  return v;
}

}  // namespace

int cmd_check(const Args& a) {
  const uint64_t seed = uint64_t(a.get_int("seed", 1234, 0, std::numeric_limits<long long>::max()));
  const bool quick = a.has("quick");
  int failures = 0, runs = 0;
  std::printf("%-28s %-13s %-5s %-11s %-11s %s\n", "case", "format", "back", "out rel L2", "lse max abs", "result");
  std::printf("(an e4m3 q on CUDA runs fp8 scores by default: bar rel L2 <= 5e-3, LSE <= 1e-2; else 1e-2 / 1e-3)\n");
  for (const auto& c : cases(quick)) {
    for (Backend b : {Backend::kCpu, Backend::kCuda}) {
      auto hp = testing::make_problem(c.spec, seed);
      hp.params.score_precision = c.score;
      const Support s = backend_support(b, geometry_of(hp.params));
      if (!s.ok()) {
        std::printf("%-28s %-13s %-5s %-11s %-11s skipped: %s\n", c.name, std::string(to_string(c.spec.format)).c_str(),
                    std::string(to_string(b)).c_str(), "-", "-", s.reason.c_str());
        continue;
      }
      std::vector<double> ref_out, ref_lse;
      testing::reference_double(hp, ref_out, ref_lse);
      run_host(b, hp.params, hp.kv_bytes());
      const auto d = testing::compare(hp, ref_out, ref_lse);
      // The CPU reference sums in float64 whatever the precision asks.
      const bool fp8_scores =
          b == Backend::kCuda && resolve_score_precision(geometry_of(hp.params)) == ScorePrecision::kFP8;
      const bool ok = fp8_scores ? d.rel_l2 <= 5e-3 && d.lse_max_abs <= 1e-2 : d.rel_l2 <= 1e-2 && d.lse_max_abs <= 1e-3;
      ++runs;
      failures += !ok;
      std::printf("%-28s %-13s %-5s %-11.3e %-11.3e %s\n", c.name, std::string(to_string(c.spec.format)).c_str(),
                  std::string(to_string(b)).c_str(), d.rel_l2, d.lse_max_abs, ok ? "PASS" : "FAIL");
    }
  }
  std::printf("%d passed, %d failed\n", runs - failures, failures);
  return failures ? 1 : 0;
}

}  // namespace smla::cli
