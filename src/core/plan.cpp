#include "smla/plan.h"

#include <algorithm>
#include <cstdint>

#include "smla/workspace.h"

namespace smla {

int choose_num_splits(int64_t num_tokens, int blocks_per_row, int topk, int num_sms) {
  const int64_t blocks = num_tokens * std::max(1, blocks_per_row);
  if (blocks <= 0 || num_sms <= 0 || blocks >= num_sms) return 1;
  // Cost of s splits in units of one 64-entry tile on one SM (one block per SM, as the 64-head
  // kernels run): waves of blocks x tiles per split, plus about one tile for the merge launch.
  // A ragged last wave costs a whole wave, so 5 splits of 32 blocks on 132 SMs (two waves of 7
  // tiles) lose to 4 (one wave of 8).
  const int64_t cap = std::min<int64_t>((std::max(topk, 1) + kMinEntriesPerSplit - 1) / kMinEntriesPerSplit, kMaxSplits);
  int best = 1;
  int64_t best_cost = INT64_MAX;
  for (int64_t s = 1; s <= cap; ++s) {
    const int64_t waves = (blocks * s + num_sms - 1) / num_sms;
    const int64_t entries = (topk + s - 1) / s;
    const int64_t tiles = (entries + kMinEntriesPerSplit - 1) / kMinEntriesPerSplit;
    const int64_t cost = waves * tiles + (s > 1 ? 1 : 0);
    if (cost < best_cost) best = int(s), best_cost = cost;  // fewest splits on a tie
  }
  return best;
}

size_t split_workspace_bytes(int64_t num_tokens, int num_heads, int splits) {
  return sparse_mla_workspace(num_tokens, num_heads, splits).bytes;
}

int batch_invariant_splits(int topk) {
  return std::clamp((std::max(topk, 1) + kBatchInvariantChunk - 1) / kBatchInvariantChunk, 1, kMaxSplits);
}

int64_t row_bucket(int64_t num_tokens) {
  if (num_tokens <= 0) return 0;
  int64_t b = 1;
  while (b < num_tokens) b <<= 1;
  return b;
}

}  // namespace smla
