// smla/engine.h — plan / run, the serving surface (DESIGN.md §4).
//
// A Plan is made once per geometry at startup. It fixes the schedule of every row-count bucket
// (powers of two up to max_rows, plus the engine's CUDA-graph sizes) and states the workspace the
// caller must own. run() checks the call against the plan (a geometry that was not planned fails
// with a clear error, also during graph capture), never allocates device memory, never
// synchronizes and never reads device memory on the host. A Plan is immutable after construction,
// so one plan may be shared by all layers and called from many threads at once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "smla/api.h"
#include "smla/params.h"
#include "smla/support.h"

namespace smla {

struct PlanConfig {
  Geometry geometry;                  // heads, rope_dim, format, q dtype, capacity (topk), LSE, sink
  int64_t max_rows = 1;               // largest T of any run
  std::vector<int64_t> graph_sizes;   // the engine's CUDA-graph batch sizes (extra buckets)
  bool batch_invariant = false;       // a row's output independent of the batch around it
  Backend backend = Backend::kCuda;
  int device = 0;                     // CUDA device the plan is made for (its SM count sets the splits);
                                      // run() launches on the current device, which must be this one
};

// The schedule of one row-count bucket.
struct Schedule {
  int64_t bucket = 0;  // runs with T <= bucket (and > the previous bucket) use this schedule
  int num_splits = 1;  // pieces of each row's top-k, merged by LSE
};

class Plan {
 public:
  explicit Plan(const PlanConfig& cfg);  // throws Error with the support reason

  const PlanConfig& config() const { return cfg_; }
  const std::vector<Schedule>& schedules() const { return schedules_; }
  size_t workspace_bytes() const { return workspace_bytes_; }
  // The schedule a run of T rows uses: the smallest bucket >= T.
  const Schedule& schedule_for(int64_t num_tokens) const;

  // Runs p (device pointers for the CUDA backend, host pointers for the CPU backend) on `stream`
  // (a cudaStream_t; ignored by the CPU backend). Throws Error before any launch when p is outside
  // the plan or the workspace is too small.
  void run(const SparseMlaParams& p, void* workspace, size_t workspace_bytes, void* stream = nullptr) const;

  // Checks p against the plan without running it.
  void check(const SparseMlaParams& p, size_t workspace_bytes) const;

 private:
  PlanConfig cfg_;
  int num_sms_ = 0;
  std::vector<Schedule> schedules_;
  size_t workspace_bytes_ = 0;
};

}  // namespace smla
