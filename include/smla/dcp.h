// smla/dcp.h — decode context parallelism (DESIGN.md §5), the host side: the sharding rule, the
// merge of per-rank partial results, and a CPU simulation of W ranks in one process that uses the
// same filter (smla/index.h) and merge (smla/state.h) code as the NCCL path.
#pragma once

#include <cstdint>
#include <vector>

#include "smla/params.h"

namespace smla::dcp {

// Rank that owns request-local token position i, and its local position there.
// Example: W = 2, I = 64: positions 0..63 -> rank 0 local 0..63, 64..127 -> rank 1 local 0..63,
// 128 -> rank 0 local 64.
inline int owner_rank(int64_t i, int world, int interleave) { return int((i / interleave) % world); }
inline int64_t local_position(int64_t i, int world, int interleave) {
  return (i / (int64_t(world) * interleave)) * interleave + i % interleave;
}

// Merges W partial results: outs[w] [T,H,512] fp32 and lses[w] [T,H] natural-log LSE (NaN / +inf
// count as -inf) into out [T,H,512] fp32 and lse [T,H]. All-empty rows end as out 0, LSE -inf.
void merge_partials(const std::vector<const float*>& outs, const std::vector<const float*>& lses, int64_t T,
                    int H, float* out, float* lse);

// One rank's (or the unsharded) paged cache: rows [num_blocks * block_stride_rows][row_bytes] and
// a block table [num_reqs][max_blocks] (-1 for blocks not allocated).
struct PagedCache {
  std::vector<uint8_t> rows;
  std::vector<int32_t> block_table;
  int num_reqs = 0, max_blocks = 0, block_size = 0, row_bytes = 0;
  int64_t block_stride_rows = 0;
  int64_t num_rows() const { return row_bytes ? int64_t(rows.size()) / row_bytes : 0; }
};

// Lays out each request's logical rows (request_rows[r]: [len_r][row_bytes]) into W paged caches
// by the sharding rule (world = 1: the unsharded cache). Blocks are handed out in a scrambled
// order so physical rows differ from logical ones.
std::vector<PagedCache> shard_cache(const std::vector<std::vector<uint8_t>>& request_rows, int row_bytes, int world,
                                    int interleave, int block_size, int64_t block_stride_rows);

// Simulates one decode step of W = caches.size() ranks on the CPU: each rank filters the global
// top-k positions [T,K] (request req_of_token[t]) to its own rows, compacted and counted, runs
// the reference with LSE on its shard, then the partials are merged. `tmpl` supplies q, heads,
// format, scales and sink (its kv/idx/counts/out/lse are ignored). Writes out [T,H,512] fp32 and
// lse [T,H] (natural log).
void simulate_decode(const SparseMlaParams& tmpl, const std::vector<PagedCache>& caches, const int32_t* positions,
                     const int32_t* req_of_token, int world, int interleave, float* out, float* lse);

}  // namespace smla::dcp
