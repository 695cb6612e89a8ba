// The workspace layouts of smla/workspace.h: the one definition the planner, the CUDA launcher's
// carving and the DCP step share. Sizes are checked against numbers worked out by hand from the
// shapes the kernels index ([T, H, splits, 512] fp32 partial outputs, ...), and every layout against
// the rules a carving relies on: parts aligned, inside the total, never overlapping.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "smla/engine.h"
#include "smla/workspace.h"

namespace {

using smla::WorkspacePart;

// Parts are 256-aligned, disjoint and inside `total`; the total is 256-aligned. Returns the sum
// of the part sizes.
size_t check_parts(std::vector<WorkspacePart> parts, size_t total, const std::string& what) {
  SCOPED_TRACE(what);
  EXPECT_EQ(total % smla::kWorkspaceAlign, 0u);
  parts.erase(std::remove_if(parts.begin(), parts.end(), [](const WorkspacePart& p) { return p.bytes == 0; }),
              parts.end());
  std::sort(parts.begin(), parts.end(), [](const WorkspacePart& a, const WorkspacePart& b) { return a.offset < b.offset; });
  size_t sum = 0, end = 0;
  for (const auto& p : parts) {
    EXPECT_EQ(p.offset % smla::kWorkspaceAlign, 0u) << "part at " << p.offset;
    EXPECT_GE(p.offset, end) << "part at " << p.offset << " overlaps the one before (ending at " << end << ")";
    end = p.end();
    sum += p.bytes;
  }
  EXPECT_LE(end, total);
  EXPECT_LT(total - end, smla::kWorkspaceAlign) << "slack past the last part";
  return sum;
}

TEST(Workspace, SparseMlaAbsentWithoutSplit) {
  for (auto [t, h, s] : {std::tuple{int64_t(1), 1, 1}, {100, 128, 1}, {0, 128, 8}, {-3, 128, 8}, {4, 0, 8}}) {
    const auto ws = smla::sparse_mla_workspace(t, h, s);
    EXPECT_EQ(ws.bytes, 0u) << t << " " << h << " " << s;
    EXPECT_EQ(ws.part_out.bytes, 0u);
    EXPECT_EQ(ws.part_lse.bytes, 0u);
  }
}

TEST(Workspace, SparseMlaWorkedExamples) {
  // The partial outputs are bf16 (2 B each), the LSEs fp32.
  // T = 1, H = 1, 2 splits: out 2 * 512 * 2 = 2048 B at 0, lse 2 * 4 = 8 B at 2048, total 2304 (9 * 256).
  auto ws = smla::sparse_mla_workspace(1, 1, 2);
  EXPECT_EQ(ws.part_out.offset, 0u);
  EXPECT_EQ(ws.part_out.bytes, 2048u);
  EXPECT_EQ(ws.part_lse.offset, 2048u);
  EXPECT_EQ(ws.part_lse.bytes, 8u);
  EXPECT_EQ(ws.bytes, 2304u);
  // T = 3, H = 3, 3 splits: 27 partials -> out 27648 B (108 * 256), lse 108 B at 27648; 27756 -> 27904.
  ws = smla::sparse_mla_workspace(3, 3, 3);
  EXPECT_EQ(ws.part_out.bytes, 27648u);
  EXPECT_EQ(ws.part_lse.offset, 27648u);
  EXPECT_EQ(ws.part_lse.bytes, 108u);
  EXPECT_EQ(ws.bytes, 27904u);
  // The example of the header: T = 1, H = 128, 32 splits (4096 partials).
  ws = smla::sparse_mla_workspace(1, 128, 32);
  EXPECT_EQ(ws.part_out.bytes, 4194304u);
  EXPECT_EQ(ws.part_lse.offset, 4194304u);
  EXPECT_EQ(ws.part_lse.bytes, 16384u);
  EXPECT_EQ(ws.bytes, 4210688u);
  // No int overflow at the largest plans: 65536 rows x 128 heads x 32 splits x 1028 B.
  ws = smla::sparse_mla_workspace(65536, 128, 32);
  EXPECT_EQ(ws.bytes, size_t(65536) * 128 * 32 * 1028);
}

TEST(Workspace, SparseMlaLayoutIsCarvable) {
  for (int64_t t : {1, 2, 3, 7, 64, 1000})
    for (int h : {1, 16, 64, 128})
      for (int s : {2, 3, 8, 32}) {
        const auto ws = smla::sparse_mla_workspace(t, h, s);
        const size_t parts = size_t(t) * size_t(h) * size_t(s);
        EXPECT_EQ(ws.part_out.bytes, parts * 512 * 2);
        EXPECT_EQ(ws.part_lse.bytes, parts * 4);
        const size_t sum = check_parts({ws.part_out, ws.part_lse}, ws.bytes,
                                       "T " + std::to_string(t) + " H " + std::to_string(h) + " S " + std::to_string(s));
        EXPECT_EQ(sum, parts * (512 * 2 + 4));
      }
}

// The CPU backend never splits: its plan needs no workspace whatever the geometry.
TEST(Workspace, CpuPlanNeedsNone) {
  smla::PlanConfig cfg;
  cfg.backend = smla::Backend::kCpu;
  cfg.max_rows = 4096;
  EXPECT_EQ(smla::Plan(cfg).workspace_bytes(), 0u);
}

smla::DcpWorkspaceShape dcp_shape(int world, int hl, int64_t t, bool a2a, size_t attn) {
  smla::DcpWorkspaceShape s;
  s.world = world, s.local_heads = hl, s.topk = 2048, s.max_rows = t, s.all_to_all = a2a, s.attention_bytes = attn;
  return s;
}

std::vector<WorkspacePart> all_parts(const smla::DcpWorkspace& w) {
  return {w.idx,     w.counts, w.q_gathered, w.q_all,     w.out_part, w.lse_part, w.lse_all,
          w.scaled,  w.summed, w.lse_local,  w.send,      w.recv,     w.attention};
}

TEST(Workspace, DcpWorkedExample) {
  // W = 2, H_l = 8 (H = 16), T = 4, K = 2048, D = 576, bf16, all-gather + reduce-scatter merge,
  // 4352 B of attention scratch.
  const auto w = smla::dcp_workspace(dcp_shape(2, 8, 4, false, 4352));
  EXPECT_EQ(w.idx.offset, 0u);
  EXPECT_EQ(w.idx.bytes, 4u * 2048 * 4);             // [T, K] int32 = 32768
  EXPECT_EQ(w.counts.offset, 32768u);
  EXPECT_EQ(w.counts.bytes, 16u);                     // [T] int32
  EXPECT_EQ(w.q_gathered.offset, 33024u);             // 32768 + 256
  EXPECT_EQ(w.q_gathered.bytes, 2u * 4 * 8 * 576 * 2);  // [W, T, H_l, D] bf16 = 73728
  EXPECT_EQ(w.q_all.offset, 106752u);
  EXPECT_EQ(w.q_all.bytes, 4u * 16 * 576 * 2);       // [T, H, D] = 73728
  EXPECT_EQ(w.out_part.bytes, 4u * 16 * 512 * 2);     // [T, H, 512] bf16
  EXPECT_EQ(w.lse_part.bytes, 4u * 16 * 4);           // [T, H] fp32
  EXPECT_EQ(w.lse_all.bytes, 2u * 4 * 16 * 4);        // [W, T, H] fp32
  EXPECT_EQ(w.scaled.bytes, 2u * 4 * 8 * 512 * 4);    // [W, T, H_l, 512] fp32
  EXPECT_EQ(w.summed.bytes, 4u * 8 * 512 * 4);        // [T, H_l, 512] fp32
  EXPECT_EQ(w.lse_local.bytes, 4u * 8 * 4);           // [T, H_l] fp32
  EXPECT_EQ(w.send.bytes, 0u);
  EXPECT_EQ(w.recv.bytes, 0u);
  EXPECT_EQ(w.attention.bytes, 4352u);
  const size_t sum = check_parts(all_parts(w), w.bytes, "W 2 H_l 8 T 4");
  EXPECT_EQ(sum, 32768u + 16 + 73728 + 73728 + 65536 + 256 + 512 + 131072 + 65536 + 128 + 4352);
  for (const auto& p : all_parts(w)) EXPECT_LE(p.offset, w.attention.offset);  // the attention part comes last
  // Each part rounded up to 256 B: 32768 + 256 + 73728 + 73728 + 65536 + 256 + 512 + 131072 + 65536 + 256 + 4352.
  EXPECT_EQ(w.bytes, 448000u);
}

TEST(Workspace, DcpAllToAllHasOnlyItsBuffers) {
  const auto w = smla::dcp_workspace(dcp_shape(4, 16, 32, true, 0));
  EXPECT_EQ(w.send.bytes, 4u * 32 * 16 * 513 * 4);  // [W, T, H_l, 513] fp32
  EXPECT_EQ(w.recv.bytes, w.send.bytes);
  for (const auto& p : {w.lse_all, w.scaled, w.summed, w.lse_local, w.attention}) EXPECT_EQ(p.bytes, 0u);
  check_parts(all_parts(w), w.bytes, "all-to-all");
}

TEST(Workspace, DcpLayoutsAreCarvable) {
  for (int world : {1, 2, 8})
    for (int hl : {1, 8, 16})
      for (int64_t t : {1, 5, 128})
        for (bool a2a : {false, true})
          for (int rope : {0, 64}) {
            auto s = dcp_shape(world, hl, t, a2a, size_t(t) * 999);
            s.rope_dim = rope;
            s.q_dtype = rope ? smla::DType::kBF16 : smla::DType::kFP16;
            const auto w = smla::dcp_workspace(s);
            EXPECT_EQ(w.q_all.bytes, size_t(t) * world * hl * (512 + rope) * 2);
            EXPECT_EQ(w.attention.bytes, size_t(t) * 999);
            check_parts(all_parts(w), w.bytes,
                        "W " + std::to_string(world) + " H_l " + std::to_string(hl) + " T " + std::to_string(t) +
                            (a2a ? " a2a" : " ag") + " rope " + std::to_string(rope));
          }
}

TEST(Workspace, DcpBadShapeRefused) {
  auto bad = dcp_shape(0, 8, 4, false, 0);
  EXPECT_THROW(smla::dcp_workspace(bad), smla::Error);
  bad = dcp_shape(2, 8, 0, false, 0);
  EXPECT_THROW(smla::dcp_workspace(bad), smla::Error);
  bad = dcp_shape(2, 8, 4, false, 0);
  bad.q_dtype = smla::DType::kE4M3;
  EXPECT_THROW(smla::dcp_workspace(bad), smla::Error);
  bad = dcp_shape(2, 8, 4, false, 0);
  bad.rope_dim = 32;
  EXPECT_THROW(smla::dcp_workspace(bad), smla::Error);
}

smla::ShardqWorkspaceShape shardq_shape(int world, int heads, int64_t max_tokens, int max_requests, int64_t slots,
                                        size_t attn) {
  smla::ShardqWorkspaceShape s;
  s.world = world, s.num_heads = heads, s.topk = 2048, s.max_tokens = max_tokens, s.max_requests = max_requests;
  s.slots = slots, s.attention_bytes = attn;
  return s;
}

std::vector<WorkspacePart> all_parts(const smla::ShardqWorkspace& w) {
  return {w.status,   w.req_base, w.dest,   w.slot_token, w.exchange_a, w.exchange_b, w.lse_send,
          w.lse_recv, w.q_full,   w.idx,    w.counts,     w.lse_full,   w.attention};
}

TEST(Workspace, ShardqWorkedExample) {
  // W = 2, H = 16 (8 per rank), max_tokens 100, 3 requests: slots = min(100, 50 + 6) = 56; K = 2048,
  // D = 576, bf16 q and out, 1000 B of attention scratch.
  const auto w = smla::shardq_workspace(shardq_shape(2, 16, 100, 3, 56, 1000));
  EXPECT_EQ(w.status.offset, 0u);
  EXPECT_EQ(w.status.bytes, 16u);
  EXPECT_EQ(w.req_base.offset, 256u);
  EXPECT_EQ(w.req_base.bytes, 3u * 2 * 4);      // [R, W] int32
  EXPECT_EQ(w.dest.offset, 512u);
  EXPECT_EQ(w.dest.bytes, 100u * 4);            // [max_tokens] int32
  EXPECT_EQ(w.slot_token.offset, 1024u);
  EXPECT_EQ(w.slot_token.bytes, 56u * 4);       // [S] int32
  EXPECT_EQ(w.exchange_a.offset, 1280u);
  EXPECT_EQ(w.exchange_a.bytes, 2u * 56 * 8 * 576 * 2);  // q [W, S, Hs, D] bf16 (> out [W, S, Hs, 512]) = 1032192
  EXPECT_EQ(w.exchange_b.offset, 1280u + 1032192);
  EXPECT_EQ(w.exchange_b.bytes, w.exchange_a.bytes);
  EXPECT_EQ(w.lse_send.bytes, 2u * 56 * 8 * 4);  // [W, S, Hs] fp32
  EXPECT_EQ(w.lse_recv.bytes, w.lse_send.bytes);
  EXPECT_EQ(w.q_full.bytes, 56u * 16 * 576 * 2);  // [S, H, D]
  EXPECT_EQ(w.idx.bytes, 56u * 2048 * 4);          // [S, K]
  EXPECT_EQ(w.counts.bytes, 56u * 4);
  EXPECT_EQ(w.lse_full.bytes, 56u * 16 * 4);       // [S, H]
  EXPECT_EQ(w.attention.bytes, 1000u);
  check_parts(all_parts(w), w.bytes, "W 2 H 16");
  for (const auto& p : all_parts(w)) EXPECT_LE(p.offset, w.attention.offset);  // the attention part comes last
  // 256 + 256 + 512 + 256 + 2 * 1032192 + 2 * 3584 + 1032192 + 458752 + 256 + 3584 + 1024 (each rounded up to 256).
  EXPECT_EQ(w.bytes, 3568640u);
}

TEST(Workspace, ShardqExchangeHoldsQAndOut) {
  // An e4m3 q (1 byte) is smaller than the bf16 out, so the out size sets the exchange buffers.
  auto s = shardq_shape(4, 128, 64, 2, 20, 0);
  s.q_dtype = smla::DType::kE4M3;
  const auto w = smla::shardq_workspace(s);
  EXPECT_EQ(w.exchange_a.bytes, 4u * 20 * 32 * 512 * 2);  // out [W, S, Hs, 512] bf16 = [S, H, 512]
  EXPECT_EQ(w.q_full.bytes, 20u * 128 * 576);
  EXPECT_EQ(w.attention.bytes, 0u);
  check_parts(all_parts(w), w.bytes, "e4m3");
  for (int world : {1, 2, 8})
    for (int64_t t : {1, 7, 300})
      for (int rope : {0, 64}) {
        auto x = shardq_shape(world, 8 * world, t, 3, std::max<int64_t>(1, t / world), size_t(t) * 77);
        x.rope_dim = rope;
        x.q_dtype = x.out_dtype = rope ? smla::DType::kBF16 : smla::DType::kFP16;
        check_parts(all_parts(smla::shardq_workspace(x)), smla::shardq_workspace(x).bytes,
                    "W " + std::to_string(world) + " T " + std::to_string(t) + " rope " + std::to_string(rope));
      }
}

TEST(Workspace, ShardqBadShapeRefused) {
  EXPECT_THROW(smla::shardq_workspace(shardq_shape(3, 16, 10, 1, 10, 0)), smla::Error);  // H not a multiple of W
  EXPECT_THROW(smla::shardq_workspace(shardq_shape(2, 16, 10, 0, 10, 0)), smla::Error);  // no requests
  EXPECT_THROW(smla::shardq_workspace(shardq_shape(2, 16, 10, 1, 11, 0)), smla::Error);  // slots > max_tokens
  EXPECT_THROW(smla::shardq_workspace(shardq_shape(2, 16, 10, 1, 0, 0)), smla::Error);
  auto bad = shardq_shape(2, 16, 10, 1, 5, 0);
  bad.out_dtype = smla::DType::kFP32;
  EXPECT_THROW(smla::shardq_workspace(bad), smla::Error);
}

}  // namespace
