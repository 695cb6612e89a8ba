// The KV cache writer: one 128-thread block per token. Thread i owns latent elements 4i..4i+3, so
// an fp8_ds_mla tile (128 values) is one warp and an nvfp4 block (16 values) is four lanes; the
// scale comes from a shuffle max and the rounding from smla/numeric.h, the same functions the CPU
// encoder uses, so rows are bit-identical.
#include <cuda_runtime.h>

#include "check.cuh"
#include "smla/cuda_serving.h"
#include "writer_mirror.h"
#include "smla/formats.h"
#include "smla/numeric.h"

namespace smla::cuda {
namespace {

constexpr int kThreads = 128;  // 512 latent values, 4 per thread
constexpr int kPerThread = kLatentDim / kThreads;
static_assert(kPerThread == 4 && kThreads >= kRopeDim, "thread i owns latent 4i..4i+3 and RoPE value i");
// The shuffles below reduce a scale over the lanes that own one tile of the row-layout table.
static_assert(row_layout(KvFormat::kFP8DsMla).tile_width == 32 * kPerThread, "an fp8_ds_mla tile is one warp");
static_assert(row_layout(KvFormat::kNvFP4DsMla).tile_width == 4 * kPerThread, "an nvfp4 block is four lanes");

struct WriterParams {
  const uint16_t* latent;  // [N, 512] bf16/fp16, row stride latent_stride
  int64_t latent_stride;
  const uint16_t* rope;    // nullable [N, 64], row stride rope_stride
  int64_t rope_stride;
  bool src_bf16;
  const int32_t* slots;    // [N]
  uint8_t* cache;          // row r at cache + r * row_stride
  int64_t num_rows, row_stride;
  int block_size;
  int64_t block_stride_rows;
  int rope_dim;
  float k_scale;
  // The tiered cache's second destination (smla/cuda_tiered.h): the same row, staged in shared
  // memory, also goes to mirror row mirror_rows[n] when that is in [0, mirror_num_rows).
  uint8_t* mirror = nullptr;              // nullable
  const int32_t* mirror_rows = nullptr;   // [N], negative: none
  int64_t mirror_num_rows = 0, mirror_stride = 0;
  int row_bytes = 0;                      // bytes copied to both destinations (a multiple of 16)
};

__device__ __forceinline__ float load(const uint16_t* p, int64_t i, bool bf16) {
  return bf16 ? num::bf16_to_f32(p[i]) : num::fp16_to_f32(p[i]);
}

template <KvFormat kFormat>
__global__ void __launch_bounds__(kThreads) cache_writer_kernel(WriterParams p) {
  constexpr RowLayout l = row_layout(kFormat);  // where each part of the row goes (smla/formats.h)
  const int64_t n = blockIdx.x;
  const int32_t slot = p.slots[n];
  if (slot < 0) return;
  const int64_t row_id = int64_t(slot / p.block_size) * p.block_stride_rows + slot % p.block_size;
  if (row_id >= p.num_rows) return;  // past the cache: skipped, never written
  __shared__ alignas(16) uint8_t staged[row_layout(kFormat).bytes];  // the row, when it goes to the mirror too
  const bool mirrored = p.mirror != nullptr && p.mirror_rows[n] >= 0 && p.mirror_rows[n] < p.mirror_num_rows;
  uint8_t* row = mirrored ? staged : p.cache + row_id * p.row_stride;
  const int tid = threadIdx.x;
  float x[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) x[i] = load(p.latent, n * p.latent_stride + 4 * tid + i, p.src_bf16);
  const bool has_rope = tid < p.rope_dim;
  const float r = has_rope ? load(p.rope, n * p.rope_stride + tid, p.src_bf16) : 0.0f;

  if constexpr (kFormat == KvFormat::kBF16 || kFormat == KvFormat::kFP16) {
    uint16_t* out = reinterpret_cast<uint16_t*>(row);
#pragma unroll
    for (int i = 0; i < 4; ++i)
      out[4 * tid + i] = kFormat == KvFormat::kBF16 ? num::f32_to_bf16(x[i]) : num::f32_to_fp16(x[i]);
    uint16_t* rope_out = reinterpret_cast<uint16_t*>(row + l.rope_offset);
    if (has_rope) rope_out[tid] = kFormat == KvFormat::kBF16 ? num::f32_to_bf16(r) : num::f32_to_fp16(r);
  } else if constexpr (kFormat == KvFormat::kFP8E4M3) {
#pragma unroll
    for (int i = 0; i < 4; ++i) row[4 * tid + i] = num::f32_to_e4m3(x[i] / p.k_scale);
    if (has_rope) row[l.rope_offset + tid] = num::f32_to_e4m3(r / p.k_scale);
  } else if constexpr (kFormat == KvFormat::kFP8DsMla) {
    float amax = fmaxf(fmaxf(fabsf(x[0]), fabsf(x[1])), fmaxf(fabsf(x[2]), fabsf(x[3])));
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const float s = num::ds_mla_tile_scale(amax);  // warp w = tile w
#pragma unroll
    for (int i = 0; i < 4; ++i) row[4 * tid + i] = num::f32_to_e4m3(x[i] / s);
    if ((tid & 31) == 0) *reinterpret_cast<float*>(row + l.scale_offset + l.scale_bytes * (tid >> 5)) = s;
    if (tid < kRopeDim)
      reinterpret_cast<uint16_t*>(row + l.rope_offset)[tid] = has_rope ? num::f32_to_bf16(r) : uint16_t(0);
  } else {  // nvfp4_ds_mla
    float amax = fmaxf(fmaxf(fabsf(x[0]), fabsf(x[1])), fmaxf(fabsf(x[2]), fabsf(x[3])));
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
    const uint8_t sb = num::nvfp4_block_scale(amax);  // lanes 4b..4b+3 share block b
    const float sf = num::e4m3_to_f32(sb);
    const uint8_t lo0 = num::f32_to_e2m1(x[0] / sf), hi0 = num::f32_to_e2m1(x[1] / sf);
    const uint8_t lo1 = num::f32_to_e2m1(x[2] / sf), hi1 = num::f32_to_e2m1(x[3] / sf);
    row[2 * tid] = uint8_t(lo0 | (hi0 << 4));
    row[2 * tid + 1] = uint8_t(lo1 | (hi1 << 4));
    if ((tid & 3) == 0) row[nvfp4_scale_offset(tid >> 2)] = sb;
    if (tid < kRopeDim) row[l.rope_offset + tid] = has_rope ? num::f32_to_e4m3(r) : uint8_t(0);
  }
  if (mirrored) {  // block-uniform: n decides it
    __syncthreads();
    uint8_t* dst = p.cache + row_id * p.row_stride;
    uint8_t* dst2 = p.mirror + int64_t(p.mirror_rows[n]) * p.mirror_stride;
    static_assert(16 * kThreads >= row_layout(kFormat).bytes, "one 16-byte piece of the row per thread");
    if (16 * tid < p.row_bytes) {
      const uint4 v = *reinterpret_cast<const uint4*>(staged + 16 * tid);
      *reinterpret_cast<uint4*>(dst + 16 * tid) = v;
      *reinterpret_cast<uint4*>(dst2 + 16 * tid) = v;
    }
  }
}

}  // namespace

void write_cache(const CacheWriteParams& p, void* stream) { write_cache_mirrored(p, WriterMirror{}, stream); }

void write_cache_mirrored(const CacheWriteParams& p, const WriterMirror& m, void* stream) {
  validate(p);
  if (p.num_tokens == 0) return;
  SMLA_CHECK(p.num_tokens <= 0x7fffffffLL, "write_cache: at most 2^31 - 1 tokens per call");
  WriterParams w;
  w.mirror = static_cast<uint8_t*>(m.base), w.mirror_rows = m.rows, w.mirror_num_rows = m.num_rows;
  w.mirror_stride = m.row_stride_bytes, w.row_bytes = row_bytes(p.format, p.rope_dim);
  w.latent = static_cast<const uint16_t*>(p.latent), w.latent_stride = p.latent_stride;
  w.rope = static_cast<const uint16_t*>(p.rope), w.rope_stride = p.rope_stride;
  w.src_bf16 = p.src_dtype == DType::kBF16;
  w.slots = p.slot_mapping;
  w.cache = static_cast<uint8_t*>(p.cache), w.num_rows = p.num_rows, w.row_stride = p.row_stride_bytes;
  w.block_size = p.block_size, w.block_stride_rows = p.block_stride_rows;
  w.rope_dim = p.rope_dim, w.k_scale = p.k_scale;
  const dim3 grid(unsigned(p.num_tokens)), block(kThreads);
  auto s = static_cast<cudaStream_t>(stream);
  switch (p.format) {
    case KvFormat::kBF16: cache_writer_kernel<KvFormat::kBF16><<<grid, block, 0, s>>>(w); break;
    case KvFormat::kFP16: cache_writer_kernel<KvFormat::kFP16><<<grid, block, 0, s>>>(w); break;
    case KvFormat::kFP8E4M3: cache_writer_kernel<KvFormat::kFP8E4M3><<<grid, block, 0, s>>>(w); break;
    case KvFormat::kFP8DsMla: cache_writer_kernel<KvFormat::kFP8DsMla><<<grid, block, 0, s>>>(w); break;
    case KvFormat::kNvFP4DsMla: cache_writer_kernel<KvFormat::kNvFP4DsMla><<<grid, block, 0, s>>>(w); break;
  }
  check_launch("cache_writer_kernel");
}

}  // namespace smla::cuda
