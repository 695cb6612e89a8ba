// smla/index.h — index conversion (DESIGN.md §2, §5): request-local logical top-k positions to
// physical KV rows through a block table, optionally filtered to one context-parallel rank.
//
// The per-entry rule is an inline host/device function, so the CPU reference and the CUDA kernel
// share one definition.
#pragma once

#include <cstdint>

#include "smla/numeric.h"  // SMLA_HD

namespace smla {

struct IndexConvertParams {
  const int32_t* positions = nullptr;  // [T, K] request-local token positions, -1 padded
  int64_t pos_stride_t = 0;
  int64_t num_tokens = 0;  // T
  int topk = 0;            // K
  const int32_t* req_of_token = nullptr;  // nullable: [T] request of each row (null: row t -> req t)
  const int32_t* block_table = nullptr;   // [R, max_blocks] int32 block ids, row stride bt_stride
  int64_t bt_stride = 0;
  int num_reqs = 0;        // R
  int max_blocks = 0;      // columns of block_table
  int block_size = 0;      // B, tokens per block
  int64_t block_stride_rows = 0;  // physical rows between blocks (>= B; larger for hybrid layouts)
  int32_t* phys = nullptr;  // [T, K] out: valid rows compacted to the front, -1 after
  int64_t phys_stride_t = 0;
  int32_t* counts = nullptr;  // nullable: [T] out, number of valid entries per row
  // Prefill-workspace remap (nullable, both or neither): when the engine has gathered each
  // request's KV into one contiguous workspace, a position maps to row
  // prefill_row_start[req] + (local) pos, valid iff pos < prefill_req_len[req]; the block table
  // is not read.
  const int32_t* prefill_row_start = nullptr;  // [R]
  const int32_t* prefill_req_len = nullptr;    // [R]
  // Context parallelism (DESIGN.md §5): keep only positions owned by dcp_rank.
  int dcp_world = 1;       // W (1: no filter)
  int dcp_rank = 0;
  int dcp_interleave = 1;  // I
};

// Physical row of one request-local position, or -1 when the position is negative, past the
// block table, not owned by this rank, or its block id is negative.
// Example: B = 64, block_stride_rows = 128, table {7, 3}: pos 70 -> block 3, offset 6 -> 390.
// With W = 2, I = 1: pos 5 lives on rank 1 at local position 2.
SMLA_HD int32_t logical_to_physical(int32_t pos, const int32_t* table_row, int max_blocks, int block_size,
                                    int64_t block_stride_rows, int world, int rank, int interleave) {
  if (pos < 0) return -1;
  int64_t local = pos;
  if (world > 1) {
    if ((pos / interleave) % world != rank) return -1;
    local = int64_t(pos / (int64_t(world) * interleave)) * interleave + pos % interleave;
  }
  const int64_t blk = local / block_size;
  if (blk >= max_blocks) return -1;
  const int32_t b = table_row[blk];
  if (b < 0) return -1;
  const int64_t r = int64_t(b) * block_stride_rows + local % block_size;
  return r > INT32_MAX ? -1 : int32_t(r);
}

// Workspace row of one request-local position under the prefill remap, or -1 when the position
// is negative, not owned by this rank, or at or past the request's length.
// Example: start 1000, length 50: pos 7 -> 1007, pos 50 -> -1.
SMLA_HD int32_t logical_to_workspace_row(int32_t pos, int32_t row_start, int32_t req_len, int world, int rank,
                                         int interleave) {
  if (pos < 0) return -1;
  int64_t local = pos;
  if (world > 1) {
    if ((pos / interleave) % world != rank) return -1;
    local = int64_t(pos / (int64_t(world) * interleave)) * interleave + pos % interleave;
  }
  if (local >= req_len) return -1;
  const int64_t r = int64_t(row_start) + local;
  return (r < 0 || r > INT32_MAX) ? -1 : int32_t(r);
}

// CPU reference of the conversion kernel. Validates (throws Error), then converts every row.
void convert_indices_reference(const IndexConvertParams& p);
void validate(const IndexConvertParams& p);

}  // namespace smla
