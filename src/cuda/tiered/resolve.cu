// The HiSparse resolver (smla/tiered.h states the rule; resolve_tiered_reference is its
// definition). Two launches of a fixed shape per step (for a given num_reqs and topk; one for the
// one-grid step below), no host synchronization, so a step can be captured in a CUDA graph. In the
// two-kernel path the one cross-block signal is a flag from each resolve block to its request's copy
// blocks (below), which never waits the other way.
// resolve_kernel_9 / _16 run one 512-thread block per request:
//
//   0. read the request's clock (the stamp word of its slot R - 1), its length and (one token per
//      request) its first pass of positions, then collect its tokens;
//   1. stamp the hits (a thread's kIlp exchanges in flight together) and claim each missing
//      position once (atomicCAS -1 -> -2 on the position -> slot map); counts are summed per warp.
//      Each claimed miss goes to the copy list (pool row, position) at once; the list is then
//      handed to the copy blocks (below);
//   2. sort the misses by position and the candidate slots by (stamp, slot) with two block-wide
//      radix sorts (9 keys per thread for R <= 4608, 16 up to R = 8192; the slot keys are 32-bit
//      while the clock is below 2^18), pair them rank by rank, update map, slot positions and
//      stamps. A request with at most kSmallMisses misses and 32-bit keys does it without sorts
//      (assign_slots_small: ranks by counting, the stamp of the n-th smallest key by a binary
//      search over the candidates' stamp range, the slots at that stamp by a block scan);
//   3. write the physical hot rows of every token (compacted in entry order by a block scan) and
//      its count, advance the request's clock and add its counters (fire-and-forget atomics).
//
// The hand-off (s10): right after phase 1 each resolve block has written its request's claimed
// misses, in claim order, as (pool row, position) to the workspace's job list; it then raises one
// state flag per copy block of its request (the miss count + 1). copy_kernel (a programmatic
// dependent launch: its blocks become resident while resolve_kernel runs) spins on its own flag,
// clears it, loads its first round of rows from pinned host memory into registers, and only then
// waits for the resolver's end (griddepcontrol.wait): each row's slot is its position's entry in
// the final map. The host reads thus run under phases 2 and 3 instead of after them. Blocks per
// request: enough for about 4 pieces of 16 bytes per thread when a request misses everything, at
// most kTieredCopyFlags, about 2 x #SMs blocks in all; up to kCopyRoundUnroll loads in flight per
// thread per round.
//
// Early mode (s11; one token per request and a request's copy
// blocks covering its K entries at one per thread): the copy blocks do not wait for a job list.
// Each reads its own share of the token's entries (positions, map, block table) at its start and
// issues the host reads of the misses it sees before the resolver has claimed anything; the
// resolver writes no job list and raises the flags just before its first victim map write, which
// tells a block whether its map reads came before every placement (copy_early).
//
// A step that hits everything is one pass over the entries with no sort. When a request has one
// token of K <= kThreads * kIlp entries, its rows are written from the registers of that pass (no
// second read of the positions; with misses, only the missed entries' map words are read again);
// in an all-hit step copy_kernel's blocks read a zero count from their flag (before the resolver
// ends) and exit at its end.
//
// One-grid step (s13, onegrid_kernel below; the default where the call allows it: one token per
// request with req_of_token null, R <= 4608, and num_reqs x (1 + G) blocks resident at once, so
// B <= 7 at K = 2048 on an H200): one cooperative launch instead of the two above. Per request, G
// worker blocks (one per 128 entries, at most 16) classify their share of the entries, write the
// hits' ids, arrive and start the misses' host reads; one chooser block waits for their arrival and
// runs the same victim choice (assign_slots); the workers then store their rows. Same results.
//
// `smla bench --hisparse --phases` (set_tiered_phase_buffer_for_testing): %globaltimer stamps of
// the resolver's phases and the copy blocks' events, off (a null pointer test) otherwise.
//
// Device-side bad input (request ids, lengths, positions with no pool row) never reaches memory:
// it is counted in TieredCounters::errors and those tokens/entries come out empty.
#include <cub/block/block_radix_sort.cuh>
#include <cub/block/block_scan.cuh>
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <string>
#include <type_traits>

#include "../common/ptx.cuh"
#include "../serving/check.cuh"
#include "../serving/writer_mirror.h"
#include "gather.h"
#include "smla/cuda_tiered.h"
#include "onegrid.h"
#include "victims.h"
#include "smla/formats.h"

namespace smla::cuda {
namespace {

constexpr int kThreads = 512;
// Sort keys per thread: 9 when R <= 4608 (K = 2048's default R = 4224 sorts 4608 keys, not
// 8192), 16 up to the limit R = 8192. The kernel is instantiated for both.
constexpr int kItemsSmall = 9, kItemsLarge = 16;
static_assert(kThreads * kItemsLarge == kTieredMaxHotSlots);
constexpr int kSlotBits = tiered::kSlotBits;  // slot < 8192
// A request's step with at most this many misses (and 32-bit LRU keys) picks its victims without
// the two block sorts (assign_slots_small); more take the sorts.
constexpr int kSmallMisses = tiered::kSmallMisses;
static_assert(kSmallMisses + kTieredCopyFlags <= kThreads, "publish_before_assign's threads are not ranking threads");
constexpr int kIlp = 4;        // top-k entries per thread per pass (loads in flight)
constexpr int kCopyUnroll = 16;  // 16-byte host loads in flight per thread: 64 KB per 256-thread block
// copy_kernel: 16-byte host loads in flight per thread per round (8: 64 registers, 4 blocks per
// SM and one beside a resolve block, so its grid is resident in one wave beside the resolver), and
// at most about kCopyBlocksPerSm blocks per SM in all (2 x 132 blocks x 256 threads x 8 x 16 B =
// 8.7 MB in flight per round, far above what the ~55 GB/s link needs to stay busy).
constexpr int kCopyRoundUnroll = 8;
constexpr int kCopyBlocksPerSm = 2;
int copy_blocks_override = 0;        // set_tiered_copy_blocks_for_testing (0: the launcher's choice)
int one_grid_mode = 0;               // set_tiered_one_grid_for_testing (0: where the shape allows it, 1: never)
bool copy_late = false;              // set_tiered_copy_late_for_testing: the first loads wait for the resolver's end
int early_read_mode = 0;             // set_tiered_early_read_for_testing (0: the launcher's choice)
uint64_t* phase_buffer = nullptr;    // set_tiered_phase_buffer_for_testing

// One missing row to copy: its host-pool row and its position (the slot it lands in is the final
// position -> slot map's entry, which copy_kernel reads after the resolver's end).
struct CopyJob {
  int32_t src_row;
  int32_t pos;
};

struct ResolveParams {
  const int32_t* positions;  // [T, K], row stride pos_stride_t
  int64_t pos_stride_t;
  int64_t num_tokens;
  int topk;
  const int32_t* req_of_token;  // nullable [T]
  int num_reqs;
  const int32_t* seq_lens;      // [num_reqs]
  int64_t pool_rows;
  const int32_t* block_table;   // [num_reqs, max_blocks], row stride bt_stride
  int64_t bt_stride;
  int max_blocks, block_size;
  int64_t block_stride_rows;
  int R;                        // hot slots per request
  int max_tokens_per_request;
  int64_t max_positions;
  int row_bytes;
  TieredCounters* ctr;
  uint32_t* stamps;             // [max_requests, R]; slot R - 1's word is the request's clock
  int32_t* slot_pos;            // [max_requests, R]
  int32_t* pos_slot;            // [max_requests, max_positions]
  const uint8_t* pool;          // device-visible pointer of the pinned host pool, row stride pool_stride
  int64_t pool_stride;
  uint8_t* hot;                 // [max_requests * R rows], row stride hot_stride
  int64_t hot_stride;
  int32_t* phys;                // [T, K], row stride phys_stride_t
  int64_t phys_stride_t;
  int32_t* counts;              // nullable [T]
  int32_t* miss_count;          // workspace: [max_requests] rows to copy per request
  CopyJob* jobs;                // workspace: [max_requests, R] the rows to copy, in claim order
  uint32_t* copy_flags;         // state: [max_requests, kTieredCopyFlags] hand-off words, 0 between steps
  int copy_blocks_per_req;      // copy_kernel's blocks per request (<= kTieredCopyFlags): the flags raised
  uint64_t* phase;              // benchmark only, nullable: %globaltimer stamps (kPhase*), see phase_stamp
  int early;                    // 1: the copy blocks read their own entries (copy_early); no job list is
                                // written and a step with misses raises the flags right before its first
                                // map write of a victim assignment (publish_before_assign)
};

using Scan = cub::BlockScan<int, kThreads>;

template <int kItems_>
struct ResolveSmem {
  static constexpr int kItems = kItems_, kKeys = kThreads * kItems_;
  using SortPos = cub::BlockRadixSort<uint32_t, kThreads, kItems>;
  using SortSlot = cub::BlockRadixSort<uint64_t, kThreads, kItems>;
  union {
    alignas(16) int32_t miss[kKeys];      // missing positions, in claim order (phase 1); rank_of reads it 4 at a time
    typename SortPos::TempStorage sort_pos;
    typename SortSlot::TempStorage sort_slot;
    typename Scan::TempStorage scan;
  };
  int32_t sorted_miss[kKeys];                  // the misses by position (phase 2; frees registers)
  int32_t tokens[kTieredMaxTokensPerRequest];  // this request's tokens (any order)
  int num_tokens;
  int num_miss;
  int newest_used;
  int bad;            // the request is dropped: bad length or too many tokens
  // 32-bit: a shared 64-bit atomicAdd is a compare-and-swap loop (ATOMS.CAST.SPIN), which 512
  // threads contending on one word serialize for many microseconds; a step's counts fit 32 bits.
  unsigned hits;
  unsigned errors;
  // The small-step victim choice (assign_slots_small): per-warp counts (two buffers), the chosen
  // candidate keys, and the slot of each rank.
  alignas(16) unsigned warp_count[2][kThreads / 32];  // read 4 at a time
  uint32_t warp_min[kThreads / 32], warp_max[kThreads / 32];  // the candidates' stamp range per warp
  int num_sel;
  alignas(16) uint32_t sel[kSmallMisses];  // 16-byte aligned: rank_of reads it 4 at a time
  int32_t slot_of_rank[kSmallMisses];
  // write_row_from_regs with misses: each thread's classify entries and map slots, kept here across
  // the victim assignment (in registers they would cost the kernel its one-copy-block-beside fit).
  int32_t keep_pos[kThreads * kIlp];
  int32_t keep_slot[kThreads * kIlp];
  // assign_slots_small: each candidate slot's position (slot_pos), loaded beside its stamp, so the
  // victims' old positions need no round trip after the choice.
  int32_t slot_old[kKeys];
};
static_assert(sizeof(ResolveSmem<kItemsLarge>) <= 227 * 1024);

// Host-pool row of a request-local position, or -1: logical_to_physical with one rank (the
// device cache's paged rule), in 32-bit division (pos >= 0 and block_size >= 1 fit 32 bits, so
// the rows are the same; index.h's int64 division is a ~70-instruction call per position).
template <class P>  // ResolveParams or CopyParams (the same block-table fields)
__device__ __forceinline__ int64_t pool_row_of(const P& p, int req, int32_t pos) {
  if (pos < 0) return -1;
  const uint32_t bs = uint32_t(p.block_size);
  const uint32_t blk = uint32_t(pos) / bs, off = uint32_t(pos) - blk * bs;
  if (int64_t(blk) >= p.max_blocks) return -1;
  const int32_t b = p.block_table[int64_t(req) * p.bt_stride + blk];
  if (b < 0) return -1;
  const int64_t r = int64_t(b) * p.block_stride_rows + off;
  return r > INT32_MAX || r >= p.pool_rows ? -1 : r;
}

// One classify / write pass's kIlp consecutive entries first .. first + kIlp - 1 of a token row
// (-1 past K): one 16-byte load when the row allows it (the dense [T, K] case), else kIlp loads.
static_assert(kIlp == 4, "load_pass reads one int4");
__device__ __forceinline__ void load_pass(const int32_t* row, int first, int topk, int32_t (&pos)[kIlp]) {
  if ((reinterpret_cast<uintptr_t>(row + first) & 15) == 0 && first + kIlp <= topk) {
    const int4 v = *reinterpret_cast<const int4*>(row + first);
    pos[0] = v.x, pos[1] = v.y, pos[2] = v.z, pos[3] = v.w;
  } else {
#pragma unroll
    for (int u = 0; u < kIlp; ++u) pos[u] = first + u < topk ? row[first + u] : -1;
  }
}

// A load with acquire semantics at GPU scope: no later memory operation of the thread (nor, through
// a block barrier, of its block) is performed before it.
__device__ __forceinline__ int32_t ld_acquire(const int32_t* p) {
  int32_t v;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// `smla bench --hisparse --phases` only (set_tiered_phase_buffer_for_testing): %globaltimer stamps
// of one step. Resolve block 0, thread 0 (slots 0-7), and over every copy block's thread 0 (8: the
// earliest start; 9-12: the latest of each event).
enum Phase {
  kPhStart = 0, kPhTokens = 1, kPhClassified = 2, kPhAssigned = 3, kPhIds = 4, kPhEnd = 5, kPhSearched = 6,
  kPhRanked = 7, kPhCopyStart = 8, kPhCopyLoads = 9, kPhCopyFlag = 10, kPhCopyWait = 11, kPhCopyEnd = 12,
  kPhKeys = 13  // the small path's candidate keys loaded: before the search
};
__device__ __forceinline__ void phase_stamp(uint64_t* ph, int slot) {
  if (ph != nullptr && blockIdx.x == 0 && threadIdx.x == 0) ph[slot] = ptx::globaltimer();
}
__device__ __forceinline__ void phase_max(uint64_t* ph, int slot) {  // thread 0 of any copy block
  if (ph != nullptr && threadIdx.x == 0) {
    const unsigned long long t = ptx::globaltimer();
    if (slot == kPhCopyStart) atomicMin(reinterpret_cast<unsigned long long*>(ph + slot), t);
    else atomicMax(reinterpret_cast<unsigned long long*>(ph + slot), t);
  }
}

// A relaxed store at GPU scope (the same instruction cost as a plain one): the map words of placed
// misses, which copy_early's acquire loads may read (publish_before_assign's ordering argument needs
// the observed write to be a strong one).
__device__ __forceinline__ void st_relaxed(int32_t* p, int32_t v) {
  asm volatile("st.relaxed.gpu.global.b32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}

// Entry classes: kInvalid (position < 0 or >= length), kNewest (length - 1, slot R - 1), kOld
// (everything else: a hot slot, found or copied; a miss whose position has no host-pool row is
// an error and stays invalid, its map entry -1).
enum EntryKind { kInvalid, kNewest, kOld };
__device__ __forceinline__ EntryKind classify(int32_t len, int32_t pos) {
  if (pos < 0 || pos >= len) return kInvalid;
  return pos == len - 1 ? kNewest : kOld;
}

// Writes token t's row as empty (-1, count 0).
__device__ void write_empty_row(const ResolveParams& p, int64_t t) {
  int32_t* out = p.phys + t * p.phys_stride_t;
  for (int j = int(threadIdx.x); j < p.topk; j += kThreads) out[j] = -1;
  if (threadIdx.x == 0 && p.counts) p.counts[t] = 0;
}

__device__ __forceinline__ int64_t req_of(const ResolveParams& p, int64_t t) {
  return p.req_of_token ? int64_t(p.req_of_token[t]) : t;
}

// Phase 0: this request's tokens into shared memory; the length and token-count checks.
template <class Smem>
__device__ void collect_tokens(const ResolveParams& p, int r, Smem& sm, int32_t len) {
  if (threadIdx.x == 0) sm.num_tokens = 0, sm.num_miss = 0, sm.newest_used = 0, sm.hits = 0, sm.errors = 0;
  __syncthreads();
  if (r < p.num_reqs) {
    if (p.req_of_token) {
      for (int64_t t = threadIdx.x; t < p.num_tokens; t += kThreads)
        if (p.req_of_token[t] == r) {
          const int i = atomicAdd(&sm.num_tokens, 1);
          if (i < kTieredMaxTokensPerRequest) sm.tokens[i] = int32_t(t);
        }
    } else if (threadIdx.x == 0 && r < p.num_tokens) {
      sm.tokens[0] = r, sm.num_tokens = 1;
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    sm.bad = sm.num_tokens > 0 && (len < 0 || len > p.max_positions || sm.num_tokens > p.max_tokens_per_request);
    if (sm.bad) sm.errors += unsigned(sm.num_tokens);
  }
  __syncthreads();
}

// Phase 1: stamp hits, claim misses. Each thread takes kIlp entries per pass and issues their
// loads together: one token row of K = 2048 is one pass. Thread t takes entries base + t * kIlp ..
// + kIlp - 1 (the blocked order write_rows scans in), so that a single pass (one token, K <=
// kThreads * kIlp) leaves in keep_pos/keep_slot exactly what write_rows would read back when the
// step has no miss. pre (when have_pre) is the first pass of token sm.tokens[0], loaded early.
template <class Smem>
__device__ void classify_entries(const ResolveParams& p, int r, int32_t len, uint32_t now, Smem& sm,
                                 bool have_pre, const int32_t (&pre)[kIlp], int32_t (&keep_pos)[kIlp],
                                 int32_t (&keep_slot)[kIlp], unsigned& hits, uint32_t (&pending)[kIlp]) {
  int32_t* map = p.pos_slot + int64_t(r) * p.max_positions;
  uint32_t* stamps = p.stamps + int64_t(r) * p.R;
  CopyJob* jobs = p.jobs + int64_t(r) * p.R;
  unsigned errors = 0;
  bool newest = false, wrote_jobs = false;
  for (int i = 0; i < sm.num_tokens; ++i) {
    const int32_t* row = p.positions + int64_t(sm.tokens[i]) * p.pos_stride_t;
    for (int base = 0; base < p.topk; base += kThreads * kIlp) {
      const int first = base + int(threadIdx.x) * kIlp;
      int32_t pos[kIlp], slot[kIlp];
      EntryKind kind[kIlp];
      if (have_pre && i == 0 && base == 0) {
#pragma unroll
        for (int u = 0; u < kIlp; ++u) pos[u] = pre[u];
      } else {
        load_pass(row, first, p.topk, pos);
      }
#pragma unroll
      for (int u = 0; u < kIlp; ++u) kind[u] = classify(len, pos[u]);
#pragma unroll
      for (int u = 0; u < kIlp; ++u) slot[u] = kind[u] == kOld ? map[pos[u]] : -3;
      // Pool rows of every old entry, loaded beside the map (not after it): a miss's host read
      // then waits one round trip less; a hit's is unused (the block table is small and hot).
      int32_t pool_row[kIlp];
#pragma unroll
      for (int u = 0; u < kIlp; ++u) pool_row[u] = kind[u] == kOld ? int32_t(pool_row_of(p, r, pos[u])) : -1;
      // The hits' stamp exchanges go out together (one round trip, not kIlp); a position already
      // stamped `now` by another entry of this step is not counted again.
      uint32_t old[kIlp];
#pragma unroll
      for (int u = 0; u < kIlp; ++u) old[u] = now;
#pragma unroll
      for (int u = 0; u < kIlp; ++u)
        if (slot[u] >= 0) old[u] = atomicExch(&stamps[slot[u]], now);
      // The exchanges' results are counted one pass late (the last pass's by count_hits, after the
      // ids are written), so their round trip is not waited for here.
#pragma unroll
      for (int u = 0; u < kIlp; ++u) newest |= kind[u] == kNewest, hits += pending[u] != now, pending[u] = old[u];
      // Misses (map -1): their pool rows, then the claims, issued for all kIlp entries at once. A
      // position with no pool row is an error.
      int32_t prow[kIlp];
#pragma unroll
      for (int u = 0; u < kIlp; ++u) prow[u] = slot[u] == -1 ? pool_row[u] : -1;
      bool claimed[kIlp];
#pragma unroll
      for (int u = 0; u < kIlp; ++u) {
        errors += slot[u] == -1 && prow[u] < 0;
        claimed[u] = prow[u] >= 0 && atomicCAS(&map[pos[u]], -1, -2) == -1;
      }
      // The claimed positions join sm.miss (at most R - 1 distinct ones: the plan rule), one shared
      // atomic per warp and entry index (every thread of the block runs this loop).
      const int lane = int(threadIdx.x) & 31;
#pragma unroll
      for (int u = 0; u < kIlp; ++u) {
        const unsigned m = __ballot_sync(0xffffffffu, claimed[u]);
        if (m == 0) continue;
        int at = 0;
        if (lane == __ffs(m) - 1) at = atomicAdd(&sm.num_miss, __popc(m));
        at = __shfl_sync(0xffffffffu, at, __ffs(m) - 1);
        if (claimed[u]) {
          const int idx = at + __popc(m & ((1u << lane) - 1));
          sm.miss[idx] = pos[u];
          if (!p.early) {  // the copy blocks start on these before the victims are known
            jobs[idx] = CopyJob{prow[u], pos[u]};
            wrote_jobs = true;
          }
        }
      }
#pragma unroll
      for (int u = 0; u < kIlp; ++u) keep_pos[u] = pos[u], keep_slot[u] = slot[u];
    }
  }
  // The job list is published (publish_misses) after a block barrier: each writer fences first.
  if (wrote_jobs) __threadfence();
  // Summed per warp first: one shared atomic per warp, not per thread (every thread gets here).
  errors = __reduce_add_sync(0xffffffffu, errors);
  newest = __any_sync(0xffffffffu, newest);
  if ((threadIdx.x & 31) == 0) {
    if (errors) atomicAdd(&sm.errors, errors);
    if (newest) atomicExch(&sm.newest_used, 1);
  }
}

// Early mode (p.early), a step with misses: the flags are raised right before the first map write of
// the victim assignment, and each raising thread fences after its store (a block barrier then
// precedes the map writes). A copy block that read its entries' map words (acquire loads) and then
// still finds its flag 0 thus read them before any of those writes: every entry it saw
// below 0 with a pool row is a claimed miss of this step, every other one a hit (copy_early).
// The raising threads are the block's last copy_blocks_per_req (<= 128): in assign_slots_small the
// first n <= 256 threads rank the chosen keys meanwhile, so the fence's round trip runs beside them.
__device__ __forceinline__ void publish_before_assign(const ResolveParams& p, int r, int count) {
  const int i = int(threadIdx.x) - (kThreads - p.copy_blocks_per_req);
  if (i >= 0) {
    *reinterpret_cast<volatile uint32_t*>(p.copy_flags + int64_t(r) * kTieredCopyFlags + i) = uint32_t(count) + 1u;
    __threadfence();
  }
}

// Phase 2a: the claimed misses into sm.sorted_miss, ascending.
template <class Smem>
__device__ void sort_misses(const ResolveParams& p, int num_miss, Smem& sm) {
  constexpr int kItems = Smem::kItems;
  uint32_t pos[kItems];  // blocked: thread i holds ranks i*kItems .. i*kItems + kItems - 1
#pragma unroll
  for (int k = 0; k < kItems; ++k) {
    const int i = int(threadIdx.x) * kItems + k;
    pos[k] = i < num_miss ? uint32_t(sm.miss[i]) : 0xffffffffu;
  }
  __syncthreads();  // sm.miss is reused by the sort
  // Positions are < max_positions: only their low bits take part (the padding's low bits are all
  // ones, so it still sorts last).
  typename Smem::SortPos(sm.sort_pos).Sort(pos, 0, 32 - __clz(int(p.max_positions)));
#pragma unroll
  for (int k = 0; k < kItems; ++k) {
    const int i = int(threadIdx.x) * kItems + k;
    if (i < num_miss) sm.sorted_miss[i] = int32_t(pos[k]);
  }
}

// How many of a[0 .. n) lie below x (a: 16-byte aligned shared memory). Read 4 entries per
// 16-byte load, 16 in flight: a plain loop is one dependent shared load per entry (~30 cycles),
// which at n = 205 cost ~3.4 µs per ranking (s11 phases).
template <class T>
__device__ __forceinline__ int rank_of(const T* a, int n, T x) {
  static_assert(sizeof(T) == 4);
  using V = std::conditional_t<std::is_signed_v<T>, int4, uint4>;
  int rank = 0;
  const int n4 = n & ~3;
#pragma unroll 4
  for (int j = 0; j < n4; j += 4) {
    const V v = *reinterpret_cast<const V*>(a + j);
    rank += int(T(v.x) < x) + int(T(v.y) < x) + int(T(v.z) < x) + int(T(v.w) < x);
  }
  for (int j = n4; j < n; ++j) rank += a[j] < x;
  return rank;
}

// The small path's chosen keys once s* is known: those at s* straight to their rank c0 + (their index
// in slot order among the keys at s*) while below need = n - c0; those below s* (all chosen) into
// sm.sel, ranked afterwards. The default collects sm.sel by one shared atomic per warp and item.
template <int kItems, class Smem>
__device__ __forceinline__ void collect_chosen(const uint32_t (&key)[kItems], uint32_t s_star, unsigned c0, int need,
                                               Smem& sm) {
  constexpr uint32_t kNone = 0xffffffffu, kSlotMask = (1u << kSlotBits) - 1;
  const int lane = int(threadIdx.x) & 31;
  // The candidates stamped s*, numbered in slot order; the first `need` are chosen.
  int at_star[kItems];
  {
    int f[kItems];
#pragma unroll
    for (int k = 0; k < kItems; ++k) f[k] = key[k] != kNone && (key[k] >> kSlotBits) == s_star;
    int total;
    Scan(sm.scan).ExclusiveSum(f, at_star, total);
#pragma unroll
    for (int k = 0; k < kItems; ++k)
      if (!f[k]) at_star[k] = kSmallMisses;  // never chosen
  }
  // The keys below s* (all chosen) into sm.sel; those at s* straight to their rank.
#pragma unroll
  for (int k = 0; k < kItems; ++k) {
    const bool below = key[k] != kNone && (key[k] >> kSlotBits) < s_star;
    if (at_star[k] < need) sm.slot_of_rank[int(c0) + at_star[k]] = int32_t(key[k] & kSlotMask);
    const unsigned m = __ballot_sync(0xffffffffu, below);
    if (m == 0) continue;
    int at = 0;
    if (lane == __ffs(m) - 1) at = atomicAdd(&sm.num_sel, __popc(m));
    at = __shfl_sync(0xffffffffu, at, __ffs(m) - 1);
    if (below) sm.sel[at + __popc(m & ((1u << lane) - 1))] = key[k];
  }
}

// Phase 2 for a step of n <= kSmallMisses misses whose LRU keys fit 32 bits (end_bit <= 31), with
// no sort. The misses (distinct positions) are ranked by counting. The n smallest candidate keys
// (stamp << kSlotBits | slot, distinct) are: every candidate whose stamp is below s*, the stamp of
// the n-th smallest key (c0 < n of them), and the n - c0 lowest slots among the candidates stamped
// s*. s* is found by a binary search over the candidates' stamp range [min, max] (a block-wide
// count per probe: a few probes, where a search over whole keys took end_bit ~ 20, at ~0.3 µs
// each, s11 phases); the slots at s* by one block scan in slot order (the blocked order). The
// c0 keys below s* are collected and ranked by counting, those at s* take ranks c0 + their scan
// index. Rank i of each side then meets as in assign_slots: the same pairs, so the same map,
// slots and stamps.
// The small path's first part: thread t's candidate keys (slots t * kItems + k; padding and slots
// stamped `now`: kNone, never chosen) into key, and each slot's position beside its stamp into
// sm.slot_old (one round trip for both). Needs only the stamps final (every hit's exchange done): the
// one-grid chooser issues it together with its other reads after the workers' arrivals.
template <class Smem>
__device__ __forceinline__ void load_small_keys(const ResolveParams& p, int r, uint32_t now, Smem& sm,
                                                uint32_t (&key)[Smem::kItems]) {
  constexpr int kItems = Smem::kItems;
  constexpr uint32_t kNone = 0xffffffffu;
  const int t = int(threadIdx.x);
  const uint32_t* stamps = p.stamps + int64_t(r) * p.R;
  const int32_t* slot_pos = p.slot_pos + int64_t(r) * p.R;
#pragma unroll
  for (int k = 0; k < kItems; ++k) {
    const int sl = t * kItems + k;
    const uint32_t st = sl < p.R - 1 ? stamps[sl] : now;
    sm.slot_old[sl] = sl < p.R - 1 ? slot_pos[sl] : -1;
    key[k] = st != now ? (st << kSlotBits) | uint32_t(sl) : kNone;
  }
}

// The small path's second part, from the keys of load_small_keys (sm.miss holds the sm.num_miss
// claimed positions).
template <class Smem>
__device__ void choose_small(const ResolveParams& p, int r, uint32_t now, Smem& sm, const uint32_t (&key)[Smem::kItems]) {
  constexpr int kItems = Smem::kItems;
  constexpr uint32_t kNone = 0xffffffffu, kSlotMask = (1u << kSlotBits) - 1;
  const int n = sm.num_miss;
  const int t = int(threadIdx.x), lane = t & 31, warp = t >> 5;
  uint32_t* stamps = p.stamps + int64_t(r) * p.R;
  int32_t* slot_pos = p.slot_pos + int64_t(r) * p.R;
  uint32_t smin = kNone, smax = 0;
  // The candidates' stamp range, per warp.
#pragma unroll
  for (int k = 0; k < kItems; ++k)
    if (key[k] != kNone) smin = min(smin, key[k] >> kSlotBits), smax = max(smax, key[k] >> kSlotBits);
  smin = __reduce_min_sync(0xffffffffu, smin);
  smax = __reduce_max_sync(0xffffffffu, smax);
  if (lane == 0) sm.warp_min[warp] = smin, sm.warp_max[warp] = smax;
  if (t == 0) sm.num_sel = 0;
  // Misses by position: rank = how many misses lie below (positions are distinct).
  if (t < n) {
    const int32_t q = sm.miss[t];
    const int rank = rank_of(sm.miss, n, q);
    sm.sorted_miss[rank] = q;
  }
  __syncthreads();  // warp_min / warp_max; sm.miss is read no more (the scan below reuses it)
  phase_stamp(p.phase, kPhKeys);
  uint32_t lo = kNone, hi = 0;
#pragma unroll
  for (int w = 0; w < kThreads / 32; ++w) lo = min(lo, sm.warp_min[w]), hi = max(hi, sm.warp_max[w]);
  // s*: the least s in [lo, hi] with count(stamp <= s) >= n (there are >= n candidates: the plan
  // rule); c0 = count(stamp < s*), the count of the last probe that moved lo (0 if none did).
  unsigned c0 = 0;
  for (int it = 0; lo < hi; ++it) {
    const uint32_t mid = lo + (hi - lo) / 2;
    unsigned c = 0;
#pragma unroll
    for (int k = 0; k < kItems; ++k) c += key[k] != kNone && (key[k] >> kSlotBits) <= mid;
    c = __reduce_add_sync(0xffffffffu, c);
    if (lane == 0) sm.warp_count[it & 1][warp] = c;
    __syncthreads();  // two buffers: a warp rewrites this one only after the next barrier
    unsigned total = 0;
#pragma unroll
    for (int w = 0; w < kThreads / 32; w += 4) {
      const uint4 v = *reinterpret_cast<const uint4*>(&sm.warp_count[it & 1][w]);
      total += v.x + v.y + v.z + v.w;
    }
    if (total >= unsigned(n)) hi = mid;
    else lo = mid + 1, c0 = total;
  }
  const uint32_t s_star = lo;
  const int need = n - int(c0);  // >= 1
  phase_stamp(p.phase, kPhSearched);
  collect_chosen(key, s_star, c0, need, sm);
  __syncthreads();
  if (p.early) publish_before_assign(p, r, n);  // threads >= 384, beside the ranking below
  if (t < int(c0)) {
    const uint32_t x = sm.sel[t];
    const int rank = rank_of(sm.sel, int(c0), x);
    sm.slot_of_rank[rank] = int32_t(x & kSlotMask);
  }
  __syncthreads();
  phase_stamp(p.phase, kPhRanked);
  if (t < n) {
    int32_t* map = p.pos_slot + int64_t(r) * p.max_positions;
    const int32_t q = sm.sorted_miss[t];
    const int sl = sm.slot_of_rank[t];
    const int32_t old = sm.slot_old[sl];
    if (old >= 0) map[old] = -1;
    st_relaxed(map + q, sl), slot_pos[sl] = q, stamps[sl] = now;
  }
}

template <class Smem>
__device__ __forceinline__ void assign_slots_small(const ResolveParams& p, int r, uint32_t now, Smem& sm) {
  uint32_t key[Smem::kItems];
  load_small_keys(p, r, now, sm, key);
  choose_small(p, r, now, sm, key);
}

// Whether assign_slots takes the small path (assign_slots_small) for num_miss misses at clock now.
__device__ __forceinline__ bool takes_small_path(int num_miss, uint32_t now) {
  return num_miss <= kSmallMisses && kSlotBits + 32 - __clz(int(now)) <= 31;
}

// Phase 2b: misses by position meet candidate slots by (stamp, slot), rank by rank: map, slot
// positions and stamps (copy_kernel reads each claimed row's slot from the map afterwards).
template <class Smem>
__device__ void assign_slots(const ResolveParams& p, int r, uint32_t now, Smem& sm) {
  constexpr int kItems = Smem::kItems;
  const int num_miss = sm.num_miss;
  // Keys (stamp << kSlotBits) | slot; a slot stamped `now` (a hit of this step) and the padding
  // get all ones. Stamps are <= now: the other keys are below 2^end_bit - 1, so those sort last.
  const int end_bit = kSlotBits + 32 - __clz(int(now));
  if (takes_small_path(num_miss, now)) {
    assign_slots_small(p, r, now, sm);
    return;
  }
  sort_misses(p, num_miss, sm);
  __syncthreads();
  uint32_t* stamps = p.stamps + int64_t(r) * p.R;
  int slot_of_rank[kItems];  // blocked: thread i holds ranks i*kItems .. i*kItems + kItems - 1
  if (end_bit <= 31) {  // now < 2^18: the keys fit 32 bits (SortPos's sort, half the exchange bytes)
    uint32_t key[kItems];
#pragma unroll
    for (int k = 0; k < kItems; ++k) {
      const int s = int(threadIdx.x) * kItems + k;
      const uint32_t st = s < p.R - 1 ? stamps[s] : now;
      key[k] = st != now ? (st << kSlotBits) | uint32_t(s) : 0xffffffffu;
    }
    typename Smem::SortPos(sm.sort_pos).Sort(key, 0, end_bit);
#pragma unroll
    for (int k = 0; k < kItems; ++k) slot_of_rank[k] = int(key[k] & ((1u << kSlotBits) - 1));
  } else {
    uint64_t key[kItems];
#pragma unroll
    for (int k = 0; k < kItems; ++k) {
      const int s = int(threadIdx.x) * kItems + k;
      const uint32_t st = s < p.R - 1 ? stamps[s] : now;
      key[k] = st != now ? (uint64_t(st) << kSlotBits) | uint64_t(s) : ~uint64_t(0);
    }
    typename Smem::SortSlot(sm.sort_slot).Sort(key, 0, end_bit);
#pragma unroll
    for (int k = 0; k < kItems; ++k) slot_of_rank[k] = int(key[k] & ((uint64_t(1) << kSlotBits) - 1));
  }
  if (p.early) {
    publish_before_assign(p, r, num_miss);
    __syncthreads();
  }
  int32_t* map = p.pos_slot + int64_t(r) * p.max_positions;
  int32_t* slot_pos = p.slot_pos + int64_t(r) * p.R;
  // Chunks of up to 9 ranks: each chunk's slot_pos loads go out together, then its writes (the
  // ranks' slots are distinct, as are the old and the new positions).
  constexpr int kChunk = kItems <= 9 ? kItems : 8;
#pragma unroll
  for (int k0 = 0; k0 < kItems; k0 += kChunk) {
    int32_t q[kChunk], old[kChunk];
#pragma unroll
    for (int c = 0; c < kChunk; ++c) {
      const int k = k0 + c, i = int(threadIdx.x) * kItems + k;
      q[c] = -1, old[c] = -1;
      if (k < kItems && i < num_miss) {
        q[c] = sm.sorted_miss[i];
        old[c] = slot_pos[slot_of_rank[k]];
      }
    }
#pragma unroll
    for (int c = 0; c < kChunk; ++c) {
      const int k = k0 + c, i = int(threadIdx.x) * kItems + k;
      if (k < kItems && i < num_miss) {
        const int s = slot_of_rank[k];
        if (old[c] >= 0) map[old[c]] = -1;
        st_relaxed(map + q[c], s), slot_pos[s] = q[c], stamps[s] = now;
      }
    }
  }
}

// Phase 3: physical hot rows of every token of the request, compacted in entry order. A pass
// covers kThreads * kIlp entries, thread t holding kIlp consecutive ones (the blocked order the
// scan numbers them in).
template <class Smem>
__device__ void write_rows(const ResolveParams& p, int r, int32_t len, Smem& sm) {
  const int32_t* map = p.pos_slot + int64_t(r) * p.max_positions;
  for (int i = 0; i < sm.num_tokens; ++i) {
    const int64_t t = sm.tokens[i];
    const int32_t* row = p.positions + t * p.pos_stride_t;
    int32_t* out = p.phys + t * p.phys_stride_t;
    int n = 0;  // uniform across the block
    for (int base = 0; base < p.topk; base += kThreads * kIlp) {
      const int first = base + int(threadIdx.x) * kIlp;
      int32_t pos[kIlp], phys[kIlp];
      int valid[kIlp], offset[kIlp];
      load_pass(row, first, p.topk, pos);
#pragma unroll
      for (int u = 0; u < kIlp; ++u) {
        const EntryKind k = classify(len, pos[u]);
        const int32_t slot = k == kNewest ? p.R - 1 : k == kOld ? map[pos[u]] : -1;  // -1: a pool-less miss
        phys[u] = slot >= 0 ? r * p.R + slot : -1;
        valid[u] = slot >= 0;
      }
      int total;
      Scan(sm.scan).ExclusiveSum(valid, offset, total);
#pragma unroll
      for (int u = 0; u < kIlp; ++u)
        if (valid[u]) out[n + offset[u]] = phys[u];
      n += total;
      __syncthreads();  // the scan storage is reused by the next pass
    }
    for (int j = n + int(threadIdx.x); j < p.topk; j += kThreads) out[j] = -1;
    if (threadIdx.x == 0 && p.counts) p.counts[t] = n;
  }
}

// Phase 3 for a request with one token and K <= kThreads * kIlp: the single classify pass left
// each thread's entries and their map slots in registers. A slot found there (a hit) has not moved
// since; without a miss in the step no map entry changed at all. With misses (reread) an old
// entry whose slot was < 0 (its own claim, a duplicate's, or no pool row) takes its final map
// entry, read again after the assignment; so this writes what write_rows would, without reading
// the positions again.
template <class Smem>
__device__ void write_row_from_regs(const ResolveParams& p, int r, int32_t len, Smem& sm,
                                    const int32_t (&pos)[kIlp], const int32_t (&map_slot)[kIlp], bool reread) {
  const int32_t* map = p.pos_slot + int64_t(r) * p.max_positions;
  const int64_t t = sm.tokens[0];
  int32_t* out = p.phys + t * p.phys_stride_t;
  int32_t phys[kIlp];
  int valid[kIlp], offset[kIlp];
#pragma unroll
  for (int u = 0; u < kIlp; ++u) {
    const EntryKind k = classify(len, pos[u]);
    int32_t again = -1;
    if (k == kOld && reread && map_slot[u] < 0) again = map[pos[u]];
    const int32_t slot = k == kNewest ? p.R - 1 : k != kOld ? -1 : reread && map_slot[u] < 0 ? again : map_slot[u];
    phys[u] = slot >= 0 ? r * p.R + slot : -1;
    valid[u] = slot >= 0;
  }
  int n;
  Scan(sm.scan).ExclusiveSum(valid, offset, n);
#pragma unroll
  for (int u = 0; u < kIlp; ++u)
    if (valid[u]) out[offset[u]] = phys[u];
  for (int j = n + int(threadIdx.x); j < p.topk; j += kThreads) out[j] = -1;
  if (threadIdx.x == 0 && p.counts) p.counts[t] = n;
}

// The hits of classify_entries: its count so far plus its last pass's exchange results, summed per
// warp into sm.hits (every thread of the block calls it; a block barrier follows before sm.hits is read).
template <class Smem>
__device__ __forceinline__ void count_hits(uint32_t now, unsigned hits, const uint32_t (&pending)[kIlp], Smem& sm) {
#pragma unroll
  for (int u = 0; u < kIlp; ++u) hits += pending[u] != now;
  hits = __reduce_add_sync(0xffffffffu, hits);
  if ((threadIdx.x & 31) == 0 && hits) atomicAdd(&sm.hits, hits);
}

// The hand-off to copy_kernel: request r's job list (count entries, written and fenced by their
// writers before the block barrier that precedes this call) is complete; raise one flag per copy
// block of the request (count + 1; each copy block reads and clears its own). With no job to
// publish (an all-hit step) the flag orders nothing, so no fence delays the id write.
__device__ __forceinline__ void publish_misses(const ResolveParams& p, int r, int count) {
  if (int(threadIdx.x) < p.copy_blocks_per_req) {
    if (count > 0) __threadfence();
    *reinterpret_cast<volatile uint32_t*>(p.copy_flags + int64_t(r) * kTieredCopyFlags + threadIdx.x) =
        uint32_t(count) + 1u;
  }
}

template <int kItems>
__device__ __forceinline__ void resolve_body(const ResolveParams& p) {
  using Smem = ResolveSmem<kItems>;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  Smem& sm = *reinterpret_cast<Smem*>(smem_raw);
  const int r = int(blockIdx.x);
  // The request's clock: the stamp word of its reserved slot R - 1 (no LRU candidate reads it).
  uint32_t* clock = p.stamps + int64_t(r) * p.R + (p.R - 1);
  // copy_kernel (a PDL launch) may start its blocks now; they wait for this grid's end.
  ptx::pdl_launch_dependents();
  phase_stamp(p.phase, kPhStart);
  // The loads that need nothing from shared memory go out first, so that their latency overlaps
  // the token collection: the clock, the length, and (token t = request r when req_of_token is
  // null) the first classify pass of the request's positions.
  const uint32_t now = (r < p.num_reqs ? *clock : 0u) + 1;
  const int32_t len = r < p.num_reqs && p.num_tokens > 0 ? p.seq_lens[r] : 0;  // seq_lens may be null when T = 0
  const bool have_pre = !p.req_of_token && r < p.num_reqs && r < p.num_tokens;
  int32_t pre[kIlp];
  if (have_pre) {
    load_pass(p.positions + int64_t(r) * p.pos_stride_t, int(threadIdx.x) * kIlp, p.topk, pre);
  }
  collect_tokens(p, r, sm, len);
  phase_stamp(p.phase, kPhTokens);
  const bool live = sm.num_tokens > 0 && !sm.bad;
  if (!live && r < p.num_reqs) publish_misses(p, r, 0);  // nothing to copy for this request
  if (live) {
    int32_t keep_pos[kIlp], keep_slot[kIlp];
    unsigned hits = 0;
    uint32_t pending[kIlp];
#pragma unroll
    for (int u = 0; u < kIlp; ++u) pending[u] = now;
    classify_entries(p, r, len, now, sm, have_pre, pre, keep_pos, keep_slot, hits, pending);
    __syncthreads();
    phase_stamp(p.phase, kPhClassified);
    // The copy blocks start their host reads now; the victims, the map and the ids follow. Early
    // mode: they started already; a step with misses raises the flags in assign_slots.
    if (!p.early || sm.num_miss == 0) publish_misses(p, r, sm.num_miss);
    if (sm.num_tokens == 1 && p.topk <= kThreads * kIlp) {
      const bool reread = sm.num_miss > 0;  // uniform
      if (reread) {
#pragma unroll
        for (int u = 0; u < kIlp; ++u)
          sm.keep_pos[u * kThreads + threadIdx.x] = keep_pos[u], sm.keep_slot[u * kThreads + threadIdx.x] = keep_slot[u];
        assign_slots(p, r, now, sm);
        __syncthreads();  // map writes of every thread are visible to the block; the scan reuses the union
        phase_stamp(p.phase, kPhAssigned);
#pragma unroll
        for (int u = 0; u < kIlp; ++u)
          keep_pos[u] = sm.keep_pos[u * kThreads + threadIdx.x], keep_slot[u] = sm.keep_slot[u * kThreads + threadIdx.x];
        write_row_from_regs(p, r, len, sm, keep_pos, keep_slot, true);
      } else {
        write_row_from_regs(p, r, len, sm, keep_pos, keep_slot, false);
      }
    } else {
      if (sm.num_miss > 0) assign_slots(p, r, now, sm);
      __syncthreads();  // map writes of every thread are visible to the block; the scan reuses the union
      phase_stamp(p.phase, kPhAssigned);
      write_rows(p, r, len, sm);
    }
    count_hits(now, hits, pending, sm);  // the exchanges' round trip ran under the id write
    phase_stamp(p.phase, kPhIds);
  } else if (sm.num_tokens > 0) {  // a dropped request: every one of its tokens comes out empty
    for (int64_t t = 0; t < p.num_tokens; ++t)
      if (req_of(p, t) == r) write_empty_row(p, t);
  }
  // Tokens whose request id has no hot buffer in this step, spread over the blocks.
  for (int64_t t = blockIdx.x; t < p.num_tokens; t += gridDim.x) {
    const int64_t q = req_of(p, t);
    if (q >= 0 && q < p.num_reqs) continue;
    write_empty_row(p, t);
    if (threadIdx.x == 0) ++sm.errors;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    if (r < p.num_reqs) p.miss_count[r] = sm.num_miss;  // 0 unless live: copy_kernel's row count
    if (live) *clock = now;
    const unsigned long long hits = (unsigned long long)sm.hits + (sm.newest_used ? 1 : 0);
    if (hits) atomicAdd(reinterpret_cast<unsigned long long*>(&p.ctr->hits), hits);
    if (sm.num_miss) {
      atomicAdd(reinterpret_cast<unsigned long long*>(&p.ctr->misses), (unsigned long long)sm.num_miss);
      atomicAdd(reinterpret_cast<unsigned long long*>(&p.ctr->bytes), (unsigned long long)sm.num_miss * p.row_bytes);
    }
    if (sm.errors) atomicAdd(reinterpret_cast<unsigned long long*>(&p.ctr->errors), (unsigned long long)sm.errors);
    if (r == 0) atomicAdd(&p.ctr->clock, 1u);  // steps resolved
  }
  phase_stamp(p.phase, kPhEnd);
}

// One kernel per sort size. Their launch bounds differ only so that ptxas allocates each without
// a spill (its choice for the 9-key body under a bare __launch_bounds__(512) spills, and for the
// 16-key body under (512, 1) it does too; KernelConfig.KernelsHaveTheirRegistersAndNoSpills).
__global__ void __launch_bounds__(kThreads, 1) resolve_kernel_9(ResolveParams p) { resolve_body<kItemsSmall>(p); }
__global__ void __launch_bounds__(kThreads) resolve_kernel_16(ResolveParams p) { resolve_body<kItemsLarge>(p); }

// copy_kernel's arguments.
struct CopyParams {
  uint32_t* flags;            // state: [max_requests, kTieredCopyFlags] hand-off words
  const CopyJob* jobs;        // workspace: [max_requests, R] (pool row, position), claim order
  const int32_t* pos_slot;    // state: [max_requests, max_positions] the map (final after the resolver)
  int64_t max_positions;
  int R, blocks_per_req, pieces;
  const uint8_t* pool;        // device-visible pointer of the pinned host pool
  int64_t pool_stride;
  uint8_t* hot;               // [max_requests * R rows]
  int64_t hot_stride;
  int late;                   // benchmark A/B only: 1 = no load before the resolver's end (s9's schedule)
  // Early mode (copy_early): the block reads its own entries. The step's inputs, as the resolver has them:
  int early;                  // 1: copy_early; 0: the job list
  int force_late;             // tests only: every block takes copy_early's late path
  uint64_t* phase;            // benchmark only, nullable: %globaltimer stamps (kPhase*)
  const int32_t* positions;   // [T, K], row stride pos_stride_t
  int64_t pos_stride_t;
  int64_t num_tokens;
  int topk;
  const int32_t* req_of_token;  // nullable [T]
  const int32_t* seq_lens;      // [num_reqs]
  int64_t pool_rows;
  const int32_t* block_table;
  int64_t bt_stride;
  int max_blocks, block_size;
  int64_t block_stride_rows;
};

constexpr int kCopyThreads = 256;

// One round of a copy thread: up to kCopyRoundUnroll pieces i = base + u * width of the request's list
// (piece i: 16 bytes at offset 16 * (i % pieces) of job i / pieces), loaded from the host pool.
struct CopyRound {
  uint4 v[kCopyRoundUnroll];
};

__device__ __forceinline__ void copy_load(const CopyParams& c, const CopyJob* jobs, int base, int width, int total,
                                          CopyRound& rd) {
#pragma unroll
  for (int u = 0; u < kCopyRoundUnroll; ++u) {
    const int i = base + u * width;
    if (i < total) {
      // Through L2 (ld.global.cg): a job line cached in this SM's L1 by another request's block
      // could predate this request's flag.
      const int32_t src_row = __ldcg(&jobs[i / c.pieces].src_row);
      rd.v[u] = *reinterpret_cast<const uint4*>(c.pool + int64_t(src_row) * c.pool_stride + 16 * (i % c.pieces));
    }
  }
}

// The stores of a round, after the resolver's end: each piece's slot is its position's final map
// entry (every claimed position got one; a negative entry is never written through). The job's
// position is read again here (an L2 hit, under the host loads' latency) rather than kept in
// registers across the wait: the kernel stays at <= 64 registers, 4 blocks per SM, one beside a
// resolve block.
__device__ __forceinline__ void copy_store(const CopyParams& c, const CopyJob* jobs, const int32_t* map, uint8_t* hot,
                                           int base, int width, int total, const CopyRound& rd) {
  int32_t pos[kCopyRoundUnroll], slot[kCopyRoundUnroll];
#pragma unroll
  for (int u = 0; u < kCopyRoundUnroll; ++u) {
    const int i = base + u * width;
    pos[u] = i < total ? __ldcg(&jobs[i / c.pieces].pos) : -1;
  }
#pragma unroll
  for (int u = 0; u < kCopyRoundUnroll; ++u) slot[u] = pos[u] >= 0 ? __ldcg(map + pos[u]) : -1;
#pragma unroll
  for (int u = 0; u < kCopyRoundUnroll; ++u) {
    const int i = base + u * width;
    if (slot[u] >= 0 && slot[u] < c.R - 1)
      *reinterpret_cast<uint4*>(hot + int64_t(slot[u]) * c.hot_stride + 16 * (i % c.pieces)) = rd.v[u];
  }
}

// Early mode: the rows of a block's own entries, read before the resolver has chosen any victim.
// Request r's token row is cut into blocks_per_req ranges of E = ceil(K / blocks_per_req) <= 256
// entries (the launcher enables the mode only then), one entry per thread. Each block, resident
// beside the resolve block from its start (a PDL launch):
//   1. reads its entries' positions, the request's length, their map words and pool rows (the
//      resolver's own classification: old = 0 <= pos < length - 1 with length <= max_positions;
//      a miss is an old entry whose map word is < 0 (-1, or -2 once claimed) with a pool row);
//   2. lists its misses in shared memory, reads its flag after a block barrier (in time: still 0),
//      and loads the first round of those rows from host memory into registers;
//   3. waits for its flag, clears it, waits for the resolver's end (griddepcontrol.wait) and
//      stores each row to its position's final map slot; later rounds load and store in turn.
// The resolver raises the flag before its first map write of a victim (publish_before_assign), so
// an in-time block's map words were read before any of them: below 0 = a claimed miss of this step,
// >= 0 = a hit whose slot does not change. A late block (its flag was up at the check: it started
// late, or force_late) cannot tell a hit from a miss already placed; after the resolver's end it
// copies every old entry with a pool row to its final slot (a hit's slot gets the bytes it already
// holds: slots of this step's positions are never victims, and nothing else writes them now). The
// map, stamps, ids and counters are the resolver's alone; duplicates of a position in two blocks
// store the same bytes twice.
__device__ __forceinline__ void copy_early_rounds(const CopyParams& c, const int32_t* map, uint8_t* hot,
                                                  const int32_t* lpos, const int32_t* lrow, int total, bool loaded,
                                                  CopyRound& rd) {
  for (int base = int(threadIdx.x); base < total; base += kCopyThreads * kCopyRoundUnroll) {
    if (!loaded) {
#pragma unroll
      for (int u = 0; u < kCopyRoundUnroll; ++u) {
        const int i = base + u * kCopyThreads;
        if (i < total)
          rd.v[u] = *reinterpret_cast<const uint4*>(c.pool + int64_t(lrow[i / c.pieces]) * c.pool_stride +
                                                    16 * (i % c.pieces));
      }
    }
    loaded = false;
    int32_t slot[kCopyRoundUnroll];
#pragma unroll
    for (int u = 0; u < kCopyRoundUnroll; ++u) {
      const int i = base + u * kCopyThreads;
      slot[u] = i < total ? __ldcg(map + lpos[i / c.pieces]) : -1;
    }
#pragma unroll
    for (int u = 0; u < kCopyRoundUnroll; ++u) {
      const int i = base + u * kCopyThreads;
      if (slot[u] >= 0 && slot[u] < c.R - 1)
        *reinterpret_cast<uint4*>(hot + int64_t(slot[u]) * c.hot_stride + 16 * (i % c.pieces)) = rd.v[u];
    }
  }
}

__device__ void copy_early(const CopyParams& c, int r, int part) {
  __shared__ int s_token, s_n, s_late;
  __shared__ int32_t s_pos[kCopyThreads], s_row[kCopyThreads];
  const int t = int(threadIdx.x), lane = t & 31;
  // r < num_reqs (the grid has num_reqs * blocks_per_req blocks); seq_lens may be null when T = 0.
  const int32_t len = c.num_tokens > 0 ? c.seq_lens[r] : 0;
  if (t == 0) s_token = c.req_of_token ? INT_MAX : (int64_t(r) < c.num_tokens ? r : -1), s_n = 0;
  __syncthreads();
  if (c.req_of_token) {  // one token per request (the launcher's rule); more are dropped by the resolver
    for (int64_t i = t; i < c.num_tokens; i += kCopyThreads)
      if (c.req_of_token[i] == r) atomicMin(&s_token, int(i));
    __syncthreads();
  }
  const int token = s_token == INT_MAX ? -1 : s_token;
  const int per_block = (c.topk + c.blocks_per_req - 1) / c.blocks_per_req;
  const int j = part * per_block + t;
  int32_t pos = -1;
  if (token >= 0 && t < per_block && j < c.topk) pos = c.positions[int64_t(token) * c.pos_stride_t + j];
  const int32_t* map = c.pos_slot + int64_t(r) * c.max_positions;
  const bool old = int64_t(len) <= c.max_positions && pos >= 0 && int64_t(pos) < int64_t(len) - 1;
  int32_t slot = 0, prow = -1;
  if (old) {
    slot = ld_acquire(map + pos);  // ordered before the flag read below (publish_before_assign)
    prow = int32_t(pool_row_of(c, r, pos));
  }
  const bool miss = old && slot < 0 && prow >= 0;
  {
    const unsigned m = __ballot_sync(0xffffffffu, miss);
    int at = 0;
    if (m != 0 && lane == __ffs(m) - 1) at = atomicAdd(&s_n, __popc(m));
    at = __shfl_sync(0xffffffffu, at, m != 0 ? __ffs(m) - 1 : 0);
    if (miss) {
      const int idx = at + __popc(m & ((1u << lane) - 1));
      s_pos[idx] = pos, s_row[idx] = prow;
    }
  }
  __syncthreads();
  volatile uint32_t* flag = c.flags + int64_t(r) * kTieredCopyFlags + part;
  uint32_t at_check = 0;
  if (t == 0) at_check = *flag;
  const int n = s_n;
  uint8_t* hot = c.hot + int64_t(r) * c.R * c.hot_stride;
  CopyRound rd;
  const int total = n * c.pieces;
#pragma unroll
  for (int u = 0; u < kCopyRoundUnroll; ++u) {  // the first round, before any victim is known
    const int i = t + u * kCopyThreads;
    if (i < total)
      rd.v[u] = *reinterpret_cast<const uint4*>(c.pool + int64_t(s_row[i / c.pieces]) * c.pool_stride +
                                                16 * (i % c.pieces));
  }
  phase_max(c.phase, kPhCopyLoads);
  if (t == 0) {
    uint32_t v;
    while ((v = *flag) == 0) __nanosleep(64);
    *flag = 0;  // this block is the flag's only reader: zero again for the next step
    // The flag holds the request's miss count + 1: with no miss (an all-hit step, a request without
    // tokens or dropped) there is nothing to store, however late the check was.
    s_late = v == 1 ? 2 : (at_check != 0 || c.force_late) ? 1 : 0;
  }
  phase_max(c.phase, kPhCopyFlag);
  __syncthreads();
  if (s_late == 2) {
    ptx::pdl_wait();
    phase_max(c.phase, kPhCopyWait);
    return;
  }
  const bool late = s_late == 1;
  if (late) {  // every old entry with a pool row, after the resolver's end
    if (t == 0) s_n = 0;
    __syncthreads();
    const bool want = old && prow >= 0;
    const unsigned m = __ballot_sync(0xffffffffu, want);
    int at = 0;
    if (m != 0 && lane == __ffs(m) - 1) at = atomicAdd(&s_n, __popc(m));
    at = __shfl_sync(0xffffffffu, at, m != 0 ? __ffs(m) - 1 : 0);
    if (want) {
      const int idx = at + __popc(m & ((1u << lane) - 1));
      s_pos[idx] = pos, s_row[idx] = prow;
    }
    __syncthreads();
  }
  ptx::pdl_wait();  // resolve_kernel's end: the map is final
  phase_max(c.phase, kPhCopyWait);
  copy_early_rounds(c, map, hot, s_pos, s_row, s_n * c.pieces, !late, rd);
}

// Copies the claimed rows: request blockIdx.x / blocks_per_req, the part blockIdx.x %
// blocks_per_req of its 16-byte pieces (strided, kCopyRoundUnroll loads in flight per thread).
// A PDL launch: the blocks are resident while resolve_kernel runs. Each waits for its own flag
// (raised by the resolve block right after classification, with the job list complete), clears
// it, and issues its first round of host loads at once; only the stores wait for the resolver's
// end (griddepcontrol.wait), when the victims are in the map. Later rounds (large steps) load and
// store in turn. No deadlock: the resolve blocks have all started (each triggers the launch at its
// first instruction) and none waits for a copy block.
__global__ void __launch_bounds__(kCopyThreads) copy_kernel(CopyParams c) {
  // A programmatic dependent launch behind this kernel may start its blocks on free SMs now; they
  // wait for this grid's end, which follows the resolver's (every block waits for it).
  ptx::pdl_launch_dependents();
  phase_max(c.phase, kPhCopyStart);
  const int r = int(blockIdx.x) / c.blocks_per_req, part = int(blockIdx.x) % c.blocks_per_req;
  if (c.early) {
    copy_early(c, r, part);
    phase_max(c.phase, kPhCopyEnd);
    return;
  }
  __shared__ int s_count;
  if (threadIdx.x == 0) {
    volatile uint32_t* flag = c.flags + int64_t(r) * kTieredCopyFlags + part;
    uint32_t v;
    while ((v = *flag) == 0) __nanosleep(64);
    __threadfence();  // the job list, fenced before the flag, is read after this
    *flag = 0;        // this block is the flag's only reader: zero again for the next step
    s_count = int(v) - 1;
  }
  phase_max(c.phase, kPhCopyFlag);
  __syncthreads();
  const int total = s_count * c.pieces;
  const CopyJob* jobs = c.jobs + int64_t(r) * c.R;
  const int32_t* map = c.pos_slot + int64_t(r) * c.max_positions;
  uint8_t* hot = c.hot + int64_t(r) * c.R * c.hot_stride;
  // The request's blocks_per_req * kCopyThreads threads take consecutive pieces (coalesced), u-th
  // load of a thread one grid width further: a short list spreads over all of the request's
  // blocks (SMs) instead of filling the first few.
  const int width = c.blocks_per_req * kCopyThreads;
  int base = part * kCopyThreads + int(threadIdx.x);
  CopyRound rd;
  if (c.late) ptx::pdl_wait();
  copy_load(c, jobs, base, width, total, rd);  // before the victims are chosen
  phase_max(c.phase, kPhCopyLoads);
  ptx::pdl_wait();  // resolve_kernel's end: map final (a no-op unless launched with PDL)
  phase_max(c.phase, kPhCopyWait);
  if (total == 0) {
    phase_max(c.phase, kPhCopyEnd);
    return;
  }
  copy_store(c, jobs, map, hot, base, width, total, rd);
  for (base += width * kCopyRoundUnroll; base < total; base += width * kCopyRoundUnroll) {
    copy_load(c, jobs, base, width, total, rd);
    copy_store(c, jobs, map, hot, base, width, total, rd);
  }
  phase_max(c.phase, kPhCopyEnd);
}

// ---- The one-grid step (s13, perf-history s13-hisparse) ----
// One cooperative launch of num_reqs x (1 + G) blocks of kThreads: per request, block 0 is the
// chooser and blocks 1 .. G the workers (tiered::onegrid_workers: one per 128 entries, at most 16).
// Used for one token per request with req_of_token null (token r -> request r), R <= 4608 and a grid
// that fits the device at once (the launch guarantees co-residency, so the blocks may wait on one
// another); every other call takes resolve_kernel + copy_kernel. The same rule, the same results.
//
// Worker b takes entries [b E, b E + count) of its request's token, one per thread: length, clock,
// position, then map word and pool row together; a hit exchanges its slot's stamp for `now` (the
// count of hits is the exchanges that returned another stamp, as in classify_entries), a miss with
// a pool row claims its position (-1 -> -2), a miss without one is an error. A block scan of the
// entries' validity places each valid entry in the block's segment [b E, b E + count) in entry
// order; hits and the newest row write their ids at once, the rest of the segment gets -1. The
// claimed misses go to the job list (the block's segment of the request's list). The block then stores its record (tiered::pack_record: its claim count for the gather)
// and arrives on the request's 64-bit hand-off word by a release add of its counts (tiered::arrival_word), so
// the word holds the step's totals once all have arrived. A block with no entry left unresolved (a
// claim, or a position another entry claimed) exits; the others issue the first round of host loads
// of their claimed rows, wait for the chooser's word, leave (add 1), write their unresolved entries'
// ids from the final map (unless the chooser rewrote the row) and store their rows to the final slots.
//
// The chooser waits for the G arrivals; an all-hit step then only writes the count, the clock and
// the counters. With claims it issues in one round (s13b) the records, its job entries' positions
// and, on the counting path, the candidate keys (load_small_keys), then places the claimed positions
// in sm.miss (tiered::onegrid_miss_index) and picks the victims: choose_small (up to kSmallMisses
// misses with 32-bit keys) or assign_slots' sorts, the same victims as resolve_kernel. When the workers' segments are not the compacted row (a worker
// before the last with an invalid entry: tiered::onegrid_needs_fixup) it rewrites the whole row
// from the final map (write_rows) before raising its word, and the workers skip their id writes.
// It then writes the count, the clock and the counters, and puts the hand-off words back to 0.
// The hand-off words are the state's copy_flags of the request (words 0 and 1, words 8 .. 8 + G - 1),
// which copy_kernel also expects to be 0 between steps.
__device__ __forceinline__ uint64_t ld_acquire_u64(const unsigned long long* p) {
  uint64_t v;
  asm volatile("ld.acquire.gpu.global.b64 %0, [%1];\n" : "=l"(v) : "l"(p) : "memory");
  return v;
}
// An add with release semantics at GPU scope (no result): cooperative groups' arrival on sm_70+.
__device__ __forceinline__ void red_release_add_u64(unsigned long long* p, uint64_t v) {
  asm volatile("red.release.gpu.global.add.u64 [%0], %1;\n" ::"l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ void st_release_u64(unsigned long long* p, uint64_t v) {
  asm volatile("st.release.gpu.global.b64 [%0], %1;\n" ::"l"(p), "l"(v) : "memory");
}

using OneGridSmem = ResolveSmem<kItemsSmall>;

__device__ void onegrid_worker(const ResolveParams& p, OneGridSmem& sm, int r, int b, int G, int per) {
  namespace tg = tiered;
  __shared__ uint64_t s_word;
  const int t = int(threadIdx.x), lane = t & 31;
  phase_max(p.phase, kPhCopyStart);
  if (r >= p.num_tokens) return;  // no token for this request: nothing to resolve (the chooser agrees)
  const int32_t len = p.seq_lens[r];
  if (len < 0 || int64_t(len) > p.max_positions) return;  // dropped: the chooser writes the empty row
  uint32_t* stamps = p.stamps + int64_t(r) * p.R;
  int32_t* map = p.pos_slot + int64_t(r) * p.max_positions;
  uint32_t* words = p.copy_flags + int64_t(r) * kTieredCopyFlags;
  const uint32_t now = __ldcg(stamps + (p.R - 1)) + 1;
  const int first = tg::onegrid_first(b, per), count = tg::onegrid_count(p.topk, b, per);
  const int32_t pos = t < count ? p.positions[int64_t(r) * p.pos_stride_t + first + t] : -1;
  if (t == 0) sm.num_miss = 0, sm.hits = 0, sm.errors = 0, sm.newest_used = 0, sm.bad = 0;
  const EntryKind kind = classify(len, pos);
  const int32_t slot = kind == kOld ? map[pos] : -3;
  const int32_t prow = kind == kOld ? int32_t(pool_row_of(p, r, pos)) : -1;
  uint32_t old = now;
  if (slot >= 0) old = atomicExch(&stamps[slot], now);
  const bool error = slot == -1 && prow < 0;
  const bool claimed = slot == -1 && prow >= 0 && atomicCAS(&map[pos], -1, -2) == -1;
  const bool unresolved = kind == kOld && slot < 0 && prow >= 0;  // its slot comes from the victim choice
  const int valid = kind == kNewest || (kind == kOld && (slot >= 0 || prow >= 0));
  __syncthreads();  // the counters above are zero before any update
  int off = 0, nvalid = 0;
  Scan(sm.scan).ExclusiveSum(valid, off, nvalid);
  int32_t* out = p.phys + int64_t(r) * p.phys_stride_t + first;
  if (valid && !unresolved) out[off] = r * p.R + (kind == kNewest ? p.R - 1 : slot);
  if (t >= nvalid && t < count) out[t] = -1;
  {  // counts, summed per warp
    const unsigned h = __reduce_add_sync(0xffffffffu, unsigned(slot >= 0 && old != now));
    const unsigned e = __reduce_add_sync(0xffffffffu, unsigned(error));
    const bool nw = __any_sync(0xffffffffu, kind == kNewest), un = __any_sync(0xffffffffu, unresolved);
    if (lane == 0) {
      if (h) atomicAdd(&sm.hits, h);
      if (e) atomicAdd(&sm.errors, e);
      if (nw) atomicExch(&sm.newest_used, 1);  // atomics: several warps may set it (racecheck-clean)
      if (un) atomicExch(&sm.bad, 1);
    }
  }
  // The claimed misses: positions and pool rows in shared memory (sorted_miss / slot_old: unused by
  // a worker otherwise), and the block's segment of the request's job list for the chooser.
  {
    const unsigned m = __ballot_sync(0xffffffffu, claimed);
    if (m != 0) {
      int at = 0;
      if (lane == __ffs(m) - 1) at = atomicAdd(&sm.num_miss, __popc(m));
      at = __shfl_sync(0xffffffffu, at, __ffs(m) - 1);
      if (claimed) {
        const int idx = at + __popc(m & ((1u << lane) - 1));
        sm.sorted_miss[idx] = pos, sm.slot_old[idx] = prow;
        p.jobs[int64_t(r) * p.R + first + idx] = CopyJob{prow, pos};
      }
    }
  }
  __syncthreads();
  const int n = sm.num_miss;
  const int pieces = p.row_bytes / 16, total = n * pieces;
  const bool waits = sm.bad != 0;
  // The arrival comes before the host loads (the chooser should not wait for PCIe). As in cooperative
  // groups' grid sync on sm_70+ (s13b: no fence.sc), the block barrier and thread 0's release add
  // (cumulative) order every thread's ids, job entries, claims and exchanges before the arrival.
  __syncthreads();
  auto* hand = reinterpret_cast<unsigned long long*>(words);  // the 64-bit hand-off word (words 0, 1)
  if (t == 0) {
    const bool newest = sm.newest_used != 0;
    words[tg::kOneGridRecordWord + b] = tg::pack_record(nvalid, n, int(sm.errors), waits, newest);
    if (sm.hits) atomicAdd(reinterpret_cast<unsigned long long*>(&p.ctr->hits), (unsigned long long)sm.hits);
    red_release_add_u64(hand, tg::arrival_word(nvalid, n, int(sm.errors), waits, newest,
                                               tg::onegrid_breaks_row(nvalid, b, G, p.topk, per)));
  }
  phase_max(p.phase, kPhCopyFlag);
  if (!waits) return;
  CopyRound rd;
#pragma unroll
  for (int u = 0; u < kCopyRoundUnroll; ++u) {  // the first round, before any victim is known
    const int i = t + u * kThreads;
    if (i < total)
      rd.v[u] = *reinterpret_cast<const uint4*>(p.pool + int64_t(sm.slot_old[i / pieces]) * p.pool_stride +
                                                16 * (i % pieces));
  }
  phase_max(p.phase, kPhCopyLoads);
  if (t == 0) {
    uint64_t v;
    while (((v = ld_acquire_u64(hand)) & tg::kOneGridDone) == 0) __nanosleep(32);
    // No fence (s13b): the acquire load and the block barrier below order the block's reads after the
    // chooser's writes, as cooperative groups' grid sync does. The leaving add follows the load of the
    // same word in program order (same-address coherence).
    atomicAdd(hand, 1ull);  // leaving: the chooser puts the word back to 0 once every waiting block has
    s_word = v;
  }
  __syncthreads();  // thread 0's acquire, then the block's reads of the final map
  phase_max(p.phase, kPhCopyWait);
  // The final map words this block needs first — its unresolved entries' (their ids) and the first
  // round's rows' (their slots) — are read together, before any store (s13b: a store of an id before
  // the row slots' loads would put two round trips in a row: the loads cannot pass a global store).
  const bool write_id = unresolved && (s_word & tg::kOneGridFixup) == 0;
  const int32_t id_slot = write_id ? __ldcg(map + pos) : -1;
  int32_t dst[kCopyRoundUnroll];
#pragma unroll
  for (int u = 0; u < kCopyRoundUnroll; ++u) {
    const int i = t + u * kThreads;
    dst[u] = i < total ? __ldcg(map + sm.sorted_miss[i / pieces]) : -1;
  }
  if (write_id) out[off] = id_slot >= 0 ? r * p.R + id_slot : -1;
  uint8_t* hot = p.hot + int64_t(r) * p.R * p.hot_stride;
  for (int base = t; base < total; base += kThreads * kCopyRoundUnroll) {
    if (base != t) {  // later rounds (more than kThreads x kCopyRoundUnroll pieces): rows, then slots
#pragma unroll
      for (int u = 0; u < kCopyRoundUnroll; ++u) {
        const int i = base + u * kThreads;
        if (i < total)
          rd.v[u] = *reinterpret_cast<const uint4*>(p.pool + int64_t(sm.slot_old[i / pieces]) * p.pool_stride +
                                                    16 * (i % pieces));
      }
#pragma unroll
      for (int u = 0; u < kCopyRoundUnroll; ++u) {
        const int i = base + u * kThreads;
        dst[u] = i < total ? __ldcg(map + sm.sorted_miss[i / pieces]) : -1;
      }
    }
#pragma unroll
    for (int u = 0; u < kCopyRoundUnroll; ++u) {
      const int i = base + u * kThreads;
      if (dst[u] >= 0 && dst[u] < p.R - 1)
        *reinterpret_cast<uint4*>(hot + int64_t(dst[u]) * p.hot_stride + 16 * (i % pieces)) = rd.v[u];
    }
  }
  phase_max(p.phase, kPhCopyEnd);
}

__device__ void onegrid_chooser(const ResolveParams& p, OneGridSmem& sm, int r, int G, int per) {
  namespace tg = tiered;
  __shared__ int s_claims[tg::kOneGridWorkers];
  __shared__ uint64_t s_tot;
  const int t = int(threadIdx.x);
  phase_stamp(p.phase, kPhStart);
  uint32_t* clock = p.stamps + int64_t(r) * p.R + (p.R - 1);
  uint32_t* words = p.copy_flags + int64_t(r) * kTieredCopyFlags;
  auto* hand = reinterpret_cast<unsigned long long*>(words);  // the 64-bit hand-off word (words 0, 1)
  const uint32_t now = __ldcg(clock) + 1;  // through L2: the chooser's L1 holds no line of the stamps
  const bool has_token = r < p.num_tokens;
  const int32_t len = has_token ? p.seq_lens[r] : 0;
  const bool bad = has_token && (len < 0 || int64_t(len) > p.max_positions);
  unsigned errors = 0;  // thread 0's
  // Tokens whose request id has no hot buffer (t >= num_reqs), spread over the choosers.
  for (int64_t q = int64_t(p.num_reqs) + r; q < p.num_tokens; q += p.num_reqs) {
    write_empty_row(p, q);
    if (t == 0) ++errors;
  }
  if (bad) {
    write_empty_row(p, r);
    if (t == 0) ++errors;
  }
  const bool live = has_token && !bad;
  int n = 0;
  bool newest = false;
  if (live) {
    if (t == 0) {
      uint64_t v;
      // As cooperative groups' grid sync (no fence, s13b): the acquire load and the block barrier below
      // order the block's reads after every arrival (and so after every worker's writes).
      while (tg::unpack_totals(v = ld_acquire_u64(hand)).arrivals < G) __nanosleep(32);
      s_tot = v;
    }
    __syncthreads();  // thread 0's acquire, then the block's reads of what the workers wrote
    phase_stamp(p.phase, kPhClassified);
    // The step's totals came with the arrivals: an all-hit step reads nothing more.
    const tg::OneGridTotals tot = tg::unpack_totals(s_tot);
    n = tot.claims, newest = tot.newest > 0;
    const bool fixup = tot.breaks > 0;  // tg::onegrid_needs_fixup
    if (t == 0) errors += unsigned(tot.errors);
    if (n > 0) {
      // Three reads, none depending on another, issued in one round (s13b): the G records (their claim
      // counts), the positions of this thread's first kIlp job entries (read whether claimed or not:
      // j < K <= R - 1 is in bounds, an unclaimed entry's stale word is ignored), and on the small path
      // the candidate keys and slot positions. All three were final at the arrivals.
      const bool small = takes_small_path(n, now);
      uint32_t rec = 0;
      if (t < G) rec = __ldcg(words + tg::kOneGridRecordWord + t);
      const CopyJob* jobs = p.jobs + int64_t(r) * p.R;
      int32_t jpos[kIlp];
#pragma unroll
      for (int u = 0; u < kIlp; ++u) {
        const int j = t + u * kThreads;
        jpos[u] = j < p.topk ? __ldcg(&jobs[j].pos) : -1;
      }
      uint32_t key[OneGridSmem::kItems];
      if (small) load_small_keys(p, r, now, sm, key);
      if (t < G) s_claims[t] = tg::unpack_record(rec).claims;
      if (t == 0) sm.num_miss = n;  // the records' sum (the arrival word's field is their total)
      __syncthreads();
      // Each entry to the list at tiered::onegrid_miss_index (the workers' segments in order).
#pragma unroll
      for (int u = 0; u < kIlp; ++u) {
        const int j = t + u * kThreads;
        const int at = j < p.topk ? tg::onegrid_miss_index(j, per, s_claims) : -1;
        if (at >= 0) sm.miss[at] = jpos[u];
      }
      for (int j = t + kIlp * kThreads; j < p.topk; j += kThreads) {  // K > 2048 only
        const int at = tg::onegrid_miss_index(j, per, s_claims);
        if (at >= 0) sm.miss[at] = __ldcg(&jobs[j].pos);
      }
      __syncthreads();
      if (small) choose_small(p, r, now, sm, key);
      else assign_slots(p, r, now, sm);  // the sorts (p.early = 0: the default choice, no flags)
      __syncthreads();  // every map write of the block before the row rewrite / the word
      phase_stamp(p.phase, kPhAssigned);
    }
    if (fixup) {  // the row from the final map (writes the count too)
      if (t == 0) sm.num_tokens = 1, sm.tokens[0] = r;
      __syncthreads();
      write_rows(p, r, len, sm);
    }
    if (tot.waiters > 0) {
      __syncthreads();  // map, slot positions, stamps (and a rewritten row) of every thread, then
      if (t == 0) {     // thread 0's release store (cumulative; no fence, s13b) of the word
        const uint64_t word = tg::kOneGridDone | (fixup ? tg::kOneGridFixup : 0u);
        st_release_u64(hand, word);
        phase_stamp(p.phase, kPhIds);
        while (ld_acquire_u64(hand) != word + uint64_t(tot.waiters)) __nanosleep(32);
      }
    }
    if (t < G) words[tg::kOneGridRecordWord + t] = 0;  // (with claims, thread t read it before two barriers)
    if (t == 0) {
      *hand = 0ull;  // every worker has arrived and every waiting one has left
      if (!fixup && p.counts) p.counts[r] = tot.valid;
      *clock = now;
    }
  }
  if (t == 0) {
    const unsigned long long hits = newest ? 1 : 0;  // the workers added the hot hits
    if (hits) atomicAdd(reinterpret_cast<unsigned long long*>(&p.ctr->hits), hits);
    if (n) {
      atomicAdd(reinterpret_cast<unsigned long long*>(&p.ctr->misses), (unsigned long long)n);
      atomicAdd(reinterpret_cast<unsigned long long*>(&p.ctr->bytes), (unsigned long long)n * p.row_bytes);
    }
    if (errors) atomicAdd(reinterpret_cast<unsigned long long*>(&p.ctr->errors), (unsigned long long)errors);
    if (r == 0) atomicAdd(&p.ctr->clock, 1u);  // steps resolved
  }
  phase_stamp(p.phase, kPhEnd);
}

__global__ void __launch_bounds__(kThreads, 1) onegrid_kernel(ResolveParams p, int G, int per) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  OneGridSmem& sm = *reinterpret_cast<OneGridSmem*>(smem_raw);
  const int r = int(blockIdx.x) / (G + 1), b = int(blockIdx.x) % (G + 1);
  if (b == 0) onegrid_chooser(p, sm, r, G, per);
  else onegrid_worker(p, sm, r, b - 1, G, per);
}

// One thread per named position: a hot one loses its slot. Duplicates write the same values.
__global__ void invalidate_kernel(const int32_t* req, const int32_t* pos, int64_t n, int R, int max_requests,
                                  int64_t max_positions, uint32_t* stamps, int32_t* slot_pos, int32_t* pos_slot) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const int32_t q = req[i], x = pos[i];
  if (q < 0 || x < 0 || q >= max_requests || x >= max_positions) return;
  int32_t* m = pos_slot + int64_t(q) * max_positions + x;
  const int32_t slot = *m;
  if (slot < 0) return;
  slot_pos[int64_t(q) * R + slot] = -1, stamps[int64_t(q) * R + slot] = 0, *m = -1;
}

// The benchmark's plain gather: 16-byte pieces of rows[i] -> row i, kCopyUnroll loads in flight.
__global__ void __launch_bounds__(256) gather_kernel(const uint8_t* src, int64_t src_stride, const int32_t* rows,
                                                     int64_t total, int pieces, uint8_t* dst, int64_t dst_stride) {
  const int64_t step = int64_t(gridDim.x) * 256 * kCopyUnroll;
  for (int64_t base = int64_t(blockIdx.x) * 256 * kCopyUnroll + threadIdx.x; base < total; base += step) {
    uint4 v[kCopyUnroll];
#pragma unroll
    for (int u = 0; u < kCopyUnroll; ++u) {
      const int64_t i = base + int64_t(u) * 256;
      if (i < total)
        v[u] = *reinterpret_cast<const uint4*>(src + int64_t(rows[i / pieces]) * src_stride + 16 * (i % pieces));
    }
#pragma unroll
    for (int u = 0; u < kCopyUnroll; ++u) {
      const int64_t i = base + int64_t(u) * 256;
      if (i < total) *reinterpret_cast<uint4*>(dst + (i / pieces) * dst_stride + 16 * (i % pieces)) = v[u];
    }
  }
}

std::string s(int64_t v) { return std::to_string(v); }

// The device-visible address of a pinned host pool; refuses pageable memory. The query runs in
// relaxed capture mode so that it stays legal inside a global or thread-local stream capture.
const void* device_view_of_pool(const void* pool, const char* what) {
  cudaPointerAttributes a{};
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  check_cuda(cudaThreadExchangeStreamCaptureMode(&mode), "cudaThreadExchangeStreamCaptureMode");
  const cudaError_t e = cudaPointerGetAttributes(&a, pool);
  check_cuda(cudaThreadExchangeStreamCaptureMode(&mode), "cudaThreadExchangeStreamCaptureMode");
  check_cuda(e, what);
  if (a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged) return pool;
  SMLA_CHECK(a.type == cudaMemoryTypeHost && a.devicePointer != nullptr,
             std::string(what) + " is not pinned: allocate it with cudaHostAlloc or register it with cudaHostRegister "
                                 "(cudaHostRegisterMapped)");
  return a.devicePointer;
}

void check_cuda_limits(const TieredCache& cache) {
  const TieredCacheConfig& c = cache.config();
  SMLA_CHECK(c.hot_slots <= kTieredMaxHotSlots,
             "the CUDA resolver sorts at most " + s(kTieredMaxHotSlots) + " hot slots per request; got R = " + s(c.hot_slots));
  SMLA_CHECK(c.max_tokens_per_request <= kTieredMaxTokensPerRequest,
             "the CUDA resolver takes at most " + s(kTieredMaxTokensPerRequest) + " tokens per request per step; got " +
                 s(c.max_tokens_per_request));
}

}  // namespace

void reset_tiered_state(const TieredCache& cache, void* state, size_t state_bytes, void* stream) {
  const TieredStateLayout& L = cache.state_layout();
  SMLA_CHECK(state != nullptr && state_bytes >= L.total,
             "tiered state too small: it needs " + s(int64_t(L.total)) + " bytes; got " + s(int64_t(state_bytes)));
  auto st = static_cast<cudaStream_t>(stream);
  auto* b = static_cast<uint8_t*>(state);
  check_cuda(cudaMemsetAsync(b, 0, L.zero_end, st), "reset_tiered_state");
  check_cuda(cudaMemsetAsync(b + L.zero_end, 0xFF, L.total - L.zero_end, st), "reset_tiered_state");
}

void release_tiered_request(const TieredCache& cache, void* state, size_t state_bytes, int req, void* stream) {
  const TieredStateLayout& L = cache.state_layout();
  const TieredCacheConfig& c = cache.config();
  SMLA_CHECK(state != nullptr && state_bytes >= L.total,
             "tiered state too small: it needs " + s(int64_t(L.total)) + " bytes; got " + s(int64_t(state_bytes)));
  SMLA_CHECK(req >= 0 && req < c.max_requests,
             "request " + s(req) + " has no hot buffer: ids are [0, " + s(c.max_requests) + ")");
  auto st = static_cast<cudaStream_t>(stream);
  auto* b = static_cast<uint8_t*>(state);
  const size_t R = size_t(c.hot_slots);
  check_cuda(cudaMemsetAsync(b + L.stamps + size_t(req) * R * 4, 0, R * 4, st), "release_tiered_request");
  check_cuda(cudaMemsetAsync(b + L.slot_pos + size_t(req) * R * 4, 0xFF, R * 4, st), "release_tiered_request");
  check_cuda(cudaMemsetAsync(b + L.pos_slot + size_t(req) * size_t(c.max_positions) * 4, 0xFF,
                             size_t(c.max_positions) * 4, st),
             "release_tiered_request");
}

void invalidate_tiered_positions(const TieredCache& cache, void* state, size_t state_bytes, const int32_t* req,
                                 const int32_t* pos, int64_t n, void* stream) {
  const TieredStateLayout& L = cache.state_layout();
  const TieredCacheConfig& c = cache.config();
  SMLA_CHECK(state != nullptr && state_bytes >= L.total,
             "tiered state too small: it needs " + s(int64_t(L.total)) + " bytes; got " + s(int64_t(state_bytes)));
  SMLA_CHECK(n >= 0 && (n == 0 || (req != nullptr && pos != nullptr)), "invalidate: req and pos must be [n] int32");
  if (n == 0) return;
  SMLA_CHECK(n <= int64_t(INT32_MAX) * 256, "invalidate: too many entries");
  auto* b = static_cast<uint8_t*>(state);
  constexpr int kBlock = 256;
  invalidate_kernel<<<unsigned((n + kBlock - 1) / kBlock), kBlock, 0, static_cast<cudaStream_t>(stream)>>>(
      req, pos, n, c.hot_slots, c.max_requests, c.max_positions, reinterpret_cast<uint32_t*>(b + L.stamps),
      reinterpret_cast<int32_t*>(b + L.slot_pos), reinterpret_cast<int32_t*>(b + L.pos_slot));
  check_launch("invalidate_kernel");
}

// The one-grid step's workers per request for a call of this shape (0: the two-kernel path): one
// token per request with req_of_token null, R <= 4608, 1 <= K <= 8192, no hook of the two-kernel
// path set (copy blocks, late copy, early reads), and num_reqs x (1 + G) blocks
// resident at once on the current device (the cooperative launch's condition).
static int one_grid_workers(const TieredCache& cache, int num_reqs, int topk, bool req_of_token_null) {
  const int g = tiered::onegrid_workers(topk);
  if (one_grid_mode == 1 || g == 0 || !req_of_token_null || num_reqs < 1 ||
      cache.config().hot_slots > kThreads * kItemsSmall || copy_blocks_override != 0 || copy_late ||
      early_read_mode != 0)
    return 0;
  constexpr int kSmem = int(sizeof(OneGridSmem));
  // The attribute is set on every call: it belongs to the current device, and the call is cheap.
  check_cuda(cudaFuncSetAttribute(onegrid_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem),
             "onegrid_kernel shared-memory attribute");
  int dev = 0, sms = 0, per_sm = 0, coop = 0;
  check_cuda(cudaGetDevice(&dev), "cudaGetDevice");
  check_cuda(cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, dev), "cudaDeviceGetAttribute");
  if (coop == 0) return 0;
  check_cuda(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), "cudaDeviceGetAttribute");
  check_cuda(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, onegrid_kernel, kThreads, kSmem),
             "onegrid_kernel occupancy");
  return int64_t(num_reqs) * (g + 1) <= int64_t(per_sm) * sms ? g : 0;
}

void resolve_tiered(const TieredCache& cache, const TieredResolveParams& p, void* stream) {
  cache.check(p);
  check_cuda_limits(cache);
  SMLA_CHECK(p.workspace_bytes >= cache.workspace_bytes() && (cache.workspace_bytes() == 0 || p.workspace),
             "tiered workspace too small: it needs " + s(int64_t(cache.workspace_bytes())) + " bytes; got " +
                 s(int64_t(p.workspace_bytes)));
  SMLA_CHECK(reinterpret_cast<uintptr_t>(p.workspace) % 16 == 0,
             "tiered workspace must be 16-byte aligned (cudaMalloc memory is)");
  SMLA_CHECK(p.num_tokens <= INT32_MAX, "resolve_tiered: at most 2^31 - 1 tokens per step");
  const TieredCacheConfig& c = cache.config();
  const TieredStateLayout& L = cache.state_layout();
  auto* base = static_cast<uint8_t*>(p.state);
  // A step without tokens still needs a pool pointer only when it copies; T = 0 copies nothing.
  const void* pool = p.num_tokens > 0 ? device_view_of_pool(p.pool, "the host pool") : nullptr;

  ResolveParams k{};
  k.positions = p.positions, k.pos_stride_t = p.pos_stride_t, k.num_tokens = p.num_tokens, k.topk = p.topk;
  k.req_of_token = p.req_of_token, k.num_reqs = p.num_reqs, k.seq_lens = p.seq_lens;
  k.pool_rows = p.pool_rows, k.block_table = p.block_table, k.bt_stride = p.bt_stride;
  k.max_blocks = p.max_blocks, k.block_size = p.block_size, k.block_stride_rows = p.block_stride_rows;
  k.R = c.hot_slots, k.max_tokens_per_request = c.max_tokens_per_request, k.max_positions = c.max_positions;
  k.row_bytes = cache.row_bytes();
  k.ctr = reinterpret_cast<TieredCounters*>(base + L.counters);
  k.stamps = reinterpret_cast<uint32_t*>(base + L.stamps);
  k.slot_pos = reinterpret_cast<int32_t*>(base + L.slot_pos);
  k.pos_slot = reinterpret_cast<int32_t*>(base + L.pos_slot);
  k.pool = static_cast<const uint8_t*>(pool), k.pool_stride = p.pool_row_stride_bytes;
  k.hot = static_cast<uint8_t*>(p.hot), k.hot_stride = cache.hot_row_stride_bytes();
  k.phys = p.phys, k.phys_stride_t = p.phys_stride_t, k.counts = p.counts;
  // The workspace: miss counts [max_requests] (one 256-byte-aligned block), then the copy lists.
  auto* ws = static_cast<uint8_t*>(p.workspace);
  k.miss_count = reinterpret_cast<int32_t*>(ws);
  k.jobs = reinterpret_cast<CopyJob*>(ws + (size_t(c.max_requests) * sizeof(int32_t) + 255) / 256 * 256);
  static_assert(sizeof(CopyJob) == 8, "the workspace size in TieredCache counts 8 bytes per copy job");

  auto st = static_cast<cudaStream_t>(stream);
  const unsigned grid = unsigned(p.num_reqs > 0 ? p.num_reqs : 1);

  // copy_kernel's blocks per request: enough for the most a request can miss (R - 1 rows, or its
  // tokens' K entries) at kCopyPiecesPerThread pieces per thread, at most kTieredCopyFlags, and
  // at most about kCopyBlocksPerSm x #SMs blocks in all (one wave beside the resolve blocks; a
  // thread then takes up to kCopyRoundUnroll pieces per round). Depends on (num_reqs, topk) and
  // the device only; decided before any launch, since the resolve blocks raise that many flags.
  int dev = 0, sms = 0;
  check_cuda(cudaGetDevice(&dev), "cudaGetDevice");
  check_cuda(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), "cudaDeviceGetAttribute");
  const int pieces = k.row_bytes / 16;
  const int64_t max_rows = std::min<int64_t>(c.hot_slots - 1, int64_t(c.max_tokens_per_request) * p.topk);
  constexpr int kCopyPiecesPerThread = 4;
  const int64_t per_block = int64_t(kCopyThreads) * kCopyPiecesPerThread;
  const int64_t want = std::max<int64_t>(1, (max_rows * pieces + per_block - 1) / per_block);
  const int64_t cap = std::max<int64_t>(1, int64_t(sms) * kCopyBlocksPerSm / std::max(1, p.num_reqs));
  int blocks_per_req = int(std::min<int64_t>(std::min(want, cap), kTieredCopyFlags));
  if (copy_blocks_override > 0) blocks_per_req = std::min(copy_blocks_override, kTieredCopyFlags);
  k.copy_flags = reinterpret_cast<uint32_t*>(base + L.copy_flags);
  k.copy_blocks_per_req = blocks_per_req;
  // Early mode (copy_early): one token per request (token t -> request t, or a request map with at
  // most one token per request), and every entry of a token held by one copy thread. Depends on
  // the call's shape only, like the grid.
  const bool early_on = early_read_mode == 0 || early_read_mode >= 2;
  k.phase = phase_buffer;
  k.early = early_on && !copy_late && (p.req_of_token == nullptr || c.max_tokens_per_request == 1) &&
            int64_t(blocks_per_req) * kCopyThreads >= p.topk;

  // The one-grid step (onegrid_kernel, s13) where the call's shape allows it: one token per request
  // (req_of_token null), R <= 4608 and a grid that fits the device at once. A test or benchmark hook
  // of the two-kernel path (copy blocks, late copy, early reads) keeps that path.
  const int og_workers = one_grid_workers(cache, p.num_reqs, p.topk, p.req_of_token == nullptr);
  if (og_workers > 0) {
    const int64_t blocks = int64_t(p.num_reqs) * (og_workers + 1);
    ResolveParams g = k;
    g.early = 0, g.copy_blocks_per_req = 0;
    g.copy_flags = reinterpret_cast<uint32_t*>(base + L.copy_flags);
    const int per = tiered::onegrid_entries(p.topk, og_workers);
    cudaLaunchConfig_t lc{};
    lc.gridDim = dim3(unsigned(blocks));
    lc.blockDim = dim3(kThreads);
    lc.dynamicSmemBytes = sizeof(OneGridSmem);
    lc.stream = st;
    cudaLaunchAttribute attr{};
    attr.id = cudaLaunchAttributeCooperative;  // the blocks wait on one another: all resident at once
    attr.val.cooperative = 1;
    lc.attrs = &attr;
    lc.numAttrs = 1;
    const cudaError_t e = cudaLaunchKernelEx(&lc, onegrid_kernel, g, og_workers, per);
    if (e != cudaErrorCooperativeLaunchTooLarge) {
      check_cuda(e, "onegrid_kernel launch (cooperative)");
      check_launch("onegrid_kernel");
      return;
    }
    // The device cannot hold the grid at once now (another context holds SMs): nothing was launched;
    // the two-kernel path below resolves the step instead.
    (void)cudaGetLastError();
  }

  // The attribute is set on every call: it belongs to the current device, and the call is cheap.
  if (c.hot_slots <= kThreads * kItemsSmall) {
    constexpr int kSmem = int(sizeof(ResolveSmem<kItemsSmall>));
    check_cuda(cudaFuncSetAttribute(resolve_kernel_9, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem),
               "resolve_kernel shared-memory attribute");
    resolve_kernel_9<<<grid, kThreads, kSmem, st>>>(k);
  } else {
    constexpr int kSmem = int(sizeof(ResolveSmem<kItemsLarge>));
    check_cuda(cudaFuncSetAttribute(resolve_kernel_16, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem),
               "resolve_kernel shared-memory attribute");
    resolve_kernel_16<<<grid, kThreads, kSmem, st>>>(k);
  }
  check_launch("resolve_kernel");
  // Launched whenever resolve_kernel raised flags (T = 0 included: every count is then 0 and the
  // pool is not read), so the launch shape depends on (num_reqs, topk) only. It must run after
  // every resolve launch that raised flags: they are cleared only by their copy blocks.
  if (p.num_reqs == 0) return;

  CopyParams cp{};
  cp.flags = k.copy_flags, cp.jobs = k.jobs, cp.pos_slot = k.pos_slot, cp.max_positions = c.max_positions;
  cp.R = c.hot_slots, cp.blocks_per_req = blocks_per_req, cp.pieces = pieces;
  cp.pool = k.pool, cp.pool_stride = k.pool_stride, cp.hot = k.hot, cp.hot_stride = k.hot_stride;
  cp.late = copy_late ? 1 : 0;
  cp.early = k.early, cp.force_late = early_read_mode == 3 ? 1 : 0;
  cp.phase = phase_buffer;
  cp.positions = k.positions, cp.pos_stride_t = k.pos_stride_t, cp.num_tokens = k.num_tokens, cp.topk = k.topk;
  cp.req_of_token = k.req_of_token, cp.seq_lens = k.seq_lens, cp.pool_rows = k.pool_rows;
  cp.block_table = k.block_table, cp.bt_stride = k.bt_stride, cp.max_blocks = k.max_blocks;
  cp.block_size = k.block_size, cp.block_stride_rows = k.block_stride_rows;
  // A PDL launch: its blocks become resident while resolve_kernel runs (every resolve block
  // triggers at its start), start their host reads at their flag and wait in pdl_wait() for its
  // end before storing, so no launch gap and no victim choice sits before the host reads.
  cudaLaunchConfig_t lc{};
  lc.gridDim = dim3(unsigned(int64_t(blocks_per_req) * p.num_reqs));
  lc.blockDim = dim3(kCopyThreads);
  lc.stream = st;
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  lc.attrs = &attr;
  lc.numAttrs = 1;
  check_cuda(cudaLaunchKernelEx(&lc, copy_kernel, cp), "copy_kernel launch (PDL)");
  check_launch("copy_kernel");
}

void set_tiered_copy_blocks_for_testing(int blocks_per_request) { copy_blocks_override = blocks_per_request; }
void set_tiered_copy_late_for_testing(bool late) { copy_late = late; }
void set_tiered_one_grid_for_testing(int mode) { one_grid_mode = mode; }
bool tiered_one_grid_taken(const TieredCache& cache, int num_reqs, int topk, bool req_of_token_null) {
  return one_grid_workers(cache, num_reqs, topk, req_of_token_null) > 0;
}
void set_tiered_early_read_for_testing(int mode) { early_read_mode = mode; }
void set_tiered_phase_buffer_for_testing(uint64_t* stamps) { phase_buffer = stamps; }

void gather_rows_from_host(const void* src, int64_t src_stride, const int32_t* rows, int64_t n, void* dst,
                           int64_t dst_stride, int row_bytes, void* stream) {
  SMLA_CHECK(n >= 0 && row_bytes > 0 && row_bytes % 16 == 0 && src_stride % 16 == 0 && dst_stride % 16 == 0,
             "gather_rows_from_host: row bytes and strides must be positive multiples of 16");
  if (n == 0) return;
  const void* s_dev = device_view_of_pool(src, "gather source");
  int dev = 0, sms = 0;
  check_cuda(cudaGetDevice(&dev), "cudaGetDevice");
  check_cuda(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), "cudaDeviceGetAttribute");
  const int pieces = row_bytes / 16;
  const int64_t total = n * pieces;
  const int64_t blocks = std::min<int64_t>((total + 256 * kCopyUnroll - 1) / (256 * kCopyUnroll), int64_t(sms) * 8);
  gather_kernel<<<unsigned(blocks), 256, 0, static_cast<cudaStream_t>(stream)>>>(
      static_cast<const uint8_t*>(s_dev), src_stride, rows, total, pieces, static_cast<uint8_t*>(dst), dst_stride);
  check_launch("gather_kernel");
}

TieredCounters read_tiered_counters(const TieredCache& cache, const void* state, void* stream) {
  SMLA_CHECK(state != nullptr, "read_tiered_counters: state is null");
  TieredCounters c;
  auto st = static_cast<cudaStream_t>(stream);
  check_cuda(cudaMemcpyAsync(&c, static_cast<const uint8_t*>(state) + cache.state_layout().counters, sizeof(c),
                             cudaMemcpyDeviceToHost, st),
             "read_tiered_counters");
  check_cuda(cudaStreamSynchronize(st), "read_tiered_counters");
  return c;
}

void write_cache_tiered(const TieredCache& cache, const CacheWriteParams& pool_write, const int32_t* hot_rows,
                        void* hot, size_t hot_bytes, void* stream) {
  validate(pool_write);
  const TieredCacheConfig& c = cache.config();
  SMLA_CHECK(pool_write.format == c.format && pool_write.rope_dim == c.rope_dim,
             "write_cache_tiered: the pool write is " + std::string(to_string(pool_write.format)) + " rope_dim " +
                 s(pool_write.rope_dim) + " but the tiered cache is " + std::string(to_string(c.format)) + " rope_dim " +
                 s(c.rope_dim));
  SMLA_CHECK(pool_write.row_stride_bytes % 16 == 0 && reinterpret_cast<uintptr_t>(pool_write.cache) % 16 == 0,
             "write_cache_tiered: the host pool and its row stride must be 16-byte aligned");
  SMLA_CHECK(hot_rows == nullptr || (hot != nullptr && hot_bytes >= cache.hot_buffer_bytes() &&
                                     reinterpret_cast<uintptr_t>(hot) % 16 == 0),
             "write_cache_tiered: hot buffer too small or misaligned: it needs " + s(int64_t(cache.hot_buffer_bytes())) +
                 " bytes, 16-byte aligned; got " + s(int64_t(hot_bytes)));
  if (pool_write.num_tokens == 0) return;
  CacheWriteParams w = pool_write;
  if (w.num_rows > 0) w.cache = const_cast<void*>(device_view_of_pool(pool_write.cache, "the host pool"));
  WriterMirror m;
  if (hot_rows) m.base = hot, m.rows = hot_rows, m.num_rows = cache.hot_rows(), m.row_stride_bytes = cache.hot_row_stride_bytes();
  write_cache_mirrored(w, m, stream);
}

}  // namespace smla::cuda
