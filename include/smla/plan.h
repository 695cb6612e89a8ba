// smla/plan.h — scheduling heuristics and workspace arithmetic as pure host functions.
#pragma once

#include <cstddef>
#include <cstdint>

namespace smla {

// Entries of top-k below which a split is not worth its merge.
inline constexpr int kMinEntriesPerSplit = 64;
inline constexpr int kMaxSplits = 32;

// How many pieces each row's top-k is split into so that the grid fills the GPU.
// blocks_per_row: CTAs one row already uses (e.g. head groups). Returns 1 when T * blocks_per_row
// already covers num_sms; otherwise the s in [1, min(ceil(topk / kMinEntriesPerSplit), kMaxSplits)]
// with the least ceil(T * blocks_per_row * s / num_sms) * ceil(ceil(topk / s) / 64) + (s > 1), the
// fewest on a tie: waves of blocks times 64-entry tiles per block, plus one tile for the merge.
// Depends only on its arguments, so a replayed schedule is the captured one.
// Examples (132 SMs, K = 2048): T = 1, 2 blocks/row -> 32; T = 32, 2 blocks/row -> 2 (one wave of
// 16 tiles; 3 would be two waves of 11); T = 32, 1 block/row -> 4; T = 128 -> 1; T = 1, K = 100 -> 1.
int choose_num_splits(int64_t num_tokens, int blocks_per_row, int topk, int num_sms);

// Bytes of split-K scratch: per (row, head, split) 512 bf16 partial outputs and one fp32 LSE,
// rounded up to 256 bytes. 0 when splits == 1. = sparse_mla_workspace(...).bytes of smla/workspace.h,
// the layout that also gives each part's offset.
size_t split_workspace_bytes(int64_t num_tokens, int num_heads, int splits);

// Batch-invariant mode: every row's top-k is cut into pieces of kBatchInvariantChunk entries
// whatever T is, so a row's reduction order, and with it its output bits, never depend on the
// batch around it. Example: K = 2048 -> 2 pieces; K = 100 -> 1.
inline constexpr int kBatchInvariantChunk = 1024;
int batch_invariant_splits(int topk);

// Row-count bucket of T: the smallest power of two >= T (0 for T = 0).
int64_t row_bucket(int64_t num_tokens);

}  // namespace smla
