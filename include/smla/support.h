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
// (except fp8_ds_mla at H <= swapab_max_heads() while swapab is on: kBF16, the faster path there),
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
Support supports_sm90_xo(const Geometry& g, const DeviceInfo& dev);
Support supports_sm90_ws(const Geometry& g, const DeviceInfo& dev);
Support supports_sm90_ws_q8(const Geometry& g, const DeviceInfo& dev);

// In the order they are tried; the first whose supports() is OK runs.
inline constexpr CudaVariant kCudaVariants[] = {
    {"swapab", ScorePrecision::kBF16,
     "small-H kernel for fp8_ds_mla and fp8_e4m3 rows with a bf16 q or an e4m3 q widened exactly (H <= 16; "
     "fp8_ds_mla: score precision auto or bf16, fp8_e4m3: bf16; H <= 32 in 16-head blocks with "
     "SMLA_SM90_SWAPAB_HGROUPS=1, opt-in): the rows are the wgmma M dimension (H padded to 16, "
     "not 64), raw rows in a cp.async ring, e4m3 converted exactly in registers, tile scales in fp32 (S) and folded "
     "into bf16 P (P V); fp32 sums (DESIGN.md §8: LSE within 1e-3). SMLA_SM90_SWAPAB=0 turns it off, "
     "SMLA_SM90_SWAPAB_E4M3=0 for fp8_e4m3 alone; nvfp4_ds_mla (off with SMLA_SM90_SWAPAB_NVFP4=0, block scales applied as "
     "K and V are converted)",
     supports_sm90_swapab, split_workspace_bytes},
    {"h128.xo", ScorePrecision::kBF16,
     "h64.ws for fp8_ds_mla at 64 < H <= 128 as a cluster of a token's two 64-head blocks, each dequantizing half "
     "of every tile into both blocks' shared memory (FlashMLA's crossover): the same bits as h64.ws. Opt-in: "
     "SMLA_SM90_CROSSOVER=1 (with SMLA_SM90_XO_REGS=1 the producer converts rows loaded into its registers)",
     supports_sm90_xo, split_workspace_bytes},
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

// Whether the swapab variant may run: the environment switch SMLA_SM90_SWAPAB, read once per
// process (0: off, any other value: on; unset: kSwapAbByDefault), for same-binary A/B runs.
inline constexpr int kSwapAbMaxHeads = 16;
inline constexpr bool kSwapAbByDefault = true;  // 25-31 % faster than h64.ws at T >= 32, equal at T = 1 (s11 run 2)
bool swapab_enabled();
// The largest H swapab runs: kSwapAbMaxHeads (16), or with SMLA_SM90_SWAPAB_HGROUPS (read once; opt-in,
// docs/perf-history.md#s12-swapab-hgroups) = 1 or 32: 32, = 64: 64 (an experiment), swapab then launching
// ceil(H / 16) blocks of 16 heads per (token, split). Any other value: 16.
int swapab_max_heads();
// fp8_e4m3 rows on swapab (bf16 scores: a bf16 q, or an e4m3 q with score precision bf16): on by
// default since session 12 (its cases 97/97 and memcheck 31/31 on the H200 with the switch on; 24-26 %
// faster than h64.ws); SMLA_SM90_SWAPAB_E4M3=0 turns it off, read once.
inline constexpr bool kSwapAbE4M3ByDefault = true;
bool swapab_e4m3_enabled();
// nvfp4_ds_mla rows on swapab (a bf16 q): on by default since session 12 (2.3-2.4x h64.ws at H = 16,
// T >= 128 on the H200, its cases 49/49, memcheck clean: docs/perf-history.md#s12-run-b);
// SMLA_SM90_SWAPAB_NVFP4=0 turns it off, read once.
inline constexpr bool kSwapAbNvfp4ByDefault = true;
bool swapab_nvfp4_enabled();

// The crossover variant h128.xo (fp8_ds_mla, bf16 scores, 64 < H <= 128): opt-in, SMLA_SM90_CROSSOVER=1,
// read once per process (docs/perf-history.md s12-crossover: not measured yet). Its register-staged mode
// (SMLA_SM90_XO_REGS=1, s12-flashmla-h128) is the launcher's choice of kernel, not a variant of its own.
bool crossover_enabled();

// The variant that runs g on dev: the first that supports it; nullptr when none does
// (support_cuda says why).
const CudaVariant* cuda_variant_for(const Geometry& g, const DeviceInfo& dev);
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
