#include "smla/tiered.h"

#include <algorithm>
#include <climits>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "smla/formats.h"
#include "smla/index.h"

namespace smla {
namespace {

std::string s(int64_t v) { return std::to_string(v); }
size_t align256(size_t v) { return (v + 255) / 256 * 256; }

// Host-pool row of a position, or -1 (the device cache's paged rule, one rank).
int64_t pool_row(const TieredResolveParams& p, int req, int32_t pos) {
  const int32_t r = logical_to_physical(pos, p.block_table + int64_t(req) * p.bt_stride, p.max_blocks, p.block_size,
                                        p.block_stride_rows, 1, 0, 1);
  return r < p.pool_rows ? r : -1;
}

}  // namespace

int default_hot_slots(int topk) {
  SMLA_CHECK(topk >= 1, "topk must be >= 1; got " + s(topk));
  return int((2 * int64_t(topk) + 1 + 127) / 128 * 128);
}

TieredCache::TieredCache(const TieredCacheConfig& cfg) : cfg_(cfg) {
  SMLA_CHECK(cfg.rope_dim == 0 || cfg.rope_dim == kRopeDim, "TieredCacheConfig.rope_dim must be 64 or 0; got " + s(cfg.rope_dim));
  SMLA_CHECK(cfg.topk >= 1 && cfg.topk <= (1 << 20), "TieredCacheConfig.topk must be in [1, 2^20]; got " + s(cfg.topk));
  SMLA_CHECK(cfg.max_requests >= 1, "TieredCacheConfig.max_requests must be >= 1; got " + s(cfg.max_requests));
  SMLA_CHECK(cfg.max_tokens_per_request >= 1,
             "TieredCacheConfig.max_tokens_per_request must be >= 1; got " + s(cfg.max_tokens_per_request));
  SMLA_CHECK(cfg.max_positions >= 1 && cfg.max_positions <= INT32_MAX,
             "TieredCacheConfig.max_positions must be in [1, 2^31 - 1]; got " + s(cfg.max_positions));
  SMLA_CHECK(cfg.hot_slots >= 0, "TieredCacheConfig.hot_slots must be >= 0 (0: the default); got " + s(cfg.hot_slots));
  if (cfg_.hot_slots == 0) cfg_.hot_slots = default_hot_slots(cfg.topk);
  const int64_t need = int64_t(cfg.max_tokens_per_request) * cfg.topk + 1;
  SMLA_CHECK(need <= cfg_.hot_slots,
             "hot_slots R = " + s(cfg_.hot_slots) + " cannot hold one step: max_tokens_per_request (" +
                 s(cfg.max_tokens_per_request) + ") x topk (" + s(cfg.topk) + ") + 1 = " + s(need) +
                 " > R; raise hot_slots to at least " + s(need) + " or lower max_tokens_per_request");
  SMLA_CHECK(int64_t(cfg.max_requests) * cfg_.hot_slots <= INT32_MAX,
             "max_requests x hot_slots = " + s(int64_t(cfg.max_requests) * cfg_.hot_slots) +
                 " hot rows exceed int32 row ids; lower max_requests");
  row_bytes_ = smla::row_bytes(cfg.format, cfg.rope_dim);
  if (cfg_.hot_row_stride_bytes == 0) cfg_.hot_row_stride_bytes = row_bytes_;
  SMLA_CHECK(cfg_.hot_row_stride_bytes >= row_bytes_ && cfg_.hot_row_stride_bytes % 16 == 0,
             "TieredCacheConfig.hot_row_stride_bytes must be >= " + s(row_bytes_) + " (the row bytes of " +
                 std::string(to_string(cfg.format)) + ") and a multiple of 16; got " + s(cfg_.hot_row_stride_bytes));

  const size_t slots = size_t(cfg.max_requests) * size_t(cfg_.hot_slots);
  size_t off = 0;
  layout_.counters = off, off = align256(off + sizeof(TieredCounters));
  layout_.stamps = off, off = align256(off + slots * sizeof(uint32_t));
  layout_.copy_flags = off, off = align256(off + size_t(cfg.max_requests) * kTieredCopyFlags * sizeof(uint32_t));
  layout_.zero_end = off;
  layout_.slot_pos = off, off = align256(off + slots * sizeof(int32_t));
  layout_.pos_slot = off, off = align256(off + size_t(cfg.max_requests) * size_t(cfg.max_positions) * sizeof(int32_t));
  layout_.total = off;
  // The CUDA resolver's copy list: one miss count per request, then R (pool row, position) pairs per
  // request (a request misses at most R - 1 rows per step).
  workspace_bytes_ = align256(size_t(cfg.max_requests) * sizeof(int32_t)) + slots * 2 * sizeof(int32_t);
}

void TieredCache::check(const TieredResolveParams& p) const {
  SMLA_CHECK(p.num_tokens >= 0, "num_tokens must be >= 0; got " + s(p.num_tokens));
  SMLA_CHECK(p.num_reqs >= 0 && p.num_reqs <= cfg_.max_requests,
             "num_reqs = " + s(p.num_reqs) + " but the tiered cache has hot buffers for " + s(cfg_.max_requests) +
                 " requests; make a TieredCache with a larger max_requests");
  SMLA_CHECK(p.num_tokens <= int64_t(p.num_reqs) * cfg_.max_tokens_per_request,
             "T = " + s(p.num_tokens) + " tokens exceed num_reqs (" + s(p.num_reqs) + ") x max_tokens_per_request (" +
                 s(cfg_.max_tokens_per_request) + ")");
  SMLA_CHECK(p.req_of_token != nullptr || p.num_tokens <= p.num_reqs,
             "req_of_token is null (token t -> request t) but T = " + s(p.num_tokens) + " > num_reqs = " + s(p.num_reqs));
  SMLA_CHECK(p.topk >= 1 && p.topk <= cfg_.topk,
             "positions must be int32 [T, K] with 1 <= K <= the planned topk " + s(cfg_.topk) + "; got K = " + s(p.topk));
  SMLA_CHECK(p.hot != nullptr && p.hot_bytes >= hot_buffer_bytes(),
             "hot buffer too small: it needs " + s(int64_t(hot_buffer_bytes())) + " bytes (max_requests x R x row stride); got " +
                 s(int64_t(p.hot_bytes)));
  SMLA_CHECK(p.state != nullptr && p.state_bytes >= state_bytes(),
             "tiered state too small: it needs " + s(int64_t(state_bytes())) + " bytes; got " + s(int64_t(p.state_bytes)));
  SMLA_CHECK(p.block_size >= 1 && p.block_stride_rows >= p.block_size,
             "host pool: need block_stride_rows >= block_size >= 1");
  SMLA_CHECK(p.max_blocks >= 0, "host pool: max_blocks must be >= 0");
  SMLA_CHECK(p.pool_rows >= 0, "host pool: pool_rows must be >= 0");
  SMLA_CHECK(p.pool_row_stride_bytes >= row_bytes_ && p.pool_row_stride_bytes % 16 == 0,
             "host pool row stride must be >= " + s(row_bytes_) + " bytes and a multiple of 16; got " +
                 s(p.pool_row_stride_bytes));
  if (p.num_tokens == 0) return;
  SMLA_CHECK(p.positions != nullptr && p.pos_stride_t >= p.topk, "positions must be int32 [T, K] with row stride >= K");
  SMLA_CHECK(p.phys != nullptr && p.phys_stride_t >= p.topk, "phys must be int32 [T, K] with row stride >= K");
  SMLA_CHECK(p.seq_lens != nullptr, "seq_lens [num_reqs] is null");
  SMLA_CHECK(p.pool != nullptr && p.pool_rows >= 1, "host pool is empty: give its pointer and pool_rows >= 1");
  SMLA_CHECK(p.max_blocks == 0 || (p.block_table != nullptr && p.bt_stride >= p.max_blocks),
             "block_table must be int32 [num_reqs, max_blocks] with row stride >= max_blocks");
}

void reset_tiered_state(const TieredCache& cache, void* state, size_t state_bytes) {
  const TieredStateLayout& L = cache.state_layout();
  SMLA_CHECK(state != nullptr && state_bytes >= L.total,
             "tiered state too small: it needs " + s(int64_t(L.total)) + " bytes; got " + s(int64_t(state_bytes)));
  auto* b = static_cast<uint8_t*>(state);
  std::memset(b, 0, L.zero_end);
  std::memset(b + L.zero_end, 0xFF, L.total - L.zero_end);
}

void release_tiered_request(const TieredCache& cache, void* state, size_t state_bytes, int req) {
  const TieredStateLayout& L = cache.state_layout();
  const TieredCacheConfig& c = cache.config();
  SMLA_CHECK(state != nullptr && state_bytes >= L.total,
             "tiered state too small: it needs " + s(int64_t(L.total)) + " bytes; got " + s(int64_t(state_bytes)));
  SMLA_CHECK(req >= 0 && req < c.max_requests,
             "request " + s(req) + " has no hot buffer: ids are [0, " + s(c.max_requests) + ")");
  auto* b = static_cast<uint8_t*>(state);
  const size_t R = size_t(c.hot_slots);
  std::memset(b + L.stamps + size_t(req) * R * 4, 0, R * 4);
  std::memset(b + L.slot_pos + size_t(req) * R * 4, 0xFF, R * 4);
  std::memset(b + L.pos_slot + size_t(req) * size_t(c.max_positions) * 4, 0xFF, size_t(c.max_positions) * 4);
}

void invalidate_tiered_positions(const TieredCache& cache, void* state, size_t state_bytes, const int32_t* req,
                                 const int32_t* pos, int64_t n) {
  const TieredStateLayout& L = cache.state_layout();
  const TieredCacheConfig& c = cache.config();
  SMLA_CHECK(state != nullptr && state_bytes >= L.total,
             "tiered state too small: it needs " + s(int64_t(L.total)) + " bytes; got " + s(int64_t(state_bytes)));
  SMLA_CHECK(n >= 0 && (n == 0 || (req != nullptr && pos != nullptr)), "invalidate: req and pos must be [n] int32");
  auto* b = static_cast<uint8_t*>(state);
  auto* stamps = reinterpret_cast<uint32_t*>(b + L.stamps);
  auto* slot_pos = reinterpret_cast<int32_t*>(b + L.slot_pos);
  auto* pos_slot = reinterpret_cast<int32_t*>(b + L.pos_slot);
  for (int64_t i = 0; i < n; ++i) {
    if (req[i] < 0 || pos[i] < 0) continue;
    SMLA_CHECK(req[i] < c.max_requests, "invalidate: request " + s(req[i]) + " has no hot buffer: ids are [0, " +
                                            s(c.max_requests) + ")");
    SMLA_CHECK(pos[i] < c.max_positions, "invalidate: position " + s(pos[i]) + " is past max_positions = " +
                                             s(c.max_positions));
    int32_t& m = pos_slot[int64_t(req[i]) * c.max_positions + pos[i]];
    if (m < 0) continue;
    const int64_t sl = int64_t(req[i]) * c.hot_slots + m;
    slot_pos[sl] = -1, stamps[sl] = 0, m = -1;
  }
}

void resolve_tiered_reference(const TieredCache& cache, const TieredResolveParams& p) {
  cache.check(p);
  const TieredCacheConfig& c = cache.config();
  const TieredStateLayout& L = cache.state_layout();
  const int R = c.hot_slots;
  const int64_t T = p.num_tokens;
  auto* base = static_cast<uint8_t*>(p.state);
  auto* ctr = reinterpret_cast<TieredCounters*>(base + L.counters);
  auto* stamps = reinterpret_cast<uint32_t*>(base + L.stamps);
  auto* slot_pos = reinterpret_cast<int32_t*>(base + L.slot_pos);
  auto* pos_slot = reinterpret_cast<int32_t*>(base + L.pos_slot);
  auto req_of = [&](int64_t t) -> int64_t { return p.req_of_token ? p.req_of_token[t] : t; };

  // Validate the device-side data the CUDA resolver can only flag (it counts errors instead).
  std::vector<std::vector<int64_t>> tokens(size_t(p.num_reqs));
  for (int64_t t = 0; t < T; ++t) {
    const int64_t r = req_of(t);
    SMLA_CHECK(r >= 0 && r < p.num_reqs, "token " + s(t) + " belongs to request " + s(r) +
                                             ", which has no hot buffer in this step: ids are [0, num_reqs = " +
                                             s(p.num_reqs) + ")");
    tokens[size_t(r)].push_back(t);
  }
  for (int r = 0; r < p.num_reqs; ++r) {
    if (tokens[size_t(r)].empty()) continue;
    const int64_t len = p.seq_lens[r];
    SMLA_CHECK(len >= 0 && len <= c.max_positions,
               "request " + s(r) + " has length " + s(len) + ", past the tiered cache's max_positions = " +
                   s(c.max_positions) + "; make a TieredCache with a larger max_positions");
    SMLA_CHECK(int64_t(tokens[size_t(r)].size()) <= c.max_tokens_per_request,
               "request " + s(r) + " has " + s(int64_t(tokens[size_t(r)].size())) +
                   " tokens in this step, more than the planned max_tokens_per_request = " + s(c.max_tokens_per_request));
    // A position that is not hot will be copied: it needs a host-pool row.
    const int32_t* map = pos_slot + int64_t(r) * c.max_positions;
    for (int64_t t : tokens[size_t(r)])
      for (int j = 0; j < p.topk; ++j) {
        const int32_t pos = p.positions[t * p.pos_stride_t + j];
        if (pos >= 0 && pos < len - 1 && map[pos] < 0)
          SMLA_CHECK(pool_row(p, r, pos) >= 0, "request " + s(r) + " position " + s(pos) +
                                                   " has no host-pool row (block table too short, block id < 0 or "
                                                   "row >= pool_rows = " + s(p.pool_rows) + "); fix the block table or grow the pool");
      }
  }

  const auto* pool = static_cast<const uint8_t*>(p.pool);
  auto* hot = static_cast<uint8_t*>(p.hot);
  for (int r = 0; r < p.num_reqs; ++r) {
    if (tokens[size_t(r)].empty()) continue;
    const int64_t len = p.seq_lens[r];
    int32_t* map = pos_slot + int64_t(r) * c.max_positions;
    uint32_t* st = stamps + int64_t(r) * R;
    int32_t* sp = slot_pos + int64_t(r) * R;
    const uint32_t now = st[R - 1] + 1;  // the request's clock lives in its reserved slot's stamp
    // Classify: hits stamp their slot now; misses collected once each.
    std::vector<int32_t> misses;
    bool newest_used = false;
    for (int64_t t : tokens[size_t(r)])
      for (int j = 0; j < p.topk; ++j) {
        const int32_t pos = p.positions[t * p.pos_stride_t + j];
        if (pos < 0 || pos >= len) continue;
        if (pos == len - 1) {
          newest_used = true;
          continue;
        }
        const int32_t slot = map[pos];
        if (slot >= 0) {
          if (st[slot] != now) ++ctr->hits;
          st[slot] = now;
        } else if (slot == -1) {
          map[pos] = -2;  // claimed: a miss of this step
          misses.push_back(pos);
        }
      }
    if (newest_used) ++ctr->hits;
    // Victims: slots 0 .. R - 2 not needed now, by (stamp, slot); misses by position.
    std::sort(misses.begin(), misses.end());
    std::vector<std::pair<uint32_t, int>> cand;
    for (int sl = 0; sl < R - 1; ++sl)
      if (st[sl] != now) cand.emplace_back(st[sl], sl);
    std::sort(cand.begin(), cand.end());
    if (misses.size() > cand.size()) fail("internal: tiered resolver ran out of victims");  // the plan rule forbids it
    for (size_t i = 0; i < misses.size(); ++i) {
      const int sl = cand[i].second;
      const int32_t pos = misses[i];
      if (sp[sl] >= 0) map[sp[sl]] = -1;
      map[pos] = sl, sp[sl] = pos, st[sl] = now;
      std::memcpy(hot + int64_t(cache.hot_row(r, sl)) * c.hot_row_stride_bytes,
                  pool + pool_row(p, r, pos) * p.pool_row_stride_bytes, size_t(cache.row_bytes()));
    }
    ctr->misses += misses.size();
    ctr->bytes += uint64_t(misses.size()) * uint64_t(cache.row_bytes());
    st[R - 1] = now;
  }
  // Out: physical hot rows, compacted, in entry order.
  for (int64_t t = 0; t < T; ++t) {
    const int r = int(req_of(t));
    const int64_t len = p.seq_lens[r];
    const int32_t* map = pos_slot + int64_t(r) * c.max_positions;
    int32_t* out = p.phys + t * p.phys_stride_t;
    int n = 0;
    for (int j = 0; j < p.topk; ++j) {
      const int32_t pos = p.positions[t * p.pos_stride_t + j];
      if (pos < 0 || pos >= len) continue;
      out[n++] = cache.hot_row(r, pos == len - 1 ? R - 1 : map[pos]);
    }
    for (int j = n; j < p.topk; ++j) out[j] = -1;
    if (p.counts) p.counts[t] = n;
  }
  ctr->clock += 1;
}

int64_t max_tiered_decode_batch(TieredCacheConfig cfg, size_t budget_bytes,
                                const std::function<size_t(int64_t rows)>& attention_workspace) {
  auto bytes = [&](int64_t b) -> size_t {
    cfg.max_requests = int(b);
    const TieredCache tc(cfg);
    const size_t ws = attention_workspace ? attention_workspace(b * cfg.max_tokens_per_request) : 0;
    return tc.device_bytes() + ws;
  };
  cfg.max_requests = 1;
  const TieredCache one(cfg);  // validates the geometry once (throws with the reason)
  const int64_t limit = INT32_MAX / one.hot_slots();
  if (bytes(1) > budget_bytes) return 0;
  int64_t lo = 1, hi = 2;  // bytes(lo) fits; find hi that does not (or the limit)
  while (hi <= limit && bytes(hi) <= budget_bytes) lo = hi, hi *= 2;
  if (hi > limit) {
    if (bytes(limit) <= budget_bytes) return limit;
    hi = limit;
  }
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    (bytes(mid) <= budget_bytes ? lo : hi) = mid;
  }
  return lo;
}

}  // namespace smla
