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
      return t.bits == 16 ? Elem::kFP16 : t.bits == 32 ? Elem::kFP32 : t.bits == 64 ? Elem::kF64 : Elem::kOther;
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

// What dimension i of the named argument is called, for stride messages.
std::string dim_label(const std::string& name, int ndim, int i) {
  static const char* tok_head[] = {"token", "head", "feature"};
  static const char* tok_entry[] = {"token", "entry"};
  if ((name == "q" || name == "q_rope" || name == "out" || name == "lse") && i < 3)
    return std::string(tok_head[i]) + " stride (dim " + std::to_string(i) + ")";
  if ((name == "idx" || name == "positions" || name == "phys") && i < 2)
    return std::string(tok_entry[i]) + " stride (dim " + std::to_string(i) + ")";
  if ((name == "kv" || name == "cache") && ndim == 3 && i < 2)
    return std::string(i == 0 ? "block" : "row") + " stride (dim " + std::to_string(i) + ")";
  if ((name == "kv" || name == "cache") && ndim == 2 && i == 0) return "row stride (dim 0)";
  return "stride of dim " + std::to_string(i);
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
  for (int i = 0; i < v.ndim(); ++i)
    SMLA_CHECK(v.stride[i] >= 0, v.name + " has a negative " + dim_label(v.name, v.ndim(), i) + " of " +
                                     std::to_string(v.stride[i]) + " elements (a reversed view such as " + v.name +
                                     "[::-1]); pass a copy with non-negative strides (np.ascontiguousarray / "
                                     ".contiguous())");
  return v;
}

}  // namespace

std::string to_string(const Device& d) { return d.cuda ? "cuda:" + std::to_string(d.id) : "cpu"; }

std::string elem_name(Elem e) {
  switch (e) {
    case Elem::kBF16: return "bfloat16";
    case Elem::kFP16: return "float16";
    case Elem::kFP32: return "float32";
    case Elem::kF64: return "float64";
    case Elem::kU16: return "uint16";
    case Elem::kI16: return "int16";
    case Elem::kU8: return "uint8";
    case Elem::kI8: return "int8";
    case Elem::kE4M3: return "float8_e4m3fn";
    case Elem::kI32: return "int32";
    case Elem::kI64: return "int64";
    default: return "an unsupported dtype";  // float64, complex, bool, ...
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

namespace {
std::string hex(const void* p) {
  std::ostringstream o;
  o << p;
  return o.str();
}
bool extents_overlap(const View& a, const View& b) {
  const int64_t na = a.span_bytes(), nb = b.span_bytes();
  if (na == 0 || nb == 0 || !(a.device == b.device)) return false;
  const auto pa = reinterpret_cast<uintptr_t>(a.data), pb = reinterpret_cast<uintptr_t>(b.data);
  return pa < pb + uintptr_t(nb) && pb < pa + uintptr_t(na);
}
std::string extent(const View& v) {
  return "[" + hex(v.data) + ", +" + std::to_string(v.span_bytes()) + " bytes)";
}
}  // namespace

void expect_disjoint(const std::vector<const View*>& outs, const std::vector<const View*>& ins) {
  for (size_t i = 0; i < outs.size(); ++i) {
    if (!outs[i]) continue;
    const View& o = *outs[i];
    auto refuse = [&](const View& other, const char* role) {
      fail(o.name + " overlaps " + other.name + " (" + role + "): " + o.name + "'s bytes " + extent(o) + " and " +
           other.name + "'s " + extent(other) + " share memory; give " + o.name +
           " its own buffer (np.empty / torch.empty), outputs are written while inputs are read");
    };
    for (size_t j = i + 1; j < outs.size(); ++j)
      if (outs[j] && extents_overlap(o, *outs[j])) refuse(*outs[j], "another output");
    for (const View* in : ins)
      if (in && extents_overlap(o, *in)) refuse(*in, "an input");
  }
}

void expect_no_self_overlap(const View& v) {
  if (v.numel() <= 1) return;
  // Sort the dimensions of extent > 1 by stride; each must step past everything inside it.
  std::vector<int> dims;
  for (int i = 0; i < v.ndim(); ++i)
    if (v.shape[i] > 1) dims.push_back(i);
  std::sort(dims.begin(), dims.end(), [&](int a, int b) { return v.stride[a] < v.stride[b]; });
  int64_t inner = 1;  // elements spanned by the dimensions inside this one
  for (int d : dims) {
    SMLA_CHECK(v.stride[d] >= inner,
               v.name + " overlaps itself: " + dim_label(v.name, v.ndim(), d) + " is " + std::to_string(v.stride[d]) +
                   " elements but must be >= " + std::to_string(inner) + " (" + v.describe() + ", strides " +
                   shape_str(v.stride) + "); an output needs one element of memory per entry (np.empty / "
                   "torch.empty, not a broadcast or expanded view)");
    inner = v.stride[d] * (v.shape[d] - 1) + inner;
  }
}

void expect_cache_elem(const View& c, KvFormat format) {
  const bool bytes = c.itemsize == 1 && (c.elem == Elem::kU8 || c.elem == Elem::kI8 || c.elem == Elem::kE4M3);
  const bool bits16 = c.elem == Elem::kU16 || c.elem == Elem::kI16;
  bool ok = bytes;
  std::string want = "uint8 bytes";
  if (format == KvFormat::kBF16) {
    ok = ok || bits16 || c.elem == Elem::kBF16;
    want = "bfloat16, uint16 bf16 bits or uint8 bytes";
  } else if (format == KvFormat::kFP16) {
    ok = ok || bits16 || c.elem == Elem::kFP16;
    want = "float16, uint16 fp16 bits or uint8 bytes";
  }
  const std::string fmt(to_string(format));
  const std::string e = c.elem == Elem::kOther ? std::to_string(c.itemsize * 8) + "-bit" : elem_name(c.elem);
  SMLA_CHECK(ok, c.name + " holds " + e + " elements (" + c.describe() + ") but format " + fmt +
                     " stores " + fmt + " rows; pass the cache as " + want +
                     (format == KvFormat::kBF16 ? " (convert values with smla.bf16_bits or .to(torch.bfloat16))"
                                                : " (a byte view of the encoded rows: .view(np.uint8) / "
                                                  ".view(torch.uint8))"));
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
  // Rows must be distinct: a row stride below the row size (0 for np.broadcast_to / expand views)
  // would make every row read, or write, the same bytes.
  const int64_t row_dim = kv.ndim() - 2;
  const int64_t rs_bytes = kv.stride[row_dim] * kv.itemsize;
  SMLA_CHECK(kv.shape[row_dim] <= 1 || rs_bytes >= row_bytes_needed,
             kv.name + "'s row stride is " + std::to_string(rs_bytes) + " bytes but a " + format_name + " row is " +
                 std::to_string(row_bytes_needed) + " bytes (" + kv.describe() + ", strides " + shape_str(kv.stride) +
                 "); pass a cache whose rows are distinct memory (not a broadcast or expanded view)");
  if (kv.ndim() == 2) {
    r.num_rows = kv.shape[0];
    r.row_stride_bytes = kv.shape[0] <= 1 ? std::max(rs_bytes, row_bytes_needed) : rs_bytes;
    return r;
  }
  const int64_t nb = kv.shape[0], bs = kv.shape[1];
  SMLA_CHECK(bs >= 1 && bs <= (int64_t(1) << 30), kv.name + ": block_size must be >= 1; got " + kv.describe());
  r.block_size = int(bs);
  // make_view gave a size-1 row dimension the dense stride, so the row stride is never 0 here.
  r.row_stride_bytes = std::max(rs_bytes, row_bytes_needed);
  const int64_t row_stride = kv.stride[1];
  SMLA_CHECK(row_stride > 0 && kv.stride[0] % row_stride == 0 && (nb <= 1 || kv.stride[0] / row_stride >= bs),
             kv.name + "'s block stride (" + std::to_string(kv.stride[0]) +
                 " elements) must be a multiple of its row stride (" + std::to_string(row_stride) +
                 ") and span at least block_size = " + std::to_string(bs) + " rows (" + kv.describe() + ", strides " +
                 shape_str(kv.stride) + "); pass a cache whose blocks are distinct memory");
  r.block_stride_rows = kv.stride[0] / kv.stride[1];
  r.num_rows = nb == 0 ? 0 : (nb - 1) * r.block_stride_rows + bs;
  return r;
}

}  // namespace smla::py
