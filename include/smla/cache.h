// smla/cache.h — the KV cache writer (DESIGN.md §3): new tokens' latent + RoPE into a paged cache
// of any format. The CPU reference here is the definition the CUDA writer matches bit for bit.
#pragma once

#include <cstdint>

#include "smla/types.h"

namespace smla {

struct CacheWriteParams {
  int64_t num_tokens = 0;             // N new tokens
  const void* latent = nullptr;       // [N, 512] src_dtype, row stride latent_stride (elements)
  int64_t latent_stride = 0;
  const void* rope = nullptr;         // [N, 64] src_dtype, row stride rope_stride; null iff rope_dim = 0
  int64_t rope_stride = 0;
  DType src_dtype = DType::kBF16;     // bf16 or fp16
  const int32_t* slot_mapping = nullptr;  // [N] slot = block * block_size + offset; negative: skip
  void* cache = nullptr;              // physical row r at cache + r * row_stride_bytes
  int64_t num_rows = 0;               // rows the cache holds; a slot mapping past them is skipped
  int64_t row_stride_bytes = 0;       // >= row_bytes(format, rope_dim)
  int block_size = 1;                 // tokens per block (B)
  int64_t block_stride_rows = 1;      // physical rows between blocks (>= B)
  KvFormat format = KvFormat::kBF16;
  int rope_dim = kRopeDim;
  float k_scale = 1.0f;               // fp8_e4m3 only

  // Physical row of a slot, or -1 when the slot is negative or past the cache.
  int64_t physical_row(int64_t slot) const {
    if (slot < 0) return -1;
    const int64_t r = (slot / block_size) * block_stride_rows + slot % block_size;
    return r < num_rows ? r : -1;
  }
};

void validate(const CacheWriteParams& p);
// CPU reference: encodes every token with encode_row() into its slot (host pointers).
void write_cache_reference(const CacheWriteParams& p);

}  // namespace smla
