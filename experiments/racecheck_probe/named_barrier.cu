// Does compute-sanitizer racecheck honour a named barrier over a subset of the block?
//
// smla's kernels exchange values between two consumer warpgroups through shared memory across
// `bar.sync 1, 256` (both consumer warpgroups, 256 threads; the producer warpgroup of a 384-thread
// block does not take part). racecheck reports those exchanges as hazards (h64.ws's row-sum
// exchange since session 9, swapab's merge buffer in session 11). By the PTX memory model a
// barrier orders the shared-memory accesses of the threads that take part in it, so these are
// either tool false positives or real bugs. This probe runs the same pattern in isolation:
//   mode 0: warpgroup 1 writes, bar.sync 1, 256, warpgroup 0 reads     (race-free by PTX)
//   mode 1: the same with __syncthreads() (barrier 0, all 384 threads) (race-free; control)
//   mode 2: warpgroup 1 writes, no barrier, warpgroup 0 reads           (a real race; control)
//   mode 3: as the kernels do: barrier 1 used three times by both warpgroups (once before any
//           exchange), warpgroup 0 reads the buffer, then warpgroup 1 overwrites it after the
//           second barrier and warpgroup 0 reads that after the third    (race-free by PTX)
//   mode 5: mode 4 with the barrier id and count as register operands ("r"), as smla's
//           ptx::named_sync writes them                                  (race-free by PTX)
//   mode 4: mode 3 with warpgroup 2 exiting at once and 128-thread barriers 2 / 3 of each
//           warpgroup in between, as swapab's consumers                  (race-free by PTX)
// Session 14 (docs/perf-history.md#s14-named-barriers): in every mode above both warpgroups execute
// the same barrier instruction; in the kernels they never do (each role's inlined load_q / store_o
// has its own BAR, and the P hand-off is the scorer's bar.arrive against consumer 1's bar.sync).
//   mode 6: mode 0 with each warpgroup at its own `bar.sync 1, 256` instruction (.aligned: PTX
//           requires one instruction for the CTA, so this is what synccheck may call divergent)
//   mode 7: mode 6 with the non-aligned `barrier.sync` (legal by PTX; the same SASS as mode 6)
//   mode 8: the P hand-off: warpgroup 1 writes, `bar.arrive 2, 256`; warpgroup 0 `bar.sync 2, 256`
//           and reads (.aligned forms at two instructions)
//   mode 9: mode 8 with `barrier.arrive` / `barrier.sync` (legal by PTX)
//   mode 10: h64.ws's whole sequence: barrier 1 at one instruction per warpgroup ("Q loaded"), four
//            tiles of warpgroup 0 `bar.arrive 2 + tile % 2, 256` against warpgroup 1's `bar.sync`,
//            then the row-sum exchange (warpgroup 1 writes, barrier 1 at its own instruction per
//            warpgroup, warpgroup 0 reads): store_o's pair
//   mode 11: mode 10 with the non-aligned forms
//   mode 12: the kernels since session 14: mode 11 with barrier 1's two uses replaced by two
//            mbarriers of 256 arrivals (arrive, then wait for phase 0), the P hand-off unchanged
// and checks the values read. Build and run (one GPU, sm_90a):
//   nvcc -std=c++17 -gencode=arch=compute_90a,code=sm_90a -o named_barrier named_barrier.cu
//   for m in 0 1 2 3 4 5 6 7 8 9 10 11 12; do compute-sanitizer --tool racecheck ./named_barrier $m; done
//   for m in 0 6 7 8 9 10 11 12; do compute-sanitizer --tool synccheck ./named_barrier $m; done
#include <cstdio>
#include <cstdint>
#include <cstdlib>

#include <cuda_runtime.h>

__device__ __forceinline__ void sync_r(uint32_t id, uint32_t count) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}

__device__ __forceinline__ void arrive_r(uint32_t id, uint32_t count, bool aligned) {
  if (aligned) asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(count) : "memory");
  else asm volatile("barrier.arrive %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}
__device__ __forceinline__ void sync_a(uint32_t id, uint32_t count, bool aligned) {
  if (aligned) asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
  else asm volatile("barrier.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}

// Mode 10 / 11: warpgroup kWg's part of h64.ws's barrier sequence (a template per warpgroup, as
// ws_consume<kWg>: each has its own barrier instructions).
// Mode 12's hand-off: arrive on an mbarrier of 256 arrivals, wait for its phase 0.
__device__ __forceinline__ void mbar_once(uint64_t* bar) {
  const uint32_t a = uint32_t(__cvta_generic_to_shared(bar));
  asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.shared::cta.b64 st, [%0];\n}\n" ::"r"(a) : "memory");
  asm volatile("{\n.reg .pred done;\nwait_%=:\nmbarrier.try_wait.parity.shared::cta.b64 done, [%0], 0;\n"
               "@!done bra wait_%=;\n}\n" ::"r"(a)
               : "memory");
}

template <int kWg, bool aligned, bool kMbar = false>
__device__ __forceinline__ void h64_sequence(float* buf, float* pbuf, int* out, uint64_t* mb = nullptr) {
  const int lane = threadIdx.x % 128;
  if (kMbar) mbar_once(&mb[0]);  // "Q loaded"
  else sync_a(1, 256, aligned);
  for (int tile = 0; tile < 4; ++tile) {
    if (kWg == 0) {  // the scorer: P of the tile, then arrive
      pbuf[(tile & 1) * 128 + lane] = float(tile * 1000 + lane);
      arrive_r(2u + uint32_t(tile & 1), 256, aligned);
    } else {  // consumer 1: sync, read P
      sync_a(2u + uint32_t(tile & 1), 256, aligned);
      if (pbuf[(tile & 1) * 128 + 127 - lane] != float(tile * 1000 + 127 - lane)) atomicAdd(out, 1);
    }
  }
  if (kWg == 1) buf[lane] = float(lane) + 0.5f;  // consumer 1's row sums
  if (kMbar) mbar_once(&mb[1]);
  else sync_a(1, 256, aligned);
  if (kWg == 0 && buf[127 - lane] != float(127 - lane) + 0.5f) atomicAdd(out, 1);
}

__global__ void exchange(int mode, int* out) {
  if (mode == 12) {
    __shared__ float b12[128], p12[256];
    __shared__ uint64_t mb[2];
    const int wg = threadIdx.x / 128;
    if (threadIdx.x == 0) {
      for (int i = 0; i < 2; ++i)
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 256;\n" ::"r"(uint32_t(__cvta_generic_to_shared(&mb[i])))
                     : "memory");
      asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();
    if (wg == 0) h64_sequence<0, false, true>(b12, p12, out, mb);
    else if (wg == 1) h64_sequence<1, false, true>(b12, p12, out, mb);
    return;
  }
  if (mode >= 10) {
    __shared__ float b10[128], p10[256];
    const int wg = threadIdx.x / 128;
    if (mode == 10 && wg == 0) h64_sequence<0, true>(b10, p10, out);
    else if (mode == 10 && wg == 1) h64_sequence<1, true>(b10, p10, out);
    else if (wg == 0) h64_sequence<0, false>(b10, p10, out);
    else if (wg == 1) h64_sequence<1, false>(b10, p10, out);
    return;
  }
  if (mode >= 6) {  // two warpgroups at two barrier instructions (distinct asm text: never merged)
    __shared__ float b6[128];
    const int wg = threadIdx.x / 128, lane = threadIdx.x % 128;
    if (wg == 2) return;
    if (wg == 1) {
      b6[lane] = float(lane) + 0.5f;
      if (mode == 6) asm volatile("bar.sync 1, 256; // wg1\n" ::: "memory");
      else if (mode == 7) asm volatile("barrier.sync 1, 256; // wg1\n" ::: "memory");
      else if (mode == 8) asm volatile("bar.arrive 2, 256; // wg1\n" ::: "memory");
      else asm volatile("barrier.arrive 2, 256; // wg1\n" ::: "memory");
    } else {
      if (mode == 6) asm volatile("bar.sync 1, 256; // wg0\n" ::: "memory");
      else if (mode == 7) asm volatile("barrier.sync 1, 256; // wg0\n" ::: "memory");
      else if (mode == 8) asm volatile("bar.sync 2, 256; // wg0\n" ::: "memory");
      else asm volatile("barrier.sync 2, 256; // wg0\n" ::: "memory");
      if (b6[127 - lane] != float(127 - lane) + 0.5f) atomicAdd(out, 1);
    }
    return;
  }
  if (mode == 5) {  // mode 4's sequence through register operands
    __shared__ float b5[128];
    const int wg = threadIdx.x / 128, lane = threadIdx.x % 128;
    if (wg == 1) b5[lane] = float(lane) + 0.5f;
    if (wg == 2) return;
    sync_r(1, 256);
    sync_r(2u + uint32_t(wg), 128);
    if (wg == 0 && b5[127 - lane] != float(127 - lane) + 0.5f) atomicAdd(out, 1);
    sync_r(1, 256);
    if (wg == 1) b5[lane] = float(lane) + 1.5f;
    sync_r(1, 256);
    if (wg == 0 && b5[127 - lane] != float(127 - lane) + 1.5f) atomicAdd(out, 1);
    return;
  }
  __shared__ float buf[128];
  const int wg = threadIdx.x / 128, lane = threadIdx.x % 128;
  if (wg == 1) buf[lane] = float(lane) + 0.5f;  // consumer 1 writes
  if (mode == 0) {
    if (wg < 2) asm volatile("bar.sync 1, 256;\n" ::: "memory");
  } else if (mode == 1) {
    __syncthreads();
  }
  if (mode >= 3) {
    if (wg == 2) return;
    asm volatile("bar.sync 1, 256;\n" ::: "memory");  // (the kernels' "Q loaded" barrier)
    if (mode == 4) {  // each warpgroup's own barrier, as the per-tile max exchange
      if (wg == 0) asm volatile("bar.sync 2, 128;\n" ::: "memory");
      else asm volatile("bar.sync 3, 128;\n" ::: "memory");
    }
  }
  if (wg == 0 && buf[127 - lane] != float(127 - lane) + 0.5f) atomicAdd(out, 1);  // consumer 0 reads
  if (mode >= 3) {
    asm volatile("bar.sync 1, 256;\n" ::: "memory");    // every read of the stage done
    if (wg == 1) buf[lane] = float(lane) + 1.5f;        // consumer 1 writes the merge buffer
    asm volatile("bar.sync 1, 256;\n" ::: "memory");
    if (wg == 0 && buf[127 - lane] != float(127 - lane) + 1.5f) atomicAdd(out, 1);
  }
}

int main(int argc, char** argv) {
  const int mode = argc > 1 ? std::atoi(argv[1]) : 0;
  int* bad = nullptr;
  if (cudaMalloc(&bad, sizeof(int)) != cudaSuccess || cudaMemset(bad, 0, sizeof(int)) != cudaSuccess) return 2;
  exchange<<<1, 384>>>(mode, bad);
  int h = -1;
  if (cudaGetLastError() != cudaSuccess || cudaMemcpy(&h, bad, sizeof(int), cudaMemcpyDeviceToHost) != cudaSuccess) {
    std::fprintf(stderr, "CUDA error\n");
    return 2;
  }
  std::printf("mode %d: %d wrong values read\n", mode, h);
  cudaFree(bad);
  return 0;
}
