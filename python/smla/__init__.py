"""smla — sparse MLA attention (DeepSeek-V3.2 DSA) for serving engines.

Tensors come in through DLPack, zero-copy, from PyTorch, NumPy (host: the CPU reference backend)
or any other DLPack producer; CUDA arrays run on the SM90 CUDA backend. NumPy has no bfloat16, so
bf16 data is passed as uint16 bit patterns (``smla.bf16_bits`` makes them) or as
``ml_dtypes.bfloat16``. Quantized caches are uint8 bytes (or float8 tensors, passed as bytes).

Streams are explicit: ``stream=`` takes an integer cudaStream_t, a ``torch.cuda.Stream``, or None
(PyTorch's current stream for torch tensors, the legacy default stream otherwise).

Main entry points:

- :func:`sparse_mla` — one call; allocates ``out``/``lse`` when they are not given.
- :class:`Plan` — plan once per geometry, then :meth:`Plan.run` with caller-owned outputs and
  workspace: allocates nothing, legal inside CUDA-graph capture.
- :func:`write_cache`, :func:`convert_indices`, :func:`finish_empty_rows` — the serving kernels.
- :func:`merge_partials` — the context-parallel (DCP) merge of per-rank partial results.
- :func:`shardq_owner_rank`, :func:`shardq_layout`, :func:`shardq_max_tokens_per_rank` — ShardQ's token
  ownership and per-rank bound (the step itself is C++ / C: ``smla::dist::ShardQ``, ``smla_shardq_*``).
- :func:`support` — why a geometry cannot run ("" when it can).
- :func:`replay` / :func:`dump_layer` — run a dumped layer on any backend.

Errors raise :class:`SmlaError` (a ``ValueError``) carrying the C++ message;
:class:`UnsupportedError` (a subclass) when no backend here supports the request.
"""

import math
import os

import numpy as np

from . import _smla
from ._arrays import dl as _dl
from ._arrays import dtype_name as _dtype_name
from ._arrays import empty as _empty
from ._arrays import framework as _framework
from ._arrays import is_cuda as _is_cuda
from ._arrays import resolve_stream as _stream
from ._arrays import allocator as _allocator
from ._arrays import as_f32 as _f32
from ._arrays import as_int as _int
from ._arrays import check_ndim as _ndim
from ._arrays import dl_out as _dl_out
from ._arrays import narrow_int32 as _narrow_int32
from ._smla import (
    LATENT_DIM,
    ROPE_DIM,
    Schedule,
    SmlaError,
    UnsupportedError,
    built_with_cuda,
    cuda_device_count,
    cuda_device_info,
    reorder_batch_threshold,
    row_bytes,
    shardq_layout,
    shardq_max_tokens_per_rank,
    shardq_owner_rank,
)

__version__ = "0.1.0"

__all__ = [
    "LATENT_DIM", "ROPE_DIM", "FORMATS", "DEEPSEEK_V32_SOFTMAX_SCALE", "SmlaError", "UnsupportedError", "Plan",
    "Schedule", "sparse_mla", "write_cache", "convert_indices", "finish_empty_rows", "merge_partials", "support",
    "kernel_name", "kernel_for", "replay", "dump_layer", "encode_rows", "decode_rows", "bf16_bits", "bf16_to_float",
    "token_to_request", "reorder_batch_threshold", "owner_rank", "local_position", "shardq_owner_rank",
    "shardq_max_tokens_per_rank", "shardq_layout", "row_bytes", "built_with_cuda",
    "cuda_device_count", "cuda_device_info", "current_stream",
]

FORMATS = ("bf16", "fp16", "fp8_e4m3", "fp8_ds_mla", "nvfp4_ds_mla")
# DeepSeek-V3.2: 192^-0.5 * mscale^2 with mscale = 0.1 * ln(40) + 1 (DESIGN.md §1).
DEEPSEEK_V32_SOFTMAX_SCALE = 192**-0.5 * (0.1 * math.log(40) + 1) ** 2


def _lse_base(lse_base):
    if lse_base is None:
        return None
    b = str(lse_base)
    if b in ("e", "E"):
        return "e"
    if b in ("2", "2.0"):
        return "2"
    raise SmlaError(f'lse_base must be "e" or "2"; got {lse_base!r}')


def _split_q(q):
    """q or the (q_nope [T, H, 512], q_pe [T, H, 64]) pair; [T, H] of q."""
    if isinstance(q, (tuple, list)):
        if len(q) != 2:
            raise SmlaError("q must be one [T, H, D] tensor or the pair (q_nope [T, H, 512], q_pe [T, H, 64])")
        _ndim(q[0], "q", 3, "[T, H, 512] (the latent part of the (q_nope, q_pe) pair)")
        _ndim(q[1], "q_pe", 3, "[T, H, 64] (the RoPE part of the (q_nope, q_pe) pair)")
        return q[0], q[1]
    _ndim(q, "q", 3, "[T, H, 576] (or [T, H, 512] with rope_dim=0, or the pair (q_nope, q_pe))")
    return q, None


_SCALE_HINT = " (DeepSeek-V3.2: smla.DEEPSEEK_V32_SOFTMAX_SCALE)"


def _call(what, fn, *args, **kwargs):
    """fn(*args, **kwargs), with nanobind's refusal of an argument (a TypeError listing every
    overload) turned into one SmlaError line. The Python layer checks arguments first, so this is
    the backstop for array objects DLPack cannot carry."""
    try:
        return fn(*args, **kwargs)
    except TypeError as e:
        msg = str(e)
        if "incompatible function arguments" not in msg:
            raise
        invoked = next((ln.strip() for ln in msg.splitlines() if ln.strip().startswith("Invoked with")), "")
        raise SmlaError(f"{what}: an argument is not an array smla can take through DLPack ({invoked}); pass "
                        f"NumPy, PyTorch or CuPy arrays of the documented dtypes") from None


def _out_kind(q, out_dtype):
    if out_dtype is not None:
        k = {"bf16": "bf16", "bfloat16": "bf16", "fp16": "fp16", "float16": "fp16", "f32": "f32",
             "fp32": "f32", "float32": "f32"}.get(str(out_dtype).replace("torch.", ""))
        if k is None:
            raise SmlaError(f"out_dtype must be bf16, fp16 or f32; got {out_dtype!r}")
        return k
    return "fp16" if _dtype_name(q) == "fp16" else "bf16"


def current_stream(device=None):
    """PyTorch's current CUDA stream as an int handle (requires PyTorch)."""
    from .torch_ops import current_stream as cs

    return cs(device)


# ---------------------------------------------------------------------------------------------
# Attention


def sparse_mla(q, kv, idx, *, format, softmax_scale, counts=None, sink=None, q_scale=1.0, k_scale=1.0,
               rope_dim=64, lse_base="e", return_lse=True, out=None, lse=None, stream=None, q_dtype=None,
               out_dtype=None, workspace=None, score_precision="auto"):
    """Sparse MLA attention (DESIGN.md §1) in one call; returns ``(out, lse)``.

    q: [T, H, 512 + rope_dim] bf16/fp16 (e4m3 for the fp8_e4m3 and fp8_ds_mla caches), or the pair
       (q_nope [T, H, 512], q_pe [T, H, 64]) — no concatenating copy.
    kv: the cache, [num_rows, row] or [num_blocks, block_size, row] of any element type (uint8
        bytes for quantized formats); row r = block * block_stride_rows + offset, where
        block_stride_rows is the tensor's block stride in rows.
    idx: int32 [T, K] physical rows, -1 padded (invalid entries are skipped).
    counts: optional int32 [T] active lengths. sink: optional float32 [H] sink logits.
    lse_base: "e" or "2". return_lse=False skips the LSE (lse is then None).
    out / lse: optional outputs ([T, H, 512], float32 [T, H]); allocated with q's framework when
        None. out_dtype ("bf16", "fp16", "f32" — f32 on the CPU backend only) picks the dtype.
    q_dtype: "bf16" / "fp16" / "e4m3" when the array type is ambiguous (uint16 data means bf16
        unless q_dtype="fp16").
    stream: cudaStream_t int / torch.cuda.Stream / None (see the module docs).
    workspace: optional device byte buffer for split-K partials; allocated per call when needed.
    score_precision: "auto" (default), "bf16" or "fp8". "fp8": S = q·k on the fp8 tensor cores, for an
        e4m3 q with an fp8 cache only (LSE within ~1e-2 of the reference instead of 1e-3; docs/python.md);
        "auto" is "fp8" for an e4m3 q with an fp8 cache and "bf16" otherwise; "bf16" widens an e4m3 q exactly.
    """
    q_nope, q_pe = _split_q(q)
    T, H = int(q_nope.shape[0]), int(q_nope.shape[1])
    scale = _f32(softmax_scale, "softmax_scale", _SCALE_HINT)
    qs, ks = _f32(q_scale, "q_scale"), _f32(k_scale, "k_scale")
    rd = _int(rope_dim, "rope_dim")
    if out is None:
        out = _empty(q_nope, (T, H, LATENT_DIM), _out_kind(q_nope, out_dtype))
    if lse is None and return_lse:
        lse = _empty(q_nope, (T, H), "f32")
    base = _lse_base(lse_base) if lse is not None else None
    _call(
        "sparse_mla", _smla._sparse_mla, _dl(q_nope, "q"), _dl(q_pe, "q_pe"), _dl(kv, "kv"), _dl(idx, "idx"),
        _dl(counts, "counts"), _dl(sink, "sink"), _dl_out(out, "out"), _dl_out(lse, "lse"),
        format=str(format), softmax_scale=scale, q_scale=qs, k_scale=ks, rope_dim=rd, lse_base=base,
        q_dtype=None if q_dtype is None else str(q_dtype), score_precision=str(score_precision),
        workspace=_dl_out(workspace, "workspace"),
        stream=_stream(stream, q_nope), alloc=_allocator(q_nope) if _is_cuda(q_nope) else None)
    return out, lse


class Plan:
    """A plan for one geometry (DESIGN.md §4): made once, shared by layers and threads.

    Plan(num_heads, topk, *, rope_dim=64, format="bf16", q_dtype="bf16", lse_base="e" (None: no
    LSE), sink=False, score_precision="auto", max_rows=1, graph_sizes=(), batch_invariant=False,
    backend="cuda", device=0)

    score_precision="auto" (default) plans the fp8 score path for an e4m3 q with an fp8 cache and bf16
    otherwise (the plan's score_precision property reports "auto"); "bf16" / "fp8" choose it
    (docs/python.md).

    ``workspace_bytes`` is the scratch every run needs; the caller owns it. :meth:`run` checks
    the call against the plan (a geometry that was not planned raises, also during graph
    capture), allocates nothing and never synchronizes.
    """

    def __init__(self, num_heads, topk, *, rope_dim=64, format="bf16", q_dtype="bf16", lse_base="e", sink=False,
                 score_precision="auto", max_rows=1, graph_sizes=(), batch_invariant=False, backend="cuda",
                 device=0):
        i64 = (-(2**63), 2**63 - 1)
        self._plan = _smla._Plan(
            num_heads=_int(num_heads, "num_heads", what="the query head count (1 to 128)"),
            topk=_int(topk, "topk", what="the top-k capacity K (>= 1)"),
            rope_dim=_int(rope_dim, "rope_dim", what="64 or 0"),
            format=str(format), q_dtype=str(q_dtype), lse_base=_lse_base(lse_base), sink=bool(sink),
            score_precision=str(score_precision), max_rows=_int(max_rows, "max_rows", *i64, "the largest T of any run"),
            graph_sizes=[_int(g, "graph_sizes", *i64, "the engine's CUDA-graph batch sizes (<= max_rows)")
                         for g in graph_sizes],
            batch_invariant=bool(batch_invariant), backend=str(backend),
            device=_int(device, "device", what="a CUDA device ordinal"))

    def __getattr__(self, name):
        # workspace_bytes, schedules, schedule_for, num_heads, topk, rope_dim, format, q_dtype,
        # lse_base, sink, score_precision, max_rows, backend, device
        plan = self.__dict__.get("_plan")
        if plan is None:
            raise AttributeError(name)
        return getattr(plan, name)

    def __repr__(self):
        p = self._plan
        return (f"smla.Plan(num_heads={p.num_heads}, topk={p.topk}, rope_dim={p.rope_dim}, format={p.format!r}, "
                f"q_dtype={p.q_dtype!r}, lse_base={p.lse_base!r}, sink={p.sink}, "
                f"score_precision={p.score_precision!r}, max_rows={p.max_rows}, "
                f"backend={p.backend!r}, workspace_bytes={p.workspace_bytes})")

    def new_workspace(self, like):
        """A workspace buffer of workspace_bytes (at least 1 byte) made by like's framework on
        like's device. Allocate it once, at startup."""
        return _empty(like, (max(int(self._plan.workspace_bytes), 1),), "u8")

    def run(self, q, kv, idx, out, *, softmax_scale, counts=None, sink=None, lse=None, q_scale=1.0, k_scale=1.0,
            workspace=None, stream=None):
        """Runs the planned geometry into the caller's out (and lse when the plan has LSE on).
        q may be the (q_nope, q_pe) pair. Allocates nothing."""
        q_nope, q_pe = _split_q(q)
        _call(
            "Plan.run", self._plan.run, _dl(q_nope, "q"), _dl(kv, "kv"), _dl(idx, "idx"), _dl_out(out, "out"),
            softmax_scale=_f32(softmax_scale, "softmax_scale", _SCALE_HINT), q_rope=_dl(q_pe, "q_pe"),
            counts=_dl(counts, "counts"),
            sink=_dl(sink, "sink"), lse=_dl_out(lse, "lse"), q_scale=_f32(q_scale, "q_scale"),
            k_scale=_f32(k_scale, "k_scale"), workspace=_dl_out(workspace, "workspace"),
            stream=_stream(stream, q_nope))
        return out, lse

    def check(self, q, kv, idx, out, *, softmax_scale, counts=None, sink=None, lse=None, q_scale=1.0,
              k_scale=1.0, workspace=None):
        """Raises SmlaError when run() with these arguments would be refused; runs nothing."""
        q_nope, q_pe = _split_q(q)
        _call(
            "Plan.check", self._plan.check, _dl(q_nope, "q"), _dl(kv, "kv"), _dl(idx, "idx"), _dl_out(out, "out"),
            softmax_scale=_f32(softmax_scale, "softmax_scale", _SCALE_HINT), q_rope=_dl(q_pe, "q_pe"),
            counts=_dl(counts, "counts"),
            sink=_dl(sink, "sink"), lse=_dl_out(lse, "lse"), q_scale=_f32(q_scale, "q_scale"),
            k_scale=_f32(k_scale, "k_scale"), workspace=_dl_out(workspace, "workspace"))


# ---------------------------------------------------------------------------------------------
# Serving kernels


def write_cache(latent, rope, slot_mapping, cache, *, format, k_scale=1.0, block_size=None, src_dtype=None,
                stream=None):
    """Encodes new tokens into their cache rows (DESIGN.md §3), bit-identical on every backend.

    latent [N, 512] and rope [N, 64] (None for rope_dim = 0): bf16 (uint16 bits in NumPy) or fp16.
    slot_mapping [N] int32 (int64 is narrowed exactly: a slot outside int32 is past any cache and
    skipped, never wrapped into another slot): slot = block * block_size + offset; negative or past
    the cache: skipped. cache: [num_blocks, block_size, row] of any element type (uint8 for
    quantized formats) or [num_rows, row] (then block_size defaults to 1). Returns cache.
    """
    _call(
        "write_cache", _smla._write_cache, _dl(latent, "latent"), _dl(rope, "rope"),
        _dl(_narrow_int32(slot_mapping, "slot_mapping"), "slot_mapping"), _dl_out(cache, "cache"),
        format=str(format), k_scale=_f32(k_scale, "k_scale"),
        block_size=None if block_size is None else _int(block_size, "block_size", 1, 2**31 - 1, "a positive integer"),
        src_dtype=None if src_dtype is None else str(src_dtype), stream=_stream(stream, latent))
    return cache


def convert_indices(positions, block_table, *, block_size, block_stride_rows=None, req_of_token=None, phys=None,
                    counts=None, dcp_world=1, dcp_rank=0, dcp_interleave=1, stream=None):
    """Request-local top-k positions -> physical cache rows; returns ``(phys, counts)``.

    positions int32 [T, K] (-1 padded); block_table int32 [num_reqs, max_blocks];
    req_of_token int32 [T] (None: row t reads request t; int64 is narrowed exactly: a request
    outside int32 matches no request and its row comes back empty). phys[t] holds the valid rows compacted
    to the front, -1 after; counts[t] their number. block_stride_rows (default block_size) is the
    rows between blocks in the cache. With dcp_world > 1 only positions this rank owns are kept,
    at their local rows (DESIGN.md §5).
    """
    T, K = _ndim(positions, "positions", 2, "int32 [T, K] request-local positions, -1 padded")
    if phys is None:
        phys = _empty(positions, (T, K), "i32")
    if counts is None:
        counts = _empty(positions, (T,), "i32")
    pos32 = 2**31 - 1
    _call(
        "convert_indices", _smla._convert_indices, _dl(positions, "positions"), _dl(block_table, "block_table"),
        _dl_out(phys, "phys"), _dl_out(counts, "counts"),
        _dl(_narrow_int32(req_of_token, "req_of_token"), "req_of_token"),
        block_size=_int(block_size, "block_size", 1, pos32, "a positive integer"),
        block_stride_rows=None if block_stride_rows is None else _int(block_stride_rows, "block_stride_rows", 1,
                                                                      2**63 - 1, "a positive integer"),
        dcp_world=_int(dcp_world, "dcp_world", 1, pos32, "a positive integer"),
        dcp_rank=_int(dcp_rank, "dcp_rank", 0, pos32, "a rank in [0, dcp_world)"),
        dcp_interleave=_int(dcp_interleave, "dcp_interleave", 1, pos32, "a positive integer"),
        stream=_stream(stream, positions))
    return phys, counts


def finish_empty_rows(counts, out, lse=None, *, stream=None):
    """Rows with counts[t] <= 0 get out 0 and LSE -inf; no other row is touched. For engines that
    skip attention on such rows (sparse_mla itself already writes them so)."""
    _call("finish_empty_rows", _smla._finish_empty_rows, _dl(counts, "counts"), _dl_out(out, "out"),
          _dl_out(lse, "lse"), stream=_stream(stream, out))
    return out, lse


def merge_partials(outs, lses, out=None, lse=None):
    """Merges per-rank partial results of context parallelism (DESIGN.md §5): outs[w] [T, H, 512]
    and natural-log lses[w] [T, H] (NaN / +inf count as -inf). Returns ``(out, lse)``, float32;
    all-empty rows end as out 0, LSE -inf. NumPy arrays run the C++ merge; torch tensors (any
    device) the same rule in torch ops."""
    outs, lses = list(outs), list(lses)
    if not outs or len(outs) != len(lses):
        raise SmlaError("merge_partials needs one (out, lse) pair per rank")
    if _framework(outs[0]) == "torch":
        return _merge_partials_torch(outs, lses, out, lse)
    outs = [np.ascontiguousarray(o, dtype=np.float32) for o in outs]
    lses = [np.ascontiguousarray(x, dtype=np.float32) for x in lses]
    T, H = outs[0].shape[0], outs[0].shape[1]
    if out is None:
        out = np.empty((T, H, LATENT_DIM), np.float32)
    if lse is None:
        lse = np.empty((T, H), np.float32)
    _smla._merge_partials(outs, lses, out, lse)
    return out, lse


def _merge_partials_torch(outs, lses, out, lse):
    import torch

    L = torch.stack([x.float() for x in lses])  # [W, T, H]
    L = torch.where(torch.isnan(L) | (L == math.inf), torch.full_like(L, -math.inf), L)
    m = L.max(dim=0).values
    m = torch.where(m == -math.inf, torch.zeros_like(m), m)
    total = m + torch.log(torch.exp(L - m).sum(dim=0))
    w = torch.exp(L - total)
    w = torch.where(torch.isfinite(w), w, torch.zeros_like(w))
    merged = (w.unsqueeze(-1) * torch.stack([o.float() for o in outs])).sum(dim=0)
    if out is None:
        out = merged
    else:
        out.copy_(merged)
    if lse is None:
        lse = total
    else:
        lse.copy_(total)
    return out, lse


def owner_rank(i, world, interleave):
    """Context-parallel rank that owns request-local token position i (DESIGN.md §5)."""
    return (i // interleave) % world


def local_position(i, world, interleave):
    """Position of token i in its owner rank's local cache."""
    return (i // (world * interleave)) * interleave + i % interleave


# ---------------------------------------------------------------------------------------------
# Support checks


def support(num_heads=128, topk=2048, *, rope_dim=64, format="bf16", q_dtype="bf16", lse_base="e", sink=False,
            score_precision="auto", backend="cuda", device=0):
    """"" when `backend` ("cpu" / "cuda") can run this geometry here (on CUDA device `device`);
    otherwise one sentence that says what is unsupported and what to use instead."""
    return _smla._support(_int(num_heads, "num_heads"), _int(topk, "topk"), _int(rope_dim, "rope_dim"), str(format),
                          str(q_dtype), _lse_base(lse_base), bool(sink), str(score_precision), str(backend),
                          _int(device, "device"))


def kernel_name(num_heads=128, topk=2048, *, rope_dim=64, format="bf16", q_dtype="bf16"):
    """Name of the CUDA kernel that would run the geometry, or "" when there is none."""
    return _smla._kernel_name(_int(num_heads, "num_heads"), _int(topk, "topk"), _int(rope_dim, "rope_dim"),
                              str(format), str(q_dtype))


def kernel_for(num_heads=128, topk=2048, *, rope_dim=64, format="bf16", q_dtype="bf16", lse_base="e", sink=False,
               score_precision="auto", device=None):
    """The CUDA kernel and variant that would run the geometry, "sm90/sparse_mla/<format>_d<D>/<variant>"
    (e.g. ".../fp8_ds_mla_d576/h64.ws.q8" for an e4m3 q under score_precision="auto" or "fp8"); the kernel family alone
    (:func:`kernel_name`) when no variant runs it. device: a CUDA ordinal, or None for any SM90 GPU."""
    return _smla._kernel_for(_int(num_heads, "num_heads"), _int(topk, "topk"), _int(rope_dim, "rope_dim"),
                             str(format), str(q_dtype), _lse_base(lse_base), bool(sink), str(score_precision),
                             None if device is None else _int(device, "device", what="a CUDA device ordinal"))


# ---------------------------------------------------------------------------------------------
# Row codecs and NumPy helpers


def bf16_bits(x):
    """bf16 bit patterns (uint16) of float values: round to nearest even (NumPy has no bf16)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    u = x.view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(x)
    if nan.any():
        r[nan] = (u[nan] >> 16).astype(np.uint16) | 0x40
    return r


def bf16_to_float(bits):
    """float32 values of bf16 bit patterns (uint16, or ml_dtypes.bfloat16 / torch.bfloat16 data)."""
    if _framework(bits) == "torch":
        return bits.float()
    b = np.asarray(bits)
    if b.dtype.name == "bfloat16":
        return b.astype(np.float32)
    return (b.astype(np.uint32) << 16).view(np.float32)


def encode_rows(format, latent, rope=None, k_scale=1.0):
    """Rows of `format` (uint8 [N, row_bytes]) from float latent [N, 512] and rope [N, 64] (None:
    rope_dim = 0): smla's CPU encoder, the definition every writer matches."""
    latent = np.ascontiguousarray(latent, dtype=np.float32)
    rope = None if rope is None else np.ascontiguousarray(rope, dtype=np.float32)
    rows = np.empty((latent.shape[0], row_bytes(format, 0 if rope is None else ROPE_DIM)), np.uint8)
    _smla._encode_rows(str(format), latent, rope, float(k_scale), rows)
    return rows


def decode_rows(format, rows, rope_dim=64, k_scale=1.0):
    """Dequantized float32 [N, 512 + rope_dim] of uint8 rows [N, >= row_bytes]."""
    rows = np.asarray(rows)
    if rows.dtype != np.uint8:
        rows = np.ascontiguousarray(rows).view(np.uint8).reshape(rows.shape[0], -1)
    out = np.empty((rows.shape[0], LATENT_DIM + int(rope_dim)), np.float32)
    _smla._decode_rows(str(format), rows, int(rope_dim), float(k_scale), out)
    return out


def token_to_request(query_start_loc, num_tokens):
    """int32 [num_tokens] request of each token from cumulative offsets query_start_loc [R + 1]
    (tokens past the last request get -1). Host arrays."""
    qsl = np.ascontiguousarray(query_start_loc, dtype=np.int32)
    out = np.empty(int(num_tokens), np.int32)
    _smla._token_to_request(qsl, out)
    return out


# ---------------------------------------------------------------------------------------------
# Replay (DESIGN.md: `smla replay`)

_ST_NP = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16, "I32": np.int32, "I64": np.int64,
          "U8": np.uint8, "F8_E4M3": np.uint8, "I8": np.int8, "U16": np.uint16, "F64": np.float64}


def _st_to_numpy(entry):
    dtype, shape, raw = entry
    if dtype not in _ST_NP:
        raise SmlaError(f"safetensors dtype {dtype} has no NumPy mapping here")
    return np.frombuffer(raw, dtype=np.dtype(_ST_NP[dtype]).newbyteorder("<")).reshape(shape)


def replay(dump, *, backend="cpu", out_dtype="bf16", save=None):
    """Runs a dumped layer (a safetensors file: path or bytes; see smla/replay.h) on `backend`.
    Returns ``(tensors, metadata)``: numpy arrays "out" [T, H, 512] (bf16 as uint16 bits, or
    float32 with out_dtype="f32") and "lse" [T, H] float32. save: optional path to write the
    result as safetensors."""
    data = dump if isinstance(dump, (bytes, bytearray, memoryview)) else open(os.fspath(dump), "rb").read()
    tensors, meta = _smla._replay(bytes(data), str(backend), str(out_dtype))
    if save is not None:
        with open(os.fspath(save), "wb") as f:
            f.write(_smla._st_serialize(tensors, meta))
    return {k: _st_to_numpy(v) for k, v in tensors.items()}, dict(meta)


def _host(x):
    """(safetensors dtype name, contiguous host numpy array) of any array."""
    name = _dtype_name(x)
    if _framework(x) == "torch":
        import torch

        t = x.detach().cpu().contiguous()
        if name in ("bf16", "fp16", "u16"):
            a = t.view(torch.int16).numpy().view(np.uint16 if name != "fp16" else np.float16)
        elif name == "e4m3":
            a = t.view(torch.uint8).numpy()
        else:
            a = t.numpy()
    else:
        a = np.ascontiguousarray(x.get() if _framework(x) == "cupy" else x)
        if a.dtype.name == "bfloat16":
            a = a.view(np.uint16)
        elif a.dtype.name.startswith("float8"):
            a = a.view(np.uint8)
    st = {"bf16": "BF16", "u16": "BF16", "fp16": "F16", "f32": "F32", "i32": "I32", "u8": "U8",
          "e4m3": "F8_E4M3", "i64": "I64"}.get(name)
    if st is None:
        raise SmlaError(f"cannot dump an array of dtype {getattr(x, 'dtype', '?')}")
    return st, a


def dump_layer(path, q, kv, idx, *, format, softmax_scale, counts=None, sink=None, q_scale=1.0, k_scale=1.0,
               lse_base="e", rope_dim=64):
    """Writes one attention call as a replay dump (safetensors) that ``smla replay`` and
    :func:`replay` run. Arrays may live on any device (they are copied to the host). A paged
    cache [num_blocks, block_size, row] is written as its dense rows [num_blocks * block_size, row];
    q may be the (q_nope, q_pe) pair (written concatenated)."""
    q_nope, q_pe = _split_q(q)
    qt, qa = _host(q_nope)
    if q_pe is not None:
        _, pa = _host(q_pe)
        qa = np.concatenate([qa, pa], axis=-1)
    if qt == "U8":
        qt = "F8_E4M3"
    kt, ka = _host(kv)
    ka = ka.reshape(-1, ka.shape[-1])
    if format in ("bf16", "fp16"):
        kt = "BF16" if format == "bf16" else "F16"
    tensors = {"q": (qt, list(qa.shape), qa.tobytes()), "kv": (kt, list(ka.shape), ka.tobytes())}
    it, ia = _host(idx)
    tensors["idx"] = (it, list(ia.shape), ia.tobytes())
    if counts is not None:
        ct, ca = _host(counts)
        tensors["counts"] = (ct, list(ca.shape), ca.tobytes())
    if sink is not None:
        st, sa = _host(sink)
        tensors["sink"] = (st, list(sa.shape), sa.tobytes())
    meta = {"format": str(format), "softmax_scale": repr(float(softmax_scale)), "q_scale": repr(float(q_scale)),
            "k_scale": repr(float(k_scale)), "lse_base": _lse_base(lse_base) or "e", "rope_dim": str(int(rope_dim))}
    with open(os.fspath(path), "wb") as f:
        f.write(_smla._st_serialize(tensors, meta))


# HiSparse, the host-backed tiered cache (python/smla/tiered.py).
from .tiered import TieredCache, max_tiered_decode_batch  # noqa: E402

__all__ += ["TieredCache", "max_tiered_decode_batch"]
