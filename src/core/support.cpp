#include "smla/support.h"

#include <string>
#include <string_view>

#include "smla/formats.h"

namespace smla {

Support support_common(const Geometry& g) {
  if (g.num_heads < 1) return {"num_heads must be >= 1"};
  if (g.rope_dim != 0 && g.rope_dim != kRopeDim)
    return {"head size " + std::to_string(kLatentDim + g.rope_dim) +
            " is not supported; smla supports D = 576 (512 latent + 64 RoPE) or D = 512 (rope_dim = 0)"};
  if (g.topk < 1) return {"top-k capacity must be >= 1"};
  if (g.q_dtype != DType::kBF16 && g.q_dtype != DType::kFP16 && g.q_dtype != DType::kE4M3)
    return {"q dtype " + std::string(to_string(g.q_dtype)) + " is not supported; use bf16 or fp16"};
  if (g.q_dtype == DType::kE4M3 && g.format != KvFormat::kFP8E4M3 && g.format != KvFormat::kFP8DsMla)
    return {"an e4m3 q is only read with the fp8 caches (fp8_e4m3, fp8_ds_mla); pass a bf16 q for " +
            std::string(to_string(g.format))};
  if (g.q_dtype == DType::kBF16 && g.format == KvFormat::kFP16)
    return {"a bf16 q with an fp16 cache is not supported; cast q to fp16 or store the cache as bf16"};
  if (g.q_dtype == DType::kFP16 && g.format == KvFormat::kBF16)
    return {"an fp16 q with a bf16 cache is not supported; cast q to bf16 or store the cache as fp16"};
  if (g.score_precision == ScorePrecision::kFP8 && g.q_dtype != DType::kE4M3)
    return {"score precision fp8 multiplies an e4m3 q with fp8 rows; got a " + std::string(to_string(g.q_dtype)) +
            " q with a " + std::string(to_string(g.format)) +
            " cache: use score precision bf16, or an e4m3 q with fp8_e4m3 / fp8_ds_mla"};
  return {};
}

Support support_cpu(const Geometry& g) { return support_common(g); }

ScorePrecision resolve_score_precision(const Geometry& g) {
  if (g.score_precision != ScorePrecision::kAuto) return g.score_precision;
  const bool fp8_cache = g.format == KvFormat::kFP8E4M3 || g.format == KvFormat::kFP8DsMla;
  // fp8_ds_mla at H <= 32, the swap-AB kernel: its bf16 scores (q widened exactly) run faster than the
  // fp8 score path there (docs/perf-history.md#s11-swapab, #s14-swapab-n32), and are the more accurate.
  if (g.format == KvFormat::kFP8DsMla && g.num_heads <= kSwapAbMaxHeads) return ScorePrecision::kBF16;
  return g.q_dtype == DType::kE4M3 && fp8_cache ? ScorePrecision::kFP8 : ScorePrecision::kBF16;
}

Geometry geometry_of(const SparseMlaParams& p) {
  Geometry g;
  g.num_heads = p.num_heads;
  g.rope_dim = p.rope_dim;
  g.format = p.format;
  g.q_dtype = p.q_dtype;
  g.topk = p.topk;
  g.lse_mode = p.lse ? p.lse_mode : LseMode::kOff;
  g.sink = p.sink != nullptr;
  g.score_precision = p.score_precision;
  return g;
}

namespace {

Support sm90_device(const DeviceInfo& dev) {
  if (!dev.present()) return {"no CUDA device found; use the CPU backend"};
  if (dev.cc_major != 9 || dev.cc_minor != 0)
    return {"smla's CUDA kernels are built for SM90 (H100/H200); found sm_" + std::to_string(dev.cc_major) +
            std::to_string(dev.cc_minor) + " (" + dev.name + "); use the CPU backend"};
  return {};
}

// What every SM90 variant needs: the device, the shared rules, and the kernel's own limits.
Support sm90_common(const Geometry& g, const DeviceInfo& dev) {
  if (auto s = sm90_device(dev); !s.ok()) return s;
  if (auto s = support_common(g); !s.ok()) return s;
  if (format_is_quantized(g.format) && g.q_dtype == DType::kFP16)
    return {"the SM90 kernel reads the " + std::string(to_string(g.format)) +
            " cache with a bf16 q (or an e4m3 q for the fp8 caches); got an fp16 q: cast q to bf16 or use the CPU "
            "backend"};
  if (g.num_heads > kMaxNativeHeads)
    return {"H = " + std::to_string(g.num_heads) +
            " exceeds the 128 heads one call handles; call once per group of <= 128 heads"};
  return {};
}

}  // namespace


Support supports_sm90_swapab(const Geometry& g, const DeviceInfo& dev) {
  if (auto s = sm90_common(g, dev); !s.ok()) return s;
  if (g.format != KvFormat::kFP8DsMla && g.format != KvFormat::kFP8E4M3 && g.format != KvFormat::kNvFP4DsMla)
    return {"swapab reads fp8_ds_mla, fp8_e4m3 and nvfp4_ds_mla rows only; use h64.ws for the other formats"};
  if (g.q_dtype != DType::kBF16 && g.q_dtype != DType::kE4M3)
    return {"swapab takes a bf16 or e4m3 q; use h64.ws for the others"};
  if (resolve_score_precision(g) != ScorePrecision::kBF16)
    return {"swapab computes the scores in bf16, not fp8; use score precision bf16 or auto"};
  if (g.num_heads > swapab_max_heads(g.format))
    return {"swapab runs " + std::string(to_string(g.format)) + " at H <= " + std::to_string(swapab_max_heads(g.format)) +
            "; use h64.ws for larger H"};
  return {};
}

Support supports_sm90_ws(const Geometry& g, const DeviceInfo& dev) {
  if (auto s = sm90_common(g, dev); !s.ok()) return s;
  if (resolve_score_precision(g) != ScorePrecision::kBF16) return {"h64.ws computes the scores in bf16, not fp8"};
  return {};
}

Support supports_sm90_ws_q8(const Geometry& g, const DeviceInfo& dev) {
  if (auto s = sm90_common(g, dev); !s.ok()) return s;
  if (resolve_score_precision(g) != ScorePrecision::kFP8) return {"h64.ws.q8 computes the scores in fp8, not bf16"};
  // (support_common: score precision fp8 comes with an e4m3 q, and an e4m3 q with an fp8 cache.)
  return {};
}

const CudaVariant* cuda_variant_for(const Geometry& g, const DeviceInfo& dev) {
  for (const CudaVariant& v : cuda_variants())
    if (v.supports(g, dev).ok()) return &v;
  return nullptr;
}

const CudaVariant* cuda_variant_for(const Geometry& g, const DeviceInfo& dev, int64_t num_tokens, bool batch_invariant) {
  const CudaVariant* v = cuda_variant_for(g, dev);
  if (v == nullptr || batch_invariant || std::string_view(v->name) != "swapab" || g.num_heads <= 16 ||
      num_tokens >= kSwapAbN32MinRows)
    return v;
  for (const CudaVariant& w : cuda_variants())
    if (std::string_view(w.name) == "h64.ws" && w.supports(g, dev).ok()) return &w;
  return v;
}

Support support_cuda(const Geometry& g, const DeviceInfo& dev, bool built_with_cuda) {
  if (!built_with_cuda) return {"this build of smla has no CUDA backend (nvcc was not found); use the CPU backend"};
  if (cuda_variant_for(g, dev) != nullptr) return {};
  const ScorePrecision sp = resolve_score_precision(g);
  const CudaVariant* general = nullptr;  // the last variant of that precision: the general one
  for (const CudaVariant& v : cuda_variants())
    if (v.score_precision == sp) general = &v;
  if (general != nullptr) return general->supports(g, dev);
  return {"no CUDA kernel computes the scores in " + std::string(to_string(sp))};
}

DeviceInfo any_sm90_device() {
  DeviceInfo d;
  d.cc_major = 9, d.cc_minor = 0, d.name = "an SM90 GPU";
  return d;
}

std::string cuda_kernel_name(const Geometry& g) {
  return std::string("sm90/sparse_mla/") + std::string(to_string(g.format)) + "_d" +
         std::to_string(kLatentDim + g.rope_dim);
}

}  // namespace smla
