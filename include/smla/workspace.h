// smla/workspace.h — the layout of every caller-owned workspace, as pure host arithmetic: the size
// and offset of each part. The one definition: Plan sizes its workspace with it, the CUDA launcher
// carves the split-K scratch out of it, and dist::Dcp and dist::ShardQ size and carve their step buffers
// with it.
#pragma once

#include <cstddef>
#include <cstdint>

#include "smla/types.h"

namespace smla {

// Every part starts at a multiple of this many bytes from the workspace start, and every total is a
// multiple of it. A workspace itself must be at least 16-byte aligned (the kernels' vector loads);
// cudaMalloc and the PyTorch allocator give 256 or more.
inline constexpr size_t kWorkspaceAlign = 256;

struct WorkspacePart {
  size_t offset = 0;  // bytes from the workspace start
  size_t bytes = 0;   // 0: the part is absent
  size_t end() const { return offset + bytes; }
};

// Split-K scratch of one sparse MLA launch: T rows, H heads, each row's top-k cut into `splits`
// pieces merged by LSE. Absent (every size 0) when splits <= 1 or T <= 0.
// The partial outputs are normalized (O / l, |value| <= max |V| * out scale) and stored as bf16: half
// the bytes of fp32 through the store and the merge's read (the small-call latency, issue #19.3;
// docs/perf-history.md s10-partials); bf16, not fp16, because V of a bf16 cache can exceed fp16's
// range. The LSEs stay fp32 and the merge sums in fp32.
// Example: T = 1, H = 128, 32 splits: part_out [0, 4194304), part_lse [4194304, 4210688), 4210688 B.
struct SparseMlaWorkspace {
  WorkspacePart part_out;  // [T, H, splits, 512] bf16 partial outputs (normalized)
  WorkspacePart part_lse;  // [T, H, splits] fp32 partial LSEs (natural log)
  size_t bytes = 0;        // total
};
SparseMlaWorkspace sparse_mla_workspace(int64_t num_tokens, int num_heads, int splits);

// What a DCP step over NCCL (smla/dist.h, DESIGN.md §5) is sized for.
struct DcpWorkspaceShape {
  int world = 1;          // W ranks
  int local_heads = 1;    // H_l; attention runs over H = H_l * W heads
  int rope_dim = kRopeDim;
  DType q_dtype = DType::kBF16;  // 16-bit: q, the gathered q and the partial outputs use it
  int topk = 1;           // K
  int64_t max_rows = 1;   // largest T of a step
  bool all_to_all = false;  // merge path (only its buffers are laid out)
  size_t attention_bytes = 0;  // the attention plan's workspace (Plan::workspace_bytes())
};

// The step buffers of one DCP rank, for T = max_rows (a smaller T uses the front of each part).
struct DcpWorkspace {
  WorkspacePart idx;         // [T, K] int32 local rows, compacted
  WorkspacePart counts;      // [T] int32 valid entries per row
  WorkspacePart q_gathered;  // [W, T, H_l, D] q_dtype: the all-gathered q, rank-major
  WorkspacePart q_all;       // [T, H, D] q_dtype: the same, head-major
  WorkspacePart out_part;    // [T, H, 512] q_dtype: this rank's partial output
  WorkspacePart lse_part;    // [T, H] fp32: its LSE (natural log)
  // all-gather + reduce-scatter merge (absent with all_to_all)
  WorkspacePart lse_all;     // [W, T, H] fp32
  WorkspacePart scaled;      // [W, T, H_l, 512] fp32: weighted partials, by destination rank
  WorkspacePart summed;      // [T, H_l, 512] fp32
  WorkspacePart lse_local;   // [T, H_l] fp32
  // all-to-all merge (present only with all_to_all)
  WorkspacePart send;        // [W, T, H_l, 513] fp32: (out, lse) packed per destination rank
  WorkspacePart recv;        // [W, T, H_l, 513] fp32
  WorkspacePart attention;   // the attention's workspace (attention_bytes)
  size_t bytes = 0;          // total
};
// Throws Error when a count is out of range (world, local_heads, topk, max_rows >= 1; a 16-bit q).
DcpWorkspace dcp_workspace(const DcpWorkspaceShape& shape);

// What a ShardQ prefill step over NCCL (smla/dist.h, DESIGN.md §5b) is sized for.
struct ShardqWorkspaceShape {
  int world = 1;                   // W ranks
  int num_heads = 1;               // H, all heads (each rank holds H / W of them); a multiple of W
  int rope_dim = kRopeDim;
  DType q_dtype = DType::kBF16;    // bf16, fp16 or e4m3
  DType out_dtype = DType::kBF16;  // bf16 or fp16
  int topk = 1;                    // K
  int64_t max_tokens = 1;          // largest T of a step
  int max_requests = 1;            // most requests in a step
  int64_t slots = 1;               // tokens one rank attends at most: shardq::max_tokens_per_rank(max_tokens,
                                   // world, max_requests) of smla/shardq.h, in [1, max_tokens]
  size_t attention_bytes = 0;      // the attention plan's workspace (Plan::workspace_bytes())
};

// The step buffers of one ShardQ rank (Hs = H / W heads per rank, S = slots). Every exchange buffer
// holds W blocks of S tokens, block p for peer p. exchange_a and exchange_b are reused within the
// step (each holds one thing at a time, in stream order), so the step needs about 3 copies of q
// and of out, not 6.
struct ShardqWorkspace {
  WorkspacePart status;      // [4] int32: the device-side check of cu_seqlens (0 = fine; read by wait())
  WorkspacePart req_base;    // [max_requests, W] int32: slots of rank p taken by the earlier requests
  WorkspacePart dest;        // [max_tokens] int32: owner * S + slot of each token (-1 after a bad cu_seqlens)
  WorkspacePart slot_token;  // [S] int32: this rank's token in each slot (-1: unused slot)
  WorkspacePart exchange_a;  // q to send [W, S, Hs, D] q_dtype; then the attention's out [S, H, 512];
                             // then the received out [W, S, Hs, 512] out_dtype
  WorkspacePart exchange_b;  // received q [W, S, Hs, D]; then the out to send [W, S, Hs, 512]
  WorkspacePart lse_send;    // [W, S, Hs] fp32
  WorkspacePart lse_recv;    // [W, S, Hs] fp32
  WorkspacePart q_full;      // [S, H, D] q_dtype: this rank's tokens with every head
  WorkspacePart idx;         // [S, K] int32: their top-k rows (-1 in unused slots)
  WorkspacePart counts;      // [S] int32: their counts (0 in unused slots)
  WorkspacePart lse_full;    // [S, H] fp32: the attention's LSE (natural log)
  WorkspacePart attention;   // the attention's workspace (attention_bytes)
  size_t bytes = 0;          // total
};
// Throws Error when a count is out of range (world, num_heads, topk, max_tokens, max_requests >= 1,
// H a multiple of W, slots in [1, max_tokens]).
ShardqWorkspace shardq_workspace(const ShardqWorkspaceShape& shape);

}  // namespace smla
