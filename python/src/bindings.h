// python/src/bindings.h — what the extension's source files share: the argument types, the
// backend of a device, and one registration function per topic (module.cpp calls them).
//
//   attention.cpp  sparse_mla (one call) and Plan: both through smla::Plan
//   serving.cpp    write_cache, convert_indices, finish_empty_rows: through smla/api.h
//   host.cpp       DCP merge, row codecs, token_to_request, replay and safetensors (host only)
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/ndarray.h>

#include <optional>
#include <string>

#include "smla/api.h"
#include "tensors.h"

namespace smla::py {

using OptIn = std::optional<In>;
using OptOut = std::optional<Out>;
using OptStr = std::optional<std::string>;

inline std::string s(int64_t v) { return std::to_string(v); }

// The backend that runs arrays on `d`: the CPU reference for host memory, CUDA otherwise.
inline Backend backend_of(const Device& d) { return d.cuda ? Backend::kCuda : Backend::kCpu; }

// Makes `d` the current CUDA device for the scope (launches go to the arrays' device, whichever
// it is); a no-op for host memory and in builds without CUDA (where CUDA arrays are refused by
// the API's backend switch).
class DeviceGuard {
 public:
  explicit DeviceGuard(const Device& d);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int prev_ = -1;
};

// "e" / "2"; None: LSE off.
LseMode parse_lse_base(const OptStr& base);
std::optional<DType> parse_hint(const OptStr& name);
// "auto" / "bf16" / "fp8" (the score_precision keyword).
ScorePrecision parse_score(const std::string& name);

void def_attention(nb::module_& m);
void def_serving(nb::module_& m);
void def_host(nb::module_& m);

}  // namespace smla::py
