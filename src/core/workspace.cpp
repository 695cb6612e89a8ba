#include "smla/workspace.h"

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

}  // namespace smla
