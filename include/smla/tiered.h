// smla/tiered.h — HiSparse, the host-backed tiered KV cache (DESIGN.md §4b).
//
// A request's rows live in a HOST POOL (pinned host memory, any row format, addressed per request
// by a block table like the device cache). The device holds, per request, a HOT BUFFER of R slots
// (one row each; slot R - 1 is reserved for the request's newest token, which the cache writer
// puts there), a position -> slot map and LRU stamps. Each decode step the RESOLVER maps every
// token's request-local top-k positions to hot slots, copying the missing rows from the host pool,
// and writes physical hot-buffer row ids (request r's slot s is row r * R + s) with counts, ready
// for Plan::run over the hot buffer.
//
// The LRU rule (the CPU reference below is its definition; the CUDA resolver equals it exactly):
//   Each request keeps its own clock (the stamp word of its reserved slot R - 1, which no LRU
//   choice reads). For every request with tokens this step, now = its clock + 1, and the NEEDED
//   positions are the valid
//   entries (0 <= pos < length, pos != length - 1) of all its tokens' rows, duplicates once. The
//   newest position (length - 1) is always slot R - 1. A needed position mapped to a slot is a hit
//   (its stamp becomes now). The misses, in ascending position order, take the slots among
//   0 .. R - 2 whose stamp is not now (no token of this step needs them), in ascending
//   (stamp, slot) order: least recently used first, ties by lowest slot, never-used slots
//   (stamp 0) first of all. The victim's old position is unmapped, the row is copied from the
//   host pool, map and stamp are set. Then the request's clock = now.
//   Output: entry (t, j) with a valid position -> row req * R + slot, compacted to the front of
//   the row in entry order, -1 after, counts[t] = valid entries (the index conversion's
//   convention, smla/index.h). Invalid positions (< 0 or >= the request's length) stay invalid.
//   Counters: hits = distinct (request, position) found in the hot buffer (the newest slot
//   included), misses = rows copied, bytes = misses * row bytes.
//
// Plan-time rule: a step's distinct positions of one request must fit the R - 1 free slots, so
// max_tokens_per_request * K + 1 <= R; a TieredCache that breaks it is refused.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

#include "smla/types.h"

namespace smla {

struct TieredCacheConfig {
  KvFormat format = KvFormat::kFP8DsMla;
  int rope_dim = kRopeDim;           // 64 or 0
  int topk = 2048;                   // K, top-k capacity of a token's row
  int hot_slots = 0;                 // R per request; 0: the default round_up(2K + 1, 128)
  int max_requests = 1;              // hot buffers: request ids 0 .. max_requests - 1
  int max_tokens_per_request = 1;    // query tokens of one request in one step (speculative decode: > 1)
  int64_t max_positions = 131072;    // longest request (tokens); sizes the position -> slot map
  int64_t hot_row_stride_bytes = 0;  // 0: row_bytes(format, rope_dim); a multiple of 16 otherwise
};

// The default hot-buffer size for top-k K: round_up(2K + 1, 128). Example: K = 2048 -> 4224.
int default_hot_slots(int topk);

// Hand-off words per request in the state (the most copy blocks the CUDA resolver gives one request).
inline constexpr int kTieredCopyFlags = 128;

// Device counters of a tiered cache (the first bytes of its state). Read them whenever you like
// (a device-to-host copy of this struct); reset_tiered_state zeroes them.
struct TieredCounters {
  uint64_t hits = 0;     // distinct (request, position) per step found in the hot buffer
  uint64_t misses = 0;   // rows copied from the host pool
  uint64_t bytes = 0;    // bytes copied from the host pool
  uint64_t errors = 0;   // CUDA resolver only: entries or tokens dropped for bad device-side input
                         // (a request id without a hot buffer, a length past max_positions, more
                         // tokens of one request than planned, a missing position with no
                         // host-pool row);
                         // the CPU reference throws instead. 0 on good input.
  uint32_t clock = 0;    // steps resolved (each request's LRU clock lives with its stamps)
  uint32_t reserved[3] = {0, 0, 0};
};
static_assert(sizeof(TieredCounters) == 48);

// Byte offsets of the parts of a tiered cache's device state (one caller-owned allocation of
// state_bytes(), 256-byte aligned parts). The parts that start zeroed come first, the parts that
// start at -1 (all bytes 0xFF) after, so a reset is two memsets.
struct TieredStateLayout {
  size_t counters = 0;  // TieredCounters
  size_t stamps = 0;    // [max_requests, R] uint32 LRU stamps (0: never used); slot R - 1's: the request's clock
  size_t copy_flags = 0;  // [max_requests, kTieredCopyFlags] uint32: the CUDA resolver's hand-off words to its
                          // copy blocks (a step's miss count + 1 while in flight; 0 between steps)
  size_t zero_end = 0;  // [0, zero_end) starts 0
  size_t slot_pos = 0;  // [max_requests, R] int32 position held by each slot (-1: none)
  size_t pos_slot = 0;  // [max_requests, max_positions] int32 slot of each position (-1: not hot)
  size_t total = 0;     // state_bytes(); [zero_end, total) starts -1
};

// One resolver step. Pointers are device pointers for the CUDA resolver (the host pool: a pinned
// host pointer, which the launcher translates), host pointers for the CPU reference.
struct TieredResolveParams {
  int64_t num_tokens = 0;                 // T query tokens of this step
  const int32_t* positions = nullptr;     // [T, K] request-local top-k positions, -1 padded, row stride pos_stride_t
  int64_t pos_stride_t = 0;
  int topk = 0;                           // K of this call (<= the cache's topk)
  const int32_t* req_of_token = nullptr;  // nullable [T] request of each token (null: token t -> request t)
  int num_reqs = 0;                       // requests of this step: ids [0, num_reqs), num_reqs <= max_requests
  const int32_t* seq_lens = nullptr;      // [num_reqs] tokens of each request, the newest (length - 1) in slot R - 1

  // ---- host pool: row r at pool + r * pool_row_stride_bytes, addressed per request by a block table
  const void* pool = nullptr;
  int64_t pool_rows = 0;
  int64_t pool_row_stride_bytes = 0;      // >= row bytes, a multiple of 16
  const int32_t* block_table = nullptr;   // [num_reqs, max_blocks] int32, row stride bt_stride
  int64_t bt_stride = 0;
  int max_blocks = 0;
  int block_size = 1;
  int64_t block_stride_rows = 1;

  // ---- device state (sizes from the TieredCache)
  void* hot = nullptr;                    // [max_requests * R rows] hot buffer, hot_buffer_bytes()
  size_t hot_bytes = 0;
  void* state = nullptr;                  // state_bytes(), reset once with reset_tiered_state
  size_t state_bytes = 0;
  void* workspace = nullptr;              // workspace_bytes() (CUDA resolver; unused by the CPU reference)
  size_t workspace_bytes = 0;

  // ---- out
  int32_t* phys = nullptr;                // [T, K] hot-buffer rows, compacted, -1 after; row stride phys_stride_t
  int64_t phys_stride_t = 0;
  int32_t* counts = nullptr;              // nullable [T] valid entries per token
};

// The plan of a tiered cache: geometry, the plan-time rule, and every device size. Immutable.
class TieredCache {
 public:
  explicit TieredCache(const TieredCacheConfig& cfg);  // throws Error naming what to change

  const TieredCacheConfig& config() const { return cfg_; }
  int hot_slots() const { return cfg_.hot_slots; }  // R (the default resolved)
  int row_bytes() const { return row_bytes_; }
  int64_t hot_row_stride_bytes() const { return cfg_.hot_row_stride_bytes; }
  int64_t hot_rows() const { return int64_t(cfg_.max_requests) * cfg_.hot_slots; }  // num_rows for Plan::run
  // Physical hot-buffer row of request req's slot s: req * R + s.
  int32_t hot_row(int req, int slot) const { return int32_t(int64_t(req) * cfg_.hot_slots + slot); }
  // Where the cache writer puts request req's newest token: slot R - 1.
  int32_t newest_hot_row(int req) const { return hot_row(req, cfg_.hot_slots - 1); }

  size_t hot_buffer_bytes() const { return size_t(hot_rows()) * size_t(cfg_.hot_row_stride_bytes); }
  const TieredStateLayout& state_layout() const { return layout_; }
  size_t state_bytes() const { return layout_.total; }
  // Resolver scratch per step: the CUDA resolver's copy list, align256(max_requests * 4) +
  // max_requests * R * 8 bytes (a miss count per request, then R (pool row, position) pairs each).
  size_t workspace_bytes() const { return workspace_bytes_; }
  // Everything on the device: hot buffer + state + workspace.
  size_t device_bytes() const { return hot_buffer_bytes() + state_bytes() + workspace_bytes(); }

  // Checks one step's host-visible arguments against the plan (sizes, pointers, buffer sizes);
  // throws Error before anything runs.
  void check(const TieredResolveParams& p) const;

 private:
  TieredCacheConfig cfg_;
  int row_bytes_ = 0;
  TieredStateLayout layout_;
  size_t workspace_bytes_ = 0;
};

// Host state init (the CPU reference's state; the CUDA one: cuda::reset_tiered_state): counters
// and stamps 0, maps -1.
void reset_tiered_state(const TieredCache& cache, void* state, size_t state_bytes);
// Forgets request req's hot rows (a finished request whose hot buffer is reused, or a request whose
// positions were rewritten): its map -1, its slots empty, its stamps 0. Host state.
void release_tiered_request(const TieredCache& cache, void* state, size_t state_bytes, int req);

// Forgets the hot rows of single positions: entry i names request req[i] and position pos[i]
// (either negative: skipped). Call it when positions are rewritten in the host pool (rejected
// speculative tokens overwritten by the next ones): the hot buffer does not see the pool change.
// Each named position that is hot loses its slot (map -1, the slot empty with stamp 0, so it is
// the first victim next). Host state; throws Error for a request id >= max_requests or a position
// >= max_positions. Example: req {0, 0}, pos {41, 42} after request 0 rolled back to length 41.
void invalidate_tiered_positions(const TieredCache& cache, void* state, size_t state_bytes, const int32_t* req,
                                 const int32_t* pos, int64_t n);

// The CPU reference resolver (host pointers; the host pool may be any host memory). Validates,
// throws Error on bad input (a request id >= num_reqs, a length past max_positions, more tokens of
// one request than planned, a position to copy (valid, not hot) with no host-pool row), then
// resolves one step.
void resolve_tiered_reference(const TieredCache& cache, const TieredResolveParams& p);

// The seed's autotune_hisparse_decode as a pure function: the largest decode batch B (requests, one
// hot buffer each, cfg.max_tokens_per_request tokens each) whose tiered device bytes plus the
// attention workspace for B * max_tokens_per_request rows fit budget_bytes; 0 when not even one
// request fits. cfg.max_requests is ignored. attention_workspace may be empty (counted as 0).
// Example: fp8_ds_mla, K = 2048 (R = 4224), max_positions = 131072, no attention workspace: each
// request costs 4224 * 656 B hot + 4224 * 8 B stamps/slots + 131072 * 4 B map + 128 * 4 B hand-off
// flags + 4224 * 8 B copy list ~= 3.36 MB, so a 1 GiB budget gives B = 319.
int64_t max_tiered_decode_batch(TieredCacheConfig cfg, size_t budget_bytes,
                                const std::function<size_t(int64_t rows)>& attention_workspace = {});

}  // namespace smla
