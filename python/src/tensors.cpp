#include "tensors.h"

#include <algorithm>
#include <sstream>

namespace smla::py {
namespace {

namespace dl = nb::dlpack;

Elem elem_of(dl::dtype t) {
  if (t.lanes != 1) return Elem::kOther;
  switch (dl::dtype_code(t.code)) {
    case dl::dtype_code::Bfloat: return t.bits == 16 ? Elem::kBF16 : Elem::kOther;
    case dl::dtype_code::Float:
      return t.bits == 16 ? Elem::kFP16 : t.bits == 32 ? Elem::kFP32 : Elem::kOther;
    case dl::dtype_code::UInt:
      return t.bits == 16 ? Elem::kU16 : t.bits == 8 ? Elem::kU8 : Elem::kOther;
    case dl::dtype_code::Int:
      return t.bits == 16 ? Elem::kI16 : t.bits == 8 ? Elem::kI8 : t.bits == 32 ? Elem::kI32
                                                                 : t.bits == 64 ? Elem::kI64 : Elem::kOther;
    default:
      // float8_e4m3fn (DLPack code 10 in newer versions); other float8 kinds are not e4m3fn.
      return (t.code == 10 && t.bits == 8) ? Elem::kE4M3 : Elem::kOther;
  }
}

template <typename A>
View make_view(const A& a, const char* name) {
  View v;
  v.name = name;
  v.data = const_cast<void*>(static_cast<const void*>(a.data()));
  const int dev = a.device_type();
  SMLA_CHECK(dev == nb::device::cpu::value || dev == nb::device::cuda::value || dev == nb::device::cuda_host::value ||
                 dev == nb::device::cuda_managed::value,
             std::string(name) + " lives on an unsupported device (DLPack device type " + std::to_string(dev) +
                 "); pass a host (NumPy) or CUDA array");
  v.device.cuda = dev == nb::device::cuda::value || dev == nb::device::cuda_managed::value;
  v.device.id = v.device.cuda ? a.device_id() : 0;
  v.elem = elem_of(a.dtype());
  v.itemsize = int((a.dtype().bits + 7) / 8);
  v.shape.resize(a.ndim());
  v.stride.resize(a.ndim());
  for (size_t i = 0; i < a.ndim(); ++i) v.shape[i] = int64_t(a.shape(i));
  // Dense strides where the framework's are arbitrary: size-1 dimensions, and empty arrays.
  const bool empty = v.numel() == 0;
  int64_t dense = 1;
  for (int i = int(a.ndim()) - 1; i >= 0; --i) {
    v.stride[i] = (empty || v.shape[i] == 1) ? dense : a.stride(i);
    dense = v.stride[i] * std::max<int64_t>(v.shape[i], 1);
  }
  return v;
}

}  // namespace

std::string to_string(const Device& d) { return d.cuda ? "cuda:" + std::to_string(d.id) : "cpu"; }

std::string elem_name(Elem e) {
  switch (e) {
    case Elem::kBF16: return "bfloat16";
    case Elem::kFP16: return "float16";
    case Elem::kFP32: return "float32";
    case Elem::kU16: return "uint16";
    case Elem::kI16: return "int16";
    case Elem::kU8: return "uint8";
    case Elem::kI8: return "int8";
    case Elem::kE4M3: return "float8_e4m3fn";
    case Elem::kI32: return "int32";
    case Elem::kI64: return "int64";
    default: return "an unsupported dtype";
  }
}

std::string shape_str(const std::vector<int64_t>& s) {
  std::ostringstream o;
  o << "[";
  for (size_t i = 0; i < s.size(); ++i) o << (i ? ", " : "") << s[i];
  o << "]";
  return o.str();
}

int64_t View::numel() const {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

int64_t View::span_bytes() const {
  if (numel() == 0) return 0;
  int64_t last = 0;
  for (int i = 0; i < ndim(); ++i) last += (shape[i] - 1) * stride[i];
  return (last + 1) * itemsize;
}

std::string View::describe() const {
  const std::string e = elem == Elem::kOther ? std::to_string(itemsize * 8) + "-bit elements" : elem_name(elem);
  return e + shape_str(shape) + " on " + to_string(device);
}

View view(const In& a, const char* name) { return make_view(a, name); }
View view(const Out& a, const char* name) { return make_view(a, name); }

void expect_shape(const View& v, std::initializer_list<int64_t> expect, const std::string& what) {
  bool ok = v.ndim() == int(expect.size());
  int i = 0;
  for (int64_t e : expect) {
    if (!ok) break;
    ok = e < 0 || v.shape[i] == e;
    ++i;
  }
  SMLA_CHECK(ok, v.name + " must be " + what + "; got " + v.describe());
}

void expect_inner_contiguous(const View& v, const std::string& what) {
  SMLA_CHECK(v.ndim() == 0 || v.shape.back() <= 1 || v.stride.back() == 1,
             v.name + " must have a contiguous last dimension (" + what + "); got strides " + shape_str(v.stride) +
                 " (call .contiguous() / np.ascontiguousarray)");
}

void expect_contiguous(const View& v, const std::string& what) {
  int64_t dense = 1;
  bool ok = true;
  for (int i = v.ndim() - 1; i >= 0; --i) {
    if (v.shape[i] != 1 && v.stride[i] != dense) ok = false;
    dense *= v.shape[i];
  }
  SMLA_CHECK(ok || v.numel() == 0, v.name + " must be contiguous (" + what + "); got strides " + shape_str(v.stride) +
                                       " (call .contiguous() / np.ascontiguousarray)");
}

void expect_elem(const View& v, Elem e, const std::string& what) {
  if (v.elem == e) return;
  std::string fix;
  if (e == Elem::kI32 && v.elem == Elem::kI64) fix = " (convert with .to(torch.int32) / .astype(np.int32))";
  if (e == Elem::kFP32) fix = " (convert with .float() / .astype(np.float32))";
  fail(v.name + " must be " + what + "; got " + v.describe() + fix);
}

Device common_device(std::initializer_list<const View*> views) {
  const View* first = nullptr;
  for (const View* v : views) {
    if (!v) continue;
    if (!first) {
      first = v;
      continue;
    }
    SMLA_CHECK(v->device == first->device, "all tensors must be on one device: " + first->name + " is on " +
                                               to_string(first->device) + " but " + v->name + " is on " +
                                               to_string(v->device));
  }
  SMLA_CHECK(first != nullptr, "no tensor given");
  return first->device;
}

DType q_dtype_of(const View& q, const DType* hint) {
  DType d;
  switch (q.elem) {
    case Elem::kBF16: d = DType::kBF16; break;
    case Elem::kFP16: d = DType::kFP16; break;
    case Elem::kU16:
    case Elem::kI16: d = (hint && *hint == DType::kFP16) ? DType::kFP16 : DType::kBF16; break;
    case Elem::kU8:
    case Elem::kI8:
    case Elem::kE4M3: d = DType::kE4M3; break;
    default:
      fail(q.name + " must be bf16 or fp16 (NumPy: uint16 bf16 bits, ml_dtypes.bfloat16 or float16), or e4m3 "
                    "bytes for the fp8 caches; got " + q.describe());
  }
  SMLA_CHECK(!hint || *hint == d, q.name + " holds " + q.describe() + " but q_dtype says " +
                                      std::string(smla::to_string(*hint)));
  return d;
}

DType out_dtype_of(const View& out, DType q_dtype) {
  switch (out.elem) {
    case Elem::kBF16: return DType::kBF16;
    case Elem::kFP16: return DType::kFP16;
    case Elem::kFP32: return DType::kFP32;
    case Elem::kU16:
    case Elem::kI16: return q_dtype == DType::kFP16 ? DType::kFP16 : DType::kBF16;
    default:
      fail(out.name + " must be bf16 (uint16 bits in NumPy), fp16 or fp32 (CPU only) [T, H, 512]; got " +
           out.describe());
  }
}

DType src_dtype_of(const View& v, const DType* hint) {
  DType d;
  switch (v.elem) {
    case Elem::kBF16: d = DType::kBF16; break;
    case Elem::kFP16: d = DType::kFP16; break;
    case Elem::kU16:
    case Elem::kI16: d = (hint && *hint == DType::kFP16) ? DType::kFP16 : DType::kBF16; break;
    default:
      fail(v.name + " must be bf16 or fp16 (NumPy: uint16 bf16 bits or float16); got " + v.describe());
  }
  SMLA_CHECK(!hint || *hint == d,
             v.name + " holds " + v.describe() + " but src_dtype says " + std::string(smla::to_string(*hint)));
  return d;
}

RowView row_view(const View& kv, int64_t row_bytes_needed, const std::string& format_name) {
  const std::string form = "[num_rows, row] or [num_blocks, block_size, row] with row >= " +
                           std::to_string(row_bytes_needed) + " bytes for " + format_name;
  SMLA_CHECK(kv.ndim() == 2 || kv.ndim() == 3, kv.name + " must be " + form + "; got " + kv.describe());
  expect_inner_contiguous(kv, form);
  RowView r;
  r.base = kv.data;
  r.row_width_bytes = kv.shape.back() * kv.itemsize;
  SMLA_CHECK(r.row_width_bytes >= row_bytes_needed, kv.name + " must be " + form + "; got rows of " +
                                                        std::to_string(r.row_width_bytes) + " bytes (" +
                                                        kv.describe() + ")");
  if (kv.ndim() == 2) {
    r.num_rows = kv.shape[0];
    r.row_stride_bytes = kv.stride[0] * kv.itemsize;
    return r;
  }
  const int64_t nb = kv.shape[0], bs = kv.shape[1];
  SMLA_CHECK(bs >= 1 && bs <= (int64_t(1) << 30), kv.name + ": block_size must be >= 1; got " + kv.describe());
  r.block_size = int(bs);
  r.row_stride_bytes = kv.stride[1] * kv.itemsize;
  SMLA_CHECK(kv.stride[0] % kv.stride[1] == 0 && kv.stride[0] / kv.stride[1] >= bs,
             kv.name + ": the block stride (" + std::to_string(kv.stride[0]) +
                 " elements) must be a multiple of the row stride (" + std::to_string(kv.stride[1]) +
                 ") and span at least block_size rows");
  r.block_stride_rows = kv.stride[0] / kv.stride[1];
  r.num_rows = nb == 0 ? 0 : (nb - 1) * r.block_stride_rows + bs;
  return r;
}

}  // namespace smla::py
