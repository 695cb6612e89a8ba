// safetensors: byte-exact writer, round trips, and a parser that rejects every malformation
// with one Error line (never a crash or an out-of-bounds read).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "devtools/safetensors.h"
#include "smla/types.h"

namespace {

using smla::Error;
namespace st = smla::st;

std::vector<uint8_t> image(const std::string& header, const std::vector<uint8_t>& data) {
  std::vector<uint8_t> out(8 + header.size() + data.size());
  const uint64_t n = header.size();
  std::memcpy(out.data(), &n, 8);
  std::copy(header.begin(), header.end(), out.begin() + 8);
  std::copy(data.begin(), data.end(), out.begin() + 8 + long(header.size()));
  return out;
}

st::File parse(const std::vector<uint8_t>& bytes) { return st::parse(bytes.data(), bytes.size()); }

// Parses and returns the error message ("" when it parsed).
std::string parse_error(const std::vector<uint8_t>& bytes) {
  // A private copy of exactly `size` bytes, so a read past the end is caught by sanitizers.
  std::vector<uint8_t> copy(bytes);
  try {
    st::parse(copy.data(), copy.size());
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    return msg.empty() ? "(empty message)" : msg;
  }
  return "";
}

st::File sample() {
  st::File f;
  f.tensors["b"] = {"F32", {2}, {0, 0, 128, 63, 0, 0, 0, 64}};  // 1.0f, 2.0f
  f.tensors["a"] = {"U8", {1, 3}, {7, 8, 9}};
  f.tensors["z"] = {"I32", {0, 4}, {}};
  f.metadata["format"] = "bf16";
  f.metadata["softmax_scale"] = "0.125";
  return f;
}

TEST(Safetensors, Itemsize) {
  EXPECT_EQ(st::itemsize("BF16"), 2);
  EXPECT_EQ(st::itemsize("F8_E4M3"), 1);
  EXPECT_EQ(st::itemsize("I32"), 4);
  EXPECT_EQ(st::itemsize("F64"), 8);
  EXPECT_THROW(st::itemsize("bf16"), Error);
  EXPECT_THROW(st::itemsize(""), Error);
}

TEST(Safetensors, TinyFileByteExact) {
  st::File f;
  f.tensors["x"] = {"U8", {2}, {0xab, 0xcd}};
  const std::vector<uint8_t> got = st::serialize(f);
  // 53 bytes of JSON padded with 3 spaces to 56, so the data starts 8-byte aligned at 64.
  const std::string json = R"({"x":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}})";
  ASSERT_EQ(json.size(), 53u);
  std::vector<uint8_t> want = {56, 0, 0, 0, 0, 0, 0, 0};
  want.insert(want.end(), json.begin(), json.end());
  want.insert(want.end(), 3, ' ');
  want.push_back(0xab);
  want.push_back(0xcd);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(int(got[i]), int(want[i])) << "byte " << i;
}

TEST(Safetensors, MetadataFirstThenTensorsByName) {
  st::File f;
  f.tensors["b"] = {"I32", {1}, {1, 0, 0, 0}};
  f.tensors["a"] = {"F16", {}, {0, 0x3c}};
  f.metadata["k"] = "v";
  const auto bytes = st::serialize(f);
  uint64_t n;
  std::memcpy(&n, bytes.data(), 8);
  EXPECT_EQ(n % 8, 0u);
  const std::string header(reinterpret_cast<const char*>(bytes.data() + 8), n);
  EXPECT_EQ(header.substr(0, header.find_last_not_of(' ') + 1),
            R"({"__metadata__":{"k":"v"},"a":{"dtype":"F16","shape":[],"data_offsets":[0,2]},)"
            R"("b":{"dtype":"I32","shape":[1],"data_offsets":[2,6]}})");
  const std::vector<uint8_t> data(bytes.begin() + 8 + long(n), bytes.end());
  EXPECT_EQ(data, (std::vector<uint8_t>{0, 0x3c, 1, 0, 0, 0}));
}

TEST(Safetensors, RoundTrip) {
  const st::File f = sample();
  const st::File g = parse(st::serialize(f));
  ASSERT_EQ(g.tensors.size(), 3u);
  for (const auto& [name, t] : f.tensors) {
    const auto& u = g.tensors.at(name);
    EXPECT_EQ(u.dtype, t.dtype) << name;
    EXPECT_EQ(u.shape, t.shape) << name;
    EXPECT_EQ(u.data, t.data) << name;
  }
  EXPECT_EQ(g.metadata, f.metadata);
  EXPECT_EQ(st::serialize(g), st::serialize(f));
}

TEST(Safetensors, FileRoundTrip) {
  const std::string path = std::string(SMLA_BINARY_DIR) + "/test_safetensors_roundtrip.safetensors";
  st::write(path, sample());
  const st::File g = st::read(path);
  EXPECT_EQ(g.tensors.at("b").data, sample().tensors.at("b").data);
  std::remove(path.c_str());
  EXPECT_THROW(st::read(path), Error);
}

TEST(Safetensors, AcceptsForeignLayouts) {
  // Another writer's choices: unpadded header, reversed key order, no metadata, a gap.
  const auto f = parse(image(R"({"y":{"data_offsets":[4,6],"shape":[1],"dtype":"BF16"},)"
                             R"("x":{"shape":[1],"dtype":"U8","data_offsets":[0,1]}})",
                             {1, 0, 0, 0, 0x80, 0x3f}));
  EXPECT_EQ(f.tensors.at("x").data, (std::vector<uint8_t>{1}));
  EXPECT_EQ(f.tensors.at("y").data, (std::vector<uint8_t>{0x80, 0x3f}));
  EXPECT_TRUE(f.metadata.empty());
  EXPECT_TRUE(parse(image("{}", {})).tensors.empty());
  EXPECT_TRUE(parse(image("  {}    ", {})).tensors.empty());
}

TEST(Safetensors, RejectsTruncation) {
  const auto full = st::serialize(sample());
  uint64_t n;
  std::memcpy(&n, full.data(), 8);
  for (size_t cut : {size_t(0), size_t(1), size_t(7), size_t(8), size_t(9), size_t(8 + n / 2), size_t(8 + n - 1),
                     size_t(8 + n), size_t(8 + n + 3), full.size() - 1}) {
    const std::vector<uint8_t> part(full.begin(), full.begin() + long(cut));
    EXPECT_NE(parse_error(part), "") << "cut at " << cut;
  }
  EXPECT_EQ(parse_error(full), "");
}

TEST(Safetensors, RejectsHugeHeaderLength) {
  for (uint64_t n : {uint64_t(9), uint64_t(1) << 40, ~uint64_t(0), ~uint64_t(0) - 7}) {
    std::vector<uint8_t> b(16, ' ');
    std::memcpy(b.data(), &n, 8);
    const std::string msg = parse_error(b);
    EXPECT_NE(msg.find("header length"), std::string::npos) << msg;
  }
}

TEST(Safetensors, RejectsBadJson) {
  EXPECT_NE(parse_error(image("{not json}", {})).find("JSON"), std::string::npos);
  EXPECT_NE(parse_error(image("", {})), "");
  EXPECT_NE(parse_error(image("{\"a\":", {})), "");
  EXPECT_NE(parse_error(image(std::string("{}\0\0", 4), {})), "");
  EXPECT_NE(parse_error(image("[]", {})).find("object"), std::string::npos);
  EXPECT_NE(parse_error(image("3", {})).find("object"), std::string::npos);
  const std::string dup = R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
                          R"("a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})";
  EXPECT_NE(parse_error(image(dup, {1, 2})).find("twice"), std::string::npos);
}

TEST(Safetensors, RejectsMissingOrMistypedFields) {
  const std::vector<std::string> headers = {
      R"({"a":3})",
      R"({"a":{"shape":[1],"data_offsets":[0,1]}})",
      R"({"a":{"dtype":"U8","data_offsets":[0,1]}})",
      R"({"a":{"dtype":"U8","shape":[1]}})",
      R"({"a":{"dtype":7,"shape":[1],"data_offsets":[0,1]}})",
      R"({"a":{"dtype":"U8","shape":1,"data_offsets":[0,1]}})",
      R"({"a":{"dtype":"U8","shape":[-1],"data_offsets":[0,1]}})",
      R"({"a":{"dtype":"U8","shape":[1.5],"data_offsets":[0,1]}})",
      R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0]}})",
      R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1,2]}})",
      R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[-1,0]}})",
      R"({"a":{"dtype":"U8","shape":[1],"data_offsets":["0","1"]}})",
      R"({"__metadata__":{"k":1}})",
      R"({"__metadata__":[]})",
  };
  for (const auto& h : headers) {
    const std::string msg = parse_error(image(h, {0}));
    EXPECT_NE(msg, "") << h;
  }
  EXPECT_NE(parse_error(image(headers[1], {0})).find("'a'"), std::string::npos);
}

TEST(Safetensors, RejectsBadOffsetsAndSizes) {
  auto err = [](const std::string& h, size_t data_bytes) { return parse_error(image(h, std::vector<uint8_t>(data_bytes))); };
  // out of range
  EXPECT_NE(err(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 7).find("past"), std::string::npos);
  EXPECT_NE(err(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[100,101]}})", 8), "");
  EXPECT_NE(err(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[18446744073709551615,0]}})", 8), "");
  // reversed
  EXPECT_NE(err(R"({"a":{"dtype":"U8","shape":[0],"data_offsets":[4,0]}})", 8).find("reversed"), std::string::npos);
  // overlapping
  EXPECT_NE(err(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                R"("b":{"dtype":"U8","shape":[2],"data_offsets":[7,9]}})", 9).find("overlap"), std::string::npos);
  EXPECT_NE(err(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                R"("b":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}})", 4).find("overlap"), std::string::npos);
  // size != prod(shape) * itemsize
  EXPECT_NE(err(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8).find("needs 12"), std::string::npos);
  EXPECT_NE(err(R"({"a":{"dtype":"BF16","shape":[2,2],"data_offsets":[0,4]}})", 8), "");
  // shape whose byte count overflows
  EXPECT_NE(err(R"({"a":{"dtype":"F64","shape":[4294967296,4294967296],"data_offsets":[0,0]}})", 0).find("too large"),
            std::string::npos);
  // unknown dtype
  EXPECT_NE(err(R"({"a":{"dtype":"F4","shape":[1],"data_offsets":[0,1]}})", 1).find("unknown dtype"), std::string::npos);
  // empty tensors sharing an offset are fine
  EXPECT_EQ(err(R"({"a":{"dtype":"U8","shape":[0],"data_offsets":[0,0]},)"
                R"("b":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}})", 2), "");
}

TEST(Safetensors, MessagesStayOnOneLine) {
  // A tensor name with a newline (legal JSON) must not split the error.
  const std::string msg = parse_error(image(R"({"a\nb":{"dtype":"U8","shape":[1]}})", {0}));
  EXPECT_NE(msg, "");
}

TEST(Safetensors, MutatedImagesParseOrThrow) {
  // Random byte edits and cuts of a valid image: every outcome is a File or an Error, and what
  // parses holds tensors whose bytes match their shape (run under ASan to catch stray reads).
  const auto full = st::serialize(sample());
  std::mt19937 rng(7);
  int rejected = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    std::vector<uint8_t> b = full;
    const int edits = 1 + int(rng() % 3);
    for (int e = 0; e < edits; ++e) {
      const size_t pos = rng() % b.size();
      b[pos] = (rng() % 2) ? uint8_t(rng()) : uint8_t("{}[]\",:0123456789 \0"[rng() % 20]);
    }
    if (rng() % 4 == 0) b.resize(rng() % (b.size() + 1));
    try {
      const st::File f = st::parse(b.data(), b.size());
      for (const auto& [name, t] : f.tensors) {
        size_t n = size_t(st::itemsize(t.dtype));
        for (int64_t d : t.shape) n *= size_t(d);
        EXPECT_EQ(t.data.size(), n) << name;
      }
    } catch (const Error& e) {
      ++rejected;
      EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos);
    }
  }
  EXPECT_GT(rejected, 1000);
}

TEST(Safetensors, SerializeRejectsInconsistentTensors) {
  st::File f;
  f.tensors["a"] = {"F32", {2}, {0, 0, 0}};
  EXPECT_THROW(st::serialize(f), Error);
  f.tensors["a"] = {"Q8", {1}, {0}};
  EXPECT_THROW(st::serialize(f), Error);
}

// Issue #20: a key repeated inside a tensor entry or "__metadata__" is refused (the JSON parser
// would keep the last one), naming where.
TEST(Safetensors, RejectsDuplicateKeysAtEveryLevel) {
  const std::string in_entry = R"({"a":{"dtype":"U8","shape":[1],"dtype":"I8","data_offsets":[0,1]}})";
  EXPECT_NE(parse_error(image(in_entry, {1})).find("'a' names 'dtype' twice"), std::string::npos)
      << parse_error(image(in_entry, {1}));
  const std::string in_meta = R"({"__metadata__":{"format":"bf16","format":"fp16"}})";
  EXPECT_NE(parse_error(image(in_meta, {})).find("'__metadata__' names 'format' twice"), std::string::npos)
      << parse_error(image(in_meta, {}));
  const std::string offsets = R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1],"data_offsets":[1,2]}})";
  EXPECT_NE(parse_error(image(offsets, {1, 2})).find("twice"), std::string::npos);
  // The same key in two different objects is fine.
  const std::string ok = R"({"__metadata__":{"dtype":"x"},"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})";
  EXPECT_EQ(parse_error(image(ok, {1})), "");
}

TEST(Safetensors, ReadRefusesDirectoriesAndMissingFiles) {
  const std::string dir = ::testing::TempDir();
  try {
    st::read(dir);
    ADD_FAILURE() << "a directory was read";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("is a directory"), std::string::npos) << e.what();
  }
  try {
    st::read(dir + "/no-such-file.safetensors");
    ADD_FAILURE() << "a missing file was read";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no such file"), std::string::npos) << e.what();
  }
}

}  // namespace
