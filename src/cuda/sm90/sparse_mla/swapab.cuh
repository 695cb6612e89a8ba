// SM90 sparse MLA, the small-H "swap AB" kernel for fp8_ds_mla rows and a bf16 q (or an e4m3 q,
// widened to bf16 exactly when Q is staged): the rows, not the heads, are the wgmma M dimension, so
// N = 16 (H <= 16) or N = 32 (17 <= H <= 32, fp8_ds_mla and fp8_e4m3) and nothing is padded to 64 heads
// (docs/perf-history.md#s11-swapab: the paper bound, the runs, the variants tried; #s14-swapab-n32: N = 32). Also fp8_e4m3 rows
// and nvfp4_ds_mla rows (its block scales applied as K and V are converted: swapab_nvfp4.h,
// docs/perf-history.md#s12-swapab-nvfp4).
//
// One block per (token, top-k split), H <= N (heads past H masked). 3 warpgroups:
//   warpgroup 2: the producer. 16-byte cp.async of each valid 656-byte row into a ring of kStages
//     raw stages (row stride 672 bytes: the bank spread of the loads below), completion on the
//     stage's "full" mbarrier (every thread's copies, and the stage's valid-row mask stored in
//     shared memory). Invalid or out-of-range entries are never read: their slot keeps stale
//     bytes, which the bit-move conversion turns into finite values and the softmax selects away.
//   warpgroups 0 and 1: consumers of alternate tiles (tile i: consumer i % 2), each with its own O,
//     max and sums, merged at the end through shared memory.
// A consumer's tile (64 rows):
//   S^T = K Q^T: wgmma m64nNk16, A = K from registers (raw e4m3 -> bf16 by bit moves: value * 2^-120,
//     exact, subnormals included), B = Q^T in shared memory (bf16, each head times 2^e_h, a power of
//     two that takes its largest |q| to [2^64, 2^65)). One chain of 8 k-steps per 128-dim tile j
//     from 0, times the row's tile scale and added in fp32; the bf16 RoPE a chain of its own. The
//     dims are permuted consistently in A and B: lane t (= lane % 4) owns dims [16 t, 16 t + 16)
//     of each 64-dim chunk, so its fragment of a row comes from one 16-byte load per chunk.
//   softmax over the tile's rows per head (columns): shuffles within a warp, a 4-warp exchange.
//   O^T = V^T P^T, fp8_ds_mla and fp8_e4m3 (swapab_fp8pv.h, docs/perf-history.md#s13-fp8pv): wgmma
//     m64nNk32 .e4m3, A = V^T's raw bytes by a 4 x 4 byte transpose of the words below (4 rows of one dim
//     per register), B = P^T * scale_j * F_j as hi + lo e4m3 (F_j a power of two per tile and j), each
//     tile into a fresh accumulator added to O times 1 / F_j (128 products: DESIGN.md §8). nvfp4_ds_mla:
//   O^T = V^T P^T: wgmma m64nNk16, M = latent dims (8 m64 tiles, m-tile mt inside 128-dim tile mt / 2;
//     fp8_e4m3, nvfp4_ds_mla: a lane's 16 dims of a row contiguous instead, SwabConsumer::dim0),
//     A = V^T from registers (the same bit moves, two rows per register by prmt), B = P^T times the
//     rows' tile scale of j (and 2^56) in bf16, one 64 x N matrix per tile j in shared memory (one
//     for all m-tiles without row scales: fp8_e4m3, nvfp4_ds_mla).
// Rows are permuted in the tile (sigma) for conflict-free shared loads; S^T's row m and P^T's
// k index m both mean slot sigma(m).
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <type_traits>

#include "cuda/common/ptx.cuh"
#include "cuda/sm90/sparse_mla/config.h"
#include "cuda/sm90/sparse_mla/dequant.h"
#include "cuda/sm90/sparse_mla/launcher.h"
#include "cuda/sm90/sparse_mla/swapab_fp8pv.h"
#include "cuda/sm90/sparse_mla/swapab_nvfp4.h"
#include "cuda/sm90/sparse_mla/ws_common.cuh"
#include "smla/types.h"

namespace smla::cuda::sm90::sparse_mla {

template <int kN, KvFormat kF = KvFormat::kFP8DsMla>
struct SwabConfig {
  static_assert(kF == KvFormat::kFP8DsMla || kF == KvFormat::kFP8E4M3 || kF == KvFormat::kNvFP4DsMla,
                "swapab reads fp8_ds_mla, fp8_e4m3 or nvfp4_ds_mla rows");
  // N = 32 (17 <= H <= 32; fp8_ds_mla and fp8_e4m3): O^T is 128 registers a thread, so S and P V run in
  // smaller pieces (scores32, pv8_by_tile), and fp8_ds_mla keeps two P^T per consumer, not four
  // (docs/perf-history.md#s14-swapab-n32; session 11's N = 32 with three stages: #s11-swapab-run1).
  static_assert(kN == 16 || kN == 32, "N of the swap-AB wgmma: 16 or 32 heads");
  static constexpr int kThreads = 3 * 128;
  static constexpr int kConsumerRegs = 232;
  static constexpr int kProducerRegs = 40;
  // Each stage belongs to one consumer (tiles alternate between the two, so the count is even):
  // a stage shared in turn would let a consumer wait on a phase two ahead of the one in flight
  // (an mbarrier's phase parity aliases).
  // nvfp4_ds_mla: 8 stages of 22 KiB (its 352-byte rows; docs/perf-history.md#s12-swapab-nvfp4).
  static constexpr int kStages = kF == KvFormat::kNvFP4DsMla ? 8 : 4;
  static_assert(kStages % 2 == 0, "tiles alternate between the consumers: an even stage count (one consumer a stage)");
  // bytes between rows of a stage: a row (fp8_ds_mla 656, fp8_e4m3 576, nvfp4_ds_mla 352) and a bank
  // spread of 8 words mod 32 (the two rows of an S load 16 banks apart, the four rows of a P V load 8
  // apart; 352 bytes are 88 words, -8 mod 32, as they are)
  static constexpr int kRowStride = kF == KvFormat::kFP8DsMla ? 672 : kF == KvFormat::kFP8E4M3 ? 608 : 352;
  static constexpr int kStageBytes = kBlockK * kRowStride;
  static constexpr int kOperandBytes = kN * 128;  // one (kN heads x 64 k) bf16 swizzled B operand
  // P^T matrices per consumer: N = 16 four (one per latent tile j; fp8_e4m3 and nvfp4_ds_mla use the first).
  // N = 32 (17 <= H <= 32): four 42 KiB stages, Q^T 36 KiB and 2 x 4 P^T of 4 KiB would be 236 KiB, so
  // fp8_ds_mla keeps two, tiles j and j + 2 in turn (P V of j = 0, 1 read, then 2, 3 written), fp8_e4m3 one
  // (docs/perf-history.md#s14-swapab-n32).
  static constexpr int kPBufs = kN == 16 ? 4 : kF == KvFormat::kFP8DsMla ? 2 : 1;
  struct SharedStorage {
    alignas(1024) uint8_t q[9][kOperandBytes];     // Q^T: chunk c (dims 64c.., 8 = RoPE) of kN heads, permuted
    alignas(1024) uint8_t p[2][kPBufs][kOperandBytes];  // [consumer][latent tile j] P^T * scale_j * 2^56 (only j = 0 without row scales)
    alignas(128) uint8_t kv[kStages][kStageBytes];  // raw rows; at the end consumer 1's O in its stages
    uint64_t valid[kStages][4];                     // [stage][producer warp] bit i: slot i holds a row
    float qfac[kN];                                 // scale_log2 * 2^(120 - e_h)
    float red_m[2][2][4][kN];                       // [consumer][tile parity][warp][head] partial max
    float red_l[2][4][kN];                          // [consumer][warp][head] final partial sums
    uint32_t red_s[2][2][4][4];                     // [consumer][tile parity][warp][j] max |scale_j| bits (ds)
    float fin_m[kN];                                // consumer 1's final max
    uint64_t full[kStages];
    uint64_t empty[kStages];
  };
  static constexpr size_t kSmemBytes = sizeof(SharedStorage);
  static_assert(kSmemBytes <= kSmemLimit, "swap-AB kernel: shared memory over 227 KiB");
  // Consumer 1's O^T for the merge (512 x kN fp32) goes into its own stages (the odd ones: tile i uses
  // stage i % kStages, consumer i % 2), by latent half: both halves in stage 1 when a stage holds them
  // (fp8_ds_mla 42 KiB, fp8_e4m3 38 KiB), else half h in stage 1 + 2 h (nvfp4_ds_mla: 22 KiB stages).
  static constexpr int kObHalfBytes = 256 * kN * 4;
  static constexpr bool kObOneStage = kStageBytes >= 2 * kObHalfBytes;
  static_assert(kObOneStage || (kStageBytes >= kObHalfBytes && kStages >= 4),
                "consumer 1's O must fit its own stages for the merge");
  static_assert((kConsumerRegs - 168) * 2 <= 168 - kProducerRegs, "consumer registers exceed what the producer releases");
};

namespace swab {

// ---- PTX of this kernel only.
__device__ __forceinline__ void stmatrix_x4_trans(uint32_t addr, const uint32_t (&r)[4]) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(r[0]),
               "r"(r[1]), "r"(r[2]), "r"(r[3])
               : "memory");
}
__device__ __forceinline__ uint32_t lds32(uint32_t addr) {
  uint32_t v;
  asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(v) : "r"(addr));
  return v;
}
__device__ __forceinline__ void lds128(uint32_t (&v)[4], uint32_t addr) {
  asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n" : "=r"(v[0]), "=r"(v[1]), "=r"(v[2]), "=r"(v[3]) : "r"(addr));
}
__device__ __forceinline__ float4 lds128f(uint32_t addr) {
  float4 v;
  asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];\n" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(addr));
  return v;
}
__device__ __forceinline__ void sts128_zero(uint32_t addr) {
  asm volatile("st.shared.v4.b32 [%0], {%1, %1, %1, %1};\n" ::"r"(addr), "r"(0) : "memory");
}
__device__ __forceinline__ void sts16(uint32_t addr, uint16_t v) {
  asm volatile("st.shared.u16 [%0], %1;\n" ::"r"(addr), "h"(v) : "memory");
}

// Two e4m3 bytes picked by kSel as (byte, its sign replicated) per 16-bit half -> bf16x2 of the
// e4m3 values times 2^-120 (exact for every code, subnormals included; never NaN or inf).
template <uint32_t kSel>
__device__ __forceinline__ uint32_t e4m3x2_bits(uint32_t a, uint32_t b) {
  uint32_t r;
  asm("prmt.b32 %0, %1, %2, %3;\n" : "=r"(r) : "r"(a), "r"(b), "n"(kSel));
  return (r << 4) & 0x87f087f0u;
}
// prmt selectors: bytes 0, 1 of a (kLo) or 2, 3 (kHi); byte k of a then byte k of b (kPair<k>).
inline constexpr uint32_t kSelLo = 0x9180u, kSelHi = 0xB3A2u;
template <int k>
inline constexpr uint32_t kPair = uint32_t(k) | uint32_t(8 | k) << 4 | uint32_t(4 + k) << 8 | uint32_t(8 | (4 + k)) << 12;

// D(64 x 16, fp32) (+)= A(64 x 16 bf16, registers) B(16 x 16 bf16, K-major smem).
__device__ __forceinline__ void wgmma_rs16(float (&d)[8], const uint32_t (&a)[4], uint64_t desc_b, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %13, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7}, {%8, %9, %10, %11}, %12, "
      "p, 1, 1, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d));
}

// D(64 x 16, fp32) (+)= A(64 x 32 e4m3, registers) B(32 x 16 e4m3, K-major smem): P V on the fp8 tensor
// cores (docs/perf-history.md#s13-fp8pv).
__device__ __forceinline__ void wgmma_rs8(float (&d)[8], const uint32_t (&a)[4], uint64_t desc_b, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %13, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n16k32.f32.e4m3.e4m3 {%0, %1, %2, %3, %4, %5, %6, %7}, {%8, %9, %10, %11}, %12, "
      "p, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d));
}
// N = 32: D(64 x 32, fp32) (+)= A B, the same operands with 32 heads.
__device__ __forceinline__ void wgmma_rs16(float (&d)[16], const uint32_t (&a)[4], uint64_t desc_b, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, "
      "%14, %15}, {%16, %17, %18, %19}, %20, p, 1, 1, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d));
}
__device__ __forceinline__ void wgmma_rs8(float (&d)[16], const uint32_t (&a)[4], uint64_t desc_b, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k32.f32.e4m3.e4m3 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, "
      "%14, %15}, {%16, %17, %18, %19}, %20, p, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d));
}
__device__ __forceinline__ uint32_t redux_max(uint32_t v) {
  uint32_t r;
  asm("redux.sync.max.u32 %0, %1, 0xffffffff;\n" : "=r"(r) : "r"(v));
  return r;
}

template <int N>
__device__ __forceinline__ void fence_a(uint32_t (&a)[N][4]) {
#pragma unroll
  for (int i = 0; i < N; ++i) ptx::fence_operands(a[i]);
}

// Slot (row of the stage) of logical row m of a tile: m = 16 s + 8 hi + 2 tt + e ->
// 16 s + 4 (e + 2 hi) + (tt + 2 e) % 4. The two rows a lane loads for S (m, m + 1 at the same
// lane % 4) are 2 mod 4 slots apart (16 banks at a 168-word stride), the four rows of one P V load
// (tt = 0..3) four consecutive slots (8 banks apart).
__device__ __forceinline__ int slot_of(int m) { return swp8::slot_of(m); }
// Physical dim (0..63 inside a 64-dim chunk) of logical k position kl of the chunk: k-step s =
// kl / 16, column col = kl % 16 of the A fragment; lane t = (col % 8) / 2 owns dims [16 t, 16 t + 16).
__host__ __device__ constexpr int dim_of(int kl) {
  const int s = kl >> 4, col = kl & 15;
  return 16 * ((col & 7) >> 1) + 4 * s + (col & 1) + 2 * (col >> 3);
}
__device__ __forceinline__ float pow2(int e) { return __int_as_float((127 + e) << 23); }  // e in [-126, 127]

// swapab_nvfp4.h's lane layout (its host tests) is this kernel's K permutation.
constexpr bool nvfp4_dims_agree() {
  for (int ks = 0; ks < 36; ++ks)
    for (int col = 0; col < 16; ++col) {
      const int t = (col & 7) >> 1, r = col >> 3, e = col & 1;
      if (swnv::k_dim(ks, t, r, e) != 64 * (ks >> 2) + dim_of(16 * (ks & 3) + col)) return false;
    }
  return true;
}
static_assert(nvfp4_dims_agree(), "swapab_nvfp4.h's k_dim must be dim_of's permutation");

}  // namespace swab

// ---- the producer (the whole warpgroup): 16-byte cp.async, 8 threads per row (a warp writes four
// rows' 128 contiguous bytes per instruction), rows grp + 16 i of the tile for thread (grp, c). Each
// thread's copies arrive on the stage's "full" mbarrier when they land (cp.async.mbarrier.arrive),
// lane 0 of each warp also arrives after storing its rows' valid bits. L2 fetches are 256 bytes,
// 128 for a row's last eight chunks (less of the next row pulled from DRAM: s7-l2).
template <int kN, int kDiag, KvFormat kF>
__device__ __forceinline__ void swab_produce(const KernelParams& p, typename SwabConfig<kN, kF>::SharedStorage& s,
                                             const WsBlock& w, int wt) {
  using Cfg = SwabConfig<kN, kF>;
  const int c = wt & 7, grp = wt >> 3, warp = wt >> 5, lane = wt & 31;
  const int chunks = p.raw_chunks;
  constexpr int kRowChunks = row_layout(kF).bytes / 16;  // a whole row: 41 / 36 / 22
  static_assert(kRowChunks <= 48, "6 chunks of 16 bytes per thread and row");
  int rows[4];
  auto fetch = [&](int tile) {  // the ids, by the c == 0 thread of each row
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int e = w.begin + tile * kBlockK + grp + 16 * i;
      rows[i] = (c == 0 && tile < w.num_tiles && e < w.end) ? __ldg(w.idx_row + e) : -1;
    }
  };
  fetch(0);
  for (int tile = 0; tile < w.num_tiles; ++tile) {
    const int st = tile % Cfg::kStages;
    int cur[4];  // this tile's row ids (-1: masked)
    uint32_t bal[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int row = __shfl_sync(0xffffffffu, rows[i], lane & ~7);
      cur[i] = row >= 0 && row < p.num_rows ? row : -1;
      bal[i] = __ballot_sync(0xffffffffu, cur[i] >= 0);
    }
    fetch(tile + 1);  // the next tile's ids load while this one's copies go out
    ptx::mbar_wait(ws_bar(s.empty[st]), ((tile / Cfg::kStages) & 1) ^ 1);
    const uint32_t full = ws_bar(s.full[st]);
    if constexpr (kDiag != 2) {
      const uint32_t base = ptx::smem_addr(s.kv[st]) + uint32_t(grp * Cfg::kRowStride + 16 * c);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        if (cur[i] < 0) {
          // fp8_ds_mla, fp8_e4m3: a masked slot is zeroed (P V's e4m3 wgmma reads its V bytes raw, and a stale
          // byte may be the NaN code: 0 * NaN = NaN; docs/perf-history.md#s13-fp8pv), ordered before the
          // consumers' reads by the __syncwarp and lane 0's arrive below. nvfp4's bit moves never make NaN.
          if constexpr (kF != KvFormat::kNvFP4DsMla) {
            const uint32_t dst = base + uint32_t(16 * i * Cfg::kRowStride);
            const int n = chunks;
#pragma unroll
            for (int k = 0; k < 6; ++k)
              if (c + 8 * k < n) swab::sts128_zero(dst + 128 * k);
          }
          continue;
        }
        const uint8_t* src = p.kv + int64_t(cur[i]) * p.kv_row_stride_bytes + 16 * c;
        const uint32_t dst = base + uint32_t(16 * i * Cfg::kRowStride);
        // chunks c, c + 8, ... (< 41). A whole row (D = 576, the usual call) with its chunk count a
        // constant: the chunks every thread copies need no test, and only the last one or two a predicate
        // on c (docs/perf-history.md#s12-swapab-diet); D = 512 (fewer chunks) the general loop.
        auto copy_row = [&](auto kc) {
          constexpr int kChunks = decltype(kc)::value;
          const int n = kChunks > 0 ? kChunks : chunks;
#pragma unroll
          for (int k = 0; k < 6; ++k)
            if (c + 8 * k < n) ptx::cp_async_16_zfill_l2(dst + 128 * k, src + 128 * k, true, c + 8 * k + 8 >= n);
        };
        if (chunks == kRowChunks) copy_row(std::integral_constant<int, kRowChunks>{});
        else copy_row(std::integral_constant<int, 0>{});
      }
    }
    ptx::cp_async_mbar_arrive(full);
    if constexpr (kF != KvFormat::kNvFP4DsMla) __syncwarp();  // (the lanes' zero stores of masked slots, before
                                                               // lane 0's release arrive)
    if (lane == 0) {  // bit 4 warp + gl + 16 i: slot grp + 16 i of lane 8 gl
      uint64_t mask = 0;
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int gl = 0; gl < 4; ++gl) mask |= uint64_t((bal[i] >> (8 * gl)) & 1u) << (4 * warp + gl + 16 * i);
      s.valid[st][warp] = mask;
      ptx::mbar_arrive(full);
    }
  }
}

// ---- Q^T into shared memory (both consumers, 256 threads): head h's 576 dims times 2^e_h in the
// permuted order, bf16, the 128-byte swizzle of a K-major operand (rows = heads); heads past H and
// (D = 512) the RoPE chunk zero. qfac[h] = scale_log2 * 2^(120 - e_h).
template <int kN, KvFormat kF>
__device__ __forceinline__ void swab_load_q(const KernelParams& p, typename SwabConfig<kN, kF>::SharedStorage& s,
                                            const WsBlock& w, int tid) {
  const int warp = tid >> 5, lane = tid & 31;
  const int dims = p.k_steps * 16;  // 576 or 512
  // Lane l holds 8-dim units u = l, l + 32, l + 64 (< 72) of the head: all loads issued at once.
  for (int h = warp; h < kN; h += 8) {  // h: the head in the block's group, w.head0 + h in the call
    const int hc = w.head0 + h;
    const bool head = hc < p.num_heads;
    // element offsets of head hc's latent and RoPE (q_rope, or q past 512) in q's element type
    const int64_t ol = w.t * p.q_stride_t + int64_t(hc) * p.q_stride_h;
    const int64_t orp = p.q_rope != nullptr ? w.t * p.q_rope_stride_t + int64_t(hc) * p.q_rope_stride_h : ol + kLatent;
    const void* rbase = p.q_rope != nullptr ? p.q_rope : p.q;
    uint32_t v[3][4];  // bf16 pairs of units lane, lane + 32, lane + 64
#pragma unroll
    for (int k = 0; k < 3; ++k) {
      const int u = lane + 32 * k;
      v[k][0] = v[k][1] = v[k][2] = v[k][3] = 0u;
      if (!head || u >= kMaxDim / 8 || 8 * u >= dims) continue;
      const bool lat = u < kLatent / 8;
      const int64_t off = lat ? ol + 8 * u : orp + 8 * (u - kLatent / 8);
      if (p.q_e4m3) {  // e4m3 -> bf16 exactly (q_scale is in scale_log2), as h64.ws widens it
        const uint8_t* src = static_cast<const uint8_t*>(lat ? p.q : rbase) + off;
        uint32_t lo = 0, hi = 0;
        if (p.q_vec16) {
          const uint2 x = *reinterpret_cast<const uint2*>(src);
          lo = x.x, hi = x.y;
        } else {
#pragma unroll
          for (int i = 0; i < 4; ++i) lo |= uint32_t(src[i]) << (8 * i), hi |= uint32_t(src[4 + i]) << (8 * i);
        }
        const dq::Chunk c8 = dq::e4m3x8_fast(lo, hi);
        v[k][0] = c8.w[0], v[k][1] = c8.w[1], v[k][2] = c8.w[2], v[k][3] = c8.w[3];
      } else {
        const uint16_t* src = static_cast<const uint16_t*>(lat ? p.q : rbase) + off;
        if (p.q_vec16) {
          const uint4 x = *reinterpret_cast<const uint4*>(src);
          v[k][0] = x.x, v[k][1] = x.y, v[k][2] = x.z, v[k][3] = x.w;
        } else {
#pragma unroll
          for (int i = 0; i < 4; ++i) v[k][i] = uint32_t(src[2 * i]) | uint32_t(src[2 * i + 1]) << 16;
        }
      }
    }
    auto val = [&](int k, int i) {  // element i (0..7) of unit k as float
      return __uint_as_float((i & 1) ? (v[k][i >> 1] & 0xffff0000u) : (v[k][i >> 1] << 16));
    };
    float amax = 0.0f;
#pragma unroll
    for (int k = 0; k < 3; ++k)
#pragma unroll
      for (int i = 0; i < 8; ++i) amax = fmaxf(amax, fabsf(val(k, i)));
#pragma unroll
    for (int o = 16; o >= 1; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    // |q| up to [2^64, 2^65) against K's bits = value * 2^-120
    int e = 0;
    if (amax > 0.0f && amax < INFINITY) e = min(max(64 - ilogbf(amax), -7), 126);
    const float mul = swab::pow2(e);
    if (lane == 0) s.qfac[h] = p.scale_log2 * swab::pow2(120 - e);
    const uint32_t row = ptx::smem_addr(s.q) + uint32_t(h * 128);
#pragma unroll
    for (int k = 0; k < 3; ++k) {
      const int u = lane + 32 * k;
      if (u >= kMaxDim / 8) continue;
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const int d = 8 * u + i, c = d >> 6, pd = d & 63;  // chunk, physical dim in it
        // logical position of physical dim pd (dim_of's inverse): pd = 16 tt + 4 s + e + 2 hi
        const int kl = 16 * ((pd >> 2) & 3) + 2 * (pd >> 4) + (pd & 1) + 8 * ((pd >> 1) & 1);
        const float x = val(k, i) * mul;
        const uint32_t bits = ptx::Bf16::pack(x, 0.0f) & 0xffffu;
        swab::sts16(row + uint32_t(c * SwabConfig<kN, kF>::kOperandBytes + (((kl >> 3) ^ (h & 7)) << 4) + (kl & 7) * 2),
                    uint16_t(bits));
      }
    }
  }
}

// ---- a consumer warpgroup: tiles c, c + 2, ...; its O^T (latent dims x kN heads) in registers.
// It holds a tile's stage until P V's last V load.
template <int kN, int kDiag, KvFormat kF = KvFormat::kFP8DsMla>
struct SwabConsumer {
  using Cfg = SwabConfig<kN, kF>;
  static constexpr bool kDs = kF == KvFormat::kFP8DsMla;  // per-row tile scales and a bf16 RoPE; else
                                                          // fp8_e4m3: no scales (k_scale is in the score and
                                                          // output scales), an e4m3 RoPE
  // nvfp4_ds_mla: e2m1 with a block scale per 16 values, applied to K and V as they are converted
  // (swapab_nvfp4.h: the same units as e4m3, value * 2^-120); an e4m3 RoPE, no scale in P^T.
  static constexpr bool kNv = kF == KvFormat::kNvFP4DsMla;
  // fp8_ds_mla, fp8_e4m3: P V on the e4m3 tensor cores (m64nNk32, A = the raw V bytes transposed, B = P^T
  // as two e4m3 halves; swapab_fp8pv.h, docs/perf-history.md#s13-fp8pv); nvfp4_ds_mla: bf16 as before.
  static constexpr bool kP8 = !kNv;
  static constexpr int kRopeE4m3 = row_layout(kF).rope_offset;  // the e4m3 RoPE's bytes (not fp8_ds_mla)
  using Smem = typename Cfg::SharedStorage;
  static constexpr int kNH = kN / 2;  // accumulator registers of an m64nN product
  static constexpr int kNB = kN / 8;  // n8 blocks (heads 8i .. 8i + 7)
  // P^T matrices per tile: fp8_ds_mla one per 128-dim latent tile j (P^T times the rows' scale of j);
  // fp8_e4m3 and nvfp4_ds_mla have no row scale in P^T, so the four would be identical: one, which
  // every m-tile's P V reads (docs/perf-history.md#s12-swapab-diet).
  static constexpr int kPTiles = kDs ? 4 : 1;
  // P V's M axis (latent dims): lane (w, g, t) holds dims dim0(j, w, g) + 2 h + r of m-tile mt = 2 j + h,
  // fragment row g + 8 r. With four P^T (fp8_ds_mla) an m-tile must stay inside one 128-dim tile j:
  // dim0 = 128 j + 4 (8 w + g), 4 bytes of a row per tile j (four 4-byte loads a row).
  // fp8_e4m3 and nvfp4_ds_mla (one P^T): dim0 = 16 (8 w + g) + 4 j, the lane's 16 dims of a row
  // contiguous: fp8_e4m3 one 16-byte load a row (conflict-free: 608-byte rows put the four rows of a
  // quarter-warp 8 banks apart), nvfp4_ds_mla one block a row (8 bytes and one scale byte,
  // swapab_nvfp4.h). The same products per (dim, head), in the same k order.
  // N = 32 (pv8_by_tile: one 4-byte load per row and tile j) takes fp8_ds_mla's mapping for fp8_e4m3 too:
  // its 4-byte loads are then conflict-free at 608-byte rows (word 24 slot + 8 w + g mod 32), where 16 (8 w +
  // g) + 4 j would put a warp's 32 loads on 8 banks.
  static constexpr bool kV16 = kF != KvFormat::kFP8DsMla && kN == 16;
  __host__ __device__ static constexpr int dim0(int j, int w, int g) {
    return kV16 ? 16 * (8 * w + g) + 4 * j : 128 * j + 4 * (8 * w + g);
  }
  // Every latent dim held by exactly one (lane, j, d); with kV16 a lane's j are the 4-byte words of one
  // 16-byte run (the load pv_convert issues; fp8_e4m3 one byte per dim, nvfp4 half a byte).
  static constexpr bool dims_ok() {
    int seen[512] = {};
    for (int w = 0; w < 4; ++w)
      for (int g = 0; g < 8; ++g)
        for (int j = 0; j < 4; ++j) {
          if (kV16 && dim0(j, w, g) != dim0(0, w, g) + 4 * j) return false;
          for (int d = 0; d < 4; ++d) {
            const int dim = dim0(j, w, g) + d;
            if (dim < 0 || dim >= 512 || seen[dim]++) return false;
            if (!kV16 && dim / 128 != j) return false;  // four P^T: m-tiles 2 j, 2 j + 1 inside tile j
          }
        }
    return true;
  }
  static_assert(dims_ok(), "P V's latent dims must be a permutation (inside each 128-dim tile with four P^T)");
  // the P^T descriptor offset (16-byte units) of m-tile mt's P^T
  __device__ __forceinline__ static constexpr uint32_t p_tile(int mt) {
    return kPTiles == 4 ? uint32_t(mt >> 1) * uint32_t(Cfg::kOperandBytes >> 4) : 0u;
  }

  // S^T of the tile in stage `kv`: x[r][i][e] for rows m = 16 w + g + 8 r, heads 8 i + 2 t + e:
  // sum_j scale_j(row) * chain_j + 2^-120 * rope chain (= 2^(e_h - 120) * q.k).
  // fp8_ds_mla: esc[r] = row m_r's four tile scales, loaded once here for the chains and for P.
  __device__ __forceinline__ static void scores(uint32_t kv, uint32_t q_base, int slot0, int slot1, int t, bool rope,
                                                float (&x)[kNH], float4 (&esc)[2]) {
    const uint32_t r0 = kv + uint32_t(slot0 * Cfg::kRowStride), r1 = kv + uint32_t(slot1 * Cfg::kRowStride);
    if constexpr (kDs) {
      esc[0] = swab::lds128f(r0 + 512);
      esc[1] = swab::lds128f(r1 + 512);
    }
    const uint32_t k0 = r0 + uint32_t(16 * t), k1 = r1 + uint32_t(16 * t);  // lane t's 16 bytes of each chunk
    const uint64_t qd = ptx::sw128_desc(q_base, 16, 1024);
    constexpr uint32_t kChunk = uint32_t(Cfg::kOperandBytes >> 4);
#pragma unroll
    for (int i = 0; i < kNH; ++i) x[i] = 0.0f;
    // nvfp4_ds_mla: each row's eight block scales of lane t's blocks (4 c + t, chunk c = 0..7).
    uint32_t nsc0[2] = {0u, 0u}, nsc1[2] = {0u, 0u};
    if constexpr (kNv) {
      swnv::lds64(nsc0, r0 + uint32_t(swnv::k_scales(t)));
      swnv::lds64(nsc1, r1 + uint32_t(swnv::k_scales(t)));
    }
    // A of 128-dim tile j: 8 k-steps, 4 registers each.
    auto convert = [&](int j, uint32_t(&a)[8][4]) {
      if constexpr (kNv) {  // 8 bytes (lane t's block of the chunk) per row and chunk, times its scale
#pragma unroll
        for (int cc = 0; cc < 2; ++cc) {
          const int ch = 2 * j + cc;
          uint32_t u0[2], u1[2], k0[4][2], k1[4][2];
          swnv::lds64(u0, r0 + uint32_t(swnv::k_bytes(ch, t)));
          swnv::lds64(u1, r1 + uint32_t(swnv::k_bytes(ch, t)));
          swnv::k_chunk(u0[0], u0[1], swnv::k_scale(nsc0[0], nsc0[1], ch), k0);
          swnv::k_chunk(u1[0], u1[1], swnv::k_scale(nsc1[0], nsc1[1], ch), k1);
#pragma unroll
          for (int k = 0; k < 4; ++k) {
            a[4 * cc + k][0] = k0[k][0];
            a[4 * cc + k][1] = k1[k][0];
            a[4 * cc + k][2] = k0[k][1];
            a[4 * cc + k][3] = k1[k][1];
          }
        }
      } else {
#pragma unroll
        for (int cc = 0; cc < 2; ++cc) {
          uint32_t u0[4], u1[4];
          const uint32_t off = uint32_t((2 * j + cc) * 64);  // (an immediate: lane t's 16 t is in k0, k1)
          swab::lds128(u0, k0 + off);
          swab::lds128(u1, k1 + off);
#pragma unroll
          for (int k = 0; k < 4; ++k) {
            a[4 * cc + k][0] = swab::e4m3x2_bits<swab::kSelLo>(u0[k], u0[k]);
            a[4 * cc + k][1] = swab::e4m3x2_bits<swab::kSelLo>(u1[k], u1[k]);
            a[4 * cc + k][2] = swab::e4m3x2_bits<swab::kSelHi>(u0[k], u0[k]);
            a[4 * cc + k][3] = swab::e4m3x2_bits<swab::kSelHi>(u1[k], u1[k]);
          }
        }
      }
    };
    auto issue = [&](int j, uint32_t(&a)[8][4], float(&acc)[kNH]) {
      ptx::wgmma_fence();
#pragma unroll
      for (int k = 0; k < 8; ++k)
        swab::wgmma_rs16(acc, a[k], qd + (2 * j + (k >> 2)) * kChunk + uint32_t(2 * (k & 3)), k == 0 ? 0 : 1);
      ptx::wgmma_commit();
    };
    auto add = [&](int j, float(&acc)[kNH]) {  // times the rows' scale of tile j (fp8_ds_mla)
      if constexpr (kDs) {
        auto comp = [](const float4& v, int k) { return k == 0 ? v.x : k == 1 ? v.y : k == 2 ? v.z : v.w; };
        const float scl[2] = {comp(esc[0], j), comp(esc[1], j)};
#pragma unroll
        for (int i = 0; i < kNH; ++i) x[i] = fmaf(acc[i], scl[(i >> 1) & 1], x[i]);
      } else {
#pragma unroll
        for (int i = 0; i < kNH; ++i) x[i] += acc[i];
      }
    };
    // Two A register sets: chain j + 1 is converted while chain j runs.
    float acc[2][kNH];
    uint32_t a[2][8][4];
    convert(0, a[0]);
    issue(0, a[0], acc[0]);
#pragma unroll
    for (int j = 1; j < 4; ++j) {
      convert(j, a[j & 1]);
      issue(j, a[j & 1], acc[j & 1]);
      ptx::wgmma_wait<1>();
      ptx::fence_operands(acc[(j - 1) & 1]);
      swab::fence_a(a[(j - 1) & 1]);
      add(j - 1, acc[(j - 1) & 1]);
    }
    ptx::wgmma_wait<0>();
    ptx::fence_operands(acc[1]);
    swab::fence_a(a[1]);
    add(3, acc[1]);
    if (rope) {  // fp8_ds_mla: bf16 RoPE at bytes 528..655, lane t's dims [16 t, 16 t + 16), 2 per word;
                 // fp8_e4m3 / nvfp4_ds_mla: e4m3 RoPE at bytes 512..575 / 256..319, converted as e4m3 latent
      uint32_t ar[4][4];
      if constexpr (kDs) {
        uint32_t v0[8], v1[8];
        swab::lds128(*reinterpret_cast<uint32_t(*)[4]>(&v0[0]), r0 + 528 + 32 * t);
        swab::lds128(*reinterpret_cast<uint32_t(*)[4]>(&v0[4]), r0 + 544 + 32 * t);
        swab::lds128(*reinterpret_cast<uint32_t(*)[4]>(&v1[0]), r1 + 528 + 32 * t);
        swab::lds128(*reinterpret_cast<uint32_t(*)[4]>(&v1[4]), r1 + 544 + 32 * t);
#pragma unroll
        for (int k = 0; k < 4; ++k) ar[k][0] = v0[2 * k], ar[k][1] = v1[2 * k], ar[k][2] = v0[2 * k + 1], ar[k][3] = v1[2 * k + 1];
      } else {
        uint32_t u0[4], u1[4];
        swab::lds128(u0, r0 + kRopeE4m3 + 16 * t);
        swab::lds128(u1, r1 + kRopeE4m3 + 16 * t);
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          ar[k][0] = swab::e4m3x2_bits<swab::kSelLo>(u0[k], u0[k]);
          ar[k][1] = swab::e4m3x2_bits<swab::kSelLo>(u1[k], u1[k]);
          ar[k][2] = swab::e4m3x2_bits<swab::kSelHi>(u0[k], u0[k]);
          ar[k][3] = swab::e4m3x2_bits<swab::kSelHi>(u1[k], u1[k]);
        }
      }
      ptx::wgmma_fence();
#pragma unroll
      for (int k = 0; k < 4; ++k) swab::wgmma_rs16(acc[0], ar[k], qd + 8 * kChunk + uint32_t(2 * k), k == 0 ? 0 : 1);
      ptx::wgmma_commit();
      ptx::wgmma_wait<0>();
      ptx::fence_operands(acc[0]);
      swab::fence_a(ar);
      // the latent chains are in units of 2^(e_h - 120), a bf16 RoPE's 2^e_h (an e4m3 one's as the latent)
      constexpr float kRope = kDs ? 7.52316384526264e-37f : 1.0f;  // 2^-120
#pragma unroll
      for (int i = 0; i < kNH; ++i) x[i] = fmaf(acc[0][i], kRope, x[i]);
    }
  }

  // N = 32 (O^T holds 128 registers: one A chunk of 4 k-steps converted while the previous one runs, one
  // chain accumulator): the same products as scores(). fp8_e4m3 (no row scales, RoPE in the latent's
  // units): every k-step into x; fp8_ds_mla: chain j into acc, then x += scale_j * acc.
  __device__ __forceinline__ static void scores32(uint32_t kv, uint32_t q_base, int slot0, int slot1, int t, bool rope,
                                                  float (&x)[kNH], float4 (&esc)[2]) {
    static_assert(!kNv, "N = 32: fp8_ds_mla and fp8_e4m3");
    const uint32_t r0 = kv + uint32_t(slot0 * Cfg::kRowStride), r1 = kv + uint32_t(slot1 * Cfg::kRowStride);
    const uint32_t k0 = r0 + uint32_t(16 * t), k1 = r1 + uint32_t(16 * t);
    const uint64_t qd = ptx::sw128_desc(q_base, 16, 1024);
    constexpr uint32_t kChunk = uint32_t(Cfg::kOperandBytes >> 4);
    // 64-dim chunk ch (0..7 latent; 8 the e4m3 RoPE): 4 k-steps
    auto convert = [&](int ch, uint32_t(&a)[4][4]) {
      uint32_t u0[4], u1[4];
      const uint32_t off = ch < 8 ? uint32_t(ch * 64) : uint32_t(kRopeE4m3);
      swab::lds128(u0, k0 + off);
      swab::lds128(u1, k1 + off);
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        a[k][0] = swab::e4m3x2_bits<swab::kSelLo>(u0[k], u0[k]);
        a[k][1] = swab::e4m3x2_bits<swab::kSelLo>(u1[k], u1[k]);
        a[k][2] = swab::e4m3x2_bits<swab::kSelHi>(u0[k], u0[k]);
        a[k][3] = swab::e4m3x2_bits<swab::kSelHi>(u1[k], u1[k]);
      }
    };
    auto issue = [&](int ch, uint32_t(&a)[4][4], float(&d)[kNH], bool first) {
      ptx::wgmma_fence();
#pragma unroll
      for (int k = 0; k < 4; ++k) swab::wgmma_rs16(d, a[k], qd + uint32_t(ch) * kChunk + uint32_t(2 * k), first && k == 0 ? 0 : 1);
      ptx::wgmma_commit();
    };
    uint32_t a[2][4][4];
    if constexpr (!kDs) {
#pragma unroll
      for (int ch = 0; ch < 9; ++ch) {  // (x needs no zeroing: the first k-step overwrites it)
        if (ch == 8 && !rope) break;
        if (ch >= 2) {
          ptx::wgmma_wait<1>();
          swab::fence_a(a[ch & 1]);
        }
        convert(ch, a[ch & 1]);
        issue(ch, a[ch & 1], x, ch == 0);
      }
      ptx::wgmma_wait<0>();
      swab::fence_a(a[0]);
      swab::fence_a(a[1]);
      ptx::fence_operands(x);
    } else {
#pragma unroll
      for (int i = 0; i < kNH; ++i) x[i] = 0.0f;
      float acc[kNH];
      // (the rows' scale of tile j loaded per chain, and all four again at the end for P: 8 registers
      // fewer through S than holding them)
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        convert(2 * j, a[0]);
        issue(2 * j, a[0], acc, true);
        convert(2 * j + 1, a[1]);
        issue(2 * j + 1, a[1], acc, false);
        ptx::wgmma_wait<0>();
        ptx::fence_operands(acc);
        swab::fence_a(a[0]);
        swab::fence_a(a[1]);
        const float scl[2] = {__uint_as_float(swab::lds32(r0 + uint32_t(512 + 4 * j))),
                              __uint_as_float(swab::lds32(r1 + uint32_t(512 + 4 * j)))};
#pragma unroll
        for (int i = 0; i < kNH; ++i) x[i] = fmaf(acc[i], scl[(i >> 1) & 1], x[i]);
      }
      if (rope) {  // bf16 RoPE at bytes 528..655, lane t's dims [16 t, 16 t + 16), 2 per word
        uint32_t ar[4][4];
        uint32_t v0[8], v1[8];
        swab::lds128(*reinterpret_cast<uint32_t(*)[4]>(&v0[0]), r0 + 528 + 32 * t);
        swab::lds128(*reinterpret_cast<uint32_t(*)[4]>(&v0[4]), r0 + 544 + 32 * t);
        swab::lds128(*reinterpret_cast<uint32_t(*)[4]>(&v1[0]), r1 + 528 + 32 * t);
        swab::lds128(*reinterpret_cast<uint32_t(*)[4]>(&v1[4]), r1 + 544 + 32 * t);
#pragma unroll
        for (int k = 0; k < 4; ++k) ar[k][0] = v0[2 * k], ar[k][1] = v1[2 * k], ar[k][2] = v0[2 * k + 1], ar[k][3] = v1[2 * k + 1];
        issue(8, ar, acc, true);
        ptx::wgmma_wait<0>();
        ptx::fence_operands(acc);
        swab::fence_a(ar);
        constexpr float kRope = 7.52316384526264e-37f;  // 2^-120: the latent chains' units against the RoPE's
#pragma unroll
        for (int i = 0; i < kNH; ++i) x[i] = fmaf(acc[i], kRope, x[i]);
      }
      esc[0] = swab::lds128f(r0 + 512);
      esc[1] = swab::lds128f(r1 + 512);
    }
  }

  // O^T += V^T P^T for the tile in stage `kv`: lane (w, g, t) holds dims dim0(j, w, g) + 2 h + r
  // (m-tile mt = 2 j + h, fragment row g + 8 r) and reads 4 bytes of each of its 16 rows per j.
  // Arrives on `empty` once its last load is done (A lives in registers).
  // (Masked rows' stale bytes are converted too: the bit moves never make NaN or inf, and their P is 0.)
  __device__ __forceinline__ static void pv_convert(uint32_t kv, int w, int g, int t, int ks, uint32_t (&a)[8][4]) {
    if constexpr (kNv) {  // the lane's block of each row: 8 bytes (16 dims) and its scale byte
      uint32_t vv[4][2], sb[4];  // [k column 2t, 2t+1, 2t+8, 2t+9][word], [column]
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int m = 16 * ks + 2 * t + (c & 1) + 8 * (c >> 1);
        const uint32_t row = kv + uint32_t(swab::slot_of(m) * Cfg::kRowStride);
        swnv::lds64(vv[c], row + uint32_t(swnv::v_bytes(w, g)));
        sb[c] = swnv::lds8(row + uint32_t(swnv::v_scale_off(w, g)));
      }
      const uint32_t s01 = swnv::v_scale(sb[0], sb[1]), s23 = swnv::v_scale(sb[2], sb[3]);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        uint32_t r01[4], r23[4];
        swnv::v_pair(vv[0][j >> 1], vv[1][j >> 1], j, s01, r01);
        swnv::v_pair(vv[2][j >> 1], vv[3][j >> 1], j, s23, r23);
        a[2 * j][0] = r01[0], a[2 * j][1] = r01[1], a[2 * j + 1][0] = r01[2], a[2 * j + 1][1] = r01[3];
        a[2 * j][2] = r23[0], a[2 * j][3] = r23[1], a[2 * j + 1][2] = r23[2], a[2 * j + 1][3] = r23[3];
      }
      return;
    }
    const uint32_t col = uint32_t(dim0(0, w, g));
    uint32_t wd[4][4];  // [k column 2t, 2t+1, 2t+8, 2t+9][j]
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const int m = 16 * ks + 2 * t + (c & 1) + 8 * (c >> 1);
      const uint32_t row = kv + uint32_t(swab::slot_of(m) * Cfg::kRowStride) + col;
      if constexpr (kV16) {
        swab::lds128(wd[c], row);
      } else {
#pragma unroll
        for (int j = 0; j < 4; ++j) wd[c][j] = swab::lds32(row + uint32_t(128 * j));
      }
    }
    // m-tile 2j: bytes 0, 1 of the words (fragment rows g, g + 8); m-tile 2j + 1: bytes 2, 3
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      a[2 * j][0] = swab::e4m3x2_bits<swab::kPair<0>>(wd[0][j], wd[1][j]);
      a[2 * j][1] = swab::e4m3x2_bits<swab::kPair<1>>(wd[0][j], wd[1][j]);
      a[2 * j][2] = swab::e4m3x2_bits<swab::kPair<0>>(wd[2][j], wd[3][j]);
      a[2 * j][3] = swab::e4m3x2_bits<swab::kPair<1>>(wd[2][j], wd[3][j]);
      a[2 * j + 1][0] = swab::e4m3x2_bits<swab::kPair<2>>(wd[0][j], wd[1][j]);
      a[2 * j + 1][1] = swab::e4m3x2_bits<swab::kPair<3>>(wd[0][j], wd[1][j]);
      a[2 * j + 1][2] = swab::e4m3x2_bits<swab::kPair<2>>(wd[2][j], wd[3][j]);
      a[2 * j + 1][3] = swab::e4m3x2_bits<swab::kPair<3>>(wd[2][j], wd[3][j]);
    }
  }
  __device__ __forceinline__ static void pv(uint32_t kv, uint32_t p_base, int w, int g, int t, uint32_t empty,
                                            float (&o)[8][kNH]) {
    uint32_t a[2][8][4];  // two A register sets: k-step ks + 1 is converted while ks runs
    // (fp8_ds_mla, four P^T: opaque per tile, so the compiler forms the 16 descriptors from it in uniform
    // registers, one add each, where it would hoist them out of the loop into 32 ordinary registers and
    // move them to uniform ones per wgmma: docs/perf-history.md#s12-swapab-diet. One P^T: not needed.)
    if constexpr (kPTiles == 4) asm volatile("" : "+r"(p_base));
    const uint64_t pd = ptx::sw128_desc(p_base, 16, 1024);
    auto issue = [&](int ks, uint32_t(&ak)[8][4]) {
      ptx::wgmma_fence();
#pragma unroll
      for (int mt = 0; mt < 8; ++mt) swab::wgmma_rs16(o[mt], ak[mt], pd + p_tile(mt) + uint32_t(2 * ks), 1);
      ptx::wgmma_commit();
    };
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) {
      if (ks >= 2) {
        ptx::wgmma_wait<1>();
        swab::fence_a(a[ks & 1]);
      }
      pv_convert(kv, w, g, t, ks, a[ks & 1]);
      if (ks == 3) ptx::mbar_arrive(empty);
      issue(ks, a[ks & 1]);
    }
    ptx::wgmma_wait<0>();
    swab::fence_a(a[0]);
    swab::fence_a(a[1]);
#pragma unroll
    for (int mt = 0; mt < 8; ++mt) ptx::fence_operands(o[mt]);
  }

  // kP8: O^T += (V^T P^T) / F_j for the tile: two k32 steps s, each the words of k16 blocks 2 s and 2 s + 1
  // (words(s, wd): loaded as pv_convert loads them) transposed into
  // e4m3 A fragments, then per m-tile hi (B at k 32 s) and lo (B at k 64 + 32 s) into a fresh accumulator
  // (128 products, then promoted: DESIGN.md §8), added to O times inv_f of its latent tile.
  template <class Words>
  __device__ __forceinline__ static void pv8(Words&& words, uint32_t p_base, const float (&inv_f)[kPTiles],
                                             float (&o)[8][kNH]) {
    uint32_t a[2][8][4];
    float acc[8][kNH];
    // (four P^T: opaque per tile, so the descriptors are formed in uniform registers: s12-swapab-diet)
    if constexpr (kPTiles == 4) asm volatile("" : "+r"(p_base));
    const uint64_t pd = ptx::sw128_desc(p_base, 16, 1024);
#pragma unroll
    for (int st = 0; st < 2; ++st) {
      uint32_t wd[2][4][4];
      words(st, wd);
      swp8::v_fragments(wd, a[st]);
      ptx::wgmma_fence();
#pragma unroll
      for (int mt = 0; mt < 8; ++mt) {
        swab::wgmma_rs8(acc[mt], a[st][mt], pd + p_tile(mt) + uint32_t(2 * st), st);
        swab::wgmma_rs8(acc[mt], a[st][mt], pd + p_tile(mt) + uint32_t(2 * st + 4), 1);
      }
      ptx::wgmma_commit();
    }
    ptx::wgmma_wait<0>();
    swab::fence_a(a[0]);
    swab::fence_a(a[1]);
#pragma unroll
    for (int mt = 0; mt < 8; ++mt) {
      ptx::fence_operands(acc[mt]);
#pragma unroll
      for (int i = 0; i < kNH; ++i) o[mt][i] = fmaf(acc[mt][i], inv_f[kPTiles == 4 ? mt >> 1 : 0], o[mt][i]);
    }
  }
  // kP8, N = 32 (O^T is 128 registers: no room for a fresh accumulator of all 8 m-tiles): one latent tile j
  // at a time, m-tiles 2 j and 2 j + 1 into a fresh accumulator (32 registers), promoted before the next j.
  // The same products per (dim, head) in the same k order as pv8. Arrives on `empty` after its last load.
  template <int kJ0, int kJ1>
  __device__ __forceinline__ static void pv8_by_tile(uint32_t kv, int w, int g, int t, uint32_t p_base,
                                                     const float (&inv_f)[kPTiles], uint32_t empty, float (&o)[8][kNH]) {
    if constexpr (kPTiles == 4) asm volatile("" : "+r"(p_base));
    const uint64_t pd = ptx::sw128_desc(p_base, 16, 1024);
#pragma unroll
    for (int j = kJ0; j < kJ1; ++j) {
      const uint32_t pj = kPTiles == 4 ? uint32_t(j % Cfg::kPBufs) * uint32_t(Cfg::kOperandBytes >> 4) : 0u;
      uint32_t a[2][2][4];  // [k32 step][m-tile 2 j + h]
#pragma unroll
      for (int st = 0; st < 2; ++st) {  // (per k32 step: 8 words live, not 16)
        uint32_t wd[2][4];  // [k16 block 2 st + half][word c]: 4 bytes at dims dim0(j) .. + 3 of row_of_word(kk, t, c)
#pragma unroll
        for (int half = 0; half < 2; ++half)
#pragma unroll
          for (int c = 0; c < 4; ++c)
            wd[half][c] = swab::lds32(
                kv + uint32_t(swab::slot_of(swp8::row_of_word(2 * st + half, t, c)) * Cfg::kRowStride) +
                uint32_t(dim0(j, w, g)));
        if (j == 3 && st == 1) ptx::mbar_arrive(empty);  // (after the tile's last loads)
        swp8::v_fragments_tile(wd, a[st]);
      }
      float acc[2][kNH];
      ptx::wgmma_fence();
#pragma unroll
      for (int st = 0; st < 2; ++st)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          swab::wgmma_rs8(acc[h], a[st][h], pd + pj + uint32_t(2 * st), st);
          swab::wgmma_rs8(acc[h], a[st][h], pd + pj + uint32_t(2 * st + 4), 1);
        }
      ptx::wgmma_commit();
      ptx::wgmma_wait<0>();
      swab::fence_a(a[0]);
      swab::fence_a(a[1]);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        ptx::fence_operands(acc[h]);
#pragma unroll
        for (int i = 0; i < kNH; ++i) o[2 * j + h][i] = fmaf(acc[h][i], inv_f[kPTiles == 4 ? j : 0], o[2 * j + h][i]);
      }
    }
  }
  // kP8: the words of k16 block kk as pv_convert loads them: wd[c][j].
  __device__ __forceinline__ static void pv_load_block(uint32_t kv, int w, int g, int t, int kk, uint32_t (&wd)[4][4]) {
    const uint32_t col = uint32_t(dim0(0, w, g));
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const uint32_t row = kv + uint32_t(swab::slot_of(swp8::row_of_word(kk, t, c)) * Cfg::kRowStride) + col;
      if constexpr (kV16) {
        swab::lds128(wd[c], row);
      } else {
#pragma unroll
        for (int j = 0; j < 4; ++j) wd[c][j] = swab::lds32(row + uint32_t(128 * j));
      }
    }
  }

  // The tile loop of consumer c (thread wt of its warpgroup), then the merge with the other
  // consumer and the stores (consumer 0).
  __device__ __forceinline__ static void run(const KernelParams& p, Smem& s, const WsBlock& w, int c, int wt) {
    const int warp = wt >> 5, lane = wt & 31, g = lane >> 2, t = lane & 3;
    const uint32_t bar_wg = 2u + uint32_t(c);  // named barrier of this warpgroup (ids 2, 3)
    const bool rope = p.k_steps > kLatent / 16;
    const int m0 = 16 * warp + g, m1 = m0 + 8;  // this lane's S^T rows (logical)
    const int slot0 = swab::slot_of(m0), slot1 = swab::slot_of(m1);
    // the heads' q factors; N = 32: read from shared memory per tile (8 registers less over the loop)
    float qf[kN == 16 ? kNB : 1][2];
    if constexpr (kN == 16) {
#pragma unroll
      for (int i = 0; i < kNB; ++i) qf[i][0] = s.qfac[8 * i + 2 * t], qf[i][1] = s.qfac[8 * i + 2 * t + 1];
    }
    float o[8][kNH];
#pragma unroll
    for (int mt = 0; mt < 8; ++mt)
#pragma unroll
      for (int i = 0; i < kNH; ++i) o[mt][i] = 0.0f;
    float m_run[kNB][2], l_run[kNB][2];
#pragma unroll
    for (int i = 0; i < kNB; ++i) m_run[i][0] = m_run[i][1] = -INFINITY, l_run[i][0] = l_run[i][1] = 0.0f;
    constexpr float k2p56 = 72057594037927936.0f;
    const uint32_t q_base = ptx::smem_addr(s.q);
    int iter = 0;
    for (int tile = c; tile < w.num_tiles; tile += 2, ++iter) {
      const int st = tile % Cfg::kStages;
      ptx::mbar_wait(ws_bar(s.full[st]), uint32_t((tile / Cfg::kStages) & 1));
      const uint32_t kv = ptx::smem_addr(s.kv[st]);
      const uint64_t vmask = s.valid[st][0] | s.valid[st][1] | s.valid[st][2] | s.valid[st][3];
      const bool v0 = (vmask >> slot0) & 1, v1 = (vmask >> slot1) & 1;
      if constexpr (kDiag == 1) {  // timing only: the rows' ring without any compute
        ptx::mbar_arrive(ws_bar(s.empty[st]));
        continue;
      }
      float x[kNH];
      float4 esc[2];  // fp8_ds_mla: the rows' tile scales (S's chains, then P)
      if constexpr (kN == 32) scores32(kv, q_base, slot0, slot1, t, rope, x, esc);
      else scores(kv, q_base, slot0, slot1, t, rope, x, esc);
      // x[4 i + 2 r + e]: row m_r, head 8 i + 2 t + e. Scores in the log2 domain, masked rows -inf.
      float mx[kNB][2];
#pragma unroll
      for (int i = 0; i < kNB; ++i) {
        float qfi[2];
        if constexpr (kN == 16) {
          qfi[0] = qf[i][0], qfi[1] = qf[i][1];
        } else {
          uint32_t b[2];
          swnv::lds64(b, ptx::smem_addr(s.qfac) + uint32_t(4 * (8 * i + 2 * t)));
          qfi[0] = __uint_as_float(b[0]), qfi[1] = __uint_as_float(b[1]);
        }
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float s0 = v0 ? x[4 * i + e] * qfi[e] : -INFINITY;
          const float s1 = v1 ? x[4 * i + 2 + e] * qfi[e] : -INFINITY;
          x[4 * i + e] = s0, x[4 * i + 2 + e] = s1;
          float m = fmaxf(s0, s1);
          m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 4));
          m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 8));
          m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 16));
          mx[i][e] = m;
        }
      }
      const int par = iter & 1;
      if constexpr (kP8 && kDs) {  // the warp's max |scale_j| over its rows (bits of positive floats), j = 0..3;
                                    // a masked row's scales are 0 (the producer zeroes its slot)
        const float s0[4] = {esc[0].x, esc[0].y, esc[0].z, esc[0].w}, s1[4] = {esc[1].x, esc[1].y, esc[1].z, esc[1].w};
        uint32_t sm[4];
#pragma unroll
        for (int j = 0; j < 4; ++j)
          sm[j] = swab::redux_max(max(__float_as_uint(s0[j]) & 0x7fffffffu, __float_as_uint(s1[j]) & 0x7fffffffu));
        if (lane == 0) *reinterpret_cast<uint4*>(s.red_s[c][par][warp]) = make_uint4(sm[0], sm[1], sm[2], sm[3]);
      }
      if (g == 0) {
#pragma unroll
        for (int i = 0; i < kNB; ++i)
#pragma unroll
          for (int e = 0; e < 2; ++e) s.red_m[c][par][warp][8 * i + 2 * t + e] = mx[i][e];
      }
      ptx::named_sync(bar_wg, 128);
      // kP8: F_j, the power of two that puts P * scale_j * F_j under 256 over the tile (fp8_e4m3: F = 2^8)
      float tf[kPTiles], inv_tf[kPTiles];
      if constexpr (kP8 && kDs) {
        uint4 r[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) r[k] = *reinterpret_cast<const uint4*>(s.red_s[c][par][k]);
        const uint32_t mj[4] = {max(max(r[0].x, r[1].x), max(r[2].x, r[3].x)),
                                max(max(r[0].y, r[1].y), max(r[2].y, r[3].y)),
                                max(max(r[0].z, r[1].z), max(r[2].z, r[3].z)),
                                max(max(r[0].w, r[1].w), max(r[2].w, r[3].w))};
#pragma unroll
        for (int j = 0; j < kPTiles; ++j) swp8::tile_factor(mj[j], tf[j], inv_tf[j]);
      } else {
#pragma unroll
        for (int j = 0; j < kPTiles; ++j) tf[j] = 256.0f, inv_tf[j] = 1.0f / 256.0f;
      }
      float f[kNB][2];
      bool any_f = false;
#pragma unroll
      for (int i = 0; i < kNB; ++i)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int h = 8 * i + 2 * t + e;
          float m = fmaxf(fmaxf(s.red_m[c][par][0][h], s.red_m[c][par][1][h]),
                          fmaxf(s.red_m[c][par][2][h], s.red_m[c][par][3][h]));
          m = fmaxf(m, m_run[i][e]);
          f[i][e] = m == m_run[i][e] ? 1.0f : ws::rescale(m_run[i][e], m);
          any_f |= f[i][e] != 1.0f;
          m_run[i][e] = m;
          const float nref = -ws::ref_of(m);
          const float p0 = ptx::fast_exp2(x[4 * i + e] + nref), p1 = ptx::fast_exp2(x[4 * i + 2 + e] + nref);
          x[4 * i + e] = p0, x[4 * i + 2 + e] = p1;
          l_run[i][e] = l_run[i][e] * f[i][e] + p0 + p1;
        }
      if (__any_sync(0xffffffffu, any_f)) {
#pragma unroll
        for (int mt = 0; mt < 8; ++mt)
#pragma unroll
          for (int i = 0; i < kNH; ++i) o[mt][i] *= f[i >> 2][i & 1];
      }
      // kP8: P^T * scale_j * F_j as hi + lo e4m3 (0 for masked rows: P = 0 and their zeroed scales),
      // head h's row of tile j's B operand = hi at k, lo at 64 + k (k = swp8::k_of_row(m)): stmatrix.trans of
      // (8 k-pairs x 8 heads) b16 blocks, the element of lane (g, t) = rows (m0, m1) of heads 8 ib + 2 t + e.
      if constexpr (kP8) {
        const float s0[4] = {esc[0].x, esc[0].y, esc[0].z, esc[0].w}, s1[4] = {esc[1].x, esc[1].y, esc[1].z, esc[1].w};
        uint32_t ph[kNB][2];  // P of rows (m0, m1), f16x2, per head 8 i + 2 t + e
#pragma unroll
        for (int i = 0; i < kNB; ++i)
#pragma unroll
          for (int e = 0; e < 2; ++e) ph[i][e] = swp8::pack_f16x2(x[4 * i + e], x[4 * i + 2 + e]);
        auto write_p = [&](int j, float sc0, float sc1) {  // sc0, sc1: the rows' scale of tile j (fp8_ds_mla)
          // (a masked row: P = 0 and, fp8_ds_mla, its zeroed slot's scale 0)
          const float f0 = kDs ? sc0 * tf[j] : tf[j], f1 = kDs ? sc1 * tf[j] : tf[j];
          const uint32_t sp = swp8::pack_f16x2(f0, f1);
          const uint32_t pb = ptx::smem_addr(s.p[c][j % Cfg::kPBufs]);
#pragma unroll
          for (int q4 = 0; q4 < kNB / 2; ++q4) {  // matrices (ib, half) for ib = 2 q4, 2 q4 + 1; half 0 hi, 1 lo
            uint32_t r4[4];
#pragma unroll
            for (int b = 0; b < 2; ++b) {
              const int ib = 2 * q4 + b;
              swp8::split_e4m3x4(swp8::mul_f16x2(ph[ib][0], sp), swp8::mul_f16x2(ph[ib][1], sp), r4[2 * b],
                                 r4[2 * b + 1]);
            }
            const int mi = lane >> 3, ib = 2 * q4 + (mi >> 1), hl = mi & 1;
            const int h = 8 * ib + (lane & 7);
            swab::stmatrix_x4_trans(pb + uint32_t(h * 128 + (((4 * hl + warp) ^ (h & 7)) << 4)), r4);
          }
        };
        if constexpr (kN == 32 && kDs) {
          // two P^T buffers: tiles 0, 1, their P V, then 2, 3 over them once every warp's P V has read them
          write_p(0, s0[0], s1[0]);
          write_p(1, s0[1], s1[1]);
          ptx::fence_proxy_async_smem();
          ptx::named_sync(bar_wg, 128);
          pv8_by_tile<0, 2>(kv, warp, g, t, ptx::smem_addr(s.p[c][0]), inv_tf, ws_bar(s.empty[st]), o);
          ptx::named_sync(bar_wg, 128);
          // the rows' scales of tiles 2, 3 again from the stage (still held: registers are short here)
          const float4 e0 = swab::lds128f(kv + uint32_t(slot0 * Cfg::kRowStride + 512));
          const float4 e1 = swab::lds128f(kv + uint32_t(slot1 * Cfg::kRowStride + 512));
          write_p(2, e0.z, e1.z);
          write_p(3, e0.w, e1.w);
        } else {
#pragma unroll
          for (int j = 0; j < kPTiles; ++j) write_p(j, s0[j], s1[j]);
        }
      } else {
      // P^T * scale_j * 2^56 (0 for masked rows: their stale scale is never multiplied) as the
      // K-major B operand of tile j: stmatrix.trans of the (8 rows x 8 heads) blocks.
        float4 sc0 = make_float4(1.0f, 1.0f, 1.0f, 1.0f), sc1 = sc0;  // fp8_e4m3, nvfp4: no row scales
        if constexpr (kDs) sc0 = esc[0], sc1 = esc[1];
        const float s0[4] = {sc0.x, sc0.y, sc0.z, sc0.w}, s1[4] = {sc1.x, sc1.y, sc1.z, sc1.w};
        // lane l addresses row (head) 8 ib + l % 8 of matrix l / 8 = (ib, r); that matrix's 8 k are
        // rows 16 warp + 8 r + 0..7: chunk 2 warp + r of the head's 128 bytes.
#pragma unroll
        for (int j = 0; j < kPTiles; ++j) {
          const float f0 = v0 ? s0[j] * k2p56 : 0.0f, f1 = v1 ? s1[j] * k2p56 : 0.0f;
          const uint32_t pb = ptx::smem_addr(s.p[c][j]);
#pragma unroll
          for (int q4 = 0; q4 < kNB / 2; ++q4) {  // matrices (ib, r) for ib = 2 q4, 2 q4 + 1
            uint32_t r4[4];
#pragma unroll
            for (int k = 0; k < 4; ++k) {
              const int ib = 2 * q4 + (k >> 1), r = k & 1;
              const float fr = r ? f1 : f0;
              r4[k] = ptx::Bf16::pack(x[4 * ib + 2 * r] * fr, x[4 * ib + 2 * r + 1] * fr);
            }
            const int mi = lane >> 3, ib = 2 * q4 + (mi >> 1), r = mi & 1;
            const int h = 8 * ib + (lane & 7);
            swab::stmatrix_x4_trans(pb + uint32_t(h * 128 + (((2 * warp + r) ^ (h & 7)) << 4)), r4);
          }
        }
      }
      ptx::fence_proxy_async_smem();
      ptx::named_sync(bar_wg, 128);
      if constexpr (kP8 && kN == 32) {
        pv8_by_tile<kDs ? 2 : 0, 4>(kv, warp, g, t, ptx::smem_addr(s.p[c][0]), inv_tf, ws_bar(s.empty[st]), o);
      } else if constexpr (kP8) {
        const uint32_t empty = ws_bar(s.empty[st]);
        pv8([&](int s2, uint32_t(&wd)[2][4][4]) {
              pv_load_block(kv, warp, g, t, 2 * s2, wd[0]);
              pv_load_block(kv, warp, g, t, 2 * s2 + 1, wd[1]);
              if (s2 == 1) ptx::mbar_arrive(empty);  // (after the tile's last loads)
            }, ptx::smem_addr(s.p[c][0]), inv_tf, o);
      } else {
        pv(kv, ptx::smem_addr(s.p[c][0]), warp, g, t, ws_bar(s.empty[st]), o);
      }
    }

    // ---- merge the two consumers, then out / LSE (or the split's partials) from consumer 0.
    // Row sums: lanes of one t hold heads 8 i + 2 t + e over rows g: sum over g, then the warps.
#pragma unroll
    for (int i = 0; i < kNB; ++i)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float l = l_run[i][e];
        l += __shfl_xor_sync(0xffffffffu, l, 4);
        l += __shfl_xor_sync(0xffffffffu, l, 8);
        l += __shfl_xor_sync(0xffffffffu, l, 16);
        l_run[i][e] = l;
        if (g == 0) s.red_l[c][warp][8 * i + 2 * t + e] = l;
        if (c == 1 && warp == 0 && g == 0) s.fin_m[8 * i + 2 * t + e] = m_run[i][e];
      }
    // Consumer 1's O^T to its own stages (now idle: every one of its tiles' rows has landed and been
    // read by it), so no warpgroup writes what the other read (docs/perf-history.md#s12-swapab-diet).
    bar_sync(Bar::kConsumers, kConsumerThreads);
    // ob(mt)[i * 128 + wt]: m-tile mt's register i; m-tiles 0-3 and 4-7 in the two halves
    auto ob = [&](int mt) {
      uint8_t* half = Cfg::kObOneStage ? s.kv[1] + (mt >> 2) * Cfg::kObHalfBytes : s.kv[1 + 2 * (mt >> 2)];
      return reinterpret_cast<float*>(half) + (mt & 3) * kNH * 128;
    };
    if (c == 1) {
#pragma unroll
      for (int mt = 0; mt < 8; ++mt)
#pragma unroll
        for (int i = 0; i < kNH; ++i) ob(mt)[i * 128 + wt] = o[mt][i];
    }
    bar_sync(Bar::kConsumers, kConsumerThreads);
    if (c == 1) return;
    float lse[kNB][2];
    bool hv[kNB][2];
#pragma unroll
    for (int i = 0; i < kNB; ++i)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int h = 8 * i + 2 * t + e;
        hv[i][e] = w.head0 + h < p.num_heads;
        const float ma = m_run[i][e], mb = s.fin_m[h];
        const float la = s.red_l[0][0][h] + s.red_l[0][1][h] + s.red_l[0][2][h] + s.red_l[0][3][h];
        const float lb = s.red_l[1][0][h] + s.red_l[1][1][h] + s.red_l[1][2][h] + s.red_l[1][3][h];
        const float m = fmaxf(ma, mb);
        const float fa = ws::rescale(ma, m), fb = ws::rescale(mb, m);
        const float l = la * fa + lb * fb;
        float denom = l;
        if (p.num_splits == 1 && p.sink != nullptr && l > 0.0f && hv[i][e]) denom += exp2f(p.sink[w.head0 + h] * kLog2e - m);
        // O = 2^64 * accumulator (P carried 2^56, V 2^-120); kP8: O is in the rows' units already
        constexpr float kOUnit = kP8 ? 1.0f : 18446744073709551616.0f;
        const float sc = l > 0.0f ? p.out_scale * kOUnit / denom : 0.0f;
#pragma unroll
        for (int mt = 0; mt < 8; ++mt)
#pragma unroll
          for (int k = 0; k < 2; ++k) {
            const int idx = 4 * i + 2 * k + e;
            o[mt][idx] = (o[mt][idx] * fa + ob(mt)[idx * 128 + wt] * fb) * sc;
          }
        lse[i][e] = l > 0.0f ? (m + log2f(l)) * kLn2 : -INFINITY;
      }
    // Lane (w, g, t): dims dim0(j, w, g) + {0, 1, 2, 3} of head 8 i + 2 t + e =
    // o[2j][4i + e], o[2j][4i + 2 + e], o[2j + 1][4i + e], o[2j + 1][4i + 2 + e].
#pragma unroll
    for (int i = 0; i < kNB; ++i)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        if (!hv[i][e]) continue;
        const int h = w.head0 + 8 * i + 2 * t + e;  // the call's head
        if (p.num_splits == 1) {
          auto* out = static_cast<uint16_t*>(p.out) + w.t * p.out_stride_t + int64_t(h) * p.out_stride_h;
          const bool vec = (reinterpret_cast<uintptr_t>(out) & 7) == 0;
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            const uint32_t lo = ptx::Bf16::pack(o[2 * j][4 * i + e], o[2 * j][4 * i + 2 + e]);
            const uint32_t hi = ptx::Bf16::pack(o[2 * j + 1][4 * i + e], o[2 * j + 1][4 * i + 2 + e]);
            uint16_t* d = out + dim0(j, warp, g);
            if (vec) {
              *reinterpret_cast<uint2*>(d) = make_uint2(lo, hi);
            } else {
              d[0] = uint16_t(lo & 0xffffu), d[1] = uint16_t(lo >> 16), d[2] = uint16_t(hi & 0xffffu), d[3] = uint16_t(hi >> 16);
            }
          }
          if (p.lse != nullptr && warp == 0 && g == 0)
            p.lse[w.t * p.lse_stride_t + h] = p.lse_base2 ? lse[i][e] * kLog2e : lse[i][e];
        } else {
          const int64_t part = (w.t * p.num_heads + h) * p.num_splits + w.split;
          uint16_t* po = p.part_out + part * kLatent;
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            const uint32_t lo = ptx::Bf16::pack(o[2 * j][4 * i + e], o[2 * j][4 * i + 2 + e]);
            const uint32_t hi = ptx::Bf16::pack(o[2 * j + 1][4 * i + e], o[2 * j + 1][4 * i + 2 + e]);
            *reinterpret_cast<uint2*>(po + dim0(j, warp, g)) = make_uint2(lo, hi);
          }
          if (warp == 0 && g == 0) p.part_lse[part] = lse[i][e];
        }
      }
  }

};

// kDiag (timing only, wrong results; `SMLA_SM90_SWAPAB_DIAG`): 1 the rows' ring alone (consumers
// release each stage at once), 2 the compute alone (the producer copies nothing).
template <int kN, int kDiag, KvFormat kF>
__global__ void __launch_bounds__(SwabConfig<kN, kF>::kThreads, 1) sparse_mla_swapab_kernel(const __grid_constant__ KernelParams p) {
  using Cfg = SwabConfig<kN, kF>;
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  auto& s = *reinterpret_cast<typename Cfg::SharedStorage*>(smem_raw);
  WsBlock w = block_work(p);
  // heads [head0, head0 + kN) of head group blockIdx.x % p.head_groups (p.head_groups = 1: H <= kN)
  w.head0 = int(blockIdx.x - w.t * p.head_groups) * kN;
  if (threadIdx.x == 0) {
    for (int i = 0; i < Cfg::kStages; ++i) {
      // every producer thread's copies landed (128) and the 4 warps' valid bits stored
      ptx::mbar_init(ws_bar(s.full[i]), 128 + 4);
      ptx::mbar_init(ws_bar(s.empty[i]), 128);  // the consuming warpgroup, once per tile
    }
    ptx::fence_mbar_init();
  }
  __syncthreads();
  ptx::pdl_launch_dependents();  // the split merge (a PDL launch) may start its blocks now
  const int wg = threadIdx.x / 128, wt = threadIdx.x % 128;
  if (wg == 2) {
    ptx::setmaxnreg_dec<Cfg::kProducerRegs>();
    swab_produce<kN, kDiag, kF>(p, s, w, wt);
    return;
  }
  ptx::setmaxnreg_inc<Cfg::kConsumerRegs>();
  swab_load_q<kN, kF>(p, s, w, threadIdx.x);
  ptx::fence_proxy_async_smem();
  __syncwarp();  // (swab_load_q branches per lane: reconverged here, the barrier below needs no divergence check)
  bar_sync(Bar::kConsumers, kConsumerThreads);
  // The consumer index from a shuffle of lane 0's: the compiler then knows it is warp-uniform and keeps
  // what derives from it (the P^T descriptors of P V) in uniform registers, not one R2UR pair per wgmma
  // (docs/perf-history.md#s12-swapab-diet).
  const int c = __shfl_sync(0xffffffffu, wg, 0);
  SwabConsumer<kN, kDiag, kF>::run(p, s, w, c, wt);
}

template <int kN, int kDiag, KvFormat kF>
void launch_swapab_mode(const KernelParams& p, cudaStream_t stream) {
  using Cfg = SwabConfig<kN, kF>;
  auto* kernel = sparse_mla_swapab_kernel<kN, kDiag, kF>;
  static std::atomic<uint64_t> attribute_set{0};
  int dev = 0;
  SMLA_CHECK(cudaGetDevice(&dev) == cudaSuccess, "cudaGetDevice failed");
  const uint64_t bit = uint64_t(1) << (dev & 63);
  if (!(attribute_set.load(std::memory_order_acquire) & bit)) {
    const cudaError_t ea =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(Cfg::kSmemBytes));
    SMLA_CHECK(ea == cudaSuccess, std::string("cannot raise the swap-AB kernel's shared memory to ") +
                                      std::to_string(Cfg::kSmemBytes) + " bytes: " + cudaGetErrorString(ea));
    attribute_set.fetch_or(bit, std::memory_order_release);
  }
  const dim3 grid(unsigned(p.num_tokens * p.head_groups), 1, unsigned(p.num_splits));
  kernel<<<grid, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(p);
}

// SMLA_SM90_SWAPAB_DIAG=rows|compute (read once): the timing-only modes of kDiag, a diagnostic for
// `smla bench` that times a part of the kernel alone to locate its bound (wrong results, not a
// variant; docs/perf-history.md#s11-swapab).
inline int swapab_diag_mode() {
  static const int mode = [] {
    const char* e = std::getenv("SMLA_SM90_SWAPAB_DIAG");
    const std::string v = e != nullptr ? e : "";
    return v == "rows" ? 1 : v == "compute" ? 2 : 0;
  }();
  return mode;
}

// N = 16 (16 heads per block, H <= 16) or 32 (17 <= H <= 32; fp8_ds_mla, fp8_e4m3).
template <int kN, KvFormat kF>
void launch_swapab(const KernelParams& p, cudaStream_t stream) {
  if constexpr (kF == KvFormat::kFP8DsMla && kN == 16) {  // (the timing-only modes: fp8_ds_mla N = 16 only)
    switch (swapab_diag_mode()) {
      case 1: return launch_swapab_mode<kN, 1, kF>(p, stream);
      case 2: return launch_swapab_mode<kN, 2, kF>(p, stream);
      default: break;
    }
  }
  launch_swapab_mode<kN, 0, kF>(p, stream);
}

}  // namespace smla::cuda::sm90::sparse_mla
