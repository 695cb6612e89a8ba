#include "smla/plan.h"

#include <algorithm>

namespace smla {

int choose_num_splits(int64_t num_tokens, int blocks_per_row, int topk, int num_sms) {
  const int64_t blocks = num_tokens * std::max(1, blocks_per_row);
  if (blocks <= 0 || blocks >= num_sms) return 1;
  const int64_t want = (num_sms + blocks - 1) / blocks;
  const int64_t cap = (topk + kMinEntriesPerSplit - 1) / kMinEntriesPerSplit;
  return int(std::max<int64_t>(1, std::min<int64_t>({want, cap, kMaxSplits})));
}

size_t split_workspace_bytes(int64_t num_tokens, int num_heads, int splits) {
  if (splits <= 1 || num_tokens <= 0) return 0;
  const size_t bytes = size_t(num_tokens) * size_t(num_heads) * size_t(splits) * (512 + 1) * sizeof(float);
  return (bytes + 255) / 256 * 256;
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
