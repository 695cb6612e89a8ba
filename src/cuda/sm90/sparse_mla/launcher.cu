// Host entry of the SM90 sparse MLA: checks, the variant (smla/support.h's table), schedule (head
// groups, top-k splits), KernelParams, and each variant's launch: the one compile-time dispatch
// (variant x cache format x element type).
#include <cuda_runtime.h>

#include <iterator>
#include <string>
#include <string_view>

#include "cuda/common/phase.h"
#include "cuda/sm90/sparse_mla/launcher.h"
#include "smla/cuda.h"
#include "smla/formats.h"
#include "smla/plan.h"
#include "smla/workspace.h"

namespace smla::cuda {
namespace {

namespace k = sm90::sparse_mla;

// What a call adds to validate() and to its geometry's support (the variant table): output
// type, grid size, pointer alignment.
void check_call(const SparseMlaParams& p) {
  SMLA_CHECK(p.out_dtype != DType::kFP32,
             "out_dtype f32 is CPU-only; the CUDA backend writes bf16 (fp16 for an fp16 q)");
  SMLA_CHECK(p.num_tokens * sm90::sparse_mla::head_groups_for(p.num_heads) < (int64_t(1) << 31),
             "T * ceil(H / 64) must be < 2^31 on the CUDA backend (one grid row per token and head group)");
  if (p.num_tokens == 0) return;
  SMLA_CHECK(p.num_rows == 0 || (reinterpret_cast<uintptr_t>(p.kv) % 16 == 0 && p.kv_row_stride_bytes % 16 == 0),
             "kv must be 16-byte aligned with a row stride that is a multiple of 16 bytes (got stride " +
                 std::to_string(p.kv_row_stride_bytes) + ")");
  const uintptr_t q_align = p.q_dtype == DType::kE4M3 ? 1 : 2;
  SMLA_CHECK(reinterpret_cast<uintptr_t>(p.q) % q_align == 0 && reinterpret_cast<uintptr_t>(p.out) % 2 == 0 &&
                 reinterpret_cast<uintptr_t>(p.q_rope) % q_align == 0,
             "q, q_rope and out must be aligned to their elements");
  SMLA_CHECK(reinterpret_cast<uintptr_t>(p.idx) % 4 == 0 && reinterpret_cast<uintptr_t>(p.counts) % 4 == 0 &&
                 reinterpret_cast<uintptr_t>(p.lse) % 4 == 0 && reinterpret_cast<uintptr_t>(p.sink) % 4 == 0,
             "idx, counts, lse and sink must be 4-byte aligned");
}

int current_num_sms() {
  int dev = 0, n = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev);
  SMLA_CHECK(e == cudaSuccess, std::string("cannot query the CUDA device: ") + cudaGetErrorString(e));
  return n;
}

bool aligned(const void* ptr, int64_t bytes) { return reinterpret_cast<uintptr_t>(ptr) % uint64_t(bytes) == 0; }

// The current device as the variant table sees it (ordinal and compute capability; attribute
// queries, no synchronization). No device: an empty DeviceInfo, which every variant refuses.
DeviceInfo current_device() {
  DeviceInfo d;
  if (cudaGetDevice(&d.ordinal) != cudaSuccess ||
      cudaDeviceGetAttribute(&d.cc_major, cudaDevAttrComputeCapabilityMajor, d.ordinal) != cudaSuccess ||
      cudaDeviceGetAttribute(&d.cc_minor, cudaDevAttrComputeCapabilityMinor, d.ordinal) != cudaSuccess) {
    cudaGetLastError();  // a failed query leaves a (non-sticky) error: clear it
    return {};
  }
  d.name = "device " + std::to_string(d.ordinal);
  return d;
}

// The variant that runs p on the current device (smla/support.h's table, and its small-call rule
// unless batch_invariant), or Error with the reason.
const CudaVariant& variant_for(const SparseMlaParams& p, bool batch_invariant = false) {
  const Geometry g = geometry_of(p);
  const DeviceInfo dev = current_device();
  const CudaVariant* v = cuda_variant_for(g, dev, p.num_tokens, batch_invariant);
  if (v == nullptr) fail_unsupported(support_cuda(g, dev, true).reason);
  return *v;
}

int num_splits_for(const SparseMlaParams& p, int num_sms) {
  return choose_num_splits(p.num_tokens, k::head_groups_for(p.num_heads), p.topk, num_sms);
}

// ---- the launches of kCudaVariants, in its order.
using LaunchFn = void (*)(const k::KernelParams& kp, KvFormat format, cudaStream_t s);

void launch_swapab(const k::KernelParams& kp, KvFormat format, cudaStream_t s) {
  // N = 16 heads per block for H <= 16, N = 32 for 17 <= H <= 32 (fp8_ds_mla, fp8_e4m3); one block per token
  // and split either way (kp.head_groups = 1)
  if (kp.num_heads > swapab_max_heads(format) || kp.head_groups != 1)
    fail("swapab runs H <= " + std::to_string(swapab_max_heads(format)));  // unreachable: supports() refuses
  const bool n16 = kp.num_heads <= 16;
  if (format == KvFormat::kFP8DsMla) {
    if (n16) k::launch_swapab<16, KvFormat::kFP8DsMla>(kp, s);
    else k::launch_swapab<32, KvFormat::kFP8DsMla>(kp, s);
  } else if (format == KvFormat::kFP8E4M3) {
    if (n16) k::launch_swapab<16, KvFormat::kFP8E4M3>(kp, s);
    else k::launch_swapab<32, KvFormat::kFP8E4M3>(kp, s);
  } else if (format == KvFormat::kNvFP4DsMla) {
    k::launch_swapab<16, KvFormat::kNvFP4DsMla>(kp, s);
  } else {
    fail("swapab reads fp8_ds_mla, fp8_e4m3 or nvfp4_ds_mla rows only");  // unreachable: supports() refuses
  }
}

void launch_h64_ws(const k::KernelParams& kp, KvFormat format, cudaStream_t s) {
  switch (format) {
    case KvFormat::kFP8E4M3: return k::launch_ws<ptx::Bf16, KvFormat::kFP8E4M3>(kp, s);
    case KvFormat::kFP8DsMla: return k::launch_ws<ptx::Bf16, KvFormat::kFP8DsMla>(kp, s);
    case KvFormat::kNvFP4DsMla: return k::launch_ws<ptx::Bf16, KvFormat::kNvFP4DsMla>(kp, s);
    case KvFormat::kFP16: return k::launch_ws<ptx::Fp16, KvFormat::kFP16>(kp, s);
    case KvFormat::kBF16: return k::launch_ws<ptx::Bf16, KvFormat::kBF16>(kp, s);
  }
}

void launch_h64_ws_q8(const k::KernelParams& kp, KvFormat format, cudaStream_t s) {
  if (format == KvFormat::kFP8E4M3) k::launch_ws<ptx::Bf16, KvFormat::kFP8E4M3, true>(kp, s);
  else if (format == KvFormat::kFP8DsMla) k::launch_ws<ptx::Bf16, KvFormat::kFP8DsMla, true>(kp, s);
  else fail("h64.ws.q8 reads fp8 rows only");  // unreachable: its supports() refuses the others
}

constexpr LaunchFn kLaunch[] = {launch_swapab, launch_h64_ws, launch_h64_ws_q8};
static_assert(std::size(kLaunch) == std::size(kCudaVariants), "one launch per variant of smla/support.h");
static_assert(std::string_view(kCudaVariants[0].name) == "swapab" && std::string_view(kCudaVariants[1].name) == "h64.ws" &&
                  std::string_view(kCudaVariants[2].name) == "h64.ws.q8",
              "kLaunch follows kCudaVariants");

}  // namespace

int sparse_mla_auto_splits(const SparseMlaParams& p, int num_sms) { return num_splits_for(p, num_sms); }

size_t sparse_mla_workspace_bytes(const SparseMlaParams& p, int num_sms, int num_splits) {
  if (p.num_tokens <= 0) return 0;
  return variant_for(p).workspace(p.num_tokens, p.num_heads,
                                  num_splits > 0 ? num_splits : num_splits_for(p, num_sms));
}

void sparse_mla(const SparseMlaParams& p, void* workspace, size_t workspace_bytes, void* stream, int num_splits,
                bool batch_invariant) {
  validate(p);
  const CudaVariant& variant = variant_for(p, batch_invariant);
  check_call(p);
  SMLA_CHECK(num_splits >= 0 && num_splits <= kMaxSplits,
             "num_splits must be in [0, " + std::to_string(kMaxSplits) + "]; got " + std::to_string(num_splits));
  if (p.num_tokens == 0) return;  // empty problem: nothing to launch

  const int splits = num_splits > 0 ? num_splits : num_splits_for(p, current_num_sms());
  const size_t need = variant.workspace(p.num_tokens, p.num_heads, splits);
  SMLA_CHECK(workspace_bytes >= need && (need == 0 || workspace != nullptr),
             "workspace too small: this launch splits the top-k " + std::to_string(splits) + " ways and needs " +
                 std::to_string(need) + " bytes (sparse_mla_workspace_bytes); got " + std::to_string(workspace_bytes));
  SMLA_CHECK(need == 0 || aligned(workspace, 16), "workspace must be 16-byte aligned");

  k::KernelParams kp{};
  kp.num_tokens = p.num_tokens;
  kp.num_heads = p.num_heads;
  kp.head_groups = k::head_groups_for(p.num_heads);
  kp.num_splits = splits;
  kp.topk = p.topk;
  kp.raw_chunks = k::raw_row_chunks(p.format, p.rope_dim);
  kp.k_steps = p.head_dim() / 16;
  kp.q = p.q;
  kp.q_stride_t = p.q_stride_t, kp.q_stride_h = p.q_stride_h;
  kp.q_rope = p.q_rope;
  kp.q_rope_stride_t = p.q_rope_stride_t, kp.q_rope_stride_h = p.q_rope_stride_h;
  kp.q_e4m3 = p.q_dtype == DType::kE4M3;
  const int64_t q_vec_bytes = kp.q_e4m3 ? 8 : 16;  // 8 elements of q per load
  kp.q_vec16 = aligned(p.q, q_vec_bytes) && p.q_stride_t % 8 == 0 && p.q_stride_h % 8 == 0 &&
               (p.q_rope == nullptr ||
                (aligned(p.q_rope, q_vec_bytes) && p.q_rope_stride_t % 8 == 0 && p.q_rope_stride_h % 8 == 0));
  kp.kv = static_cast<const uint8_t*>(p.kv);
  kp.kv_row_stride_bytes = p.kv_row_stride_bytes;
  kp.num_rows = p.num_rows;
  kp.idx = p.idx;
  kp.idx_stride_t = p.idx_stride_t;
  kp.counts = p.counts;
  kp.sink = p.sink;
  // fp8_e4m3 rows are read as exact e4m3 values: k_scale moves to the score and output scales.
  const float k_scale = p.format == KvFormat::kFP8E4M3 ? p.k_scale : 1.0f;
  kp.scale_log2 = p.softmax_scale * p.q_scale * k_scale * 1.4426950408889634f;
  kp.out_scale = k_scale;
  kp.out = p.out;
  kp.out_stride_t = p.out_stride_t, kp.out_stride_h = p.out_stride_h;
  kp.out_vec2 = aligned(p.out, 4) && p.out_stride_t % 2 == 0 && p.out_stride_h % 2 == 0;
  kp.lse = p.lse_mode == LseMode::kOff ? nullptr : p.lse;
  kp.lse_stride_t = p.lse_stride_t;
  kp.lse_base2 = p.lse_mode == LseMode::kBase2;
  if (splits > 1) {  // carved as smla/workspace.h lays it out (need above is its total)
    const SparseMlaWorkspace layout = sparse_mla_workspace(p.num_tokens, p.num_heads, splits);
    kp.part_out = reinterpret_cast<uint16_t*>(static_cast<uint8_t*>(workspace) + layout.part_out.offset);
    kp.part_lse = reinterpret_cast<float*>(static_cast<uint8_t*>(workspace) + layout.part_lse.offset);
  }
#if SMLA_PHASE_TIMER
  kp.phase = phase::buffer();
#endif

  auto s = static_cast<cudaStream_t>(stream);
  const bool fp16 = p.q_dtype == DType::kFP16;
  kLaunch[&variant - kCudaVariants](kp, p.format, s);
  cudaError_t e = cudaGetLastError();
  SMLA_CHECK(e == cudaSuccess, std::string("sparse MLA kernel launch failed: ") + cudaGetErrorString(e));
  if (splits > 1) {
    if (fp16) k::launch_combine<ptx::Fp16>(kp, s);
    else k::launch_combine<ptx::Bf16>(kp, s);
    e = cudaGetLastError();
    SMLA_CHECK(e == cudaSuccess, std::string("sparse MLA split merge launch failed: ") + cudaGetErrorString(e));
  }
}

}  // namespace smla::cuda
