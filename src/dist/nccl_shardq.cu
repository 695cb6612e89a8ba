// ShardQ prefill over NCCL: the step (DESIGN.md §5b) and its small kernels.
//
// Step on rank r of W (H heads in all, Hs = H / W per rank, S = slots per rank):
//   1. ownership: cu_seqlens -> per-request slot bases (one block, a scan over requests), then per
//      token dest = owner * S + slot and this rank's slot -> token map (shardq_rule.h, the zigzag)
//   2. this rank's tokens' idx / counts gathered into its slots (-1 / 0 in unused slots)
//   3. q [T, Hs, D] packed by owner into [W, S, Hs, D]; all-to-all (grouped send / recv)
//   4. the W received blocks assembled into q_full [S, H, D] (zeros in unused slots)
//   5. sparse attention over the S slots with all H heads, LSE on: out [S, H, 512], lse [S, H]
//   6. out split by heads into [W, S, Hs, 512] (and LSE into [W, S, Hs]); all-to-all
//   7. unpacked by dest into out [T, Hs, 512] (and lse [T, Hs])
// Every size is fixed by the plan (S, not the step's per-rank counts), so the host enqueues the
// same calls whatever cu_seqlens holds: graph capture works, and no rank waits for a size.
// A lost peer is bounded as in Dcp (nccl_dcp.cu) by the step's CommWatchdog (dist/nccl_watchdog.h):
// each all-to-all is one guarded call, and the step's completion event follows the out all-to-all.
#include <cuda_runtime.h>
#include <nccl.h>

#include <cstring>
#include <mutex>
#include <string>

#include "smla/dist.h"
#include "smla/engine.h"
#include "smla/params.h"
#include "smla/shardq.h"
#include "smla/workspace.h"
#include "dist/nccl_common.h"
#include "dist/nccl_watchdog.h"
#include "dist/shardq_device.h"
#include "dist/shardq_rule.h"

namespace smla::dist {
namespace detail {
namespace {

constexpr int kMaxWorld = 16;
constexpr int kScanThreads = 256;

// 1a. One block: per-request owned counts of every rank, scanned over the requests (tiles of 256,
// Hillis-Steele within a tile, a running carry across tiles) into req_base [R, W]; status[0] gets
// the faults of cu_seqlens.
__global__ void ownership_base_kernel(const int32_t* cu, int R, int64_t T, int W, int64_t slots, int32_t* status,
                                      int32_t* req_base) {
  __shared__ int64_t scan[kMaxWorld][kScanThreads];  // (rank, request in tile): inclusive prefix
  __shared__ int64_t carry[kMaxWorld];
  __shared__ int fault;
  const int tid = threadIdx.x;
  if (tid == 0) fault = (cu[0] != 0 ? kShardqBadStart : 0) | (cu[R] != T ? kShardqBadEnd : 0);
  if (tid < kMaxWorld) carry[tid] = 0;
  __syncthreads();
  for (int tile = 0; tile < R; tile += kScanThreads) {
    const int r = tile + tid;
    int64_t n = 0;
    if (r < R) {
      const int64_t lo = cu[r], hi = cu[r + 1];
      if (hi < lo) atomicOr(&fault, int(kShardqDecreasing));
      n = hi > lo ? hi - lo : 0;
    }
    int64_t own[kMaxWorld];
#pragma unroll
    for (int p = 0; p < kMaxWorld; ++p) {
      own[p] = p < W ? shardq_owned_count(n, W, p) : 0;
      scan[p][tid] = own[p];
    }
    __syncthreads();
    for (int off = 1; off < kScanThreads; off <<= 1) {
      int64_t add[kMaxWorld];
#pragma unroll
      for (int p = 0; p < kMaxWorld; ++p) add[p] = (p < W && tid >= off) ? scan[p][tid - off] : 0;
      __syncthreads();
#pragma unroll
      for (int p = 0; p < kMaxWorld; ++p) scan[p][tid] += add[p];
      __syncthreads();
    }
    if (r < R) {
#pragma unroll
      for (int p = 0; p < kMaxWorld; ++p)
        if (p < W) req_base[int64_t(r) * W + p] = int32_t(carry[p] + scan[p][tid] - own[p]);
    }
    __syncthreads();
    if (tid < W) carry[tid] += scan[tid][kScanThreads - 1];
    __syncthreads();
  }
  if (tid < W && carry[tid] > slots) atomicOr(&fault, int(kShardqOverSlots));
  __syncthreads();
  if (tid == 0) status[0] = fault;
}

// 1b. One thread per token: its request (binary search of cu_seqlens), owner and slot.
__global__ void ownership_dest_kernel(const int32_t* cu, int R, int64_t T, int W, int rank, int64_t slots,
                                      const int32_t* status, const int32_t* req_base, int32_t* dest,
                                      int32_t* slot_token) {
  const int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (t >= T) return;
  if (status[0] != 0) {
    dest[t] = -1;
    return;
  }
  // The last request r in [0, R) with cu[r] <= t: non-empty, since cu[r + 1] > t (cu[R] = T > t).
  int lo = 0, hi = R - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (cu[mid] <= t) lo = mid;
    else hi = mid - 1;
  }
  const int64_t start = cu[lo], n = int64_t(cu[lo + 1]) - start;
  int owner = 0;
  int64_t index = 0;
  shardq_owner_of(t - start, n, W, &owner, &index);
  const int64_t slot = req_base[int64_t(lo) * W + owner] + index;
  dest[t] = int32_t(owner * slots + slot);
  if (owner == rank) slot_token[slot] = int32_t(t);
}

// 2. This rank's tokens' top-k rows and counts in slot order.
__global__ void gather_rows_kernel(const int32_t* slot_token, const int32_t* idx, int64_t idx_stride_t,
                                   const int32_t* counts, int K, int32_t* idx_own, int32_t* counts_own) {
  const int64_t s = blockIdx.x;
  const int64_t tok = slot_token[s];
  int32_t* dst = idx_own + s * K;
  if (tok < 0) {
    for (int k = threadIdx.x; k < K; k += blockDim.x) dst[k] = -1;
    if (threadIdx.x == 0) counts_own[s] = 0;
    return;
  }
  const int32_t* src = idx + tok * idx_stride_t;
  for (int k = threadIdx.x; k < K; k += blockDim.x) dst[k] = src[k];
  if (threadIdx.x == 0) counts_own[s] = counts ? counts[tok] : K;
}

// 3. q row t (this rank's heads, `vecs` 16-byte vectors) to its owner's block and slot.
__global__ void pack_q_kernel(const uint4* q, const int32_t* dest, uint4* send, int vecs) {
  const int64_t t = blockIdx.x;
  const int64_t d = dest[t];
  if (d < 0) return;
  const uint4* src = q + t * vecs;
  uint4* dst = send + d * vecs;
  for (int i = threadIdx.x; i < vecs; i += blockDim.x) dst[i] = src[i];
}

// 4. Block (slot s, peer p): p's heads of this rank's token in slot s into q_full [S, W, Hs, D].
__global__ void assemble_q_kernel(const uint4* recv, const int32_t* slot_token, uint4* q_full, int64_t S, int vecs) {
  const int64_t s = blockIdx.x, p = blockIdx.y, W = gridDim.y;
  uint4* dst = q_full + (s * W + p) * vecs;
  if (slot_token[s] < 0) {  // unused slot: zeros (its count is 0; no stale bytes reach the kernel)
    for (int i = threadIdx.x; i < vecs; i += blockDim.x) dst[i] = make_uint4(0, 0, 0, 0);
    return;
  }
  const uint4* src = recv + (p * S + s) * vecs;
  for (int i = threadIdx.x; i < vecs; i += blockDim.x) dst[i] = src[i];
}

// 6. Block (slot s, peer p): head block p of out [S, W, Hs, 512] (and of lse [S, H]) to peer p's
// send block. Unused slots are skipped: no peer reads them.
__global__ void split_out_kernel(const uint4* out_full, const float* lse_full, const int32_t* slot_token, uint4* send,
                                 float* lse_send, int64_t S, int Hs, int vecs) {
  const int64_t s = blockIdx.x, p = blockIdx.y, W = gridDim.y;
  if (slot_token[s] < 0) return;
  const uint4* src = out_full + (s * W + p) * vecs;
  uint4* dst = send + (p * S + s) * vecs;
  for (int i = threadIdx.x; i < vecs; i += blockDim.x) dst[i] = src[i];
  if (lse_send)
    for (int h = threadIdx.x; h < Hs; h += blockDim.x) lse_send[(p * S + s) * Hs + h] = lse_full[(s * W + p) * Hs + h];
}

// 7. Token t's out (and lse) back from its owner's block and slot; zeros and NaN after a bad cu_seqlens.
__global__ void unpack_out_kernel(const uint4* recv, const float* lse_recv, const int32_t* dest, uint4* out,
                                  float* lse, int Hs, int vecs) {
  const int64_t t = blockIdx.x;
  const int64_t d = dest[t];
  uint4* dst = out + t * vecs;
  if (d < 0) {
    for (int i = threadIdx.x; i < vecs; i += blockDim.x) dst[i] = make_uint4(0, 0, 0, 0);
    if (lse)
      for (int h = threadIdx.x; h < Hs; h += blockDim.x) lse[t * Hs + h] = __int_as_float(0x7fffffff);
    return;
  }
  const uint4* src = recv + d * vecs;
  for (int i = threadIdx.x; i < vecs; i += blockDim.x) dst[i] = src[i];
  if (lse)
    for (int h = threadIdx.x; h < Hs; h += blockDim.x) lse[t * Hs + h] = lse_recv[d * Hs + h];
}

}  // namespace

void shardq_ownership(const int32_t* cu_seqlens, int num_requests, int64_t num_tokens, int world, int rank,
                      int64_t slots, int32_t* status, int32_t* req_base, int32_t* dest, int32_t* slot_token,
                      void* stream_ptr) {
  SMLA_CHECK(num_requests >= 1 && num_tokens >= 1 && world >= 1 && world <= kMaxWorld && rank >= 0 && rank < world &&
                 slots >= 1,
             "shardq_ownership: need R >= 1, T >= 1, world in [1, 16], rank in [0, world), slots >= 1");
  auto stream = static_cast<cudaStream_t>(stream_ptr);
  check_cuda(cudaMemsetAsync(slot_token, 0xff, size_t(slots) * sizeof(int32_t), stream), "cudaMemsetAsync(slot_token)");
  ownership_base_kernel<<<1, kScanThreads, 0, stream>>>(cu_seqlens, num_requests, num_tokens, world, slots, status,
                                                        req_base);
  check_cuda(cudaGetLastError(), "ownership_base_kernel");
  ownership_dest_kernel<<<unsigned((num_tokens + 255) / 256), 256, 0, stream>>>(
      cu_seqlens, num_requests, num_tokens, world, rank, slots, status, req_base, dest, slot_token);
  check_cuda(cudaGetLastError(), "ownership_dest_kernel");
}

}  // namespace detail

namespace {

using detail::check_cuda;
using detail::DeviceScope;
using detail::part_of;
using detail::settle;  // the constructor's queries (no watchdog yet); the step's calls use CommWatchdog::call

constexpr int kMaxWorld = 16;

std::string s_(int64_t v) { return std::to_string(v); }

DType out_dtype_of(DType q) { return q == DType::kFP16 ? DType::kFP16 : DType::kBF16; }

ShardqConfig checked(const ShardqConfig& c) {
  static_assert(kMaxWorld == kMaxShardqWorld, "the ownership kernel's rank arrays hold kMaxShardqWorld ranks");
  check_config(c);
  return c;
}

detail::WatchdogConfig watchdog_config(const ShardqConfig& cfg) {
  detail::WatchdogConfig w;
  w.who = "ShardQ", w.rank = cfg.rank, w.timeout_ms = cfg.timeout_ms;
  w.terminate_on_stuck_call = cfg.terminate_on_stuck_call, w.watch_steps = cfg.watchdog;
  return w;
}

PlanConfig attention_plan_config(const ShardqConfig& c, int64_t slots, int device) {
  PlanConfig pc;
  pc.geometry.num_heads = c.num_heads;
  pc.geometry.rope_dim = c.rope_dim;
  pc.geometry.format = c.format;
  pc.geometry.q_dtype = c.q_dtype;
  pc.geometry.topk = c.topk;
  pc.geometry.lse_mode = LseMode::kBaseE;  // always on: exchanged when the caller asks for it
  pc.geometry.sink = c.sink;
  pc.geometry.score_precision = c.score_precision;
  pc.max_rows = slots;
  pc.backend = Backend::kCuda;
  pc.device = device;
  return pc;
}

int comm_device(void* nccl_comm, const ShardqConfig& cfg) {
  SMLA_CHECK(nccl_comm != nullptr, "ShardQ: the NCCL communicator is null");
  auto comm = static_cast<ncclComm_t>(nccl_comm);
  // [R1] of dist/nccl_watchdog.h: another step object's watchdog may be using this communicator.
  const auto state = detail::comm_state(comm);
  std::lock_guard<std::mutex> lock(state->call_mu);
  int n = 0, r = 0, dev = -1;
  settle(comm, ncclCommCount(comm, &n), "ncclCommCount", cfg.timeout_ms);
  settle(comm, ncclCommUserRank(comm, &r), "ncclCommUserRank", cfg.timeout_ms);
  SMLA_CHECK(n == cfg.world && r == cfg.rank, "ShardQ: the communicator has " + s_(n) + " ranks and this is rank " +
                                                  s_(r) + "; the config says world " + s_(cfg.world) + ", rank " +
                                                  s_(cfg.rank));
  settle(comm, ncclCommCuDevice(comm, &dev), "ncclCommCuDevice", cfg.timeout_ms);
  return dev;
}

// Grouped send / recv of one (or two) buffers of W blocks, block p to and from peer p: one guarded
// call of the watchdog [R1] (the group is closed whatever a send or recv answers).
void all_to_all(detail::CommWatchdog& wd, const void* send, void* recv, size_t block_bytes, const void* send2,
                void* recv2, size_t block2_bytes, int W, cudaStream_t stream, const char* what) {
  const ncclComm_t comm = wd.comm();
  wd.call(what, [&] {
    ncclResult_t r = ncclGroupStart();
    if (r != ncclSuccess) return r;
    for (int p = 0; p < W && r == ncclSuccess; ++p) {
      r = ncclSend(static_cast<const uint8_t*>(send) + size_t(p) * block_bytes, block_bytes, ncclUint8, p, comm,
                   stream);
      if (r == ncclSuccess)
        r = ncclRecv(static_cast<uint8_t*>(recv) + size_t(p) * block_bytes, block_bytes, ncclUint8, p, comm, stream);
      if (send2 && r == ncclSuccess)
        r = ncclSend(static_cast<const uint8_t*>(send2) + size_t(p) * block2_bytes, block2_bytes, ncclUint8, p, comm,
                     stream);
      if (send2 && r == ncclSuccess)
        r = ncclRecv(static_cast<uint8_t*>(recv2) + size_t(p) * block2_bytes, block2_bytes, ncclUint8, p, comm, stream);
    }
    const ncclResult_t end = ncclGroupEnd();
    return r != ncclSuccess ? r : end;
  });
}

}  // namespace

struct ShardQ::Impl {
  Impl(void* nccl_comm, const ShardqConfig& c)
      : comm(static_cast<ncclComm_t>(nccl_comm)),
        cfg(checked(c)),
        device(comm_device(nccl_comm, cfg)),
        slots(shardq::max_tokens_per_rank(cfg.max_tokens, cfg.world, cfg.max_requests)),
        out_dtype(out_dtype_of(cfg.q_dtype)),
        attention(attention_plan_config(cfg, slots, device)),
        wd(comm, device, watchdog_config(cfg)) {
    ShardqWorkspaceShape shape;
    shape.world = cfg.world, shape.num_heads = cfg.num_heads, shape.rope_dim = cfg.rope_dim;
    shape.q_dtype = cfg.q_dtype, shape.out_dtype = out_dtype, shape.topk = cfg.topk;
    shape.max_tokens = cfg.max_tokens, shape.max_requests = cfg.max_requests, shape.slots = slots;
    shape.attention_bytes = attention.workspace_bytes();
    layout = shardq_workspace(shape);
  }
  ncclComm_t comm;
  ShardqConfig cfg;
  int device;
  int64_t slots;
  DType out_dtype;
  Plan attention;          // all H heads over `slots` rows
  ShardqWorkspace layout;  // the step buffers in the caller's workspace
  const int32_t* last_status = nullptr;  // the last enqueued step's status word (read by wait())
  bool timing = false;
  cudaEvent_t ev[8] = {};
  // Last member: its thread stops first. Every NCCL call of a step goes through it (one lock per
  // communicator, the host's time inside visible), and it aborts the communicator when a step does
  // not finish (dist/nccl_watchdog.h).
  detail::CommWatchdog wd;

  int64_t q_row_bytes() const {  // one token, one rank's heads of q
    return int64_t(cfg.num_heads / cfg.world) * (kLatentDim + cfg.rope_dim) * dtype_bytes(cfg.q_dtype);
  }
  int64_t out_row_bytes() const { return int64_t(cfg.num_heads / cfg.world) * kLatentDim * dtype_bytes(out_dtype); }
};

ShardQ::ShardQ(void* nccl_comm, const ShardqConfig& cfg) : impl_(std::make_unique<Impl>(nccl_comm, cfg)) {
  DeviceScope on(impl_->device);
  for (auto& e : impl_->ev) check_cuda(cudaEventCreate(&e), "cudaEventCreate");
}

ShardQ::~ShardQ() {
  for (auto& e : impl_->ev)
    if (e) cudaEventDestroy(e);
}

const ShardqConfig& ShardQ::config() const { return impl_->cfg; }
int ShardQ::device() const { return impl_->device; }
int64_t ShardQ::slots() const { return impl_->slots; }
size_t ShardQ::workspace_bytes() const { return impl_->layout.bytes; }
void ShardQ::enable_timing(bool on) { impl_->timing = on; }
size_t ShardQ::a2a_q_bytes() const { return size_t(impl_->cfg.world * impl_->slots * impl_->q_row_bytes()); }
size_t ShardQ::a2a_out_bytes(bool with_lse) const {
  const auto& m = *impl_;
  return size_t(m.cfg.world * m.slots * (m.out_row_bytes() + (with_lse ? m.cfg.num_heads / m.cfg.world * 4 : 0)));
}

ShardQ::Timing ShardQ::last_timing() const {
  auto& m = *impl_;
  Timing t;
  if (!m.timing) return t;
  float ms[7] = {};
  for (int i = 0; i < 7; ++i) check_cuda(cudaEventElapsedTime(&ms[i], m.ev[i], m.ev[i + 1]), "cudaEventElapsedTime");
  // ev: 0 start | 1 q a2a | 2 assemble | 3 attention | 4 split | 5 out a2a | 6 unpack | 7
  t.a2a_q_ms = ms[1], t.attn_ms = ms[3], t.a2a_out_ms = ms[5];
  t.other_ms = ms[0] + ms[2] + ms[4] + ms[6];
  t.total_ms = t.a2a_q_ms + t.attn_ms + t.a2a_out_ms + t.other_ms;
  return t;
}

void ShardQ::step(const ShardqStepArgs& a, void* workspace, size_t workspace_bytes, void* stream_ptr) {
  auto& m = *impl_;
  const auto& cfg = m.cfg;
  auto stream = static_cast<cudaStream_t>(stream_ptr);
  m.wd.check();  // after an abort every step throws the recorded failure
  SMLA_CHECK(a.num_tokens >= 0 && a.num_tokens <= cfg.max_tokens,
             "ShardQ step: T = " + s_(a.num_tokens) + " must be in [0, max_tokens = " + s_(cfg.max_tokens) +
                 "]; plan a ShardQ with a larger max_tokens");
  SMLA_CHECK(a.num_requests >= 0 && a.num_requests <= cfg.max_requests,
             "ShardQ step: R = " + s_(a.num_requests) + " requests must be in [0, max_requests = " +
                 s_(cfg.max_requests) + "]; plan a ShardQ with a larger max_requests");
  SMLA_CHECK(a.num_tokens == 0 || a.num_requests >= 1,
             "ShardQ step: T = " + s_(a.num_tokens) + " tokens in 0 requests; give num_requests >= 1 and cu_seqlens");
  SMLA_CHECK(workspace_bytes >= m.layout.bytes && (workspace != nullptr || m.layout.bytes == 0),
             "ShardQ step: workspace too small: the step needs " + s_(int64_t(m.layout.bytes)) +
                 " bytes (ShardQ::workspace_bytes()); got " + s_(int64_t(workspace_bytes)));
  SMLA_CHECK(reinterpret_cast<uintptr_t>(workspace) % 16 == 0, "ShardQ step: the workspace must be 16-byte aligned");
  if (a.num_tokens == 0) return;  // every rank has the same T: no rank enqueues anything
  SMLA_CHECK(a.cu_seqlens && a.q && a.idx && a.out && a.kv,
             "ShardQ step: cu_seqlens, q, idx, out and kv must not be null");
  SMLA_CHECK(reinterpret_cast<uintptr_t>(a.q) % 16 == 0 && reinterpret_cast<uintptr_t>(a.out) % 16 == 0,
             "ShardQ step: q and out must be 16-byte aligned (dense [T, H / W, D] and [T, H / W, 512])");
  SMLA_CHECK(reinterpret_cast<uintptr_t>(a.idx) % 4 == 0 && reinterpret_cast<uintptr_t>(a.lse) % 4 == 0 &&
                 reinterpret_cast<uintptr_t>(a.counts) % 4 == 0 && reinterpret_cast<uintptr_t>(a.cu_seqlens) % 4 == 0,
             "ShardQ step: idx, counts, cu_seqlens and lse must be 4-byte aligned");
  const int64_t idx_stride = a.idx_stride_t ? a.idx_stride_t : cfg.topk;
  SMLA_CHECK(idx_stride >= cfg.topk, "ShardQ step: idx_stride_t = " + s_(idx_stride) + " must be >= topk = " +
                                         s_(cfg.topk) + " (idx is [T, K] with row stride idx_stride_t)");
  SMLA_CHECK((a.sink != nullptr) == cfg.sink, std::string("ShardQ step: sink ") + (a.sink ? "given" : "absent") +
                                                  " but the ShardQ was configured with sink " +
                                                  (cfg.sink ? "on (pass sink [H], every head)" : "off"));
  const int64_t T = a.num_tokens, S = m.slots;
  const int W = cfg.world, H = cfg.num_heads, Hs = H / W, K = cfg.topk;
  {  // out and lse are written while q, idx, counts, cu_seqlens and the workspace are read
    struct Span {
      const void* p;
      size_t bytes;
      const char* name;
    };
    auto overlap = [](const Span& x, const Span& y) {
      const auto xb = reinterpret_cast<uintptr_t>(x.p), yb = reinterpret_cast<uintptr_t>(y.p);
      return x.bytes && y.bytes && xb < yb + y.bytes && yb < xb + x.bytes;
    };
    const Span out_span{a.out, size_t(T) * size_t(m.out_row_bytes()), "out"};
    const Span lse_span{a.lse, a.lse ? size_t(T) * Hs * sizeof(float) : 0, "lse"};
    const Span inputs[] = {{a.q, size_t(T) * size_t(m.q_row_bytes()), "q"},
                           {a.idx, size_t((T - 1) * idx_stride + K) * sizeof(int32_t), "idx"},
                           {a.counts, a.counts ? size_t(T) * sizeof(int32_t) : 0, "counts"},
                           {a.cu_seqlens, size_t(a.num_requests + 1) * sizeof(int32_t), "cu_seqlens"},
                           {workspace, m.layout.bytes, "the workspace"}};
    for (const Span& o : {out_span, lse_span})
      for (const Span& i : inputs)
        SMLA_CHECK(!overlap(o, i), std::string("ShardQ step: ") + o.name + " overlaps " + i.name +
                                       "; outputs need memory of their own");
    SMLA_CHECK(!overlap(out_span, lse_span), "ShardQ step: out overlaps lse; outputs need memory of their own");
  }
  const ShardqWorkspace& L = m.layout;
  auto* status = part_of<int32_t>(workspace, L.status);
  auto* req_base = part_of<int32_t>(workspace, L.req_base);
  auto* dest = part_of<int32_t>(workspace, L.dest);
  auto* slot_token = part_of<int32_t>(workspace, L.slot_token);
  auto* ex_a = part_of<uint4>(workspace, L.exchange_a);
  auto* ex_b = part_of<uint4>(workspace, L.exchange_b);
  auto* lse_send = part_of<float>(workspace, L.lse_send);
  auto* lse_recv = part_of<float>(workspace, L.lse_recv);
  auto* q_full = part_of<uint4>(workspace, L.q_full);
  auto* idx_own = part_of<int32_t>(workspace, L.idx);
  auto* counts_own = part_of<int32_t>(workspace, L.counts);
  auto* lse_full = part_of<float>(workspace, L.lse_full);

  SparseMlaParams p;
  p.num_tokens = S, p.num_heads = H, p.rope_dim = cfg.rope_dim, p.topk = K;
  p.q = q_full, p.q_dtype = cfg.q_dtype, p.kv = a.kv, p.num_rows = a.num_rows, p.kv_row_stride_bytes = a.kv_row_stride_bytes;
  p.format = cfg.format, p.idx = idx_own, p.counts = counts_own, p.sink = a.sink;
  p.softmax_scale = a.softmax_scale, p.q_scale = a.q_scale, p.k_scale = a.k_scale;
  p.out = ex_a, p.out_dtype = m.out_dtype, p.lse = lse_full, p.lse_mode = LseMode::kBaseE;
  p.score_precision = cfg.score_precision;
  set_dense_strides(p);
  void* attn_ws = part_of<uint8_t>(workspace, L.attention);
  m.attention.check(p, L.attention.bytes);  // everything the attention will check, before anything is enqueued

  const int q_vecs = int(m.q_row_bytes() / 16), o_vecs = int(m.out_row_bytes() / 16);  // multiples of 16 bytes
  const size_t q_block = size_t(S) * size_t(m.q_row_bytes()), o_block = size_t(S) * size_t(m.out_row_bytes());
  const bool with_lse = a.lse != nullptr;
  auto mark = [&](int i) {
    if (m.timing) check_cuda(cudaEventRecord(m.ev[i], stream), "cudaEventRecord");
  };

  DeviceScope on(m.device);
  mark(0);
  detail::shardq_ownership(a.cu_seqlens, a.num_requests, T, W, cfg.rank, S, status, req_base, dest, slot_token, stream);
  detail::gather_rows_kernel<<<unsigned(S), 128, 0, stream>>>(slot_token, a.idx, idx_stride, a.counts, K, idx_own,
                                                              counts_own);
  check_cuda(cudaGetLastError(), "gather_rows_kernel");
  detail::pack_q_kernel<<<unsigned(T), 128, 0, stream>>>(static_cast<const uint4*>(a.q), dest, ex_a, q_vecs);
  check_cuda(cudaGetLastError(), "pack_q_kernel");
  m.last_status = status;
  mark(1);
  // No host polling here: the watchdog bounds each call and the step's completion (dist/nccl_watchdog.h).
  all_to_all(m.wd, ex_a, ex_b, q_block, nullptr, nullptr, 0, W, stream, "the all-to-all of q (ncclGroupEnd)");
  mark(2);
  detail::assemble_q_kernel<<<dim3(unsigned(S), unsigned(W)), 128, 0, stream>>>(ex_b, slot_token, q_full, S, q_vecs);
  check_cuda(cudaGetLastError(), "assemble_q_kernel");
  mark(3);
  m.attention.run(p, attn_ws, L.attention.bytes, stream);  // out [S, H, 512] into exchange_a
  mark(4);
  detail::split_out_kernel<<<dim3(unsigned(S), unsigned(W)), 128, 0, stream>>>(
      ex_a, lse_full, slot_token, ex_b, with_lse ? lse_send : nullptr, S, Hs, o_vecs);
  check_cuda(cudaGetLastError(), "split_out_kernel");
  mark(5);
  all_to_all(m.wd, ex_b, ex_a, o_block, with_lse ? lse_send : nullptr, lse_recv, size_t(S) * Hs * sizeof(float), W,
             stream, "the all-to-all of out (ncclGroupEnd)");
  // After the step's last NCCL operation (the host's event record overlaps the GPU's all-to-all):
  // the watchdog aborts the communicator if the stream has not got here within timeout_ms.
  m.wd.step_enqueued(stream);
  mark(6);
  detail::unpack_out_kernel<<<unsigned(T), 128, 0, stream>>>(ex_a, lse_recv, dest, static_cast<uint4*>(a.out), a.lse,
                                                             Hs, o_vecs);
  check_cuda(cudaGetLastError(), "unpack_out_kernel");
  mark(7);
}

void ShardQ::wait(void* stream_ptr, int timeout_ms) {
  SMLA_CHECK(timeout_ms >= 1, "ShardQ::wait: timeout_ms must be >= 1; got " + s_(timeout_ms));
  auto& m = *impl_;
  auto stream = static_cast<cudaStream_t>(stream_ptr);
  DeviceScope on(m.device);
  m.wd.wait(stream, timeout_ms);  // NCCL's asynchronous error, the watchdog's abort, or timeout_ms: throws
  // The stream is done: the last step's own fault (a malformed cu_seqlens), seen only on the device.
  if (!m.last_status) return;
  int32_t status = 0;
  check_cuda(cudaMemcpyAsync(&status, m.last_status, sizeof(status), cudaMemcpyDeviceToHost, stream),
             "reading the ShardQ step's status");
  check_cuda(cudaStreamSynchronize(stream), "reading the ShardQ step's status");
  if (status == 0) return;
  std::string why;
  if (status & detail::kShardqBadStart) why += " cu_seqlens[0] is not 0;";
  if (status & detail::kShardqDecreasing) why += " cu_seqlens decreases;";
  if (status & detail::kShardqBadEnd) why += " cu_seqlens[R] is not T;";
  if (status & detail::kShardqOverSlots) why += " a rank got more tokens than the planned slots;";
  fail("ShardQ step on rank " + s_(m.cfg.rank) + ": bad cu_seqlens:" + why +
       " it must be [R + 1] non-decreasing int32 from 0 to T (out was written as 0, lse as NaN)");
}

bool ShardQ::aborted() const { return impl_->wd.aborted(); }

}  // namespace smla::dist
