"""An independent NumPy model of smla (DESIGN.md §1 and §3) and a pure-Python safetensors codec.

Written from the design text, not from the C++ sources: the point is that two implementations
of the same contract agree. Rounding is done by table search (nearest value of the format's
finite grid, ties to the even code), not by bit tricks.
"""

import json
import math
import struct

import numpy as np

LATENT = 512
FORMATS = ["bf16", "fp16", "fp8_e4m3", "fp8_ds_mla", "nvfp4_ds_mla"]

# ---------------------------------------------------------------------------------------------
# Scalar formats


def _e4m3_value(code):
    """Value of an OCP e4m3 ("fn") byte: bias 7, subnormals at exponent 0, S.1111.111 = NaN."""
    sign = -1.0 if code & 0x80 else 1.0
    e, m = (code >> 3) & 0xF, code & 0x7
    if e == 0xF and m == 0x7:
        return math.nan
    if e == 0:
        return sign * (m / 8.0) * 2.0**-6
    return sign * (1.0 + m / 8.0) * 2.0 ** (e - 7)


E4M3_TABLE = np.array([_e4m3_value(c) for c in range(256)], dtype=np.float64)
E4M3_POS = E4M3_TABLE[:0x7F]  # codes 0..0x7e: 0 .. 448, increasing
E2M1_POS = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])  # codes 0..7
E2M1_TABLE = np.concatenate([E2M1_POS, -E2M1_POS])  # nibble -> value (bit 3 = sign)


def _round_to_table(x, grid):
    """Code (index into the increasing non-negative grid) nearest to |x|, ties to the even
    code, saturating at the grid's last value. NaN maps to code 0."""
    a = np.abs(np.asarray(x, dtype=np.float64))
    a = np.where(np.isnan(a), 0.0, np.minimum(a, grid[-1]))
    hi = np.searchsorted(grid, a, side="left")  # grid[hi-1] < a <= grid[hi]
    hi = np.minimum(hi, len(grid) - 1)
    lo = np.maximum(hi - 1, 0)
    d_lo = a - grid[lo]
    d_hi = grid[hi] - a
    pick_hi = (d_hi < d_lo) | ((d_hi == d_lo) & (hi % 2 == 0))
    return np.where(pick_hi, hi, lo).astype(np.uint8)


def e4m3_encode(x):
    x = np.asarray(x, dtype=np.float32)
    code = _round_to_table(x, E4M3_POS)
    sign = np.where(np.signbit(x) & ~np.isnan(x), 0x80, 0).astype(np.uint8)
    return (code | sign).astype(np.uint8)


def e4m3_decode(b):
    return E4M3_TABLE[np.asarray(b, dtype=np.uint8)].astype(np.float32)


def e2m1_encode(x):
    """Nibbles (0..15) of e2m1 values: values 0, .5, 1, 1.5, 2, 3, 4, 6 with a sign bit 0x8."""
    x = np.asarray(x, dtype=np.float32)
    code = _round_to_table(x, E2M1_POS)
    sign = np.where(np.signbit(x) & ~np.isnan(x), 0x8, 0).astype(np.uint8)
    return (code | sign).astype(np.uint8)


def e2m1_decode(nib):
    return E2M1_TABLE[np.asarray(nib, dtype=np.uint8)].astype(np.float32)


def bf16_encode(x):
    """bf16 bits (uint16) of fp32 values: round to nearest even, finite overflow saturates."""
    x = np.asarray(x, dtype=np.float32)
    bits = x.view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint32)
    finite = np.isfinite(x)
    overflow = finite & ((rounded & 0x7FFF) == 0x7F80)
    rounded = np.where(overflow, (rounded & 0x8000) | 0x7F7F, rounded)
    return rounded.astype(np.uint16)


def bf16_decode(h):
    return (np.asarray(h, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def fp16_encode(x):
    x = np.asarray(x, dtype=np.float32)
    return np.clip(x, -65504.0, 65504.0).astype(np.float16)  # numpy casts round to nearest even


# ---------------------------------------------------------------------------------------------
# Writer scale conventions (DESIGN.md §3)


def ds_mla_tile_scale(amax):
    """max(2^ceil(log2(amax / 448)), 2^-126), with amax / 448 taken in fp32."""
    r = np.float32(amax) / np.float32(448.0)
    if not r > 0:
        return np.float32(2.0**-126)
    e = math.ceil(math.log2(float(r)))
    return np.float32(max(2.0**e, 2.0**-126))


def nvfp4_block_scale_code(amax):
    """e4m3 code of max(amax / 6, 2^-9), moved up one e4m3 step if rounding landed below."""
    t = max(float(np.float32(amax) / np.float32(6.0)), 2.0**-9)
    t = float(np.float32(t))
    code = int(e4m3_encode(np.float32(t)))
    if E4M3_TABLE[code] < t and code < 0x7E:
        code += 1
    return code


def nvfp4_scale_offset(s):
    return 320 + 8 * (s & 3) + (s >> 2)


# ---------------------------------------------------------------------------------------------
# Row codecs: latent [N, 512] fp32, rope [N, rope_dim] fp32


def row_bytes(fmt, rope_dim):
    d = LATENT + rope_dim
    return {"bf16": 2 * d, "fp16": 2 * d, "fp8_e4m3": d, "fp8_ds_mla": 656, "nvfp4_ds_mla": 352}[fmt]


def encode_rows(fmt, latent, rope, k_scale=1.0):
    """Encoded rows as uint8 [N, row_bytes]."""
    latent = np.asarray(latent, dtype=np.float32)
    n = latent.shape[0]
    rope_dim = rope.shape[1] if rope is not None else 0
    rope = np.asarray(rope, dtype=np.float32) if rope_dim else np.zeros((n, 0), np.float32)
    full = np.concatenate([latent, rope], axis=1)
    if fmt == "bf16":
        return bf16_encode(full).astype("<u2").view(np.uint8).reshape(n, -1)
    if fmt == "fp16":
        return fp16_encode(full).astype("<f2").view(np.uint8).reshape(n, -1)
    if fmt == "fp8_e4m3":
        return e4m3_encode(full / np.float32(k_scale))
    out = np.zeros((n, row_bytes(fmt, rope_dim)), np.uint8)
    if fmt == "fp8_ds_mla":
        for r in range(n):
            for tile in range(4):
                x = latent[r, 128 * tile : 128 * (tile + 1)]
                s = ds_mla_tile_scale(np.max(np.abs(x)))
                out[r, 128 * tile : 128 * (tile + 1)] = e4m3_encode(x / s)
                out[r, 512 + 4 * tile : 516 + 4 * tile] = np.frombuffer(struct.pack("<f", float(s)), np.uint8)
            if rope_dim:
                out[r, 528 : 528 + 2 * rope_dim] = bf16_encode(rope[r]).astype("<u2").view(np.uint8)
        return out
    if fmt == "nvfp4_ds_mla":
        for r in range(n):
            nibbles = np.zeros(LATENT, np.uint8)
            for blk in range(32):
                x = latent[r, 16 * blk : 16 * (blk + 1)]
                code = nvfp4_block_scale_code(np.max(np.abs(x)))
                out[r, nvfp4_scale_offset(blk)] = code
                nibbles[16 * blk : 16 * (blk + 1)] = e2m1_encode(x / np.float32(E4M3_TABLE[code]))
            out[r, :256] = nibbles[0::2] | (nibbles[1::2] << 4)  # low nibble = even element
            if rope_dim:
                out[r, 256 : 256 + rope_dim] = e4m3_encode(rope[r])
        return out
    raise ValueError(fmt)


def decode_rows(fmt, rows, rope_dim, k_scale=1.0):
    """Dequantized rows [N, 512 + rope_dim] fp32 from uint8 [N, row_bytes]."""
    rows = np.asarray(rows, dtype=np.uint8)
    n = rows.shape[0]
    d = LATENT + rope_dim
    if fmt == "bf16":
        return bf16_decode(rows[:, : 2 * d].copy().view("<u2"))
    if fmt == "fp16":
        return rows[:, : 2 * d].copy().view("<f2").astype(np.float32)
    if fmt == "fp8_e4m3":
        return e4m3_decode(rows[:, :d]) * np.float32(k_scale)
    out = np.zeros((n, d), np.float32)
    if fmt == "fp8_ds_mla":
        scales = rows[:, 512:528].copy().view("<f4")  # [N, 4]
        for tile in range(4):
            sl = slice(128 * tile, 128 * (tile + 1))
            out[:, sl] = e4m3_decode(rows[:, sl]) * scales[:, tile : tile + 1]
        if rope_dim:
            out[:, 512:] = bf16_decode(rows[:, 528 : 528 + 2 * rope_dim].copy().view("<u2"))
        return out
    if fmt == "nvfp4_ds_mla":
        packed = rows[:, :256]
        nib = np.empty((n, LATENT), np.uint8)
        nib[:, 0::2] = packed & 0xF
        nib[:, 1::2] = packed >> 4
        vals = e2m1_decode(nib)
        for blk in range(32):
            sf = e4m3_decode(rows[:, nvfp4_scale_offset(blk)])[:, None]
            out[:, 16 * blk : 16 * (blk + 1)] = vals[:, 16 * blk : 16 * (blk + 1)] * sf
        if rope_dim:
            out[:, 512:] = e4m3_decode(rows[:, 256 : 256 + rope_dim])
        return out
    raise ValueError(fmt)


# ---------------------------------------------------------------------------------------------
# Attention (DESIGN.md §1), float64


def sparse_mla(q, rows, idx, softmax_scale, q_scale=1.0, counts=None, sink=None, lse_base="e"):
    """q [T, H, D] float, rows [N, D] dequantized float, idx [T, K] int.
    Returns out [T, H, 512] float64 and lse [T, H] float64 (sink excluded)."""
    q = np.asarray(q, dtype=np.float64)
    rows = np.asarray(rows, dtype=np.float64)
    t_count, h_count, _ = q.shape
    n_rows = rows.shape[0]
    k_cap = idx.shape[1]
    scale = float(np.float32(softmax_scale)) * float(np.float32(q_scale))
    out = np.zeros((t_count, h_count, LATENT))
    lse = np.full((t_count, h_count), -np.inf)
    for t in range(t_count):
        n = k_cap if counts is None else int(counts[t])
        sel = idx[t, :n].astype(np.int64)
        sel = sel[(sel >= 0) & (sel < n_rows)]
        if sel.size == 0:
            continue
        k = rows[sel]  # [m, D]
        s = scale * (q[t] @ k.T)  # [H, m]
        mx = s.max(axis=1, keepdims=True)
        e = np.exp(s - mx)
        total = e.sum(axis=1)
        denom = total.copy()
        if sink is not None:
            denom += np.exp(np.asarray(sink, np.float64) - mx[:, 0])
        out[t] = (e / denom[:, None]) @ k[:, :LATENT]
        lse[t] = mx[:, 0] + np.log(total)
    if lse_base == "2":
        lse = lse * math.log2(math.e)
    return out, lse


# ---------------------------------------------------------------------------------------------
# safetensors

ST_ITEMSIZE = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "U16": 2, "I16": 2, "F16": 2,
               "BF16": 2, "U32": 4, "I32": 4, "F32": 4, "U64": 8, "I64": 8, "F64": 8}


def st_serialize(tensors, metadata=None):
    """tensors: {name: (dtype, shape, raw bytes)}. Returns the file image."""
    header = {}
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    blobs, offset = [], 0
    for name, (dtype, shape, raw) in tensors.items():
        raw = bytes(raw)
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + b"".join(blobs)


def st_parse(data):
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    base = 8 + n
    meta = header.pop("__metadata__", {})
    out = {}
    for name, info in header.items():
        b, e = info["data_offsets"]
        out[name] = (info["dtype"], tuple(info["shape"]), data[base + b : base + e])
    return out, meta


def st_array(entry):
    """numpy array of a parsed tensor (BF16 comes back as float32)."""
    dtype, shape, raw = entry
    if dtype == "BF16":
        return bf16_decode(np.frombuffer(raw, "<u2")).reshape(shape)
    np_type = {"F32": "<f4", "F16": "<f2", "I32": "<i4", "U8": "u1", "F8_E4M3": "u1", "I64": "<i8"}[dtype]
    return np.frombuffer(raw, np_type).reshape(shape)
