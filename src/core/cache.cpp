#include "smla/cache.h"

#include <string>
#include <vector>

#include "smla/formats.h"
#include "smla/numeric.h"

namespace smla {

void validate(const CacheWriteParams& p) {
  SMLA_CHECK(p.num_tokens >= 0, "num_tokens must be >= 0");
  SMLA_CHECK(p.rope_dim == 0 || p.rope_dim == kRopeDim, "rope_dim must be 64 or 0");
  SMLA_CHECK(p.src_dtype == DType::kBF16 || p.src_dtype == DType::kFP16,
             "latent/rope must be bf16 or fp16; got " + std::string(to_string(p.src_dtype)));
  SMLA_CHECK(p.block_size >= 1 && p.block_stride_rows >= p.block_size, "need block_stride_rows >= block_size >= 1");
  SMLA_CHECK(p.num_rows >= 0, "num_rows must be >= 0");
  SMLA_CHECK(p.format != KvFormat::kFP8E4M3 || (p.k_scale > 0 && p.k_scale < INFINITY), "k_scale must be finite and > 0");
  const int rb = row_bytes(p.format, p.rope_dim);
  SMLA_CHECK(p.num_rows == 0 || p.row_stride_bytes >= rb,
             "cache row stride must be >= " + std::to_string(rb) + " bytes for " + std::string(to_string(p.format)));
  if (p.num_tokens == 0) return;
  SMLA_CHECK(p.latent != nullptr && p.latent_stride >= kLatentDim, "latent must be [N, 512] with row stride >= 512");
  SMLA_CHECK((p.rope != nullptr) == (p.rope_dim > 0), "rope must be given exactly when rope_dim = 64");
  SMLA_CHECK(p.rope == nullptr || p.rope_stride >= kRopeDim, "rope must be [N, 64] with row stride >= 64");
  SMLA_CHECK(p.slot_mapping != nullptr, "slot_mapping [N] is null");
  SMLA_CHECK(p.num_rows == 0 || p.cache != nullptr, "cache is null");
}

void write_cache_reference(const CacheWriteParams& p) {
  validate(p);
  const int rb = row_bytes(p.format, p.rope_dim);
  std::vector<float> latent(kLatentDim), rope(kRopeDim);
  auto load = [&](const void* base, int64_t i) {
    const uint16_t v = static_cast<const uint16_t*>(base)[i];
    return p.src_dtype == DType::kBF16 ? num::bf16_to_f32(v) : num::fp16_to_f32(v);
  };
  std::vector<uint8_t> row(static_cast<size_t>(rb));
  for (int64_t n = 0; n < p.num_tokens; ++n) {
    const int64_t r = p.physical_row(p.slot_mapping[n]);
    if (r < 0) continue;
    for (int d = 0; d < kLatentDim; ++d) latent[size_t(d)] = load(p.latent, n * p.latent_stride + d);
    for (int d = 0; d < p.rope_dim; ++d) rope[size_t(d)] = load(p.rope, n * p.rope_stride + d);
    encode_row(p.format, p.rope_dim, latent.data(), rope.data(), p.k_scale, row.data());
    auto* dst = static_cast<uint8_t*>(p.cache) + r * p.row_stride_bytes;
    for (int b = 0; b < rb; ++b) dst[b] = row[size_t(b)];
  }
}

}  // namespace smla
