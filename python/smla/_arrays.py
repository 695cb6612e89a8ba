"""Array plumbing between Python frameworks and the C++ core.

Tensors cross into C++ through DLPack, zero-copy. This module only (a) gives the C++ side a
DLPack-ready object for each framework, (b) allocates outputs with the caller's own framework on
the convenience paths, and (c) resolves the CUDA stream. PyTorch and CuPy are imported lazily:
NumPy is the only hard dependency.
"""

import sys

import numpy as np

from ._smla import SmlaError

LATENT = 512

# dtype names the API uses ("bf16", "fp16", "f32", "i32", "u8") -> NumPy dtype. NumPy has no
# bfloat16: bf16 data travels as uint16 bits (or ml_dtypes.bfloat16 when the caller uses it).
_NP = {"bf16": np.uint16, "fp16": np.float16, "f32": np.float32, "i32": np.int32, "u8": np.uint8}


def framework(x):
    """'torch', 'numpy', 'cupy' or 'other' for an array object."""
    if isinstance(x, np.ndarray):
        return "numpy"
    mod = type(x).__module__.split(".")[0]
    if mod == "torch":
        return "torch"
    if mod == "cupy":
        return "cupy"
    return "other"


def _is_np_bf16(x):
    return isinstance(x, np.ndarray) and x.dtype.name == "bfloat16"


def _torch_dlpack(t):
    # A DLPack capsule without the producer-side stream synchronization that __dlpack__() with no
    # stream argument performs (it would make the legacy default stream wait, which breaks CUDA
    # graph capture). smla launches on the stream the caller names, so no sync is needed here.
    import torch

    t = t.detach()
    if t.dtype in _torch_byte_dtypes():
        t = t.view(torch.uint8)
    try:
        from torch.utils.dlpack import to_dlpack

        return to_dlpack(t)
    except (ImportError, AttributeError):  # pragma: no cover - future torch without to_dlpack
        return t.__dlpack__(stream=-1)


_BYTE_DTYPES = None


def _torch_byte_dtypes():
    # float8 tensors travel as their bytes (older DLPack has no float8 codes).
    global _BYTE_DTYPES
    if _BYTE_DTYPES is None:
        import torch

        names = ["float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "float8_e8m0fnu"]
        _BYTE_DTYPES = tuple(getattr(torch, n) for n in names if hasattr(torch, n))
    return _BYTE_DTYPES


def dl(x, name="an array"):
    """What the C++ functions accept for x: a DLPack producer or capsule (None stays None)."""
    if x is None:
        return None
    if isinstance(x, np.ndarray):
        if _is_np_bf16(x):
            x = x.view(np.uint16)
        elif x.dtype.kind == "V" or x.dtype.name.startswith("float8"):
            x = x.view(np.uint8)
        # DLPack counts strides in elements and wants aligned data; NumPy would refuse the export
        # (and nanobind then lists every overload) — say which array and how to fix it instead.
        item = x.dtype.itemsize
        if any(st % item for st in x.strides) or not x.flags.aligned:
            raise SmlaError(f"{name} has strides {list(x.strides)} bytes or a data address that are not multiples "
                            f"of its {item}-byte elements; pass np.ascontiguousarray({name})")
        return x
    if framework(x) == "torch":
        return _torch_dlpack(x)
    if not hasattr(x, "__dlpack__"):
        raise SmlaError(f"expected a DLPack array (NumPy, PyTorch, CuPy, ...); got {type(x).__name__}")
    return x


def dl_out(x, name):
    """dl(x) for an array smla writes: refuses read-only arrays with one line (nanobind's own
    refusal is a TypeError listing every overload)."""
    if x is None:
        return None
    flags = getattr(x, "flags", None)
    if isinstance(x, np.ndarray) and not x.flags.writeable or (
            not isinstance(x, np.ndarray) and framework(x) == "other" and flags is not None
            and getattr(flags, "writeable", True) is False):
        raise SmlaError(f"{name} is read-only (its writeable flag is off, e.g. np.broadcast_to or a frozen "
                        f"array); pass a writable array (np.empty(...) or {name}.copy())")
    return dl(x, name)


def check_ndim(x, name, ndim, form):
    """x.shape with exactly `ndim` dimensions, else one SmlaError line naming x and its form."""
    shape = getattr(x, "shape", None)
    if shape is None:
        raise SmlaError(f"{name} must be an array {form}; got {type(x).__name__}")
    if len(shape) != ndim:
        raise SmlaError(f"{name} must be {form}; got {dtype_label(x)}{list(int(d) for d in shape)} "
                        f"({len(shape)} dimension{'s' if len(shape) != 1 else ''})")
    return tuple(int(d) for d in shape)


def dtype_label(x):
    return str(getattr(x, "dtype", "?")).replace("torch.", "")


_I32_MIN, _I32_MAX = -(2**31), 2**31 - 1


def as_int(v, name, lo=_I32_MIN, hi=_I32_MAX, what="a smaller value"):
    """int(v) in [lo, hi] (the C++ integer it becomes), else one SmlaError line naming the argument
    (nanobind would raise a TypeError for a value that does not fit)."""
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
        if isinstance(v, (float, np.floating)) and float(v).is_integer():
            v = int(v)
        else:
            raise SmlaError(f"{name} must be an integer; got {v!r}")
    v = int(v)
    if not lo <= v <= hi:
        raise SmlaError(f"{name} = {v} does not fit the C++ integer it becomes ([{lo}, {hi}]); pass {what}")
    return v


_F32_MAX = float(np.finfo(np.float32).max)


def as_f32(v, name, example=""):
    """float(v), finite and representable as float32, else one SmlaError line naming the argument."""
    try:
        if isinstance(v, (str, bytes, bool)) or v is None:
            raise TypeError
        f = float(v)
    except (TypeError, ValueError):
        raise SmlaError(f"{name} must be a finite number{example}; got {v!r}") from None
    if f != f or f in (float("inf"), float("-inf")):
        raise SmlaError(f"{name} must be finite{example}; got {f!r}")
    if abs(f) > _F32_MAX:
        raise SmlaError(f"{name} = {f!r} is outside float32's range (|x| <= {_F32_MAX:.4g}); smla computes in "
                        f"float32, pass a smaller value{example}")
    return f


def narrow_int32(x, name):
    """An int64 index array as int32, exactly: values outside int32 become -1 (the "skip" / "no
    request" value), never another index (astype would wrap 2^32 + 5 to 5). Other dtypes pass
    through to the C++ check. No host synchronization for device tensors."""
    if x is None or dtype_name(x) != "i64":
        return x
    fw = framework(x)
    if fw == "torch":
        import torch

        ok = (x >= _I32_MIN) & (x <= _I32_MAX)
        return torch.where(ok, x, torch.full_like(x, -1)).to(torch.int32)
    if fw == "numpy":
        return np.where((x >= _I32_MIN) & (x <= _I32_MAX), x, -1).astype(np.int32)
    if fw == "cupy":
        import cupy

        return cupy.where((x >= _I32_MIN) & (x <= _I32_MAX), x, -1).astype(cupy.int32)
    raise SmlaError(f"{name} is int64 in a {type(x).__name__}; pass int32 (smla narrows int64 exactly only for "
                    f"NumPy, PyTorch and CuPy arrays)")


def is_cuda(x):
    """Whether x lives on a CUDA device (DLPack device type 2 or 13)."""
    if isinstance(x, np.ndarray):
        return False
    dev = getattr(x, "__dlpack_device__", None)
    if dev is None:
        return False
    return dev()[0] in (2, 13)


def dtype_name(x):
    """The API's dtype name of x's elements: bf16 / fp16 / f32 / i32 / i64 / u8 / e4m3 / u16 / other."""
    if framework(x) == "torch":
        import torch

        m = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "f32", torch.int32: "i32",
             torch.int64: "i64", torch.uint8: "u8", torch.int8: "u8", torch.int16: "u16"}
        if x.dtype in m:
            return m[x.dtype]
        return "e4m3" if x.dtype in _torch_byte_dtypes() else "other"
    dt = np.dtype(getattr(x, "dtype", np.float64))
    if dt.name == "bfloat16":
        return "bf16"
    if dt.name.startswith("float8"):
        return "e4m3"
    return {"float16": "fp16", "float32": "f32", "int32": "i32", "int64": "i64", "uint8": "u8", "int8": "u8",
            "uint16": "u16", "int16": "u16"}.get(dt.name, "other")


def empty(like, shape, kind):
    """An uninitialized array of `kind` ('bf16', 'fp16', 'f32', 'i32', 'u8') on like's device, made
    by like's framework."""
    fw = framework(like)
    if fw == "torch":
        import torch

        td = {"bf16": torch.bfloat16, "fp16": torch.float16, "f32": torch.float32, "i32": torch.int32,
              "u8": torch.uint8}[kind]
        return torch.empty(shape, dtype=td, device=like.device)
    if fw == "numpy":
        if kind == "bf16" and _is_np_bf16(like):
            return np.empty(shape, dtype=like.dtype)
        return np.empty(shape, dtype=_NP[kind])
    if fw == "cupy":
        import cupy

        with cupy.cuda.Device(like.device.id):
            return cupy.empty(shape, dtype=_NP[kind])
    raise SmlaError(f"cannot allocate outputs for a {type(like).__name__}; pass out= (and lse=) explicitly")


def allocator(like):
    """alloc(nbytes) -> DLPack byte buffer on like's device (the CUDA workspace of one call)."""
    return lambda nbytes: dl(empty(like, (int(nbytes),), "u8"))


def resolve_stream(stream, like):
    """The cudaStream_t handle (int) to launch on: an int as given, an object with .cuda_stream
    (torch.cuda.Stream) or .ptr (cupy), or for None PyTorch's current stream for torch CUDA
    tensors, CuPy's current stream for CuPy arrays, else 0 (the legacy default stream)."""
    if stream is None:
        if not is_cuda(like):
            return 0
        fw = framework(like)
        if fw == "torch":
            import torch

            return int(torch.cuda.current_stream(like.device).cuda_stream)
        if fw == "cupy":
            import cupy

            return int(cupy.cuda.get_current_stream().ptr)
        return 0
    if isinstance(stream, int):
        return stream
    for attr in ("cuda_stream", "ptr"):
        if hasattr(stream, attr):
            return int(getattr(stream, attr))
    raise SmlaError(f"stream must be an int cudaStream_t handle, a torch.cuda.Stream or None; got {stream!r}")


def torch_loaded():
    return "torch" in sys.modules
