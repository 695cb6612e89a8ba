#include "smla/workspace.h"

#include <algorithm>
#include <string>

namespace smla {
namespace {

size_t align_up(size_t n) { return (n + kWorkspaceAlign - 1) / kWorkspaceAlign * kWorkspaceAlign; }

// Appends parts one after another, each at the next aligned offset.
class Carver {
 public:
  WorkspacePart take(size_t bytes) {
    if (bytes == 0) return {};
    const WorkspacePart part{end_, bytes};
    end_ = align_up(end_ + bytes);
    return part;
  }
  size_t total() const { return end_; }

 private:
  size_t end_ = 0;
};

}  // namespace

SparseMlaWorkspace sparse_mla_workspace(int64_t num_tokens, int num_heads, int splits) {
  SparseMlaWorkspace ws;
  if (splits <= 1 || num_tokens <= 0 || num_heads <= 0) return ws;
  const size_t parts = size_t(num_tokens) * size_t(num_heads) * size_t(splits);  // (row, head, split)
  Carver c;
  ws.part_out = c.take(parts * kLatentDim * sizeof(uint16_t));  // bf16
  ws.part_lse = c.take(parts * sizeof(float));
  ws.bytes = c.total();
  return ws;
}

DcpWorkspace dcp_workspace(const DcpWorkspaceShape& s) {
  SMLA_CHECK(s.world >= 1 && s.local_heads >= 1 && s.topk >= 1 && s.max_rows >= 1,
             "dcp_workspace: world, local_heads, topk and max_rows must be >= 1");
  SMLA_CHECK(s.rope_dim == 0 || s.rope_dim == kRopeDim, "dcp_workspace: rope_dim must be 64 or 0");
  SMLA_CHECK(s.q_dtype == DType::kBF16 || s.q_dtype == DType::kFP16, "dcp_workspace: q must be bf16 or fp16");
  const size_t T = size_t(s.max_rows), W = size_t(s.world), Hl = size_t(s.local_heads), H = W * Hl;
  const size_t D = size_t(kLatentDim + s.rope_dim), q = size_t(dtype_bytes(s.q_dtype)), f = sizeof(float);
  DcpWorkspace ws;
  Carver c;
  ws.idx = c.take(T * size_t(s.topk) * sizeof(int32_t));
  ws.counts = c.take(T * sizeof(int32_t));
  ws.q_gathered = c.take(W * T * Hl * D * q);
  ws.q_all = c.take(T * H * D * q);
  ws.out_part = c.take(T * H * kLatentDim * q);
  ws.lse_part = c.take(T * H * f);
  if (s.all_to_all) {
    ws.send = c.take(W * T * Hl * (kLatentDim + 1) * f);
    ws.recv = c.take(W * T * Hl * (kLatentDim + 1) * f);
  } else {
    ws.lse_all = c.take(W * T * H * f);
    ws.scaled = c.take(W * T * Hl * kLatentDim * f);
    ws.summed = c.take(T * Hl * kLatentDim * f);
    ws.lse_local = c.take(T * Hl * f);
  }
  ws.attention = c.take(s.attention_bytes);
  ws.bytes = c.total();
  return ws;
}

ShardqWorkspace shardq_workspace(const ShardqWorkspaceShape& s) {
  SMLA_CHECK(s.world >= 1 && s.num_heads >= 1 && s.topk >= 1 && s.max_tokens >= 1 && s.max_requests >= 1,
             "shardq_workspace: world, num_heads, topk, max_tokens and max_requests must be >= 1");
  SMLA_CHECK(s.num_heads % s.world == 0, "shardq_workspace: num_heads = " + std::to_string(s.num_heads) +
                                             " must be a multiple of world = " + std::to_string(s.world));
  SMLA_CHECK(s.slots >= 1 && s.slots <= s.max_tokens, "shardq_workspace: slots must be in [1, max_tokens]");
  SMLA_CHECK(s.rope_dim == 0 || s.rope_dim == kRopeDim, "shardq_workspace: rope_dim must be 64 or 0");
  SMLA_CHECK(s.q_dtype == DType::kBF16 || s.q_dtype == DType::kFP16 || s.q_dtype == DType::kE4M3,
             "shardq_workspace: q must be bf16, fp16 or e4m3");
  SMLA_CHECK(s.out_dtype == DType::kBF16 || s.out_dtype == DType::kFP16, "shardq_workspace: out must be bf16 or fp16");
  const size_t W = size_t(s.world), H = size_t(s.num_heads), Hs = H / W, S = size_t(s.slots);
  const size_t D = size_t(kLatentDim + s.rope_dim), q = size_t(dtype_bytes(s.q_dtype));
  const size_t o = size_t(dtype_bytes(s.out_dtype)), f = sizeof(float), i = sizeof(int32_t);
  const size_t q_exchange = W * S * Hs * D * q, o_exchange = W * S * Hs * kLatentDim * o;  // S * H * 512 * o too
  ShardqWorkspace ws;
  Carver c;
  ws.status = c.take(4 * i);
  ws.req_base = c.take(size_t(s.max_requests) * W * i);
  ws.dest = c.take(size_t(s.max_tokens) * i);
  ws.slot_token = c.take(S * i);
  ws.exchange_a = c.take(std::max(q_exchange, o_exchange));
  ws.exchange_b = c.take(std::max(q_exchange, o_exchange));
  ws.lse_send = c.take(W * S * Hs * f);
  ws.lse_recv = c.take(W * S * Hs * f);
  ws.q_full = c.take(S * H * D * q);
  ws.idx = c.take(S * size_t(s.topk) * i);
  ws.counts = c.take(S * i);
  ws.lse_full = c.take(S * H * f);
  ws.attention = c.take(s.attention_bytes);
  ws.bytes = c.total();
  return ws;
}

}  // namespace smla
