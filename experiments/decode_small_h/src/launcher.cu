// Host entry of the SM90 small-head decode kernel (decode.h): support check, split choice,
// DecodeParams, the launch and the split merge (cuda::sparse_mla's merge kernel and workspace
// layout). Also the gather-limit kernel the benchmark quotes against.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>
#include <string>

#include "cuda/sm90/sparse_mla/launcher.h"
#include "decode_small_h/src/decode.h"
#include "decode_small_h/src/kernel.cuh"
#include "smla/formats.h"
#include "smla/plan.h"
#include "smla/workspace.h"

namespace smla::cuda {
namespace {

namespace d = sm90::decode;

bool aligned(const void* ptr, int64_t bytes) { return reinterpret_cast<uintptr_t>(ptr) % uint64_t(bytes) == 0; }


int current_num_sms() {
  int dev = 0, n = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev);
  SMLA_CHECK(e == cudaSuccess, std::string("cannot query the CUDA device: ") + cudaGetErrorString(e));
  return n;
}

// Entries per split: a multiple of the tile, covering K in `splits` pieces.
int split_len_for(int topk, int splits) {
  const int per = (topk + splits - 1) / splits;
  return (per + d::kRows - 1) / d::kRows * d::kRows;
}

DecodeK resolve(DecodeK k) {
  if (k != DecodeK::kAuto) return k;
  static const DecodeK env = [] {
    const char* e = std::getenv("SMLA_SM90_DECODE_K");
    return e != nullptr && std::string(e) == "f16" ? DecodeK::kF16 : DecodeK::kBits;
  }();
  return env;
}

const char* const kRingNames[3] = {"", ".deep", ".teams"};

// H > 16 as two 16-head groups on head tile 16 (with the ring of H <= 16) instead of head tile
// 32: SMLA_SM90_DECODE_H32=split (read once).
bool split_heads_env() {
  static const bool v = [] {
    const char* e = std::getenv("SMLA_SM90_DECODE_H32");
    return e != nullptr && std::string(e) == "split";
  }();
  return v;
}

// The instantiation and grid a call runs: head tile 16 kMT, head groups per token, ring.
struct Shape {
  int mt, groups, ring;
};
Shape shape_of(const SparseMlaParams& p, const DecodeDiag& dg) {
  if (p.num_heads <= 16) return {1, 1, dg.ring};
  if (dg.split_heads) return {1, 2, dg.ring};
  return {2, 1, 0};
}

int blocks_per_sm_of(const Shape& s) {
  if (s.mt == 2) return d::DecodeConfig<2>::kBlocksPerSm;
  return s.ring == 1 ? d::DecodeConfig<1, 1>::kBlocksPerSm
         : s.ring == 2 ? d::DecodeConfig<1, 2>::kBlocksPerSm
                       : d::DecodeConfig<1>::kBlocksPerSm;
}

DecodeDiag env_diag(DecodeK k) { return DecodeDiag{resolve(k), decode_small_h_ring_env(), 0, split_heads_env()}; }

}  // namespace

int decode_small_h_ring_env() {
  static const int v = [] {
    const char* e = std::getenv("SMLA_SM90_DECODE_RING");
    return e == nullptr ? 0 : std::clamp(std::atoi(e), 0, 2);
  }();
  return v;
}

std::string decode_small_h_variant(const SparseMlaParams& p, DecodeK k) {
  const Shape s = shape_of(p, env_diag(k));
  return std::string(s.mt == 2 ? "h32" : s.groups == 2 ? "h16x2" : "h16") + kRingNames[s.ring] +
         (resolve(k) == DecodeK::kF16 ? ".f16" : ".bits");
}

std::string decode_small_h_supports(const SparseMlaParams& p) {
  try {
    validate(p);
  } catch (const Error& e) {
    return e.what();
  }
  if (p.format != KvFormat::kFP8DsMla)
    return "the small-head decode kernel reads fp8_ds_mla caches only; got " + std::string(to_string(p.format));
  if (p.q_dtype != DType::kBF16)
    return "the small-head decode kernel takes a bf16 q; got " + std::string(to_string(p.q_dtype));
  if (p.out_dtype != DType::kBF16) return "the small-head decode kernel writes bf16 out; got " + std::string(to_string(p.out_dtype));
  if (p.num_heads > 32)
    return "the small-head decode kernel takes H <= 32; got H = " + std::to_string(p.num_heads);
  if (p.num_tokens >= (int64_t(1) << 31) / (2 * kMaxSplits))
    return "T must be < 2^25 for the small-head decode kernel (one block per token, split and head group); got T = " +
           std::to_string(p.num_tokens);
  if (p.num_tokens == 0) return "";
  if (p.num_rows > 0 && (!aligned(p.kv, 16) || p.kv_row_stride_bytes % 16 != 0))
    return "kv must be 16-byte aligned with a row stride that is a multiple of 16 bytes (got stride " +
           std::to_string(p.kv_row_stride_bytes) + ")";
  if (!aligned(p.q, 2) || !aligned(p.q_rope, 2) || !aligned(p.out, 2))
    return "q, q_rope and out must be aligned to their bf16 elements";
  if (!aligned(p.idx, 4) || !aligned(p.counts, 4) || !aligned(p.lse, 4) || !aligned(p.sink, 4))
    return "idx, counts, lse and sink must be 4-byte aligned";
  return "";
}

int decode_small_h_splits(const SparseMlaParams& p, int num_sms) {
  return decode_small_h_splits(p, num_sms, env_diag(DecodeK::kAuto));
}

int decode_small_h_splits(const SparseMlaParams& p, int num_sms, const DecodeDiag& dg) {
  if (p.num_tokens <= 0) return 1;
  const Shape s = shape_of(p, dg);
  const int want = choose_num_splits(p.num_tokens, s.groups, p.topk, num_sms * blocks_per_sm_of(s));
  // The pieces actually used once each is rounded up to whole 32-entry tiles.
  const int len = split_len_for(p.topk, want);
  return (p.topk + len - 1) / len;
}

size_t decode_small_h_workspace_bytes(const SparseMlaParams& p, int num_sms) {
  if (p.num_tokens <= 0) return 0;
  int splits = 1;
  for (int ring = 0; ring < 3; ++ring)
    for (bool split_heads : {false, true})
      splits = std::max(splits, decode_small_h_splits(p, num_sms, DecodeDiag{DecodeK::kBits, ring, 0, split_heads}));
  return split_workspace_bytes(p.num_tokens, p.num_heads, splits);
}

void decode_small_h_launch(const SparseMlaParams& p, void* workspace, size_t workspace_bytes, void* stream,
                           DecodeK k) {
  decode_small_h_launch_diag(p, workspace, workspace_bytes, stream, env_diag(k));
}

int decode_small_h_blocks_per_sm(const SparseMlaParams& p, DecodeDiag dg) {
  const bool f16 = resolve(dg.k) == DecodeK::kF16;
  const Shape s = shape_of(p, dg);
  if (s.mt == 2) return f16 ? d::blocks_per_sm<2, true, 0>() : d::blocks_per_sm<2, false, 0>();
  if (s.ring == 1) return f16 ? d::blocks_per_sm<1, true, 1>() : d::blocks_per_sm<1, false, 1>();
  if (s.ring == 2) return f16 ? d::blocks_per_sm<1, true, 2>() : d::blocks_per_sm<1, false, 2>();
  return f16 ? d::blocks_per_sm<1, true, 0>() : d::blocks_per_sm<1, false, 0>();
}

void decode_small_h_launch_diag(const SparseMlaParams& p, void* workspace, size_t workspace_bytes, void* stream,
                                DecodeDiag dg) {
  const std::string why = decode_small_h_supports(p);
  SMLA_CHECK(why.empty(), why);
  SMLA_CHECK(dg.mode >= 0 && dg.mode <= 2, "decode diagnostic mode must be 0, 1 or 2");
  SMLA_CHECK(dg.ring >= 0 && dg.ring <= 2, "decode ring must be 0, 1 or 2");
  if (p.num_tokens == 0) return;

  const Shape shape = shape_of(p, dg);
  const int splits = decode_small_h_splits(p, current_num_sms(), dg);
  const size_t need = split_workspace_bytes(p.num_tokens, p.num_heads, splits);
  SMLA_CHECK(workspace_bytes >= need && (need == 0 || workspace != nullptr),
             "workspace too small: this launch splits the top-k " + std::to_string(splits) + " ways and needs " +
                 std::to_string(need) + " bytes (decode_small_h_workspace_bytes); got " +
                 std::to_string(workspace_bytes));
  SMLA_CHECK(need == 0 || aligned(workspace, 16), "workspace must be 16-byte aligned");

  d::DecodeParams kp{};
  kp.num_tokens = p.num_tokens;
  kp.num_heads = p.num_heads;
  kp.num_splits = splits;
  kp.head_groups = shape.groups;
  kp.split_len = split_len_for(p.topk, splits);
  kp.topk = p.topk;
  kp.rope = p.rope_dim > 0;
  kp.row_chunks = kp.rope ? d::kRowBytes / 16 : (d::kRopeOffset) / 16;
  kp.q = static_cast<const uint16_t*>(p.q);
  kp.q_stride_t = p.q_stride_t, kp.q_stride_h = p.q_stride_h;
  kp.q_rope = static_cast<const uint16_t*>(p.q_rope);
  kp.q_rope_stride_t = p.q_rope_stride_t, kp.q_rope_stride_h = p.q_rope_stride_h;
  kp.q_vec = aligned(p.q, 4) && p.q_stride_t % 2 == 0 && p.q_stride_h % 2 == 0 &&
             (p.q_rope == nullptr || (aligned(p.q_rope, 4) && p.q_rope_stride_t % 2 == 0 && p.q_rope_stride_h % 2 == 0));
  kp.kv = static_cast<const uint8_t*>(p.kv);
  kp.kv_row_stride_bytes = p.kv_row_stride_bytes;
  kp.num_rows = p.num_rows;
  kp.idx = p.idx;
  kp.idx_stride_t = p.idx_stride_t;
  kp.counts = p.counts;
  kp.sink = p.sink;
  kp.scale_log2 = p.softmax_scale * p.q_scale * 1.4426950408889634f;
  kp.out = static_cast<uint16_t*>(p.out);
  kp.out_stride_t = p.out_stride_t, kp.out_stride_h = p.out_stride_h;
  kp.out_vec = aligned(p.out, 16) && p.out_stride_t % 8 == 0 && p.out_stride_h % 8 == 0;
  kp.lse = p.lse_mode == LseMode::kOff ? nullptr : p.lse;
  kp.lse_stride_t = p.lse_stride_t;
  kp.lse_base2 = p.lse_mode == LseMode::kBase2;
  if (splits > 1) {  // carved as smla/workspace.h lays it out (need above is its total)
    const SparseMlaWorkspace layout = sparse_mla_workspace(p.num_tokens, p.num_heads, splits);
    kp.part_out = reinterpret_cast<uint16_t*>(static_cast<uint8_t*>(workspace) + layout.part_out.offset);
    kp.part_lse = reinterpret_cast<float*>(static_cast<uint8_t*>(workspace) + layout.part_lse.offset);
  }

  auto s = static_cast<cudaStream_t>(stream);
  kp.mode = dg.mode;
  const bool f16 = resolve(dg.k) == DecodeK::kF16;
  // The one switch from runtime values to template arguments.
  if (shape.mt == 2) f16 ? d::launch_decode<2, true, 0>(kp, s) : d::launch_decode<2, false, 0>(kp, s);
  else if (shape.ring == 1) f16 ? d::launch_decode<1, true, 1>(kp, s) : d::launch_decode<1, false, 1>(kp, s);
  else if (shape.ring == 2) f16 ? d::launch_decode<1, true, 2>(kp, s) : d::launch_decode<1, false, 2>(kp, s);
  else f16 ? d::launch_decode<1, true, 0>(kp, s) : d::launch_decode<1, false, 0>(kp, s);
  cudaError_t e = cudaGetLastError();
  SMLA_CHECK(e == cudaSuccess, std::string("small-head decode kernel launch failed: ") + cudaGetErrorString(e));
  if (splits > 1) {
    // cuda::sparse_mla's split merge: sink, LSE mode and the bf16 output from the partials.
    sm90::sparse_mla::KernelParams mp{};
    mp.num_tokens = p.num_tokens;
    mp.num_heads = p.num_heads;
    mp.num_splits = splits;
    mp.sink = p.sink;
    mp.out = p.out;
    mp.out_stride_t = p.out_stride_t, mp.out_stride_h = p.out_stride_h;
    mp.out_vec2 = aligned(p.out, 4) && p.out_stride_t % 2 == 0 && p.out_stride_h % 2 == 0;
    mp.lse = kp.lse;
    mp.lse_stride_t = p.lse_stride_t;
    mp.lse_base2 = kp.lse_base2;
    mp.part_out = kp.part_out;
    mp.part_lse = kp.part_lse;
    // Always a programmatic dependent launch (launcher.h): the kernel above triggers it after its
    // main loop. mp.phase (SMLA_PHASE_TIMER builds only) stays null from the value-initialization.
    sm90::sparse_mla::launch_combine<ptx::Bf16>(mp, s);
    e = cudaGetLastError();
    SMLA_CHECK(e == cudaSuccess, std::string("small-head decode split merge launch failed: ") + cudaGetErrorString(e));
  }
}

// ---- the gather limit: each warp reads 8 rows at a time (every lane up to ceil(8 * chunks / 32)
// independent 16-byte loads in flight), folds them into one word and stores it only if it equals
// a value no data produces in practice (so the loads are not removed).
namespace {

constexpr int kGatherRowsPerWarp = 8;
constexpr int kGatherMaxChunks = 72;  // up to 1152-byte rows

template <int kGatherLoads>  // ceil(8 * chunks / 32)
__global__ void __launch_bounds__(256, kGatherLoads <= 11 ? 3 : 2) gather_rows_kernel(const uint8_t* kv, int64_t stride, int64_t num_rows,
                                                          int chunks, const int32_t* idx, int64_t n,
                                                          uint32_t* sink) {
  const int lane = threadIdx.x & 31;
  const int64_t warp0 = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int64_t warps = (int64_t(gridDim.x) * blockDim.x) >> 5;
  uint32_t acc = 0;
  for (int64_t base = warp0 * kGatherRowsPerWarp; base < n; base += warps * kGatherRowsPerWarp) {
    int32_t rid = -1;
    if (lane < kGatherRowsPerWarp && base + lane < n) rid = idx[base + lane];
    uint4 v[kGatherLoads];
#pragma unroll
    for (int i = 0; i < kGatherLoads; ++i) {
      const int flat = i * 32 + lane;  // chunk flat % chunks of row flat / chunks
      const int r = flat / chunks, c = flat - r * chunks;
      const int32_t row = __shfl_sync(0xffffffffu, rid, r < kGatherRowsPerWarp ? r : 0);
      v[i] = make_uint4(0, 0, 0, 0);
      if (r < kGatherRowsPerWarp && row >= 0 && row < num_rows)
        v[i] = __ldg(reinterpret_cast<const uint4*>(kv + int64_t(row) * stride) + c);
    }
#pragma unroll
    for (int i = 0; i < kGatherLoads; ++i) acc ^= v[i].x ^ v[i].y ^ v[i].z ^ v[i].w;
  }
  if (acc == 0x9e3779b9u) sink[0] = acc;
}

}  // namespace

void gather_rows_limit(const void* kv, int64_t row_stride_bytes, int64_t num_rows, int row_bytes, const int32_t* idx,
                       int64_t num_entries, uint32_t* scratch, void* stream) {
  SMLA_CHECK(row_bytes % 16 == 0 && row_bytes / 16 <= kGatherMaxChunks,
             "gather limit: row_bytes must be a multiple of 16 up to 1152");
  SMLA_CHECK(scratch != nullptr, "gather limit: scratch must be a device word");
  const int chunks = row_bytes / 16;
  const int blocks = current_num_sms() * 8;
  auto s = static_cast<cudaStream_t>(stream);
  const auto* base = static_cast<const uint8_t*>(kv);
  if (chunks <= 44) gather_rows_kernel<11><<<blocks, 256, 0, s>>>(base, row_stride_bytes, num_rows, chunks, idx, num_entries, scratch);
  else gather_rows_kernel<18><<<blocks, 256, 0, s>>>(base, row_stride_bytes, num_rows, chunks, idx, num_entries, scratch);
  const cudaError_t e = cudaGetLastError();
  SMLA_CHECK(e == cudaSuccess, std::string("gather limit launch failed: ") + cudaGetErrorString(e));
}

}  // namespace smla::cuda
