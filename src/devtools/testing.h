// devtools/testing.h — random problems for tests, `smla check` and `smla bench` (host memory).
// Developer tools: linked by the tools and tests, never by the public libraries.
//
// Rows that no entry selects are filled with NaN bytes of the format (when poison_unselected),
// so a kernel that reads a row it should skip produces NaN; outputs start poisoned (NaN).
#pragma once

#include <cstdint>
#include <vector>

#include "smla/params.h"

namespace smla::testing {

struct ProblemSpec {
  int64_t num_tokens = 4;
  int num_heads = 16;
  int topk = 64;
  int rope_dim = kRopeDim;
  KvFormat format = KvFormat::kBF16;
  DType q_dtype = DType::kBF16;
  int64_t num_rows = 1024;        // pool size
  double invalid_fraction = 0.1;  // share of entries set to -1, other negatives or >= num_rows
  bool use_counts = false;        // random counts in [0, K]
  bool all_invalid_row = false;   // make row 0 all -1
  bool duplicates = true;         // allow repeated rows within a row
  bool sink = false;
  bool q_pair = false;            // q as (latent, rope) pair
  LseMode lse_mode = LseMode::kBaseE;
  DType out_dtype = DType::kBF16;
  bool poison_unselected = true;
  float softmax_scale = 0.1352338f;  // DeepSeek-V3.2: 192^-0.5 * mscale^2
  float q_scale = 1.0f;
  float k_scale = 1.0f;
  int64_t q_head_pad = 0;  // extra elements between heads (free strides)
  int64_t out_head_pad = 0;
};

struct HostProblem {
  ProblemSpec spec;
  std::vector<uint8_t> q, q_rope, kv;
  std::vector<int32_t> idx, counts;
  std::vector<float> sink, lse;
  std::vector<uint8_t> out;  // out_dtype elements
  SparseMlaParams params;    // points into the vectors above (re-made by bind())
  void bind();               // (re)points params at this object's buffers
  size_t kv_bytes() const { return kv.size(); }
};

HostProblem make_problem(const ProblemSpec& spec, uint64_t seed);

// Relative L2 error of a [T,H,512] output against reference doubles, and the max abs LSE
// difference (matching -inf counts as 0; -inf against finite counts as inf).
struct Diff {
  double rel_l2 = 0;
  double lse_max_abs = 0;
  int64_t nonfinite = 0;  // NaN/inf in out
};
Diff compare(const HostProblem& got, const std::vector<double>& ref_out, const std::vector<double>& ref_lse);

// The reference in double for every (t, h): ref_out [T*H*512], ref_lse [T*H] (natural or base 2
// following spec.lse_mode).
void reference_double(const HostProblem& p, std::vector<double>& ref_out, std::vector<double>& ref_lse);

// Element of an output buffer as float (bf16 / fp16 / f32).
float out_value(const HostProblem& p, int64_t t, int h, int d);

}  // namespace smla::testing
