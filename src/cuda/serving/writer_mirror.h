// The cache writer with a second destination (the tiered cache's hot slot, smla/cuda_tiered.h).
// Internal to the CUDA layer: write_cache_tiered validates the mirror and calls this.
#pragma once

#include <cstdint>

#include "smla/cache.h"

namespace smla::cuda {

struct WriterMirror {
  void* base = nullptr;             // nullable: no mirror (plain write_cache)
  const int32_t* rows = nullptr;    // [N] mirror row per token, negative: none
  int64_t num_rows = 0;             // rows at or past it are skipped
  int64_t row_stride_bytes = 0;     // a multiple of 16, as are p.row_stride_bytes and both bases
};

// Like write_cache; a token whose mirror row is in range is also written there, from the same
// shared-memory copy of its encoded row.
void write_cache_mirrored(const CacheWriteParams& p, const WriterMirror& mirror, void* stream);

}  // namespace smla::cuda
