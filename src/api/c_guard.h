// Internal: the C ABI's exception -> status conversion and its per-thread last-error message, shared
// by the C functions of smla_api (src/api/c_api.cpp) and of smla_dist (src/dist/c_api_dist.cpp), so
// smla_last_error() reports either.
#pragma once

#include <exception>
#include <new>
#include <string>

#include "smla/smla.h"
#include "smla/types.h"

namespace smla::capi {

// This thread's last error message (empty after a call that succeeded).
std::string& last_error();

template <class F>
smla_status guarded(F&& f) {
  try {
    f();
    last_error().clear();
    return SMLA_OK;
  } catch (const smla::Error& e) {
    last_error() = e.what();
    switch (e.kind()) {
      case smla::Error::Kind::kUnsupported: return SMLA_ERROR_UNSUPPORTED;
      case smla::Error::Kind::kInternal: return SMLA_ERROR_INTERNAL;
      default: return SMLA_ERROR_INVALID_ARGUMENT;
    }
  } catch (const std::bad_alloc&) {
    last_error() = "out of host memory";
    return SMLA_ERROR_INTERNAL;
  } catch (const std::exception& e) {
    last_error() = e.what();
    return SMLA_ERROR_INTERNAL;
  }
}

}  // namespace smla::capi
