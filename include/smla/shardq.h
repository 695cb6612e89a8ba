// smla/shardq.h — ShardQ prefill (DESIGN.md §5b), the host side: which rank attends which tokens,
// the per-rank token bound the buffers are planned for, the packing of the two all-to-alls, and a
// CPU simulation of W tensor-parallel ranks that the NCCL step is held to.
//
// Under tensor parallelism each of W ranks holds q for every token of the step with H / W heads,
// and the whole latent cache. ShardQ re-shards q by tokens: each rank attends a slice of the tokens
// with all H heads (reading each selected row once for all heads), then the output goes back to
// the head-sharded layout.
//
// Ownership (zigzag, for causal load balance): a request of n tokens is cut into 2·W chunks of
// c = ceil(n / (2·W)) tokens (the last ones short or empty); rank r owns chunks r and 2·W − 1 − r.
// Example: n = 10, W = 2: c = 3, chunks {0,1,2} {3,4,5} {6,7,8} {9}: rank 0 owns tokens 0-2 and 9,
// rank 1 owns 3-8.
#pragma once

#include <cstdint>
#include <vector>

#include "smla/params.h"

namespace smla::shardq {

// c = ceil(n / (2·world)): tokens per chunk of a request of n tokens (0 when n = 0).
int64_t chunk_tokens(int64_t n, int world);
// Rank that attends token j (0 <= j < n) of a request of n tokens.
int owner_rank(int64_t j, int64_t n, int world);
// The most tokens any rank attends in a step of at most max_tokens tokens in at most max_requests
// requests: min(max_tokens, ceil(max_tokens / world) + 2·max_requests). Buffers are planned for it.
int64_t max_tokens_per_rank(int64_t max_tokens, int world, int max_requests);

// One step's assignment of tokens to ranks. Requests are laid out back to back in the step
// (request i: tokens [sum of earlier lengths, + lens[i])). rank_tokens[r] lists the global token
// ids rank r attends, in ascending order; slot i of rank r's buffers holds rank_tokens[r][i].
struct Layout {
  int world = 1;
  int64_t num_tokens = 0;
  std::vector<std::vector<int64_t>> rank_tokens;
};
Layout make_layout(const std::vector<int64_t>& request_lens, int world);

// The all-to-all buffers are padded to `slots` = max_tokens_per_rank(...) tokens per peer, so
// their sizes are fixed at plan time (graph capture) whatever the step's lengths. A "row" is one
// token's values for a block of heads: row_bytes = heads_per_rank * elements * element bytes.
//
// q, before the step: rank `rank` holds q_local [T][row_bytes] (its H / W heads of every token)
// and sends peer p the rows of p's tokens: send [world][slots][row_bytes].
void pack_by_owner(const Layout& l, int64_t slots, const uint8_t* local, int64_t local_stride, int64_t row_bytes,
                   uint8_t* send);
// Rank `rank` receives recv [world][slots][row_bytes] (from peer p: p's heads of this rank's
// tokens) and assembles full-head rows: full [slots][world * row_bytes] (heads of peer p at
// p * row_bytes). Slots past the rank's token count are left as they are.
void gather_heads(const Layout& l, int rank, int64_t slots, const uint8_t* recv, int64_t row_bytes, uint8_t* full);
// out, after attention: rank `rank` holds full [slots][world * row_bytes] for its tokens and sends
// peer p the head block p: send [world][slots][row_bytes].
void split_heads(const Layout& l, int rank, int64_t slots, const uint8_t* full, int64_t row_bytes, uint8_t* send);
// Rank receives recv [world][slots][row_bytes] (from peer p: this rank's heads of p's tokens) and
// scatters them to their global tokens: local [T][row_bytes] with row stride local_stride.
void unpack_by_owner(const Layout& l, int64_t slots, const uint8_t* recv, int64_t row_bytes, uint8_t* local,
                     int64_t local_stride);

// Simulates one ShardQ step of `world` ranks on the CPU with the reference backend: `tmpl` is
// the unsharded problem (q [T, H, D] with all H heads, idx [T, K] physical rows of the replicated
// cache, kv, scales, sink; its out / lse are ignored). Each rank's head slice of q goes through
// pack_by_owner -> exchange -> gather_heads, the rank attends its tokens with all H heads, and
// the output goes back through split_heads -> exchange -> unpack_by_owner. Writes out [T, H, 512]
// fp32 and lse [T, H] (natural log), assembled from every rank's head slice.
// H must be a multiple of world; q must be dense ([T, H, D] with D = 512 + rope_dim).
void simulate_prefill(const SparseMlaParams& tmpl, const std::vector<int64_t>& request_lens, int world, float* out,
                      float* lse);

}  // namespace smla::shardq
