// A plain gather of rows from pinned host memory into device memory: the reference the
// benchmark holds the resolver's miss path to (smla bench --hisparse). Internal to the CUDA layer
// and the tools.
#pragma once

#include <cstdint>

#include "smla/tiered.h"

namespace smla::cuda {

// dst row i <- src row rows[i] for i < n (rows: device [n] int32). Every stride and row_bytes a
// multiple of 16; src is a pinned host pointer (or device memory). The grid covers every SM with
// 16 loads of 16 bytes in flight per thread.
void gather_rows_from_host(const void* src, int64_t src_stride, const int32_t* rows, int64_t n, void* dst,
                           int64_t dst_stride, int row_bytes, void* stream);

// Tests only: copy_kernel's blocks per request for the following resolve_tiered calls in this
// process (0: the launcher's choice; capped at kTieredCopyFlags). One block per request
// makes every list longer than 4096 pieces take several copy rounds.
void set_tiered_copy_blocks_for_testing(int blocks_per_request);
// Tests only: the one-grid step (resolve.cu's onegrid_kernel, s13) for the following resolve_tiered
// calls in this process: 0 = wherever the call's shape allows it (the default), 1 = never (the
// two-kernel path: resolve_kernel + copy_kernel). Results are the same either way.
void set_tiered_one_grid_for_testing(int mode);
// Whether a resolve_tiered call of this shape (num_reqs, topk, req_of_token null or not) on the
// current device takes the one-grid step now (the benchmark prints it).
bool tiered_one_grid_taken(const TieredCache& cache, int num_reqs, int topk, bool req_of_token_null);
// Tests and `smla bench --hisparse --late-copy` only: the copy blocks issue no host load before the
// resolver's end (session 9's schedule, for an A/B in one run); results are the same.
void set_tiered_copy_late_for_testing(bool late);
// Tests only: the copy blocks' own reads (early mode, resolve.cu's copy_early) for the following
// resolve_tiered calls in this process: 0 = the default (on where the call's shape allows it), 1 = off
// (the job list), 2 = on where the call's shape allows it, 3 = on and every copy block takes the late path (it
// copies all its old entries after the resolver's end). Results are the same in every mode.
void set_tiered_early_read_for_testing(int mode);
// `smla bench --hisparse --phases` only: a device buffer of 16 uint64 that the following
// resolve_tiered calls fill with %globaltimer stamps (resolve.cu's Phase; null: none). The caller
// zeroes it (slot 8, the earliest copy block's start, to all ones) before each step.
void set_tiered_phase_buffer_for_testing(uint64_t* stamps);

}  // namespace smla::cuda
