// smla/support.h — what each backend supports, answered as OK or one sentence that names what
// is unsupported and what to use instead (the seed's supports_combination is the model), and the
// CUDA backend's variant table: which kernel runs a geometry, and why.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "smla/params.h"
#include "smla/plan.h"
#include "smla/types.h"

namespace smla {

// The per-geometry facts a plan is made for.
struct Geometry {
  int num_heads = 128;
  int rope_dim = kRopeDim;  // 64 (D = 576) or 0 (D = 512)
  KvFormat format = KvFormat::kBF16;
  DType q_dtype = DType::kBF16;
  int topk = 2048;          // capacity K
  LseMode lse_mode = LseMode::kBaseE;
  bool sink = false;
  ScorePrecision score_precision = ScorePrecision::kAuto;  // kFP8: an e4m3 q with an fp8 cache; kAuto: fp8 there
};

// The geometry of one call (LSE off when p.lse is null).
Geometry geometry_of(const SparseMlaParams& p);

// The score path g asks for: kAuto is kFP8 when q is e4m3 and the format is fp8_e4m3 or fp8_ds_mla
// (except fp8_ds_mla at H <= kSwapAbMaxHeads: kBF16, swapab's faster path there),
// else kBF16; an explicit kBF16 / kFP8 is returned as it is (support_common refuses kFP8 where it
// cannot run, with its reason).
ScorePrecision resolve_score_precision(const Geometry& g);

struct DeviceInfo {
  int ordinal = -1;
  int cc_major = 0, cc_minor = 0;
  int num_sms = 0;
  size_t smem_per_block_optin = 0;
  std::string name;
  bool present() const { return cc_major > 0; }
};

struct Support {
  std::string reason;  // empty: supported
  bool ok() const { return reason.empty(); }
};

// Shared geometry rules (heads, D, dtypes, format pairing, score precision).
Support support_common(const Geometry& g);
// The CPU reference backend: everything support_common accepts (it sums every product in float64,
// whatever the score precision asks).
Support support_cpu(const Geometry& g);

// ---- the CUDA sparse MLA variant table (DESIGN.md §6)
// One kernel variant: what it supports (with the reason when not), the workspace it needs, and,
// in the CUDA layer (cuda/sm90/sparse_mla/launcher.cu, in the same order), its launch. support(),
// `smla info`, the planner, the launcher and the tests all read this table.
struct CudaVariant {
  const char* name;                // "h64.ws": kernel names, `smla info`, bench records
  ScorePrecision score_precision;  // the score path it implements
  const char* notes;               // what it is, how accurate
  Support (*supports)(const Geometry& g, const DeviceInfo& dev);
  size_t (*workspace)(int64_t num_tokens, int num_heads, int num_splits);  // bytes (split-K scratch)
};

Support supports_sm90_swapab(const Geometry& g, const DeviceInfo& dev);
Support supports_sm90_ws(const Geometry& g, const DeviceInfo& dev);
Support supports_sm90_ws_q8(const Geometry& g, const DeviceInfo& dev);

// In the order they are tried; the first whose supports() is OK runs.
inline constexpr CudaVariant kCudaVariants[] = {
    {"swapab", ScorePrecision::kBF16,
     "small-H kernel for fp8_ds_mla, fp8_e4m3 (H <= 32) and nvfp4_ds_mla (H <= 16) rows with a bf16 q or an e4m3 q "
     "widened exactly (fp8_ds_mla: score precision auto or bf16, fp8_e4m3: bf16): the rows are the wgmma M dimension "
     "(H padded to 16 or 32, not 64), raw rows in a cp.async ring, e4m3 converted exactly in registers, tile scales in fp32 "
     "(S) and folded into bf16 P (P V), nvfp4_ds_mla's block scales applied as K and V are converted; fp32 sums "
     "(DESIGN.md §8: LSE within 1e-3)",
     supports_sm90_swapab, split_workspace_bytes},
    {"h64.ws", ScorePrecision::kBF16,
     "warp-specialized wgmma kernel, 64-head groups (heads past H zero-padded); quantized rows dequantized to "
     "bf16 in shared memory, an e4m3 q widened to bf16 exactly; fp32 sums (DESIGN.md §8: LSE within 1e-3)",
     supports_sm90_ws, split_workspace_bytes},
    {"h64.ws.q8", ScorePrecision::kFP8,
     "h64.ws with S = q·k on the fp8 tensor cores from the raw e4m3 rows (6-13% faster than widening q); "
     "exact products summed with fewer bits than fp32 and promoted to fp32 every 128 dims (fp8_e4m3: 64): LSE within ~1e-2 of the "
     "reference (DESIGN.md §8's fp8-product bar), not 1e-3",
     supports_sm90_ws_q8, split_workspace_bytes},
};
inline std::span<const CudaVariant> cuda_variants() { return kCudaVariants; }

// The largest H swapab runs (one block per token and split: N = 16 heads for H <= 16, N = 32 above;
// docs/perf-history.md#s14-swapab-n32): fp8_ds_mla and fp8_e4m3 32, nvfp4_ds_mla 16 (N = 16 only).
inline constexpr int kSwapAbMaxHeads = 32;
inline constexpr int kSwapAbNvfp4MaxHeads = 16;
constexpr int swapab_max_heads(KvFormat f) {
  return f == KvFormat::kNvFP4DsMla ? kSwapAbNvfp4MaxHeads : kSwapAbMaxHeads;
}

// The variant that runs g on dev: the first that supports it; nullptr when none does
// (support_cuda says why).
const CudaVariant* cuda_variant_for(const Geometry& g, const DeviceInfo& dev);
// A call of few rows at 17 <= H <= 32: swapab's N = 32 tile runs alone ~4 us longer than h64.ws's
// (one or a few tiles per block), so calls of T < kSwapAbN32MinRows rows run h64.ws (T = 1 in a graph:
// 11.3 vs 15.3 us; T = 32 equal; T >= 128 swapab 12-21 % faster: docs/perf-history.md#s14-swapab-n32),
// except in a batch-invariant plan, which runs one kernel for every T (a row's bits never depend on
// the batch around it).
inline constexpr int64_t kSwapAbN32MinRows = 32;
// The variant that runs a call of num_tokens rows: cuda_variant_for(g, dev), or h64.ws instead of
// swapab for a small call at H > 16 (above) unless batch_invariant.
const CudaVariant* cuda_variant_for(const Geometry& g, const DeviceInfo& dev, int64_t num_tokens, bool batch_invariant);
// The variant is chosen by g's resolved score precision (resolve_score_precision).
// The CUDA backend on `dev`, given whether this build contains the CUDA kernels: OK when a
// variant runs g, else the reason of the general variant of g's resolved score precision (the
// last in the table with that precision: specialized variants come first).
Support support_cuda(const Geometry& g, const DeviceInfo& dev, bool built_with_cuda);
// An SM90 device with nothing else known (what `smla info` asks about without a GPU).
DeviceInfo any_sm90_device();
// "sm90/sparse_mla/<format>_d<D>": the kernel family of g, without the variant.
std::string cuda_kernel_name(const Geometry& g);

}  // namespace smla
