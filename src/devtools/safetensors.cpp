// The safetensors container: an 8-byte little-endian u64 header length N, N bytes of JSON
// ({name: {"dtype", "shape", "data_offsets": [begin, end]}} plus an optional "__metadata__"
// object of strings, possibly padded with spaces), then the data buffer that the offsets index.
//
// parse() treats its input as hostile: every length and offset is checked against the buffer
// before anything is copied, and every malformation ends as one Error line that says what is
// wrong and where.
#include "devtools/safetensors.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <new>
#include <set>
#include <nlohmann/json.hpp>

#include "smla/types.h"

static_assert(std::endian::native == std::endian::little, "safetensors data is little-endian");

namespace smla::st {
namespace {

using json = nlohmann::json;

// Names and parser messages come from the file: keep the error to one printable line.
[[noreturn]] void bad(std::string msg) {
  for (char& c : msg)
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = '?';
  fail("safetensors: " + msg);
}

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// prod(shape) * itemsize, or an Error naming the tensor when it does not fit in 63 bits.
uint64_t byte_size(const std::string& name, const std::vector<int64_t>& shape, int item) {
  constexpr uint64_t kMax = uint64_t(std::numeric_limits<int64_t>::max());
  uint64_t n = uint64_t(item);
  for (int64_t d : shape) {
    if (d < 0) bad("tensor '" + name + "' has a negative dimension in shape " + shape_str(shape));
    if (d != 0 && n > kMax / uint64_t(d))
      bad("tensor '" + name + "' shape " + shape_str(shape) + " is too large");
    n *= uint64_t(d);
  }
  return n;
}

// The tensor entry `name` of the header: {"dtype": str, "shape": [uint...], "data_offsets": [b, e]}.
struct Entry {
  std::string name;
  Tensor meta;  // dtype and shape (data filled later)
  uint64_t begin = 0, end = 0;
};

Entry read_entry(const std::string& name, const json& v) {
  const std::string where = "tensor '" + name + "'";
  if (!v.is_object()) bad(where + " must map to an object with dtype, shape and data_offsets");
  Entry e;
  e.name = name;
  auto it = v.find("dtype");
  if (it == v.end() || !it->is_string()) bad(where + " has no string field 'dtype'");
  e.meta.dtype = it->get<std::string>();
  const int item = itemsize(e.meta.dtype);  // throws on unknown dtypes

  it = v.find("shape");
  if (it == v.end() || !it->is_array()) bad(where + " has no array field 'shape'");
  for (const auto& d : *it) {
    if (!d.is_number_unsigned())  // the parser stores every non-negative integer as unsigned
      bad(where + " shape must hold non-negative integers; got " + it->dump());
    const uint64_t u = d.get<uint64_t>();
    if (u > uint64_t(std::numeric_limits<int64_t>::max())) bad(where + " shape dimension " + d.dump() + " is too large");
    e.meta.shape.push_back(int64_t(u));
  }

  it = v.find("data_offsets");
  if (it == v.end() || !it->is_array() || it->size() != 2 || !(*it)[0].is_number_unsigned() ||
      !(*it)[1].is_number_unsigned())
    bad(where + " needs 'data_offsets' as two non-negative integers [begin, end]");
  e.begin = (*it)[0].get<uint64_t>();
  e.end = (*it)[1].get<uint64_t>();
  if (e.begin > e.end)
    bad(where + " data_offsets are reversed: [" + std::to_string(e.begin) + ", " + std::to_string(e.end) + "]");
  const uint64_t want = byte_size(name, e.meta.shape, item);
  if (e.end - e.begin != want)
    bad(where + " spans " + std::to_string(e.end - e.begin) + " bytes but " + e.meta.dtype + " " +
        shape_str(e.meta.shape) + " needs " + std::to_string(want));
  return e;
}

}  // namespace

int itemsize(const std::string& dtype) {
  if (dtype == "BOOL" || dtype == "U8" || dtype == "I8" || dtype == "F8_E4M3" || dtype == "F8_E5M2") return 1;
  if (dtype == "U16" || dtype == "I16" || dtype == "F16" || dtype == "BF16") return 2;
  if (dtype == "U32" || dtype == "I32" || dtype == "F32") return 4;
  if (dtype == "U64" || dtype == "I64" || dtype == "F64") return 8;
  bad("unknown dtype '" + dtype + "'; expected one of BOOL, U8, I8, F8_E4M3, F8_E5M2, U16, I16, F16, BF16, "
      "U32, I32, F32, U64, I64, F64");
}

File parse(const uint8_t* bytes, size_t size) {
  if (size < 8) bad("file is truncated: " + std::to_string(size) + " bytes, less than the 8-byte header length");
  uint64_t n = 0;
  std::memcpy(&n, bytes, 8);
  if (n > size - 8)
    bad("header length " + std::to_string(n) + " runs past the end of the file (" + std::to_string(size - 8) +
        " bytes follow the length field): file truncated or not safetensors");
  const char* hbegin = reinterpret_cast<const char*>(bytes + 8);
  const char* hend = hbegin + n;

  // The JSON parser stops at a NUL byte; refuse it so nothing after it is silently ignored.
  if (std::memchr(hbegin, 0, n) != nullptr) bad("header contains a NUL byte; pad it with spaces");

  // Keys must be unique in every object (the top level, each tensor entry, "__metadata__"): the
  // parser keeps the last of a repeated key, which would silently shadow the first.
  std::vector<std::set<std::string>> open_objects;  // the keys seen in each object being parsed
  std::string top_key, duplicate;                   // the top-level key being read; the first repeat
  const json::parser_callback_t cb = [&](int, json::parse_event_t ev, json& parsed) {
    if (ev == json::parse_event_t::object_start) open_objects.emplace_back();
    else if (ev == json::parse_event_t::object_end && !open_objects.empty()) open_objects.pop_back();
    else if (ev == json::parse_event_t::key && !open_objects.empty()) {
      const std::string k = parsed.get<std::string>();
      if (open_objects.size() == 1) top_key = k;
      if (!open_objects.back().insert(k).second && duplicate.empty())
        duplicate = open_objects.size() == 1 ? "header names '" + k + "' twice"
                                             : "'" + top_key + "' names '" + k + "' twice";
    }
    return true;
  };
  json header;
  try {
    header = json::parse(hbegin, hend, cb);
  } catch (const json::exception& e) {
    bad(std::string("header is not valid JSON: ") + e.what());
  }
  if (!duplicate.empty()) bad(duplicate + "; every key may appear once per object");
  if (!header.is_object()) bad("header must be a JSON object; got " + std::string(header.type_name()));

  File f;
  std::vector<Entry> entries;
  for (const auto& [name, v] : header.items()) {
    if (name == "__metadata__") {
      if (!v.is_object()) bad("'__metadata__' must be an object of strings");
      for (const auto& [k, s] : v.items()) {
        if (!s.is_string()) bad("'__metadata__' value of '" + k + "' must be a string; got " + s.dump());
        f.metadata[k] = s.get<std::string>();
      }
      continue;
    }
    entries.push_back(read_entry(name, v));
  }

  const uint64_t data_size = size - 8 - n;
  const uint8_t* data = bytes + 8 + n;
  for (const auto& e : entries)
    if (e.end > data_size)
      bad("tensor '" + e.name + "' data_offsets [" + std::to_string(e.begin) + ", " + std::to_string(e.end) +
          "] run past the data buffer (" + std::to_string(data_size) + " bytes): file truncated?");
  std::vector<const Entry*> order;
  for (const auto& e : entries) order.push_back(&e);
  std::sort(order.begin(), order.end(), [](const Entry* a, const Entry* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  for (size_t i = 1; i < order.size(); ++i)
    if (order[i]->begin < order[i - 1]->end)
      bad("tensors '" + order[i - 1]->name + "' and '" + order[i]->name + "' overlap in the data buffer");

  for (auto& e : entries) {
    Tensor t = std::move(e.meta);
    t.data.assign(data + e.begin, data + e.end);
    f.tensors.emplace(e.name, std::move(t));
  }
  return f;
}

File read(const std::string& path) {
  std::error_code ec;
  const auto status = std::filesystem::status(path, ec);
  if (ec || !std::filesystem::exists(status)) fail("cannot open '" + path + "': no such file");
  if (std::filesystem::is_directory(status)) fail("'" + path + "' is a directory; give a .safetensors file");
  if (!std::filesystem::is_regular_file(status)) fail("'" + path + "' is not a regular file; give a .safetensors file");
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) fail("cannot open '" + path + "' for reading");
  const std::streamoff size = in.tellg();
  if (size < 0) fail("cannot determine the size of '" + path + "'");
  std::vector<uint8_t> bytes;
  try {
    bytes.resize(static_cast<size_t>(size));
  } catch (const std::bad_alloc&) {
    fail("'" + path + "' (" + std::to_string(size) + " bytes) does not fit in memory");
  }
  in.seekg(0);
  if (size > 0 && !in.read(reinterpret_cast<char*>(bytes.data()), size)) fail("cannot read '" + path + "'");
  try {
    return parse(bytes.data(), bytes.size());
  } catch (const Error& e) {
    fail(path + ": " + e.what());
  }
}

std::vector<uint8_t> serialize(const File& f) {
  // Key order: "__metadata__" first, then tensors by name, each as dtype, shape, data_offsets;
  // data laid out in the same order with no gaps.
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!f.metadata.empty()) {
    nlohmann::ordered_json m = nlohmann::ordered_json::object();
    for (const auto& [k, v] : f.metadata) m[k] = v;
    header["__metadata__"] = std::move(m);
  }
  uint64_t offset = 0;
  for (const auto& [name, t] : f.tensors) {
    if (name == "__metadata__") bad("a tensor cannot be named '__metadata__'");
    const uint64_t want = byte_size(name, t.shape, itemsize(t.dtype));
    if (t.data.size() != want)
      bad("tensor '" + name + "' holds " + std::to_string(t.data.size()) + " bytes but " + t.dtype + " " +
          shape_str(t.shape) + " needs " + std::to_string(want));
    nlohmann::ordered_json e = nlohmann::ordered_json::object();
    e["dtype"] = t.dtype;
    e["shape"] = t.shape;
    e["data_offsets"] = {offset, offset + want};
    header[name] = std::move(e);
    offset += want;
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::ordered_json::exception& e) {
    bad(std::string("cannot encode the header (names and metadata must be UTF-8): ") + e.what());
  }
  text.append((8 - text.size() % 8) % 8, ' ');  // pad so the data buffer starts 8-byte aligned

  std::vector<uint8_t> out(8 + text.size() + offset);
  const uint64_t n = text.size();
  std::memcpy(out.data(), &n, 8);
  std::memcpy(out.data() + 8, text.data(), text.size());
  uint8_t* data = out.data() + 8 + text.size();
  for (const auto& [name, t] : f.tensors) {
    if (!t.data.empty()) std::memcpy(data, t.data.data(), t.data.size());
    data += t.data.size();
  }
  return out;
}

void write(const std::string& path, const File& f) {
  const std::vector<uint8_t> bytes = serialize(f);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) fail("cannot open '" + path + "' for writing");
  out.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
  out.close();
  if (!out) fail("cannot write '" + path + "'");
}

}  // namespace smla::st
