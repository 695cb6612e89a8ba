// devtools/safetensors.h — (developer tools) read and write the safetensors format (u64
// little-endian header length, a JSON header of {name: {dtype, shape, data_offsets}} plus optional
// string "__metadata__", then raw little-endian data). Used by `smla replay` and the tests.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace smla::st {

struct Tensor {
  std::string dtype;           // safetensors dtype name: "BF16", "F16", "F32", "F8_E4M3", "U8", "I32", ...
  std::vector<int64_t> shape;  // row-major
  std::vector<uint8_t> data;   // raw little-endian bytes, size = prod(shape) * itemsize
};

struct File {
  std::map<std::string, Tensor> tensors;
  std::map<std::string, std::string> metadata;  // "__metadata__" (string values only)
};

// Bytes per element of a safetensors dtype name; throws Error for unknown names.
int itemsize(const std::string& dtype);

// Parses a whole file image. Any malformation (truncated, bad JSON, offsets out of range or
// overlapping, size not matching shape x dtype, unknown dtype) throws Error with one line.
File parse(const uint8_t* bytes, size_t size);
File read(const std::string& path);

std::vector<uint8_t> serialize(const File& f);
void write(const std::string& path, const File& f);

}  // namespace smla::st
