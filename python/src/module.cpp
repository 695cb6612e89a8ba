// python/src/module.cpp — the nanobind extension smla._smla.
//
// Thin glue over the public C++ API: arrays arrive through DLPack (zero-copy), are checked once
// (tensors.h) and turned into the plain params structs; smla::Plan (attention.cpp) and the API's
// serving functions (serving.cpp) decide what runs where, size the workspace and validate. Nothing
// here allocates device memory: where a convenience path needs a workspace, the Python layer
// passes an `alloc(nbytes)` callable that returns an array from the caller's framework.
// smla::Error becomes smla.SmlaError (a ValueError); Kind::kUnsupported becomes
// smla.UnsupportedError (a subclass).
#include <nanobind/stl/string.h>

#include "bindings.h"
#include "smla/formats.h"
#if SMLA_HAVE_CUDA
#include <cuda_runtime.h>

#include "smla/cuda.h"
#endif

namespace smla::py {
namespace {

PyObject* g_error = nullptr;        // smla.SmlaError(ValueError)
PyObject* g_unsupported = nullptr;  // smla.UnsupportedError(SmlaError)

[[maybe_unused]] nb::dict device_info_dict(const DeviceInfo& d) {
  nb::dict r;
  r["ordinal"] = d.ordinal;
  r["name"] = d.name;
  r["compute_capability"] = nb::make_tuple(d.cc_major, d.cc_minor);
  r["num_sms"] = d.num_sms;
  r["smem_per_block_optin"] = d.smem_per_block_optin;
  return r;
}

}  // namespace

DeviceGuard::DeviceGuard(const Device& d) {
#if SMLA_HAVE_CUDA
  if (!d.cuda) return;
  int cur = 0;
  SMLA_CHECK(cudaGetDevice(&cur) == cudaSuccess, "cannot query the current CUDA device");
  if (cur != d.id) {
    SMLA_CHECK(cudaSetDevice(d.id) == cudaSuccess, "cannot switch to CUDA device " + s(d.id));
    prev_ = cur;
  }
#else
  (void)d;
#endif
}

DeviceGuard::~DeviceGuard() {
#if SMLA_HAVE_CUDA
  if (prev_ >= 0) cudaSetDevice(prev_);
#endif
}

LseMode parse_lse_base(const OptStr& base) {
  if (!base) return LseMode::kOff;
  if (*base == "e") return LseMode::kBaseE;
  if (*base == "2") return LseMode::kBase2;
  fail("lse_base must be \"e\" or \"2\" (or None for no LSE); got \"" + *base + "\"");
}

ScorePrecision parse_score(const std::string& name) {
  if (name == "bf16") return ScorePrecision::kBF16;
  if (name == "fp8") return ScorePrecision::kFP8;
  if (name == "auto") return ScorePrecision::kAuto;
  fail("score_precision must be \"auto\", \"bf16\" or \"fp8\" (fp8: an e4m3 q with an fp8 cache); got \"" + name +
       "\"");
}

std::optional<DType> parse_hint(const OptStr& name) {
  if (!name) return std::nullopt;
  return parse_dtype(*name);
}

}  // namespace smla::py

namespace smla::py {
void register_tiered(nb::module_& m);  // python/src/tiered.cpp: smla.TieredCache
}  // namespace smla::py

NB_MODULE(_smla, m) {
  using namespace smla;
  using namespace smla::py;
  using namespace nb::literals;
  m.doc() = "smla: sparse MLA attention (C++ core). Use the `smla` package, not this module.";

  g_error = PyErr_NewExceptionWithDoc("smla.SmlaError",
                                      "An smla call was refused or failed; the message names the argument and the fix.",
                                      PyExc_ValueError, nullptr);
  g_unsupported = PyErr_NewExceptionWithDoc(
      "smla.UnsupportedError", "No backend here supports the request; the message says what to use instead.",
      g_error, nullptr);
  m.attr("SmlaError") = nb::borrow(g_error);
  m.attr("UnsupportedError") = nb::borrow(g_unsupported);
  nb::register_exception_translator([](const std::exception_ptr& ep, void*) {
    try {
      std::rethrow_exception(ep);
    } catch (const Error& e) {
      PyErr_SetString(e.kind() == Error::Kind::kUnsupported ? g_unsupported : g_error, e.what());
    }
  });

  m.attr("LATENT_DIM") = kLatentDim;
  m.attr("ROPE_DIM") = kRopeDim;
  m.def("built_with_cuda", &built_with_cuda);
  m.def("cuda_device_count", []() -> int {
#if SMLA_HAVE_CUDA
    return cuda::device_count();
#else
    return 0;
#endif
  });
  m.def("cuda_device_info", [](int ordinal) -> nb::dict {
#if SMLA_HAVE_CUDA
    return device_info_dict(cuda::device_info(ordinal));
#else
    (void)ordinal;
    fail_unsupported("this build of smla has no CUDA backend");
#endif
  }, "ordinal"_a = 0);
  m.def("row_bytes", [](const std::string& format, int rope_dim) { return row_bytes(parse_kv_format(format), rope_dim); },
        "format"_a, "rope_dim"_a = kRopeDim);

  def_attention(m);
  def_serving(m);
  def_host(m);
  register_tiered(m);
}
