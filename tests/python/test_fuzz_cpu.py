"""Fuzz the Python binding on the CPU backend (issue #20): random shapes, element types, strides
(padded, zero, negative, non-contiguous inner), outputs overlapping inputs or each other. Every
case must end in exactly one of two ways:

- smla.SmlaError (one line), and always when the case is bad by construction (an output sharing
  memory with another array, a cache of the wrong element type, a broadcast or reversed array, an
  inner dimension that is not contiguous);
- the result equal, bit for bit, to the same call on dense copies of the inputs into fresh
  outputs, and (float32 outputs) within tolerance of the independent NumPy model smla_np.py.

Never a crash, never another exception type. Thousands of cases, bounded in time.
"""

import time

import numpy as np
import pytest

smla = pytest.importorskip("smla", reason="the smla package is not importable; run scripts/test or scripts/python-test")
import smla_np as ref  # noqa: E402

as_strided = np.lib.stride_tricks.as_strided

FORMATS = ("bf16", "fp16", "fp8_e4m3", "fp8_ds_mla", "nvfp4_ds_mla")
# element types a cache of each format may arrive as (bytes always; 16-bit bits for bf16 / fp16)
CACHE_OK = {"bf16": {"u1", "i1", "u2", "i2"}, "fp16": {"u1", "i1", "u2", "i2", "f2"}}
TIME_BUDGET_S = 3.0
MIN_CASES = 2000


def kind(dt):
    return np.dtype(dt).kind + str(np.dtype(dt).itemsize)


class Pools:
    """Encoded rows per (format, rope_dim), made once (valid rows: no NaN scales)."""

    def __init__(self, rng):
        self.rows = {}
        for fmt in FORMATS:
            for rd in (64, 0):
                lat = (rng.standard_normal((64, 512)) * 2).astype(np.float32)
                rope = (rng.standard_normal((64, 64)) * 2).astype(np.float32) if rd else None
                self.rows[fmt, rd] = smla.encode_rows(fmt, lat, rope, 0.5 if fmt == "fp8_e4m3" else 1.0)


def layout(rng, a, allow_bad=True):
    """a (dense) in a random memory layout with the same values. Returns (array, bad) where bad
    names why smla must refuse it (None: a layout smla takes)."""
    modes, weights = ["dense", "padded", "zero", "neg", "inner"], [0.4, 0.5, 0.04, 0.03, 0.03]
    mode = rng.choice(modes, p=weights) if allow_bad else rng.choice(modes[:2])
    if a.ndim == 0 or a.size == 0:
        return a.copy(), None
    if mode == "dense":
        return a.copy(), None
    if mode == "padded":
        pads = [int(rng.integers(0, 3)) for _ in range(a.ndim)]
        pads[-1] = 0 if rng.random() < 0.5 else pads[-1]
        base = np.zeros([n + p for n, p in zip(a.shape, pads)], a.dtype)
        v = base[tuple(slice(0, n) for n in a.shape)]
        v[...] = a
        return v, None
    if mode == "zero":
        d = int(rng.integers(0, a.ndim))
        if a.shape[d] <= 1:
            return a.copy(), None
        src = np.ascontiguousarray(np.take(a, [0], axis=d))
        strides = list(src.strides)
        strides[d] = 0
        v = as_strided(src, shape=a.shape, strides=strides, writeable=bool(rng.random() < 0.5))
        # an input may repeat memory along an outer dimension (the result is defined); the inner
        # dimension must be contiguous, and an output never repeats memory
        return v, "zero stride" if d == a.ndim - 1 else "zero outer stride"
    if mode == "neg":
        d = int(rng.integers(0, a.ndim))
        if a.shape[d] <= 1:
            return a.copy(), None
        v = np.flip(np.flip(a, d).copy(), d)
        return v, "negative stride"
    # inner: last dimension with stride 2
    if a.shape[-1] <= 1:
        return a.copy(), None
    base = np.zeros(a.shape[:-1] + (2 * a.shape[-1],), a.dtype)
    v = base[..., ::2]
    v[...] = a
    return v, "inner stride"


def make_case(rng, pools):
    fmt = FORMATS[rng.integers(0, len(FORMATS))]
    rd = 64 if rng.random() < 0.8 else 0
    D = 512 + rd
    T, H, K = int(rng.integers(0, 4)), int(rng.integers(1, 5)), int(rng.integers(1, 7))
    must_refuse = []
    rows_all = pools.rows[fmt, rd]
    rb = rows_all.shape[1]

    # --- kv: 2-D rows or a paged [nb, bs, W] cache, padded rows / blocks, any element type
    W = rb + (8 * int(rng.integers(0, 2)))  # row width in bytes (a wider row is allowed)
    paged = rng.random() < 0.5
    if paged:
        nb, bs, bpad = int(rng.integers(1, 4)), int(rng.integers(1, 5)), int(rng.integers(0, 2))
        base = np.zeros((nb, bs + bpad, W), np.uint8)
        n_valid = (nb - 1) * (bs + bpad) + bs
        flat = base.reshape(-1, W)
        pick = rng.integers(0, len(rows_all), flat.shape[0])
        flat[:, :rb] = rows_all[pick]
        kv_bytes = base[:, :bs, :]
        canon_rows = np.ascontiguousarray(flat[:n_valid])  # row r = block * (bs + bpad) + offset
    else:
        n_valid = int(rng.integers(1, 13))
        rpad = 8 * int(rng.integers(0, 2))
        base = np.zeros((n_valid, W + rpad), np.uint8)
        base[:, :rb] = rows_all[rng.integers(0, len(rows_all), n_valid)]
        kv_bytes = base[:, :W]
        canon_rows = np.ascontiguousarray(kv_bytes)
    good = {"bf16": [np.uint8, np.int8, np.uint16, np.int16], "fp16": [np.uint8, np.uint16, np.float16]}
    choices = good.get(fmt, [np.uint8, np.int8]) if rng.random() < 0.85 else [np.float16, np.float32, np.float64]
    kv_dt = choices[rng.integers(0, len(choices))]
    kv = kv_bytes.view(kv_dt)
    if kind(kv_dt) not in CACHE_OK.get(fmt, {"u1", "i1"}):
        must_refuse.append(f"kv {np.dtype(kv_dt).name} for {fmt}")
    r = rng.random()
    if r < 0.05:
        kv = as_strided(kv, shape=kv.shape, strides=(0,) + kv.strides[1:])
        if kv.shape[0] > 1:
            must_refuse.append("kv stride 0")
    elif r < 0.1 and kv.shape[0] > 1:
        kv = kv[::-1]
        must_refuse.append("kv reversed")

    # --- q
    fits = {"bf16": ["bf16"], "fp16": ["fp16"], "fp8_e4m3": ["bf16", "e4m3"], "fp8_ds_mla": ["bf16", "e4m3"],
            "nvfp4_ds_mla": ["bf16"]}[fmt]
    q_kind = rng.choice(fits) if rng.random() < 0.85 else rng.choice(["bf16", "fp16", "e4m3", "f32", "i32"])
    qf = rng.standard_normal((T, H, D)).astype(np.float32)
    if q_kind == "bf16":
        q0 = smla.bf16_bits(qf)
        q_val = smla.bf16_to_float(q0)
    elif q_kind == "fp16":
        q0 = qf.astype(np.float16)
        q_val = q0.astype(np.float32)
    elif q_kind == "e4m3":
        q0 = ref.e4m3_encode(qf).astype(np.uint8)
        q_val = ref.e4m3_decode(q0)
    else:
        q0 = qf if q_kind == "f32" else qf.astype(np.int32)
        q_val = None
        must_refuse.append(f"q {q_kind}")
    q, bad = layout(rng, q0)
    if bad and bad != "zero outer stride":
        must_refuse.append("q " + bad)

    # --- idx: int32 (int64 refused), valid rows, -1, out-of-range
    idx0 = rng.integers(-2, n_valid + 2, (T, K)).astype(np.int32)
    idx, bad = layout(rng, idx0)
    if bad and bad != "zero outer stride":
        must_refuse.append("idx " + bad)
    if rng.random() < 0.05:
        idx = idx.astype(np.int64)
        must_refuse.append("idx int64")

    counts = None
    if rng.random() < 0.3:
        counts = rng.integers(-1, K + 2, T).astype(np.int32)
    sink = None
    if rng.random() < 0.2:
        sink = rng.standard_normal(H).astype(np.float32)

    # --- outputs: fresh, in a random layout, or overlapping an input / each other
    out_dt = rng.choice(["f32", "u16", "f16" if q_kind == "fp16" and rng.random() < 0.9 else "u16"])
    out_np = {"f32": np.float32, "u16": np.uint16, "f16": np.float16}[out_dt]
    out, bad = layout(rng, np.zeros((T, H, 512), out_np))
    if bad:
        must_refuse.append("out " + bad)
    lse = np.zeros((T, H), np.float32) if rng.random() < 0.8 else None
    if lse is not None:
        lse, bad = layout(rng, lse)
        if bad:
            must_refuse.append("lse " + bad)
    r = rng.random()
    if r < 0.1 and T > 0 and lse is not None:  # lse inside out
        out = np.zeros((T, H, 512), np.float32)
        lse = as_strided(out, shape=(T, H), strides=(H * 2048, 4))
        out_dt = "f32"
        must_refuse.append("lse inside out")
    elif r < 0.15 and T > 0 and kv_bytes.size >= T * H * 1024 * 2:  # out inside the cache rows
        out = as_strided(kv_bytes, shape=(T, H, 1024), strides=(H * 1024, 1024, 1)).view(np.uint16)
        out_dt = "u16"
        must_refuse.append("out inside kv")
    elif r < 0.2 and T > 0 and lse is not None:  # lse inside q's memory
        if q.flags.c_contiguous and q.flags.writeable and q.nbytes >= T * H * 4:
            lse = q.reshape(-1).view(np.uint8)[: T * H * 4].view(np.float32).reshape(T, H)
            must_refuse.append("lse inside q")

    # bf16 / fp16 output must match a 16-bit q; u16 means q's type (f16 with an fp16 q)
    if out_dt == "f16" and q_kind != "fp16":
        must_refuse.append("fp16 out for a non-fp16 q")
    # combinations the backend refuses by geometry (fp16 q with bf16 cache, e4m3 q with bf16 ...)
    return dict(fmt=fmt, rd=rd, T=T, H=H, K=K, q=q, q_val=q_val, kv=kv, canon_rows=canon_rows, idx=idx,
                counts=counts, sink=sink, out=out, lse=lse, must_refuse=must_refuse, q_kind=q_kind)


def overlapping(c):
    """Names of output pairs whose extents overlap (what smla must refuse)."""
    outs = [("out", c["out"]), ("lse", c["lse"])]
    ins = [("q", c["q"]), ("kv", c["kv"]), ("idx", c["idx"]), ("counts", c["counts"]), ("sink", c["sink"])]
    hits = []
    for i, (n, o) in enumerate(outs):
        if o is None or o.size == 0:
            continue
        for m, x in outs[i + 1:] + ins:
            if x is not None and x.size and np.may_share_memory(o, x):
                hits.append(f"{n}/{m}")
    return hits


def run_case(c):
    smla.sparse_mla(c["q"], c["kv"], c["idx"], format=c["fmt"], softmax_scale=0.125, counts=c["counts"],
                    sink=c["sink"], rope_dim=c["rd"], out=c["out"], lse=c["lse"], return_lse=c["lse"] is not None)


def reference_case(c):
    """The same call on dense copies into fresh outputs."""
    q = np.ascontiguousarray(c["q"])
    out = np.zeros(c["out"].shape, c["out"].dtype)
    lse = None if c["lse"] is None else np.zeros(c["lse"].shape, np.float32)
    smla.sparse_mla(q, c["canon_rows"], np.ascontiguousarray(c["idx"]), format=c["fmt"], softmax_scale=0.125,
                    counts=c["counts"], sink=c["sink"], rope_dim=c["rd"], out=out, lse=lse,
                    return_lse=lse is not None)
    return out, lse


def same_bits(a, b):
    a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
    return a.shape == b.shape and np.array_equal(a.view(np.uint8), b.view(np.uint8))


def test_fuzz_sparse_mla_cpu():
    rng = np.random.default_rng(20)
    pools = Pools(rng)
    n = ok = refused = modeled = 0
    t0 = time.monotonic()
    while n < 20000 and (n < MIN_CASES or time.monotonic() - t0 < TIME_BUDGET_S):
        n += 1
        c = make_case(rng, pools)
        must = list(c["must_refuse"]) + overlapping(c)
        out_before = None if c["out"].size == 0 else np.array(c["out"], copy=True)
        try:
            run_case(c)
        except smla.SmlaError as e:
            refused += 1
            assert "\n" not in str(e), f"case {n}: multi-line error {e!r}"
            if must and out_before is not None and c["out"].flags.writeable and not overlapping(c):
                # refused before anything was written
                assert same_bits(c["out"], out_before), f"case {n}: refused after writing out ({e})"
            continue
        except Exception as e:  # noqa: BLE001 - the point of the test
            pytest.fail(f"case {n}: {type(e).__name__} instead of SmlaError: {e} (must_refuse={must})")
        assert not must, f"case {n}: accepted although {must}"
        ok += 1
        want_out, want_lse = reference_case(c)
        assert same_bits(c["out"], want_out), f"case {n}: out differs from the dense call"
        if c["lse"] is not None:
            assert same_bits(c["lse"], want_lse), f"case {n}: lse differs from the dense call"
        if c["out"].dtype == np.float32 and c["q_val"] is not None and c["T"] > 0:
            modeled += 1
            rows = ref.decode_rows(c["fmt"], c["canon_rows"].view(np.uint8)[:, :smla.row_bytes(c["fmt"], c["rd"])],
                                   c["rd"], 1.0)  # the run's k_scale
            counts = None if c["counts"] is None else np.clip(c["counts"], 0, c["K"])  # DESIGN.md §2
            qc = np.ascontiguousarray(c["q"])  # the values q holds (a broadcast view repeats q[0])
            q_val = {"bf16": lambda: smla.bf16_to_float(qc), "fp16": lambda: qc.astype(np.float32),
                     "e4m3": lambda: ref.e4m3_decode(qc)}[str(c["q_kind"])]()
            mo, ml = ref.sparse_mla(q_val, rows, np.asarray(c["idx"]), 0.125, counts=counts, sink=c["sink"])
            err = np.abs(c["out"] - mo).max()
            assert err <= 1e-4 * max(1.0, np.abs(mo).max()), f"case {n}: out off the NumPy model by {err}"
            if c["lse"] is not None:
                fin = np.isfinite(ml)
                assert np.array_equal(np.isneginf(c["lse"]), np.isneginf(ml)), f"case {n}: empty rows differ"
                assert np.allclose(c["lse"][fin], ml[fin], atol=1e-4, rtol=1e-5), f"case {n}: lse off the model"
    elapsed = time.monotonic() - t0
    print(f"fuzz: {n} cases in {elapsed:.1f} s: {ok} ran and matched ({modeled} against the NumPy model), "
          f"{refused} refused")
    assert n >= MIN_CASES
    assert ok >= n // 10 and refused >= n // 10, (ok, refused)  # both paths exercised


# ---------------------------------------------------------------------------------------------
# the cache writer: cache layouts and element types, int64 slots, sources overlapping the cache


def make_write_case(rng):
    fmt = FORMATS[rng.integers(0, len(FORMATS))]
    rd = 64 if rng.random() < 0.8 else 0
    rb = smla.row_bytes(fmt, rd)
    N = int(rng.integers(0, 5))
    must = []
    W = rb + 8 * int(rng.integers(0, 2))
    paged = rng.random() < 0.6
    if paged:
        nb, bs, bpad = int(rng.integers(1, 4)), int(rng.integers(1, 5)), int(rng.integers(0, 2))
        base = rng.integers(0, 256, (nb, bs + bpad, W)).astype(np.uint8)
        cache_bytes = base[:, :bs, :]
        n_valid, stride_rows, n_slots = (nb - 1) * (bs + bpad) + bs, bs + bpad, nb * bs
    else:
        n_valid = int(rng.integers(1, 9))
        base = rng.integers(0, 256, (n_valid, W)).astype(np.uint8)
        cache_bytes = base
        bs, stride_rows, n_slots = 1, 1, n_valid
    good = {"bf16": [np.uint8, np.int8, np.uint16, np.int16], "fp16": [np.uint8, np.uint16, np.float16]}
    choices = good.get(fmt, [np.uint8, np.int8]) if rng.random() < 0.85 else [np.float16, np.float32, np.float64]
    cdt = choices[rng.integers(0, len(choices))]
    cache = cache_bytes.view(cdt)
    if kind(cdt) not in CACHE_OK.get(fmt, {"u1", "i1"}):
        must.append(f"cache {np.dtype(cdt).name} for {fmt}")
    r = rng.random()
    if r < 0.05 and cache.shape[0] > 1:
        cache = as_strided(cache, shape=cache.shape, strides=(0,) + cache.strides[1:], writeable=True)
        must.append("cache stride 0")
    elif r < 0.08 and cache.ndim == 3 and cache.shape[1] > 1:
        cache = as_strided(cache, shape=cache.shape, strides=(cache.strides[0], 0, cache.strides[2]),
                           writeable=True)
        must.append("cache row stride 0")
    elif r < 0.11 and cache.shape[0] > 1:
        cache = cache[::-1]
        must.append("cache reversed")
    elif r < 0.14:
        cache = cache.copy() if rng.random() < 0.5 else cache
        cache.flags.writeable = False
        must.append("cache read-only")
    src16 = np.float16 if (fmt == "fp16") == (rng.random() < 0.9) else np.uint16
    lat = (rng.standard_normal((N, 512)) * 2).astype(np.float32)
    latent = lat.astype(np.float16) if src16 == np.float16 else smla.bf16_bits(lat)
    rope = None
    if rd:
        rp = (rng.standard_normal((N, 64)) * 2).astype(np.float32)
        rope = rp.astype(np.float16) if src16 == np.float16 else smla.bf16_bits(rp)
    latent, bad = layout(rng, latent, allow_bad=True)
    if bad and bad != "zero outer stride":
        must.append("latent " + bad)
    if rng.random() < 0.05 and N > 0 and base.nbytes >= N * 1024:
        latent = base.reshape(-1)[: N * 1024].view(np.uint16).reshape(N, 512)  # a view of the cache's memory
        if src16 == np.float16:
            latent = latent.view(np.float16)
    if np.may_share_memory(latent, cache):
        must.append("latent inside cache")
    # slots: in range, negative, past the cache, past int32 (int64 only)
    slots = rng.integers(-3, n_slots + 3, N)
    wide = rng.random() < 0.4
    if wide and N > 0:
        slots[rng.integers(0, N)] = rng.choice([2**32 + 1, -(2**32) + 2, 2**31, 2**63 - 1, -(2**63)])
    slots = slots.astype(np.int64 if wide else np.int32)
    return dict(fmt=fmt, rd=rd, N=N, base=base, cache=cache, latent=latent, rope=rope, slots=slots,
                bs=bs, stride_rows=stride_rows, n_valid=n_valid, paged=paged, must=must, W=W)


def test_fuzz_write_cache_cpu():
    rng = np.random.default_rng(21)
    n = ok = refused = 0
    t0 = time.monotonic()
    while n < 20000 and (n < 1000 or time.monotonic() - t0 < 2.0):
        n += 1
        c = make_write_case(rng)
        before = c["base"].copy()
        kw = dict(format=c["fmt"], k_scale=0.5 if c["fmt"] == "fp8_e4m3" else 1.0)
        if not c["paged"]:
            kw["block_size"] = 1
        try:
            smla.write_cache(c["latent"], c["rope"], c["slots"], c["cache"], **kw)
        except smla.SmlaError as e:
            refused += 1
            assert "\n" not in str(e), f"case {n}: multi-line error {e!r}"
            assert np.array_equal(c["base"], before), f"case {n}: refused after writing ({e})"
            continue
        except Exception as e:  # noqa: BLE001 - the point of the test
            pytest.fail(f"case {n}: {type(e).__name__} instead of SmlaError: {e} (must={c['must']})")
        assert not c["must"], f"case {n}: accepted although {c['must']}"
        ok += 1
        # the same tokens written into dense rows: physical row = block * block_stride_rows + offset
        # (DESIGN.md §2), a slot outside [0, rows) or outside int32 skipped
        want = before.copy()
        flat = want.reshape(-1, want.shape[-1])[: c["n_valid"], : c["W"]]
        dense = np.ascontiguousarray(flat)
        s = c["slots"].astype(np.int64)
        phys = np.where(s >= 0, (s // c["bs"]) * c["stride_rows"] + s % c["bs"], -1)
        phys = np.where((phys >= 0) & (phys < c["n_valid"]) & (s <= 2**31 - 1), phys, -1).astype(np.int32)
        lat = np.ascontiguousarray(c["latent"])
        smla.write_cache(lat, c["rope"], phys, dense, format=c["fmt"], k_scale=kw["k_scale"], block_size=1)
        flat[...] = dense
        assert np.array_equal(c["base"], want), f"case {n}: cache differs from the dense write"
    print(f"fuzz write_cache: {n} cases in {time.monotonic() - t0:.1f} s: {ok} written and matched, {refused} refused")
    assert ok >= n // 10 and refused >= n // 20, (ok, refused)


# ---------------------------------------------------------------------------------------------
# index conversion: layouts, int64 requests, outputs over the inputs


def test_fuzz_convert_indices_cpu():
    rng = np.random.default_rng(22)
    n = ok = refused = 0
    t0 = time.monotonic()
    while n < 20000 and (n < 1000 or time.monotonic() - t0 < 1.5):
        n += 1
        T, K, R, M, B = (int(rng.integers(0, 4)), int(rng.integers(1, 6)), int(rng.integers(1, 4)),
                         int(rng.integers(1, 4)), int(rng.choice([1, 4, 64])))
        must = []
        pos, bad = layout(rng, rng.integers(-2, M * B + 3, (T, K)).astype(np.int32))
        if bad and bad != "zero outer stride":
            must.append("positions " + bad)
        bt, bad = layout(rng, rng.integers(-1, 9, (R, M)).astype(np.int32))
        if bad and bad != "zero outer stride":
            must.append("block_table " + bad)
        req = None
        if rng.random() < 0.7:
            req = rng.integers(-1, R + 1, T)
            if rng.random() < 0.3 and T > 0:
                req[rng.integers(0, T)] = rng.choice([2**32, 2**32 + 1, -(2**40)])
                req = req.astype(np.int64)
            else:
                req = req.astype(np.int64 if rng.random() < 0.3 else np.int32)
        elif T > R:
            must.append("T > num_reqs without req_of_token")
        phys, bad = layout(rng, np.zeros((T, K), np.int32))
        if bad:
            must.append("phys " + bad)
        counts = np.zeros(T, np.int32)
        if rng.random() < 0.08 and T > 0 and pos.flags.writeable and pos.flags.c_contiguous:
            phys = pos  # in place
        if rng.random() < 0.05 and T > 0 and phys.flags.c_contiguous and phys.size >= T:
            counts = phys.reshape(-1)[:T]  # counts inside phys
        stride_rows = B + int(rng.integers(0, 3))
        for a, b in [(phys, pos), (phys, bt), (counts, pos), (counts, phys), (counts, bt)] + (
                [(phys, req), (counts, req)] if req is not None else []):
            if a.size and b.size and np.may_share_memory(a, b):
                must.append("an output overlaps")
        before = [np.array(x, copy=True) for x in (pos, bt)]
        try:
            smla.convert_indices(pos, bt, block_size=B, block_stride_rows=stride_rows, req_of_token=req, phys=phys,
                                 counts=counts)
        except smla.SmlaError as e:
            refused += 1
            assert "\n" not in str(e), f"case {n}: multi-line error {e!r}"
            assert all(np.array_equal(x, y) for x, y in zip((pos, bt), before)), f"case {n}: refused after writing"
            continue
        except Exception as e:  # noqa: BLE001 - the point of the test
            pytest.fail(f"case {n}: {type(e).__name__} instead of SmlaError: {e} (must={must})")
        assert not must, f"case {n}: accepted although {must}"
        ok += 1
        req32 = None
        if req is not None:
            r64 = np.asarray(req, np.int64)
            req32 = np.where((r64 >= -(2**31)) & (r64 < 2**31), r64, -1).astype(np.int32)  # no request
        want_phys, want_counts = smla.convert_indices(np.ascontiguousarray(before[0]), np.ascontiguousarray(before[1]),
                                                      block_size=B, block_stride_rows=stride_rows,
                                                      req_of_token=req32)
        assert np.array_equal(phys, want_phys) and np.array_equal(counts, want_counts), f"case {n}: differs"
    print(f"fuzz convert_indices: {n} cases in {time.monotonic() - t0:.1f} s: {ok} matched, {refused} refused")
    assert ok >= n // 10 and refused >= n // 20, (ok, refused)
