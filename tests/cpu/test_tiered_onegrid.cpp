// The one-grid B = 1 resolver's host-and-device pieces (src/cuda/tiered/onegrid.h): the cut of a
// request's top-k entries among its worker blocks, the record word a worker hands the chooser, and
// the per-block id segments, composed on the host as the kernel writes them, against the rule of
// resolve_tiered_reference (a token's valid ids in entry order, then -1): equal whenever the chooser
// does not rewrite the row, and a rewrite asked for exactly when a block before the last has an
// invalid entry.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cuda/tiered/onegrid.h"

namespace {

namespace tg = smla::cuda::tiered;

// Every K from 1 to the limit: 1 .. 16 workers, each with at least one entry and at most a block's
// 512 threads of them, contiguous and covering [0, K) once; K outside the range is refused.
TEST(TieredOneGrid, WorkersCoverEveryEntryOnce) {
  EXPECT_EQ(tg::onegrid_workers(0), 0);
  EXPECT_EQ(tg::onegrid_workers(-3), 0);
  EXPECT_EQ(tg::onegrid_workers(16 * 512 + 1), 0);
  EXPECT_EQ(tg::onegrid_workers(2048), 16);  // #21's K: 16 workers of 128 entries
  EXPECT_EQ(tg::onegrid_entries(2048, 16), 128);
  EXPECT_EQ(tg::onegrid_workers(100), 1);
  EXPECT_EQ(tg::onegrid_workers(129), 2);
  for (int K = 1; K <= 16 * 512; ++K) {
    const int g = tg::onegrid_workers(K);
    ASSERT_GE(g, 1) << K;
    ASSERT_LE(g, tg::kOneGridWorkers) << K;
    const int per = tg::onegrid_entries(K, g);
    ASSERT_LE(per, tg::kOneGridMaxEntries) << K;
    int next = 0;
    for (int b = 0; b < g; ++b) {
      const int first = tg::onegrid_first(b, per), count = tg::onegrid_count(K, b, per);
      ASSERT_EQ(first, next) << "K " << K << " block " << b;
      ASSERT_GE(count, 1) << "K " << K << " block " << b << ": a worker without entries";
      ASSERT_LE(count, per) << K;
      next = first + count;
    }
    ASSERT_EQ(next, K) << K;
    ASSERT_EQ(tg::onegrid_count(K, g, per), 0) << K;  // past the last worker: nothing
  }
}

// Every valid and claim count a block can have (0 .. 512), errors over their range, both flags.
TEST(TieredOneGrid, RecordsRoundTrip) {
  for (int valid = 0; valid <= 512; ++valid)
    for (int claims = 0; claims <= 512; claims += (claims < 20 ? 1 : 7))
      for (int errors : {0, 1, 2, 255, 256, 511, 512})
        for (int f = 0; f < 4; ++f) {
          const uint32_t w = tg::pack_record(valid, claims, errors, f & 1, f & 2);
          const tg::OneGridRecord r = tg::unpack_record(w);
          ASSERT_EQ(r.valid, valid);
          ASSERT_EQ(r.claims, claims);
          ASSERT_EQ(r.errors, errors);
          ASSERT_EQ(r.waits, bool(f & 1));
          ASSERT_EQ(r.newest, bool(f & 2));
        }
  EXPECT_EQ(tg::pack_record(0, 0, 0, false, false), 0u);  // an idle record is the between-steps 0
}

// The 64-bit arrival word: the sum of up to 16 workers' arrival_word equals the field-wise totals
// (every field at its largest included), and the chooser's done / fix-up bits and the departures
// added after them stay out of the totals' way.
TEST(TieredOneGrid, ArrivalWordsSumToTheTotals) {
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 20000; ++trial) {
    const int g = 1 + int(rng() % tg::kOneGridWorkers);
    const bool largest = trial % 10 == 0;  // every worker at 512 entries, all of them claims and errors
    uint64_t sum = 0;
    tg::OneGridTotals want;
    for (int b = 0; b < g; ++b) {
      const int valid = largest ? 512 : int(rng() % 513), claims = largest ? 512 : int(rng() % 513);
      const int errors = largest ? 512 : int(rng() % 513);
      const bool waits = largest || rng() % 2, newest = largest || rng() % 2, breaks = largest || rng() % 2;
      sum += tg::arrival_word(valid, claims, errors, waits, newest, breaks);
      want.arrivals += 1, want.waiters += waits, want.newest += newest, want.breaks += breaks;
      want.valid += valid, want.claims += claims, want.errors += errors;
    }
    const tg::OneGridTotals got = tg::unpack_totals(sum);
    ASSERT_EQ(got.arrivals, want.arrivals) << trial;
    ASSERT_EQ(got.waiters, want.waiters) << trial;
    ASSERT_EQ(got.breaks, want.breaks) << trial;
    ASSERT_EQ(got.newest, want.newest) << trial;
    ASSERT_EQ(got.valid, want.valid) << trial;
    ASSERT_EQ(got.claims, want.claims) << trial;
    ASSERT_EQ(got.errors, want.errors) << trial;
    ASSERT_EQ(sum & (tg::kOneGridDone | tg::kOneGridFixup), 0u) << trial << ": totals reach the chooser's bits";
    // After the chooser's word, each waiting worker adds 1: the word equals done (| fix-up) + leavers.
    const uint64_t word = tg::kOneGridDone | (trial % 2 ? tg::kOneGridFixup : 0u);
    ASSERT_EQ(tg::unpack_totals(word + uint64_t(want.waiters)).arrivals, want.waiters) << trial;
    ASSERT_NE(word + uint64_t(want.waiters), uint64_t(want.waiters)) << trial;
  }
}

std::vector<int32_t> compacted(const std::vector<bool>& valid, const std::vector<int32_t>& ids) {
  std::vector<int32_t> out;
  for (size_t j = 0; j < valid.size(); ++j)
    if (valid[j]) out.push_back(ids[j]);
  out.resize(valid.size(), -1);
  return out;
}

void check_row(const std::vector<bool>& valid, const std::vector<int32_t>& ids, const std::string& what) {
  const int K = int(valid.size());
  std::vector<int32_t> out(static_cast<size_t>(K), 777);
  std::unique_ptr<bool[]> v(new bool[size_t(K)]);
  for (int j = 0; j < K; ++j) v[size_t(j)] = valid[size_t(j)];
  const bool fixup = tg::onegrid_ids_model(v.get(), ids.data(), K, out.data());
  // The rewrite is asked for exactly when a block before the last has an invalid entry.
  const int g = tg::onegrid_workers(K), per = tg::onegrid_entries(K, g);
  bool broken = false;
  for (int j = 0; j < std::min(K, (g - 1) * per); ++j) broken |= !valid[size_t(j)];
  EXPECT_EQ(fixup, broken) << what;
  if (!fixup) EXPECT_EQ(out, compacted(valid, ids)) << what;
  for (int32_t x : out) EXPECT_NE(x, 777) << what << ": an entry not written";
}

TEST(TieredOneGrid, SegmentsAreTheCompactedRowUnlessRewritten) {
  std::mt19937_64 rng(20261201);
  const std::vector<int> Ks = {1, 2, 100, 127, 128, 129, 255, 256, 300, 511, 2047, 2048, 2049, 3000, 8191, 8192};
  int rewrites = 0, kept = 0;
  for (int K : Ks)
    for (int trial = 0; trial < 40; ++trial) {
      std::vector<bool> valid(static_cast<size_t>(K));
      std::vector<int32_t> ids(static_cast<size_t>(K));
      for (int j = 0; j < K; ++j) ids[size_t(j)] = 1000 + int32_t(rng() % 100000);  // never the 777 poison
      const int kind = trial % 5;
      for (int j = 0; j < K; ++j) {
        switch (kind) {
          case 0: valid[size_t(j)] = true; break;                    // every entry valid
          case 1: valid[size_t(j)] = rng() % 16 != 0; break;         // a few invalid anywhere
          case 2: valid[size_t(j)] = rng() % 2 == 0; break;          // half
          case 3: valid[size_t(j)] = j < K - int(rng() % 8); break;  // invalid only at the end
          default: valid[size_t(j)] = false; break;                  // an empty row
        }
      }
      if (kind == 4 && K > 1) valid[size_t(rng() % uint64_t(K))] = true;  // one valid entry
      const int g = tg::onegrid_workers(K), per = tg::onegrid_entries(K, g);
      bool broken = false;
      for (int j = 0; j < std::min(K, (g - 1) * per); ++j) broken |= !valid[size_t(j)];
      (broken ? rewrites : kept) += 1;
      check_row(valid, ids, "K " + std::to_string(K) + " trial " + std::to_string(trial));
    }
  EXPECT_GT(rewrites, 50);  // both outcomes are exercised
  EXPECT_GT(kept, 50);
}

// The chooser's miss list (tiered::onegrid_miss_index, each thread for its own job entries) against
// the sequential compaction it replaced (worker by worker, each worker's first claims[b] entries in
// order): the same index for every entry, every list slot [0, sum) filled exactly once, -1 for the
// unclaimed rest. Random claim counts (none, all, some) for every worker count, K from 1 to 8192.
TEST(TieredOneGrid, MissIndexIsTheSequentialCompaction) {
  std::mt19937_64 rng(20261202);
  const std::vector<int> Ks = {1, 2, 100, 127, 128, 129, 300, 511, 2047, 2048, 2049, 3000, 4095, 8191, 8192};
  int checked = 0;
  for (int K : Ks)
    for (int trial = 0; trial < 60; ++trial) {
      const int g = tg::onegrid_workers(K), per = tg::onegrid_entries(K, g);
      int claims[tg::kOneGridWorkers] = {};
      for (int b = 0; b < g; ++b) {
        const int count = tg::onegrid_count(K, b, per);
        const int kind = (trial + b) % 4;
        claims[b] = kind == 0 ? 0 : kind == 1 ? count : int(rng() % uint64_t(count + 1));
      }
      std::vector<int> expect(static_cast<size_t>(K), -1);
      int next = 0;
      for (int b = 0; b < g; ++b)
        for (int i = 0; i < claims[b]; ++i) expect[size_t(tg::onegrid_first(b, per) + i)] = next++;
      std::vector<int> hits(static_cast<size_t>(std::max(next, 1)), 0);
      for (int j = 0; j < K; ++j) {
        const int got = tg::onegrid_miss_index(j, per, claims);
        ASSERT_EQ(got, expect[size_t(j)]) << "K " << K << " trial " << trial << " entry " << j;
        if (got >= 0) {
          ASSERT_LT(got, next);
          ++hits[size_t(got)];
        }
      }
      for (int x = 0; x < next; ++x) ASSERT_EQ(hits[size_t(x)], 1) << "K " << K << " list slot " << x;
      ++checked;
    }
  EXPECT_EQ(checked, 15 * 60);
}

}  // namespace
