// The host side of decode context parallelism: partial-result merge, the CPU simulation and the
// DcpConfig check (host-only, so CI tests it).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "reference/sparse_mla.h"
#include "smla/dcp.h"
#include "smla/dist.h"
#include "smla/formats.h"
#include "smla/index.h"
#include "smla/state.h"

namespace smla::dcp {

void merge_partials(const std::vector<const float*>& outs, const std::vector<const float*>& lses, int64_t T, int H,
                    float* out, float* lse) {
  const int W = int(outs.size());
  SMLA_CHECK(W >= 1 && lses.size() == outs.size(), "merge_partials needs one out and one lse per rank");
  std::vector<float> l(static_cast<size_t>(W)), w(static_cast<size_t>(W));
  for (int64_t i = 0; i < T * H; ++i) {
    for (int r = 0; r < W; ++r) l[size_t(r)] = lses[size_t(r)][i];
    lse[i] = lse_merge(l.data(), W, w.data());
    for (int d = 0; d < kLatentDim; ++d) {
      float acc = 0.0f;
      for (int r = 0; r < W; ++r)
        if (w[size_t(r)] != 0.0f) acc += w[size_t(r)] * outs[size_t(r)][i * kLatentDim + d];
      out[i * kLatentDim + d] = acc;
    }
  }
}

std::vector<PagedCache> shard_cache(const std::vector<std::vector<uint8_t>>& request_rows, int row_bytes, int world,
                                    int interleave, int block_size, int64_t block_stride_rows) {
  SMLA_CHECK(world >= 1 && interleave >= 1 && block_size >= 1 && block_stride_rows >= block_size,
             "shard_cache: need world >= 1, interleave >= 1, block_stride_rows >= block_size >= 1");
  const int R = int(request_rows.size());
  std::vector<PagedCache> caches(static_cast<size_t>(world));
  // Local length of each request on each rank.
  std::vector<std::vector<int64_t>> local_len(size_t(world), std::vector<int64_t>(size_t(R), 0));
  for (int r = 0; r < R; ++r) {
    const int64_t len = int64_t(request_rows[size_t(r)].size()) / row_bytes;
    for (int64_t i = 0; i < len; ++i) {
      const int w = owner_rank(i, world, interleave);
      local_len[size_t(w)][size_t(r)] = std::max(local_len[size_t(w)][size_t(r)], local_position(i, world, interleave) + 1);
    }
  }
  for (int w = 0; w < world; ++w) {
    PagedCache& c = caches[size_t(w)];
    c.num_reqs = R, c.block_size = block_size, c.row_bytes = row_bytes, c.block_stride_rows = block_stride_rows;
    int64_t max_blocks = 1, total_blocks = 0;
    for (int r = 0; r < R; ++r) {
      const int64_t nb = (local_len[size_t(w)][size_t(r)] + block_size - 1) / block_size;
      max_blocks = std::max(max_blocks, nb);
      total_blocks += nb;
    }
    c.max_blocks = int(max_blocks);
    c.block_table.assign(size_t(R) * size_t(max_blocks), -1);
    // Scrambled block order: block k of the allocation gets physical block (k * 7 + 3) mod n, a
    // permutation whenever gcd(7, n) = 1 (n is bumped until it is).
    int64_t n = std::max<int64_t>(total_blocks, 1);
    while (std::gcd(n, int64_t(7)) != 1) ++n;
    c.rows.assign(size_t(n * block_stride_rows) * size_t(row_bytes), 0);
    int64_t k = 0;
    for (int r = 0; r < R; ++r) {
      const int64_t nb = (local_len[size_t(w)][size_t(r)] + block_size - 1) / block_size;
      for (int64_t b = 0; b < nb; ++b, ++k) c.block_table[size_t(r) * size_t(max_blocks) + size_t(b)] = int32_t((k * 7 + 3) % n);
    }
  }
  for (int r = 0; r < R; ++r) {
    const int64_t len = int64_t(request_rows[size_t(r)].size()) / row_bytes;
    for (int64_t i = 0; i < len; ++i) {
      PagedCache& c = caches[size_t(owner_rank(i, world, interleave))];
      const int64_t lp = local_position(i, world, interleave);
      const int64_t phys = int64_t(c.block_table[size_t(r) * size_t(c.max_blocks) + size_t(lp / block_size)]) *
                               block_stride_rows + lp % block_size;
      std::memcpy(c.rows.data() + phys * row_bytes, request_rows[size_t(r)].data() + i * row_bytes, size_t(row_bytes));
    }
  }
  return caches;
}

void simulate_decode(const SparseMlaParams& tmpl, const std::vector<PagedCache>& caches, const int32_t* positions,
                     const int32_t* req_of_token, int world, int interleave, float* out, float* lse) {
  SMLA_CHECK(int(caches.size()) == world, "simulate_decode: need one cache per rank");
  const int64_t T = tmpl.num_tokens;
  const int H = tmpl.num_heads, K = tmpl.topk;
  std::vector<std::vector<float>> outs(static_cast<size_t>(world)), lses(static_cast<size_t>(world));
  for (int w = 0; w < world; ++w) {
    const PagedCache& c = caches[size_t(w)];
    std::vector<int32_t> phys(static_cast<size_t>(T * K)), counts(static_cast<size_t>(T));
    IndexConvertParams ic;
    ic.positions = positions, ic.pos_stride_t = K, ic.num_tokens = T, ic.topk = K;
    ic.req_of_token = req_of_token;
    ic.block_table = c.block_table.data(), ic.bt_stride = c.max_blocks, ic.num_reqs = c.num_reqs;
    ic.max_blocks = c.max_blocks, ic.block_size = c.block_size, ic.block_stride_rows = c.block_stride_rows;
    ic.phys = phys.data(), ic.phys_stride_t = K, ic.counts = counts.data();
    ic.dcp_world = world, ic.dcp_rank = w, ic.dcp_interleave = interleave;
    convert_indices_reference(ic);

    SparseMlaParams p = tmpl;
    p.kv = c.rows.data(), p.num_rows = c.num_rows(), p.kv_row_stride_bytes = c.row_bytes;
    p.idx = phys.data(), p.idx_stride_t = K, p.counts = counts.data();
    outs[size_t(w)].assign(size_t(T * H * kLatentDim), 0.0f);
    lses[size_t(w)].assign(size_t(T * H), 0.0f);
    p.out = outs[size_t(w)].data(), p.out_dtype = DType::kFP32;
    p.out_stride_h = kLatentDim, p.out_stride_t = int64_t(H) * kLatentDim;
    p.lse = lses[size_t(w)].data(), p.lse_stride_t = H, p.lse_mode = LseMode::kBaseE;
    reference::sparse_mla(p);
  }
  std::vector<const float*> op, lp;
  for (int w = 0; w < world; ++w) op.push_back(outs[size_t(w)].data()), lp.push_back(lses[size_t(w)].data());
  merge_partials(op, lp, T, H, out, lse);
}

}  // namespace smla::dcp

namespace smla::dist {

void check_config(const DcpConfig& cfg) {
  SMLA_CHECK(cfg.world >= 1 && cfg.world <= kMaxDcpWorld,
             "DCP: world must be in [1, 16]; got " + std::to_string(cfg.world));
  SMLA_CHECK(cfg.rank >= 0 && cfg.rank < cfg.world,
             "DCP: rank must be in [0, world = " + std::to_string(cfg.world) + "); got " + std::to_string(cfg.rank));
  SMLA_CHECK(cfg.interleave >= 1, "DCP: interleave must be >= 1; got " + std::to_string(cfg.interleave));
  SMLA_CHECK(cfg.local_heads >= 1 && int64_t(cfg.local_heads) * cfg.world <= kMaxNativeHeads,
             "DCP: local_heads * world must be in [1, 128] (the heads one attention call handles); got " +
                 std::to_string(cfg.local_heads) + " * " + std::to_string(cfg.world));
  SMLA_CHECK(cfg.q_dtype == DType::kBF16 || cfg.q_dtype == DType::kFP16, "DCP: q must be bf16 or fp16");
  SMLA_CHECK(cfg.max_rows >= 1 && cfg.topk >= 1, "DCP: max_rows and topk must be >= 1");
  SMLA_CHECK(cfg.timeout_ms >= 1, "DCP: timeout_ms must be >= 1 (the longest wait for a step, in ms); got " +
                                      std::to_string(cfg.timeout_ms));
}

}  // namespace smla::dist
