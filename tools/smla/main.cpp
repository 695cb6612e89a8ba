// smla — the command-line face of the engine: info, check, bench, replay.
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>

#include "cli.h"
#include "smla/types.h"

namespace smla::cli {

std::string Args::get(const std::string& k, const std::string& dflt) const {
  auto it = kv.find(k);
  return it == kv.end() ? dflt : it->second;
}
long long Args::get_int(const std::string& k, long long dflt) const {
  auto it = kv.find(k);
  if (it == kv.end()) return dflt;
  try {
    size_t pos = 0;
    long long v = std::stoll(it->second, &pos);
    if (pos == it->second.size()) return v;
  } catch (...) {
  }
  fail("--" + k + " must be an integer; got '" + it->second + "'");
}
double Args::get_double(const std::string& k, double dflt) const {
  auto it = kv.find(k);
  if (it == kv.end()) return dflt;
  try {
    size_t pos = 0;
    double v = std::stod(it->second, &pos);
    if (pos == it->second.size()) return v;
  } catch (...) {
  }
  fail("--" + k + " must be a number; got '" + it->second + "'");
}
std::vector<long long> Args::get_ints(const std::string& k, const std::vector<long long>& dflt) const {
  auto it = kv.find(k);
  if (it == kv.end()) return dflt;
  std::vector<long long> out;
  size_t start = 0;
  const std::string& s = it->second;
  while (start <= s.size()) {
    size_t end = s.find(',', start);
    if (end == std::string::npos) end = s.size();
    const std::string part = s.substr(start, end - start);
    try {
      size_t pos = 0;
      out.push_back(std::stoll(part, &pos));
      if (pos != part.size()) throw 0;
    } catch (...) {
      fail("--" + k + " must be comma-separated integers; got '" + s + "'");
    }
    start = end + 1;
  }
  return out;
}

Args parse_args(int argc, char** argv, int first) {
  Args a;
  for (int i = first; i < argc; ++i) {
    std::string s = argv[i];
    if (s.rfind("--", 0) == 0) {
      std::string key = s.substr(2), val = "1";
      if (auto eq = key.find('='); eq != std::string::npos) {
        val = key.substr(eq + 1);
        key = key.substr(0, eq);
      } else if (i + 1 < argc && std::strncmp(argv[i + 1], "--", 2) != 0) {
        val = argv[++i];
      }
      a.kv[key] = val;
    } else {
      a.positional.push_back(s);
    }
  }
  return a;
}

}  // namespace smla::cli

namespace {
void usage() {
  std::puts(
      "usage: smla <command> [options]\n"
      "  info   [--heads H --format F --q-dtype Q --topk K --rope-dim 64|0 --score bf16|fp8]   build, devices, which kernel runs\n"
      "  check  [--seed N --quick]                                random problems, every backend vs reference\n"
      "  bench  [--backend cpu|cuda --heads 128,16 --T 1,32,128 --topk 2048 --format bf16 [--q e4m3 [--score fp8]] [--splits N] [--phases] [--graph] --json F]\n"
      "  replay DUMP.safetensors [--backend cpu|cuda] --out RESULT.safetensors [--out-dtype bf16|f32]");
}
}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || !std::strcmp(argv[1], "-h") || !std::strcmp(argv[1], "--help")) {
    usage();
    return argc < 2 ? 2 : 0;
  }
  const std::string cmd = argv[1];
  try {
    const auto args = smla::cli::parse_args(argc, argv, 2);
    if (cmd == "info") return smla::cli::cmd_info(args);
    if (cmd == "check") return smla::cli::cmd_check(args);
    if (cmd == "bench") return smla::cli::cmd_bench(args);
    if (cmd == "replay") return smla::cli::cmd_replay(args);
    std::fprintf(stderr, "smla: unknown command '%s'\n", cmd.c_str());
    usage();
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "smla %s: error: %s\n", cmd.c_str(), e.what());
    return 1;
  }
}
