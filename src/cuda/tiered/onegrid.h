// The one-grid B = 1 resolver (s13, resolve.cu's onegrid_kernel) as host-and-device pieces: how a
// request's top-k entries are cut among its worker blocks, the record word each worker hands the
// chooser, and when the workers' per-block id segments are already the row compacted in entry
// order (else the chooser rewrites the row: the fix-up). onegrid_ids_model composes them in one
// thread; tests/cpu/test_tiered_onegrid.cpp holds it to the compaction rule of
// resolve_tiered_reference (valid ids in entry order, then -1) on random validity patterns.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define SMLA_ONEGRID_HD __host__ __device__ __forceinline__
#else
#define SMLA_ONEGRID_HD inline
#endif

namespace smla::cuda::tiered {

// Worker blocks per request: one per kOneGridEntries entries, at most kOneGridWorkers; a worker's
// threads take one entry each (at most kOneGridMaxEntries: the block's 512 threads).
inline constexpr int kOneGridEntries = 128;
inline constexpr int kOneGridWorkers = 16;
inline constexpr int kOneGridMaxEntries = 512;

// Workers for top-k K (0: the one-grid path does not take K: K < 1 or K > 16 x 512).
SMLA_ONEGRID_HD int onegrid_workers(int topk) {
  if (topk < 1 || topk > kOneGridWorkers * kOneGridMaxEntries) return 0;
  const int g = (topk + kOneGridEntries - 1) / kOneGridEntries;
  return g < kOneGridWorkers ? g : kOneGridWorkers;
}
// Entries per worker (the last may have fewer, never none: (G - 1) x E < K <= G x E).
SMLA_ONEGRID_HD int onegrid_entries(int topk, int workers) { return (topk + workers - 1) / workers; }
SMLA_ONEGRID_HD int onegrid_first(int b, int per) { return b * per; }
SMLA_ONEGRID_HD int onegrid_count(int topk, int b, int per) {
  const int left = topk - b * per;
  return left < per ? (left > 0 ? left : 0) : per;
}

// A worker's record (one 32-bit word of the state's hand-off area, 0 between steps): its valid
// entries (<= 512: 10 bits), its claimed misses (10 bits), its error entries (10 bits), whether it
// waits for the chooser (an entry whose slot the victim choice gives), whether it saw the newest row.
struct OneGridRecord {
  int valid = 0, claims = 0, errors = 0;
  bool waits = false, newest = false;
};
SMLA_ONEGRID_HD uint32_t pack_record(int valid, int claims, int errors, bool waits, bool newest) {
  return uint32_t(valid) | uint32_t(claims) << 10 | uint32_t(errors) << 20 | (waits ? 1u << 30 : 0u) |
         (newest ? 1u << 31 : 0u);
}
SMLA_ONEGRID_HD OneGridRecord unpack_record(uint32_t w) {
  OneGridRecord r;
  r.valid = int(w & 1023u), r.claims = int((w >> 10) & 1023u), r.errors = int((w >> 20) & 1023u);
  r.waits = (w >> 30) & 1u, r.newest = (w >> 31) & 1u;
  return r;
}

// The hand-off word (64 bits: words 0 and 1 of the request's area). Each worker arrives by adding
// arrival_word(...) of its counts, so that the chooser reads the step's totals with the arrival count
// (an all-hit step needs nothing else); the chooser then stores kOneGridDone (| kOneGridFixup when
// it rewrote the row), each waiting worker adds 1 on leaving, and the chooser stores 0 once all have.
// Fields (low to high): arrivals 5 bits, waiting workers 5, workers that break the row 5, workers
// that saw the newest row 5, valid entries 14, claims 14, errors 14: sums of at most 16 workers of
// at most 512 entries each (K <= 8192) never carry out of a field.
inline constexpr uint64_t kOneGridDone = uint64_t(1) << 63;
inline constexpr uint64_t kOneGridFixup = uint64_t(1) << 62;
inline constexpr int kOneGridRecordWord = 8;  // worker b's record: word 8 + b

struct OneGridTotals {
  int arrivals = 0, waiters = 0, breaks = 0, newest = 0, valid = 0, claims = 0, errors = 0;
};
SMLA_ONEGRID_HD uint64_t arrival_word(int valid, int claims, int errors, bool waits, bool newest, bool breaks) {
  return uint64_t(1) | uint64_t(waits ? 1 : 0) << 5 | uint64_t(breaks ? 1 : 0) << 10 | uint64_t(newest ? 1 : 0) << 15 |
         uint64_t(valid) << 20 | uint64_t(claims) << 34 | uint64_t(errors) << 48;
}
SMLA_ONEGRID_HD OneGridTotals unpack_totals(uint64_t w) {
  OneGridTotals t;
  t.arrivals = int(w & 31u), t.waiters = int((w >> 5) & 31u), t.breaks = int((w >> 10) & 31u);
  t.newest = int((w >> 15) & 31u), t.valid = int((w >> 20) & 16383u), t.claims = int((w >> 34) & 16383u);
  t.errors = int((w >> 48) & 16383u);
  return t;
}

// Worker b writes its valid entries' ids compacted from first(b), and -1 over the rest of its
// range. Those segments are the row compacted in entry order exactly when every worker but the last
// has all its entries valid; otherwise the chooser rewrites the row (the fix-up).
// Whether worker b's segment breaks the compaction (it is not the last and has an invalid entry).
SMLA_ONEGRID_HD bool onegrid_breaks_row(int valid, int b, int workers, int topk, int per) {
  return b + 1 < workers && valid != onegrid_count(topk, b, per);
}
SMLA_ONEGRID_HD bool onegrid_needs_fixup(const int* valid, int workers, int topk, int per) {
  bool fix = false;
  for (int b = 0; b < workers; ++b) fix |= onegrid_breaks_row(valid[b], b, workers, topk, per);
  return fix;
}

// The chooser's miss list: entry j of the request's job list (worker b = j / per's segment, index
// i = j - b per) holds a claimed position when i < claims[b]; it goes to the list at the claims of the
// workers before b plus i (the workers' segments in worker order), else -1. Each chooser thread
// computes it for its own entries from the G claim counts (no serial prefix step).
SMLA_ONEGRID_HD int onegrid_miss_index(int j, int per, const int* claims) {
  const int b = j / per, i = j - b * per;
  if (i >= claims[b]) return -1;
  int off = 0;
  for (int c = 0; c < b; ++c) off += claims[c];
  return off + i;
}

// One thread's composition of the workers' id writes for one token row: ids[j] is entry j's id when
// is_valid[j], out gets what the kernel leaves before any fix-up (per-block segments); returns
// whether the chooser rewrites the row.
inline bool onegrid_ids_model(const bool* is_valid, const int32_t* ids, int topk, int32_t* out) {
  const int g = onegrid_workers(topk), per = onegrid_entries(topk, g);
  int valid[kOneGridWorkers] = {};
  for (int b = 0; b < g; ++b) {
    const int first = onegrid_first(b, per), count = onegrid_count(topk, b, per);
    int n = 0;
    for (int t = 0; t < count; ++t)
      if (is_valid[first + t]) out[first + n++] = ids[first + t];
    for (int t = n; t < count; ++t) out[first + t] = -1;
    valid[b] = n;
  }
  return onegrid_needs_fixup(valid, g, topk, per);
}

}  // namespace smla::cuda::tiered
