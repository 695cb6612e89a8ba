// Host entry points of the SM90 small-head decode kernel for quantized caches (fp8_ds_mla with a
// bf16 q, H <= 32): rows read once, raw, into a deep cp.async ring, dequantized in registers and fed
// to mma.sync with Q in registers (docs/perf-decode.md). Same semantics as cuda::sparse_mla
// (DESIGN.md §1); not routed: an experiment (experiments/decode_small_h/README.md), built only with -DSMLA_BUILD_EXPERIMENTS=ON. No CUDA
// headers: streams travel as void* (a cudaStream_t).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "smla/params.h"

namespace smla::cuda {

// Why this kernel cannot run p ("" = it can): format, q / out dtype, heads, alignment, grid size.
// Also runs validate(p) and reports its message.
std::string decode_small_h_supports(const SparseMlaParams& p);

// The ring schedule at H <= 16 (params.h): 0 two blocks per SM (the default), 1 "deep" (one
// block, 8 stages, a three-step software pipeline), 2 "teams" (one block of two 8-warp teams on
// alternate tiles). SMLA_SM90_DECODE_RING=0/1/2 picks it (read once). H <= 32 always runs 0.
int decode_small_h_ring_env();

struct DecodeDiag;

// Pieces each row's top-k is split into on a device with num_sms SMs (split-K for small T), for
// the variant the environment picks (SMLA_SM90_DECODE_*), or for `variant`.
int decode_small_h_splits(const SparseMlaParams& p, int num_sms);
int decode_small_h_splits(const SparseMlaParams& p, int num_sms, const DecodeDiag& variant);

// Workspace bytes a launch of p needs (0 when no split is needed), enough for any ring; the
// split-K convention of cuda::sparse_mla (plan.h split_workspace_bytes).
size_t decode_small_h_workspace_bytes(const SparseMlaParams& p, int num_sms);

// How K's e4m3 latent becomes an MMA operand (V always uses the bit moves): kBits: bit moves into
// bf16 (3 ALU/FMA instructions per 2 values); kF16: cvt.rn.f16x2.e4m3x2 (1 instruction per 2
// values, q in f16 under a per-head power-of-two scale). kAuto: SMLA_SM90_DECODE_K=f16 or =bits
// (read once), kBits when unset. Both are exact conversions; A/B in docs/perf-decode.md.
enum class DecodeK { kAuto, kBits, kF16 };

// "h16.bits", "h32.f16", "h16.deep.bits", "h16.teams.f16", "h16x2.teams.bits" (H > 16 as two 16-head
// groups: SMLA_SM90_DECODE_H32=split), ...: the instantiation decode_small_h_launch runs for p and k.
std::string decode_small_h_variant(const SparseMlaParams& p, DecodeK k = DecodeK::kAuto);

// Launches DESIGN.md §1 for p on `stream` (device pointers). Validates on the host and throws
// Error (naming the argument) before any launch; never allocates, never synchronizes.
void decode_small_h_launch(const SparseMlaParams& p, void* workspace, size_t workspace_bytes, void* stream,
                           DecodeK k = DecodeK::kAuto);

// For the benchmark: a launch with the variant fixed (K conversion, the ring at H <= 16) and a
// diagnostic mode: 0 normal; 1 rows gathered but no products (the memory pipeline alone); 2
// products on whatever shared memory holds but no rows gathered (the compute alone). Modes 1 and 2
// write meaningless outputs. blocks_per_sm: resident blocks per SM of that instantiation.
struct DecodeDiag {
  DecodeK k = DecodeK::kBits;
  int ring = 0;
  int mode = 0;
  bool split_heads = false;  // H > 16: two 16-head groups on head tile 16 (with `ring`), not head tile 32
};
void decode_small_h_launch_diag(const SparseMlaParams& p, void* workspace, size_t workspace_bytes, void* stream,
                                DecodeDiag d);
int decode_small_h_blocks_per_sm(const SparseMlaParams& p, DecodeDiag d);

// Benchmark ceiling: reads the rows idx[0 .. num_entries) (row_bytes each, 16-byte loads, several
// rows in flight per warp, nothing stored but, in theory, one word to `scratch` so the loads stay);
// entries outside [0, num_rows) are skipped.
void gather_rows_limit(const void* kv, int64_t row_stride_bytes, int64_t num_rows, int row_bytes, const int32_t* idx,
                       int64_t num_entries, uint32_t* scratch, void* stream);

}  // namespace smla::cuda
