// smla_ubench_smem: how fast one SM runs the shared-memory traffic of the warp-specialized sparse
// MLA kernel's tile, part by part (docs/perf-history.md, session 7: its per-tile time follows the
// shared-memory bytes a tile moves, at about half of the nominal rate; this finds which part is slow).
//
// One block per SM, three warpgroups, each part on or off per case:
//   warpgroup 0, "S":   36 m64nNk16 SS products per 64-row tile (Q and K from shared memory, N = 64
//                       as in the kernel, or 128 / 256 over the same bytes per instruction class);
//   warpgroup 1, "PV":  4 m64n256k16 SS products per tile (P and V from shared memory);
//   warpgroup 2, "fill": cp.async of 64 random 1152-byte rows per tile into the other buffer, from a
//                       pool in DRAM (1.2 GB) or one that stays in L2 (8 MB).
// Each warpgroup waits for its own work at the end of every tile, as the kernel does. Prints cycles
// per tile of each part, the SM clock (cycles / %globaltimer) and shared-memory bytes per cycle.
// The operands hold arbitrary finite bf16 values; no result is checked (a timing tool, not a test).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "cuda/common/ptx.cuh"

namespace {

namespace ptx = smla::cuda::ptx;

constexpr int kTileBytes = 9 * 64 * 128;  // 64 rows x 576 bf16, nine 8 KiB swizzled dim blocks
struct Smem {
  alignas(1024) uint8_t q[kTileBytes];
  alignas(1024) uint8_t kv[2][kTileBytes];
  uint64_t bar;  // the bulk fill's completion
};

struct Args {
  int iters;
  bool s, pv, fill, bulk;  // bulk: the fill as one cp.async.bulk per row (rows contiguous, no swizzle)
  int pv_halves;           // P V products per tile: 4 (one 256-dim half, one warpgroup's) or 8 (both)
  int row_bytes;           // gathered bytes per row: 1152 (bf16) or 656 (fp8_ds_mla)
  int rows;                // rows per tile: 64, or 32 (S as m64n32k16, two P V k-steps)
  int depth;               // gathered tiles in flight: 1 (the kernel's) to 3
  const uint8_t* pool;
  int64_t pool_rows;
  unsigned long long* out;  // per block: cycles of S, PV, fill, then %globaltimer ns of S, PV, fill
  float* sink;              // per thread: the sum of its accumulators (keeps the products alive)
};

// D(64 x N) += A(64 x 16) B(16 x N), both K-major in shared memory, 128-byte swizzle.
template <int N>
__device__ __forceinline__ void wgmma_ss(float (&d)[N / 2], uint64_t a, uint64_t b);
template <>
__device__ __forceinline__ void wgmma_ss<64>(float (&d)[32], uint64_t a, uint64_t b) {
  ptx::wgmma_m64n64k16<ptx::Bf16>(d, a, b, 1);
}
template <>
__device__ __forceinline__ void wgmma_ss<128>(float (&d)[64], uint64_t a, uint64_t b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, "
      "%12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, "
      "%34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, "
      "%56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),
        "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]),
        "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]),
        "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]),
        "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(a), "l"(b));
}

template <>
__device__ __forceinline__ void wgmma_ss<32>(float (&d)[16], uint64_t a, uint64_t b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, "
      "%13, %14, %15}, %16, %17, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "l"(a), "l"(b));
}

// D(64 x 64) += A(64 x 32) B(32 x 64), e4m3, both K-major (the fp8 tensor-core path for S).
__device__ __forceinline__ void wgmma_e4m3(float (&d)[32], uint64_t a, uint64_t b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, "
      "%13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, "
      "1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),
        "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(a), "l"(b));
}

__device__ __forceinline__ unsigned long long clock64_now() {
  unsigned long long c;
  asm volatile("mov.u64 %0, %%clock64;\n" : "=l"(c));
  return c;
}

// S products of warpgroup 0 per 64-row tile (N = 32: per 32-row tile): N = 64, 36 m64n64k16 (the
// kernel's); N = 128, 18 m64n128k16 (the same FLOPs, half the Q bytes); N = 32, 36 m64n32k16; N = 8
// stands for 18 e4m3 m64n64k32 (Q and K kept as e4m3, 2 KiB of each per product).
template <int N>
__device__ void run_s(const Args& a, Smem& s) {
  constexpr int kAcc = N == 8 ? 32 : N / 2;
  float acc[kAcc];
#pragma unroll
  for (int i = 0; i < kAcc; ++i) acc[i] = 0.0f;
  const uint64_t qd = ptx::sw128_desc(ptx::smem_addr(s.q), 16, 1024);
  const uint64_t kd = ptx::sw128_desc(ptx::smem_addr(s.kv[0]), 16, 1024);
  constexpr int kPerTile = N == 8 ? 18 : N == 32 ? 36 : 36 * 64 / N;
  for (int it = 0; it < a.iters; ++it) {
    ptx::wgmma_fence();
#pragma unroll
    for (int i = 0; i < kPerTile; ++i) {
      const uint32_t off = uint32_t((i / 4) * (8192 >> 4) + (i % 4) * 2);
      if constexpr (N == 8) wgmma_e4m3(acc, qd + off, kd + off);
      else wgmma_ss<N>(acc, qd + off, kd + off);
    }
    ptx::wgmma_commit();
    ptx::wgmma_wait<0>();
    ptx::fence_operands(acc);
  }
  float t = 0.0f;
#pragma unroll
  for (int i = 0; i < kAcc; ++i) t += acc[i];
  a.sink[blockIdx.x * blockDim.x + threadIdx.x] = t;
}

template <int kHalves, int kKSteps>
__device__ void run_pv(const Args& a, Smem& s) {
  float acc[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) acc[i] = 0.0f;
  const uint64_t pd = ptx::sw128_desc(ptx::smem_addr(s.kv[0]) + 8 * 8192, 16, 1024);
  const uint64_t vd = ptx::sw128_desc(ptx::smem_addr(s.kv[0]) + 4 * 8192, 8192, 1024);
  for (int it = 0; it < a.iters; ++it) {
    ptx::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kKSteps; ++kk)
      ptx::wgmma_m64n256k16_tb<ptx::Bf16>(acc, pd + uint32_t((kk * 32) >> 4), vd + uint32_t((kk * 16 * 128) >> 4));
    if constexpr (kHalves == 2) {  // the other 256 dims too (the kernel's two warpgroups' products)
#pragma unroll
      for (int kk = 0; kk < kKSteps; ++kk)
        ptx::wgmma_m64n256k16_tb<ptx::Bf16>(acc, pd + uint32_t((kk * 32) >> 4),
                                           vd - uint32_t((4 * 8192) >> 4) + uint32_t((kk * 16 * 128) >> 4));
    }
    ptx::wgmma_commit();
    ptx::wgmma_wait<0>();
    ptx::fence_operands(acc);
  }
  float t = 0.0f;
#pragma unroll
  for (int i = 0; i < 128; ++i) t += acc[i];
  a.sink[blockIdx.x * blockDim.x + threadIdx.x] = t;
}

// 64 random rows per tile (row r of the tile from a hash of block, tile and r), 8 threads per row,
// every 16-byte chunk to its swizzled place in buffer 1 (as the kernel's producer does).
__device__ void run_fill(const Args& a, Smem& s, int wt) {
  const int c = wt & 7, grp = wt >> 3;
  const uint32_t base = ptx::smem_addr(s.kv[1]);
  for (int it = 0; it < a.iters; ++it) {
    for (int i = 0; i < a.rows / 16; ++i) {
      const int r = grp + 16 * i;
      uint64_t h = (uint64_t(blockIdx.x) * 1000003u + uint64_t(it)) * 64 + uint64_t(r);
      h ^= h >> 33;
      h *= 0xff51afd7ed558ccdull;
      h ^= h >> 33;
      const uint8_t* row = a.pool + int64_t(h % uint64_t(a.pool_rows)) * a.row_bytes + c * 16;
      const uint32_t dst = base + uint32_t(r * 128 + ((c ^ (r & 7)) << 4));
      if (a.row_bytes == 1152) {
#pragma unroll
        for (int blk = 0; blk < 9; ++blk) ptx::cp_async_16(dst + uint32_t(blk * 8192), row + blk * 128);
      } else {  // 41 chunks of a 656-byte row: chunk c + 8 j, staged compactly
        for (int j = 0; c + 8 * j < a.row_bytes / 16; ++j) ptx::cp_async_16(dst + uint32_t(j * 8192), row + j * 128);
      }
    }
    ptx::cp_async_commit();
    if (a.depth >= 3) ptx::cp_async_wait<2>();  // (in-flight tiles land on the same bytes: timing only)
    else if (a.depth == 2) ptx::cp_async_wait<1>();
    else ptx::cp_async_wait<0>();
  }
  ptx::cp_async_wait<0>();
}

// The same rows with one 1152-byte cp.async.bulk each (64 threads issue, completion counted in
// bytes on an mbarrier), into buffer 1 row after row: what a TMA-style gather costs the operand
// reads beside it, not a layout wgmma could use.
__device__ void run_fill_bulk(const Args& a, Smem& s, int wt) {
  const uint32_t bar = ptx::smem_addr(&s.bar);
  for (int it = 0; it < a.iters; ++it) {
    if (wt == 0)
      asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(64 * 1152) : "memory");
    if (wt < 64) {
      uint64_t h = (uint64_t(blockIdx.x) * 1000003u + uint64_t(it)) * 64 + uint64_t(wt);
      h ^= h >> 33;
      h *= 0xff51afd7ed558ccdull;
      h ^= h >> 33;
      const uint8_t* row = a.pool + int64_t(h % uint64_t(a.pool_rows)) * 1152;
      asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                       ptx::smem_addr(s.kv[1]) + uint32_t(wt * 1152)),
                   "l"(row), "r"(1152), "r"(bar)
                   : "memory");
    }
    ptx::mbar_wait(bar, uint32_t(it & 1));
  }
}

template <int N>
__global__ void __launch_bounds__(384, 1) smem_rate_kernel(const __grid_constant__ Args a) {
  extern __shared__ __align__(1024) uint8_t raw[];
  auto& s = *reinterpret_cast<Smem*>(raw);
  // Finite bf16 values everywhere (1 + small fractions): no NaN or denormal paths.
  for (int i = threadIdx.x; i < int(sizeof(Smem) / 4); i += blockDim.x)
    reinterpret_cast<uint32_t*>(raw)[i] = 0x3f803f80u + uint32_t((i * 2654435761u) >> 28) * 0x00010001u;
  if (threadIdx.x == 0) {
    ptx::mbar_init(ptx::smem_addr(&s.bar), 1);
    ptx::fence_mbar_init();
  }
  ptx::fence_proxy_async_smem();
  __syncthreads();
  const int wg = threadIdx.x / 128, wt = threadIdx.x % 128;
  const unsigned long long c0 = clock64_now();
  const uint64_t g0 = ptx::globaltimer();
  if (wg == 0 && a.s) run_s<N>(a, s);
  if (wg == 1 && a.pv) {
    if (a.rows == 32) run_pv<2, 2>(a, s);
    else if (a.pv_halves == 2) run_pv<2, 4>(a, s);
    else run_pv<1, 4>(a, s);
  }
  if (wg == 2 && a.fill) {
    if (a.bulk) run_fill_bulk(a, s, wt);
    else run_fill(a, s, wt);
  }
  const unsigned long long c1 = clock64_now();
  const uint64_t g1 = ptx::globaltimer();
  if (wt == 0) {
    a.out[blockIdx.x * 6 + wg] = c1 - c0;
    a.out[blockIdx.x * 6 + 3 + wg] = g1 - g0;
  }
}

void ck(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "smla_ubench_smem: %s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

struct Case {
  const char* name;
  int n;
  bool s, pv, fill, dram, bulk;
  int pv_halves = 1;
  int row_bytes = 1152;
  int rows = 64, depth = 1;
};

}  // namespace

int main(int argc, char** argv) {
  const int iters = argc > 1 ? std::atoi(argv[1]) : 2000;
  int dev = 0, sms = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) {
    std::printf("smla_ubench_smem: no CUDA device, nothing to measure\n");
    return 0;
  }
  const int64_t dram_rows = 1 << 20, l2_rows = 8 << 20 >> 10;  // 1.2 GB, or <= 9.4 MB (stays in L2)
  uint8_t* pool = nullptr;
  ck(cudaMalloc(&pool, size_t(dram_rows) * 1152), "pool");
  ck(cudaMemset(pool, 0x3f, size_t(dram_rows) * 1152), "pool fill");
  unsigned long long* out = nullptr;
  ck(cudaMalloc(&out, size_t(sms) * 6 * sizeof(unsigned long long)), "out");
  float* sink = nullptr;
  ck(cudaMalloc(&sink, size_t(sms) * 384 * sizeof(float)), "sink");
  ck(cudaFuncSetAttribute(smem_rate_kernel<64>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(sizeof(Smem))), "attr");
  ck(cudaFuncSetAttribute(smem_rate_kernel<128>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(sizeof(Smem))), "attr");
  ck(cudaFuncSetAttribute(smem_rate_kernel<8>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(sizeof(Smem))), "attr");
  ck(cudaFuncSetAttribute(smem_rate_kernel<32>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(sizeof(Smem))), "attr");
  const Case cases[] = {
      {"S n64 alone", 64, true, false, false, false},         {"S n128 alone", 128, true, false, false, false},
      {"PV alone", 64, false, true, false, false},             {"fill alone (DRAM rows)", 64, false, false, true, true},
      {"fill alone (L2 rows)", 64, false, false, true, false}, {"S n64 + PV", 64, true, true, false, false},
      {"S n64 + fill (DRAM)", 64, true, false, true, true},    {"S n64 + PV + fill (L2)", 64, true, true, true, false},
      {"S n64 + PV + fill (DRAM)", 64, true, true, true, true}, {"S n128 + PV + fill (DRAM)", 128, true, true, true, true},
      {"bulk fill alone (DRAM)", 64, false, false, true, true, true},
      {"S n64 + PV + bulk fill (L2)", 64, true, true, true, false, true},
      {"S n64 + PV + bulk fill (DRAM)", 64, true, true, true, true, true},
      {"S n64 + 2 PV (a tile's work)", 64, true, true, false, false, false, 2},
      {"S n64 + 2 PV + fill (L2)", 64, true, true, true, false, false, 2},
      {"S n64 + 2 PV + fill (DRAM)", 64, true, true, true, true, false, 2},
      {"S e4m3 alone", 8, true, false, false, false},
      {"S e4m3 + 2 PV", 8, true, true, false, false, false, 2},
      {"S e4m3 + 2 PV + fill 656 B (DRAM)", 8, true, true, true, true, false, 2, 656},
      {"S e4m3 + 2 PV + fill 656 B (L2)", 8, true, true, true, false, false, 2, 656},
      {"fill 656 B alone (DRAM)", 8, false, false, true, true, false, 1, 656},
      {"fill alone (DRAM), 2 tiles in flight", 64, false, false, true, true, false, 1, 1152, 64, 2},
      {"S n64 + 2 PV + fill (DRAM), 2 in flight", 64, true, true, true, true, false, 2, 1152, 64, 2},
      {"32-row: S n32 + 2 PV", 32, true, true, false, false, false, 2, 1152, 32, 1},
      {"32-row: fill (DRAM), 3 in flight", 32, false, false, true, true, false, 2, 1152, 32, 3},
      {"32-row: S n32 + 2 PV + fill (DRAM), 3 in flight", 32, true, true, true, true, false, 2, 1152, 32, 3},
  };
  std::printf("smem_rate: %d SMs, %d tiles per part, %zu B shared memory per block\n", sms, iters, sizeof(Smem));
  std::printf("per 64-row tile: S n64 36 x 4 KiB, S n128 18 x 6 KiB, S e4m3 18 x 4 KiB, PV 4 x 10 KiB per half, fill 64 rows\n");
  for (const Case& c : cases) {
    Args a{iters, c.s, c.pv, c.fill, c.bulk, c.pv_halves, c.row_bytes, c.rows, c.depth, pool, c.dram ? dram_rows : l2_rows, out, sink};
    for (int rep = 0; rep < 2; ++rep) {  // the first launch warms up
      if (c.n == 64) smem_rate_kernel<64><<<sms, 384, sizeof(Smem)>>>(a);
      else if (c.n == 128) smem_rate_kernel<128><<<sms, 384, sizeof(Smem)>>>(a);
      else if (c.n == 32) smem_rate_kernel<32><<<sms, 384, sizeof(Smem)>>>(a);
      else smem_rate_kernel<8><<<sms, 384, sizeof(Smem)>>>(a);
      ck(cudaGetLastError(), "launch");
      ck(cudaDeviceSynchronize(), "run");
    }
    std::vector<unsigned long long> h(size_t(sms) * 6);
    ck(cudaMemcpy(h.data(), out, h.size() * sizeof(h[0]), cudaMemcpyDeviceToHost), "copy");
    double cyc[3] = {0, 0, 0}, ns[3] = {0, 0, 0};
    for (int b = 0; b < sms; ++b)
      for (int p = 0; p < 3; ++p) {
        cyc[p] += double(h[b * 6 + p]) / sms;
        ns[p] += double(h[b * 6 + 3 + p]) / sms;
      }
    const int first = c.s ? 0 : c.pv ? 1 : 2;
    const double per[3] = {cyc[0] / iters, cyc[1] / iters, cyc[2] / iters};
    const double bytes = (c.s ? (c.n == 64 ? 36 * 4096.0 : c.n == 128 ? 18 * 6144.0 : c.n == 32 ? 36 * 3072.0 : 18 * 4096.0) : 0) +
                         (c.pv ? (c.rows / 16) * 10240.0 * c.pv_halves : 0) + (c.fill ? double(c.rows) * c.row_bytes : 0);
    double longest = 0;
    for (int p = 0; p < 3; ++p) longest = per[p] > longest ? per[p] : longest;
    std::printf("%-44s S %7.0f  PV %7.0f  fill %7.0f cycles/tile (%d rows)   clock %.2f GHz   shared %.1f B/clk\n", c.name,
                c.s ? per[0] : 0.0, c.pv ? per[1] : 0.0, c.fill ? per[2] : 0.0, c.rows,
                cyc[first] / ns[first], bytes / longest);
  }
  cudaFree(sink);
  cudaFree(out);
  cudaFree(pool);
  return 0;
}
