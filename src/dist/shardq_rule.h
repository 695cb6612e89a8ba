// The zigzag ownership of ShardQ (DESIGN.md §5b) as arithmetic compiled for host and device: the
// NCCL step's ownership kernels use it, and the CPU tests hold it to shardq::owner_rank and
// shardq::make_layout (smla/shardq.h, the spec). No CUDA headers.
//
// A request of n tokens is cut into 2·W chunks of c = ceil(n / 2W) tokens; chunk k is
// [k·c, min((k + 1)·c, n)) (short or empty at the end); rank r owns chunks r and 2W − 1 − r, chunk r
// first. Example: n = 10, W = 2: c = 3; rank 0 owns 0-2 and 9 (3 + 1 tokens), rank 1 owns 3-8.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define SMLA_SHARDQ_HD __host__ __device__ __forceinline__
#else
#define SMLA_SHARDQ_HD inline
#endif

namespace smla::dist::detail {

// Tokens in chunk k of a request of n tokens cut in chunks of c.
SMLA_SHARDQ_HD int64_t shardq_chunk_len(int64_t n, int64_t c, int64_t k) {
  const int64_t lo = k * c;
  return lo >= n ? 0 : (n - lo < c ? n - lo : c);
}

// Tokens rank p attends of a request of n tokens (world W).
SMLA_SHARDQ_HD int64_t shardq_owned_count(int64_t n, int world, int p) {
  const int64_t c = (n + 2 * int64_t(world) - 1) / (2 * int64_t(world));
  if (c == 0) return 0;
  return shardq_chunk_len(n, c, p) + shardq_chunk_len(n, c, 2 * int64_t(world) - 1 - p);
}

// Token j (0 <= j < n) of a request of n tokens: its owner rank, and its index among the owner's
// tokens of this request (tokens in ascending order, as shardq::make_layout lists them).
SMLA_SHARDQ_HD void shardq_owner_of(int64_t j, int64_t n, int world, int* owner, int64_t* index) {
  const int64_t c = (n + 2 * int64_t(world) - 1) / (2 * int64_t(world));
  const int64_t k = j / c;  // 0 .. 2W - 1
  if (k < world) {
    *owner = int(k);
    *index = j - k * c;
  } else {
    const int p = int(2 * int64_t(world) - 1 - k);
    *owner = p;
    *index = shardq_chunk_len(n, c, p) + (j - k * c);
  }
}

}  // namespace smla::dist::detail
