// smla::replay: a dump built from smla::testing::make_problem replays to exactly the reference output,
// and wrong dtypes, shapes or metadata are refused with a message naming the tensor or key.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "devtools/replay.h"
#include "devtools/testing.h"
#include "reference/sparse_mla.h"
#include "smla/formats.h"

namespace {

using namespace smla;

template <typename T>
std::vector<uint8_t> bytes_of(const std::vector<T>& v) {
  std::vector<uint8_t> b(v.size() * sizeof(T));
  if (!b.empty()) std::memcpy(b.data(), v.data(), b.size());
  return b;
}

std::string float_text(float v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", double(v));
  return buf;
}

st::File dump_of(const smla::testing::HostProblem& hp) {
  const auto& s = hp.spec;
  const int64_t T = s.num_tokens, H = s.num_heads, D = kLatentDim + s.rope_dim;
  st::File f;
  const char* qdt = s.q_dtype == DType::kBF16 ? "BF16" : s.q_dtype == DType::kFP16 ? "F16" : "F8_E4M3";
  f.tensors["q"] = {qdt, {T, H, D}, hp.q};
  const int rb = row_bytes(s.format, s.rope_dim);
  if (s.format == KvFormat::kBF16) f.tensors["kv"] = {"BF16", {s.num_rows, D}, hp.kv};
  else if (s.format == KvFormat::kFP16) f.tensors["kv"] = {"F16", {s.num_rows, D}, hp.kv};
  else f.tensors["kv"] = {"U8", {s.num_rows, rb}, hp.kv};
  f.tensors["idx"] = {"I32", {T, s.topk}, bytes_of(hp.idx)};
  if (s.use_counts) f.tensors["counts"] = {"I32", {T}, bytes_of(hp.counts)};
  if (s.sink) f.tensors["sink"] = {"F32", {H}, bytes_of(hp.sink)};
  f.metadata["format"] = std::string(to_string(s.format));
  f.metadata["softmax_scale"] = float_text(s.softmax_scale);
  f.metadata["q_scale"] = float_text(s.q_scale);
  f.metadata["k_scale"] = float_text(s.k_scale);
  f.metadata["lse_base"] = s.lse_mode == LseMode::kBase2 ? "2" : "e";
  f.metadata["rope_dim"] = std::to_string(s.rope_dim);
  return f;
}

std::vector<float> floats_of(const st::Tensor& t) {
  std::vector<float> v(t.data.size() / 4);
  if (!v.empty()) std::memcpy(v.data(), t.data.data(), t.data.size());
  return v;
}

// Replays spec's problem through a serialized dump and checks it against the reference.
void check_replay(smla::testing::ProblemSpec spec, uint64_t seed, DType out_dtype) {
  spec.out_dtype = out_dtype == DType::kFP32 ? DType::kFP32 : spec.q_dtype == DType::kFP16 ? DType::kFP16 : DType::kBF16;
  smla::testing::HostProblem hp = smla::testing::make_problem(spec, seed);
  const std::vector<uint8_t> image = st::serialize(dump_of(hp));
  const st::File dump = st::parse(image.data(), image.size());
  ReplayOptions opt;
  opt.out_dtype = out_dtype;
  const st::File res = replay(dump, opt);

  reference::sparse_mla(hp.params, 1);
  const auto& out = res.tensors.at("out");
  const auto& lse = res.tensors.at("lse");
  const char* want_dt = spec.out_dtype == DType::kFP32 ? "F32" : spec.out_dtype == DType::kFP16 ? "F16" : "BF16";
  EXPECT_EQ(out.dtype, want_dt);
  EXPECT_EQ(out.shape, (std::vector<int64_t>{spec.num_tokens, spec.num_heads, kLatentDim}));
  EXPECT_EQ(lse.dtype, "F32");
  EXPECT_EQ(lse.shape, (std::vector<int64_t>{spec.num_tokens, spec.num_heads}));
  // Same backend, same inputs: bit-identical to the reference run in place.
  EXPECT_EQ(out.data, hp.out);
  const std::vector<float> got_lse = floats_of(lse);
  ASSERT_EQ(got_lse.size(), hp.lse.size());
  for (size_t i = 0; i < got_lse.size(); ++i)
    EXPECT_TRUE(got_lse[i] == hp.lse[i] || (std::isnan(got_lse[i]) && std::isnan(hp.lse[i]))) << i;
  // And close to the float64 oracle.
  std::vector<double> ref_out, ref_lse;
  smla::testing::reference_double(hp, ref_out, ref_lse);
  const smla::testing::Diff d = smla::testing::compare(hp, ref_out, ref_lse);
  EXPECT_LE(d.rel_l2, out_dtype == DType::kFP32 ? 1e-6 : 1e-2);
  EXPECT_LE(d.lse_max_abs, 1e-4);
  EXPECT_EQ(res.metadata.at("format"), std::string(to_string(spec.format)));
}

smla::testing::ProblemSpec small(KvFormat format) {
  smla::testing::ProblemSpec s;
  s.num_tokens = 5;
  s.num_heads = 3;
  s.topk = 37;
  s.num_rows = 200;
  s.format = format;
  s.q_dtype = format == KvFormat::kFP16 ? DType::kFP16 : DType::kBF16;
  s.all_invalid_row = true;
  s.invalid_fraction = 0.2;
  return s;
}

const KvFormat kAllFormats[] = {KvFormat::kBF16, KvFormat::kFP16, KvFormat::kFP8E4M3, KvFormat::kFP8DsMla,
                                KvFormat::kNvFP4DsMla};

TEST(Replay, EveryFormatMatchesReference) {
  uint64_t seed = 1;
  for (KvFormat f : kAllFormats) {
    SCOPED_TRACE(std::string(to_string(f)));
    auto s = small(f);
    s.use_counts = true;
    s.sink = true;
    check_replay(s, seed++, DType::kFP32);
    check_replay(s, seed++, DType::kBF16);
    s.rope_dim = 0;
    s.lse_mode = LseMode::kBase2;
    s.use_counts = false;
    check_replay(s, seed++, DType::kFP32);
  }
}

TEST(Replay, E4M3QueryWithScales) {
  auto s = small(KvFormat::kFP8E4M3);
  s.q_dtype = DType::kE4M3;
  s.q_scale = 0.05f;
  s.k_scale = 0.3f;
  s.sink = true;
  check_replay(s, 21, DType::kFP32);
  check_replay(s, 22, DType::kBF16);
}

TEST(Replay, E4M3QueryOnDsMlaCache) {
  auto s = small(KvFormat::kFP8DsMla);
  s.q_dtype = DType::kE4M3;
  s.q_scale = 0.05f;
  check_replay(s, 23, DType::kFP32);
}

TEST(Replay, Fp16QueryOnQuantizedCache) {
  auto s = small(KvFormat::kNvFP4DsMla);
  s.q_dtype = DType::kFP16;
  check_replay(s, 23, DType::kBF16);  // 16-bit out follows q: F16
}

TEST(Replay, EmptyProblem) {
  auto s = small(KvFormat::kBF16);
  s.num_tokens = 0;
  check_replay(s, 24, DType::kFP32);
}

TEST(Replay, DefaultsForOptionalMetadata) {
  auto s = small(KvFormat::kFP8DsMla);
  s.rope_dim = 0;
  smla::testing::HostProblem hp = smla::testing::make_problem(s, 25);
  st::File dump = dump_of(hp);
  for (const char* k : {"q_scale", "k_scale", "lse_base", "rope_dim"}) dump.metadata.erase(k);
  const st::File res = replay(dump, {Backend::kCpu, DType::kBF16});  // rope_dim 0 inferred from D = 512
  reference::sparse_mla(hp.params, 1);
  EXPECT_EQ(res.tensors.at("out").data, hp.out);
  EXPECT_EQ(res.metadata.at("lse_base"), "e");
}

TEST(Replay, CudaBackendWithoutCudaIsAnError) {
  if (built_with_cuda()) GTEST_SKIP() << "CUDA build";
  smla::testing::HostProblem hp = smla::testing::make_problem(small(KvFormat::kBF16), 26);
  EXPECT_THROW(replay(dump_of(hp), {Backend::kCuda, DType::kBF16}), Error);
}

// Issue #20: a CUDA build on a machine without a GPU says what `smla info` says.
TEST(Replay, CudaBackendWithoutDeviceSaysNoDevice) {
  if (!built_with_cuda()) GTEST_SKIP() << "CPU-only build (CudaBackendWithoutCudaIsAnError covers it)";
  if (first_cuda_device().present()) GTEST_SKIP() << "a CUDA device is present";
  smla::testing::HostProblem hp = smla::testing::make_problem(small(KvFormat::kBF16), 26);
  try {
    replay(dump_of(hp), {Backend::kCuda, DType::kBF16});
    ADD_FAILURE() << "ran on the CUDA backend without a device";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no CUDA device found"), std::string::npos) << e.what();
  }
}

// ---- refusals

// A zero-filled tensor whose byte count matches dtype x shape.
st::Tensor zeros(const std::string& dtype, std::vector<int64_t> shape) {
  int64_t n = st::itemsize(dtype);
  for (int64_t d : shape) n *= d;
  return {dtype, std::move(shape), std::vector<uint8_t>(size_t(n))};
}

std::string replay_error(const st::File& dump) {
  try {
    replay(dump, {});
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.find('\n'), std::string::npos);
    return msg;
  }
  return "";
}

class ReplayErrors : public ::testing::Test {
 protected:
  void SetUp() override {
    auto s = small(KvFormat::kBF16);
    s.use_counts = true;
    s.sink = true;
    hp = smla::testing::make_problem(s, 30);
    good = dump_of(hp);
    ASSERT_EQ(replay_error(good), "");
  }
  // Expects an error that contains every word.
  void expect(const st::File& d, std::initializer_list<const char*> words) {
    const std::string msg = replay_error(d);
    ASSERT_NE(msg, "") << "accepted";
    for (const char* w : words) EXPECT_NE(msg.find(w), std::string::npos) << "'" << w << "' not in: " << msg;
  }
  smla::testing::HostProblem hp;
  st::File good;
};

TEST_F(ReplayErrors, MissingTensors) {
  for (const char* name : {"q", "kv", "idx"}) {
    st::File d = good;
    d.tensors.erase(name);
    expect(d, {(std::string("'") + name + "'").c_str()});
  }
}

TEST_F(ReplayErrors, WrongDtypes) {
  st::File d = good;
  d.tensors["q"].dtype = "F16";
  expect(d, {"q"});  // fp16 q against a bf16 cache: refused by validation
  d = good;
  d.tensors["q"] = zeros("F32", {5, 3, 576});
  expect(d, {"'q'", "F32"});
  d = good;
  d.tensors["q"] = zeros("F8_E4M3", {5, 3, 576});
  expect(d, {"'q'", "fp8_e4m3"});
  d = good;
  d.tensors["kv"].dtype = "F16";
  expect(d, {"'kv'", "BF16"});
  d = good;
  d.tensors["kv"] = zeros("U8", {200, row_bytes(KvFormat::kBF16, 64)});
  expect(d, {"'kv'"});
  d = good;
  d.tensors["idx"] = {"U32", d.tensors["idx"].shape, d.tensors["idx"].data};
  expect(d, {"'idx'", "U32"});
  d = good;
  d.tensors["counts"].dtype = "F32";
  expect(d, {"'counts'"});
  d = good;
  d.tensors["sink"].dtype = "I32";
  expect(d, {"'sink'"});
}

TEST_F(ReplayErrors, WrongShapes) {
  st::File d = good;
  d.tensors["q"].shape = {5, 3, 576, 1};
  expect(d, {"'q'"});
  d = good;
  d.tensors["q"].shape = {5, 6, 288};
  expect(d, {"'q'", "576"});
  d = good;
  d.tensors["kv"] = zeros("BF16", {400, 288});
  expect(d, {"'kv'", "[N, 576]"});
  d = good;
  d.tensors["idx"].shape = {37, 5};
  expect(d, {"'idx'", "T = 5"});
  d = good;
  d.tensors["idx"] = zeros("I32", {5, 0});
  expect(d, {"'idx'", "K >= 1"});
  d = good;
  d.tensors["counts"] = zeros("I32", {4});
  expect(d, {"'counts'"});
  d = good;
  d.tensors["sink"] = zeros("F32", {1, 3});
  expect(d, {"'sink'"});
  d = good;
  d.metadata["rope_dim"] = "0";  // q still has D = 576
  expect(d, {"'q'", "512"});
}

TEST_F(ReplayErrors, InconsistentInMemoryFile) {
  st::File d = good;
  d.tensors["idx"].data.resize(8);  // a File built in code: fewer bytes than [5, 37] I32
  expect(d, {"'idx'", "bytes"});
  d = good;
  d.tensors["kv"].dtype = "X9";
  expect(d, {"'kv'", "X9"});
}

TEST_F(ReplayErrors, BadMetadata) {
  st::File d = good;
  d.metadata.erase("format");
  expect(d, {"'format'"});
  d = good;
  d.metadata["format"] = "int4";
  expect(d, {"'format'", "int4"});
  d = good;
  d.metadata.erase("softmax_scale");
  expect(d, {"'softmax_scale'", "missing"});
  for (const char* v : {"", "abc", "0.1x", "nan", "inf"}) {
    d = good;
    d.metadata["softmax_scale"] = v;
    expect(d, {"'softmax_scale'"});
  }
  d = good;
  d.metadata["q_scale"] = "0";
  expect(d, {"'q_scale'"});
  d = good;
  d.metadata["k_scale"] = "-1";
  expect(d, {"'k_scale'"});
  d = good;
  d.metadata["lse_base"] = "10";
  expect(d, {"'lse_base'"});
  d = good;
  d.metadata["rope_dim"] = "32";
  expect(d, {"'rope_dim'"});
}

// Issue #20: one strict number rule for every numeric metadata value, stated in the error.
TEST_F(ReplayErrors, OneStrictNumberRule) {
  for (const char* key : {"softmax_scale", "q_scale", "k_scale", "rope_dim"}) {
    for (const char* v : {" 0.1", "0.1 ", "+0.1", "0x1p-3", ".5", "5.", "1e", "01", "1,5", "NaN", "-inf", "64\t"}) {
      st::File d = good;
      d.metadata[key] = v;
      expect(d, {(std::string("'") + key + "'").c_str(), "JSON syntax"});
    }
  }
  // A nonzero literal that underflows float32 to 0 is refused, not read as 0.
  st::File d = good;
  d.metadata["q_scale"] = "1e-50";
  expect(d, {"'q_scale'", "rounds to 0"});
  // Out of range: the error says the accepted range (not "must be finite").
  for (const char* v : {"1e39", "3e38", "-10001"}) {
    d = good;
    d.metadata["softmax_scale"] = v;
    expect(d, {"'softmax_scale'", "[-1e4, 1e4]"});
  }
  d = good;
  d.metadata["rope_dim"] = "63";
  expect(d, {"'rope_dim'", "64 or 0"});
  // Accepted spellings of the same rule: exponent forms, negative zero exponent, integral floats.
  d = good;
  d.metadata["softmax_scale"] = "1.352338E-1";
  d.metadata["q_scale"] = "1e0";
  d.metadata["rope_dim"] = "64.0";
  EXPECT_EQ(replay_error(d), "");
}

TEST_F(ReplayErrors, NonFiniteSinkRefusedMinusInfinityIsNoSink) {
  for (float v : {NAN, INFINITY}) {
    st::File d = good;
    std::memcpy(d.tensors["sink"].data.data() + 4, &v, 4);
    expect(d, {"sink[1]"});
  }
}

}  // namespace
