// smla/support.h — what each backend supports, answered as OK or one sentence that names what
// is unsupported and what to use instead (the seed's supports_combination is the model).
#pragma once

#include <string>

#include "smla/types.h"

namespace smla {

// The per-geometry facts a plan is made for.
struct Geometry {
  int num_heads = 128;
  int rope_dim = kRopeDim;  // 64 (D = 576) or 0 (D = 512)
  KvFormat format = KvFormat::kBF16;
  DType q_dtype = DType::kBF16;
  int topk = 2048;          // capacity K
  LseMode lse_mode = LseMode::kBaseE;
  bool sink = false;
};

struct DeviceInfo {
  int ordinal = -1;
  int cc_major = 0, cc_minor = 0;
  int num_sms = 0;
  size_t smem_per_block_optin = 0;
  std::string name;
  bool present() const { return cc_major > 0; }
};

struct Support {
  std::string reason;  // empty: supported
  bool ok() const { return reason.empty(); }
};

// Shared geometry rules (heads, D, dtypes, format pairing).
Support support_common(const Geometry& g);
// The CPU reference backend: everything support_common accepts.
Support support_cpu(const Geometry& g);
// The CUDA backend on `dev`, given whether this build contains the CUDA kernels.
Support support_cuda(const Geometry& g, const DeviceInfo& dev, bool built_with_cuda);
// Name of the CUDA kernel that would run g (for `smla info`), or "" when none.
std::string cuda_kernel_name(const Geometry& g);

}  // namespace smla
