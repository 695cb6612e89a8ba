#include "smla/serving.h"

#include <string>

#include "smla/types.h"

namespace smla {

int reorder_batch_threshold(int num_heads) {
  switch (num_heads) {
    case 8:
    case 16:
    case 32: return 128;
    case 64: return 256;
    case 128: return 1024;
    default: return 1024;
  }
}

void token_to_request(const int32_t* query_start_loc, int num_reqs, int32_t* req_of_token, int64_t num_tokens) {
  SMLA_CHECK(num_reqs >= 0 && num_tokens >= 0, "token_to_request: sizes must be non-negative");
  SMLA_CHECK(num_tokens == 0 || req_of_token != nullptr, "token_to_request: req_of_token is null");
  SMLA_CHECK(query_start_loc != nullptr, "token_to_request: query_start_loc [R + 1] is null");
  SMLA_CHECK(query_start_loc[0] == 0, "query_start_loc[0] must be 0");
  for (int r = 0; r < num_reqs; ++r)
    SMLA_CHECK(query_start_loc[r + 1] >= query_start_loc[r],
               "query_start_loc must be non-decreasing; it drops at request " + std::to_string(r));
  int r = 0;
  for (int64_t t = 0; t < num_tokens; ++t) {
    while (r < num_reqs && query_start_loc[r + 1] <= t) ++r;
    req_of_token[t] = r < num_reqs ? r : -1;
  }
}

void check_finish_empty_shapes(int64_t counts_len, int64_t out_rows, int64_t lse_rows) {
  SMLA_CHECK(counts_len == out_rows,
             "finish_empty_rows: counts has " + std::to_string(counts_len) + " entries but out has " +
                 std::to_string(out_rows) + " rows; pass one count per row of out (counts int32 [T], out [T, H, 512])");
  SMLA_CHECK(lse_rows < 0 || lse_rows == out_rows,
             "finish_empty_rows: lse has " + std::to_string(lse_rows) + " rows but out and counts have " +
                 std::to_string(out_rows) + "; lse must be float32 [T, H] like out's [T, H]");
}

}  // namespace smla
