// smla/params.h — the one argument struct of a sparse MLA call (DESIGN.md §1–§2).
//
// Every backend (CPU reference, CUDA) takes this struct. Host code validates it once with
// validate(); kernels trust it. Strides are in elements of the pointed-to type unless the name
// says bytes. Pointers marked nullable may be null.
#pragma once

#include <cstdint>
#include <string>

#include "smla/types.h"

namespace smla {

struct SparseMlaParams {
  // ---- problem size
  int64_t num_tokens = 0;  // T, rows of q / idx / out; 0 is a valid empty call
  int num_heads = 0;       // H
  int rope_dim = kRopeDim; // 64 (D = 576) or 0 (D = 512)
  int topk = 0;            // K, row capacity of idx (any K >= 1)

  // ---- query
  const void* q = nullptr;  // [T, H, D] q_dtype, last dim contiguous; when q_rope is set: [T, H, 512]
  int64_t q_stride_t = 0, q_stride_h = 0;
  const void* q_rope = nullptr;  // nullable: [T, H, 64] q_dtype — q given as the (latent, RoPE) pair
  int64_t q_rope_stride_t = 0, q_rope_stride_h = 0;
  DType q_dtype = DType::kBF16;  // bf16, fp16, or e4m3 (fp8_e4m3 and fp8_ds_mla caches)

  // ---- KV cache: row r starts at kv + r * kv_row_stride_bytes
  const void* kv = nullptr;
  int64_t num_rows = 0;              // valid physical rows are [0, num_rows)
  int64_t kv_row_stride_bytes = 0;   // >= row_bytes(format, rope_dim)
  KvFormat format = KvFormat::kBF16;

  // ---- selection
  const int32_t* idx = nullptr;  // [T, K] int32 physical rows, -1 padded; row stride idx_stride_t
  int64_t idx_stride_t = 0;
  const int32_t* counts = nullptr;  // nullable: [T] active lengths; entries past it are not read
  const float* sink = nullptr;      // nullable: [H] fp32 per-head sink logits (see the sink rule below)

  // ---- scales (softmax_scale, and softmax_scale * q_scale [* k_scale for fp8_e4m3], in [-1e4, 1e4])
  float softmax_scale = 0.0f;
  float q_scale = 1.0f;  // multiplies q (e4m3 q); 1 otherwise
  float k_scale = 1.0f;  // fp8_e4m3 per-tensor scale

  // ---- outputs
  void* out = nullptr;  // [T, H, 512] out_dtype, last dim contiguous
  int64_t out_stride_t = 0, out_stride_h = 0;
  DType out_dtype = DType::kBF16;  // bf16 / fp16 (matching a 16-bit q); fp32 on the CPU backend
  float* lse = nullptr;  // nullable: [T, H] fp32, row stride lse_stride_t (heads contiguous)
  int64_t lse_stride_t = 0;
  LseMode lse_mode = LseMode::kBaseE;  // ignored when lse is null

  // ---- kernel option
  ScorePrecision score_precision = ScorePrecision::kAuto;  // kFP8: an e4m3 q with an fp8 cache only; kAuto: fp8 there (bf16 for fp8_ds_mla at H <= 32)

  int head_dim() const { return kLatentDim + rope_dim; }
};

// The largest |softmax_scale| (and |softmax_scale * q_scale [* k_scale]|) validate() accepts: scores
// beyond it are not attention logits but a unit error (DeepSeek-V3.2 uses 0.1352338).
inline constexpr float kMaxSoftmaxScale = 1e4f;

// Checks shapes, dtypes, strides, scales and pointers; throws Error naming the argument and the
// fix. Outputs (out, lse) must not share a byte with any input (q, q_rope, kv rows, idx, counts,
// sink) or with each other: each tensor's byte extent, from its shape and strides, is compared.
// Values behind pointers are not read (they may live on the device).
void validate(const SparseMlaParams& p);

// The sink rule. sink[h] = -inf means "no sink for head h" (exactly as if sink were null); any
// finite value adds exp(sink[h]) to that head's denominator. NaN and +inf are refused where the
// values are host-visible (the CPU backend, replay: this check). Device-resident sinks are not
// read on the host (run never synchronizes); there a +inf sink gives out = 0 for that head's
// non-empty rows and a NaN sink gives out = NaN for them; LSE (which excludes the sink) and empty
// rows (out 0, LSE -inf) are unaffected.
void check_host_sink(const SparseMlaParams& p);

// Fills the contiguous strides for tensors laid out densely ([T,H,D] q, [T,K] idx, ...).
// Callers set the pointers and sizes first.
void set_dense_strides(SparseMlaParams& p);

}  // namespace smla
