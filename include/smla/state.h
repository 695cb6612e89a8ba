// smla/state.h — the attention state (partial output + LSE) and its merge rule (DESIGN.md §5).
//
// One merge definition for every place partial results meet: split-K inside a kernel, the CPU
// DCP simulation and the NCCL merge. LSEs are natural-log. Edge rules: a NaN or +inf LSE counts
// as -inf (an empty or broken part contributes nothing); if every part is -inf the merged LSE is
// -inf and every weight is 0, so the merged output is exactly 0.
#pragma once

#include <cmath>

#include "smla/numeric.h"  // SMLA_HD

namespace smla {

// Sanitizes one partial LSE: NaN and +inf become -inf.
SMLA_HD float lse_sanitize(float l) { return (l != l || l == INFINITY) ? -INFINITY : l; }

// Merges n partial LSEs. Writes each part's weight exp(l_i - L) (0 when not finite) to
// weights[0..n) and returns L = m + log(sum_i exp(l_i - m)), m = max l_i (0 if all -inf).
// Example: l = {0, 0} -> L = log 2, weights {0.5, 0.5}; l = {-inf, 3} -> L = 3, weights {0, 1}.
SMLA_HD float lse_merge(const float* lse, int n, float* weights) {
  float m = -INFINITY;
  for (int i = 0; i < n; ++i) m = fmaxf(m, lse_sanitize(lse[i]));
  if (m == -INFINITY) m = 0.0f;
  float sum = 0.0f;
  for (int i = 0; i < n; ++i) sum += expf(lse_sanitize(lse[i]) - m);
  const float total = m + logf(sum);  // log(0) = -inf when every part is empty
  for (int i = 0; i < n; ++i) {
    // exp(l_i - L) computed as exp(l_i - m) / sum: L rounded to fp32 would cost ~|L| * 2^-24 of
    // relative weight accuracy. sum = 0 (all empty) gives NaN, zeroed below.
    const float w = expf(lse_sanitize(lse[i]) - m) / sum;
    weights[i] = (w == w && w != INFINITY) ? w : 0.0f;
  }
  return total;
}

}  // namespace smla
