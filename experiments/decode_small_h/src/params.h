// SM90 small-head decode kernel for fp8_ds_mla (bf16 q, H <= 32): its params struct and shared-memory
// plan. No CUDA headers (host code may include it). The design and its bound: docs/perf-decode.md.
#pragma once

#include <cstddef>
#include <cstdint>

namespace smla::cuda::sm90::decode {

// What the launcher hands the kernel: validated, strides in elements.
struct DecodeParams {
  int64_t num_tokens;  // T
  int num_heads;       // H (1..32)
  int num_splits;      // blocks per token along the top-k
  int head_groups;     // blocks per token along the heads, 16 kMT heads each (1, or 2 for H > 16 on
                       // head tile 16); blockIdx.x = (t * num_splits + split) * head_groups + group
  int split_len;       // top-k entries per split (a multiple of kRows)
  int topk;            // K, capacity of idx rows
  int row_chunks;      // 16-byte chunks gathered per row: 41 (with RoPE) or 33 (rope_dim 0: latent + scales)
  bool rope;           // D = 576 (RoPE scored) or 512

  const uint16_t* q;  // bf16 [T, H, 576], or [T, H, 512] when q_rope is set
  int64_t q_stride_t, q_stride_h;
  const uint16_t* q_rope;  // nullable: bf16 [T, H, 64]
  int64_t q_rope_stride_t, q_rope_stride_h;
  bool q_vec;  // q / q_rope pointers and strides allow 4-byte (two-element) loads

  const uint8_t* kv;  // row r at kv + r * kv_row_stride_bytes (16-byte aligned)
  int64_t kv_row_stride_bytes;
  int64_t num_rows;

  const int32_t* idx;  // [T, K], row stride idx_stride_t
  int64_t idx_stride_t;
  const int32_t* counts;  // nullable: [T]
  const float* sink;      // nullable: [H]
  float scale_log2;       // softmax_scale * log2(e)

  uint16_t* out;  // bf16 [T, H, 512]
  int64_t out_stride_t, out_stride_h;
  bool out_vec;  // out pointer and strides allow 16-byte stores
  float* lse;    // nullable: [T, H], row stride lse_stride_t
  int64_t lse_stride_t;
  bool lse_base2;
  int mode;  // benchmark diagnostics: 0 normal; 1 rows gathered, no products; 2 products, no rows

  // Split-K scratch (num_splits > 1), the layout of cuda::sparse_mla's merge: partial outputs
  // normalized by their own sum [T, H, S, 512], natural-log LSE [T, H, S] (-inf for an empty split).
  uint16_t* part_out;  // bf16 (smla/workspace.h)
  float* part_lse;
};

inline constexpr int kRowBytes = 656;  // fp8_ds_mla: 512 e4m3, 4 fp32 tile scales, 64 bf16 RoPE
inline constexpr int kScaleOffset = 512;
inline constexpr int kRopeOffset = 528;
inline constexpr int kRows = 32;        // top-k entries per pipeline tile
inline constexpr int kWarps = 8;        // warp w owns latent dims [64 w, 64 w + 64) and RoPE dims [8 w, 8 w + 8)
inline constexpr int kThreads = 32 * kWarps;
inline constexpr int kRedStride = kRows + 4;  // floats per head row of a warp's partial scores (bank spread)
inline constexpr int kPStride = kRows + 8;    // bf16 per head row of P (bank spread)

// The ring schedules (kRing):
// 0: two barriers per tile (scores | softmax | P V), kStages - 1 tiles in flight per block; H <= 16
//    two blocks per SM (registers <= 128, 106 KiB each), H <= 32 one block with 7 stages.
// 1 (H <= 16, "deep"): one block per SM, 8 stages and a three-step software pipeline with one
//    barrier per tile (scores of tile t + 1, softmax of t and P V of t - 1 in the same phase; the
//    exchange arrays double-buffered): 5 tiles (105 KiB) in flight from one block.
// 2 (H <= 16, "teams"): one block of two 8-warp teams per SM sharing an 8-stage ring, team i on
//    the tiles t with t % 2 == i with schedule 0 (its own barrier and exchange arrays), merged at
//    the end: two blocks' worth of warps that are resident together by construction.
// (GPU run 1 in docs/perf-decode.md says why 1 and 2 exist.)
template <int kMT, int kRing = 0>
struct DecodeConfig {
  static_assert(kRing == 0 || kMT == 1, "the deep and team rings are for H <= 16");
  static constexpr int kHeads = 16 * kMT;
  static constexpr int kStages = kRing != 0 ? 8 : kMT == 1 ? 4 : 7;
  static constexpr int kTeams = kRing == 2 ? 2 : 1;
  static constexpr int kBlockThreads = kThreads * kTeams;
  static constexpr int kBlocksPerSm = kMT == 1 && kRing == 0 ? 2 : 1;
  static constexpr int kBufs = kRing != 0 ? 2 : 1;  // exchange arrays: per tile parity (1) or team (2)
  struct SharedStorage {
    alignas(128) uint8_t ring[kStages][kRows * kRowBytes];  // raw rows, 656-byte pitch
    float red[kBufs][kWarps][kHeads][kRedStride];            // each warp's partial S (its dims)
    uint16_t p[kBufs][4][kHeads][kPStride];                   // P times each row's scale of latent tile i (bf16)
    alignas(16) float scl[kBufs][4][kRows];                   // the tile's scales by latent tile, then row
    float alpha[kBufs][kHeads];                               // the tile's O rescale factor per head
    float l_fin[kTeams][kHeads], m_fin[kTeams][kHeads];       // final row sums and maxima
    float qmax[kTeams][kWarps][kHeads];                       // each warp's largest |q| per head
    uint8_t valid[kStages][kRows];                            // entry of the tile is a valid row
  };
  static constexpr size_t kSmemBytes = sizeof(SharedStorage);
  static_assert(kTeams == 1 || size_t(kHeads) * 512 * 4 <= sizeof(SharedStorage::ring),
                "team 1's O is handed over through the ring");
};

static_assert(kRows * kRowBytes % 128 == 0, "ring stages stay 128-byte aligned");
static_assert(DecodeConfig<1>::kSmemBytes * 2 + 2048 <= 228 * 1024, "H <= 16: two blocks per SM");
static_assert(DecodeConfig<2>::kSmemBytes <= 227 * 1024, "H <= 32: shared memory over 227 KiB");
static_assert(DecodeConfig<1, 1>::kSmemBytes <= 227 * 1024, "H <= 16, deep ring: shared memory over 227 KiB");
static_assert(DecodeConfig<1, 2>::kSmemBytes <= 227 * 1024, "H <= 16, two teams: shared memory over 227 KiB");

}  // namespace smla::cuda::sm90::decode
