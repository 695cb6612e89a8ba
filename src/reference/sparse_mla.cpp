// The CPU sparse MLA: DESIGN.md §1 as straight loops. Read this as the spec.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <exception>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "reference/sparse_mla.h"
#include "smla/formats.h"
#include "smla/numeric.h"

namespace smla::reference {
namespace {

float load_elem(const void* base, DType t, int64_t i) {
  switch (t) {
    case DType::kBF16: return num::bf16_to_f32(static_cast<const uint16_t*>(base)[i]);
    case DType::kFP16: return num::fp16_to_f32(static_cast<const uint16_t*>(base)[i]);
    case DType::kE4M3: return num::e4m3_to_f32(static_cast<const uint8_t*>(base)[i]);
    case DType::kFP32: return static_cast<const float*>(base)[i];
    default: fail("unsupported q dtype");
  }
}

// q[t, h, 0:D] as fp32 (q_scale not applied).
void load_q(const SparseMlaParams& p, int64_t t, int h, float* q) {
  if (p.q_rope == nullptr) {
    const int64_t off = t * p.q_stride_t + h * p.q_stride_h;
    for (int d = 0; d < p.head_dim(); ++d) q[d] = load_elem(p.q, p.q_dtype, off + d);
    return;
  }
  const int64_t off = t * p.q_stride_t + h * p.q_stride_h;
  for (int d = 0; d < kLatentDim; ++d) q[d] = load_elem(p.q, p.q_dtype, off + d);
  const int64_t roff = t * p.q_rope_stride_t + h * p.q_rope_stride_h;
  for (int d = 0; d < p.rope_dim; ++d) q[kLatentDim + d] = load_elem(p.q_rope, p.q_dtype, roff + d);
}

// Active length of row t: counts[t] clamped to [0, K], or K.
int active_len(const SparseMlaParams& p, int64_t t) {
  if (p.counts == nullptr) return p.topk;
  return std::clamp<int>(p.counts[t], 0, p.topk);
}

bool is_valid(const SparseMlaParams& p, int64_t r) { return r >= 0 && r < p.num_rows; }

// Decodes the valid selected rows of token t (duplicates kept), [m][D] fp32. The buffer is sized
// by the m valid entries, not the capacity K: a row of K = 4M entries, all -1, needs nothing.
int gather_rows(const SparseMlaParams& p, int64_t t, std::vector<float>& rows) {
  const int D = p.head_dim();
  const int n = active_len(p, t);
  const int rb = row_bytes(p.format, p.rope_dim);
  int64_t valid = 0;
  for (int j = 0; j < n; ++j) valid += is_valid(p, p.idx[t * p.idx_stride_t + j]);
  try {
    rows.resize(size_t(valid) * D);
  } catch (const std::bad_alloc&) {
    fail("the CPU reference cannot allocate " + std::to_string(double(valid) * D * 4 / 1e9) + " GB for the " +
         std::to_string(valid) + " valid entries of row " + std::to_string(t) +
         "; use the CUDA backend or fewer valid entries per row");
  }
  int m = 0;
  std::vector<uint8_t> row(static_cast<size_t>(rb));
  for (int j = 0; j < n; ++j) {
    const int64_t r = p.idx[t * p.idx_stride_t + j];
    if (!is_valid(p, r)) continue;  // invalid: skipped, never dereferenced
    const auto* src = static_cast<const uint8_t*>(p.kv) + r * p.kv_row_stride_bytes;
    std::memcpy(row.data(), src, size_t(rb));
    decode_row(p.format, p.rope_dim, row.data(), p.k_scale, rows.data() + size_t(m) * D);
    ++m;
  }
  return m;
}

// Softmax-weighted sum over m decoded rows for one head: out512 and the natural-log LSE.
void attend(const SparseMlaParams& p, const float* q, const float* rows, int m, int h, double* out512,
            double* lse_e) {
  const int D = p.head_dim();
  std::fill(out512, out512 + kLatentDim, 0.0);
  if (m == 0) {
    *lse_e = -INFINITY;
    return;
  }
  const double scale = double(p.softmax_scale) * double(p.q_scale);
  std::vector<double> s(static_cast<size_t>(m));
  double mx = -INFINITY;
  for (int j = 0; j < m; ++j) {
    double dot = 0.0;
    for (int d = 0; d < D; ++d) dot += double(q[d]) * double(rows[size_t(j) * D + d]);
    s[j] = scale * dot;
    mx = std::max(mx, s[j]);
  }
  double sum = 0.0;
  for (int j = 0; j < m; ++j) {
    s[j] = std::exp(s[j] - mx);
    sum += s[j];
  }
  const double denom = sum + (p.sink ? std::exp(double(p.sink[h]) - mx) : 0.0);
  for (int j = 0; j < m; ++j) {
    const double w = s[j] / denom;
    for (int d = 0; d < kLatentDim; ++d) out512[d] += w * double(rows[size_t(j) * D + d]);
  }
  *lse_e = mx + std::log(sum);
}

void store(const SparseMlaParams& p, int64_t t, int h, const double* out512, double lse_e) {
  const int64_t off = t * p.out_stride_t + h * p.out_stride_h;
  for (int d = 0; d < kLatentDim; ++d) {
    const float v = float(out512[d]);
    switch (p.out_dtype) {
      case DType::kBF16: static_cast<uint16_t*>(p.out)[off + d] = num::f32_to_bf16(v); break;
      case DType::kFP16: static_cast<uint16_t*>(p.out)[off + d] = num::f32_to_fp16(v); break;
      case DType::kFP32: static_cast<float*>(p.out)[off + d] = v; break;
      default: fail("unsupported out dtype");
    }
  }
  if (p.lse != nullptr && p.lse_mode != LseMode::kOff) {
    const double l = p.lse_mode == LseMode::kBase2 ? lse_e * M_LOG2E : lse_e;
    p.lse[t * p.lse_stride_t + h] = float(l);
  }
}

void run_rows(const SparseMlaParams& p, int64_t t0, int64_t t1) {
  std::vector<float> rows, q(size_t(p.head_dim()));
  std::vector<double> out(kLatentDim);
  for (int64_t t = t0; t < t1; ++t) {
    const int m = gather_rows(p, t, rows);
    for (int h = 0; h < p.num_heads; ++h) {
      load_q(p, t, h, q.data());
      double lse_e;
      attend(p, q.data(), rows.data(), m, h, out.data(), &lse_e);
      store(p, t, h, out.data(), lse_e);
    }
  }
}

// Errors pass unchanged; anything else (bad_alloc, ...) becomes one Error line.
[[noreturn]] void rethrow_as_error(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const Error&) {
    throw;
  } catch (const std::bad_alloc&) {
    throw Error("the CPU reference ran out of memory; use the CUDA backend or a smaller problem",
                Error::Kind::kInternal);
  } catch (const std::exception& x) {
    throw Error(std::string("the CPU reference failed: ") + x.what(), Error::Kind::kInternal);
  }
}

}  // namespace

int sparse_mla_row_head(const SparseMlaParams& p, int64_t t, int h, double* out512, double* lse_e) {
  std::vector<float> rows, q(size_t(p.head_dim()));
  const int m = gather_rows(p, t, rows);
  load_q(p, t, h, q.data());
  attend(p, q.data(), rows.data(), m, h, out512, lse_e);
  return m;
}

void sparse_mla(const SparseMlaParams& p, int num_threads) {
  validate(p);
  check_host_sink(p);
  SMLA_CHECK(p.out_dtype == DType::kBF16 || p.out_dtype == DType::kFP16 || p.out_dtype == DType::kFP32,
             "out dtype must be bf16, fp16 or f32 on the CPU backend");
  if (p.num_tokens == 0) return;
  int n = num_threads > 0 ? num_threads : int(std::max(1u, std::thread::hardware_concurrency()));
  n = int(std::min<int64_t>(n, p.num_tokens));
  if (n == 1) {
    try {
      run_rows(p, 0, p.num_tokens);
    } catch (...) {
      rethrow_as_error(std::current_exception());
    }
    return;
  }
  // An exception in a worker (an Error, or bad_alloc) is carried to the caller, never std::terminate.
  std::vector<std::thread> pool;
  std::vector<std::exception_ptr> errors(static_cast<size_t>(n));
  const int64_t chunk = (p.num_tokens + n - 1) / n;
  try {
    for (int i = 0; i < n; ++i) {
      const int64_t t0 = i * chunk, t1 = std::min(p.num_tokens, t0 + chunk);
      if (t0 < t1)
        pool.emplace_back([&p, &errors, i, t0, t1] {
          try {
            run_rows(p, t0, t1);
          } catch (...) {
            errors[size_t(i)] = std::current_exception();
          }
        });
    }
  } catch (...) {  // a thread that could not start: finish the started ones, then report
    for (auto& th : pool) th.join();
    rethrow_as_error(std::current_exception());
  }
  for (auto& th : pool) th.join();
  for (const auto& e : errors)
    if (e) rethrow_as_error(e);
}

}  // namespace smla::reference
