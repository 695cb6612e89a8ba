// The CUDA resolver's small-step victim choice (src/cuda/tiered/victims.h), composed on the host from
// the pieces the kernel uses, against the rule of resolve_tiered_reference: the n least-recent slots
// among those the step does not need (stamp order, ties by slot index), paired with the misses in
// position order. Random stamp sets (narrow and wide ranges, many ties, a young cache of stamps 0),
// random and dense slot masks, n from 1 to every candidate, and the refusals.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "cuda/tiered/victims.h"

namespace {

namespace vt = smla::cuda::tiered;

// The reference rule (resolve_tiered_reference): candidates sorted by (stamp, slot), the first n.
std::vector<int32_t> reference_victims(const std::vector<uint32_t>& stamps, const std::vector<uint8_t>& needed,
                                       uint32_t now, int n) {
  std::vector<std::pair<uint32_t, int>> cand;
  for (int sl = 0; sl + 1 < int(stamps.size()); ++sl)
    if (!needed[size_t(sl)] && stamps[size_t(sl)] != now) cand.emplace_back(stamps[size_t(sl)], sl);
  std::sort(cand.begin(), cand.end());
  std::vector<int32_t> out;
  for (int i = 0; i < n && i < int(cand.size()); ++i) out.push_back(cand[size_t(i)].second);
  return out;
}

int candidates(const std::vector<uint32_t>& stamps, const std::vector<uint8_t>& needed, uint32_t now) {
  int c = 0;
  for (int sl = 0; sl + 1 < int(stamps.size()); ++sl) c += !needed[size_t(sl)] && stamps[size_t(sl)] != now;
  return c;
}

// One case: the model equals the reference whenever n candidates exist, and refuses otherwise.
void check_case(const std::vector<uint32_t>& stamps, const std::vector<uint8_t>& needed, uint32_t now, int n,
                const std::string& what) {
  const int R = int(stamps.size());
  std::vector<int32_t> got(size_t(vt::kSmallMisses) + 1, -7);
  const bool ok = vt::select_victims_small_model(stamps.data(), needed.data(), R, now, n, got.data());
  const int c = candidates(stamps, needed, now);
  if (vt::key_end_bit(now) > 31) {
    EXPECT_FALSE(ok) << what << ": a clock of " << now << " needs 64-bit keys (the sorts)";
    return;
  }
  if (n > c) {
    EXPECT_FALSE(ok) << what << ": n = " << n << " > " << c << " candidates must be refused";
    return;
  }
  ASSERT_TRUE(ok) << what << ": n = " << n << ", " << c << " candidates";
  for (int i = n; i <= vt::kSmallMisses; ++i) ASSERT_EQ(got[size_t(i)], -7) << what << ": rank " << i << " >= n written";
  got.resize(size_t(n));
  EXPECT_EQ(got, reference_victims(stamps, needed, now, n)) << what << ": n = " << n << ", R = " << R;
}

TEST(TieredVictims, RandomStampSetsMatchTheReference) {
  std::mt19937_64 rng(12345);
  int cases = 0;
  for (int R : {3, 40, 256, 4224, 4608, 8192}) {
    for (int trial = 0; trial < (R > 1000 ? 40 : 200); ++trial) {
      const uint32_t now = 1 + uint32_t(rng() % 300000);  // past 2^18 the model refuses (64-bit keys)
      // Stamp spread: ties everywhere (1-3 values), the 90 %-reuse steady state (~11 steps), wide.
      const uint32_t spread = std::vector<uint32_t>{1, 3, 11, 200, now}[rng() % 5];
      std::vector<uint32_t> stamps(static_cast<size_t>(R));
      for (auto& s : stamps) {
        const uint32_t back = uint32_t(rng() % std::max<uint32_t>(1, std::min(spread, now)));
        s = rng() % 10 == 0 ? 0u : now - 1 - std::min(back, now - 1);
      }
      for (int i = 0; i < R / 16; ++i) stamps[size_t(rng() % uint64_t(R))] = now;  // stamped by this step already
      std::vector<uint8_t> needed(static_cast<size_t>(R));
      const int density = int(rng() % 100);
      for (auto& b : needed) b = int(rng() % 100) < density;
      const int c = candidates(stamps, needed, now);
      const int ns[] = {1, 2, int(rng() % 257), std::min(c, 256), c, c + 1, 205};
      for (int n : ns) {
        if (n < 1 || n > vt::kSmallMisses) continue;
        check_case(stamps, needed, now, n, "R " + std::to_string(R) + " trial " + std::to_string(trial));
        ++cases;
      }
    }
  }
  EXPECT_GT(cases, 3000);
}

TEST(TieredVictims, TiesAndEdges) {
  // A young cache: every stamp 0, nothing needed: the lowest slots, in slot order.
  {
    std::vector<uint32_t> st(4224, 0u);
    std::vector<uint8_t> need(4224, 0);
    for (int n : {1, 205, 256}) check_case(st, need, 1, n, "all stamps 0");
  }
  // Exactly enough: 256 candidates among 4224 slots, every other slot needed.
  {
    std::vector<uint32_t> st(4224, 7u);
    std::vector<uint8_t> need(4224, 1);
    std::mt19937 rng(3);
    for (int i = 0, placed = 0; placed < 256; ++i) {
      const int sl = int(rng() % 4223);
      if (need[size_t(sl)]) need[size_t(sl)] = 0, st[size_t(sl)] = uint32_t(rng() % 5), ++placed;
    }
    check_case(st, need, 8, 256, "exactly enough");
    check_case(st, need, 8, 255, "one spare");
  }
  // All busy: every slot needed or stamped now: refused for any n.
  {
    std::vector<uint32_t> st(256, 9u);
    std::vector<uint8_t> need(256, 0);
    for (size_t i = 0; i < st.size(); i += 2) need[i] = 1;
    int32_t out[256];
    EXPECT_FALSE(vt::select_victims_small_model(st.data(), need.data(), 256, 9, 1, out));
  }
  // The reserved slot R - 1 is never chosen, even as the only old stamp.
  {
    std::vector<uint32_t> st(8, 5u);
    st[7] = 0;
    std::vector<uint8_t> need(8, 0);
    check_case(st, need, 6, 7, "reserved slot");
    int32_t out[8];
    EXPECT_FALSE(vt::select_victims_small_model(st.data(), need.data(), 8, 6, 8, out));
  }
  // Keys wider than 31 bits (clock >= 2^18) and n past kSmallMisses take the sorts: refused here.
  {
    std::vector<uint32_t> st(600, 1u);
    std::vector<uint8_t> need(600, 0);
    int32_t out[300];
    EXPECT_FALSE(vt::select_victims_small_model(st.data(), need.data(), 600, 1u << 18, 3, out));
    EXPECT_TRUE(vt::select_victims_small_model(st.data(), need.data(), 600, (1u << 18) - 1, 3, out));
    EXPECT_FALSE(vt::select_victims_small_model(st.data(), need.data(), 600, 5, vt::kSmallMisses + 1, out));
    EXPECT_FALSE(vt::select_victims_small_model(st.data(), need.data(), 600, 5, 0, out));
  }
}

TEST(TieredVictims, Pieces) {
  // victim_key orders as (stamp, slot) and marks needed / stamped-now slots as no candidate.
  EXPECT_EQ(vt::victim_key(3, 10, 9, false), (3u << vt::kSlotBits) | 10u);
  EXPECT_EQ(vt::victim_key(3, 10, 9, true), vt::kNoKey);
  EXPECT_EQ(vt::victim_key(9, 10, 9, false), vt::kNoKey);
  EXPECT_LT(vt::victim_key(3, 8191, 9, false), vt::victim_key(4, 0, 9, false));
  EXPECT_EQ(vt::key_slot(vt::victim_key(3, 8191, 9, false)), 8191);
  // key_end_bit is the kernel's kSlotBits + 32 - clz(now).
  EXPECT_EQ(vt::key_end_bit(0), 13);
  EXPECT_EQ(vt::key_end_bit(1), 14);
  EXPECT_EQ(vt::key_end_bit((1u << 18) - 1), 31);
  EXPECT_EQ(vt::key_end_bit(1u << 18), 32);
  EXPECT_EQ(vt::key_end_bit(0xffffffffu), 45);
  // The packed scan flags sum without carry over 8191 keys at s* and 255 below.
  int sum = 0;
  for (int i = 0; i < 8191; ++i) sum += vt::scan_flags((5u << vt::kSlotBits) | uint32_t(i), 5);
  for (int i = 0; i < 255; ++i) sum += vt::scan_flags((4u << vt::kSlotBits) | uint32_t(i), 5);
  EXPECT_EQ(vt::at_index(sum), 8191);
  EXPECT_EQ(vt::below_index(sum), 255);
  EXPECT_EQ(vt::scan_flags(vt::kNoKey, 5), 0);
  EXPECT_EQ(vt::scan_flags((6u << vt::kSlotBits) | 1u, 5), 0);
  // padded_index: distinct banks for a warp's striped writes and its blocked reads (9 and 16 items).
  for (int items : {9, 16}) {
    for (int k = 0; k < items; ++k) {
      std::vector<int> banks_blocked, banks_striped;
      for (int t = 0; t < 32; ++t) {
        banks_blocked.push_back(vt::padded_index(t * items + k) % 32);
        banks_striped.push_back(vt::padded_index(k * 512 + t) % 32);
      }
      std::sort(banks_blocked.begin(), banks_blocked.end());
      std::sort(banks_striped.begin(), banks_striped.end());
      EXPECT_EQ(std::unique(banks_striped.begin(), banks_striped.end()) - banks_striped.begin(), 32) << items;
      // blocked reads: at most 2 lanes per bank
      int worst = 0;
      for (size_t i = 0; i < banks_blocked.size();) {
        size_t j = i;
        while (j < banks_blocked.size() && banks_blocked[j] == banks_blocked[i]) ++j;
        worst = std::max(worst, int(j - i)), i = j;
      }
      EXPECT_LE(worst, 2) << "items " << items << " k " << k;
    }
  }
  // find_sorted: every member found at its index, absent values -1.
  std::mt19937 rng(5);
  for (int n : {0, 1, 2, 7, 205, 256}) {
    std::vector<int32_t> a;
    while (int(a.size()) < n) a.push_back(int32_t(rng() % 100000) * 2);  // even values
    std::sort(a.begin(), a.end());
    a.erase(std::unique(a.begin(), a.end()), a.end());
    for (int i = 0; i < int(a.size()); ++i) EXPECT_EQ(vt::find_sorted(a.data(), int(a.size()), a[size_t(i)]), i);
    for (int i = 0; i < 50; ++i) EXPECT_EQ(vt::find_sorted(a.data(), int(a.size()), int32_t(rng() % 100000) * 2 + 1), -1);
    EXPECT_EQ(vt::find_sorted(a.data(), int(a.size()), -1), -1);
  }
}

}  // namespace
