// HiSparse tiered cache on the GPU (smla/cuda_tiered.h, DESIGN.md §4b): the CUDA resolver equals
// the CPU reference (state, hot buffer, physical ids, counts, counters) over a sequence of decode
// steps for every format; attention over the hot buffer is bit-identical to attention over the
// same rows resident in a full device cache; a CUDA graph of resolve + attention replays
// correctly across steps; the tiered cache writer equals the CPU encoder in the pool and the hot
// slot; bad input is refused before launch, and bad device-side data is counted, never read.
// Skips without an SM90 device.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include "../common/gpu_test.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "cuda/tiered/gather.h"
#include "smla/cache.h"
#include "smla/cuda_serving.h"
#include "smla/cuda_tiered.h"
#include "smla/engine.h"
#include "smla/formats.h"
#include "smla/numeric.h"
#include "smla/tiered.h"

namespace {

using namespace smla;
using smla::test::fresh_seed;

#define CUDA_OK(x) ASSERT_EQ((x), cudaSuccess) << #x
#define CUDA_EXPECT(x) EXPECT_EQ((x), cudaSuccess) << #x

template <class T>
T* dev_alloc(size_t n) {
  void* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, std::max<size_t>(1, n * sizeof(T))), cudaSuccess);
  return static_cast<T*>(p);
}
template <class T>
void to_dev(T* d, const std::vector<T>& h) {
  if (!h.empty()) EXPECT_EQ(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
}
template <class T>
std::vector<T> to_host(const T* d, size_t n) {
  std::vector<T> h(n);
  if (n) EXPECT_EQ(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
  return h;
}

constexpr int kBlock = 64;  // host-pool tokens per block

// One tiered cache in both worlds: a pinned host pool (shared by the CPU reference and the GPU),
// the GPU's hot buffer / state / workspace, and the CPU reference's own hot buffer and state.
struct Tiered {
  TieredCache cache;
  int reqs, max_blocks;
  int64_t pool_rows;
  uint8_t* pool = nullptr;  // pinned
  std::vector<int32_t> table;
  int32_t* d_table = nullptr;
  uint8_t *d_hot = nullptr, *d_state = nullptr, *d_ws = nullptr;
  std::vector<uint8_t> hot, state;  // the CPU reference's
  std::mt19937_64 rng;

  Tiered(const TieredCacheConfig& cfg, uint64_t seed) : cache(cfg), reqs(cfg.max_requests), rng(seed) {
    max_blocks = int((cfg.max_positions + kBlock - 1) / kBlock);
    table.resize(size_t(reqs) * max_blocks);
    std::vector<int32_t> perm(table.size());
    for (size_t i = 0; i < perm.size(); ++i) perm[i] = int32_t(i);
    std::shuffle(perm.begin(), perm.end(), rng);
    table = perm;
    pool_rows = int64_t(table.size()) * kBlock;
    const size_t pool_bytes = size_t(pool_rows) * cache.row_bytes();
    EXPECT_EQ(cudaHostAlloc(reinterpret_cast<void**>(&pool), pool_bytes, cudaHostAllocMapped), cudaSuccess);
    for (int64_t r = 0; r < pool_rows; ++r) encode_random(pool + r * cache.row_bytes());
    d_table = dev_alloc<int32_t>(table.size());
    to_dev(d_table, table);
    d_hot = dev_alloc<uint8_t>(cache.hot_buffer_bytes());
    d_state = dev_alloc<uint8_t>(cache.state_bytes());
    d_ws = dev_alloc<uint8_t>(cache.workspace_bytes());
    EXPECT_EQ(cudaMemset(d_hot, 0, cache.hot_buffer_bytes()), cudaSuccess);
    cuda::reset_tiered_state(cache, d_state, cache.state_bytes(), nullptr);
    hot.assign(cache.hot_buffer_bytes(), 0);
    state.resize(cache.state_bytes());
    reset_tiered_state(cache, state.data(), state.size());
  }
  ~Tiered() {
    cudaFreeHost(pool);
    for (void* p : {static_cast<void*>(d_table), static_cast<void*>(d_hot), static_cast<void*>(d_state),
                    static_cast<void*>(d_ws)})
      cudaFree(p);
  }
  void encode_random(uint8_t* row) {
    std::normal_distribution<float> nd(0.0f, 1.0f);
    float lat[kLatentDim], rope[kRopeDim];
    for (float& x : lat) x = nd(rng);
    for (float& x : rope) x = nd(rng);
    encode_row(cache.config().format, cache.config().rope_dim, lat, rope, 0.05f, row);
  }
  int64_t pool_row(int r, int32_t pos) const {
    return int64_t(table[size_t(r) * max_blocks + pos / kBlock]) * kBlock + pos % kBlock;
  }
  TieredResolveParams params(bool device) {
    TieredResolveParams p;
    p.num_reqs = reqs;
    p.pool = pool, p.pool_rows = pool_rows, p.pool_row_stride_bytes = cache.row_bytes();
    p.block_table = device ? d_table : table.data(), p.bt_stride = max_blocks, p.max_blocks = max_blocks;
    p.block_size = kBlock, p.block_stride_rows = kBlock;
    p.hot = device ? static_cast<void*>(d_hot) : hot.data(), p.hot_bytes = cache.hot_buffer_bytes();
    p.state = device ? static_cast<void*>(d_state) : state.data(), p.state_bytes = cache.state_bytes();
    p.workspace = device ? d_ws : nullptr, p.workspace_bytes = device ? cache.workspace_bytes() : 0;
    return p;
  }
};

// A decode step: T tokens over the requests, positions with a chosen reuse fraction of the
// previous step's rows, invalid entries, empty rows and positions past the length.
struct Step {
  std::vector<int32_t> pos, req_of, lens;
  int64_t T() const { return int64_t(req_of.size()); }
};

struct StepMaker {
  int K, reqs, tpr;
  bool all_active = false;  // every request has tpr tokens, in request order (req_of_token may be null)
  std::vector<int32_t> lens;
  std::vector<std::vector<int32_t>> prev;
  StepMaker(int K_, int reqs_, int tpr_, std::mt19937_64& rng, int32_t max_len)
      : K(K_), reqs(reqs_), tpr(tpr_), lens(static_cast<size_t>(reqs_)), prev(static_cast<size_t>(reqs_)) {
    for (auto& l : lens) l = int32_t(1 + rng() % uint64_t(max_len / 2));
  }
  Step next(std::mt19937_64& rng, double reuse, int32_t max_len) {
    Step s;
    for (int r = 0; r < reqs; ++r)
      if (lens[size_t(r)] < max_len) lens[size_t(r)] += 1;  // the token decoded last step
    s.lens = lens;
    for (int r = 0; r < reqs; ++r) {
      if (!all_active && rng() % 8 == 0) continue;  // a request idle this step
      const int ntok = all_active ? tpr : 1 + int(rng() % uint64_t(tpr));
      std::vector<int32_t> cur;
      for (int t = 0; t < ntok; ++t) {
        s.req_of.push_back(r);
        const bool empty = rng() % 12 == 0;
        for (int j = 0; j < K; ++j) {
          const int32_t len = lens[size_t(r)];
          int32_t p;
          if (empty) p = -1;
          else if (rng() % 16 == 0) p = std::vector<int32_t>{-1, -5, len, len + 9, len - 1}[rng() % 5];
          else if (!prev[size_t(r)].empty() && double(rng() % 1000) < reuse * 1000) p = prev[size_t(r)][rng() % prev[size_t(r)].size()];
          else p = int32_t(rng() % uint64_t(len));
          s.pos.push_back(p);
          if (p >= 0 && p < len) cur.push_back(p);
        }
      }
      prev[size_t(r)] = cur;
    }
    return s;
  }
};

// The cache writer's part of a decode step: the newest token of every request into the pool and
// its hot slot R - 1 (GPU: write_cache_tiered; CPU reference: the same bytes from the pool).
void write_newest(Tiered& w, const std::vector<int32_t>& lens, std::mt19937_64& rng) {
  const int n = w.reqs;
  std::vector<uint16_t> lat(size_t(n) * kLatentDim), rope(size_t(n) * kRopeDim);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (auto& x : lat) x = num::f32_to_bf16(nd(rng));
  for (auto& x : rope) x = num::f32_to_bf16(nd(rng));
  std::vector<int32_t> slots(static_cast<size_t>(n)), hot_rows(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) {
    const int32_t pos = lens[size_t(r)] - 1;
    slots[size_t(r)] = w.table[size_t(r) * w.max_blocks + pos / kBlock] * kBlock + pos % kBlock;
    hot_rows[size_t(r)] = w.cache.newest_hot_row(r);
  }
  uint16_t* d_lat = dev_alloc<uint16_t>(lat.size());
  uint16_t* d_rope = dev_alloc<uint16_t>(rope.size());
  int32_t* d_slots = dev_alloc<int32_t>(size_t(n));
  int32_t* d_hot_rows = dev_alloc<int32_t>(size_t(n));
  to_dev(d_lat, lat), to_dev(d_rope, rope), to_dev(d_slots, slots), to_dev(d_hot_rows, hot_rows);
  CacheWriteParams cw;
  cw.num_tokens = n, cw.latent = d_lat, cw.latent_stride = kLatentDim;
  cw.rope = w.cache.config().rope_dim ? d_rope : nullptr, cw.rope_stride = kRopeDim;
  cw.slot_mapping = d_slots, cw.cache = w.pool, cw.num_rows = w.pool_rows, cw.row_stride_bytes = w.cache.row_bytes();
  cw.block_size = kBlock, cw.block_stride_rows = kBlock, cw.format = w.cache.config().format;
  cw.rope_dim = w.cache.config().rope_dim, cw.k_scale = 0.05f;
  cuda::write_cache_tiered(w.cache, cw, d_hot_rows, w.d_hot, w.cache.hot_buffer_bytes(), nullptr);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  // The pool rows are the CPU encoder's bits.
  CacheWriteParams ref = cw;
  std::vector<uint8_t> expect(size_t(w.pool_rows) * w.cache.row_bytes());
  std::memcpy(expect.data(), w.pool, expect.size());
  ref.latent = lat.data(), ref.rope = w.cache.config().rope_dim ? rope.data() : nullptr, ref.slot_mapping = slots.data();
  ref.cache = expect.data();
  write_cache_reference(ref);
  EXPECT_EQ(0, std::memcmp(expect.data(), w.pool, expect.size())) << "pool rows differ from write_cache_reference";
  const auto dh = to_host(w.d_hot, w.cache.hot_buffer_bytes());
  for (int r = 0; r < n; ++r) {
    const int64_t hr = w.cache.newest_hot_row(r);
    const uint8_t* src = w.pool + w.pool_row(r, lens[size_t(r)] - 1) * w.cache.row_bytes();
    EXPECT_EQ(0, std::memcmp(dh.data() + hr * w.cache.hot_row_stride_bytes(), src, size_t(w.cache.row_bytes())))
        << "request " << r << ": the hot slot R - 1 is not the newest token's row";
    std::memcpy(w.hot.data() + hr * w.cache.hot_row_stride_bytes(), src, size_t(w.cache.row_bytes()));
  }
  for (void* p : {static_cast<void*>(d_lat), static_cast<void*>(d_rope), static_cast<void*>(d_slots),
                  static_cast<void*>(d_hot_rows)})
    cudaFree(p);
}

// Attention over rows `phys` of kv, q fixed per test.
struct Attention {
  int H = 32, K;
  KvFormat format;
  int rope_dim;
  Plan plan;
  int64_t max_T;
  uint16_t* d_q = nullptr;
  uint16_t* d_out = nullptr;
  float* d_lse = nullptr;
  void* d_ws = nullptr;

  // A 16-bit q of the cache's type for 16-bit caches (an fp16 cache takes only an fp16 q), bf16
  // for the quantized ones; out has q's type.
  static DType q_type(KvFormat f) { return f == KvFormat::kFP16 ? DType::kFP16 : DType::kBF16; }
  static PlanConfig config(KvFormat f, int rope_dim, int K, int64_t max_T) {
    PlanConfig c;
    c.backend = Backend::kCuda, c.max_rows = max_T;
    c.geometry.num_heads = 32, c.geometry.rope_dim = rope_dim, c.geometry.format = f;
    c.geometry.q_dtype = q_type(f), c.geometry.topk = K, c.geometry.lse_mode = LseMode::kBaseE;
    return c;
  }
  Attention(KvFormat f, int rope_dim_, int K_, int64_t max_T_, std::mt19937_64& rng)
      : K(K_), format(f), rope_dim(rope_dim_), plan(config(f, rope_dim_, K_, max_T_)), max_T(max_T_) {
    const int D = kLatentDim + rope_dim;
    std::vector<uint16_t> q(size_t(max_T) * H * D);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    for (auto& x : q) x = f == KvFormat::kFP16 ? num::f32_to_fp16(nd(rng)) : num::f32_to_bf16(nd(rng));
    d_q = dev_alloc<uint16_t>(q.size());
    to_dev(d_q, q);
    d_out = dev_alloc<uint16_t>(size_t(max_T) * H * kLatentDim);
    d_lse = dev_alloc<float>(size_t(max_T) * H);
    if (plan.workspace_bytes()) d_ws = dev_alloc<uint8_t>(plan.workspace_bytes());
  }
  ~Attention() {
    for (void* p : {static_cast<void*>(d_q), static_cast<void*>(d_out), static_cast<void*>(d_lse), d_ws}) cudaFree(p);
  }
  SparseMlaParams params(int64_t T, const void* kv, int64_t num_rows, int64_t stride, const int32_t* idx,
                         const int32_t* counts) const {
    SparseMlaParams p;
    p.num_tokens = T, p.num_heads = H, p.rope_dim = rope_dim, p.topk = K;
    p.q = d_q, p.q_dtype = q_type(format);
    p.kv = kv, p.num_rows = num_rows, p.kv_row_stride_bytes = stride, p.format = format;
    p.idx = idx, p.counts = counts, p.softmax_scale = 0.1352338f, p.k_scale = 0.05f;
    p.out = d_out, p.out_dtype = q_type(format), p.lse = d_lse, p.lse_mode = LseMode::kBaseE;
    set_dense_strides(p);
    p.kv_row_stride_bytes = stride;
    return p;
  }
  void run(const SparseMlaParams& p, cudaStream_t s) const { plan.run(p, d_ws, plan.workspace_bytes(), s); }
  std::vector<uint8_t> out_bytes(int64_t T) const {
    const auto v = to_host(reinterpret_cast<const uint8_t*>(d_out), size_t(T) * H * kLatentDim * 2);
    return v;
  }
  std::vector<float> lse(int64_t T) const { return to_host(d_lse, size_t(T) * H); }
  void poison(int64_t T) const {
    EXPECT_EQ(cudaMemset(d_out, 0xff, size_t(T) * H * kLatentDim * 2), cudaSuccess);
    EXPECT_EQ(cudaMemset(d_lse, 0xff, size_t(T) * H * 4), cudaSuccess);
  }
};

// The comparison of one resolved step: GPU against the CPU reference.
void expect_same_resolution(Tiered& w, const Step& s, const int32_t* d_phys, const int32_t* d_counts,
                            const std::vector<int32_t>& phys, const std::vector<int32_t>& counts, int step,
                            const char* fmt) {
  EXPECT_EQ(to_host(d_phys, phys.size()), phys) << fmt << " step " << step << ": physical rows differ";
  EXPECT_EQ(to_host(d_counts, counts.size()), counts) << fmt << " step " << step << ": counts differ";
  const auto st = to_host(w.d_state, w.cache.state_bytes());
  const auto& L = w.cache.state_layout();
  // Stamps, the copy hand-off flags (each back to 0 after the step), slot positions and the map.
  EXPECT_EQ(0, std::memcmp(st.data() + L.stamps, w.state.data() + L.stamps, L.total - L.stamps))
      << fmt << " step " << step << ": map / slot positions / stamps / hand-off flags differ";
  TieredCounters g, c;
  std::memcpy(&g, st.data() + L.counters, sizeof(g));
  std::memcpy(&c, w.state.data() + L.counters, sizeof(c));
  EXPECT_EQ(g.hits, c.hits) << fmt << " step " << step;
  EXPECT_EQ(g.misses, c.misses) << fmt << " step " << step;
  EXPECT_EQ(g.bytes, c.bytes) << fmt << " step " << step;
  EXPECT_EQ(g.errors, 0u) << fmt << " step " << step;
  EXPECT_EQ(g.clock, c.clock) << fmt << " step " << step;
  EXPECT_EQ(to_host(w.d_hot, w.cache.hot_buffer_bytes()) == w.hot, true) << fmt << " step " << step << ": hot buffers differ";
  (void)s;
}

std::vector<int32_t> resolve_cpu(Tiered& w, const Step& s, int K, std::vector<int32_t>& counts) {
  std::vector<int32_t> phys(s.pos.size(), 777);
  counts.assign(size_t(s.T()), 777);
  TieredResolveParams p = w.params(false);
  p.num_tokens = s.T(), p.positions = s.pos.data(), p.pos_stride_t = K, p.topk = K;
  p.req_of_token = s.req_of.data(), p.seq_lens = s.lens.data();
  p.phys = phys.data(), p.phys_stride_t = K, p.counts = counts.data();
  resolve_tiered_reference(w.cache, p);
  return phys;
}

// The geometry of a step sequence. The default: K not a multiple of 64, R = round_up(201, 128) = 256,
// six requests of up to two tokens each.
struct Shape {
  int K = 100, reqs = 6, tpr = 2;
  int64_t max_positions = 700;
  bool null_req_of = false;  // one token per request, every step, and req_of_token null on the GPU
  std::function<Step(int)> script;  // when set: step i's positions, request map and lengths (no StepMaker)
};

// Runs `steps` decode steps for one format and checks resolution and attention each step.
// hot_slots 0: the default R. start_clock: every request's clock word (the stamp of slot R - 1) on
// both sides before the first step (a long-running cache: the resolver's 64-bit LRU keys).
void run_sequence(KvFormat f, int rope_dim, int steps, uint64_t seed, int hot_slots = 0, uint32_t start_clock = 0,
                  Shape shape = {}) {
  const int K = shape.K, reqs = shape.reqs, tpr = shape.tpr;
  TieredCacheConfig cfg;
  cfg.format = f, cfg.rope_dim = rope_dim, cfg.topk = K, cfg.max_requests = reqs, cfg.max_tokens_per_request = tpr;
  cfg.hot_slots = hot_slots;
  cfg.max_positions = shape.max_positions;
  Tiered w(cfg, seed);
  if (start_clock) {
    const size_t R = size_t(w.cache.hot_slots());
    for (size_t r = 0; r < size_t(reqs); ++r)
      std::memcpy(w.state.data() + w.cache.state_layout().stamps + (r * R + R - 1) * 4, &start_clock, 4);
    CUDA_OK(cudaMemcpy(w.d_state, w.state.data(), w.state.size(), cudaMemcpyHostToDevice));
  }
  std::mt19937_64 rng(seed ^ 0x9e3779b97f4a7c15ull);
  StepMaker mk(K, reqs, tpr, rng, int32_t(cfg.max_positions));
  mk.all_active = shape.null_req_of;
  Attention att(f, rope_dim, K, int64_t(reqs) * tpr, rng);
  const int64_t maxT = int64_t(reqs) * tpr;
  int32_t* d_pos = dev_alloc<int32_t>(size_t(maxT) * K);
  int32_t* d_req = dev_alloc<int32_t>(size_t(maxT));
  int32_t* d_lens = dev_alloc<int32_t>(size_t(reqs));
  int32_t* d_phys = dev_alloc<int32_t>(size_t(maxT) * K);
  int32_t* d_counts = dev_alloc<int32_t>(size_t(maxT));
  int32_t* d_rphys = dev_alloc<int32_t>(size_t(maxT) * K);
  int32_t* d_rcounts = dev_alloc<int32_t>(size_t(maxT));
  uint8_t* d_resident = dev_alloc<uint8_t>(size_t(w.pool_rows) * w.cache.row_bytes());
  const char* fmt = to_string(f).data();
  for (int step = 0; step < steps; ++step) {
    const double reuse = std::vector<double>{0.0, 0.5, 0.9, 1.0}[size_t(step % 4)];
    const Step s = shape.script ? shape.script(step) : mk.next(rng, reuse, int32_t(cfg.max_positions));
    if (step == 6 && reqs > 2) {  // request 2's hot buffer starts over (a finished request's slot reused)
      release_tiered_request(w.cache, w.state.data(), w.state.size(), 2);
      cuda::release_tiered_request(w.cache, w.d_state, w.cache.state_bytes(), 2, nullptr);
    }
    if (step == 9 && reqs > 3) {  // every position of requests 0 and 3 below 300 forgotten, with padding between
      std::vector<int32_t> rq, ps;
      for (int32_t x = 0; x < 300; ++x) rq.push_back(x % 2 ? 0 : 3), ps.push_back(x % 7 ? x : -1);
      invalidate_tiered_positions(w.cache, w.state.data(), w.state.size(), rq.data(), ps.data(), int64_t(rq.size()));
      int32_t* d_rq = dev_alloc<int32_t>(rq.size());
      int32_t* d_ps = dev_alloc<int32_t>(ps.size());
      to_dev(d_rq, rq), to_dev(d_ps, ps);
      cuda::invalidate_tiered_positions(w.cache, w.d_state, w.cache.state_bytes(), d_rq, d_ps, int64_t(rq.size()),
                                        nullptr);
      CUDA_EXPECT(cudaDeviceSynchronize());
      cudaFree(d_rq), cudaFree(d_ps);
    }
    write_newest(w, s.lens, rng);
    std::vector<int32_t> counts;
    const std::vector<int32_t> phys = resolve_cpu(w, s, K, counts);
    to_dev(d_pos, s.pos), to_dev(d_req, s.req_of), to_dev(d_lens, s.lens);
    CUDA_EXPECT(cudaMemset(d_phys, 0x7f, size_t(maxT) * K * 4));
    TieredResolveParams p = w.params(true);
    p.num_tokens = s.T(), p.positions = d_pos, p.pos_stride_t = K, p.topk = K;
    p.req_of_token = shape.null_req_of ? nullptr : d_req;
    p.seq_lens = d_lens, p.phys = d_phys, p.phys_stride_t = K, p.counts = d_counts;
    cuda::resolve_tiered(w.cache, p, nullptr);
    CUDA_EXPECT(cudaDeviceSynchronize());
    expect_same_resolution(w, s, d_phys, d_counts, phys, counts, step, fmt);

    // Attention over the hot buffer against the same rows resident in a full device cache.
    if (s.T() == 0) continue;
    CUDA_EXPECT(cudaMemcpy(d_resident, w.pool, size_t(w.pool_rows) * w.cache.row_bytes(), cudaMemcpyHostToDevice));
    IndexConvertParams ic;
    ic.positions = d_pos, ic.pos_stride_t = K, ic.num_tokens = s.T(), ic.topk = K, ic.req_of_token = d_req;
    ic.block_table = w.d_table, ic.bt_stride = w.max_blocks, ic.num_reqs = reqs, ic.max_blocks = w.max_blocks;
    ic.block_size = kBlock, ic.block_stride_rows = kBlock, ic.phys = d_rphys, ic.phys_stride_t = K, ic.counts = d_rcounts;
    // Positions at or past a request's length are invalid for the tiered cache; the resident
    // conversion has no lengths, so drop them from its input the same way.
    std::vector<int32_t> clipped = s.pos;
    for (size_t t = 0; t < s.req_of.size(); ++t)
      for (int j = 0; j < K; ++j) {
        int32_t& q = clipped[t * K + size_t(j)];
        if (q >= s.lens[size_t(s.req_of[t])]) q = -1;
      }
    int32_t* d_clipped = dev_alloc<int32_t>(clipped.size());
    to_dev(d_clipped, clipped);
    ic.positions = d_clipped;
    cuda::convert_indices(ic, nullptr);
    att.poison(s.T());
    att.run(att.params(s.T(), d_resident, w.pool_rows, w.cache.row_bytes(), d_rphys, d_rcounts), nullptr);
    CUDA_EXPECT(cudaDeviceSynchronize());
    const auto out_res = att.out_bytes(s.T());
    const auto lse_res = att.lse(s.T());
    att.poison(s.T());
    att.run(att.params(s.T(), w.d_hot, w.cache.hot_rows(), w.cache.hot_row_stride_bytes(), d_phys, d_counts), nullptr);
    CUDA_EXPECT(cudaDeviceSynchronize());
    EXPECT_EQ(to_host(d_rcounts, size_t(s.T())), counts) << fmt << " step " << step;
    EXPECT_TRUE(att.out_bytes(s.T()) == out_res) << fmt << " step " << step << ": out over the hot buffer is not bit-identical";
    const auto lse_hot = att.lse(s.T());
    EXPECT_EQ(0, std::memcmp(lse_hot.data(), lse_res.data(), lse_res.size() * 4)) << fmt << " step " << step << ": LSE differs";
    cudaFree(d_clipped);
  }
  for (void* q : {static_cast<void*>(d_pos), static_cast<void*>(d_req), static_cast<void*>(d_lens),
                  static_cast<void*>(d_phys), static_cast<void*>(d_counts), static_cast<void*>(d_rphys),
                  static_cast<void*>(d_rcounts), static_cast<void*>(d_resident)})
    cudaFree(q);
}

}  // namespace

TEST(TieredGpu, ResolverAndAttentionMatchEveryFormat) {
  REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  for (KvFormat f : {KvFormat::kBF16, KvFormat::kFP16, KvFormat::kFP8E4M3, KvFormat::kFP8DsMla, KvFormat::kNvFP4DsMla}) {
    SCOPED_TRACE(std::string(to_string(f)));
    run_sequence(f, kRopeDim, 12, seed + uint64_t(f));
  }
  run_sequence(KvFormat::kBF16, 0, 6, seed + 100);  // no-rope MLA (D = 512)
}

// R = 4800 > 512 x 9: the resolver's 16-keys-per-thread sorts (R <= 4608 takes the 9-key ones).
TEST(TieredGpu, LargeHotBufferMatches) {
  REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  run_sequence(KvFormat::kFP8DsMla, kRopeDim, 8, seed + 200, 4800);
}

// Clocks past 2^18 steps: the LRU keys take the resolver's 64-bit sort (below, its 32-bit one); the
// default R (9-key sorts) and R = 4800 (16-key sorts). Step 6 releases request 2 (its clock restarts).
TEST(TieredGpu, LongRunningClockMatches) {
  REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  run_sequence(KvFormat::kFP8DsMla, kRopeDim, 8, seed + 300, 0, (1u << 20) + 5);
  run_sequence(KvFormat::kBF16, kRopeDim, 8, seed + 301, 4800, (1u << 18) - 3);
}

// copy_kernel's rounds: with one (or three) copy blocks per request every request's list of misses
// takes several rounds of loads (rounds after the first start after the resolver's end), and the
// hand-off flags of blocks 1 .. 2 are used; results equal the CPU reference either way.
struct CopyBlocksOverride {
  explicit CopyBlocksOverride(int n) { cuda::set_tiered_copy_blocks_for_testing(n); }
  ~CopyBlocksOverride() { cuda::set_tiered_copy_blocks_for_testing(0); }
};
struct CopyLateOverride {  // the benchmark's --late-copy schedule
  CopyLateOverride() { cuda::set_tiered_copy_late_for_testing(true); }
  ~CopyLateOverride() { cuda::set_tiered_copy_late_for_testing(false); }
};

TEST(TieredGpu, CopyRoundsMatch) {
  REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  {
    CopyBlocksOverride one(1);
    run_sequence(KvFormat::kBF16, kRopeDim, 8, seed + 400);  // up to 200 rows x 72 pieces = 7 rounds of 2048
    run_sequence(KvFormat::kNvFP4DsMla, kRopeDim, 5, seed + 401);
  }
  {
    CopyBlocksOverride three(3);
    run_sequence(KvFormat::kFP8DsMla, kRopeDim, 8, seed + 402);
  }
  {
    CopyLateOverride late;  // no host load before the resolver's end: the same results
    run_sequence(KvFormat::kFP8DsMla, kRopeDim, 4, seed + 404);
  }
  run_sequence(KvFormat::kFP8DsMla, kRopeDim, 4, seed + 403);  // the launcher's choice again
}

// #21's small-miss case: one request, K = 2048 (R = 4224), steps cycling 0 / 50 / 90 / 100 % reuse
// (up to ~2000 misses per step, evictions from the second step on, invalid entries, idle steps
// and empty rows from the step maker), then 40 requests of K = 512 (the copy grid capped by the SM count).
TEST(TieredGpu, FullTopkStepsMatch) {
  REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Shape one;
  one.K = 2048, one.reqs = 1, one.tpr = 1, one.max_positions = 16384;
  run_sequence(KvFormat::kFP8DsMla, kRopeDim, 9, seed + 500, 0, 0, one);
  run_sequence(KvFormat::kBF16, kRopeDim, 5, seed + 501, 0, 0, one);
  Shape many;
  many.K = 512, many.reqs = 40, many.tpr = 1, many.max_positions = 2048;
  run_sequence(KvFormat::kFP8DsMla, kRopeDim, 6, seed + 502, 0, 0, many);
}

// The copy blocks' own reads (early mode, resolve.cu's copy_early): one token per request, through
// a request map and with req_of_token null, K = 2048 for one request (82 / 128 copy blocks of ~25 /
// 16 entries) and K = 512 for 40 requests (the grid capped: 6 blocks of 86 entries each); steps
// cycling 0 / 50 / 90 / 100 % reuse. Each shape runs with the mode off, on (blocks read their
// entries before any victim is chosen, the usual case) and on with every block late (it copies all
// of its old entries after the resolver's end): the same state, hot buffer, ids and attention bits.
struct EarlyReadOverride {
  explicit EarlyReadOverride(int mode) { cuda::set_tiered_early_read_for_testing(mode); }
  ~EarlyReadOverride() { cuda::set_tiered_early_read_for_testing(0); }
};

TEST(TieredGpu, EarlyReadMatches) {
  REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Shape one;
  one.K = 2048, one.reqs = 1, one.tpr = 1, one.max_positions = 16384;
  Shape one_null = one;
  one_null.null_req_of = true;
  Shape many;
  many.K = 512, many.reqs = 40, many.tpr = 1, many.max_positions = 2048;
  Shape many_null = many;
  many_null.null_req_of = true;
  for (int mode : {1, 2, 3}) {
    SCOPED_TRACE("early-read mode " + std::to_string(mode));
    EarlyReadOverride o(mode);
    run_sequence(KvFormat::kFP8DsMla, kRopeDim, 8, seed + 600 + uint64_t(mode), 0, 0, one);
    run_sequence(KvFormat::kBF16, kRopeDim, 5, seed + 610 + uint64_t(mode), 0, 0, one_null);
    run_sequence(KvFormat::kFP8DsMla, kRopeDim, 6, seed + 620 + uint64_t(mode), 0, 0, many_null);
    run_sequence(KvFormat::kNvFP4DsMla, kRopeDim, 4, seed + 630 + uint64_t(mode), 0, 0, many);
  }
}

// A small early-mode case for compute-sanitizer (racecheck / memcheck): 3 requests, K = 100,
// every mode.
TEST(TieredGpu, EarlyReadSmall) {
  REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Shape small;
  small.K = 100, small.reqs = 3, small.tpr = 1, small.max_positions = 700, small.null_req_of = true;
  for (int mode : {2, 3}) {
    EarlyReadOverride o(mode);
    run_sequence(KvFormat::kFP8DsMla, kRopeDim, 4, seed + 700 + uint64_t(mode), 0, 0, small);
  }
}

// The one-grid step (resolve.cu's onegrid_kernel, s13: one cooperative grid per step, a chooser and
// up to 16 classify-and-copy workers per request), the default for one token per request with
// req_of_token null, R <= 4608 and a grid that fits the device at once. Shapes: one request of
// K = 2048 (16 workers of 128 entries; steps cycling 0 / 50 / 90 / 100 % reuse: up to ~2000 misses,
// the sorts and the counting choice, evictions), 7 requests of K = 2048 (119 blocks, one per SM;
// a release at step 6 and an invalidation at step 9), K = 100 / 129 / 300 (one, two and three
// workers, the last one short), a clock past 2^18 (the chooser's 64-bit sorts), R = K + 1 (every miss
// evicts); the step maker's invalid entries, empty rows and duplicates make the chooser rewrite rows
// (a worker before the last with an invalid entry) and workers wait for positions others claimed.
// Every step equals the CPU reference (map, slot positions, stamps, hand-off words back to 0, ids,
// counts, counters, hot rows) and the attention over the hot buffer is bit-identical to the resident
// cache. The same shapes with the one-grid path off (the two-kernel path) last.
struct OneGridOverride {
  explicit OneGridOverride(int mode) { cuda::set_tiered_one_grid_for_testing(mode); }
  ~OneGridOverride() { cuda::set_tiered_one_grid_for_testing(0); }
};

// Whether a shape's steps take the one-grid step (so that a test of it cannot pass on the other path).
bool one_grid_taken(const Shape& sh, int hot_slots) {
  TieredCacheConfig cfg;
  cfg.format = KvFormat::kFP8DsMla, cfg.topk = sh.K, cfg.max_requests = sh.reqs, cfg.max_tokens_per_request = sh.tpr;
  cfg.hot_slots = hot_slots, cfg.max_positions = sh.max_positions;
  return cuda::tiered_one_grid_taken(TieredCache(cfg), sh.reqs, sh.K, sh.null_req_of);
}

TEST(TieredGpu, OneGridMatches) {
  REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Shape one;
  one.K = 2048, one.reqs = 1, one.tpr = 1, one.max_positions = 16384, one.null_req_of = true;
  Shape seven = one;
  seven.reqs = 7;
  Shape k100;
  k100.K = 100, k100.reqs = 6, k100.tpr = 1, k100.max_positions = 700, k100.null_req_of = true;
  Shape k129 = k100;
  k129.K = 129, k129.reqs = 4;
  Shape k300 = k100;
  k300.K = 300, k300.reqs = 5, k300.max_positions = 2000;
  // K above 2048 (s13b: the chooser places its first 4 x 512 job entries from registers, the rest in a
  // second loop): 16 workers of 188 / 282 entries, R given (the default R would pass 4608).
  Shape k3000 = k100;
  k3000.K = 3000, k3000.reqs = 2, k3000.max_positions = 12000;
  Shape k4500 = k3000;
  k4500.K = 4500, k4500.reqs = 1;
  for (int mode : {0, 1}) {
    SCOPED_TRACE(mode == 0 ? "one grid" : "two kernels");
    OneGridOverride o(mode);
    for (const Shape& sh : {one, seven, k100, k129, k300}) EXPECT_EQ(one_grid_taken(sh, 0), mode == 0) << sh.K;
    EXPECT_EQ(one_grid_taken(one, 2049), mode == 0);
    EXPECT_EQ(one_grid_taken(k100, 101), mode == 0);
    EXPECT_EQ(one_grid_taken(k3000, 4224), mode == 0);
    EXPECT_EQ(one_grid_taken(k4500, 4608), mode == 0);
    {
      Shape many = one;
      many.reqs = 32;  // 32 x 17 blocks do not fit at once: the two-kernel path
      EXPECT_FALSE(one_grid_taken(many, 0));
      Shape mapped = one;
      mapped.null_req_of = false;  // a request map: the two-kernel path
      EXPECT_FALSE(one_grid_taken(mapped, 0));
      EXPECT_FALSE(one_grid_taken(one, 4800));  // R > 4608
    }
    run_sequence(KvFormat::kFP8DsMla, kRopeDim, 12, seed + 1000 + uint64_t(mode), 0, 0, one);
    run_sequence(KvFormat::kBF16, kRopeDim, 8, seed + 1010 + uint64_t(mode), 0, 0, one);
    run_sequence(KvFormat::kFP8DsMla, kRopeDim, 10, seed + 1020 + uint64_t(mode), 0, 0, seven);
    run_sequence(KvFormat::kNvFP4DsMla, kRopeDim, 8, seed + 1030 + uint64_t(mode), 0, 0, k100);
    run_sequence(KvFormat::kFP16, kRopeDim, 6, seed + 1040 + uint64_t(mode), 0, 0, k129);
    run_sequence(KvFormat::kBF16, kRopeDim, 10, seed + 1050 + uint64_t(mode), 0, 0, k300);
    run_sequence(KvFormat::kFP8DsMla, kRopeDim, 6, seed + 1060 + uint64_t(mode), 0, (1u << 20) + 5, one);
    run_sequence(KvFormat::kFP8DsMla, kRopeDim, 8, seed + 1070 + uint64_t(mode), 2049, 0, one);  // R = K + 1
    run_sequence(KvFormat::kFP8E4M3, kRopeDim, 8, seed + 1080 + uint64_t(mode), 101, 0, k100);   // R = K + 1
    run_sequence(KvFormat::kBF16, kRopeDim, 8, seed + 1090 + uint64_t(mode), 4224, 0, k3000);
    run_sequence(KvFormat::kFP8DsMla, kRopeDim, 6, seed + 1095 + uint64_t(mode), 4608, 0, k4500);
  }
}

// Scripted steps of one request, K = 2048, length 16000, through the one-grid step: all 2048 miss;
// the same positions again (every entry a hit, no miss); one position replaced (exactly one miss);
// the newest row with the rest; one valid entry in an empty row (the chooser rewrites the row);
// every entry the same missing position (one claim, sixteen workers waiting for its slot); 2048
// fresh positions (evictions); 90 % of them again with 205 fresh; all of those again (all hit);
// the same with every 97th entry invalid (all hit, rewritten row). With the default R = 4224 and
// with R = K + 1 = 2049 (every miss evicts). Each step against the CPU reference and the resident
// attention, as in run_sequence.
Step scripted_step(int step, int K, int32_t len, std::vector<int32_t>& prev, std::mt19937_64& rng) {
  Step s;
  s.lens = {len};
  s.req_of = {0};
  std::vector<int32_t> pos(static_cast<size_t>(K));
  switch (step) {
    case 0:
    case 1:
      std::iota(pos.begin(), pos.end(), 0);
      std::shuffle(pos.begin(), pos.end(), rng);
      break;
    case 2:
      pos = prev, pos[size_t(rng() % uint64_t(K))] = 5000;
      break;
    case 3:
      std::iota(pos.begin(), pos.end(), 1), pos[size_t(K - 1)] = len - 1;
      std::shuffle(pos.begin(), pos.end(), rng);
      break;
    case 4:
      std::fill(pos.begin(), pos.end(), -1), pos[1500] = 7;
      break;
    case 5:
      std::fill(pos.begin(), pos.end(), 9000);
      break;
    case 6:
      std::iota(pos.begin(), pos.end(), 6000);
      std::shuffle(pos.begin(), pos.end(), rng);
      break;
    case 7: {
      pos = prev;
      std::shuffle(pos.begin(), pos.end(), rng);
      for (int j = 0; j < 205; ++j) pos[size_t(j)] = 10000 + j;
      std::shuffle(pos.begin(), pos.end(), rng);
      break;
    }
    case 8:
      pos = prev;
      std::shuffle(pos.begin(), pos.end(), rng);
      break;
    default:
      pos = prev;
      for (int j = 0; j < K; j += 97) pos[size_t(j)] = -1;
      break;
  }
  prev = pos;
  s.pos = pos;
  return s;
}

TEST(TieredGpu, OneGridScriptedSteps) {
  REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  for (int hot_slots : {0, 2049})
    for (KvFormat f : {KvFormat::kFP8DsMla, KvFormat::kBF16}) {
      SCOPED_TRACE("R " + std::to_string(hot_slots) + " " + std::string(to_string(f)));
      std::mt19937_64 rng(seed + uint64_t(hot_slots) + uint64_t(f));
      std::vector<int32_t> prev;
      Shape sh;
      sh.K = 2048, sh.reqs = 1, sh.tpr = 1, sh.max_positions = 16384, sh.null_req_of = true;
      sh.script = [&](int step) { return scripted_step(step, 2048, 16000, prev, rng); };
      ASSERT_TRUE(one_grid_taken(sh, hot_slots));
      run_sequence(f, kRopeDim, 10, seed + 1100, hot_slots, 0, sh);
    }
}

// A small one-grid case for compute-sanitizer (memcheck): 3 requests, K = 300 (three workers), and
// one request of K = 2048 with the scripted steps above.
TEST(TieredGpu, OneGridSmall) {
  REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Shape small;
  small.K = 300, small.reqs = 3, small.tpr = 1, small.max_positions = 2000, small.null_req_of = true;
  ASSERT_TRUE(one_grid_taken(small, 0));
  run_sequence(KvFormat::kFP8DsMla, kRopeDim, 6, seed + 1200, 0, 0, small);
  std::mt19937_64 rng(seed + 1201);
  std::vector<int32_t> prev;
  Shape sh;
  sh.K = 2048, sh.reqs = 1, sh.tpr = 1, sh.max_positions = 16384, sh.null_req_of = true;
  sh.script = [&](int step) { return scripted_step(step, 2048, 16000, prev, rng); };
  run_sequence(KvFormat::kFP8DsMla, kRopeDim, 10, seed + 1202, 0, 0, sh);
}

// Device-side bad data through the one-grid step (req_of_token null, K = 8: one worker per request):
// a token past num_reqs (refused before launch), a length past max_positions, then a block-table hole: counted,
// rows empty, the others resolved, the hand-off words back to 0 (memcheck covers this test).
TEST(TieredGpu, OneGridBadData) {
  REQUIRE_GPU();
  TieredCacheConfig cfg;
  cfg.format = KvFormat::kBF16, cfg.topk = 8, cfg.max_requests = 2, cfg.max_positions = 256;
  Tiered w(cfg, fresh_seed());
  const int K = 8;
  ASSERT_TRUE(cuda::tiered_one_grid_taken(w.cache, 2, K, true));
  std::vector<int32_t> pos(3 * K);
  for (int i = 0; i < 3 * K; ++i) pos[size_t(i)] = i * 3;
  int32_t* d_pos = dev_alloc<int32_t>(pos.size());
  int32_t* d_lens = dev_alloc<int32_t>(2);
  int32_t* d_phys = dev_alloc<int32_t>(pos.size());
  int32_t* d_counts = dev_alloc<int32_t>(3);
  to_dev(d_pos, pos);
  TieredResolveParams p = w.params(true);
  p.num_tokens = 3, p.positions = d_pos, p.pos_stride_t = K, p.topk = K, p.req_of_token = nullptr;
  p.seq_lens = d_lens, p.phys = d_phys, p.phys_stride_t = K, p.counts = d_counts;
  to_dev(d_lens, std::vector<int32_t>{300, 120});  // request 0: 300 > max_positions
  CUDA_OK(cudaMemset(d_phys, 0x11, pos.size() * 4));
  CUDA_OK(cudaMemset(d_counts, 0x11, 3 * 4));
  // A third token with req_of_token null would be request 2 of a 2-request cache: refused before launch.
  EXPECT_THROW(cuda::resolve_tiered(w.cache, p, nullptr), std::exception);
  p.num_tokens = 2;
  cuda::resolve_tiered(w.cache, p, nullptr);
  CUDA_OK(cudaDeviceSynchronize());
  TieredCounters c = cuda::read_tiered_counters(w.cache, w.d_state, nullptr);
  EXPECT_EQ(c.errors, 1u);  // token 0's request length
  EXPECT_EQ(c.misses, 8u);  // token 1: positions 24 .. 45, all fresh
  EXPECT_EQ(c.clock, 1u);
  const auto counts = to_host(d_counts, 3);
  EXPECT_EQ(counts[0], 0);
  EXPECT_EQ(counts[1], 8);
  const auto phys = to_host(d_phys, pos.size());
  for (int j = 0; j < K; ++j) {
    EXPECT_EQ(phys[size_t(j)], -1) << j;
    EXPECT_GE(phys[size_t(K + j)], w.cache.hot_slots()) << j;  // request 1's rows
    EXPECT_LT(phys[size_t(K + j)], 2 * w.cache.hot_slots() - 1) << j;
  }
  // Request 0 with a good length, its first block missing from the table: positions 0 .. 21 have no
  // pool row (8 errors, an empty row: the chooser rewrites nothing, the one worker is the last).
  std::vector<int32_t> holes = w.table;
  holes[0] = -1;
  to_dev(w.d_table, holes);
  to_dev(d_lens, std::vector<int32_t>{100, 120});
  p.num_tokens = 2;
  cuda::resolve_tiered(w.cache, p, nullptr);
  CUDA_OK(cudaDeviceSynchronize());
  c = cuda::read_tiered_counters(w.cache, w.d_state, nullptr);
  EXPECT_EQ(c.errors, 1u + 8u);
  EXPECT_EQ(to_host(d_counts, 2), (std::vector<int32_t>{0, 8}));
  EXPECT_EQ(c.misses, 8u);  // token 1's rows are hot now
  const auto st = to_host(w.d_state, w.cache.state_bytes());
  const auto& L = w.cache.state_layout();
  for (size_t o = L.copy_flags; o < L.zero_end; ++o) ASSERT_EQ(st[o], 0) << "hand-off word byte " << o - L.copy_flags;
  for (void* q : {static_cast<void*>(d_pos), static_cast<void*>(d_lens), static_cast<void*>(d_phys),
                  static_cast<void*>(d_counts)})
    cudaFree(q);
}

// Resolve + attention captured once; the graph replays over new positions and lengths each step.
TEST(TieredGpu, GraphReplayAcrossSteps) {
  REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const int K = 2048, reqs = 4;  // default R = 4224
  TieredCacheConfig cfg;
  cfg.format = KvFormat::kFP8DsMla, cfg.topk = K, cfg.max_requests = reqs, cfg.max_positions = 20000;
  Tiered w(cfg, seed);
  EXPECT_TRUE(cuda::tiered_one_grid_taken(w.cache, reqs, K, true)) << "the graph captures the one-grid launch";
  std::mt19937_64 rng(seed + 1);
  StepMaker mk(K, reqs, 1, rng, int32_t(cfg.max_positions));
  Attention att(cfg.format, kRopeDim, K, reqs, rng);
  int32_t* d_pos = dev_alloc<int32_t>(size_t(reqs) * K);
  int32_t* d_lens = dev_alloc<int32_t>(size_t(reqs));
  int32_t* d_phys = dev_alloc<int32_t>(size_t(reqs) * K);
  int32_t* d_counts = dev_alloc<int32_t>(size_t(reqs));
  cudaStream_t st;
  CUDA_OK(cudaStreamCreate(&st));
  // Every request has exactly one token (req_of_token null: token t -> request t).
  auto make_step = [&](double reuse) {
    Step s;
    do s = mk.next(rng, reuse, int32_t(cfg.max_positions));
    while (s.T() != reqs);
    return s;
  };
  TieredResolveParams p = w.params(true);
  p.num_tokens = reqs, p.positions = d_pos, p.pos_stride_t = K, p.topk = K;
  p.seq_lens = d_lens, p.phys = d_phys, p.phys_stride_t = K, p.counts = d_counts;
  const SparseMlaParams ap = att.params(reqs, w.d_hot, w.cache.hot_rows(), w.cache.hot_row_stride_bytes(), d_phys, d_counts);
  // Every kernel runs once before the capture (lazy module loading stays out of it): an empty
  // step on both sides (the clocks move together) and attention over empty rows.
  CUDA_OK(cudaMemset(d_phys, 0xff, size_t(reqs) * K * 4));
  CUDA_OK(cudaMemset(d_counts, 0, size_t(reqs) * 4));
  CUDA_OK(cudaMemset(d_lens, 0, size_t(reqs) * 4));
  att.run(ap, st);
  {
    TieredResolveParams p0 = p;
    p0.num_tokens = 0;
    cuda::resolve_tiered(w.cache, p0, st);
    std::vector<int32_t> none_counts;
    resolve_cpu(w, Step{}, K, none_counts);
    CUDA_OK(cudaStreamSynchronize(st));
  }
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CUDA_OK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
  cuda::resolve_tiered(w.cache, p, st);
  att.run(ap, st);
  CUDA_OK(cudaStreamEndCapture(st, &graph));
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  for (int step = 0; step < 8; ++step) {
    Step s = make_step(std::vector<double>{0.0, 0.5, 0.9, 1.0}[size_t(step % 4)]);
    s.req_of.clear();
    for (int r = 0; r < reqs; ++r) s.req_of.push_back(r);
    write_newest(w, s.lens, rng);
    std::vector<int32_t> counts;
    const auto phys = resolve_cpu(w, s, K, counts);
    to_dev(d_pos, s.pos), to_dev(d_lens, s.lens);
    att.poison(reqs);
    CUDA_OK(cudaGraphLaunch(exec, st));
    CUDA_OK(cudaStreamSynchronize(st));
    expect_same_resolution(w, s, d_phys, d_counts, phys, counts, step, "graph");
    const auto out_graph = att.out_bytes(reqs);
    const auto lse_graph = att.lse(reqs);
    // The same attention, eager, over the (now resolved) hot buffer.
    att.poison(reqs);
    att.run(ap, st);
    CUDA_OK(cudaStreamSynchronize(st));
    EXPECT_TRUE(att.out_bytes(reqs) == out_graph) << "step " << step;
    EXPECT_EQ(0, std::memcmp(att.lse(reqs).data(), lse_graph.data(), lse_graph.size() * 4)) << "step " << step;
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(st);
  for (void* q : {static_cast<void*>(d_pos), static_cast<void*>(d_lens), static_cast<void*>(d_phys),
                  static_cast<void*>(d_counts)})
    cudaFree(q);
}

TEST(TieredGpu, BadInput) {
  REQUIRE_GPU();
  TieredCacheConfig cfg;
  cfg.format = KvFormat::kBF16, cfg.topk = 8, cfg.max_requests = 2, cfg.max_positions = 256;
  Tiered w(cfg, fresh_seed());
  const int K = 8;
  std::vector<int32_t> pos(2 * K), lens{100, 120}, req{0, 1};
  for (int i = 0; i < 2 * K; ++i) pos[size_t(i)] = i * 5;
  int32_t* d_pos = dev_alloc<int32_t>(pos.size());
  int32_t* d_lens = dev_alloc<int32_t>(2);
  int32_t* d_req = dev_alloc<int32_t>(2);
  int32_t* d_phys = dev_alloc<int32_t>(pos.size());
  int32_t* d_counts = dev_alloc<int32_t>(2);
  to_dev(d_pos, pos), to_dev(d_lens, lens), to_dev(d_req, req);
  auto base = [&] {
    TieredResolveParams p = w.params(true);
    p.num_tokens = 2, p.positions = d_pos, p.pos_stride_t = K, p.topk = K, p.req_of_token = d_req;
    p.seq_lens = d_lens, p.phys = d_phys, p.phys_stride_t = K, p.counts = d_counts;
    return p;
  };
  auto expect_error = [&](TieredResolveParams p, const char* needle) {
    try {
      cuda::resolve_tiered(w.cache, p, nullptr);
      ADD_FAILURE() << "expected an error containing '" << needle << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  std::vector<uint8_t> pageable(size_t(w.pool_rows) * w.cache.row_bytes());
  {
    auto p = base();
    p.pool = pageable.data();
    expect_error(p, "not pinned");
  }
  {
    auto p = base();
    p.hot_bytes -= 16;
    expect_error(p, "hot buffer too small");
  }
  {
    auto p = base();
    p.num_reqs = 3;
    expect_error(p, "larger max_requests");
  }
  {
    TieredCacheConfig big = cfg;
    big.topk = 4096, big.max_tokens_per_request = 2;  // R = 8320 > 8192
    big.hot_slots = 8320;
    const TieredCache tc(big);
    auto p = base();
    p.hot_bytes = tc.hot_buffer_bytes(), p.state_bytes = tc.state_bytes(), p.workspace_bytes = tc.workspace_bytes();
    try {
      cuda::resolve_tiered(tc, p, nullptr);
      ADD_FAILURE() << "R = 8320 must be refused by the CUDA resolver";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("8192"), std::string::npos) << e.what();
    }
  }
  CUDA_OK(cudaDeviceSynchronize());
  TieredCounters c = cuda::read_tiered_counters(w.cache, w.d_state, nullptr);
  EXPECT_EQ(c.clock, 0u) << "a refused call launched something";
  // Device-side bad data: a request id without a hot buffer, a length past max_positions, and a
  // position whose block-table entry is negative: counted, rows empty, nothing read or written out
  // of bounds (compute-sanitizer memcheck covers this test).
  std::vector<int32_t> bad_req{0, 7}, bad_lens{300, 120};
  to_dev(d_req, bad_req), to_dev(d_lens, bad_lens);
  CUDA_OK(cudaMemset(d_phys, 0x11, pos.size() * 4));
  cuda::resolve_tiered(w.cache, base(), nullptr);
  CUDA_OK(cudaDeviceSynchronize());
  c = cuda::read_tiered_counters(w.cache, w.d_state, nullptr);
  EXPECT_EQ(c.errors, 2u);  // token 0 (length 300 > 256) and token 1 (request 7)
  EXPECT_EQ(c.misses, 0u);
  EXPECT_EQ(c.clock, 1u);
  EXPECT_EQ(to_host(d_counts, 2), (std::vector<int32_t>{0, 0}));
  EXPECT_EQ(to_host(d_phys, pos.size()), std::vector<int32_t>(pos.size(), -1));
  std::vector<int32_t> holes = w.table;
  holes[0] = -1;  // request 0's positions 0..63 have no pool row
  to_dev(w.d_table, holes);
  to_dev(d_req, req), to_dev(d_lens, lens);
  cuda::resolve_tiered(w.cache, base(), nullptr);
  CUDA_OK(cudaDeviceSynchronize());
  c = cuda::read_tiered_counters(w.cache, w.d_state, nullptr);
  // Token 0 (request 0) asks for positions 0, 5, ..., 35: all in the missing block, 8 errors, an
  // empty row. Token 1 (request 1) is untouched: 40, ..., 75, all valid. The counter adds up: the
  // first call's 2 (checked above) plus these 8 (the CPU reference's count of the same sequence:
  // Tiered.GpuBadInputSequenceErrorCount).
  EXPECT_EQ(c.errors, 2u + 8u);
  EXPECT_EQ(to_host(d_counts, 2), (std::vector<int32_t>{0, 8}));
  EXPECT_EQ(c.misses, 8u);
  for (void* q : {static_cast<void*>(d_pos), static_cast<void*>(d_lens), static_cast<void*>(d_req),
                  static_cast<void*>(d_phys), static_cast<void*>(d_counts)})
    cudaFree(q);
}
