// smla replay DUMP.safetensors [--backend cpu|cuda] --out RESULT.safetensors [--out-dtype bf16|f32]
// Runs one dumped attention call and writes out [T,H,512] and lse [T,H] (src/devtools/replay.h).
#include <chrono>
#include <cstdio>
#include <string>

#include "cli.h"
#include "devtools/replay.h"

namespace smla::cli {

int cmd_replay(const Args& a) {
  // Options and the one positional were checked against the grammar in cli.cpp.
  if (a.get("out", "").empty()) fail("--out RESULT.safetensors is required; see smla replay --help");
  ReplayOptions opt;
  opt.backend = parse_backend(a.get("backend", "cpu"));
  const std::string od = a.get("out-dtype", "bf16");
  if (od == "bf16") opt.out_dtype = DType::kBF16;
  else if (od == "f32" || od == "fp32") opt.out_dtype = DType::kFP32;
  else fail("--out-dtype must be bf16 or f32; got '" + od + "'");

  const std::string& in_path = a.positional[0];
  const std::string out_path = a.get("out", "");
  const st::File dump = st::read(in_path);
  const auto t0 = std::chrono::steady_clock::now();
  const st::File result = replay(dump, opt);
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  st::write(out_path, result);

  const auto& out = result.tensors.at("out");
  std::printf("replay: %s  T=%lld H=%lld format=%s backend=%s out=%s lse=base %s  %.1f ms -> %s\n",
              in_path.c_str(), (long long)out.shape[0], (long long)out.shape[1],
              result.metadata.at("format").c_str(), result.metadata.at("backend").c_str(), out.dtype.c_str(),
              result.metadata.at("lse_base").c_str(), ms, out_path.c_str());
  return 0;
}

}  // namespace smla::cli
