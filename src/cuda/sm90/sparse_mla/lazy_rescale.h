// SM90 sparse MLA, the 16-bit caches' lazy O rescale (docs/perf-history.md#s13-bf16blk): the rule
// that moves a row's softmax reference. Host and device: the scorer applies it per row and tile, a
// host test (tests/cpu/test_lazy_rescale.cpp) runs it in a float online softmax against float64.
//
// The online softmax keeps, per row, a reference m (log2 domain), O and l relative to it:
// P = 2^(S - m), l = sum P, O = sum P V. Any m works in exact math as long as O, l and the final
// LSE = m + log2 l use the same one; the kernel's epilogue (io.cuh store_o) does. Today's rule moves
// m to the running max at every tile where it grows, which rescales O (and l) then. The lazy rule
// moves m only when a tile's max exceeds it by more than kLazyRescaleLog2, and then to that max, as
// the eager rule would: P stays <= 2^kLazyRescaleLog2 (fp32 O and l hold that exactly in range;
// bf16 / fp16 P keep their relative precision, fp16's 65504 is far off), and after the first tiles
// of a row the rescale almost never runs. It defers a rescale, it never drops one: m is always a
// value the row's scores reached, so l >= 1 once a valid entry was seen.
#pragma once

#include "smla/formats.h"  // SMLA_HD

namespace smla::cuda::sm90::sparse_mla {

inline constexpr float kLazyRescaleLog2 = 8.0f;

// The reference after a tile whose masked row max (log2 domain, -inf when the tile has no valid
// entry for the row) is tile_max, from reference ref (-inf before any valid entry). -inf + 8 is
// -inf, so the first valid tile always sets it; a NaN tile max keeps ref (as fmaxf did).
SMLA_HD float lazy_ref(float ref, float tile_max) { return tile_max > ref + kLazyRescaleLog2 ? tile_max : ref; }

}  // namespace smla::cuda::sm90::sparse_mla
