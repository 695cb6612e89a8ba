// devtools/replay.h — run a dumped layer (DESIGN.md: `smla replay`). Developer tools.
//
// The dump holds tensors q [T,H,D], kv [N,row] (BF16/F16 for 16-bit formats, F8_E4M3 or U8 bytes
// for quantized ones), idx [T,K] I32, optional counts [T] I32 and sink [H] F32, and string
// metadata format, softmax_scale, q_scale, k_scale, lse_base ("e" or "2"), rope_dim (64 or 0).
// The result holds out [T,H,512] (bf16, or F32 on request) and lse [T,H] F32.
#pragma once

#include "devtools/safetensors.h"
#include "smla/api.h"

namespace smla {

struct ReplayOptions {
  Backend backend = Backend::kCpu;
  DType out_dtype = DType::kBF16;  // kBF16 (kFP16 for an fp16 q) or kFP32
};

// Checks every tensor's dtype and shape against the metadata (throws Error naming the tensor).
st::File replay(const st::File& dump, const ReplayOptions& opt);

}  // namespace smla
