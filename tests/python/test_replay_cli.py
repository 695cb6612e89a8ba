"""`smla replay` against the independent NumPy model in smla_np.py.

Random dumps are written with the pure-Python safetensors writer, replayed on the CPU backend
with f32 output, and compared to the model (relative L2 on out, abs/rel on LSE, 1e-5).
SMLA_BIN names the binary (ctest sets it); otherwise build/bin/smla under the repo root.
"""

import math
import os
import pathlib
import struct
import subprocess

import numpy as np
import pytest

import smla_np as ref

REPO = pathlib.Path(__file__).resolve().parents[2]
SMLA_BIN = os.environ.get("SMLA_BIN") or str(REPO / "build" / "bin" / "smla")

if not os.environ.get("SMLA_BIN") and not os.path.exists(SMLA_BIN):
    pytest.skip(f"smla binary not found at {SMLA_BIN}; build it or set SMLA_BIN", allow_module_level=True)

TOL = 1e-5
DS_SCALE = float(np.float32(192**-0.5 * (0.1 * math.log(40) + 1) ** 2))


# ---------------------------------------------------------------------------------------------
# Dump construction


def make_case(fmt, seed, T=5, H=3, K=37, N=96, rope_dim=64, counts=False, sink=False, lse_base="e",
              q_e4m3=False, q_scale=1.0, k_scale=1.0, q_fp16=False, kv_dtype="U8", all_invalid_row=True,
              write_rope_meta=True, softmax_scale=DS_SCALE):
    """Returns (tensors, metadata, expected_out, expected_lse)."""
    rng = np.random.default_rng(seed)
    D = ref.LATENT + rope_dim

    # idx: valid rows, -1, other negatives and out-of-range ids; row 0 all invalid.
    idx = rng.integers(0, N, size=(T, K)).astype(np.int32)
    kind = rng.random((T, K))
    idx[kind < 0.08] = -1
    idx[(kind >= 0.08) & (kind < 0.14)] = -rng.integers(2, 10**6, size=int(((kind >= 0.08) & (kind < 0.14)).sum()))
    idx[(kind >= 0.14) & (kind < 0.20)] = N + rng.integers(0, 10**6, size=int(((kind >= 0.14) & (kind < 0.20)).sum()))
    if all_invalid_row:
        idx[0] = -1
    cnt = rng.integers(0, K + 1, size=T).astype(np.int32) if counts else None
    if counts:
        cnt[-1] = 0  # an empty row through counts

    # KV pool: selected rows random with varied magnitudes (one tile all zero); others NaN bytes.
    selected = np.zeros(N, bool)
    for t in range(T):
        n = K if cnt is None else cnt[t]
        s = idx[t, :n]
        selected[s[(s >= 0) & (s < N)]] = True
    mag = np.exp(rng.normal(0.0, 1.0, size=(N, 1))).astype(np.float32)
    latent = (rng.normal(size=(N, ref.LATENT)) * mag).astype(np.float32)
    latent[::7, 128:256] = 0.0
    rope = rng.normal(size=(N, rope_dim)).astype(np.float32) if rope_dim else None
    if fmt == "fp8_e4m3":
        latent *= np.float32(k_scale)
        if rope is not None:
            rope *= np.float32(k_scale)
        latent[1, :4] = np.float32(1000.0 * k_scale)  # saturates to 448 * k_scale
    rows = ref.encode_rows(fmt, latent, rope, k_scale)
    rows[~selected] = 0xFF  # NaN in every format: a replay that reads them fails
    deq = ref.decode_rows(fmt, rows, rope_dim, k_scale)

    # q
    qf = rng.normal(size=(T, H, D)).astype(np.float32)
    if q_e4m3:
        q_bytes = ref.e4m3_encode(qf / np.float32(q_scale))
        q_model = ref.e4m3_decode(q_bytes)
        q_tensor = ("F8_E4M3", (T, H, D), q_bytes.tobytes())
    elif q_fp16 or fmt == "fp16":
        q16 = ref.fp16_encode(qf)
        q_model = q16.astype(np.float32)
        q_tensor = ("F16", (T, H, D), q16.astype("<f2").tobytes())
    else:
        qb = ref.bf16_encode(qf)
        q_model = ref.bf16_decode(qb)
        q_tensor = ("BF16", (T, H, D), qb.astype("<u2").tobytes())

    if fmt in ("bf16", "fp16"):
        kv_tensor = ("BF16" if fmt == "bf16" else "F16", (N, D), rows.tobytes())
    else:
        kv_tensor = (kv_dtype, (N, rows.shape[1]), rows.tobytes())
    tensors = {"q": q_tensor, "kv": kv_tensor, "idx": ("I32", (T, K), idx.astype("<i4").tobytes())}
    if counts:
        tensors["counts"] = ("I32", (T,), cnt.astype("<i4").tobytes())
    sink_v = None
    if sink:
        sink_v = rng.normal(size=H).astype(np.float32)
        tensors["sink"] = ("F32", (H,), sink_v.astype("<f4").tobytes())

    meta = {"format": fmt, "softmax_scale": repr(float(np.float32(softmax_scale))), "lse_base": lse_base}
    if q_scale != 1.0:
        meta["q_scale"] = repr(float(np.float32(q_scale)))
    if k_scale != 1.0:
        meta["k_scale"] = repr(float(np.float32(k_scale)))
    if write_rope_meta:
        meta["rope_dim"] = str(rope_dim)

    out, lse = ref.sparse_mla(q_model, deq, idx, softmax_scale, q_scale, cnt, sink_v, lse_base)
    assert np.isfinite(out).all()
    return tensors, meta, out, lse


def run_replay(tmp_path, tensors, meta, extra=("--out-dtype", "f32"), name="dump"):
    dump = tmp_path / f"{name}.safetensors"
    result = tmp_path / f"{name}.out.safetensors"
    dump.write_bytes(ref.st_serialize(tensors, meta))
    proc = subprocess.run([SMLA_BIN, "replay", str(dump), "--backend", "cpu", "--out", str(result), *extra],
                          capture_output=True, text=True, timeout=300)
    return proc, result


def check_against_model(tmp_path, case, name="dump"):
    tensors, meta, want_out, want_lse = case
    proc, result = run_replay(tmp_path, tensors, meta, name=name)
    assert proc.returncode == 0, proc.stderr
    got, _ = ref.st_parse(result.read_bytes())
    assert got["out"][0] == "F32" and got["lse"][0] == "F32"
    out = ref.st_array(got["out"]).astype(np.float64)
    lse = ref.st_array(got["lse"]).astype(np.float64)
    assert out.shape == want_out.shape and lse.shape == want_lse.shape
    assert np.isfinite(out).all()
    den = np.linalg.norm(want_out)
    rel = np.linalg.norm(out - want_out) / (den if den > 0 else 1.0)
    assert rel <= TOL, f"out rel L2 {rel:.3g}"
    empty = np.isneginf(want_lse)
    assert np.array_equal(np.isneginf(lse), empty), "empty rows must give lse = -inf"
    assert (out[empty] == 0).all(), "empty rows must give out = 0"
    err = np.abs(lse[~empty] - want_lse[~empty]) / np.maximum(1.0, np.abs(want_lse[~empty]))
    assert err.size == 0 or err.max() <= TOL, f"lse err {err.max():.3g}"


# ---------------------------------------------------------------------------------------------
# Agreement with the model


@pytest.mark.parametrize("fmt", ref.FORMATS)
def test_formats_counts_sink(tmp_path, fmt):
    check_against_model(tmp_path, make_case(fmt, seed=11, counts=True, sink=True))


@pytest.mark.parametrize("fmt", ref.FORMATS)
def test_formats_no_rope_base2(tmp_path, fmt):
    check_against_model(tmp_path, make_case(fmt, seed=12, rope_dim=0, lse_base="2", K=64, H=5))


@pytest.mark.parametrize("fmt", ref.FORMATS)
def test_formats_plain(tmp_path, fmt):
    check_against_model(tmp_path, make_case(fmt, seed=13, T=3, H=1, K=5, N=20, write_rope_meta=False))


@pytest.mark.parametrize("kv_dtype", ["U8", "F8_E4M3"])
def test_fp8_e4m3_e4m3_q_with_scales(tmp_path, kv_dtype):
    case = make_case("fp8_e4m3", seed=14, q_e4m3=True, q_scale=0.0625, k_scale=0.37, counts=True,
                     sink=True, kv_dtype=kv_dtype)
    check_against_model(tmp_path, case)


@pytest.mark.parametrize("fmt", ["fp8_ds_mla", "nvfp4_ds_mla"])
def test_ds_mla_f8_kv_dtype_and_fp16_q(tmp_path, fmt):
    check_against_model(tmp_path, make_case(fmt, seed=15, kv_dtype="F8_E4M3", q_fp16=True, lse_base="2"))


def test_all_rows_invalid(tmp_path):
    tensors, meta, out, lse = make_case("bf16", seed=16, T=4, K=8)
    idx = np.array([[-1, -7, 96, 10**9, -(2**31), 2**31 - 1, -1, -1]] * 4, np.int32)
    tensors["idx"] = ("I32", (4, 8), idx.astype("<i4").tobytes())
    check_against_model(tmp_path, (tensors, meta, np.zeros_like(out), np.full_like(lse, -np.inf)))


def test_empty_problem(tmp_path):
    tensors, meta, _, _ = make_case("nvfp4_ds_mla", seed=17, T=1)
    tensors["q"] = (tensors["q"][0], (0, 3, 576), b"")
    tensors["idx"] = ("I32", (0, 37), b"")
    proc, result = run_replay(tmp_path, tensors, meta)
    assert proc.returncode == 0, proc.stderr
    got, _ = ref.st_parse(result.read_bytes())
    assert got["out"][1] == (0, 3, 512) and got["lse"][1] == (0, 3)


def test_default_output_dtypes(tmp_path):
    """Without --out-dtype: BF16 out for a bf16 q, F16 for an fp16 q (bf16-level tolerance)."""
    for fmt, q_fp16, want in [("bf16", False, "BF16"), ("fp16", True, "F16"), ("fp8_ds_mla", True, "F16")]:
        tensors, meta, want_out, want_lse = make_case(fmt, seed=18, q_fp16=q_fp16)
        proc, result = run_replay(tmp_path, tensors, meta, extra=(), name=fmt)
        assert proc.returncode == 0, proc.stderr
        got, meta_out = ref.st_parse(result.read_bytes())
        assert got["out"][0] == want and meta_out.get("format") == fmt
        out = ref.st_array(got["out"]).astype(np.float64)
        assert np.linalg.norm(out - want_out) <= 1e-2 * np.linalg.norm(want_out)


# ---------------------------------------------------------------------------------------------
# Encoder spot checks against DESIGN.md §3's conventions


def test_scalar_conventions():
    enc = lambda v: int(ref.e4m3_encode(np.float32(v)))
    assert enc(448.0) == 0x7E and enc(1e9) == 0x7E and enc(-np.inf) == 0xFE  # saturating, never NaN
    assert enc(2.0**-9) == 0x01 and enc(2.0**-10) == 0x00 and enc(3 * 2.0**-10) == 0x02  # ties to even
    assert enc(1.0625) == 0x38 and enc(1.1875) == 0x3A
    e2 = lambda v: int(ref.e2m1_encode(np.float32(v)))
    assert [e2(v) for v in (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 7.0, -0.75)] == [0, 2, 2, 4, 4, 6, 6, 7, 0xA]
    assert ref.ds_mla_tile_scale(448.0) == 1.0 and ref.ds_mla_tile_scale(449.0) == 2.0
    assert ref.ds_mla_tile_scale(0.0) == np.float32(2.0**-126) and ref.ds_mla_tile_scale(1e-40) == np.float32(2.0**-126)
    assert ref.nvfp4_block_scale_code(6.0) == 0x38  # sf = 1
    assert ref.nvfp4_block_scale_code(6.0 * 1.0625) == 0x39  # rounded down to 1.0 -> moved up to 1.125
    assert ref.nvfp4_block_scale_code(0.0) == 0x01  # 2^-9
    assert ref.nvfp4_block_scale_code(6000.0) == 0x7E  # never past 448
    assert int(ref.bf16_encode(np.float32(3.4e38))[()]) == 0x7F7F


def test_row_round_trip_layouts():
    rng = np.random.default_rng(3)
    latent = rng.normal(size=(2, 512)).astype(np.float32)
    rope = rng.normal(size=(2, 64)).astype(np.float32)
    for fmt in ref.FORMATS:
        for rd in (64, 0):
            rows = ref.encode_rows(fmt, latent, rope if rd else None)
            assert rows.shape == (2, ref.row_bytes(fmt, rd))
            deq = ref.decode_rows(fmt, rows, rd)
            assert np.linalg.norm(deq[:, :512] - latent) <= 0.2 * np.linalg.norm(latent)
            if rd == 0 and fmt in ("fp8_ds_mla", "nvfp4_ds_mla"):
                tail = rows[:, 528:] if fmt == "fp8_ds_mla" else rows[:, 256:320]
                assert (tail == 0).all()  # RoPE bytes stay zero without RoPE
    scales = ref.encode_rows("fp8_ds_mla", latent, rope)[:, 512:528].copy().view("<f4")
    assert (np.exp2(np.round(np.log2(scales))) == scales).all()  # powers of two


# ---------------------------------------------------------------------------------------------
# Errors: non-zero exit and one clear line


def expect_error(tmp_path, data, *words, name="bad"):
    path = tmp_path / f"{name}.safetensors"
    path.write_bytes(data)
    proc = subprocess.run([SMLA_BIN, "replay", str(path), "--out", str(tmp_path / "r.safetensors")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "error" in lines[0]
    for w in words:
        assert w in lines[0], lines[0]
    assert not (tmp_path / "r.safetensors").exists()
    return lines[0]


def test_truncated_files(tmp_path):
    tensors, meta, _, _ = make_case("fp8_ds_mla", seed=19)
    image = ref.st_serialize(tensors, meta)
    (n,) = struct.unpack("<Q", image[:8])
    for cut in (0, 5, 8, 8 + n // 2, 8 + n, len(image) - 1):
        expect_error(tmp_path, image[:cut], name=f"cut{cut}")


def test_malformed_headers(tmp_path):
    expect_error(tmp_path, struct.pack("<Q", 2**62) + b"{}", "header length", name="huge")
    expect_error(tmp_path, struct.pack("<Q", 8) + b"{not js}", "JSON", name="json")
    expect_error(tmp_path, struct.pack("<Q", 8) + b"[1,2,3] ", "object", name="array")
    hdr = b'{"q":{"dtype":"BF16","shape":[2],"data_offsets":[0,8]}}'
    expect_error(tmp_path, struct.pack("<Q", len(hdr)) + hdr + bytes(8), "'q'", name="size")
    hdr = b'{"q":{"dtype":"Q7","shape":[2],"data_offsets":[0,2]}}'
    expect_error(tmp_path, struct.pack("<Q", len(hdr)) + hdr + bytes(2), "Q7", name="dtype")


def test_wrong_dtype_and_metadata(tmp_path):
    tensors, meta, _, _ = make_case("bf16", seed=20)
    bad = dict(tensors)
    T, K = tensors["idx"][1]
    bad["idx"] = ("I64", (T, K), np.zeros((T, K), "<i8").tobytes())
    expect_error(tmp_path, ref.st_serialize(bad, meta), "'idx'", "I64", name="idx")
    bad = dict(tensors)
    bad["q"] = ("F32", tensors["q"][1], bytes(2 * len(tensors["q"][2])))
    expect_error(tmp_path, ref.st_serialize(bad, meta), "'q'", name="q")
    bad = dict(tensors)
    bad["sink"] = ("F32", (7,), bytes(28))
    expect_error(tmp_path, ref.st_serialize(bad, meta), "'sink'", name="sink")
    no_scale = {k: v for k, v in meta.items() if k != "softmax_scale"}
    expect_error(tmp_path, ref.st_serialize(tensors, no_scale), "softmax_scale", name="scale")
    expect_error(tmp_path, ref.st_serialize(tensors, dict(meta, format="fp8_ds_mla")), "'kv'", name="fmt")
    expect_error(tmp_path, ref.st_serialize(tensors, dict(meta, lse_base="10")), "lse_base", name="base")
