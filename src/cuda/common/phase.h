// Phase timing of the sparse MLA kernels (`smla bench --phases`), a compile-time option: in a build
// configured with -DSMLA_PHASE_TIMER=ON, the warp-specialized attention kernel and the split merge
// write %globaltimer stamps at a few points of their prologue and epilogue (never inside the tile
// loop) into the buffer a benchmark sets, so a small call's time can be split into launch, loads,
// compute and merge. In every other build the stamps, the buffer pointer in the kernels' params
// and its read at launch are compiled out. Host-callable, no CUDA headers.
#pragma once

#include <cstdint>

namespace smla::cuda::phase {

#if SMLA_PHASE_TIMER
inline constexpr bool kEnabled = true;
#else
inline constexpr bool kEnabled = false;
#endif

inline constexpr int kAttnBlocks = 8192;   // attention blocks recorded (linear block id)
inline constexpr int kAttnEvents = 12;     // stamps per attention block (AttnEvent)
inline constexpr int kMergeBlocks = 8192;  // split-merge blocks recorded
inline constexpr int kMergeEvents = 4;     // stamps per merge block (MergeEvent)
// Buffer layout (uint64 ns): [kAttnBlocks][kAttnEvents], [kMergeBlocks][kMergeEvents], [2] stream.
inline constexpr int kMergeBase = kAttnBlocks * kAttnEvents;
inline constexpr int kStreamBase = kMergeBase + kMergeBlocks * kMergeEvents;
inline constexpr int kWords = kStreamBase + 2;

enum AttnEvent : int {
  kEntry = 0,        // block starts (thread 0)
  kQReady = 1,       // Q in shared memory (consumer 0)
  kIdsIssued = 2,    // producer: tile 0's row ids arrived, its first copies issued
  kTile0Landed = 3,  // consumer 0: tile 0 has landed (both halves) and its scores are issued
  kLoopDone = 4,     // consumer 0: every tile done
  kStored = 5,       // consumer 0: outputs / partials stored
  kProducerDone = 6,  // producer: every copy issued
  kLoopDone1 = 7,     // consumer 1: every tile done
  kRowSums = 8,       // consumer 0: row sums exchanged (both consumers past the loop)
  kNumAttnEvents = 9
};
enum MergeEvent : int { kMergeEntry = 0, kMergeWaited = 1, kMergeDone = 2 };

// The device buffer the launcher passes to the kernels (nullptr: no stamps) when kEnabled. Not
// thread-safe; for benchmarks.
void set_buffer(uint64_t* device_words);
uint64_t* buffer();
// A one-thread kernel writing %globaltimer to slot (a device address) on `stream`.
void stamp(uint64_t* slot, void* stream);

}  // namespace smla::cuda::phase
