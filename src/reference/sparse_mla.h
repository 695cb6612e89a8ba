// reference/sparse_mla.h — the CPU sparse MLA backend (DESIGN.md §1): the test oracle, and the
// backend a server reaches through the public API as Backend::kCpu (smla/engine.h). float64
// accumulation, rows decoded with the codecs of smla/formats.h. Internal header.
#pragma once

#include "smla/params.h"

namespace smla::reference {

// Computes out (and lse when set) for every row of p. Validates p first (throws Error).
// Parallel over rows with num_threads threads (0 = all hardware threads). out_dtype may be
// bf16, fp16 or fp32.
void sparse_mla(const SparseMlaParams& p, int num_threads = 0);

// The same math for one (row, head), in double: out512[512] and the natural-log LSE (sink
// excluded); returns the number of valid entries. Exposed for tests and the DCP simulation.
int sparse_mla_row_head(const SparseMlaParams& p, int64_t t, int h, double* out512, double* lse_e);

}  // namespace smla::reference
