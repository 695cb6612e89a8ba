// The HiSparse resolver's victim choice for a small step (resolve.cu's assign_slots_small), as
// host-and-device pieces: the LRU key of a slot, one probe of the stamp search, the packed flags of
// the block scan that numbers the chosen keys, and the binary search that finds a miss's rank.
// resolve.cu builds its block-parallel choice from them; select_victims_small_model composes the same
// pieces in one thread, and a host test (tests/cpu/test_tiered_victims.cpp) holds that composition
// to the rule of resolve_tiered_reference (the n least-recent candidate slots, ties by slot index)
// on random stamp sets, ties, exactly-enough and too-few-candidate cases.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#if defined(__CUDACC__)
#define SMLA_TIERED_HD __host__ __device__ __forceinline__
#else
#define SMLA_TIERED_HD inline
#endif

namespace smla::cuda::tiered {

inline constexpr int kSlotBits = 13;  // slot < 8192 (kTieredMaxHotSlots)
inline constexpr uint32_t kNoKey = 0xffffffffu;
inline constexpr uint32_t kSlotMask = (1u << kSlotBits) - 1;
// Steps with at most this many misses (and 32-bit keys) take the choice without sorts.
inline constexpr int kSmallMisses = 256;

// The LRU key of candidate slot `slot` (< R - 1): (stamp << kSlotBits) | slot, distinct per slot and
// ordered as the reference's (stamp, slot) pairs while stamp < 2^(32 - kSlotBits). A slot this step
// needs (marked in the slot mask, or already stamped `now`) is no candidate: kNoKey.
SMLA_TIERED_HD uint32_t victim_key(uint32_t stamp, int slot, uint32_t now, bool needed) {
  return !needed && stamp != now ? (stamp << kSlotBits) | uint32_t(slot) : kNoKey;
}
SMLA_TIERED_HD uint32_t key_stamp(uint32_t key) { return key >> kSlotBits; }
SMLA_TIERED_HD int key_slot(uint32_t key) { return int(key & kSlotMask); }

// Bits of the LRU key at clock `now` (stamps <= now): 32-bit keys (the small path) need <= 31.
SMLA_TIERED_HD int key_end_bit(uint32_t now) {
  int bits = 0;
  for (uint32_t v = now; v != 0; v >>= 1) ++bits;
  return kSlotBits + bits;
}

// The shared-memory word of slot i in the slot-mask mode's transposition buffer: one pad word per
// 32, so striped writes (i = k * 512 + t) and blocked reads (i = t * items + k) avoid bank conflicts
// for items = 9 and 16 alike.
SMLA_TIERED_HD int padded_index(int i) { return i + (i >> 5); }

// One probe of the search for s*, the least stamp s in [lo, hi] with count(candidate stamp <= s) >= n:
// count_le_mid candidates lie at or below mid = lo + (hi - lo) / 2. c0 ends as count(stamp < s*).
SMLA_TIERED_HD void search_step(uint32_t& lo, uint32_t& hi, unsigned& c0, uint32_t mid, unsigned count_le_mid,
                                unsigned n) {
  if (count_le_mid >= n) hi = mid;
  else lo = mid + 1, c0 = count_le_mid;
}

// The block scan's flag of a key once s* is known, two counts packed in one int: 1 << 16 for a
// key below s* (all chosen), 1 for a key at s* (the first n - c0 of them in slot order are chosen).
// The sums stay exact: below < kSmallMisses, at s* < 8192.
SMLA_TIERED_HD int scan_flags(uint32_t key, uint32_t s_star) {
  if (key == kNoKey) return 0;
  const uint32_t s = key_stamp(key);
  return s < s_star ? (1 << 16) : s == s_star ? 1 : 0;
}
SMLA_TIERED_HD int below_index(int packed_offset) { return packed_offset >> 16; }
SMLA_TIERED_HD int at_index(int packed_offset) { return packed_offset & 0xffff; }

// The index of x in the ascending a[0 .. n), or -1 (a miss's rank among the step's sorted misses,
// whose slot is slot_of_rank[rank]).
SMLA_TIERED_HD int find_sorted(const int32_t* a, int n, int32_t x) {
  int lo = 0, hi = n;
  while (lo < hi) {
    const int mid = (lo + hi) >> 1;
    if (a[mid] < x) lo = mid + 1;
    else hi = mid;
  }
  return lo < n && a[lo] == x ? lo : -1;
}

// The small-path choice in one thread, from the same pieces: stamps[0 .. R - 1) (slot R - 1 is the
// clock and never a candidate), needed[sl] != 0 for a slot this step needs, n misses. On success
// slot_of_rank[i] (i < n) is the slot the i-th miss (by position) takes. False where the kernel takes
// the sorts instead (n outside [1, kSmallMisses], keys wider than 31 bits) or fewer than n candidates
// exist (the plan rule forbids that; the kernel never meets it).
inline bool select_victims_small_model(const uint32_t* stamps, const uint8_t* needed, int R, uint32_t now, int n,
                                       int32_t* slot_of_rank) {
  if (n < 1 || n > kSmallMisses || key_end_bit(now) > 31 || R < 2 || R - 1 > int(kSlotMask) + 1) return false;
  std::vector<uint32_t> key(size_t(R - 1));
  uint32_t lo = kNoKey, hi = 0;
  for (int sl = 0; sl < R - 1; ++sl) {
    key[size_t(sl)] = victim_key(stamps[sl], sl, now, needed[sl] != 0);
    if (key[size_t(sl)] == kNoKey) continue;
    lo = std::min(lo, key_stamp(key[size_t(sl)])), hi = std::max(hi, key_stamp(key[size_t(sl)]));
  }
  if (lo == kNoKey) return false;  // no candidate at all
  unsigned c0 = 0;
  while (lo < hi) {
    const uint32_t mid = lo + (hi - lo) / 2;
    unsigned c = 0;
    for (uint32_t k : key) c += k != kNoKey && key_stamp(k) <= mid;
    search_step(lo, hi, c0, mid, c, unsigned(n));
  }
  const uint32_t s_star = lo;
  const int need = n - int(c0);
  // The block scan in slot order (exclusive prefix of the packed flags).
  std::vector<uint32_t> sel(size_t(kSmallMisses), kNoKey);
  int offset = 0;
  for (int sl = 0; sl < R - 1; ++sl) {
    const int f = scan_flags(key[size_t(sl)], s_star);
    if (f == 1 && at_index(offset) < need) slot_of_rank[int(c0) + at_index(offset)] = sl;
    if (f == (1 << 16)) {
      if (below_index(offset) >= kSmallMisses) return false;  // cannot happen: c0 < n
      sel[size_t(below_index(offset))] = key[size_t(sl)];
    }
    offset += f;
  }
  if (below_index(offset) != int(c0) || at_index(offset) < need) return false;  // fewer than n candidates
  for (int i = 0; i < int(c0); ++i) {  // the keys below s*, ranked by counting (distinct keys)
    int rank = 0;
    for (int j = 0; j < int(c0); ++j) rank += sel[size_t(j)] < sel[size_t(i)];
    slot_of_rank[rank] = key_slot(sel[size_t(i)]);
  }
  return true;
}

}  // namespace smla::cuda::tiered
