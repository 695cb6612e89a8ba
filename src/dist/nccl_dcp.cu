// Decode context parallelism over NCCL: the step (DESIGN.md §5) and its small kernels.
//
// Step on rank r of W (H = W * H_l gathered heads):
//   1. convert_indices with the DCP filter: global positions -> local rows, compacted + counted
//   2. ncclAllGather q [T, H_l, D] -> [W, T, H_l, D]; gather_heads -> [T, H, D]
//   3. sparse attention, LSE on: out_part [T, H, 512], lse_part [T, H]
//   4a. all-gather + reduce-scatter: ncclAllGather lse_part -> [W, T, H]; each rank scales its
//       partial by exp(l_r - L) into [W, T, H_l, 512] fp32 (rank-major); ncclReduceScatter(sum)
//       -> [T, H_l, 512]; finalize writes out and L for the local heads.
//   4b. all-to-all: pack (out, lse) of the heads each peer owns into [W, T, H_l, 513] fp32; grouped
//       send/recv; merge the W received partials of the local heads.
#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <string>
#include <thread>

#include "smla/cuda_serving.h"
#include "smla/dist.h"
#include "smla/engine.h"
#include "smla/formats.h"
#include "smla/numeric.h"
#include "smla/params.h"
#include "smla/state.h"
#include "smla/workspace.h"
#include "dist/nccl_common.h"
#include "dist/nccl_watchdog.h"

namespace smla::dist {
namespace {

using detail::check_cuda;
using detail::check_nccl;
using detail::DeviceScope;
using detail::part_of;
using detail::settle;  // the constructor's queries (no watchdog yet); the step's calls use CommWatchdog::call

// Partials merged per (row, head) sit in a small local array indexed by rank; these merge kernels
// move a few hundred KB per step, so that stack use (see ptxas) is deliberate.
constexpr int kMaxWorld = 16;

constexpr int kPack = kLatentDim + 1;  // one packed partial: 512 outputs + its LSE

// [W, T, H_l, D] (16-bit) -> [T, W * H_l, D]: one block per (t, gathered head), 16-byte copies.
__global__ void gather_heads_kernel(const uint4* src, uint4* dst, int64_t T, int W, int Hl, int vecs_per_head) {
  const int64_t t = blockIdx.x;
  const int h = blockIdx.y, w = h / Hl, hl = h % Hl;
  const uint4* s = src + ((int64_t(w) * T + t) * Hl + hl) * vecs_per_head;
  uint4* d = dst + (t * W * Hl + h) * vecs_per_head;
  for (int i = threadIdx.x; i < vecs_per_head; i += blockDim.x) d[i] = s[i];
}


__device__ __forceinline__ float load16(const uint16_t* p, int64_t i, bool bf16) {
  return bf16 ? num::bf16_to_f32(p[i]) : num::fp16_to_f32(p[i]);
}
__device__ __forceinline__ uint16_t store16(float v, bool bf16) { return bf16 ? num::f32_to_bf16(v) : num::f32_to_fp16(v); }

// Path a: weight this rank's partial of every gathered head by exp(l_rank - L) into the rank-major
// reduce-scatter buffer, and keep L of the local heads. One block per (t, h).
__global__ void weight_scatter_kernel(const uint16_t* out_part, const float* lse_all, float* scaled, float* lse_local,
                                      int64_t T, int W, int Hl, int rank, bool bf16) {
  const int64_t t = blockIdx.x;
  const int h = blockIdx.y, H = W * Hl;
  float l[kMaxWorld], wts[kMaxWorld];
  for (int r = 0; r < W; ++r) l[r] = lse_all[(int64_t(r) * T + t) * H + h];
  const float L = lse_merge(l, W, wts);
  const float w = wts[rank];
  const int dst_rank = h / Hl, hl = h % Hl;
  float* dst = scaled + ((int64_t(dst_rank) * T + t) * Hl + hl) * kLatentDim;
  const uint16_t* src = out_part + (t * H + h) * kLatentDim;
  for (int d = threadIdx.x; d < kLatentDim; d += blockDim.x) dst[d] = w == 0.0f ? 0.0f : w * load16(src, d, bf16);
  if (threadIdx.x == 0 && dst_rank == rank) lse_local[t * Hl + hl] = L;
}

__global__ void finalize_kernel(const float* summed, const float* lse_local, uint16_t* out, float* lse, int64_t n_heads,
                                bool bf16) {
  const int64_t i = blockIdx.x;  // (t, hl)
  for (int d = threadIdx.x; d < kLatentDim; d += blockDim.x) out[i * kLatentDim + d] = store16(summed[i * kLatentDim + d], bf16);
  if (lse && threadIdx.x == 0) lse[i] = lse_local[i];
  (void)n_heads;
}

// Path b: pack the partial (out, lse) of the heads peer w owns into send[w, t, hl, 0:513].
__global__ void pack_kernel(const uint16_t* out_part, const float* lse_part, float* send, int64_t T, int W, int Hl,
                            bool bf16) {
  const int64_t t = blockIdx.x;
  const int h = blockIdx.y, H = W * Hl, w = h / Hl, hl = h % Hl;
  float* dst = send + ((int64_t(w) * T + t) * Hl + hl) * kPack;
  const uint16_t* src = out_part + (t * H + h) * kLatentDim;
  for (int d = threadIdx.x; d < kLatentDim; d += blockDim.x) dst[d] = load16(src, d, bf16);
  if (threadIdx.x == 0) dst[kLatentDim] = lse_part[t * H + h];
}

__global__ void merge_received_kernel(const float* recv, uint16_t* out, float* lse, int64_t T, int W, int Hl, bool bf16) {
  const int64_t i = blockIdx.x;  // (t, hl) of the local heads
  float l[kMaxWorld], wts[kMaxWorld];
  for (int r = 0; r < W; ++r) l[r] = recv[(int64_t(r) * T * Hl + i) * kPack + kLatentDim];
  const float L = lse_merge(l, W, wts);
  for (int d = threadIdx.x; d < kLatentDim; d += blockDim.x) {
    float acc = 0.0f;
    for (int r = 0; r < W; ++r)
      if (wts[r] != 0.0f) acc += wts[r] * recv[(int64_t(r) * T * Hl + i) * kPack + d];
    out[i * kLatentDim + d] = store16(acc, bf16);
  }
  if (lse && threadIdx.x == 0) lse[i] = L;
}

PlanConfig attention_plan_config(const DcpConfig& cfg, int device) {
  PlanConfig pc;
  pc.geometry.num_heads = cfg.local_heads * cfg.world;
  pc.geometry.rope_dim = cfg.rope_dim;
  pc.geometry.format = cfg.format;
  pc.geometry.q_dtype = cfg.q_dtype;
  pc.geometry.topk = cfg.topk;
  pc.geometry.lse_mode = LseMode::kBaseE;  // the merge needs every partial's LSE
  pc.geometry.sink = false;
  pc.max_rows = cfg.max_rows;
  pc.backend = Backend::kCuda;
  pc.device = device;
  return pc;
}

DcpConfig checked(const DcpConfig& cfg) {
  static_assert(kMaxWorld == kMaxDcpWorld, "the merge kernels' rank arrays hold kMaxDcpWorld partials");
  check_config(cfg);
  return cfg;
}

detail::WatchdogConfig watchdog_config(const DcpConfig& cfg) {
  detail::WatchdogConfig w;
  w.who = "DCP", w.rank = cfg.rank, w.timeout_ms = cfg.timeout_ms;
  w.terminate_on_stuck_call = cfg.terminate_on_stuck_call, w.watch_steps = cfg.watchdog;
  return w;
}

int comm_device(void* nccl_comm, const DcpConfig& cfg) {
  SMLA_CHECK(nccl_comm != nullptr, "DCP: the NCCL communicator is null");
  auto comm = static_cast<ncclComm_t>(nccl_comm);
  // [R1] of dist/nccl_watchdog.h: another step object's watchdog may be using this communicator.
  const auto state = detail::comm_state(comm);
  std::lock_guard<std::mutex> lock(state->call_mu);
  int n = 0, r = 0, dev = -1;
  settle(comm, ncclCommCount(comm, &n), "ncclCommCount", cfg.timeout_ms);
  settle(comm, ncclCommUserRank(comm, &r), "ncclCommUserRank", cfg.timeout_ms);
  SMLA_CHECK(n == cfg.world && r == cfg.rank, "DCP: the communicator has " + std::to_string(n) + " ranks and this is rank " +
                                                  std::to_string(r) + "; the config says world " +
                                                  std::to_string(cfg.world) + ", rank " + std::to_string(cfg.rank));
  settle(comm, ncclCommCuDevice(comm, &dev), "ncclCommCuDevice", cfg.timeout_ms);
  return dev;
}

}  // namespace

struct Dcp::Impl {
  Impl(void* nccl_comm, const DcpConfig& c)
      : comm(static_cast<ncclComm_t>(nccl_comm)),
        cfg(checked(c)),
        device(comm_device(nccl_comm, cfg)),
        attention(attention_plan_config(cfg, device)),
        wd(comm, device, watchdog_config(cfg)) {
    DcpWorkspaceShape shape;
    shape.world = cfg.world, shape.local_heads = cfg.local_heads, shape.rope_dim = cfg.rope_dim;
    shape.q_dtype = cfg.q_dtype, shape.topk = cfg.topk, shape.max_rows = cfg.max_rows;
    shape.all_to_all = cfg.all_to_all, shape.attention_bytes = attention.workspace_bytes();
    layout = dcp_workspace(shape);
  }
  ncclComm_t comm;
  DcpConfig cfg;
  int device;
  Plan attention;       // the one dispatch of the API layer, planned for this rank's H_l * W heads
  DcpWorkspace layout;  // the step buffers in the caller's workspace
  bool timing = false;
  cudaEvent_t ev[4] = {};
  // Last member: its thread stops first. Every NCCL call of a step goes through it (one lock, the
  // host's time inside visible), and it aborts the communicator when a step does not finish.
  detail::CommWatchdog wd;
};

Dcp::Dcp(void* nccl_comm, const DcpConfig& cfg) : impl_(std::make_unique<Impl>(nccl_comm, cfg)) {
  DeviceScope on(impl_->device);
  for (auto& e : impl_->ev) check_cuda(cudaEventCreate(&e), "cudaEventCreate");
}

Dcp::~Dcp() {
  for (auto& e : impl_->ev)
    if (e) cudaEventDestroy(e);
}

const DcpConfig& Dcp::config() const { return impl_->cfg; }
int Dcp::device() const { return impl_->device; }
size_t Dcp::workspace_bytes() const { return impl_->layout.bytes; }
void Dcp::enable_timing(bool on) { impl_->timing = on; }

Dcp::Timing Dcp::last_timing() const {
  auto& m = *impl_;
  Timing t;
  if (!m.timing) return t;
  float a = 0, b = 0, c = 0;
  check_cuda(cudaEventElapsedTime(&a, m.ev[0], m.ev[1]), "cudaEventElapsedTime");  // index + q gather
  check_cuda(cudaEventElapsedTime(&b, m.ev[1], m.ev[2]), "cudaEventElapsedTime");  // attention
  check_cuda(cudaEventElapsedTime(&c, m.ev[2], m.ev[3]), "cudaEventElapsedTime");  // merge
  t.attn_ms = b, t.comm_ms = a + c, t.total_ms = a + b + c;
  return t;
}

void Dcp::step(const DcpStepArgs& a, void* workspace, size_t workspace_bytes, void* stream_ptr) {
  auto& m = *impl_;
  const auto& cfg = m.cfg;
  auto stream = static_cast<cudaStream_t>(stream_ptr);
  m.wd.check();  // after an abort every step throws the recorded failure
  SMLA_CHECK(a.num_tokens >= 0 && a.num_tokens <= cfg.max_rows,
             "DCP step: T = " + std::to_string(a.num_tokens) + " must be in [0, max_rows = " + std::to_string(cfg.max_rows) + "]");
  SMLA_CHECK(workspace_bytes >= m.layout.bytes && (workspace != nullptr || m.layout.bytes == 0),
             "DCP step: workspace too small: the step needs " + std::to_string(m.layout.bytes) +
                 " bytes (Dcp::workspace_bytes()); got " + std::to_string(workspace_bytes));
  SMLA_CHECK(reinterpret_cast<uintptr_t>(workspace) % 16 == 0, "DCP step: the workspace must be 16-byte aligned");
  if (a.num_tokens == 0) return;
  SMLA_CHECK(a.q && a.positions && a.out, "DCP step: q, positions and out must not be null");
  const int64_t T = a.num_tokens;
  const int W = cfg.world, Hl = cfg.local_heads, H = Hl * W, K = cfg.topk, D = kLatentDim + cfg.rope_dim;
  const bool bf16 = cfg.q_dtype == DType::kBF16;
  const DcpWorkspace& L = m.layout;
  auto* idx = part_of<int32_t>(workspace, L.idx);
  auto* counts = part_of<int32_t>(workspace, L.counts);
  auto* q_gathered = part_of<uint16_t>(workspace, L.q_gathered);
  auto* q_all = part_of<uint16_t>(workspace, L.q_all);
  auto* out_part = part_of<uint16_t>(workspace, L.out_part);
  auto* lse_part = part_of<float>(workspace, L.lse_part);

  // 1. Global top-k -> this rank's local rows, compacted and counted (validated by the launcher).
  IndexConvertParams ic;
  ic.positions = a.positions, ic.pos_stride_t = K, ic.num_tokens = T, ic.topk = K, ic.req_of_token = a.req_of_token;
  ic.block_table = a.block_table, ic.bt_stride = a.bt_stride, ic.num_reqs = a.num_reqs, ic.max_blocks = a.max_blocks;
  ic.block_size = a.block_size, ic.block_stride_rows = a.block_stride_rows, ic.phys = idx, ic.phys_stride_t = K;
  ic.counts = counts, ic.dcp_world = W, ic.dcp_rank = cfg.rank, ic.dcp_interleave = cfg.interleave;

  SparseMlaParams p;
  p.num_tokens = T, p.num_heads = H, p.rope_dim = cfg.rope_dim, p.topk = K;
  p.q = q_all, p.q_dtype = cfg.q_dtype, p.kv = a.kv, p.num_rows = a.num_rows, p.kv_row_stride_bytes = a.kv_row_stride_bytes;
  p.format = cfg.format, p.idx = idx, p.counts = counts, p.softmax_scale = a.softmax_scale, p.q_scale = a.q_scale;
  p.k_scale = a.k_scale, p.out = out_part, p.out_dtype = cfg.q_dtype, p.lse = lse_part, p.lse_mode = LseMode::kBaseE;
  set_dense_strides(p);
  void* attn_ws = part_of<uint8_t>(workspace, L.attention);
  m.attention.check(p, L.attention.bytes);  // everything the attention will check, before anything is enqueued
  validate(ic);

  DeviceScope on(m.device);
  if (m.timing) check_cuda(cudaEventRecord(m.ev[0], stream), "cudaEventRecord");
  cuda::convert_indices(ic, stream);
  const size_t q_elems = size_t(T) * Hl * D;
  // No host polling here: the watchdog bounds the call and the step's completion (dist/nccl_watchdog.h).
  m.wd.call("ncclAllGather(q)", [&] { return ncclAllGather(a.q, q_gathered, q_elems * 2, ncclUint8, m.comm, stream); });
  gather_heads_kernel<<<dim3(unsigned(T), unsigned(H)), 128, 0, stream>>>(
      reinterpret_cast<const uint4*>(q_gathered), reinterpret_cast<uint4*>(q_all), T, W, Hl, D * 2 / 16);
  check_cuda(cudaGetLastError(), "gather_heads_kernel");
  if (m.timing) check_cuda(cudaEventRecord(m.ev[1], stream), "cudaEventRecord");

  // 3. Local attention over the gathered heads, through the plan.
  m.attention.run(p, attn_ws, L.attention.bytes, stream);
  if (m.timing) check_cuda(cudaEventRecord(m.ev[2], stream), "cudaEventRecord");

  // 4. Merge across ranks.
  auto* out = static_cast<uint16_t*>(a.out);
  if (!cfg.all_to_all) {
    auto* lse_all = part_of<float>(workspace, L.lse_all);
    auto* scaled = part_of<float>(workspace, L.scaled);
    auto* summed = part_of<float>(workspace, L.summed);
    auto* lse_local = part_of<float>(workspace, L.lse_local);
    m.wd.call("ncclAllGather(lse)",
              [&] { return ncclAllGather(lse_part, lse_all, size_t(T) * H, ncclFloat32, m.comm, stream); });
    weight_scatter_kernel<<<dim3(unsigned(T), unsigned(H)), 128, 0, stream>>>(out_part, lse_all, scaled, lse_local, T,
                                                                               W, Hl, cfg.rank, bf16);
    check_cuda(cudaGetLastError(), "weight_scatter_kernel");
    m.wd.call("ncclReduceScatter(out)", [&] {
      return ncclReduceScatter(scaled, summed, size_t(T) * Hl * kLatentDim, ncclFloat32, ncclSum, m.comm, stream);
    });
    // After the last NCCL operation (the host's event record overlaps the GPU's collective): the
    // watchdog aborts if the stream has not got here within timeout_ms.
    m.wd.step_enqueued(stream);
    finalize_kernel<<<unsigned(T * Hl), 128, 0, stream>>>(summed, lse_local, out, a.lse, T * Hl, bf16);
    check_cuda(cudaGetLastError(), "finalize_kernel");
  } else {
    auto* send = part_of<float>(workspace, L.send);
    auto* recv = part_of<float>(workspace, L.recv);
    pack_kernel<<<dim3(unsigned(T), unsigned(H)), 128, 0, stream>>>(out_part, lse_part, send, T, W, Hl, bf16);
    check_cuda(cudaGetLastError(), "pack_kernel");
    const size_t chunk = size_t(T) * Hl * kPack;
    // One guarded call for the whole group [R1]: the group is closed whatever a send or recv answers.
    m.wd.call("the all-to-all (ncclGroupEnd)", [&] {
      ncclResult_t r = ncclGroupStart();
      if (r != ncclSuccess) return r;
      for (int p = 0; p < W && r == ncclSuccess; ++p) {
        r = ncclSend(send + size_t(p) * chunk, chunk, ncclFloat32, p, m.comm, stream);
        if (r == ncclSuccess) r = ncclRecv(recv + size_t(p) * chunk, chunk, ncclFloat32, p, m.comm, stream);
      }
      const ncclResult_t end = ncclGroupEnd();
      return r != ncclSuccess ? r : end;
    });
    m.wd.step_enqueued(stream);  // after the last NCCL operation, as above
    merge_received_kernel<<<unsigned(T * Hl), 128, 0, stream>>>(recv, out, a.lse, T, W, Hl, bf16);
    check_cuda(cudaGetLastError(), "merge_received_kernel");
  }
  if (m.timing) check_cuda(cudaEventRecord(m.ev[3], stream), "cudaEventRecord");
}

void Dcp::wait(void* stream_ptr, int timeout_ms) {
  SMLA_CHECK(timeout_ms >= 1, "Dcp::wait: timeout_ms must be >= 1; got " + std::to_string(timeout_ms));
  DeviceScope on(impl_->device);
  impl_->wd.wait(static_cast<cudaStream_t>(stream_ptr), timeout_ms);
}

bool Dcp::aborted() const { return impl_->wd.aborted(); }

std::vector<uint8_t> make_unique_id() {
  ncclUniqueId id;
  check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
  std::vector<uint8_t> v(sizeof(id));
  std::memcpy(v.data(), &id, sizeof(id));
  return v;
}

void* make_comm(const std::vector<uint8_t>& unique_id, int world, int rank, int timeout_ms, bool nonblocking) {
  SMLA_CHECK(unique_id.size() == sizeof(ncclUniqueId), "make_comm: the unique id must be NCCL_UNIQUE_ID_BYTES long");
  ncclUniqueId id;
  std::memcpy(&id, unique_id.data(), sizeof(id));
  ncclComm_t comm = nullptr;
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  // Blocking by default: no per-call host thread and polling [R3 of dist/nccl_watchdog.h]; the
  // step's watchdog bounds the rest. Nonblocking: every call returns at once and is polled.
  config.blocking = nonblocking ? 0 : 1;
  const ncclResult_t r = ncclCommInitRankConfig(&comm, world, id, rank, &config);
  if (r != ncclSuccess && r != ncclInProgress) fail(std::string("ncclCommInitRankConfig: ") + ncclGetErrorString(r));
  detail::forget_aborted(comm);  // a fresh communicator (NCCL may reuse an aborted one's address)
  settle(comm, r, "ncclCommInitRankConfig", timeout_ms);
  return comm;
}

void destroy_comm(void* comm) {
  if (!comm) return;
  if (detail::was_aborted(comm)) {  // ncclCommAbort already freed it
    detail::forget_aborted(comm);
    return;
  }
  ncclCommDestroy(static_cast<ncclComm_t>(comm));
}

}  // namespace smla::dist
