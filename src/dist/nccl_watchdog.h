// A per-communicator watchdog for the NCCL steps of smla_dist (DCP, ShardQ): it bounds how long a
// rank waits for peers that stopped taking part, without polling inside the step.
//
// The NCCL rules this rests on (NCCL user guide, 2.2x-2.30):
//  [R1] Thread safety: "it is not allowed to issue NCCL operations to a single communicator in
//       parallel with multiple threads"; "it is safe to operate a communicator from multiple threads
//       as long as ... only one thread operates the communicator at a time". So every NCCL call on
//       the communicator (the step's, the watchdog's ncclCommGetAsyncError, ncclCommAbort) is made
//       under one lock per communicator, CommState::call_mu.
//  [R2] Error handling: operations that hit an asynchronous error "will usually not progress and
//       never complete"; the application should watch ncclCommGetAsyncError while waiting and then
//       ncclCommAbort, which "frees resources associated with communicator object and aborts any
//       operations that might still be running on the device" (nccl.h). So a step whose kernels
//       wait for a dead peer ends once the watchdog aborts the communicator, and the caller's own
//       stream synchronization returns instead of hanging.
//  [R3] Nonblocking communicators (config.blocking = 0): a call may return ncclInProgress; the
//       state must then be polled with ncclCommGetAsyncError until ncclSuccess before the next NCCL
//       call, and no kernel may be issued on the stream before that. NCCL runs every such group on
//       a new host thread (src/group.cc), which is the per-call cost measured in perf-history (DCP).
//       A blocking communicator never returns ncclInProgress, so it needs no polling.
//  [R4] Fault tolerance: NCCL makes "all NCCL calls ... non-blocking to ensure ncclCommAbort can be
//       called at any point". A blocking call that hangs on the host (connection setup to a dead
//       peer is the one seen here: 59.5 s until NCCL's own timeout) cannot be aborted from another
//       thread under [R1] — the abort would free the communicator under the call. Only the
//       nonblocking mode bounds that case with an exception; with a blocking communicator the
//       watchdog can only report it and (by default) terminate the process, as PyTorch's
//       ProcessGroupNCCL does by default (TORCH_NCCL_ASYNC_ERROR_HANDLING = 3: tear down the process
//       without aborting the communicator).
//  [R5] CUDA graphs: steps captured into a graph are not watched (no event is recorded while the
//       stream is capturing: an event recorded during capture is a graph node, not a point the host
//       can query), and this thread runs in the thread-local capture mode.
//
// Timeout semantics follow ProcessGroupNCCL's work timeout: a step counts from the moment it was
// enqueued on the host (its completion event recorded), so work queued before it on the same stream
// counts too; timeout_ms must exceed the longest healthy step including that queue. A step that
// finishes within timeout_ms is never aborted: its clock stops when its completion event completes.
// The watchdog looks every min(timeout_ms / 8, 100) ms, so a failure surfaces within timeout_ms
// plus that.
//
// Call pattern for a step class (see Dcp in nccl_dcp.cu, ShardQ in nccl_shardq.cu):
//   CommWatchdog wd(comm, device, {"DCP", rank, timeout_ms, terminate_on_stuck_call});  // one thread
//   wd.check();                                          // throws once the communicator failed
//   wd.call("ncclAllGather(q)", [&] { return ncclAllGather(..., comm, stream); });
//   wd.call("the all-to-all", [&] {                      // a group is one guarded call
//     ncclGroupStart(); ... ncclSend/ncclRecv ...; return ncclGroupEnd(); });
//   wd.step_enqueued(stream);                            // after the step's last NCCL operation
//   wd.wait(stream, timeout_ms);                         // the caller's bounded wait (Dcp::wait)
// Several step objects on one communicator (a Dcp and a ShardQ step) each own a CommWatchdog; they
// share the communicator's CommState (its lock and its fate), so an abort by one makes the other's
// next call throw the same error. A constructor's own queries (ncclCommCount, ncclCommCuDevice) go
// under comm_state(comm)->call_mu too.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "dist/nccl_common.h"

namespace smla::dist::detail {

// What every step object on one communicator shares (one per communicator in the process): the
// lock of [R1] — so a Dcp and a ShardQ step on the same communicator never call NCCL at once, nor
// one's watchdog while the other's step is inside a call — and the communicator's fate (the first
// failure, and whether it was aborted: then no step object may touch it again).
struct CommState {
  std::mutex call_mu;  // [R1]: held by every NCCL call on the communicator
  bool aborted = false;  // under call_mu
  std::atomic<bool> aborted_flag{false};
  std::mutex fail_mu;
  std::string why;  // under fail_mu: the first failure
  std::atomic<bool> failed{false};
};

// The CommState of `comm`, shared while any step object on it lives. An entry of an aborted
// communicator belongs to a dead handle: a live communicator at the same address (NCCL may reuse
// the memory) gets a fresh state.
inline std::shared_ptr<CommState> comm_state(const void* comm) {
  static std::mutex mu;
  static std::map<const void*, std::weak_ptr<CommState>> states;
  std::lock_guard<std::mutex> g(mu);
  for (auto it = states.begin(); it != states.end();) it = it->second.expired() ? states.erase(it) : std::next(it);
  auto& w = states[comm];
  auto st = w.lock();
  if (!st || st->aborted_flag.load(std::memory_order_acquire)) {
    st = std::make_shared<CommState>();
    w = st;
  }
  return st;
}

struct WatchdogConfig {
  const char* who = "NCCL step";  // "DCP", "ShardQ": the first word of every message
  int rank = 0;
  int timeout_ms = 10000;
  bool terminate_on_stuck_call = true;  // [R4]: a blocking NCCL call stuck past timeout_ms ends the process
  bool watch_steps = true;              // false: no thread, no events (the caller's wait() is the only guard)
};

class CommWatchdog {
 public:
  CommWatchdog(ncclComm_t comm, int device, const WatchdogConfig& cfg)
      : comm_(comm), device_(device), cfg_(cfg), timeout_ns_(int64_t(cfg.timeout_ms) * 1000000),
        st_(comm_state(comm)) {
    forget_aborted(comm_);
    if (!cfg_.watch_steps) return;
    DeviceScope on(device_);
    for (auto& s : slots_) check_cuda(cudaEventCreateWithFlags(&s.ev, cudaEventDisableTiming), "cudaEventCreate");
    // Poll often enough that a failure surfaces within ~timeout + timeout/8, and at most every 100 ms.
    period_ms_ = std::max(1, std::min(100, cfg_.timeout_ms / 8));
    thread_ = std::thread([this] { run(); });
  }
  // Joins the thread (waiting for an abort in progress) and releases the events; never calls NCCL.
  ~CommWatchdog() {
    if (thread_.joinable()) {
      {
        std::lock_guard<std::mutex> g(stop_mu_);
        stop_ = true;
      }
      stop_cv_.notify_all();
      thread_.join();
    }
    for (auto& s : slots_)
      if (s.ev) cudaEventDestroy(s.ev);
  }
  CommWatchdog(const CommWatchdog&) = delete;
  CommWatchdog& operator=(const CommWatchdog&) = delete;

  ncclComm_t comm() const { return comm_; }
  bool failed() const { return st_->failed.load(std::memory_order_acquire); }
  bool aborted() const { return st_->aborted_flag.load(std::memory_order_acquire); }

  // Throws the first failure recorded (by the watchdog, a call or wait()): one atomic load when healthy.
  void check() const {
    if (!st_->failed.load(std::memory_order_acquire)) return;
    std::lock_guard<std::mutex> g(st_->fail_mu);
    fail(st_->why);
  }

  // One NCCL call (or one ncclGroupStart ... ncclGroupEnd group) on the communicator: fn returns its
  // ncclResult_t. Under st_->call_mu [R1]; the host's time inside is visible to the watchdog [R4]; a
  // nonblocking communicator's ncclInProgress is settled here by polling [R3]; any error aborts the
  // communicator and throws.
  template <class Fn>
  void call(const char* what, Fn&& fn) {
    check();
    // The watchdog holds st_->call_mu only for an instant, or while it aborts after a failure: then throw
    // instead of waiting for the abort to finish.
    while (!st_->call_mu.try_lock()) {
      check();
      std::this_thread::yield();
    }
    std::lock_guard<std::mutex> g(st_->call_mu, std::adopt_lock);
    check();
    call_what_.store(what, std::memory_order_relaxed);
    call_since_ns_.store(now_ns(), std::memory_order_release);
    struct InCall {  // the host leaves the call however it leaves (fn may throw)
      std::atomic<int64_t>& since;
      ~InCall() { since.store(0, std::memory_order_release); }
    } in_call{call_since_ns_};
    ncclResult_t r = fn();
    if (r == ncclInProgress) {
      nonblocking_.store(true, std::memory_order_release);  // settled here, within timeout_ms [R3]
      r = settle_locked(what);
    }
    if (r != ncclSuccess) {
      record_failure(prefix() + what + ": " + ncclGetErrorString(r) + "; the communicator was aborted");
      abort_locked();
      check();
    }
  }

  // After the step's last NCCL operation on `stream`: the watchdog will abort the communicator if the
  // stream has not passed this point timeout_ms from now [R2]. Not while `stream` is being captured
  // (a graph's replays are guarded by the caller's wait()).
  void step_enqueued(cudaStream_t stream) {
    if (!cfg_.watch_steps) return;
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    check_cuda(cudaStreamIsCapturing(stream, &cs), "cudaStreamIsCapturing");
    if (cs != cudaStreamCaptureStatusNone) return;
    std::lock_guard<std::mutex> g(slot_mu_);
    // More than kSlots steps in flight: forget the oldest. NCCL runs a communicator's operations in
    // issue order, so a later step's completion implies the earlier one's; only its deadline moves.
    if (head_ - tail_ == kSlots) ++tail_;
    Slot& s = slots_[head_ % kSlots];
    check_cuda(cudaEventRecord(s.ev, stream), "cudaEventRecord");
    s.enqueued_ns = now_ns();
    ++head_;
  }

  // The caller's bounded wait: returns when `stream` is done; throws (after aborting) on an NCCL
  // asynchronous error, a watchdog failure, or when timeout_ms passes first.
  void wait(cudaStream_t stream, int timeout_ms) {
    const int64_t t0 = now_ns();
    for (;;) {
      check();
      // NCCL's asynchronous error first [R2] (a stream that ran to its end after an error is no
      // success); busy means the watchdog is checking or aborting: look again next round [R1].
      if (st_->call_mu.try_lock()) {
        std::lock_guard<std::mutex> g(st_->call_mu, std::adopt_lock);
        ncclResult_t e = ncclSuccess;
        if (!st_->aborted && ncclCommGetAsyncError(comm_, &e) != ncclSuccess) e = ncclSystemError;
        if (e != ncclSuccess && e != ncclInProgress) {
          record_failure(prefix() + "NCCL reported " + ncclGetErrorString(e) + "; the communicator was aborted");
          abort_locked();
        }
      }
      check();
      const cudaError_t q = cudaStreamQuery(stream);
      if (q == cudaSuccess) return;
      if (q != cudaErrorNotReady) check_cuda(q, (std::string(cfg_.who) + " step").c_str());
      if (now_ns() - t0 > int64_t(timeout_ms) * 1000000) {
        record_failure(prefix() + "the step did not finish within " + std::to_string(timeout_ms) +
                       " ms (a peer stopped taking part?); the communicator was aborted");
        // Abort here once no call holds the communicator; the watchdog may be doing it already.
        while (!st_->aborted_flag.load(std::memory_order_acquire)) {
          if (st_->call_mu.try_lock()) {
            std::lock_guard<std::mutex> g(st_->call_mu, std::adopt_lock);
            abort_locked();
          } else {
            std::this_thread::yield();
          }
        }
        check();
      }
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }

 private:
  static constexpr int kSlots = 16;
  struct Slot {
    cudaEvent_t ev = nullptr;
    int64_t enqueued_ns = 0;
  };

  static int64_t now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
  std::string prefix() const { return std::string(cfg_.who) + ": rank " + std::to_string(cfg_.rank) + ": "; }

  void record_failure(const std::string& why) {
    std::lock_guard<std::mutex> g(st_->fail_mu);
    if (st_->failed.load(std::memory_order_relaxed)) return;  // the first failure is the one reported
    st_->why = why;
    st_->failed.store(true, std::memory_order_release);
  }

  // st_->call_mu held. Once. Marked and registered before the call: the handle is dead from here on
  // (destroy_comm must not free it again), and ncclCommAbort may take a while (it waits for the
  // device to let go of the communicator's memory).
  void abort_locked() {
    if (st_->aborted) return;
    st_->aborted = true;
    st_->aborted_flag.store(true, std::memory_order_release);
    note_aborted(comm_);
    ncclCommAbort(comm_);
  }

  // st_->call_mu held, after a call returned ncclInProgress [R3]: poll until settled, at most timeout_ms.
  ncclResult_t settle_locked(const char* what) {
    const int64_t t0 = now_ns();
    ncclResult_t r = ncclInProgress;
    while (r == ncclInProgress) {
      const int64_t waited = now_ns() - t0;
      if (waited > timeout_ns_) {
        record_failure(prefix() + what + " was not enqueued within " + std::to_string(cfg_.timeout_ms) +
                       " ms (a peer stopped taking part?); the communicator was aborted");
        abort_locked();
        check();
      }
      // Spin for the first 20 ms (an enqueue normally settles in tens of microseconds and a sleep
      // would leave the GPU idle), then poll gently.
      if (waited > 20000000) std::this_thread::sleep_for(std::chrono::microseconds(100));
      if (ncclCommGetAsyncError(comm_, &r) != ncclSuccess) r = ncclSystemError;
    }
    return r;
  }

  void run() {
    cudaSetDevice(device_);  // this thread's current device, for the event queries
    // [R5] A cudaEventQuery from this thread while another thread captures a graph in the global
    // mode would invalidate that capture; in the thread-local mode this thread's calls do not
    // interact with other threads' captures (CUDA runtime, cudaStreamCaptureMode; PyTorch's
    // ProcessGroupNCCL watchdog does the same, pytorch#148594).
    cudaStreamCaptureMode mode = cudaStreamCaptureModeThreadLocal;
    cudaThreadExchangeStreamCaptureMode(&mode);
    std::unique_lock<std::mutex> lk(stop_mu_);
    while (!stop_) {
      stop_cv_.wait_for(lk, std::chrono::milliseconds(period_ms_));
      if (stop_) break;
      lk.unlock();
      tick();
      lk.lock();
    }
  }

  // [R4] a host thread inside a blocking NCCL call for longer than the timeout.
  void check_stuck_call() {
    const int64_t since = call_since_ns_.load(std::memory_order_acquire);
    if (!since || nonblocking_.load(std::memory_order_acquire) || now_ns() - since <= timeout_ns_) return;
    if (since == warned_call_) return;
    warned_call_ = since;
    const std::string msg = prefix() + call_what_.load(std::memory_order_relaxed) + " has not returned within " +
                            std::to_string(cfg_.timeout_ms) +
                            " ms (a peer stopped taking part?). NCCL allows no abort of a blocking communicator "
                            "while another thread is inside a call on it, so ";
    if (cfg_.terminate_on_stuck_call) {
      std::fprintf(stderr, "%sthe process is terminated. A nonblocking communicator (make_comm(..., nonblocking = "
                           "true)) turns this into an exception.\n", msg.c_str());
      std::fflush(stderr);
      std::abort();
    }
    std::fprintf(stderr, "%sthe call is left to NCCL's own timeouts (terminate_on_stuck_call is off).\n", msg.c_str());
    std::fflush(stderr);
  }

  void tick() {
    if (st_->aborted_flag.load(std::memory_order_acquire)) return;  // nothing left to watch
    check_stuck_call();
    std::string why;
    {
      std::lock_guard<std::mutex> g(slot_mu_);
      while (tail_ < head_) {
        const Slot& s = slots_[tail_ % kSlots];
        const cudaError_t q = cudaEventQuery(s.ev);
        if (q == cudaErrorNotReady) {
          const int64_t waited = now_ns() - s.enqueued_ns;
          if (waited > timeout_ns_)
            why = prefix() + "a step enqueued " + std::to_string(waited / 1000000) + " ms ago did not finish within " +
                  std::to_string(cfg_.timeout_ms) + " ms (a peer stopped taking part?); the communicator was aborted";
          break;
        }
        ++tail_;  // done (a CUDA error is the caller's to see on its own stream)
      }
    }
    if (why.empty() && st_->call_mu.try_lock()) {  // [R1], [R2]: off the step's path
      std::lock_guard<std::mutex> g(st_->call_mu, std::adopt_lock);
      ncclResult_t e = ncclSuccess;
      if (!st_->aborted && ncclCommGetAsyncError(comm_, &e) == ncclSuccess && e != ncclSuccess && e != ncclInProgress)
        why = prefix() + "NCCL reported " + ncclGetErrorString(e) + "; the communicator was aborted";
    }
    if (why.empty()) return;
    record_failure(why);
    // Abort as soon as no host call holds the communicator [R1]; a call stuck meanwhile is [R4].
    for (;;) {
      if (st_->call_mu.try_lock()) {
        std::lock_guard<std::mutex> g(st_->call_mu, std::adopt_lock);
        abort_locked();
        return;
      }
      check_stuck_call();
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }

  const ncclComm_t comm_;
  const int device_;
  const WatchdogConfig cfg_;
  const int64_t timeout_ns_;
  const std::shared_ptr<CommState> st_;
  int period_ms_ = 100;

  std::atomic<int64_t> call_since_ns_{0};  // steady clock ns when the current host call began; 0: none
  std::atomic<const char*> call_what_{""};
  std::atomic<bool> nonblocking_{false};  // a call returned ncclInProgress [R3]
  int64_t warned_call_ = 0;  // watchdog thread only

  std::mutex slot_mu_;
  Slot slots_[kSlots];
  uint64_t head_ = 0, tail_ = 0;  // pending steps: [tail_, head_), under slot_mu_

  std::mutex stop_mu_;
  std::condition_variable stop_cv_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace smla::dist::detail
