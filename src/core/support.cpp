#include "smla/support.h"

#include <string>

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
  return {};
}

Support support_cpu(const Geometry& g) { return support_common(g); }

Support support_cuda(const Geometry& g, const DeviceInfo& dev, bool built_with_cuda) {
  if (!built_with_cuda) return {"this build of smla has no CUDA backend (nvcc was not found); use the CPU backend"};
  if (!dev.present()) return {"no CUDA device found; use the CPU backend"};
  if (dev.cc_major != 9 || dev.cc_minor != 0)
    return {"smla's CUDA kernels are built for SM90 (H100/H200); found sm_" + std::to_string(dev.cc_major) +
            std::to_string(dev.cc_minor) + " (" + dev.name + "); use the CPU backend"};
  if (auto s = support_common(g); !s.ok()) return s;
  const bool quantized = g.format != KvFormat::kBF16 && g.format != KvFormat::kFP16;
  if (quantized && g.q_dtype == DType::kFP16)
    return {"the SM90 kernel reads the " + std::string(to_string(g.format)) +
            " cache with a bf16 q (or e4m3 for the fp8 caches), not fp16; cast q to bf16 or use the CPU backend"};
  if (g.num_heads > kMaxNativeHeads)
    return {"H = " + std::to_string(g.num_heads) +
            " exceeds the 128 heads one call handles; call once per group of <= 128 heads"};
  return {};
}

// "sm90/sparse_mla/<format>_d<D>": bf16 / fp16 rows as stored; the quantized formats dequantized
// to bf16 in shared memory (mma.sync kernel for every head tile).
std::string cuda_kernel_name(const Geometry& g) {
  return std::string("sm90/sparse_mla/") + std::string(to_string(g.format)) + "_d" +
         std::to_string(kLatentDim + g.rope_dim);
}

}  // namespace smla
