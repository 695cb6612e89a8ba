// smla/cuda.h — the CUDA backend's entry points. No CUDA headers here: streams travel as void*
// (a cudaStream_t), device pointers inside SparseMlaParams.
#pragma once

#include <cstddef>
#include <string>

#include "smla/params.h"
#include "smla/support.h"

namespace smla::cuda {

// Number of CUDA devices (0 when there is no device or no driver; never throws).
int device_count();
// Properties of device `ordinal` (throws Error when it does not exist).
DeviceInfo device_info(int ordinal = 0);

// The split of each row's top-k the launcher picks by itself for p.num_tokens rows on a device
// with num_sms SMs (choose_num_splits over the kernel's blocks per row).
int sparse_mla_auto_splits(const SparseMlaParams& p, int num_sms);

// Workspace bytes a launch of p needs with `num_splits` pieces per row (0: the automatic choice).
size_t sparse_mla_workspace_bytes(const SparseMlaParams& p, int num_sms, int num_splits = 0);

// Launches DESIGN.md §1 on `stream` with the first variant of smla/support.h's table that supports
// p's geometry (p.score_precision chooses the score path). Every pointer in p is a device pointer.
// Validates p on the host (throws Error before any launch); never allocates and never synchronizes. num_splits > 0
// fixes the split of every row's top-k (a plan's schedule; the batch-invariant mode); 0 lets the
// launcher choose from T. batch_invariant: the same kernel for every T (cuda_variant_for's small-call
// rule off), as a batch-invariant plan runs.
void sparse_mla(const SparseMlaParams& p, void* workspace, size_t workspace_bytes, void* stream,
                int num_splits = 0, bool batch_invariant = false);

// Convenience for the CLI and tests: p holds HOST pointers; copies inputs to device 0, runs,
// copies out/lse back and synchronizes. kv_bytes: bytes of the cache buffer p.kv points to.
void sparse_mla_from_host(const SparseMlaParams& p, size_t kv_bytes, bool batch_invariant = false);

}  // namespace smla::cuda
