// SM90 sparse MLA, the crossover variant (kernel_xo.cuh): where each CTA of a 2-CTA cluster stages
// and writes its half of a tile. No CUDA headers: the kernel and a host test (tests/cpu/
// test_kernel_config.cpp) use the same offsets.
//
// A tile buffer (WsConfig::SharedStorage::kv[b]) is 9 swizzled dim blocks of 64 rows x 128 bytes;
// row r of block k is bytes [k * 8192 + 128 r, + 128). CTA `rank` of the pair (rank = head group)
// dequantizes rows [32 rank, 32 rank + 32) of every tile, so in every block it writes only bytes
// [4096 rank, 4096 rank + 4096): its own rows, in its own buffer and (over DSMEM) in the peer's.
// Its raw staging therefore lives inside its own rows of the half's blocks, where the peer never
// writes: half h (blocks 4h .. 4h + 3; block 8, the RoPE / P block, is the producer's alone) holds
// the latent bytes of its 32 rows (256 each) in blocks 4h + 1 and 4h + 2 (16 rows per block) and
// their four fp32 tile scales (16 bytes each) in block 4h + 3.
#pragma once

#include "cuda/sm90/sparse_mla/config.h"  // (and SMLA_HD, from smla/formats.h)

namespace smla::cuda::sm90::sparse_mla::xo {

inline constexpr int kRows = kBlockK / 2;              // rows a CTA dequantizes per tile
inline constexpr int kOwnBytes = kRows * 128;          // its share of one dim block
inline constexpr int kLatentBytes = kLatent / 2;       // fp8 latent bytes of one half of a row (dims 256 h ..)
inline constexpr int kScaleBytes = 16;                 // a row's four fp32 tile scales
inline constexpr int kPeerBytesPerHalf = kRows * 4 * 128;  // bf16 bytes the peer writes into a half (4 blocks)

// Tile row of local row rl (0..31) of CTA `rank`.
SMLA_HD constexpr int row_of(int rank, int rl) { return kRows * rank + rl; }
// Byte offset (in a tile buffer) of the staged latent bytes of half h of local row rl.
SMLA_HD constexpr int stage_latent(int h, int rank, int rl) {
  return (4 * h + 1 + rl / 16) * WsConfig::kBlockBytes + kOwnBytes * rank + (rl % 16) * kLatentBytes;
}
// ... and of its staged tile scales (fp32 scale s at + 4 s).
SMLA_HD constexpr int stage_scales(int h, int rank, int rl) {
  return (4 * h + 3) * WsConfig::kBlockBytes + kOwnBytes * rank + rl * kScaleBytes;
}
// The 8 raw bytes of 16-byte bf16 chunk c of dim block blk (4h .. 4h + 3) of local row rl: latent
// bytes 64 (blk - 4h) + 8c of the half; and the byte offset of the tile scale they take.
SMLA_HD constexpr int stage_chunk(int h, int rank, int rl, int blk, int c) {
  return stage_latent(h, rank, rl) + (blk - 4 * h) * 64 + c * 8;
}
SMLA_HD constexpr int stage_scale_of(int h, int rank, int rl, int blk) {
  return stage_scales(h, rank, rl) + 4 * (blk / 2);  // tile_width 128 = two 64-dim blocks
}
// The producer's 17 16-byte copies of a half's staged row: copy k < 16 takes stored bytes
// [256 h + 16 k, + 16) (the latent) to stage_latent + 16 k, copy 16 the four scales (stored at
// scale_offset) to stage_scales.
inline constexpr int kStageCopies = kLatentBytes / 16 + 1;
SMLA_HD constexpr int copy_src(int h, int k, int scale_offset) { return k < 16 ? kLatentBytes * h + 16 * k : scale_offset; }
SMLA_HD constexpr int copy_dst(int h, int rank, int rl, int k) {
  return k < 16 ? stage_latent(h, rank, rl) + 16 * k : stage_scales(h, rank, rl);
}
// The register-staged mode (SMLA_SM90_XO_REGS=1, docs/perf-history.md s12-flashmla-h128): no staging
// at all. Producer thread c (the converter in that mode) loads, straight from the stored row into
// registers, the 8 e4m3 bytes of bf16 chunk c of dim block blk (4h .. 4h + 3): stored bytes
// reg_src(blk, c), the same bytes stage_chunk holds in the staged mode; and with one 8-byte load the two fp32 tile scales of half h
// (dims 256 h .. 256 h + 255 span tiles 2h and 2h + 1): stored bytes reg_scales_src(h, scale_offset),
// scale of block blk at + 4 * (blk / 2 - 2h).
SMLA_HD constexpr int reg_src(int blk, int c) { return 64 * blk + 8 * c; }
SMLA_HD constexpr int reg_scales_src(int h, int scale_offset) { return scale_offset + 8 * h; }
SMLA_HD constexpr int reg_scale_slot(int h, int blk) { return blk / 2 - 2 * h; }
// Byte offset of bf16 chunk c of dim block blk of tile row r (the 128-byte swizzle of the wgmma operands).
SMLA_HD constexpr int bf16_chunk(int r, int blk, int c) {
  return blk * WsConfig::kBlockBytes + r * WsConfig::kAtomBytes + ((c ^ (r & 7)) << 4);
}

}  // namespace smla::cuda::sm90::sparse_mla::xo
