// smla/serving.h — small helpers a serving engine needs around the attention call.
#pragma once

#include <cstdint>

namespace smla {

// Decode/prefill split: rows of requests with at most this many query tokens are treated as
// decode. The seed's table by query heads: {8: 128, 16: 128, 32: 128, 64: 256, 128: 1024}, 1024
// for any other H.
int reorder_batch_threshold(int num_heads);

// Token -> request indices for multi-token (speculative) decode: query_start_loc [R + 1] is the
// cumulative token offset of each request (query_start_loc[0] = 0, non-decreasing). Writes
// req_of_token[t] for t < num_tokens; tokens past query_start_loc[R] get -1.
// Example: query_start_loc {0, 2, 2, 5} -> {0, 0, 2, 2, 2}.
void token_to_request(const int32_t* query_start_loc, int num_reqs, int32_t* req_of_token, int64_t num_tokens);

// The empty-row finisher's shapes (cuda::finish_empty_rows and the bindings), checked before anything
// runs: counts [T] and out [T, H, 512] (and lse [T, H] when given, else lse_rows = -1) must agree on
// T. The error names both arguments and the counts of each, e.g. "finish_empty_rows: counts has 5
// entries but out has 3 rows; pass one count per row of out (counts int32 [T], out [T, H, 512])".
void check_finish_empty_shapes(int64_t counts_len, int64_t out_rows, int64_t lse_rows);

}  // namespace smla
