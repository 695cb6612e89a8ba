// HiSparse tiered cache (smla/tiered.h, DESIGN.md §4b): the plan and its sizes, the plan-time
// rule, the CPU reference resolver against a hand-worked sequence and against an independent
// model of the LRU rule over random steps, the hot-buffer contents, determinism, bad input, and
// the decode-batch autotune helper.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "smla/formats.h"
#include "smla/tiered.h"

using smla::TieredCache;
using smla::TieredCacheConfig;
using smla::TieredCounters;
using smla::TieredResolveParams;

namespace {

// A host pool whose row bytes name their (request, position), a block table per request (blocks
// interleaved across requests, block stride larger than the block), the state and the outputs.
struct World {
  TieredCache cache;
  int num_reqs;
  int block_size = 4;
  int64_t block_stride_rows = 6;
  int max_blocks;
  std::vector<int32_t> table;   // [num_reqs, max_blocks]
  std::vector<uint8_t> pool;
  int64_t pool_rows;
  std::vector<uint8_t> hot, state;

  World(const TieredCacheConfig& cfg, int reqs)
      : cache(cfg), num_reqs(reqs), max_blocks(int((cfg.max_positions + 3) / 4)) {
    table.resize(size_t(reqs) * max_blocks);
    for (int r = 0; r < reqs; ++r)
      for (int b = 0; b < max_blocks; ++b) table[size_t(r) * max_blocks + b] = b * reqs + (reqs - 1 - r);
    pool_rows = int64_t(max_blocks) * reqs * block_stride_rows;
    pool.resize(size_t(pool_rows) * cache.row_bytes());
    for (int r = 0; r < reqs; ++r)
      for (int64_t pos = 0; pos < cfg.max_positions; ++pos) fill_row(row_of(r, int32_t(pos)), r, pos);
    hot.assign(cache.hot_buffer_bytes(), 0xAB);
    state.resize(cache.state_bytes());
    smla::reset_tiered_state(cache, state.data(), state.size());
  }
  int64_t row_of(int r, int32_t pos) const {
    return int64_t(table[size_t(r) * max_blocks + pos / block_size]) * block_stride_rows + pos % block_size;
  }
  void fill_row(int64_t row, int r, int64_t pos) {
    uint8_t* d = pool.data() + row * cache.row_bytes();
    for (int b = 0; b < cache.row_bytes(); ++b) d[b] = uint8_t((r * 131 + pos * 7 + b * 13) ^ (pos >> 5));
  }
  const uint8_t* pool_row(int r, int32_t pos) const { return pool.data() + row_of(r, pos) * cache.row_bytes(); }
  const uint8_t* hot_row(int32_t row) const { return hot.data() + int64_t(row) * cache.hot_row_stride_bytes(); }
  // The cache writer's part: the newest token of each request into its slot R - 1.
  void write_newest(const std::vector<int32_t>& lens) {
    for (int r = 0; r < num_reqs; ++r)
      if (lens[size_t(r)] > 0)
        std::memcpy(hot.data() + int64_t(cache.newest_hot_row(r)) * cache.hot_row_stride_bytes(),
                    pool_row(r, lens[size_t(r)] - 1), size_t(cache.row_bytes()));
  }
  TieredResolveParams params(const std::vector<int32_t>& pos, int K, const std::vector<int32_t>* req_of,
                             const std::vector<int32_t>& lens, std::vector<int32_t>& phys, std::vector<int32_t>& counts) {
    TieredResolveParams p;
    p.num_tokens = int64_t(pos.size()) / K, p.positions = pos.data(), p.pos_stride_t = K, p.topk = K;
    p.req_of_token = req_of ? req_of->data() : nullptr;
    p.num_reqs = num_reqs, p.seq_lens = lens.data();
    p.pool = pool.data(), p.pool_rows = pool_rows, p.pool_row_stride_bytes = cache.row_bytes();
    p.block_table = table.data(), p.bt_stride = max_blocks, p.max_blocks = max_blocks;
    p.block_size = block_size, p.block_stride_rows = block_stride_rows;
    p.hot = hot.data(), p.hot_bytes = hot.size(), p.state = state.data(), p.state_bytes = state.size();
    phys.assign(pos.size(), 12345), counts.assign(size_t(p.num_tokens), 12345);
    p.phys = phys.data(), p.phys_stride_t = K, p.counts = counts.data();
    return p;
  }
  TieredCounters counters() const {
    TieredCounters c;
    std::memcpy(&c, state.data() + cache.state_layout().counters, sizeof(c));
    return c;
  }
};

// An independent model of the LRU rule (DESIGN.md §4b), written as a per-slot table searched
// linearly rather than with the position -> slot map the implementation keeps.
struct ModelRequest {
  struct Slot { int32_t pos = -1; uint32_t stamp = 0; };
  std::vector<Slot> slots;  // R - 1 free slots
};
struct Model {
  int R;
  uint32_t clock = 0;
  uint64_t hits = 0, misses = 0;
  std::vector<ModelRequest> reqs;
  Model(int R_, int n) : R(R_), reqs(size_t(n)) {
    for (auto& q : reqs) q.slots.resize(size_t(R_ - 1));
  }
  void invalidate(int r, int32_t pos) {
    const int s = find(reqs[size_t(r)], pos);
    if (s >= 0) reqs[size_t(r)].slots[size_t(s)] = {};
  }
  int find(const ModelRequest& q, int32_t pos) const {
    for (size_t s = 0; s < q.slots.size(); ++s)
      if (q.slots[s].pos == pos) return int(s);
    return -1;
  }
  // Returns the expected physical rows [T, K] (compacted, -1 after) and counts.
  void step(const std::vector<int32_t>& pos, int K, const std::vector<int32_t>& req_of, const std::vector<int32_t>& lens,
            std::vector<int32_t>& phys, std::vector<int32_t>& counts) {
    const uint32_t now = ++clock;
    const size_t T = req_of.size();
    for (size_t r = 0; r < reqs.size(); ++r) {
      std::vector<int32_t> needed;
      bool newest = false;
      for (size_t t = 0; t < T; ++t)
        if (req_of[t] == int32_t(r))
          for (int j = 0; j < K; ++j) {
            const int32_t p = pos[t * K + j];
            if (p < 0 || p >= lens[r]) continue;
            if (p == lens[r] - 1) newest = true;
            else needed.push_back(p);
          }
      hits += newest;
      std::sort(needed.begin(), needed.end());
      needed.erase(std::unique(needed.begin(), needed.end()), needed.end());
      ModelRequest& q = reqs[r];
      std::vector<int32_t> miss;
      for (int32_t p : needed) {
        const int s = find(q, p);
        if (s >= 0) q.slots[size_t(s)].stamp = now, ++hits;
        else miss.push_back(p);
      }
      for (int32_t p : miss) {  // ascending positions; each takes the current LRU slot not used now
        int best = -1;
        for (size_t s = 0; s < q.slots.size(); ++s) {
          if (q.slots[s].stamp == now) continue;
          if (best < 0 || q.slots[s].stamp < q.slots[size_t(best)].stamp) best = int(s);
        }
        ASSERT_GE(best, 0);
        q.slots[size_t(best)] = {p, now};
        ++misses;
      }
    }
    phys.assign(pos.size(), -1), counts.assign(T, 0);
    for (size_t t = 0; t < T; ++t) {
      const int r = req_of[t];
      int n = 0;
      for (int j = 0; j < K; ++j) {
        const int32_t p = pos[t * K + j];
        if (p < 0 || p >= lens[size_t(r)]) continue;
        const int s = p == lens[size_t(r)] - 1 ? R - 1 : find(reqs[size_t(r)], p);
        phys[t * K + n++] = r * R + s;
      }
      counts[t] = n;
    }
  }
};

TieredCacheConfig small_cfg(smla::KvFormat f, int K, int R, int reqs, int tpr, int64_t max_pos) {
  TieredCacheConfig c;
  c.format = f, c.topk = K, c.hot_slots = R, c.max_requests = reqs, c.max_tokens_per_request = tpr;
  c.max_positions = max_pos;
  return c;
}

}  // namespace

TEST(Tiered, DefaultHotSlotsAndRule) {
  EXPECT_EQ(smla::default_hot_slots(2048), 4224);  // round_up(4097, 128)
  EXPECT_EQ(smla::default_hot_slots(1), 128);
  EXPECT_EQ(smla::default_hot_slots(64), 256);     // round_up(129, 128)
  EXPECT_EQ(smla::default_hot_slots(63), 128);     // 127
  TieredCacheConfig c;
  c.topk = 2048;
  EXPECT_EQ(TieredCache(c).hot_slots(), 4224);
  c.max_tokens_per_request = 2;  // 2 * 2048 + 1 = 4097 <= 4224
  EXPECT_EQ(TieredCache(c).hot_slots(), 4224);
  c.max_tokens_per_request = 3;  // 6145 > 4224: refused, the message says what R is needed
  try {
    TieredCache tc(c);
    FAIL() << "3 tokens x K 2048 must not fit R = 4224";
  } catch (const smla::Error& e) {
    EXPECT_NE(std::string(e.what()).find("at least 6145"), std::string::npos) << e.what();
  }
  c.hot_slots = 6145;
  EXPECT_EQ(TieredCache(c).hot_slots(), 6145);
  c.hot_slots = 6144;
  EXPECT_THROW(TieredCache{c}, smla::Error);
  // Exactly at the rule: 1 x 3 + 1 = 4.
  EXPECT_NO_THROW(TieredCache(small_cfg(smla::KvFormat::kBF16, 3, 4, 1, 1, 16)));
  EXPECT_THROW(TieredCache(small_cfg(smla::KvFormat::kBF16, 3, 3, 1, 1, 16)), smla::Error);
}

TEST(Tiered, GeometryRefusals) {
  auto bad = [](auto edit) {
    TieredCacheConfig c;
    edit(c);
    EXPECT_THROW(TieredCache{c}, smla::Error);
  };
  bad([](TieredCacheConfig& c) { c.rope_dim = 32; });
  bad([](TieredCacheConfig& c) { c.topk = 0; });
  bad([](TieredCacheConfig& c) { c.max_requests = 0; });
  bad([](TieredCacheConfig& c) { c.max_tokens_per_request = 0; });
  bad([](TieredCacheConfig& c) { c.max_positions = 0; });
  bad([](TieredCacheConfig& c) { c.hot_slots = -1; });
  bad([](TieredCacheConfig& c) { c.hot_row_stride_bytes = 600; });   // < 656
  bad([](TieredCacheConfig& c) { c.hot_row_stride_bytes = 664; });   // not a multiple of 16
  bad([](TieredCacheConfig& c) { c.max_requests = 1 << 20; });       // rows past int32
}

TEST(Tiered, Sizes) {
  TieredCacheConfig c;  // fp8_ds_mla, K 2048
  c.max_requests = 3, c.max_positions = 1000;
  const TieredCache tc(c);
  const size_t R = 4224;
  EXPECT_EQ(tc.row_bytes(), 656);
  EXPECT_EQ(tc.hot_row_stride_bytes(), 656);
  EXPECT_EQ(tc.hot_rows(), int64_t(3 * R));
  EXPECT_EQ(tc.hot_buffer_bytes(), 3 * R * 656);
  EXPECT_EQ(tc.hot_row(2, 5), int32_t(2 * R + 5));
  EXPECT_EQ(tc.newest_hot_row(1), int32_t(2 * R - 1));
  const auto& L = tc.state_layout();
  auto up = [](size_t v) { return (v + 255) / 256 * 256; };
  EXPECT_EQ(L.counters, 0u);
  EXPECT_EQ(L.stamps, 256u);
  EXPECT_EQ(L.copy_flags, 256 + up(3 * R * 4));
  EXPECT_EQ(L.zero_end, L.copy_flags + up(3 * 128 * 4));  // 128 hand-off words per request
  EXPECT_EQ(L.slot_pos, L.zero_end);
  EXPECT_EQ(L.pos_slot, L.slot_pos + up(3 * R * 4));
  EXPECT_EQ(L.total, L.pos_slot + up(3 * 1000 * 4));
  EXPECT_EQ(tc.state_bytes(), L.total);
  EXPECT_EQ(tc.workspace_bytes(), 256 + 3 * R * 8);  // 3 miss counts (one 256-byte block), then R pairs per request
  EXPECT_EQ(tc.device_bytes(), tc.hot_buffer_bytes() + tc.state_bytes() + tc.workspace_bytes());
  c.format = smla::KvFormat::kBF16, c.rope_dim = 0, c.hot_row_stride_bytes = 1152;
  EXPECT_EQ(TieredCache(c).row_bytes(), 1024);
  EXPECT_EQ(TieredCache(c).hot_buffer_bytes(), 3 * R * 1152);
}

TEST(Tiered, ResetState) {
  const TieredCache tc(small_cfg(smla::KvFormat::kBF16, 3, 4, 2, 1, 10));
  std::vector<uint8_t> st(tc.state_bytes(), 0x5A);
  smla::reset_tiered_state(tc, st.data(), st.size());
  const auto& L = tc.state_layout();
  for (size_t i = 0; i < L.zero_end; ++i) ASSERT_EQ(st[i], 0) << i;
  for (size_t i = L.zero_end; i < L.total; ++i) ASSERT_EQ(st[i], 0xFF) << i;
  EXPECT_THROW(smla::reset_tiered_state(tc, st.data(), st.size() - 1), smla::Error);
  EXPECT_THROW(smla::release_tiered_request(tc, st.data(), st.size(), 2), smla::Error);
}

// K = 3, R = 4 (slots 0..2 free, 3 the newest), one request; worked by hand in the comments.
TEST(Tiered, WorkedSequence) {
  World w(small_cfg(smla::KvFormat::kFP8DsMla, 3, 4, 1, 1, 16), 1);
  std::vector<int32_t> phys, counts;
  auto step = [&](std::vector<int32_t> pos, int32_t len) {
    const std::vector<int32_t> lens{len};
    w.write_newest(lens);
    smla::resolve_tiered_reference(w.cache, w.params(pos, 3, nullptr, lens, phys, counts));
    int n = 0;
    for (int32_t p : pos) {
      if (p < 0 || p >= len) continue;
      EXPECT_EQ(0, std::memcmp(w.hot_row(phys[size_t(n++)]), w.pool_row(0, p), 656)) << "len " << len << " pos " << p;
    }
    EXPECT_EQ(n, counts[0]);
  };
  // len 10: 9 is the newest (slot 3); misses {2, 5} take never-used slots 0, 1.
  step({5, 2, 9}, 10);
  EXPECT_EQ(phys, (std::vector<int32_t>{1, 0, 3}));
  EXPECT_EQ(counts[0], 3);
  // len 11: 2 hits slot 0; miss 7 takes the LRU of {1 (stamp 1), 2 (stamp 0)}: slot 2. -1 dropped.
  step({2, 7, -1}, 11);
  EXPECT_EQ(phys, (std::vector<int32_t>{0, 2, -1}));
  EXPECT_EQ(counts[0], 2);
  // len 12: 5 hits slot 1; misses {6, 8} take slots {0, 2} (both stamp 2, lower slot first).
  step({8, 6, 5}, 12);
  EXPECT_EQ(phys, (std::vector<int32_t>{2, 0, 1}));
  // len 12 again: 12 is past the length (invalid, compacted away), 11 is the newest; 7 was
  // evicted: all stamps are 3, so it takes slot 0.
  step({12, 7, 11}, 12);
  EXPECT_EQ(phys, (std::vector<int32_t>{0, 3, -1}));
  EXPECT_EQ(counts[0], 2);
  // 7 hits slot 0; 2 (evicted at len 12) takes the lower of slots 1, 2 (both stamp 3).
  step({2, 7, 11}, 12);
  EXPECT_EQ(phys, (std::vector<int32_t>{1, 0, 3}));
  const TieredCounters c = w.counters();
  // hits: newest | 2 | 5 | newest | 7 + newest.  misses: 2, 5 | 7 | 6, 8 | 7 | 2
  EXPECT_EQ(c.hits, 1u + 1u + 1u + 1u + 2u);
  EXPECT_EQ(c.misses, 2u + 1u + 2u + 1u + 1u);
  EXPECT_EQ(c.bytes, c.misses * 656u);
  EXPECT_EQ(c.clock, 5u);
  EXPECT_EQ(c.errors, 0u);
}

// Random steps over several requests, tokens per request, reuse fractions, invalid and empty
// rows: the exact slots against the model, and every output row's bytes against the host pool.
TEST(Tiered, RandomStepsMatchModel) {
  for (auto f : {smla::KvFormat::kBF16, smla::KvFormat::kFP8E4M3, smla::KvFormat::kFP8DsMla, smla::KvFormat::kNvFP4DsMla})
    for (int tpr : {1, 2}) {
      const int K = 37, reqs = 5, R = tpr * K + 1 + (tpr == 1 ? 9 : 0);
      const int64_t max_pos = 400;
      World w(small_cfg(f, K, R, reqs, tpr, max_pos), reqs);
      Model m(R, reqs);
      std::mt19937 rng(1234 + int(f) * 10 + tpr);
      std::vector<int32_t> lens(static_cast<size_t>(reqs));
      for (auto& l : lens) l = int32_t(1 + rng() % 200);
      std::vector<std::vector<int32_t>> prev(static_cast<size_t>(reqs));
      for (int step = 0; step < 40; ++step) {
        const double reuse = std::vector<double>{0.0, 0.5, 0.9, 1.0}[size_t(step % 4)];
        std::vector<int32_t> pos, req_of;
        for (int r = 0; r < reqs; ++r) {
          if (rng() % 7 == 0) continue;  // a request without tokens this step
          const int ntok = 1 + int(rng() % unsigned(tpr));
          std::vector<int32_t> cur;
          for (int t = 0; t < ntok; ++t) {
            req_of.push_back(r);
            const int kind = int(rng() % 10);
            for (int j = 0; j < K; ++j) {
              int32_t p;
              if (kind == 0) p = -1;  // an empty row
              else if (rng() % 10 == 0) p = std::vector<int32_t>{-1, -7, lens[size_t(r)], lens[size_t(r)] + 3,
                                                                  lens[size_t(r)] - 1}[rng() % 5];
              else if (!prev[size_t(r)].empty() && double(rng() % 1000) < reuse * 1000)
                p = prev[size_t(r)][rng() % prev[size_t(r)].size()];
              else p = int32_t(rng() % uint32_t(lens[size_t(r)]));
              pos.push_back(p);
              cur.push_back(p);
            }
          }
          prev[size_t(r)].clear();
          for (int32_t p : cur)
            if (p >= 0 && p < lens[size_t(r)]) prev[size_t(r)].push_back(p);
        }
        std::vector<int32_t> phys, counts, ephys, ecounts;
        w.write_newest(lens);
        smla::resolve_tiered_reference(w.cache, w.params(pos, K, &req_of, lens, phys, counts));
        m.step(pos, K, req_of, lens, ephys, ecounts);
        ASSERT_EQ(phys, ephys) << "step " << step << " format " << smla::to_string(f);
        ASSERT_EQ(counts, ecounts) << "step " << step;
        for (size_t t = 0; t < req_of.size(); ++t) {
          int n = 0;
          for (int j = 0; j < K; ++j) {
            const int32_t p = pos[t * K + size_t(j)];
            const int r = req_of[t];
            if (p < 0 || p >= lens[size_t(r)]) continue;
            ASSERT_EQ(0, std::memcmp(w.hot_row(phys[t * K + size_t(n++)]), w.pool_row(r, p), size_t(w.cache.row_bytes())))
                << "step " << step << " token " << t << " entry " << j;
          }
        }
        const TieredCounters c = w.counters();
        ASSERT_EQ(c.hits, m.hits);
        ASSERT_EQ(c.misses, m.misses);
        ASSERT_EQ(c.bytes, m.misses * uint64_t(w.cache.row_bytes()));
        ASSERT_EQ(c.clock, uint32_t(step + 1));
        for (auto& l : lens)
          if (l < max_pos) l += int32_t(rng() % 3);  // decode grows each request (or not)
        if (step == 30) {  // request 1's last few positions are rewritten (a speculative rollback)
          std::vector<int32_t> rq, ps;
          for (int32_t d = 1; d <= 6 && lens[1] - d >= 0; ++d) rq.push_back(1), ps.push_back(lens[1] - d);
          rq.push_back(-1), ps.push_back(3);  // padding: skipped
          smla::invalidate_tiered_positions(w.cache, w.state.data(), w.state.size(), rq.data(), ps.data(),
                                            int64_t(rq.size()));
          for (size_t i = 0; i + 1 < rq.size(); ++i) m.invalidate(rq[i], ps[i]);
        }
        if (step == 20) {  // request 2 finishes; its hot buffer starts over
          smla::release_tiered_request(w.cache, w.state.data(), w.state.size(), 2);
          m.reqs[2] = ModelRequest{};
          m.reqs[2].slots.resize(size_t(R - 1));
        }
      }
      EXPECT_GT(w.counters().misses, 0u);
      EXPECT_GT(w.counters().hits, 0u);
    }
}

TEST(Tiered, Deterministic) {
  auto run = [](std::vector<uint8_t>& state, std::vector<int32_t>& all_phys) {
    World w(small_cfg(smla::KvFormat::kBF16, 16, 40, 3, 2, 100), 3);
    std::mt19937 rng(99);
    std::vector<int32_t> lens{50, 80, 100};
    for (int step = 0; step < 10; ++step) {
      std::vector<int32_t> pos, req_of{2, 0, 0, 1, 2};
      for (size_t i = 0; i < req_of.size() * 16; ++i) pos.push_back(int32_t(rng() % 110) - 5);
      std::vector<int32_t> phys, counts;
      smla::resolve_tiered_reference(w.cache, w.params(pos, 16, &req_of, lens, phys, counts));
      all_phys.insert(all_phys.end(), phys.begin(), phys.end());
    }
    state = w.state;
  };
  std::vector<uint8_t> s1, s2;
  std::vector<int32_t> p1, p2;
  run(s1, p1);
  run(s2, p2);
  EXPECT_EQ(s1, s2);
  EXPECT_EQ(p1, p2);
}

TEST(Tiered, EmptyStepAndEmptyRows) {
  World w(small_cfg(smla::KvFormat::kBF16, 4, 8, 2, 1, 20), 2);
  std::vector<int32_t> phys, counts, lens{5, 0};
  std::vector<int32_t> none;
  auto p = w.params(none, 4, nullptr, lens, phys, counts);
  smla::resolve_tiered_reference(w.cache, p);  // T = 0: only the clock moves
  EXPECT_EQ(w.counters().clock, 1u);
  EXPECT_EQ(w.counters().misses, 0u);
  // Request 1 has length 0: every entry is invalid, its row is empty.
  std::vector<int32_t> pos{0, 1, 2, 3, 0, 1, -1, 4};
  smla::resolve_tiered_reference(w.cache, w.params(pos, 4, nullptr, lens, phys, counts));
  EXPECT_EQ(counts, (std::vector<int32_t>{4, 0}));
  EXPECT_EQ(std::vector<int32_t>(phys.begin() + 4, phys.end()), (std::vector<int32_t>{-1, -1, -1, -1}));
}

TEST(Tiered, BadInput) {
  World w(small_cfg(smla::KvFormat::kBF16, 4, 8, 2, 1, 20), 2);
  std::vector<int32_t> phys, counts, lens{5, 6}, pos{0, 1, 2, 3, 0, 1, 2, 3};
  auto expect_error = [&](auto edit, const char* needle) {
    std::vector<int32_t> l = lens, q = pos, req_of{0, 1};
    auto p = w.params(q, 4, &req_of, l, phys, counts);
    edit(p, l, q, req_of);
    try {
      smla::resolve_tiered_reference(w.cache, p);
      ADD_FAILURE() << "expected an error containing '" << needle << "'";
    } catch (const smla::Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  using P = TieredResolveParams;
  using V = std::vector<int32_t>;
  expect_error([](P&, V& l, V&, V&) { l[1] = 21; }, "max_positions");
  expect_error([](P&, V&, V&, V& r) { r[1] = 2; }, "has no hot buffer");
  expect_error([](P&, V&, V&, V& r) { r[1] = -1; }, "has no hot buffer");
  expect_error([](P&, V&, V&, V& r) { r[1] = 0; }, "max_tokens_per_request");
  expect_error([](P& p, V&, V&, V&) { p.num_reqs = 3; }, "larger max_requests");
  expect_error([](P& p, V&, V&, V&) { p.hot_bytes -= 1; }, "hot buffer too small");
  expect_error([](P& p, V&, V&, V&) { p.hot = nullptr; }, "hot buffer too small");
  expect_error([](P& p, V&, V&, V&) { p.state_bytes -= 1; }, "tiered state too small");
  expect_error([](P& p, V&, V&, V&) { p.pool_rows = 3; }, "host-pool row");      // pool too small
  expect_error([](P& p, V&, V& q, V&) { p.max_blocks = 1; q[7] = 4; }, "host-pool row");  // table too short
  expect_error([](P& p, V&, V&, V&) { p.pool = nullptr; }, "host pool is empty");
  expect_error([](P& p, V&, V&, V&) { p.pool_row_stride_bytes = 1000; }, "host pool row stride");
  expect_error([](P& p, V&, V&, V&) { p.topk = 5; p.pos_stride_t = 5; }, "planned topk");
  expect_error([](P& p, V&, V&, V&) { p.seq_lens = nullptr; }, "seq_lens");
  expect_error([](P& p, V&, V&, V&) { p.phys_stride_t = 3; }, "phys must be");
  expect_error([](P& p, V&, V&, V&) { p.req_of_token = nullptr; p.num_reqs = 1; }, "exceed num_reqs");
  // Nothing was written by any refused call: the state is still fresh.
  EXPECT_EQ(w.counters().clock, 0u);
  EXPECT_EQ(w.counters().misses, 0u);
}

// TieredGpu.BadInput's device-side sequence (tests/gpu/test_tiered_cache.cpp) replayed on the
// reference, which refuses bad data where the CUDA resolver counts it in TieredCounters::errors: one
// error per token of a request with a bad id or length, one per entry that needs a host-pool row and
// has none. Each such unit presented alone must be refused here, and the step without them accepted;
// the counter the GPU test reads after both calls is their number, 2 + 8 (session 13: b87859f had
// turned the GPU test's final expectation into 1 + 8, which its own first check, 2, rules out).
TEST(Tiered, GpuBadInputSequenceErrorCount) {
  const int K = 8;
  World w(small_cfg(smla::KvFormat::kBF16, K, 0, 2, 1, 256), 2);  // the GPU test's geometry, default R
  std::vector<int32_t> phys, counts, pos(2 * K);
  for (int i = 0; i < 2 * K; ++i) pos[size_t(i)] = i * 5;
  auto refused = [&](const std::vector<int32_t>& q, const std::vector<int32_t>& req_of,
                     const std::vector<int32_t>& lens, const char* needle) {
    try {
      smla::resolve_tiered_reference(w.cache, w.params(q, K, &req_of, lens, phys, counts));
    } catch (const smla::Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
      return true;
    }
    return false;
  };
  auto token_row = [&](int t) { return std::vector<int32_t>(pos.begin() + t * K, pos.begin() + (t + 1) * K); };
  uint64_t errors = 0;
  // Call 1: tokens of requests {0, 7}, lengths {300, 120} (max_positions 256).
  const std::vector<int32_t> bad_req{0, 7}, bad_lens{300, 120};
  const char* why[] = {"past the tiered cache's max_positions", "has no hot buffer"};
  for (int t = 0; t < 2; ++t) errors += refused(token_row(t), {bad_req[size_t(t)]}, bad_lens, why[t]);
  EXPECT_EQ(errors, 2u);
  const std::vector<int32_t> no_pos;
  smla::resolve_tiered_reference(w.cache, w.params(no_pos, K, nullptr, bad_lens, phys, counts));  // both dropped
  EXPECT_EQ(w.counters().clock, 1u);
  // Call 2: requests {0, 1}, lengths {100, 120}; request 0's positions 0..63 lose their pool rows
  // (the GPU test's block of 64 = this world's blocks 0..15 of 4).
  const std::vector<int32_t> req{0, 1}, lens{100, 120};
  for (int b = 0; b < 64 / w.block_size; ++b) w.table[size_t(b)] = -1;
  std::vector<int32_t> kept = pos;  // the step without the refused entries
  for (int j = 0; j < K; ++j) {  // token 0's entries, one at a time (token 1's: the accepted step below)
    std::vector<int32_t> alone(2 * K, -1);
    alone[size_t(j)] = pos[size_t(j)];
    if (refused(alone, req, lens, "has no host-pool row")) ++errors, kept[size_t(j)] = -1;
  }
  EXPECT_EQ(errors, 2u + 8u);
  smla::resolve_tiered_reference(w.cache, w.params(kept, K, &req, lens, phys, counts));
  EXPECT_EQ(counts, (std::vector<int32_t>{0, 8}));  // the GPU test's counts and misses
  EXPECT_EQ(w.counters().misses, 8u);
  EXPECT_EQ(w.counters().clock, 2u);
}

TEST(Tiered, MaxDecodeBatch) {
  TieredCacheConfig c;  // fp8_ds_mla, K 2048, R 4224, max_positions 131072
  // The worked example in tiered.h: a 1 GiB budget.
  const int64_t b = smla::max_tiered_decode_batch(c, size_t(1) << 30);
  c.max_requests = int(b);
  EXPECT_LE(TieredCache(c).device_bytes(), size_t(1) << 30);
  c.max_requests = int(b + 1);
  EXPECT_GT(TieredCache(c).device_bytes(), size_t(1) << 30);
  EXPECT_EQ(b, 319);
  // With an attention workspace of 1 MB per row the batch shrinks; one that never fits gives 0.
  const int64_t b2 = smla::max_tiered_decode_batch(c, size_t(1) << 30, [](int64_t rows) { return size_t(rows) << 20; });
  EXPECT_LT(b2, b);
  c.max_requests = int(b2);
  EXPECT_LE(TieredCache(c).device_bytes() + (size_t(b2) << 20), size_t(1) << 30);
  c.max_requests = int(b2 + 1);
  EXPECT_GT(TieredCache(c).device_bytes() + (size_t(b2 + 1) << 20), size_t(1) << 30);
  EXPECT_EQ(smla::max_tiered_decode_batch(c, 1000), 0);
  // Two tokens per request: the attention workspace sees 2 rows per request.
  c.max_tokens_per_request = 2;
  int64_t seen = 0;
  smla::max_tiered_decode_batch(c, size_t(1) << 30, [&](int64_t rows) { seen = std::max(seen, rows); return size_t(0); });
  EXPECT_EQ(seen % 2, 0);
  c.max_tokens_per_request = 3;  // breaks the rule at R = 4224
  EXPECT_THROW(smla::max_tiered_decode_batch(c, size_t(1) << 30), smla::Error);
}

// A position rewritten in the pool: without invalidation its stale hot row would be a hit; after
// invalidate_tiered_positions it is a miss again, copied fresh into the freed slot.
TEST(Tiered, InvalidatePositions) {
  World w(small_cfg(smla::KvFormat::kBF16, 3, 4, 1, 1, 16), 1);
  std::vector<int32_t> phys, counts, lens{10};
  std::vector<int32_t> pos{5, 2, 9};
  smla::resolve_tiered_reference(w.cache, w.params(pos, 3, nullptr, lens, phys, counts));
  EXPECT_EQ(phys, (std::vector<int32_t>{1, 0, 3}));  // 2 -> slot 0, 5 -> slot 1
  w.fill_row(w.row_of(0, 5), 0, 12345);              // position 5 rewritten in the pool
  const int32_t rq[] = {0, 0, -1}, ps[] = {5, 7, 2};  // 7 is not hot; the third entry is padding
  smla::invalidate_tiered_positions(w.cache, w.state.data(), w.state.size(), rq, ps, 3);
  std::vector<int32_t> pos2{5, 2, -1};
  smla::resolve_tiered_reference(w.cache, w.params(pos2, 3, nullptr, lens, phys, counts));
  // 2 hits slot 0; 5 misses and takes slot 1 (stamp 0 again, before slot 2 by index).
  EXPECT_EQ(phys, (std::vector<int32_t>{1, 0, -1}));
  EXPECT_EQ(0, std::memcmp(w.hot_row(1), w.pool_row(0, 5), size_t(w.cache.row_bytes())));
  EXPECT_EQ(w.counters().misses, 3u);
  const int32_t bad_req[] = {1}, bad_pos[] = {0}, far_pos[] = {16};
  EXPECT_THROW(smla::invalidate_tiered_positions(w.cache, w.state.data(), w.state.size(), bad_req, bad_pos, 1),
               smla::Error);
  EXPECT_THROW(smla::invalidate_tiered_positions(w.cache, w.state.data(), w.state.size(), rq, far_pos, 1),
               smla::Error);
}

// Only rows that must be copied need a host-pool row: a hot position stays a hit even when the
// pool no longer covers it (the CUDA resolver never reads the block table on the hit path).
TEST(Tiered, HitsNeedNoPoolRow) {
  World w(small_cfg(smla::KvFormat::kBF16, 3, 4, 1, 1, 16), 1);
  std::vector<int32_t> phys, counts, lens{10}, pos{5, 2, 9};
  smla::resolve_tiered_reference(w.cache, w.params(pos, 3, nullptr, lens, phys, counts));
  auto p = w.params(pos, 3, nullptr, lens, phys, counts);
  p.pool_rows = 1;  // rows of positions 2 and 5 are gone from the pool; both are hot
  smla::resolve_tiered_reference(w.cache, p);
  EXPECT_EQ(phys, (std::vector<int32_t>{1, 0, 3}));
  std::vector<int32_t> pos3{5, 3, 9};  // 3 is not hot: it would be copied, and has no pool row
  auto p3 = w.params(pos3, 3, nullptr, lens, phys, counts);
  p3.pool_rows = 1;
  EXPECT_THROW(smla::resolve_tiered_reference(w.cache, p3), smla::Error);
}
