// A deterministic decode problem for the DCP tests: requests of different lengths, a global
// top-k of request-local positions (with padding, out-of-table entries, a row whose entries all
// live on rank 0 when interleave > 1, and an all-empty row), and the float64-free CPU reference
// on the unsharded, logically ordered cache.
#pragma once

#include <cmath>
#include <random>
#include <vector>

#include "reference/sparse_mla.h"
#include "smla/formats.h"
#include "smla/numeric.h"

namespace smla::test {

struct DcpCase {
  KvFormat format = KvFormat::kBF16;
  int row_bytes = 0;
  std::vector<std::vector<uint8_t>> req_rows;  // per request, [len][row_bytes]
  std::vector<int64_t> req_offset;             // first flat row of each request
  std::vector<uint8_t> flat;                   // all requests' rows back to back
  std::vector<uint16_t> q;                     // [T, H, 576] bf16/fp16 bits
  std::vector<int32_t> positions, req_of_token;
  int64_t T = 6;
  int H = 4, K = 200;
  float softmax_scale = 0.1352338f;
};

inline DcpCase make_dcp_case(uint64_t seed, int interleave, KvFormat format, int heads, int64_t T = 6, int K = 200) {
  DcpCase c;
  c.format = format, c.H = heads, c.T = T, c.K = K;
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal;
  c.row_bytes = row_bytes(format, 64);
  const std::vector<int64_t> lens = {1300, 700, 90};
  std::vector<float> latent(512), rope(64);
  for (int64_t len : lens) {
    c.req_offset.push_back(int64_t(c.flat.size()) / c.row_bytes);
    std::vector<uint8_t> rows(size_t(len * c.row_bytes));
    for (int64_t i = 0; i < len; ++i) {
      for (auto& v : latent) v = normal(rng);
      for (auto& v : rope) v = normal(rng);
      encode_row(format, 64, latent.data(), rope.data(), 1.0f, rows.data() + i * c.row_bytes);
    }
    c.flat.insert(c.flat.end(), rows.begin(), rows.end());
    c.req_rows.push_back(std::move(rows));
  }
  const bool fp16 = format == KvFormat::kFP16;
  c.q.resize(size_t(c.T * c.H * 576));
  for (auto& v : c.q) v = fp16 ? num::f32_to_fp16(normal(rng)) : num::f32_to_bf16(normal(rng));
  c.positions.assign(size_t(c.T * c.K), -1);
  c.req_of_token.resize(size_t(c.T));
  for (int64_t t = 0; t < c.T; ++t) {
    const int req = int(t % 3);
    c.req_of_token[size_t(t)] = req;
    for (int j = 0; j < c.K; ++j) {
      int32_t pos = int32_t(rng() % uint64_t(lens[size_t(req)]));
      if (t == 1) pos = int32_t(rng() % uint64_t(interleave));  // every entry on rank 0
      if (j % 17 == 5) pos = -1;                                  // padding
      if (j % 29 == 7) pos = 1 << 24;                             // past every block table
      c.positions[size_t(t * c.K + j)] = pos;
    }
  }
  if (c.T > 5)
    for (int j = 0; j < c.K; ++j) c.positions[size_t(5 * c.K + j)] = -1;  // an all-empty row
  return c;
}

// Params of the case's q with every other field left for the caller.
inline SparseMlaParams dcp_case_params(const DcpCase& c) {
  SparseMlaParams p;
  p.num_tokens = c.T, p.num_heads = c.H, p.topk = c.K, p.rope_dim = 64;
  p.q = c.q.data(), p.format = c.format;
  p.q_dtype = c.format == KvFormat::kFP16 ? DType::kFP16 : DType::kBF16;
  p.softmax_scale = c.softmax_scale;
  set_dense_strides(p);
  return p;
}

// The reference on the unsharded logical cache: out [T,H,512] fp32 and natural-log lse [T,H].
inline void dcp_case_reference(const DcpCase& c, std::vector<float>& out, std::vector<float>& lse) {
  std::vector<int32_t> idx(c.positions.size());
  for (int64_t t = 0; t < c.T; ++t)
    for (int j = 0; j < c.K; ++j) {
      const int32_t pos = c.positions[size_t(t * c.K + j)];
      const int req = c.req_of_token[size_t(t)];
      const int64_t len = int64_t(c.req_rows[size_t(req)].size()) / c.row_bytes;
      idx[size_t(t * c.K + j)] = (pos >= 0 && pos < len) ? int32_t(c.req_offset[size_t(req)] + pos) : -1;
    }
  SparseMlaParams p = dcp_case_params(c);
  p.kv = c.flat.data(), p.num_rows = int64_t(c.flat.size()) / c.row_bytes, p.kv_row_stride_bytes = c.row_bytes;
  p.idx = idx.data();
  out.assign(size_t(c.T * c.H * 512), 0.0f);
  lse.assign(size_t(c.T * c.H), 0.0f);
  p.out = out.data(), p.out_dtype = DType::kFP32, p.lse = lse.data(), p.lse_mode = LseMode::kBaseE;
  reference::sparse_mla(p);
}

}  // namespace smla::test
