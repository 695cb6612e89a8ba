// python/src/tensors.h — DLPack arrays (nanobind ndarrays from NumPy, PyTorch, CuPy, ...) seen as
// smla tensors, zero-copy: where they live, their element type, and shape/stride checks whose
// errors name the argument and the fix (they throw smla::Error, which becomes smla.SmlaError).
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "smla/formats.h"
#include "smla/types.h"

namespace smla::py {

namespace nb = nanobind;

// Elements of any DLPack producer, read-only (inputs) or written (outputs). No dtype or shape
// constraint at the nanobind level, so nanobind never converts or copies: the checks below do it.
using In = nb::ndarray<nb::ro>;
using Out = nb::ndarray<>;

// Where memory lives. Pinned host memory (kDLCUDAHost) counts as host.
struct Device {
  bool cuda = false;
  int id = 0;
  bool operator==(const Device& o) const { return cuda == o.cuda && (!cuda || id == o.id); }
};
std::string to_string(const Device& d);

// The element types the API distinguishes. 16-bit unsigned ints carry bf16 bits (NumPy has no
// bf16); 8-bit ints and float8_e4m3fn carry e4m3 or raw cache bytes.
enum class Elem { kBF16, kFP16, kFP32, kF64, kU16, kI16, kU8, kI8, kE4M3, kI32, kI64, kOther };

// One array's facts, read once: pointer, device, element type, shape, strides in elements (a
// size-1 dimension gets the dense stride, since frameworks report arbitrary ones there). view()
// refuses negative strides (a reversed view), naming the dimension.
struct View {
  std::string name;  // the argument name, for messages
  void* data = nullptr;
  Device device;
  Elem elem = Elem::kOther;
  int itemsize = 0;
  std::vector<int64_t> shape, stride;
  int ndim() const { return int(shape.size()); }
  int64_t numel() const;
  std::string describe() const;  // "uint16[4, 16, 576] on cpu"
  // The bytes from data to one past the last element (0 when empty).
  int64_t span_bytes() const;
};

View view(const In& a, const char* name);
View view(const Out& a, const char* name);

std::string elem_name(Elem e);
std::string shape_str(const std::vector<int64_t>& s);

// Throws unless v has exactly `dims` dimensions; -1 in `expect` matches any extent.
// what: the expected form for the message, e.g. "[T, H, 576] bf16 or fp16".
void expect_shape(const View& v, std::initializer_list<int64_t> expect, const std::string& what);
// Throws unless the last dimension is contiguous (stride 1).
void expect_inner_contiguous(const View& v, const std::string& what);
// Throws unless every dimension is densely packed (row-major).
void expect_contiguous(const View& v, const std::string& what);
void expect_elem(const View& v, Elem e, const std::string& what);
// Throws unless every view is on the same device as the first; returns it.
Device common_device(std::initializer_list<const View*> views);

// Outputs must not share bytes with each other or with any input: the kernels read inputs while
// they write outputs, and write each output element once. Compares the byte extents
// [data, data + span) of arrays on one device (disjoint extents cannot share an element; arrays
// interleaved inside one extent are refused too, conservatively). Null entries are skipped.
void expect_disjoint(const std::vector<const View*>& outputs, const std::vector<const View*>& inputs);
// An output whose elements alias each other (a zero or too-small stride, e.g. a broadcast view)
// would be written twice; refused.
void expect_no_self_overlap(const View& out);

// The element types a cache of `format` may arrive as: its own 16-bit type or 16-bit integer bits
// (bf16 / fp16 formats), or bytes (every format; int8 and float8 count as bytes). Anything else
// (float32 for bf16, float16 for bf16, ...) would be reinterpreted silently; refused.
void expect_cache_elem(const View& cache, KvFormat format);

// q's element type: bf16 / fp16 natively, uint16 as bf16 bits (fp16 when hint == kFP16), 8-bit as
// e4m3. hint (nullable) is the caller's q_dtype ("bf16" / "fp16" / "e4m3"), which must agree.
DType q_dtype_of(const View& q, const DType* hint);
// out's element type given q's: bf16 / fp16 / fp32, uint16 meaning q's 16-bit type.
DType out_dtype_of(const View& out, DType q_dtype);
// Source dtype of a cache write (bf16 / fp16 / uint16 bits as bf16 unless hint says fp16).
DType src_dtype_of(const View& v, const DType* hint);

// A cache tensor as a flat row view: [rows, width] or [blocks, block_size, width] of any element
// type, last dim contiguous. Rows of a block are row_stride_bytes apart; blocks are
// block_stride_rows rows apart (>= block_size when the block stride is larger, hybrid layouts).
struct RowView {
  void* base = nullptr;
  int64_t num_rows = 0;
  int64_t row_stride_bytes = 0;
  int64_t row_width_bytes = 0;
  int block_size = 1;
  int64_t block_stride_rows = 1;
};
RowView row_view(const View& kv, int64_t row_bytes_needed, const std::string& format_name);

}  // namespace smla::py
