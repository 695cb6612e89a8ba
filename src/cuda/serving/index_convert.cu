// Index conversion: one 256-thread block per query row. Entries are converted 256 at a time with
// the shared per-entry rule (smla/index.h) and compacted to the front in their original order by a
// block-wide exclusive scan, so the result equals the CPU reference exactly.
#include <cub/block/block_scan.cuh>
#include <cuda_runtime.h>

#include "check.cuh"
#include "smla/cuda_serving.h"

namespace smla::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads) convert_indices_kernel(IndexConvertParams p) {
  using Scan = cub::BlockScan<int, kThreads>;
  __shared__ typename Scan::TempStorage scan_storage;
  const int64_t t = blockIdx.x;
  const int64_t req = p.req_of_token ? p.req_of_token[t] : t;
  const bool remap = p.prefill_row_start != nullptr;
  const bool req_ok = req >= 0 && req < p.num_reqs && (remap || p.max_blocks > 0);
  const int32_t* pos_row = p.positions + t * p.pos_stride_t;
  int32_t* out_row = p.phys + t * p.phys_stride_t;
  const int32_t* table_row = req_ok && !remap ? p.block_table + req * p.bt_stride : nullptr;
  const int32_t row_start = req_ok && remap ? p.prefill_row_start[req] : 0;
  const int32_t req_len = req_ok && remap ? p.prefill_req_len[req] : 0;
  int n = 0;  // valid entries written so far (uniform across the block)
  if (req_ok) {
    for (int base = 0; base < p.topk; base += kThreads) {
      const int j = base + int(threadIdx.x);
      int32_t r = -1;
      if (j < p.topk)
        r = remap ? logical_to_workspace_row(pos_row[j], row_start, req_len, p.dcp_world, p.dcp_rank, p.dcp_interleave)
                  : logical_to_physical(pos_row[j], table_row, p.max_blocks, p.block_size, p.block_stride_rows,
                                        p.dcp_world, p.dcp_rank, p.dcp_interleave);
      int offset, total;
      Scan(scan_storage).ExclusiveSum(r >= 0 ? 1 : 0, offset, total);
      if (r >= 0) out_row[n + offset] = r;
      n += total;
      __syncthreads();  // scan_storage is reused by the next chunk
    }
  }
  for (int j = n + int(threadIdx.x); j < p.topk; j += kThreads) out_row[j] = -1;
  if (threadIdx.x == 0 && p.counts) p.counts[t] = n;
}

}  // namespace

void convert_indices(const IndexConvertParams& p, void* stream) {
  validate(p);
  if (p.num_tokens == 0) return;
  SMLA_CHECK(p.num_tokens <= 0x7fffffffLL, "convert_indices: at most 2^31 - 1 rows per call");
  convert_indices_kernel<<<unsigned(p.num_tokens), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(p);
  check_launch("convert_indices_kernel");
}

}  // namespace smla::cuda
