// smla/formats.h — byte-exact KV row codecs (DESIGN.md §3). These are the definition the
// tests and every kernel are held to.
//
//   bf16 / fp16   1152 B (1024 without RoPE): 512 latent, then 64 RoPE values
//   fp8_e4m3       576 B (512): e4m3(x / k_scale) for every value
//   fp8_ds_mla     656 B: [0,512) e4m3 latent by 128-wide tiles, [512,528) 4 fp32 tile scales,
//                         [528,656) 64 bf16 RoPE
//   nvfp4_ds_mla   352 B: [0,256) e2m1 pairs (low nibble = even element), [256,320) 64 e4m3
//                         RoPE, [320,352) 32 e4m3 block scales at 320 + 8*(s&3) + (s>>2)
//
// The two ds_mla formats keep their size when rope_dim = 0: the RoPE bytes are written as zero
// and never read.
#pragma once

#include <cstddef>
#include <cstdint>

#include "smla/types.h"

namespace smla {

// Where each part of a row of one format lives (DESIGN.md §3), in bytes from the row's start. The
// one table of row layouts: the codecs, the cache writers, the kernels' dequantizers and stage
// layouts, the tools and the tests read it instead of writing the numbers again. constexpr, so
// device code may read it too.
struct RowLayout {
  int bytes;           // row size with RoPE (D = 576)
  int bytes_no_rope;   // row size with rope_dim = 0 (the ds_mla formats keep their size)
  int latent_bits;     // bits per stored latent value: 16, 8 (e4m3) or 4 (e2m1)
  int latent_bytes;    // bytes of the 512 stored latent values, from offset 0
  int scale_offset;    // per-row scales: offset, count, bytes each (count 0: none)
  int num_scales;
  int scale_bytes;     // 4: fp32 (fp8_ds_mla), 1: e4m3 (nvfp4_ds_mla)
  int tile_width;      // latent values per scale (0: no per-row scales)
  int rope_offset;     // the 64 RoPE values
  DType rope_dtype;    // how they are stored: bf16, fp16 or e4m3
  DType latent_dtype;  // bf16, fp16, e4m3 for 16- and 8-bit latents; kU8 for packed e2m1 pairs
};

constexpr RowLayout row_layout(KvFormat format) {
  switch (format) {
    case KvFormat::kBF16: return {1152, 1024, 16, 1024, 0, 0, 0, 0, 1024, DType::kBF16, DType::kBF16};
    case KvFormat::kFP16: return {1152, 1024, 16, 1024, 0, 0, 0, 0, 1024, DType::kFP16, DType::kFP16};
    case KvFormat::kFP8E4M3: return {576, 512, 8, 512, 0, 0, 0, 0, 512, DType::kE4M3, DType::kE4M3};
    case KvFormat::kFP8DsMla: return {656, 656, 8, 512, 512, 4, 4, 128, 528, DType::kBF16, DType::kE4M3};
    case KvFormat::kNvFP4DsMla: return {352, 352, 4, 256, 320, 32, 1, 16, 256, DType::kE4M3, DType::kU8};
  }
  return {};
}

#ifndef SMLA_HD  // host and device under nvcc (as in smla/numeric.h)
#if defined(__CUDACC__)
#define SMLA_HD __host__ __device__ __forceinline__
#else
#define SMLA_HD inline
#endif
#endif

// Byte offset of nvfp4_ds_mla's block scale s (0..31) in its row: the scales are stored permuted.
// Host and device (smla::num::nvfp4_scale_offset forwards here); the base is a constexpr variable,
// so device code needs no relaxed-constexpr flag to call it.
inline constexpr int kNvFp4ScaleOffset = row_layout(KvFormat::kNvFP4DsMla).scale_offset;
SMLA_HD constexpr int nvfp4_scale_offset(int s) { return kNvFp4ScaleOffset + 8 * (s & 3) + (s >> 2); }

// The table agrees with itself: scales and RoPE fit behind the latent, RoPE ends the row.
static_assert(row_layout(KvFormat::kFP8DsMla).scale_offset + 4 * 4 == row_layout(KvFormat::kFP8DsMla).rope_offset);
static_assert(row_layout(KvFormat::kFP8DsMla).rope_offset + 64 * 2 == row_layout(KvFormat::kFP8DsMla).bytes);
static_assert(row_layout(KvFormat::kNvFP4DsMla).rope_offset + 64 == row_layout(KvFormat::kNvFP4DsMla).scale_offset);
static_assert(row_layout(KvFormat::kNvFP4DsMla).scale_offset + 32 == row_layout(KvFormat::kNvFP4DsMla).bytes);
static_assert(row_layout(KvFormat::kBF16).rope_offset + 64 * 2 == row_layout(KvFormat::kBF16).bytes);
static_assert(row_layout(KvFormat::kFP8E4M3).rope_offset + 64 == row_layout(KvFormat::kFP8E4M3).bytes);

// Bytes of one row of `format` for rope_dim 64 or 0.
int row_bytes(KvFormat format, int rope_dim);
// Element type of q that a format accepts (bf16 or fp16 always; e4m3 for fp8_e4m3).
bool format_is_quantized(KvFormat format);

// Encodes one row. latent: [512] fp32, rope: [rope_dim] fp32 (nullable when rope_dim = 0).
// k_scale is used by fp8_e4m3 only. row: row_bytes(format, rope_dim) bytes.
void encode_row(KvFormat format, int rope_dim, const float* latent, const float* rope, float k_scale,
                uint8_t* row);

// Decodes one row into out: [512 + rope_dim] fp32 (latent first). k_scale as above.
void decode_row(KvFormat format, int rope_dim, const uint8_t* row, float k_scale, float* out);

}  // namespace smla
