// Internal helpers shared by the NCCL steps of smla_dist (DCP, ShardQ): error checks, the
// registry of aborted communicators, the polled enqueue of a nonblocking call (`settle`), the
// device scope and typed views of the caller's workspace. A step's guarded NCCL calls go through
// CommWatchdog::call (dist/nccl_watchdog.h), which settles nonblocking calls itself.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <cstdint>
#include <mutex>
#include <set>
#include <string>
#include <thread>

#include "smla/types.h"
#include "smla/workspace.h"

namespace smla::dist::detail {

inline void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) fail(std::string("NCCL step: ") + what + ": " + cudaGetErrorString(e));
}
inline void check_nccl(ncclResult_t r, const char* what) {
  if (r != ncclSuccess && r != ncclInProgress) fail(std::string("NCCL step: ") + what + ": " + ncclGetErrorString(r));
}

// Communicators that smla aborted (ncclCommAbort frees them): destroy_comm skips these, so a caller
// can clean up after an error without a double free. make_comm and the step constructors forget an
// address again when it is handed out or used anew (NCCL may reuse freed memory).
inline std::mutex& aborted_registry_mutex() {
  static std::mutex m;
  return m;
}
inline std::set<const void*>& aborted_registry() {
  static std::set<const void*> s;
  return s;
}
inline void note_aborted(const void* comm) {
  std::lock_guard<std::mutex> g(aborted_registry_mutex());
  aborted_registry().insert(comm);
}
inline void forget_aborted(const void* comm) {
  std::lock_guard<std::mutex> g(aborted_registry_mutex());
  aborted_registry().erase(comm);
}
inline bool was_aborted(const void* comm) {
  std::lock_guard<std::mutex> g(aborted_registry_mutex());
  return aborted_registry().count(comm) != 0;
}

// A nonblocking communicator answers ncclInProgress while a call is still being enqueued (e.g.
// connecting to a peer). Poll its state on the host (the stream is not synchronized) until the
// call is in place; past timeout_ms, or on an error, abort the communicator and throw. For calls
// made where no CommWatchdog exists (make_comm's init, a constructor's ncclCommCount): a step's
// calls go through CommWatchdog::call, which takes the communicator's lock, shows the watchdog
// how long the host has been inside, and settles a nonblocking answer the same way.
inline void settle(ncclComm_t comm, ncclResult_t r, const char* what, int timeout_ms) {
  const auto t0 = std::chrono::steady_clock::now();
  while (r == ncclInProgress) {
    const auto waited =
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count();
    if (waited > timeout_ms) {
      note_aborted(comm);
      ncclCommAbort(comm);
      fail(std::string("NCCL: ") + what + " was not enqueued within " + std::to_string(timeout_ms) +
           " ms (a peer stopped taking part?); the communicator was aborted");
    }
    // Spin for the first 20 ms (an enqueue normally settles in microseconds and a sleep would
    // leave the GPU idle), then poll gently.
    if (waited > 20) std::this_thread::sleep_for(std::chrono::microseconds(100));
    if (ncclCommGetAsyncError(comm, &r) != ncclSuccess) r = ncclSystemError;
  }
  if (r != ncclSuccess) {
    note_aborted(comm);
    ncclCommAbort(comm);
    fail(std::string("NCCL: ") + what + ": " + ncclGetErrorString(r) + "; the communicator was aborted");
  }
}

// A part of the caller's workspace, typed (nullptr when the part is absent).
template <class T>
T* part_of(void* workspace, const WorkspacePart& part) {
  return part.bytes ? reinterpret_cast<T*>(static_cast<uint8_t*>(workspace) + part.offset) : nullptr;
}

// Makes `device` current for a scope and restores the previous device after (only when they differ,
// so the common case costs one cudaGetDevice).
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    check_cuda(cudaGetDevice(&prev_), "cudaGetDevice");
    if (prev_ != device) check_cuda(cudaSetDevice(device), "cudaSetDevice(the communicator's device)");
    else prev_ = -1;
  }
  ~DeviceScope() {
    if (prev_ >= 0) cudaSetDevice(prev_);
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int prev_ = -1;
};

}  // namespace smla::dist::detail
