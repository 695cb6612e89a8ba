// SM90 sparse MLA, the warp-specialized kernel (bf16 / fp16 caches, the quantized formats
// dequantized to bf16 in shared memory, and fp8 rows read by the fp8 tensor cores for an e4m3 q):
// its params struct, its compile-time constants and its shared-memory plans. No CUDA headers: the
// shared-memory static_asserts hold for any compiler that includes it (host tests may too).
#pragma once

#include <cstddef>
#include <cstdint>

#include "smla/formats.h"

namespace smla::cuda::sm90::sparse_mla {

// How the kernel reads a cache row of format F (DESIGN.md §3, smla::row_layout): bf16 / fp16 rows
// are gathered into shared memory as they are; quantized rows (kQuantized<F>) are gathered raw into
// a staging area and dequantized to bf16 (dequant.h), or read by the fp8 tensor cores as they are
// (WsQ8Config).
template <KvFormat F>
inline constexpr bool kQuantized = row_layout(F).latent_bits < 16;

// What the launcher hands the kernel: validated, strides in elements, scales pre-multiplied.
struct KernelParams {
  int64_t num_tokens;  // T
  int num_heads;       // H (1..128)
  int head_groups;     // blocks per token along heads; group g covers heads [g * block_heads, ...)
                       // grid.x = T * head_groups, head group fastest: a token's groups run together
                       // and share its gathered rows in L2
  int block_heads = 64;  // real heads per 64-row block of the 64-head kernels: always 64 (the launcher
                         // never sets it; session 12's narrow-head experiment, perf-history s12-latency-budget)
  int num_splits;      // blocks per token along the top-k (1: no split, no workspace)
  int topk;            // K, capacity of idx rows
  int raw_chunks;      // 16-byte chunks of a stored row the kernel may read (raw_row_chunks)
  int k_steps;         // 16-wide steps of the QK^T reduction: D / 16 (36 or 32)

  const void* q;       // [T, H, D] 16-bit, or [T, H, 512] when q_rope is set; strides q_stride_*
  int64_t q_stride_t, q_stride_h;
  const void* q_rope;  // nullable: [T, H, 64] 16-bit; strides q_rope_stride_*
  int64_t q_rope_stride_t, q_rope_stride_h;
  bool q_vec16;        // q / q_rope pointers and strides allow 16-byte loads (8-byte for an e4m3 q)
  bool q_e4m3;         // q / q_rope hold e4m3 (the fp8 caches): widened to bf16 exactly on load, or read as
                       // it is by the fp8 score path

  const uint8_t* kv;   // row r at kv + r * kv_row_stride_bytes (16-byte aligned); nullable if num_rows == 0
  int64_t kv_row_stride_bytes;
  int64_t num_rows;

  const int32_t* idx;  // [T, K] int32, row stride idx_stride_t
  int64_t idx_stride_t;
  const int32_t* counts;  // nullable: [T]
  const float* sink;      // nullable: [H]

  float scale_log2;  // softmax_scale * q_scale (* k_scale for fp8_e4m3) * log2(e): scores in the log2 domain
  float out_scale;   // multiplies the output: k_scale for fp8_e4m3 (V kept as exact e4m3), else 1

  void* out;  // [T, H, 512] 16-bit (same type as q), strides out_stride_*
  int64_t out_stride_t, out_stride_h;
  bool out_vec2;  // out pointer and strides allow 4-byte (two-element) stores
  float* lse;     // nullable: [T, H] fp32, row stride lse_stride_t
  int64_t lse_stride_t;
  bool lse_base2;

  // Split-K scratch (num_splits > 1): partial outputs normalized by their own sum, and their
  // natural-log LSE (-inf for an empty split). The partials are bf16 (smla/workspace.h: half the
  // bytes of fp32; bf16 keeps V's range), the merge sums them in fp32.
  uint16_t* part_out;  // [T, H, num_splits, 512] bf16 bits
  float* part_lse;  // [T, H, num_splits] fp32

#if SMLA_PHASE_TIMER
  uint64_t* phase;  // nullable: %globaltimer stamps for `smla bench --phases` (cuda/common/phase.h)
#endif
};

inline constexpr int kLatent = 512;
inline constexpr int kMaxDim = 576;           // smem rows always hold the D = 576 layout
inline constexpr int kBlockK = 64;            // top-k entries per pipeline tile
inline constexpr float kLog2e = 1.4426950408889634f;
inline constexpr float kLn2 = 0.6931471805599453f;

// The warp-specialized variant (head tile 64, kernel_ws.cuh): a producer warpgroup gathers one
// tile at a time with cp.async into two tile buffers (tile i + 1 lands while tile i is computed);
// consumer 0 scores the whole tile (S = Q K^T, 64 x 64), runs the online softmax and adds
// P V for output dims [0, 256) with P from registers; consumer 1 adds P V for dims [256, 512)
// with P (and each row's rescale factor) from shared memory. Each buffer is released in two
// halves (dim blocks 0-3 and 4-8).
struct WsConfig {
  static constexpr int kHeadTile = 64;
  static constexpr int kThreads = 3 * 128;
  // setmaxnreg per warpgroup (see the static_assert below): the scorer holds O, S and the packed
  // P; consumer 1 O and one half's raw bytes; the producer only addresses.
  static constexpr int kScorerRegs = 232;
  static constexpr int kConsumerRegs = 216;  // consumer 1 also dequantizes (quantized formats)
  static constexpr int kProducerRegs = 56;
  static constexpr int kLaunchRegs = 168;  // what ptxas allocates per thread for 384 threads (65536 / 384, rounded down to 8)
  static constexpr int kDimBlocks = kMaxDim / 64;
  static constexpr int kAtomBytes = 64 * 2;
  static constexpr int kBlockBytes = 64 * kAtomBytes;  // one (64 rows, 64 dims) swizzled block: 8 KiB
  struct SharedStorage {
    alignas(1024) uint16_t q[kDimBlocks][64 * 64];       // (9, 64 heads, 64)
    alignas(1024) uint16_t kv[2][kDimBlocks][64 * 64];   // tile i in buffer i % 2; once S is done,
                                                         // its dim block 8 holds the tile's P (bf16)
    float f[2][64];                                      // [tile % 2] each row's O rescale factor
    float l_part[2][64];                                 // row sums at the end (consumer 1's: 0)
    float m_final[64];                                   // the final row max (for consumer 1)
    uint64_t full[2][2];                                 // [buffer][half] rows landed (quantized: dequantized)
    uint64_t raw[2][2];                                  // [buffer][half] quantized: raw bytes landed
    uint64_t empty[2][2];                                // [buffer][half] consumers done with it
    uint64_t q_ready;                                    // both consumers' Q stores done (256 arrivals, once)
    uint64_t sums_ready;                                 // both consumers' row sums stored (256 arrivals, once)
  };
  static constexpr size_t kSmemBytes = sizeof(SharedStorage);
};

// The warp-specialized variant for an e4m3 q over fp8 rows (fp8_e4m3, fp8_ds_mla): S = Q K^T runs
// on the fp8 tensor cores straight from the gathered bytes (m64n64k32 e4m3, K-major), so the rows
// stay raw in two stages; consumer 1 dequantizes only V (dims 0-511) into one bf16 buffer, half
// 0 (dims 0-255, the scorer's P V) and half 1 (dims 256-511, its own). Same registers and warp
// roles as WsConfig.
struct WsQ8Config {
  static constexpr int kBlockBytes = WsConfig::kBlockBytes;  // 64 rows x 128 bytes, 128-byte swizzle
  static constexpr int kQkBlocks = 5;  // e4m3 dims 0-127, ..., 384-511, then the RoPE block
                                       // (fp8_e4m3: e4m3 in its first 64 bytes; fp8_ds_mla: bf16)
  struct SharedStorage {
    alignas(1024) uint8_t q[kQkBlocks][kBlockBytes];     // (64 heads, 576) e4m3 (+ bf16 RoPE for ds_mla)
    alignas(1024) uint8_t k[2][kQkBlocks][kBlockBytes];  // tile i's raw rows in stage i % 2, as q
    alignas(1024) uint16_t v[8][64 * 64];                // bf16 V of the tile being multiplied
    alignas(1024) uint16_t p[2][64 * 64];                // [tile % 2] P (64 heads x 64 entries)
    float ks[2][kBlockK][4];                             // fp8_ds_mla: each stage row's tile scales
    float f[2][64];                                      // [tile % 2] each row's O rescale factor
    float l_part[2][64];
    float m_final[64];
    uint64_t full[2];   // [stage] raw rows landed (128 producer threads)
    uint64_t empty[2];  // [stage] S done (128 scorer threads) and V dequantized (128 consumer 1 threads)
    uint64_t vfull;     // V half 0 of the next tile dequantized (consumer 1)
    uint64_t vempty;    // the scorer's P V done with V half 0
    uint64_t q_ready;     // both consumers' Q stores done (256 arrivals, once)
    uint64_t sums_ready;  // both consumers' row sums stored (256 arrivals, once)
  };
  static constexpr size_t kSmemBytes = sizeof(SharedStorage);
};

// Quantized formats on the dequantizing path: each half of a buffer is gathered raw by the producer
// into a staging area inside that half, then dequantized in place by consumer 1 (convert.cuh).
// Raw bytes of half h (0: dims 0-255, 1: dims 256-511 and the RoPE block) staged as segment 0 then
// segment 1, `bytes` per row, rows `bytes` apart from dim block `block` of the half's buffer.
struct StageHalf {
  int block, bytes, off0, len0, off1;  // segment 0 = [off0, off0 + len0), segment 1 = [off1, off1 + bytes - len0)
};
template <KvFormat kFormat>
struct StageLayout;
template <>
struct StageLayout<KvFormat::kFP8E4M3> {  // [0,512) e4m3 latent, [512,576) e4m3 RoPE
  static constexpr RowLayout L = row_layout(KvFormat::kFP8E4M3);
  static constexpr int kHalf = L.latent_bytes / 2;  // latent bytes of one half (dims 0-255 | 256-511)
  static constexpr StageHalf h[2] = {{2, kHalf, 0, kHalf, 0}, {6, L.bytes - kHalf, kHalf, L.bytes - kHalf, 0}};
};
template <>
struct StageLayout<KvFormat::kFP8DsMla> {  // [0,512) e4m3, [512,528) 4 fp32 scales, [528,656) bf16 RoPE
  static constexpr RowLayout L = row_layout(KvFormat::kFP8DsMla);
  static constexpr int kHalf = L.latent_bytes / 2;
  static constexpr int kScales = L.num_scales * L.scale_bytes;  // every tile scale with each half
  // (the bf16 RoPE is not staged: the producer copies it straight to dim block 8)
  static constexpr StageHalf h[2] = {{1, kHalf + kScales, 0, kHalf, L.scale_offset},
                                     {5, kHalf + kScales, kHalf, kHalf, L.scale_offset}};
};
template <>
struct StageLayout<KvFormat::kNvFP4DsMla> {  // [0,256) e2m1, [256,320) e4m3 RoPE, [320,352) e4m3 scales
  static constexpr RowLayout L = row_layout(KvFormat::kNvFP4DsMla);
  static constexpr int kHalf = L.latent_bytes / 2;
  static constexpr int kScales = L.num_scales * L.scale_bytes;
  // half 0: its latent bytes and the scales; half 1: the rest of the row from its latent bytes on
  static constexpr StageHalf h[2] = {{2, kHalf + kScales, 0, kHalf, L.scale_offset},
                                     {6, L.bytes - kHalf, kHalf, L.bytes - kHalf, 0}};
};
// A half's staging area (64 rows) fits its dim blocks from `block` on: [block, 4) for half 0,
// [block, 9) for half 1.
template <KvFormat F>
constexpr bool stage_fits() {
  constexpr auto& h = StageLayout<F>::h;
  return kBlockK * h[0].bytes <= (4 - h[0].block) * WsConfig::kBlockBytes &&
         kBlockK * h[1].bytes <= (WsConfig::kDimBlocks - h[1].block) * WsConfig::kBlockBytes;
}
static_assert(stage_fits<KvFormat::kFP8E4M3>() && stage_fits<KvFormat::kFP8DsMla>() && stage_fits<KvFormat::kNvFP4DsMla>(),
              "a staging area runs past its half of the tile buffer");

inline constexpr size_t kSmemLimit = 227 * 1024;  // SM90 opt-in per-block limit
static_assert(WsConfig::kSmemBytes <= kSmemLimit, "warp-specialized variant: shared memory over 227 KiB");
static_assert(WsQ8Config::kSmemBytes <= kSmemLimit, "warp-specialized e4m3 variant: shared memory over 227 KiB");
static_assert(offsetof(WsConfig::SharedStorage, kv) % 1024 == 0,
              "warp-specialized operands must start on 1024-byte swizzle atoms");
// setmaxnreg.inc only takes registers that setmaxnreg.dec gave back inside the block: the
// consumers' growth must fit in what the producer releases, or they wait forever (a hang, not
// an error: measured on the H200 with 216 / 80).
static_assert((WsConfig::kScorerRegs - WsConfig::kLaunchRegs) + (WsConfig::kConsumerRegs - WsConfig::kLaunchRegs) <=
                  WsConfig::kLaunchRegs - WsConfig::kProducerRegs,
              "warp-specialized kernel: consumer registers exceed what the producer releases");

// 16-byte chunks of a stored row that the kernel gathers: the whole row with RoPE. Without RoPE a
// row whose RoPE comes last stops before it (16-bit, fp8_e4m3: their shorter row; fp8_ds_mla:
// after the scales, its 656-byte row keeps its size); nvfp4_ds_mla reads all 352 bytes (its RoPE
// sits between the values and the scales).
inline int raw_row_chunks(KvFormat f, int rope_dim) {
  const RowLayout L = row_layout(f);
  if (rope_dim > 0) return L.bytes / 16;
  const bool rope_last = L.rope_offset + kRopeDim * dtype_bytes(L.rope_dtype) == L.bytes;
  return (rope_last ? L.rope_offset : L.bytes_no_rope) / 16;
}

// Blocks per token along the heads: groups of 64 (heads past H zero-padded).
inline int head_groups_for(int num_heads) { return (num_heads + 63) / 64; }

}  // namespace smla::cuda::sm90::sparse_mla
