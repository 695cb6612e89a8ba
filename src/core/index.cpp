#include "smla/index.h"

#include <string>

#include "smla/types.h"

namespace smla {

void validate(const IndexConvertParams& p) {
  SMLA_CHECK(p.num_tokens >= 0, "num_tokens must be >= 0");
  SMLA_CHECK(p.topk >= 1, "positions must be int32 [T, K] with K >= 1; got K = " + std::to_string(p.topk));
  SMLA_CHECK(p.block_size >= 1, "block_size must be >= 1");
  SMLA_CHECK(p.block_stride_rows >= p.block_size, "block_stride_rows must be >= block_size");
  SMLA_CHECK(p.max_blocks >= 0 && p.num_reqs >= 0, "block table shape must be non-negative");
  SMLA_CHECK(p.dcp_world >= 1 && p.dcp_rank >= 0 && p.dcp_rank < p.dcp_world,
             "dcp_rank must be in [0, dcp_world)");
  SMLA_CHECK(p.dcp_interleave >= 1, "dcp_interleave must be >= 1");
  SMLA_CHECK((p.prefill_row_start == nullptr) == (p.prefill_req_len == nullptr),
             "prefill_row_start and prefill_req_len go together: give both [R] arrays or neither");
  if (p.num_tokens == 0) return;
  SMLA_CHECK(p.positions && p.phys, "positions and phys must not be null");
  SMLA_CHECK(p.pos_stride_t >= p.topk && p.phys_stride_t >= p.topk, "row strides must be >= K");
  SMLA_CHECK(p.prefill_row_start || p.num_reqs == 0 || p.max_blocks == 0 || (p.block_table && p.bt_stride >= p.max_blocks),
             "block_table must be int32 [R, max_blocks] with row stride >= max_blocks");
}

void convert_indices_reference(const IndexConvertParams& p) {
  validate(p);
  for (int64_t t = 0; t < p.num_tokens; ++t) {
    const int64_t req = p.req_of_token ? p.req_of_token[t] : t;
    const bool remap = p.prefill_row_start != nullptr;
    const bool req_ok = req >= 0 && req < p.num_reqs && (remap || p.max_blocks > 0);
    int n = 0;
    for (int j = 0; j < p.topk; ++j) {
      if (!req_ok) break;
      const int32_t pos = p.positions[t * p.pos_stride_t + j];
      const int32_t r =
          remap ? logical_to_workspace_row(pos, p.prefill_row_start[req], p.prefill_req_len[req], p.dcp_world,
                                           p.dcp_rank, p.dcp_interleave)
                : logical_to_physical(pos, p.block_table + req * p.bt_stride, p.max_blocks, p.block_size,
                                      p.block_stride_rows, p.dcp_world, p.dcp_rank, p.dcp_interleave);
      if (r >= 0) p.phys[t * p.phys_stride_t + n++] = r;
    }
    for (int j = n; j < p.topk; ++j) p.phys[t * p.phys_stride_t + j] = -1;
    if (p.counts) p.counts[t] = n;
  }
}

}  // namespace smla
