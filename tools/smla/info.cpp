// smla info: the build, the devices found, and which backend/kernel would run a problem (the
// CUDA variant table, smla/support.h), or why none.
#include <cstdio>

#include "cli.h"
#include "cuda/common/phase.h"
#include "smla/api.h"
#include "smla/formats.h"

namespace smla::cli {

int cmd_info(const Args& a) {
  Geometry g;
  g.num_heads = int(a.get_int("heads", 128, 1, 1 << 20));
  g.format = parse_kv_format(a.get("format", "bf16"));
  g.q_dtype = parse_dtype(a.get("q-dtype", g.format == KvFormat::kFP16 ? "fp16" : "bf16"));
  g.topk = int(a.get_int("topk", 2048, 0, 1 << 30));  // 0 reaches the support check, which says why
  g.rope_dim = int(a.get_int("rope-dim", 64, 0, 1 << 20));
  g.sink = a.has("sink");
  g.score_precision = parse_score_precision(a.get("score", "auto"));

  std::printf("smla %s  (C++20; CUDA backend: %s%s)\n", "0.1.0", built_with_cuda() ? "built (sm_90a)" : "not built",
              cuda::phase::kEnabled ? "; phase timer compiled in" : "");
  const DeviceInfo dev = first_cuda_device();
  if (dev.present())
    std::printf("device 0: %s, sm_%d%d, %d SMs, %zu KiB shared memory per block\n", dev.name.c_str(), dev.cc_major,
                dev.cc_minor, dev.num_sms, dev.smem_per_block_optin / 1024);
  else
    std::printf("devices: none found\n");
  // The resolved score precision, with "(auto)" when the default chose it.
  const std::string scores = std::string(to_string(resolve_score_precision(g))) +
                             (g.score_precision == ScorePrecision::kAuto ? " (auto)" : "");
  std::printf("problem: H=%d D=%d format=%s (%d B/row) q=%s K=%d sink=%s scores=%s\n", g.num_heads,
              kLatentDim + g.rope_dim, std::string(to_string(g.format)).c_str(),
              (g.rope_dim == 0 || g.rope_dim == 64) ? row_bytes(g.format, g.rope_dim) : 0,
              std::string(to_string(g.q_dtype)).c_str(), g.topk, g.sink ? "on" : "off",
              scores.c_str());
  // A geometry no backend can run names no kernel, and info exits 1.
  const bool runnable = support_common(g).ok();
  if (built_with_cuda() && runnable) std::printf("  kernel on an SM90 GPU: %s\n", cuda_kernel_for(g).c_str());
  for (Backend b : {Backend::kCuda, Backend::kCpu}) {
    const Support s = backend_support(b, g);
    if (s.ok())
      std::printf("  %-4s: runs%s%s\n", std::string(to_string(b)).c_str(),
                  b == Backend::kCuda ? " with kernel " : " with the float64 reference",
                  b == Backend::kCuda ? cuda_kernel_for(g, dev).c_str() : "");
    else
      std::printf("  %-4s: cannot run: %s\n", std::string(to_string(b)).c_str(), s.reason.c_str());
  }
  // The variant table on an SM90 GPU: each variant, whether it takes this problem, and why not.
  if (!runnable) return 1;
  const CudaVariant* selected = cuda_variant_for(g, any_sm90_device());
  std::printf("CUDA variants (the first that supports the problem runs; on an SM90 GPU: %s):\n",
              selected != nullptr ? selected->name : "none");
  for (const CudaVariant& v : cuda_variants()) {
    const Support s = v.supports(g, any_sm90_device());
    std::printf("  %-10s scores %-4s  %s\n             %s\n", v.name, std::string(to_string(v.score_precision)).c_str(),
                s.ok() ? "supports this problem" : ("not this problem: " + s.reason).c_str(), v.notes);
  }
  return runnable ? 0 : 1;
}

}  // namespace smla::cli
