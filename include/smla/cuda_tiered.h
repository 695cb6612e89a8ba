// smla/cuda_tiered.h — the CUDA side of the HiSparse tiered cache (smla/tiered.h, DESIGN.md §4b):
// state reset, the per-step resolver (one launch, no host synchronization, legal in CUDA-graph
// capture) and the cache writer that writes new tokens into the host pool and, for the newest
// token, the request's reserved hot slot in one launch. Device pointers except the host pool,
// which must be pinned (cudaHostAlloc, or cudaHostRegister with cudaHostRegisterMapped); streams
// as void* (cudaStream_t). Host code validates first and throws Error before any launch.
#pragma once

#include <cstddef>
#include <cstdint>

#include "smla/cache.h"
#include "smla/tiered.h"

namespace smla::cuda {

// Largest hot buffer (R) the CUDA resolver sorts in one block.
inline constexpr int kTieredMaxHotSlots = 8192;
// Most query tokens of one request in one step the CUDA resolver takes.
inline constexpr int kTieredMaxTokensPerRequest = 64;

// Counters and stamps 0, maps -1 (two memsets on `stream`).
void reset_tiered_state(const TieredCache& cache, void* state, size_t state_bytes, void* stream);
// Forgets request req's hot rows (three memsets on `stream`); see smla::release_tiered_request.
void release_tiered_request(const TieredCache& cache, void* state, size_t state_bytes, int req, void* stream);

// smla::invalidate_tiered_positions on a device state (one launch; req and pos device [n] int32).
// Entries with a request id >= max_requests or a position >= max_positions are skipped.
void invalidate_tiered_positions(const TieredCache& cache, void* state, size_t state_bytes, const int32_t* req,
                                 const int32_t* pos, int64_t n, void* stream);

// One step: equal to resolve_tiered_reference (map, slot positions, stamps, hot rows, physical
// ids, counts, counters) on good input. Bad device-side data (request ids, lengths, positions
// outside the pool) is never dereferenced: those tokens/entries come out empty and
// TieredCounters::errors counts them. Two launches: one block per request classifies, picks the
// victims and writes the ids; a PDL copy kernel starts reading the missing rows straight from
// pinned host memory as soon as each request's misses are known, and stores them at the end.
// Every call with num_reqs > 0 launches both (the state's hand-off flags are cleared by the
// second); an aborted call leaves the state to reset_tiered_state.
void resolve_tiered(const TieredCache& cache, const TieredResolveParams& p, void* stream);

// The counters, copied to the host (synchronizes `stream`: for logs and tests, not the hot path).
TieredCounters read_tiered_counters(const TieredCache& cache, const void* state, void* stream);

// The cache writer of a tiered cache: encodes every token into the host pool (pool_write.cache
// is the pinned pool, addressed by pool_write's slot mapping and block geometry) and, where
// hot_rows[n] >= 0, the same bytes into hot-buffer row hot_rows[n] (the request's newest slot,
// TieredCache::newest_hot_row). One launch; rows bit-identical to write_cache_reference.
// hot_rows: nullable [N] int32; hot: the hot buffer of hot_bytes >= cache.hot_buffer_bytes().
void write_cache_tiered(const TieredCache& cache, const CacheWriteParams& pool_write, const int32_t* hot_rows,
                        void* hot, size_t hot_bytes, void* stream);

}  // namespace smla::cuda
