// smla/dist.h — decode context parallelism (DESIGN.md §5) and ShardQ prefill (§5b) over NCCL.
//
// One decode step on each rank: filter + convert the global top-k to this rank's local rows
// (compacted, counted), all-gather q across heads, sparse attention with LSE for the gathered
// H_l * W heads on the local shard, then merge across ranks: all-gather of the LSEs + a
// reduce-scatter of the weighted outputs over heads, or one all-to-all carrying out and LSE.
// The attention runs through a Plan (smla/engine.h), made once by the constructor; the step
// buffers live in a workspace the caller owns (workspace_bytes(), laid out by dcp_workspace() of
// smla/workspace.h), so step() allocates nothing, never synchronizes, and can be captured in a
// CUDA graph. NCCL types stay out of this header: the communicator travels as void* (an ncclComm_t).
// Everything runs on the communicator's CUDA device, whichever device is current.
//
// Failure (a rank that stops taking part). Each Dcp (and each ShardQ, below) owns a watchdog thread
// (started by the constructor, joined by the destructor) that polls nothing in the step. It aborts the
// communicator (ncclCommAbort, which also ends NCCL kernels still waiting on the GPU) when a step
// has not finished timeout_ms after step() enqueued it (it looks every min(timeout_ms / 8, 100) ms,
// so the error comes within timeout_ms plus that), or when NCCL reports an asynchronous error;
// the caller's stream synchronization then returns, and the next step() or wait() throws
// "DCP: rank r: ... did not finish within N ms ...; the communicator was aborted" ("ShardQ: rank r:
// ..." for a ShardQ step). Step objects on one communicator (a Dcp and a ShardQ) share its fate: once
// one aborted it, every one's next step() or wait() throws that first error. A host thread
// stuck inside a call of a *blocking* communicator (connection setup to a dead peer) cannot be
// aborted from another thread (NCCL's thread-safety rule): after timeout_ms the watchdog writes the
// reason to stderr and terminates the process (terminate_on_stuck_call), or leaves the call to
// NCCL's own timeouts (~60 s measured). A nonblocking communicator (make_comm(..., true)) turns that
// case into an exception too, at the price of host polling on every NCCL call (0.07 -> 0.21 ms per
// step at T = 1, W = 2: docs/perf-history.md, DCP). Steps captured in a CUDA graph are not watched
// (their replays are the caller's: bound them with wait()). The rules each choice rests on are in
// src/dist/nccl_watchdog.h.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "smla/support.h"
#include "smla/types.h"

namespace smla::dist {

struct DcpConfig {
  int world = 1;           // W ranks
  int rank = 0;
  int interleave = 1;      // I: token i lives on rank (i / I) % W
  int local_heads = 16;    // H_l heads this rank owns; attention runs over H_l * W heads
  int rope_dim = kRopeDim;
  KvFormat format = KvFormat::kBF16;
  DType q_dtype = DType::kBF16;
  int topk = 2048;         // K of the global top-k
  int64_t max_rows = 1;    // largest T of a step
  bool all_to_all = false; // merge path: false = all-gather LSE + reduce-scatter; true = one all-to-all
  // Longest time, in ms, from step() until the step has finished on the GPU (work queued before it
  // on the stream counts, as in PyTorch's ProcessGroupNCCL), and longest host wait inside one NCCL
  // call. Must exceed the slowest healthy step; a step that finishes in time is never aborted.
  int timeout_ms = 10000;
  // The watchdog thread (see above). Off: no thread and no per-step event; only wait() bounds a step
  // (for a caller with a watchdog of its own, and for `smla bench --dcp`'s comparison).
  bool watchdog = true;
  // Blocking communicator only: a host call stuck in NCCL past timeout_ms terminates the process
  // (with the reason on stderr) rather than waiting for NCCL's own timeouts.
  bool terminate_on_stuck_call = true;
};

// Checks a DcpConfig on the host (no device, no NCCL): world in [1, 16], rank in [0, world),
// interleave >= 1, local_heads * world in [1, 128], q bf16 or fp16, max_rows and topk >= 1,
// timeout_ms >= 1. Throws Error naming the field and the fix. Dcp's constructor calls it.
inline constexpr int kMaxDcpWorld = 16;
void check_config(const DcpConfig& cfg);

struct DcpStepArgs {
  int64_t num_tokens = 0;            // T
  const void* q = nullptr;           // [T, H_l, D] q_dtype, dense: this rank's heads
  const int32_t* positions = nullptr;  // [T, K] global request-local token positions, -1 padded
  const int32_t* req_of_token = nullptr;  // nullable [T]
  const int32_t* block_table = nullptr;   // [R, max_blocks] of this rank's shard
  int64_t bt_stride = 0;
  int num_reqs = 0, max_blocks = 0, block_size = 0;
  int64_t block_stride_rows = 0;
  const void* kv = nullptr;          // this rank's shard, row r at kv + r * kv_row_stride_bytes
  int64_t num_rows = 0, kv_row_stride_bytes = 0;
  float softmax_scale = 0.0f, q_scale = 1.0f, k_scale = 1.0f;
  void* out = nullptr;               // [T, H_l, 512] (bf16, or fp16 for an fp16 q), dense
  float* lse = nullptr;              // nullable [T, H_l], natural log
};

class Dcp {
 public:
  // comm: an ncclComm_t of `cfg.world` ranks in which this process is `cfg.rank`. Checks the config
  // against the communicator and plans the attention for the communicator's device; allocates no
  // device memory.
  Dcp(void* nccl_comm, const DcpConfig& cfg);
  ~Dcp();
  Dcp(const Dcp&) = delete;
  Dcp& operator=(const Dcp&) = delete;

  const DcpConfig& config() const;
  // The CUDA device of the communicator (ncclCommCuDevice): the device of step()'s workspace,
  // arguments and stream.
  int device() const;
  // Bytes of device workspace step() needs: dcp_workspace(...).bytes of smla/workspace.h, the
  // attention plan's workspace included.
  size_t workspace_bytes() const;

  // One decode step on `stream` (a cudaStream_t of device()). workspace: at least
  // workspace_bytes() bytes of device memory, 16-byte aligned, used by nothing else until the step
  // has run (steps on one stream may share it). Validates on the host before enqueuing anything.
  void step(const DcpStepArgs& args, void* workspace, size_t workspace_bytes, void* stream);

  // Waits for `stream`. If NCCL reports an asynchronous error, the watchdog has aborted the
  // communicator, or the stream has not finished within timeout_ms (a rank stopped taking part),
  // aborts the communicator (if not yet) and throws Error.
  void wait(void* stream, int timeout_ms);

  // True once this Dcp aborted the communicator. ncclCommAbort frees it: make a new one (and a new
  // Dcp); destroy_comm on the aborted handle does nothing. Every later step() and wait() throws.
  bool aborted() const;

  // Seconds of the last step spent in communication vs attention (events; for the benchmark).
  struct Timing { float comm_ms = 0, attn_ms = 0, total_ms = 0; };
  Timing last_timing() const;
  void enable_timing(bool on);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// ---- ShardQ prefill over NCCL (DESIGN.md §5b; the host rules in smla/shardq.h).
//
// Under tensor parallelism each of W ranks holds q for every token of the step with H / W heads and
// the whole (replicated) latent cache. One step on every rank: the token -> (owner rank, slot) map
// is computed on the device from cu_seqlens (zigzag, shardq::owner_rank); q is packed by owner and
// exchanged (grouped ncclSend / ncclRecv); each rank assembles its tokens with all H heads and runs
// the sparse attention over its `slots` planned token slots (unused slots have count 0: out 0,
// cheap); the output (and LSE when asked) is split by heads, exchanged back and unpacked: every
// rank ends with out [T, H / W, 512] for all T tokens. Buffers are padded to
// slots = shardq::max_tokens_per_rank(max_tokens, W, max_requests) tokens per peer, so the host never
// needs the step's per-rank token counts: step() reads no device memory, allocates nothing, never
// synchronizes, and can be captured in a CUDA graph (one graph serves every cu_seqlens of the same
// T and R). A malformed cu_seqlens (not starting at 0, decreasing, not ending at T) cannot be seen on
// the host: the step then writes out 0 and LSE NaN, and wait() throws naming the fault. A rank that
// stops taking part is handled as for Dcp (the failure paragraph at the top): the ShardQ's watchdog
// thread aborts the communicator when a step has not finished timeout_ms after step() enqueued it,
// and the next step() or wait() throws "ShardQ: rank r: ...; the communicator was aborted".
struct ShardqConfig {
  int world = 1;             // W ranks
  int rank = 0;
  int num_heads = 128;       // H, all heads; a multiple of W (each rank holds H / W); <= 128
  int rope_dim = kRopeDim;
  KvFormat format = KvFormat::kBF16;
  DType q_dtype = DType::kBF16;  // bf16, fp16, or e4m3 (fp8 caches); out is fp16 for an fp16 q, else bf16
  ScorePrecision score_precision = Geometry{}.score_precision;  // as a Plan's (smla/support.h)
  bool sink = false;         // the step takes sink [H] (all heads)
  int topk = 2048;           // K: capacity of idx rows
  int64_t max_tokens = 1;    // largest T of a step
  int max_requests = 1;      // most requests in a step
  int timeout_ms = 10000;    // as DcpConfig::timeout_ms: the longest time from step() until the step has finished
  bool watchdog = true;      // as DcpConfig::watchdog (off: no thread, no per-step event; only wait() bounds a step)
  bool terminate_on_stuck_call = true;  // as DcpConfig::terminate_on_stuck_call (blocking communicator only)
};

// Checks a ShardqConfig on the host (no device, no NCCL): world in [1, 16], rank in [0, world),
// num_heads in [1, 128] and a multiple of world, q bf16, fp16 or e4m3, topk >= 1, max_tokens >= 1 with
// max_tokens * world < 2^31, max_requests >= 1, timeout_ms >= 1. Throws Error naming the field and the
// fix. ShardQ's constructor calls it.
inline constexpr int kMaxShardqWorld = 16;
void check_config(const ShardqConfig& cfg);

struct ShardqStepArgs {
  int64_t num_tokens = 0;              // T: the same on every rank
  int num_requests = 0;                // R: the same on every rank; >= 1 when T > 0
  const int32_t* cu_seqlens = nullptr; // device [R + 1]: request i is tokens [cu[i], cu[i + 1]); cu[0] = 0, cu[R] = T
  const void* q = nullptr;             // [T, H / W, D] q_dtype, dense, 16-byte aligned: this rank's heads
  const int32_t* idx = nullptr;        // [T, K] physical rows of the replicated cache, -1 padded; row stride idx_stride_t
  int64_t idx_stride_t = 0;            // 0: K
  const int32_t* counts = nullptr;     // nullable [T]: valid entries per row (K when null)
  const float* sink = nullptr;         // [H] fp32 when ShardqConfig::sink (every head: a rank attends them all)
  const void* kv = nullptr;            // the replicated cache, row r at kv + r * kv_row_stride_bytes
  int64_t num_rows = 0, kv_row_stride_bytes = 0;
  float softmax_scale = 0.0f, q_scale = 1.0f, k_scale = 1.0f;
  void* out = nullptr;                 // [T, H / W, 512] bf16 (fp16 for an fp16 q), dense, 16-byte aligned
  float* lse = nullptr;                // nullable [T, H / W] fp32, natural log (exchanged only when given)
};

class ShardQ {
 public:
  // comm: an ncclComm_t of `cfg.world` ranks in which this process is `cfg.rank`. Checks the config,
  // plans the attention (all H heads, `slots()` rows) for the communicator's device; allocates no
  // device memory.
  ShardQ(void* nccl_comm, const ShardqConfig& cfg);
  ~ShardQ();
  ShardQ(const ShardQ&) = delete;
  ShardQ& operator=(const ShardQ&) = delete;

  const ShardqConfig& config() const;
  int device() const;      // the communicator's CUDA device
  int64_t slots() const;   // tokens per rank planned: shardq::max_tokens_per_rank(max_tokens, W, max_requests)
  // Bytes of device workspace step() needs: shardq_workspace(...).bytes of smla/workspace.h.
  size_t workspace_bytes() const;

  // One prefill step on `stream` (a cudaStream_t of device()). Every rank calls it with the same T,
  // R and cu_seqlens values. workspace: as Dcp::step. Validates on the host before enqueuing anything.
  void step(const ShardqStepArgs& args, void* workspace, size_t workspace_bytes, void* stream);

  // Waits for `stream` as Dcp::wait does (an NCCL error, the watchdog's abort, or a step past
  // timeout_ms aborts the communicator and throws), then reads the status the last step's ownership
  // kernel left in its workspace and throws if cu_seqlens was malformed (the communicator stays usable).
  void wait(void* stream, int timeout_ms);

  // True once the communicator was aborted (by this ShardQ, or by another step object on it): as
  // Dcp::aborted, make a new communicator and a new ShardQ; every later step() and wait() throws.
  bool aborted() const;

  // Milliseconds of the last step's parts (events; for the benchmark): the two all-to-alls (NCCL
  // only), the attention, and the rest (ownership, packing, assembly, unpacking).
  struct Timing { float a2a_q_ms = 0, a2a_out_ms = 0, attn_ms = 0, other_ms = 0, total_ms = 0; };
  Timing last_timing() const;
  void enable_timing(bool on);
  // Bytes this rank sends (and receives) per step in each all-to-all, peers' padded slots included.
  size_t a2a_q_bytes() const;
  size_t a2a_out_bytes(bool with_lse) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Helpers for tests and the CLI: a unique id (NCCL_UNIQUE_ID_BYTES bytes) made by one process and
// handed to all, and a communicator from it (on the current device). By default the communicator
// is blocking: NCCL calls enqueue without host polling and the step's watchdog (Dcp's, ShardQ's)
// bounds a lost peer (see above). nonblocking = true: every call returns at once and is polled against
// the step's timeout_ms,
// the one mode in which connection setup to a lost peer (and this init, bounded by timeout_ms here)
// ends in an exception rather than in NCCL's own timeout (~60 s measured) or process termination.
// destroy_comm skips a communicator that a Dcp or ShardQ aborted (already freed).
std::vector<uint8_t> make_unique_id();
void* make_comm(const std::vector<uint8_t>& unique_id, int world, int rank, int timeout_ms = 60000,
                bool nonblocking = false);
void destroy_comm(void* comm);

}  // namespace smla::dist
