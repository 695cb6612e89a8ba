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
