// Fuzz-style tests of issue #20, bounded in time (a few seconds each, thousands of cases, fixed
// seeds so a failure reproduces; the case number is printed):
//  - random strides, dtypes, sizes, indices, counts, sinks and overlapping outputs into validate()
//    and the CPU backend: never a crash, and either an Error or exactly the result of the same
//    problem laid out densely; every tensor sits in its own allocation followed by an inaccessible
//    page, so a read or write past its extent (from shape and strides) crashes the test;
//  - corrupt safetensors dumps (byte flips, truncations, duplicate keys, bad numbers) into the
//    replay loader: always a clean Error or a result, and the metadata number rule checked against
//    an independent regular expression;
//  - random argument vectors into the CLI parser: an Error or a parse, never anything else.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cfloat>
#include <chrono>
#include <cmath>
#include <cstring>
#include <iterator>
#include <memory>
#include <random>
#include <regex>
#include <string>
#include <vector>

#include "cli.h"
#include "smla/formats.h"
#include "smla/numeric.h"
#include "reference/sparse_mla.h"
#include "devtools/replay.h"
#include "devtools/safetensors.h"

namespace {

using namespace smla;

// ---- guarded buffers: `bytes` usable bytes that end exactly at an inaccessible page ----------
class Guarded {
 public:
  explicit Guarded(size_t bytes) : bytes_(bytes) {
    const size_t page = size_t(sysconf(_SC_PAGESIZE));
    const size_t used = (bytes + 15) / 16 * 16;  // 16-byte aligned start
    map_bytes_ = (used + page - 1) / page * page + page;
    void* m = mmap(nullptr, map_bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) throw std::bad_alloc();
    map_ = static_cast<uint8_t*>(m);
    mprotect(map_ + map_bytes_ - page, page, PROT_NONE);
    data_ = map_ + map_bytes_ - page - used;
  }
  ~Guarded() { munmap(map_, map_bytes_); }
  Guarded(const Guarded&) = delete;
  Guarded& operator=(const Guarded&) = delete;
  uint8_t* data() { return data_; }
  size_t size() const { return bytes_; }

 private:
  size_t bytes_, map_bytes_ = 0;
  uint8_t* map_ = nullptr;
  uint8_t* data_ = nullptr;
};

// Elements a [n0, n1, width] tensor with strides (s0, s1) spans (0 when empty).
int64_t span(int64_t n0, int64_t s0, int64_t n1, int64_t s1, int64_t width) {
  if (n0 == 0 || n1 == 0) return 0;
  return (n0 - 1) * s0 + (n1 - 1) * s1 + width;
}

uint16_t random_16bit(std::mt19937_64& rng, DType t) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const float v = normal(rng);
  return t == DType::kFP16 ? num::f32_to_fp16(v) : num::f32_to_bf16(v);
}

// The same logical problem laid out densely, run by the reference: the expected result of any
// strided layout that the backend accepts.
struct Dense {
  std::vector<uint8_t> q, q_rope, kv, out;
  std::vector<int32_t> idx, counts;
  std::vector<float> sink, lse;
  SparseMlaParams p;
};

void make_dense(const SparseMlaParams& s, Dense& d) {
  d.p = s;
  const int64_t T = s.num_tokens, H = s.num_heads;
  const int qb = dtype_bytes(s.q_dtype), ob = dtype_bytes(s.out_dtype);
  const int qw = s.q_rope ? kLatentDim : s.head_dim();
  const int rb = row_bytes(s.format, s.rope_dim);
  d.q.resize(size_t(T * H * qw * qb));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h)
      std::memcpy(d.q.data() + ((t * H + h) * qw) * qb,
                  static_cast<const uint8_t*>(s.q) + (t * s.q_stride_t + h * s.q_stride_h) * qb, size_t(qw * qb));
  if (s.q_rope) {
    d.q_rope.resize(size_t(T * H * kRopeDim * qb));
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < H; ++h)
        std::memcpy(d.q_rope.data() + ((t * H + h) * kRopeDim) * qb,
                    static_cast<const uint8_t*>(s.q_rope) + (t * s.q_rope_stride_t + h * s.q_rope_stride_h) * qb,
                    size_t(kRopeDim * qb));
  }
  d.kv.resize(size_t(s.num_rows * rb) + 1);
  for (int64_t r = 0; r < s.num_rows; ++r)
    std::memcpy(d.kv.data() + r * rb, static_cast<const uint8_t*>(s.kv) + r * s.kv_row_stride_bytes, size_t(rb));
  d.idx.resize(size_t(T * s.topk));
  for (int64_t t = 0; t < T; ++t)
    std::memcpy(d.idx.data() + t * s.topk, s.idx + t * s.idx_stride_t, size_t(s.topk) * 4);
  if (s.counts) d.counts.assign(s.counts, s.counts + T);
  if (s.sink) d.sink.assign(s.sink, s.sink + H);
  d.out.assign(size_t(T * H * kLatentDim * ob), 0xAB);
  d.lse.assign(size_t(T * H), NAN);
  d.p.q = d.q.data(), d.p.q_rope = s.q_rope ? d.q_rope.data() : nullptr, d.p.kv = s.num_rows ? d.kv.data() : nullptr;
  d.p.idx = d.idx.data(), d.p.counts = s.counts ? d.counts.data() : nullptr, d.p.sink = s.sink ? d.sink.data() : nullptr;
  d.p.out = d.out.data(), d.p.lse = s.lse ? d.lse.data() : nullptr;
  d.p.kv_row_stride_bytes = rb;
  set_dense_strides(d.p);
}

TEST(Fuzz, ValidateAndCpuBackendErrorOrDenseResult) {
  std::mt19937_64 rng(20);
  auto pick = [&](int lo, int hi) { return int(std::uniform_int_distribution<int>(lo, hi)(rng)); };
  const DType dtypes[] = {DType::kBF16, DType::kFP16, DType::kE4M3, DType::kFP32, DType::kU8, DType::kI32};
  const KvFormat formats[] = {KvFormat::kBF16, KvFormat::kFP16, KvFormat::kFP8E4M3, KvFormat::kFP8DsMla,
                              KvFormat::kNvFP4DsMla};
  int accepted = 0, refused = 0, overlaps = 0;
  const auto t0 = std::chrono::steady_clock::now();
  int n = 0;
  for (; n < 4000 && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(8); ++n) {
    SCOPED_TRACE("case " + std::to_string(n));
    SparseMlaParams p;
    p.num_tokens = pick(0, 3);
    p.num_heads = pick(0, 9) == 0 ? pick(-1, 0) : pick(1, 4);
    p.topk = pick(0, 9) == 0 ? 0 : pick(1, 9);
    p.rope_dim = pick(0, 19) == 0 ? 32 : (pick(0, 1) ? 64 : 0);
    p.format = formats[pick(0, 4)];
    const bool sane_dtypes = pick(0, 3) != 0;
    p.q_dtype = sane_dtypes ? (p.format == KvFormat::kFP16 ? DType::kFP16 : DType::kBF16) : dtypes[pick(0, 5)];
    p.out_dtype = sane_dtypes ? (pick(0, 2) == 0 ? DType::kFP32 : p.q_dtype) : dtypes[pick(0, 5)];
    p.num_rows = pick(0, 12);
    p.softmax_scale = pick(0, 19) == 0 ? (pick(0, 1) ? NAN : 3e38f) : 0.1352338f;
    p.q_scale = pick(0, 29) == 0 ? 0.0f : 1.0f;
    p.lse_mode = pick(0, 2) == 0 ? LseMode::kBase2 : LseMode::kBaseE;
    const bool pair = pick(0, 4) == 0;
    const int64_t T = p.num_tokens, H = std::max(p.num_heads, 0), K = std::max(p.topk, 0);
    const int D = kLatentDim + (p.rope_dim == 64 ? 64 : 0);
    const int qw = pair ? kLatentDim : D;
    const int qb = std::max(dtype_bytes(p.q_dtype), 1), ob = std::max(dtype_bytes(p.out_dtype), 1);
    const int rb = row_bytes(p.format, p.rope_dim == 64 ? 64 : 0);
    // Strides around the dense ones, sometimes too small.
    p.q_stride_h = qw + pick(-2, 6), p.q_stride_t = H * p.q_stride_h + pick(-3, 5);
    p.q_rope_stride_h = kRopeDim + pick(-1, 3), p.q_rope_stride_t = H * p.q_rope_stride_h + pick(-2, 3);
    p.kv_row_stride_bytes = rb + pick(-3, 40);
    p.idx_stride_t = K + pick(-2, 3);
    p.out_stride_h = kLatentDim + pick(-2, 8), p.out_stride_t = (H - 1) * p.out_stride_h + kLatentDim + pick(-3, 9);
    p.lse_stride_t = H + pick(-2, 3);
    auto sz = [](int64_t v) { return size_t(std::max<int64_t>(v, 0)); };
    // Each tensor in its own guarded allocation, sized by its extent (never less than 1 byte).
    Guarded q(sz(span(T, p.q_stride_t, H, p.q_stride_h, qw)) * qb + 1);
    Guarded qr(pair ? sz(span(T, p.q_rope_stride_t, H, p.q_rope_stride_h, kRopeDim)) * qb + 1 : 1);
    Guarded kv(p.num_rows ? sz((p.num_rows - 1) * p.kv_row_stride_bytes + rb) + 1 : 1);
    Guarded idx(sz(span(T, p.idx_stride_t, 1, 0, K)) * 4 + 4);
    Guarded counts(sz(T) * 4 + 4), sink(sz(H) * 4 + 4);
    Guarded out(sz(span(T, p.out_stride_t, H, p.out_stride_h, kLatentDim)) * ob + 1);
    Guarded lse(sz(span(T, p.lse_stride_t, 1, 0, H)) * 4 + 4);
    for (size_t i = 0; i + 1 < q.size(); i += size_t(qb)) {
      if (qb == 2) {
        const uint16_t v = random_16bit(rng, p.q_dtype);
        std::memcpy(q.data() + i, &v, 2);
      } else {
        q.data()[i] = uint8_t(rng()) & 0xbb;  // finite e4m3 of moderate size (also fp32/i32 bytes)
      }
    }
    for (size_t i = 0; i + 1 < qr.size(); i += 2) {
      const uint16_t v = random_16bit(rng, p.q_dtype);
      std::memcpy(qr.data() + i, &v, 2);
    }
    for (size_t i = 0; i < kv.size(); ++i) kv.data()[i] = uint8_t(rng()) & 0x3b;  // finite codes, scales
    auto* idx_p = reinterpret_cast<int32_t*>(idx.data());
    for (size_t i = 0; i < idx.size() / 4; ++i) idx_p[i] = pick(-3, int(p.num_rows) + 2);
    auto* counts_p = reinterpret_cast<int32_t*>(counts.data());
    for (size_t i = 0; i < counts.size() / 4; ++i) counts_p[i] = pick(-2, int(K) + 2);
    auto* sink_p = reinterpret_cast<float*>(sink.data());
    for (size_t i = 0; i < sink.size() / 4; ++i) {
      const int c = pick(0, 39);
      sink_p[i] = c == 0 ? NAN : c == 1 ? INFINITY : c == 2 ? -INFINITY : float(pick(-4, 4));
    }
    std::memset(out.data(), 0xAB, out.size());
    std::memset(lse.data(), 0xCD, lse.size());
    p.q = q.data(), p.q_rope = pair ? qr.data() : nullptr, p.kv = p.num_rows ? kv.data() : nullptr;
    p.idx = idx_p, p.counts = pick(0, 1) ? counts_p : nullptr, p.sink = pick(0, 2) == 0 ? sink_p : nullptr;
    p.out = out.data(), p.lse = pick(0, 3) ? reinterpret_cast<float*>(lse.data()) : nullptr;
    // Overlap: an output placed over an input or the other output (must be refused).
    const int ov = T > 0 && H > 0 && K > 0 ? pick(0, 7) : 0;
    if (ov == 1 && p.lse) p.lse = reinterpret_cast<float*>(out.data() + 4 * pick(0, 8));
    if (ov == 2 && p.num_rows) p.out = kv.data() + 2 * pick(0, 8);
    if (ov == 3) p.out = idx.data();
    if (ov == 4) p.out = q.data() + 2 * pick(0, 4);
    if (ov == 5 && p.lse) p.lse = reinterpret_cast<float*>(q.data() + 4 * pick(0, 4));
    const bool overlapping = p.out != out.data() || (p.lse && p.lse != reinterpret_cast<float*>(lse.data()));
    std::vector<uint8_t> out_before(out.data(), out.data() + out.size());

    bool threw = false;
    try {
      reference::sparse_mla(p, pick(1, 2));
    } catch (const Error& e) {
      threw = true;
      EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << e.what();
    } catch (const std::exception& e) {
      ADD_FAILURE() << "not an smla::Error: " << e.what();
      continue;
    }
    if (overlapping) {
      ++overlaps;
      EXPECT_TRUE(threw) << "overlapping output accepted (kind " << ov << ")";
      if (threw) EXPECT_EQ(std::memcmp(out_before.data(), out.data(), out.size()), 0) << "a refused call wrote out";
      continue;
    }
    if (threw) {
      ++refused;
      EXPECT_EQ(std::memcmp(out_before.data(), out.data(), out.size()), 0) << "a refused call wrote out";
      continue;
    }
    ++accepted;
    // Accepted: exactly the dense layout's result, and nothing written between out's elements.
    Dense d;
    make_dense(p, d);
    ASSERT_NO_THROW(reference::sparse_mla(d.p, 1)) << "the strided call was accepted, the dense one not";
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < H; ++h) {
        const uint8_t* got = out.data() + (t * p.out_stride_t + h * p.out_stride_h) * ob;
        ASSERT_EQ(std::memcmp(got, d.out.data() + (t * H + h) * kLatentDim * ob, size_t(kLatentDim * ob)), 0)
            << "out differs at t " << t << " h " << h;
        if (p.lse) {
          const float* l = p.lse + t * p.lse_stride_t + h;
          ASSERT_EQ(std::memcmp(l, &d.lse[size_t(t * H + h)], 4), 0) << "lse differs at t " << t << " h " << h;
        }
        std::memset(out.data() + (t * p.out_stride_t + h * p.out_stride_h) * ob, 0xAB, size_t(kLatentDim * ob));
      }
    EXPECT_EQ(std::memcmp(out_before.data(), out.data(), out.size()), 0) << "bytes between out's rows were written";
  }
  std::printf("fuzz validate/CPU: %d cases: %d accepted (= dense result), %d refused, %d overlaps refused\n", n,
              accepted, refused, overlaps);
  EXPECT_GE(n, 1000);
  EXPECT_GT(accepted, n / 10);  // the generator reaches the compute path, not only refusals
  EXPECT_GT(overlaps, n / 20);
}

// ---- corrupt dumps into the replay loader --------------------------------------------------

std::vector<uint8_t> good_dump_image() {
  st::File f;
  const int64_t T = 2, H = 2, K = 3, N = 4;
  std::mt19937_64 rng(3);
  std::vector<uint8_t> q(size_t(T * H * 576 * 2)), kv(size_t(N * 576 * 2));
  for (size_t i = 0; i < q.size(); i += 2) {
    const uint16_t v = random_16bit(rng, DType::kBF16);
    std::memcpy(&q[i], &v, 2);
  }
  for (size_t i = 0; i < kv.size(); i += 2) {
    const uint16_t v = random_16bit(rng, DType::kBF16);
    std::memcpy(&kv[i], &v, 2);
  }
  std::vector<int32_t> idx = {0, 3, -1, 2, 2, 9};
  std::vector<uint8_t> idx_b(idx.size() * 4);
  std::memcpy(idx_b.data(), idx.data(), idx_b.size());
  std::vector<float> sink = {0.5f, -1.0f};
  std::vector<uint8_t> sink_b(8);
  std::memcpy(sink_b.data(), sink.data(), 8);
  f.tensors["q"] = {"BF16", {T, H, 576}, q};
  f.tensors["kv"] = {"BF16", {N, 576}, kv};
  f.tensors["idx"] = {"I32", {T, K}, idx_b};
  f.tensors["counts"] = {"I32", {T}, {3, 0, 0, 0, 2, 0, 0, 0}};
  f.tensors["sink"] = {"F32", {H}, sink_b};
  f.metadata = {{"format", "bf16"}, {"softmax_scale", "0.1352338"}, {"q_scale", "1"}, {"k_scale", "1"},
                {"lse_base", "e"}, {"rope_dim", "64"}};
  return st::serialize(f);
}

// "" when the image parsed and replayed, else the Error's message; any other exception fails.
std::string load_and_replay(const std::vector<uint8_t>& image) {
  std::vector<uint8_t> copy(image);  // exactly image.size() bytes
  try {
    const st::File f = st::parse(copy.data(), copy.size());
    ReplayOptions opt;
    replay(f, opt);
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
    EXPECT_FALSE(m.empty());
    return m.empty() ? "(empty)" : m;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "not an smla::Error: " << e.what();
    return "other";
  }
  return "";
}

TEST(Fuzz, CorruptDumpsAlwaysCleanError) {
  const std::vector<uint8_t> good = good_dump_image();
  ASSERT_EQ(load_and_replay(good), "");
  uint64_t hlen = 0;
  std::memcpy(&hlen, good.data(), 8);
  const std::string header(good.begin() + 8, good.begin() + 8 + long(hlen));
  std::mt19937_64 rng(21);
  auto pick = [&](size_t lo, size_t hi) { return std::uniform_int_distribution<size_t>(lo, hi)(rng); };
  const char* bad_numbers[] = {" 0.1", "0.1 ", "0x1p-3", "1e-50", "1e39", "+1", ".5", "nan", "inf", "1e", "--1",
                               "0.1.2", "1e+", "1_0", "１"};
  const char* keys[] = {"softmax_scale", "q_scale", "k_scale", "rope_dim"};
  int errors = 0, n = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (; n < 3000 && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(8); ++n) {
    SCOPED_TRACE("case " + std::to_string(n));
    std::vector<uint8_t> img = good;
    std::string h = header;
    switch (n % 6) {
      case 0:  // byte flips in the header
        for (size_t k = pick(1, 4); k > 0; --k) img[8 + pick(0, hlen - 1)] ^= uint8_t(1u << pick(0, 7));
        break;
      case 1:  // truncation anywhere
        img.resize(pick(0, img.size() - 1));
        break;
      case 2: {  // a wrong header length
        uint64_t v = pick(0, 3) == 0 ? ~uint64_t(0) - pick(0, 16) : hlen + pick(0, 64) - 32;
        std::memcpy(img.data(), &v, 8);
        break;
      }
      case 3:  // a duplicate key inside an entry or the metadata
      case 4: {  // a bad number for a numeric metadata value
        if (n % 6 == 3) {
          const char* dups[] = {"\"dtype\":\"BF16\",", "\"shape\":[1],", "\"format\":\"bf16\",", "\"q_scale\":\"1\","};
          const char* anchors[] = {"\"dtype\":", "\"shape\":", "\"format\":", "\"q_scale\":"};
          const size_t which = pick(0, 3);
          const size_t at = h.find(anchors[which]);
          h.insert(at, dups[which]);
        } else {
          const std::string key = std::string("\"") + keys[pick(0, 3)] + "\":\"";
          const size_t at = h.find(key) + key.size();
          h.replace(at, h.find('"', at) - at, bad_numbers[pick(0, std::size(bad_numbers) - 1)]);
        }
        const uint64_t len = h.size();
        img.assign(8 + h.size() + (good.size() - 8 - hlen), 0);
        std::memcpy(img.data(), &len, 8);
        std::memcpy(img.data() + 8, h.data(), h.size());
        std::memcpy(img.data() + 8 + h.size(), good.data() + 8 + hlen, good.size() - 8 - hlen);
        break;
      }
      default:  // flips anywhere, data included (a flipped data byte may still replay)
        for (size_t k = pick(1, 8); k > 0; --k) img[pick(0, img.size() - 1)] ^= uint8_t(rng());
    }
    const std::string m = load_and_replay(img);
    if (!m.empty()) ++errors;
    if (n % 6 == 3 || n % 6 == 4) EXPECT_NE(m, "") << "duplicate key or bad number accepted";
  }
  std::printf("fuzz replay loader: %d corrupt dumps, %d refused with one-line errors\n", n, errors);
  EXPECT_GE(n, 1000);
}

TEST(Fuzz, MetadataNumberRuleMatchesItsStatement) {
  // The rule as stated in the error, checked independently: JSON number syntax, > 0 and finite in
  // float32 for k_scale, and a nonzero literal must not round to 0.
  const std::regex json_number(R"(-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?)");
  std::vector<uint8_t> image = good_dump_image();
  const st::File base = st::parse(image.data(), image.size());
  std::mt19937_64 rng(22);
  const std::string alphabet = "0123456789012345678901234567890.eE+-- xpinfa,_";
  int accepted = 0, n = 0;
  for (; n < 3000; ++n) {
    std::string s;
    if (n % 2 == 0) {  // near-valid forms
      const char* forms[] = {"%d", "%d.%d", "%de%d", "%d.%dE-%d", "-%d", "0.%de-%d", "%de+%d"};
      char b[64];
      std::snprintf(b, sizeof b, forms[rng() % 7], int(rng() % 1000), int(rng() % 60), int(rng() % 60));
      s = b;
    } else {
      for (size_t k = rng() % 8; k > 0; --k) s += alphabet[rng() % alphabet.size()];
    }
    st::File f = base;
    f.metadata["k_scale"] = s;
    bool want = std::regex_match(s, json_number);
    if (want) {
      const double v = std::strtod(s.c_str(), nullptr);
      const bool nonzero_literal = s.find_first_of("123456789") < s.find_first_of("eE");
      want = v > 0 && v <= FLT_MAX && !(nonzero_literal && float(v) == 0.0f);
    }
    std::string err;
    try {
      replay(f, {});
    } catch (const Error& e) {
      err = e.what();
    }
    EXPECT_EQ(err.empty(), want) << "k_scale '" << s << "': " << err;
    if (!err.empty()) EXPECT_NE(err.find("'k_scale'"), std::string::npos) << err;
    accepted += err.empty();
  }
  EXPECT_GT(accepted, n / 10);
  EXPECT_LT(accepted, n - n / 10);
}

// ---- random argument vectors into the CLI parser ------------------------------------------

TEST(Fuzz, CliParserNeverCrashes) {
  std::vector<std::string> pool = {"--help", "-h", "-", "--", "", "=", "--=", "---", "-x", "x", "1", "-1", "0",
                                   "4294967312", "3000000000", "-9223372036854775808", "9223372036854775808",
                                   "1,2,3", ",", "1,,", "0x10", " 7", "nan", "1e3", "--sink=", "--T=", "--T=-2"};
  for (const auto& c : cli::commands())
    for (const auto& o : c.options) {
      pool.push_back(std::string("--") + o.name);
      pool.push_back(std::string("--") + o.name + "=" + "12");
    }
  std::mt19937_64 rng(23);
  int parsed = 0, n = 0;
  for (; n < 20000; ++n) {
    std::vector<std::string> args = {"smla", cli::commands()[rng() % cli::commands().size()].name};
    for (size_t k = rng() % 7; k > 0; --k) {
      std::string t = pool[rng() % pool.size()];
      if (rng() % 10 == 0) t += char(rng() % 256);  // stray bytes
      args.push_back(t);
    }
    std::vector<const char*> argv;
    for (const auto& a : args) argv.push_back(a.c_str());
    try {
      const cli::Args a = cli::parse_args(*cli::find_command(args[1]), int(argv.size()), argv.data(), 2);
      ++parsed;
      for (const auto& [key, value] : a.kv) {
        try {
          a.get_int(key, 0, -5, 5);
        } catch (const Error&) {
        }
        try {
          a.get_ints(key, {}, 1, 1 << 20);
        } catch (const Error&) {
        }
      }
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos);
    }
  }
  EXPECT_GT(parsed, 100);
}

}  // namespace
