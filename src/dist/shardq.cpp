// ShardQ prefill, the host side: zigzag ownership, the planned per-rank bound, the packing of the
// two all-to-alls, and the CPU simulation of W ranks (DESIGN.md §5b).
#include "smla/shardq.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "reference/sparse_mla.h"
#include "smla/dist.h"

namespace smla::shardq {

int64_t chunk_tokens(int64_t n, int world) {
  SMLA_CHECK(world >= 1, "shardq: world must be >= 1; got " + std::to_string(world));
  SMLA_CHECK(n >= 0, "shardq: a request length must be >= 0; got " + std::to_string(n));
  return (n + 2 * int64_t(world) - 1) / (2 * int64_t(world));
}

int owner_rank(int64_t j, int64_t n, int world) {
  SMLA_CHECK(j >= 0 && j < n, "shardq: token " + std::to_string(j) + " is outside its request of " +
                                  std::to_string(n) + " tokens");
  const int64_t chunk = j / chunk_tokens(n, world);  // 0 .. 2W - 1
  return int(chunk < world ? chunk : 2 * int64_t(world) - 1 - chunk);
}

int64_t max_tokens_per_rank(int64_t max_tokens, int world, int max_requests) {
  SMLA_CHECK(world >= 1 && max_tokens >= 0 && max_requests >= 0,
             "shardq: need world >= 1, max_tokens >= 0 and max_requests >= 0");
  // A request of n tokens gives a rank at most two chunks of ceil(n / 2W) <= n / 2W + 1 tokens.
  return std::min(max_tokens, (max_tokens + world - 1) / world + 2 * int64_t(max_requests));
}

Layout make_layout(const std::vector<int64_t>& request_lens, int world) {
  Layout l;
  l.world = world;
  l.rank_tokens.assign(size_t(std::max(world, 1)), {});
  SMLA_CHECK(world >= 1, "shardq: world must be >= 1; got " + std::to_string(world));
  int64_t start = 0;
  for (int64_t n : request_lens) {
    for (int64_t j = 0; j < n; ++j) l.rank_tokens[size_t(owner_rank(j, n, world))].push_back(start + j);
    start += n;
  }
  l.num_tokens = start;
  // Each rank's list is ascending: requests in order, and within a request chunk r comes before
  // chunk 2W - 1 - r.
  return l;
}

namespace {

void check_slots(const Layout& l, int64_t slots) {
  for (int r = 0; r < l.world; ++r)
    SMLA_CHECK(int64_t(l.rank_tokens[size_t(r)].size()) <= slots,
               "shardq: rank " + std::to_string(r) + " attends " + std::to_string(l.rank_tokens[size_t(r)].size()) +
                   " tokens, more than the " + std::to_string(slots) +
                   " slots planned (max_tokens_per_rank); plan for more tokens or requests");
}

}  // namespace

void pack_by_owner(const Layout& l, int64_t slots, const uint8_t* local, int64_t local_stride, int64_t row_bytes,
                   uint8_t* send) {
  check_slots(l, slots);
  for (int p = 0; p < l.world; ++p) {
    const auto& toks = l.rank_tokens[size_t(p)];
    for (size_t i = 0; i < toks.size(); ++i)
      std::memcpy(send + (int64_t(p) * slots + int64_t(i)) * row_bytes, local + toks[i] * local_stride,
                  size_t(row_bytes));
  }
}

void gather_heads(const Layout& l, int rank, int64_t slots, const uint8_t* recv, int64_t row_bytes, uint8_t* full) {
  check_slots(l, slots);
  const int64_t n = int64_t(l.rank_tokens[size_t(rank)].size());
  const int64_t full_row = int64_t(l.world) * row_bytes;
  for (int p = 0; p < l.world; ++p)
    for (int64_t i = 0; i < n; ++i)
      std::memcpy(full + i * full_row + p * row_bytes, recv + (int64_t(p) * slots + i) * row_bytes, size_t(row_bytes));
}

void split_heads(const Layout& l, int rank, int64_t slots, const uint8_t* full, int64_t row_bytes, uint8_t* send) {
  check_slots(l, slots);
  const int64_t n = int64_t(l.rank_tokens[size_t(rank)].size());
  const int64_t full_row = int64_t(l.world) * row_bytes;
  for (int p = 0; p < l.world; ++p)
    for (int64_t i = 0; i < n; ++i)
      std::memcpy(send + (int64_t(p) * slots + i) * row_bytes, full + i * full_row + p * row_bytes, size_t(row_bytes));
}

void unpack_by_owner(const Layout& l, int64_t slots, const uint8_t* recv, int64_t row_bytes, uint8_t* local,
                     int64_t local_stride) {
  check_slots(l, slots);
  for (int p = 0; p < l.world; ++p) {
    const auto& toks = l.rank_tokens[size_t(p)];
    for (size_t i = 0; i < toks.size(); ++i)
      std::memcpy(local + toks[i] * local_stride, recv + (int64_t(p) * slots + int64_t(i)) * row_bytes,
                  size_t(row_bytes));
  }
}

void simulate_prefill(const SparseMlaParams& tmpl, const std::vector<int64_t>& request_lens, int world, float* out,
                      float* lse) {
  const int64_t T = tmpl.num_tokens;
  const int H = tmpl.num_heads, K = tmpl.topk, D = tmpl.head_dim();
  SMLA_CHECK(world >= 1 && H % world == 0,
             "shardq: H = " + std::to_string(H) + " must be a multiple of the world size " + std::to_string(world));
  SMLA_CHECK(tmpl.q_rope == nullptr && tmpl.q_stride_h == D && tmpl.q_stride_t == int64_t(H) * D,
             "shardq simulation: q must be one dense [T, H, D] tensor");
  const Layout l = make_layout(request_lens, world);
  SMLA_CHECK(l.num_tokens == T, "shardq: the request lengths add up to " + std::to_string(l.num_tokens) +
                                    " tokens, the step has " + std::to_string(T));
  const int hs = H / world;
  const int64_t eb = dtype_bytes(tmpl.q_dtype);
  const int64_t q_row = int64_t(hs) * D * eb;           // one token, one rank's heads of q
  const int64_t o_row = int64_t(hs) * kLatentDim * 4;  // ... of out (fp32 here)
  const int64_t l_row = int64_t(hs) * 4;               // ... of lse
  int64_t slots = 0;
  for (const auto& t : l.rank_tokens) slots = std::max<int64_t>(slots, int64_t(t.size()));
  slots = std::max<int64_t>(slots, 1);
  const auto* q_all = static_cast<const uint8_t*>(tmpl.q);

  // Before the step: rank s holds q_local[s] = heads [s*hs, (s+1)*hs) of every token.
  // send_q[s] [W][slots][q_row]; the exchange: recv_q[r] block p = send_q[p] block r.
  std::vector<std::vector<uint8_t>> send_q(static_cast<size_t>(world)), recv_q(static_cast<size_t>(world));
  for (int s = 0; s < world; ++s) {
    send_q[size_t(s)].assign(size_t(world * slots * q_row), 0);
    pack_by_owner(l, slots, q_all + int64_t(s) * q_row, int64_t(H) * D * eb, q_row, send_q[size_t(s)].data());
  }
  auto exchange = [&](const std::vector<std::vector<uint8_t>>& send, std::vector<std::vector<uint8_t>>& recv,
                      int64_t row) {
    for (int r = 0; r < world; ++r) {
      recv[size_t(r)].assign(size_t(world * slots * row), 0);
      for (int p = 0; p < world; ++p)
        std::memcpy(recv[size_t(r)].data() + p * slots * row, send[size_t(p)].data() + r * slots * row,
                    size_t(slots * row));
    }
  };
  exchange(send_q, recv_q, q_row);

  // Each rank attends its tokens with all H heads; its output is split back by heads.
  const auto w = static_cast<size_t>(world);
  std::vector<std::vector<uint8_t>> send_o(w), recv_o(w), send_l(w), recv_l(w);
  for (int r = 0; r < world; ++r) {
    const auto& toks = l.rank_tokens[size_t(r)];
    const int64_t n = int64_t(toks.size());
    std::vector<uint8_t> q_full(size_t(slots * world * q_row), 0);
    gather_heads(l, r, slots, recv_q[size_t(r)].data(), q_row, q_full.data());
    std::vector<int32_t> idx(size_t(std::max<int64_t>(n, 1) * K)), counts(size_t(std::max<int64_t>(n, 1)));
    for (int64_t i = 0; i < n; ++i) {
      std::memcpy(idx.data() + i * K, tmpl.idx + toks[size_t(i)] * tmpl.idx_stride_t, size_t(K) * 4);
      if (tmpl.counts) counts[size_t(i)] = tmpl.counts[toks[size_t(i)]];
    }
    std::vector<float> o(size_t(slots * H * kLatentDim), 0.0f), ls(size_t(slots * H), 0.0f);
    SparseMlaParams p = tmpl;
    p.num_tokens = n;
    p.q = q_full.data(), p.q_stride_t = int64_t(H) * D, p.q_stride_h = D;
    p.idx = idx.data(), p.idx_stride_t = K, p.counts = tmpl.counts ? counts.data() : nullptr;
    p.out = o.data(), p.out_dtype = DType::kFP32, p.out_stride_t = int64_t(H) * kLatentDim, p.out_stride_h = kLatentDim;
    p.lse = ls.data(), p.lse_stride_t = H, p.lse_mode = LseMode::kBaseE;
    if (n > 0) reference::sparse_mla(p);
    send_o[size_t(r)].assign(size_t(world * slots * o_row), 0);
    send_l[size_t(r)].assign(size_t(world * slots * l_row), 0);
    split_heads(l, r, slots, reinterpret_cast<const uint8_t*>(o.data()), o_row, send_o[size_t(r)].data());
    split_heads(l, r, slots, reinterpret_cast<const uint8_t*>(ls.data()), l_row, send_l[size_t(r)].data());
  }
  exchange(send_o, recv_o, o_row);
  exchange(send_l, recv_l, l_row);
  // Rank s ends with out [T, hs, 512]: written here into heads [s*hs, (s+1)*hs) of out [T, H, 512].
  for (int s = 0; s < world; ++s) {
    unpack_by_owner(l, slots, recv_o[size_t(s)].data(), o_row, reinterpret_cast<uint8_t*>(out) + s * o_row,
                    int64_t(H) * kLatentDim * 4);
    unpack_by_owner(l, slots, recv_l[size_t(s)].data(), l_row, reinterpret_cast<uint8_t*>(lse) + s * l_row,
                    int64_t(H) * 4);
  }
}

}  // namespace smla::shardq

namespace smla::dist {

// The NCCL step's configuration, checked on the host (CPU-tested; ShardQ's constructor calls it).
void check_config(const ShardqConfig& c) {
  auto s_ = [](int64_t v) { return std::to_string(v); };
  SMLA_CHECK(c.world >= 1 && c.world <= kMaxShardqWorld, "ShardQ: world must be in [1, 16]; got " + s_(c.world));
  SMLA_CHECK(c.rank >= 0 && c.rank < c.world,
             "ShardQ: rank must be in [0, world = " + s_(c.world) + "); got " + s_(c.rank));
  SMLA_CHECK(c.num_heads >= 1 && c.num_heads <= kMaxNativeHeads,
             "ShardQ: num_heads (H, all heads) must be in [1, 128]; got " + s_(c.num_heads));
  SMLA_CHECK(c.num_heads % c.world == 0, "ShardQ: num_heads H = " + s_(c.num_heads) +
                                             " must be a multiple of world W = " + s_(c.world) +
                                             " (each rank holds H / W heads)");
  SMLA_CHECK(c.q_dtype == DType::kBF16 || c.q_dtype == DType::kFP16 || c.q_dtype == DType::kE4M3,
             "ShardQ: q must be bf16, fp16 or e4m3");
  SMLA_CHECK(c.topk >= 1, "ShardQ: topk must be >= 1; got " + s_(c.topk));
  SMLA_CHECK(c.max_tokens >= 1 && c.max_tokens * c.world < (int64_t(1) << 31),
             "ShardQ: max_tokens must be >= 1 and max_tokens * world < 2^31; got " + s_(c.max_tokens));
  SMLA_CHECK(c.max_requests >= 1, "ShardQ: max_requests must be >= 1; got " + s_(c.max_requests));
  SMLA_CHECK(c.timeout_ms >= 1, "ShardQ: timeout_ms must be >= 1 (the longest wait for a step, in ms); got " +
                                    s_(c.timeout_ms));
}

}  // namespace smla::dist
