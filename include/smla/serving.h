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

}  // namespace smla
