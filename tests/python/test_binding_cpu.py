"""The smla Python package on the CPU backend (NumPy arrays), against the independent NumPy model
in smla_np.py: attention for every format, counts, sink, LSE base 2, rope_dim 0, the (q_nope, q_pe)
pair, the cache writers (bytes against smla's CPU encoder and the NumPy encoder), index conversion,
the DCP merge, support strings, Plan refusals and replay.

Skips when the package is not installed (pip install . or scripts/python-test).
"""

import math

import numpy as np
import pytest

smla = pytest.importorskip("smla", reason="the smla package is not installed; run scripts/python-test")
import smla_np as ref  # noqa: E402  (tests/python/smla_np.py, written from DESIGN.md alone)

DS_SCALE = smla.DEEPSEEK_V32_SOFTMAX_SCALE


def rel_l2(got, want):
    got = np.asarray(got, np.float64)
    want = np.asarray(want, np.float64)
    den = np.linalg.norm(want)
    return np.linalg.norm(got - want) / (den if den > 0 else 1.0)


def lse_diff(got, want):
    got = np.asarray(got, np.float64)
    want = np.asarray(want, np.float64)
    both_inf = np.isneginf(got) & np.isneginf(want)
    with np.errstate(invalid="ignore"):
        d = np.where(both_inf, 0.0, np.abs(got - want))
    return float(np.nan_to_num(d, nan=np.inf).max()) if d.size else 0.0


def random_idx(rng, T, K, N, all_invalid_row=True):
    """int32 [T, K] with valid rows, -1, other negatives, out-of-range ids and duplicates."""
    idx = rng.integers(0, N, size=(T, K)).astype(np.int32)
    kind = rng.random((T, K))
    idx[kind < 0.1] = -1
    idx[(kind >= 0.1) & (kind < 0.15)] = -7
    idx[(kind >= 0.15) & (kind < 0.2)] = N + 3
    if all_invalid_row and T > 1:
        idx[0] = -1
    return idx


def make_cache(rng, fmt, N, rope_dim=64, k_scale=1.0, block_size=16):
    """Writes N random tokens through smla.write_cache into a paged uint8 cache
    [num_blocks, block_size, row_bytes]; returns (cache, dequantized rows [num_rows, D] of the whole
    cache (unwritten rows are zero),
    source latent/rope floats)."""
    latent = (rng.standard_normal((N, 512)) * 2).astype(np.float32)
    rope = (rng.standard_normal((N, rope_dim)) * 2).astype(np.float32) if rope_dim else None
    src16 = fmt == "fp16"
    lat_in = latent.astype(np.float16) if src16 else smla.bf16_bits(latent)
    rope_in = None if rope is None else (rope.astype(np.float16) if src16 else smla.bf16_bits(rope))
    nb = (N + block_size - 1) // block_size
    rb = smla.row_bytes(fmt, rope_dim)
    cache = np.zeros((nb, block_size, rb), np.uint8)
    slots = np.arange(N, dtype=np.int32)
    smla.write_cache(lat_in, rope_in, slots, cache, format=fmt, k_scale=k_scale)
    deq = ref.decode_rows(fmt, cache.reshape(-1, rb), rope_dim, k_scale)  # every row the cache holds
    lat_f = lat_in.astype(np.float32) if src16 else smla.bf16_to_float(lat_in)
    rope_f = None if rope is None else (rope_in.astype(np.float32) if src16 else smla.bf16_to_float(rope_in))
    return cache, deq, lat_f, rope_f


def make_q(rng, T, H, D, dtype="bf16"):
    qf = rng.standard_normal((T, H, D)).astype(np.float32)
    if dtype == "fp16":
        q = qf.astype(np.float16)
        return q, q.astype(np.float32)
    q = smla.bf16_bits(qf)
    return q, smla.bf16_to_float(q)


# ---------------------------------------------------------------------------------------------
# attention


@pytest.mark.parametrize("fmt", ["bf16", "fp16", "fp8_e4m3", "fp8_ds_mla", "nvfp4_ds_mla"])
def test_sparse_mla_matches_numpy_model(fmt):
    rng = np.random.default_rng(1)
    T, H, K, N = 6, 5, 45, 70
    k_scale = 0.37 if fmt == "fp8_e4m3" else 1.0
    cache, rows, _, _ = make_cache(rng, fmt, N, k_scale=k_scale)
    q, qf = make_q(rng, T, H, 576, "fp16" if fmt == "fp16" else "bf16")
    idx = random_idx(rng, T, K, len(rows))
    out, lse = smla.sparse_mla(q, cache, idx, format=fmt, softmax_scale=DS_SCALE, k_scale=k_scale, out_dtype="f32")
    want_out, want_lse = ref.sparse_mla(qf, rows, idx, DS_SCALE)
    assert out.dtype == np.float32 and out.shape == (T, H, 512) and lse.shape == (T, H)
    assert rel_l2(out, want_out) < 1e-5
    assert lse_diff(lse, want_lse) < 1e-4
    assert np.all(out[0] == 0) and np.all(np.isneginf(lse[0]))  # the all-invalid row

    # default output dtype: bf16 bits (fp16 for an fp16 q), within DESIGN.md §8 tolerances
    out16, lse16 = smla.sparse_mla(q, cache, idx, format=fmt, softmax_scale=DS_SCALE, k_scale=k_scale)
    if fmt == "fp16":
        assert out16.dtype == np.float16
        got = out16.astype(np.float32)
    else:
        assert out16.dtype == np.uint16
        got = smla.bf16_to_float(out16)
    assert rel_l2(got, want_out) <= 1e-2
    assert lse_diff(lse16, want_lse) <= 1e-3


def test_bf16_cache_as_bf16_bits_flat_rows():
    """A bf16 cache given as uint16 [N, 576] (bf16 bits, not bytes) and a flat idx."""
    rng = np.random.default_rng(2)
    T, H, K, N = 4, 16, 64, 200
    kv = smla.bf16_bits(rng.standard_normal((N, 576)))
    q, qf = make_q(rng, T, H, 576)
    idx = random_idx(rng, T, K, N)
    out, lse = smla.sparse_mla(q, kv, idx, format="bf16", softmax_scale=0.1, out_dtype="f32")
    want_out, want_lse = ref.sparse_mla(qf, smla.bf16_to_float(kv), idx, 0.1)
    assert rel_l2(out, want_out) < 1e-5 and lse_diff(lse, want_lse) < 1e-4


def test_counts_sink_lse_base2():
    rng = np.random.default_rng(3)
    T, H, K, N = 7, 3, 33, 50
    cache, rows, _, _ = make_cache(rng, "fp8_ds_mla", N)
    q, qf = make_q(rng, T, H, 576)
    idx = random_idx(rng, T, K, len(rows), all_invalid_row=False)
    counts = rng.integers(0, K + 1, size=T).astype(np.int32)
    counts[2] = 0
    sink = rng.standard_normal(H).astype(np.float32)
    out, lse = smla.sparse_mla(q, cache, idx, format="fp8_ds_mla", softmax_scale=DS_SCALE, counts=counts, sink=sink,
                               lse_base="2", out_dtype="f32")
    want_out, want_lse = ref.sparse_mla(qf, rows, idx, DS_SCALE, counts=counts, sink=sink, lse_base="2")
    assert rel_l2(out, want_out) < 1e-5
    assert lse_diff(lse, want_lse) < 1e-4
    assert np.all(out[2] == 0) and np.all(np.isneginf(lse[2]))


def test_rope_dim_0():
    rng = np.random.default_rng(4)
    T, H, K, N = 3, 4, 20, 40
    for fmt in ["bf16", "fp8_ds_mla"]:
        cache, rows, _, _ = make_cache(rng, fmt, N, rope_dim=0)
        q, qf = make_q(rng, T, H, 512)
        idx = random_idx(rng, T, K, len(rows))
        out, lse = smla.sparse_mla(q, cache, idx, format=fmt, softmax_scale=0.2, rope_dim=0, out_dtype="f32")
        want_out, want_lse = ref.sparse_mla(qf, rows, idx, 0.2)
        assert rel_l2(out, want_out) < 1e-5 and lse_diff(lse, want_lse) < 1e-4


def test_q_pair_and_strided_views_equal_concatenated():
    rng = np.random.default_rng(5)
    T, H, K, N = 5, 6, 30, 64
    cache, rows, _, _ = make_cache(rng, "bf16", N)
    q, qf = make_q(rng, T, H, 576)
    idx = random_idx(rng, T, K, len(rows))
    full, full_lse = smla.sparse_mla(q, cache, idx, format="bf16", softmax_scale=DS_SCALE, out_dtype="f32")
    # the pair as views of a wider buffer (free head/token strides, no copy)
    big = np.zeros((T, H, 700), np.uint16)
    big[:, :, :576] = q
    pair = (big[:, :, :512], big[:, :, 512:576])
    out = np.full((T, H, 512), np.nan, np.float32)
    lse = np.full((T, H), np.nan, np.float32)
    r_out, r_lse = smla.sparse_mla(pair, cache, idx, format="bf16", softmax_scale=DS_SCALE, out=out, lse=lse)
    assert r_out is out and r_lse is lse
    np.testing.assert_array_equal(out, full)
    np.testing.assert_array_equal(lse, full_lse)
    # no LSE asked
    o2, l2 = smla.sparse_mla(q, cache, idx, format="bf16", softmax_scale=DS_SCALE, return_lse=False, out_dtype="f32")
    assert l2 is None
    np.testing.assert_array_equal(o2, full)


def test_paged_cache_with_block_stride_larger_than_block():
    """kv [num_blocks, block_size, row] as a view of a buffer whose blocks are further apart
    (hybrid layouts): physical row = block * block_stride_rows + offset."""
    rng = np.random.default_rng(6)
    nb, B, S = 5, 8, 12  # blocks, tokens per block, rows between blocks
    buf = np.full((nb, S, 1152), 0xFF, np.uint8)  # NaN bf16 bytes in the gaps
    vals = smla.bf16_bits(rng.standard_normal((nb, B, 576)))
    buf[:, :B, :] = vals.view(np.uint8)
    kv = buf[:, :B, :]
    T, H, K = 4, 2, 16
    offs = rng.integers(0, B, size=(T, K))
    blks = rng.integers(0, nb, size=(T, K))
    idx = (blks * S + offs).astype(np.int32)
    idx[:, -2] = 3 * S + B + 1  # a row in a gap: inside num_rows only by the block stride
    idx[:, -1] = -1
    q, qf = make_q(rng, T, H, 576)
    valid = idx[:, :-2]
    out, lse = smla.sparse_mla(q, kv, valid.copy(), format="bf16", softmax_scale=0.1, out_dtype="f32")
    flat = np.full((nb * S, 576), np.nan, np.float32)
    flat.reshape(nb, S, 576)[:, :B] = smla.bf16_to_float(vals)
    want_out, want_lse = ref.sparse_mla(qf, flat, valid, 0.1)
    assert rel_l2(out, want_out) < 1e-5 and lse_diff(lse, want_lse) < 1e-4


@pytest.mark.parametrize("fmt", ["fp8_e4m3", "fp8_ds_mla"])
def test_e4m3_q_with_q_scale(fmt):
    rng = np.random.default_rng(7)
    T, H, K, N, q_scale = 3, 4, 25, 40, 0.05
    k_scale = 0.2 if fmt == "fp8_e4m3" else 1.0
    cache, rows, _, _ = make_cache(rng, fmt, N, k_scale=k_scale)
    q8 = ref.e4m3_encode(rng.standard_normal((T, H, 576)) * 20)
    idx = random_idx(rng, T, K, len(rows))
    out, lse = smla.sparse_mla(q8, cache, idx, format=fmt, softmax_scale=DS_SCALE, q_scale=q_scale,
                               k_scale=k_scale, out_dtype="f32")
    want_out, want_lse = ref.sparse_mla(ref.e4m3_decode(q8), rows, idx, DS_SCALE, q_scale=q_scale)
    assert rel_l2(out, want_out) < 1e-5 and lse_diff(lse, want_lse) < 1e-4


def test_ml_dtypes_bfloat16():
    ml_dtypes = pytest.importorskip("ml_dtypes", reason="ml_dtypes is not installed")
    rng = np.random.default_rng(8)
    T, H, K, N = 2, 3, 10, 20
    kv = rng.standard_normal((N, 576)).astype(ml_dtypes.bfloat16)
    q = rng.standard_normal((T, H, 576)).astype(ml_dtypes.bfloat16)
    idx = random_idx(rng, T, K, N)
    out, lse = smla.sparse_mla(q, kv, idx, format="bf16", softmax_scale=0.1)
    assert out.dtype == q.dtype
    want_out, want_lse = ref.sparse_mla(q.astype(np.float32), kv.astype(np.float32), idx, 0.1)
    assert rel_l2(out.astype(np.float32), want_out) <= 1e-2 and lse_diff(lse, want_lse) <= 1e-3


def test_empty_call():
    q = np.zeros((0, 4, 576), np.uint16)
    out, lse = smla.sparse_mla(q, np.zeros((10, 1152), np.uint8), np.zeros((0, 8), np.int32), format="bf16",
                               softmax_scale=0.1)
    assert out.shape == (0, 4, 512) and lse.shape == (0, 4)


# ---------------------------------------------------------------------------------------------
# errors carry the C++ message


def test_argument_errors_raise_with_message():
    rng = np.random.default_rng(9)
    q = smla.bf16_bits(rng.standard_normal((2, 4, 576)))
    kv = np.zeros((16, 1152), np.uint8)
    idx = np.zeros((2, 8), np.int32)
    with pytest.raises(smla.SmlaError, match=r"idx must be int32 \[T, K\].*int64"):
        smla.sparse_mla(q, kv, idx.astype(np.int64), format="bf16", softmax_scale=0.1)
    with pytest.raises(ValueError, match=r"q must be bf16 or fp16.*float32"):
        smla.sparse_mla(q.astype(np.float32), kv, idx, format="bf16", softmax_scale=0.1)
    with pytest.raises(smla.SmlaError, match=r"kv must be .*1152 bytes"):
        smla.sparse_mla(q, kv[:, :1000], idx, format="bf16", softmax_scale=0.1)
    with pytest.raises(smla.SmlaError, match=r"unknown|fp9"):
        smla.sparse_mla(q, kv, idx, format="fp9", softmax_scale=0.1)
    with pytest.raises(smla.SmlaError, match=r"q must be \[T, H, 512\]"):
        smla.sparse_mla(q, kv, idx, format="bf16", softmax_scale=0.1, rope_dim=0)
    with pytest.raises(smla.SmlaError, match=r"fp16"):  # fp16 q with a bf16 cache
        smla.sparse_mla(q.view(np.float16), kv, idx, format="bf16", softmax_scale=0.1)
    with pytest.raises(smla.SmlaError, match=r"sink must be float32 \[H\]"):
        smla.sparse_mla(q, kv, idx, format="bf16", softmax_scale=0.1, sink=np.zeros(3, np.float32))
    with pytest.raises(smla.SmlaError, match=r"softmax_scale must be finite"):
        smla.sparse_mla(q, kv, idx, format="bf16", softmax_scale=math.inf)
    assert issubclass(smla.UnsupportedError, smla.SmlaError) and issubclass(smla.SmlaError, ValueError)


def test_plan_run_and_refusals():
    rng = np.random.default_rng(10)
    T, H, K, N = 5, 8, 40, 64
    cache, rows, _, _ = make_cache(rng, "bf16", N)
    q, qf = make_q(rng, T, H, 576)
    idx = random_idx(rng, T, K, len(rows))
    plan = smla.Plan(H, K, format="bf16", max_rows=8, graph_sizes=[3], backend="cpu")
    assert plan.workspace_bytes == 0 and plan.backend == "cpu" and plan.lse_base == "e"
    assert [s.bucket for s in plan.schedules] == [1, 2, 3, 4, 8]
    assert plan.schedule_for(5).bucket == 8
    out = np.full((T, H, 512), np.nan, np.float32)
    lse = np.full((T, H), np.nan, np.float32)
    plan.run(q, cache, idx, out, softmax_scale=DS_SCALE, lse=lse)
    want_out, want_lse = ref.sparse_mla(qf, rows, idx, DS_SCALE)
    assert rel_l2(out, want_out) < 1e-5 and lse_diff(lse, want_lse) < 1e-4
    plan.check(q, cache, idx, out, softmax_scale=DS_SCALE, lse=lse)

    with pytest.raises(smla.SmlaError, match=r"H = 4 but the plan was made for H = 8"):
        plan.run(q[:, :4], cache, idx, out[:, :4], softmax_scale=DS_SCALE, lse=lse[:, :4])
    wide = np.zeros((T, K + 1), np.int32)
    with pytest.raises(smla.SmlaError, match=r"K = 41 exceeds the planned capacity 40"):
        plan.run(q, cache, wide, out, softmax_scale=DS_SCALE, lse=lse)
    big_q = np.zeros((9, H, 576), np.uint16)
    with pytest.raises(smla.SmlaError, match=r"T = 9 exceeds the planned max_rows = 8"):
        plan.run(big_q, cache, np.zeros((9, K), np.int32), np.zeros((9, H, 512), np.float32), softmax_scale=0.1,
                 lse=np.zeros((9, H), np.float32))
    with pytest.raises(smla.SmlaError, match=r"LSE off but the plan was made for LSE base e"):
        plan.run(q, cache, idx, out, softmax_scale=DS_SCALE)
    with pytest.raises(smla.SmlaError, match=r"sink given but the plan was made with sink off"):
        plan.run(q, cache, idx, out, softmax_scale=DS_SCALE, lse=lse, sink=np.zeros(H, np.float32))
    # the format is the plan's: a cache of another format is refused by its row size
    with pytest.raises(smla.SmlaError, match=r"kv must be .*1152 bytes for bf16"):
        plan.run(q, np.zeros((N, 656), np.uint8), idx, out, softmax_scale=DS_SCALE, lse=lse)
    with pytest.raises(smla.SmlaError, match=r"out must be \[T, H, 512\]"):
        plan.run(q, cache, idx, out[:, :, :256], softmax_scale=DS_SCALE, lse=lse)
    with pytest.raises(smla.UnsupportedError, match=r"head size 608 is not supported"):
        smla.Plan(H, K, rope_dim=96, backend="cpu")
    with pytest.raises(smla.UnsupportedError, match=r"fp16 cache is not supported|fp16 q with a bf16"):
        smla.Plan(H, K, format="bf16", q_dtype="fp16", backend="cpu")


def test_plan_lse_off_and_base2():
    rng = np.random.default_rng(11)
    T, H, K, N = 3, 2, 12, 30
    cache, rows, _, _ = make_cache(rng, "bf16", N)
    q, qf = make_q(rng, T, H, 576)
    idx = random_idx(rng, T, K, len(rows))
    want_out, want_lse = ref.sparse_mla(qf, rows, idx, 0.3, lse_base="2")
    p_off = smla.Plan(H, K, lse_base=None, max_rows=T, backend="cpu")
    out = np.zeros((T, H, 512), np.float32)
    p_off.run(q, cache, idx, out, softmax_scale=0.3)
    assert rel_l2(out, want_out) < 1e-5
    with pytest.raises(smla.SmlaError, match=r"LSE base e but the plan was made for LSE off"):
        p_off.run(q, cache, idx, out, softmax_scale=0.3, lse=np.zeros((T, H), np.float32))
    p2 = smla.Plan(H, K, lse_base="2", max_rows=T, backend="cpu")
    lse = np.zeros((T, H), np.float32)
    p2.run(q, cache, idx, out, softmax_scale=0.3, lse=lse)
    assert lse_diff(lse, want_lse) < 1e-4


def test_plan_cuda_refused_without_device_or_on_host_arrays():
    if smla.cuda_device_count() == 0:
        with pytest.raises(smla.UnsupportedError, match=r"CUDA|cuda"):
            smla.Plan(16, 64, backend="cuda")
    else:
        plan = smla.Plan(16, 64, backend="cuda")
        q = np.zeros((1, 16, 576), np.uint16)
        with pytest.raises(smla.SmlaError, match=r"the plan runs on cuda:0 but the tensors are on cpu"):
            plan.run(q, np.zeros((4, 1152), np.uint8), np.zeros((1, 64), np.int32), np.zeros((1, 16, 512), np.uint16),
                     softmax_scale=0.1, lse=np.zeros((1, 16), np.float32))


# ---------------------------------------------------------------------------------------------
# cache writers


@pytest.mark.parametrize("fmt", ["bf16", "fp16", "fp8_e4m3", "fp8_ds_mla", "nvfp4_ds_mla"])
@pytest.mark.parametrize("rope_dim", [64, 0])
def test_cache_writer_bytes_equal_cpu_encoder(fmt, rope_dim):
    rng = np.random.default_rng(12)
    N, B, nb = 23, 4, 9
    k_scale = 0.5 if fmt == "fp8_e4m3" else 1.0
    latent = (rng.standard_normal((N, 512)) * rng.choice([1e-3, 1.0, 30.0], size=(N, 1))).astype(np.float32)
    latent[0] = 0.0  # all-zero tiles
    rope = (rng.standard_normal((N, rope_dim)) * 3).astype(np.float32) if rope_dim else None
    src16 = fmt == "fp16"
    lat_in = latent.astype(np.float16) if src16 else smla.bf16_bits(latent)
    rope_in = None if rope is None else (rope.astype(np.float16) if src16 else smla.bf16_bits(rope))
    lat_f = lat_in.astype(np.float32) if src16 else smla.bf16_to_float(lat_in)
    rope_f = None if rope is None else (rope_in.astype(np.float32) if src16 else smla.bf16_to_float(rope_in))
    rb = smla.row_bytes(fmt, rope_dim)
    slots = rng.permutation(nb * B)[:N].astype(np.int64)  # int64 like vLLM's slot_mapping
    slots[3] = -1  # skipped
    slots[5] = nb * B + 100  # past the cache: skipped
    cache = np.full((nb, B, rb), 0xAB, np.uint8)
    smla.write_cache(lat_in, rope_in, slots, cache, format=fmt, k_scale=k_scale)
    want = smla.encode_rows(fmt, lat_f, rope_f, k_scale)
    flat = cache.reshape(-1, rb)
    for i, s in enumerate(slots):
        if 0 <= s < nb * B:
            np.testing.assert_array_equal(flat[s], want[i], err_msg=f"token {i}")
    touched = {int(s) for s in slots if 0 <= s < nb * B}
    untouched = [r for r in range(nb * B) if r not in touched]
    assert np.all(flat[untouched] == 0xAB)
    # smla's CPU encoder agrees with the independent NumPy encoder, and decodes back the same way
    np.testing.assert_array_equal(want, ref.encode_rows(fmt, lat_f, rope_f, k_scale))
    np.testing.assert_array_equal(smla.decode_rows(fmt, want, rope_dim, k_scale),
                                  ref.decode_rows(fmt, want, rope_dim, k_scale))


@pytest.mark.parametrize("fmt", ["bf16", "fp16", "fp8_e4m3", "fp8_ds_mla", "nvfp4_ds_mla"])
def test_numpy_model_row_bytes_match_cpp_table(fmt):
    # smla_np keeps its own row sizes, written from DESIGN.md §3; the C++ row-layout table
    # (smla::row_layout, through row_bytes) must give the same.
    for rope_dim in (64, 0):
        assert smla.row_bytes(fmt, rope_dim) == ref.row_bytes(fmt, rope_dim), (fmt, rope_dim)


def test_cache_writer_errors():
    lat = np.zeros((2, 512), np.uint16)
    cache = np.zeros((4, 656), np.uint8)
    with pytest.raises(smla.SmlaError, match=r"slot_mapping must be int32"):
        smla.write_cache(lat, None, np.zeros(2, np.float32), cache, format="fp8_ds_mla")
    with pytest.raises(smla.SmlaError, match=r"rope must be \[N, 64\]"):
        smla.write_cache(lat, np.zeros((3, 64), np.uint16), np.zeros(2, np.int32), cache, format="fp8_ds_mla")
    with pytest.raises(smla.SmlaError, match=r"cache must be .*1152 bytes"):
        smla.write_cache(lat, np.zeros((2, 64), np.uint16), np.zeros(2, np.int32), cache, format="bf16")


# ---------------------------------------------------------------------------------------------
# index conversion


def convert_numpy(positions, block_table, req, B, S, world=1, rank=0, interleave=1):
    T, K = positions.shape
    phys = np.full((T, K), -1, np.int32)
    counts = np.zeros(T, np.int32)
    for t in range(T):
        r = t if req is None else req[t]
        n = 0
        for pos in positions[t]:
            if pos < 0:
                continue
            local = pos
            if world > 1:
                if (pos // interleave) % world != rank:
                    continue
                local = (pos // (world * interleave)) * interleave + pos % interleave
            blk = local // B
            if blk >= block_table.shape[1] or block_table[r, blk] < 0:
                continue
            phys[t, n] = block_table[r, blk] * S + local % B
            n += 1
        counts[t] = n
    return phys, counts


@pytest.mark.parametrize("world,interleave", [(1, 1), (2, 1), (4, 8)])
def test_convert_indices_matches_numpy(world, interleave):
    rng = np.random.default_rng(13)
    R, M, B, S, T, K = 3, 6, 16, 20, 7, 50
    block_table = rng.permutation(40)[: R * M].reshape(R, M).astype(np.int32)
    block_table[1, 4:] = -1
    req = rng.integers(0, R, size=T).astype(np.int32)
    positions = rng.integers(-3, M * B * world + 30, size=(T, K)).astype(np.int32)
    positions[0] = -1
    for rank in range(world):
        phys, counts = smla.convert_indices(positions, block_table, block_size=B, block_stride_rows=S,
                                            req_of_token=req, dcp_world=world, dcp_rank=rank,
                                            dcp_interleave=interleave)
        want_phys, want_counts = convert_numpy(positions, block_table, req, B, S, world, rank, interleave)
        np.testing.assert_array_equal(phys, want_phys)
        np.testing.assert_array_equal(counts, want_counts)
    # the documented example: B = 64, block stride 128, table {7, 3}: pos 70 -> 390
    phys, counts = smla.convert_indices(np.array([[70, -1]], np.int32), np.array([[7, 3]], np.int32), block_size=64,
                                        block_stride_rows=128)
    assert phys.tolist() == [[390, -1]] and counts.tolist() == [1]
    with pytest.raises(smla.SmlaError, match=r"pass req_of_token"):
        smla.convert_indices(positions, block_table, block_size=B)


# ---------------------------------------------------------------------------------------------
# DCP merge, empty rows, serving helpers


def merge_numpy(outs, lses):
    L = np.stack(lses).astype(np.float64)
    L = np.where(np.isnan(L) | (L == np.inf), -np.inf, L)
    m = L.max(axis=0)
    m = np.where(np.isneginf(m), 0.0, m)
    with np.errstate(divide="ignore", invalid="ignore"):
        total = m + np.log(np.exp(L - m).sum(axis=0))
        w = np.exp(L - total)
    w = np.where(np.isfinite(w), w, 0.0)
    return (w[..., None] * np.stack(outs)).sum(axis=0), total


def test_merge_partials():
    rng = np.random.default_rng(14)
    W, T, H = 3, 4, 5
    outs = [rng.standard_normal((T, H, 512)).astype(np.float32) for _ in range(W)]
    lses = [rng.standard_normal((T, H)).astype(np.float32) * 3 for _ in range(W)]
    lses[0][0, :] = -np.inf
    lses[1][0, :] = np.nan
    lses[2][0, :] = np.inf  # row 0: every part empty or broken
    lses[1][1, 2] = -np.inf
    out, lse = smla.merge_partials(outs, lses)
    want_out, want_lse = merge_numpy(outs, lses)
    assert np.all(out[0] == 0) and np.all(np.isneginf(lse[0]))
    assert rel_l2(out, want_out) < 1e-5 and lse_diff(lse, want_lse) < 1e-5


def test_dcp_shards_merge_to_the_unsharded_result():
    """Each rank converts the global top-k to its own rows, runs attention with LSE, and the merge
    equals the unsharded call."""
    rng = np.random.default_rng(15)
    W, I, B, T, H, K, L = 2, 4, 8, 3, 4, 40, 96  # ranks, interleave, block, rows, heads, top-k, request len
    lat = rng.standard_normal((L, 576)).astype(np.float32)
    q, _ = make_q(rng, T, H, 576)
    positions = rng.integers(-1, L, size=(T, K)).astype(np.int32)
    req = np.zeros(T, np.int32)
    # unsharded: one request, blocks 0..L/B-1 in order
    table = np.arange(L // B, dtype=np.int32)[None]
    kv = smla.bf16_bits(lat)
    phys, counts = smla.convert_indices(positions, table, block_size=B, req_of_token=req)
    full, full_lse = smla.sparse_mla(q, kv, phys, format="bf16", softmax_scale=0.1, counts=counts, out_dtype="f32")
    outs, lses = [], []
    for rank in range(W):
        mine = [i for i in range(L) if smla.owner_rank(i, W, I) == rank]
        local = np.zeros((len(mine), 576), np.float32)
        for i in mine:
            local[smla.local_position(i, W, I)] = lat[i]
        rtable = np.arange((len(mine) + B - 1) // B, dtype=np.int32)[None]
        pad = np.zeros((rtable.shape[1] * B, 576), np.float32)
        pad[: len(mine)] = local
        rphys, rcounts = smla.convert_indices(positions, rtable, block_size=B, req_of_token=req, dcp_world=W,
                                              dcp_rank=rank, dcp_interleave=I)
        o, lse = smla.sparse_mla(q, smla.bf16_bits(pad), rphys, format="bf16", softmax_scale=0.1, counts=rcounts,
                                 out_dtype="f32")
        outs.append(o)
        lses.append(lse)
    out, lse = smla.merge_partials(outs, lses)
    assert rel_l2(out, full) < 1e-5 and lse_diff(lse, full_lse) < 1e-4


def test_shardq_ownership_and_simulated_step():
    # The zigzag written from DESIGN.md §5b: 2W chunks of c = ceil(n / 2W), rank r owns chunks r and 2W-1-r.
    for W in range(1, 9):
        for n in range(0, 40):
            c = -(-n // (2 * W))
            for j in range(n):
                k = j // c
                assert smla.shardq_owner_rank(j, n, W) == (k if k < W else 2 * W - 1 - k)
    assert smla.shardq_layout([10], 2) == [[0, 1, 2, 9], [3, 4, 5, 6, 7, 8]]
    assert smla.shardq_max_tokens_per_rank(4096, 8, 1) == 514 and smla.shardq_max_tokens_per_rank(10, 8, 4) == 10
    with pytest.raises(smla.SmlaError, match="outside its request"):
        smla.shardq_owner_rank(5, 5, 2)
    # One step of W ranks on the CPU backend: each rank attends its tokens with all H heads; put back
    # in token order the outputs equal the unsharded call's bit for bit (rows are independent).
    rng = np.random.default_rng(5)
    W, H, K, L = 4, 8, 24, 50
    lens = [13, 1, 0, 3, 7]  # requests shorter than 2W, and an empty one
    T = sum(lens)
    kv = smla.bf16_bits(rng.standard_normal((L, 576)).astype(np.float32))
    q, _ = make_q(rng, T, H, 576)
    idx = rng.integers(-1, L, size=(T, K)).astype(np.int32)
    full, full_lse = smla.sparse_mla(q, kv, idx, format="bf16", softmax_scale=0.1, out_dtype="f32")
    out = np.full_like(full, np.nan)
    lse = np.full_like(full_lse, np.nan)
    layout = smla.shardq_layout(lens, W)
    assert sorted(t for toks in layout for t in toks) == list(range(T))
    for rank, toks in enumerate(layout):
        assert len(toks) <= smla.shardq_max_tokens_per_rank(T, W, len(lens))
        if toks:
            o, l = smla.sparse_mla(q[toks], kv, idx[toks], format="bf16", softmax_scale=0.1, out_dtype="f32")
            out[toks], lse[toks] = o, l
    assert np.array_equal(out, full) and np.array_equal(lse, full_lse)


def test_finish_empty_rows_host():
    T, H = 4, 3
    out = np.ones((T, H, 512), np.float32)
    lse = np.ones((T, H), np.float32)
    smla.finish_empty_rows(np.array([2, 0, 5, -1], np.int32), out, lse)
    assert np.all(out[[1, 3]] == 0) and np.all(np.isneginf(lse[[1, 3]]))
    assert np.all(out[[0, 2]] == 1) and np.all(lse[[0, 2]] == 1)


def test_serving_helpers():
    assert smla.token_to_request(np.array([0, 2, 2, 5]), 6).tolist() == [0, 0, 2, 2, 2, -1]
    assert [smla.reorder_batch_threshold(h) for h in (8, 64, 128, 7)] == [128, 256, 1024, 1024]
    assert smla.owner_rank(128, 2, 64) == 0 and smla.local_position(128, 2, 64) == 64


# ---------------------------------------------------------------------------------------------
# support checks


def test_support_strings():
    assert smla.support(128, 2048, backend="cpu") == ""
    for fmt in smla.FORMATS:
        q_dtype = "fp16" if fmt == "fp16" else "bf16"
        assert smla.support(64, 100, format=fmt, q_dtype=q_dtype, backend="cpu") == ""
    assert "use bf16 or fp16" in smla.support(16, 64, q_dtype="f32", backend="cpu")
    assert "cast q to bf16" in smla.support(16, 64, q_dtype="fp16", format="bf16", backend="cpu")
    assert "e4m3 q is only read with the fp8 caches" in smla.support(16, 64, q_dtype="e4m3", format="bf16",
                                                                          backend="cpu")
    assert "D = 576" in smla.support(16, 64, rope_dim=32, backend="cpu")
    cuda_reason = smla.support(16, 64, backend="cuda")
    if not smla.built_with_cuda():
        assert "no CUDA backend" in cuda_reason
    elif smla.cuda_device_count() == 0:
        assert "no CUDA device" in cuda_reason
    assert smla.kernel_name(64, 2048, format="bf16") == "sm90/sparse_mla/bf16_d576"
    assert smla.kernel_name(64, 2048, format="nvfp4_ds_mla") == "sm90/sparse_mla/nvfp4_ds_mla_d576"


# ---------------------------------------------------------------------------------------------
# score precision (the fp8 score path is a plan option: an e4m3 q with an fp8 cache only)


def _one_line(excinfo, *words):
    e = excinfo.value
    assert isinstance(e, smla.SmlaError), f"{type(e).__name__}: {e}"
    msg = str(e)
    assert "\n" not in msg, msg
    for w in words:
        assert w in msg, f"{w!r} not in {msg!r}"


def test_score_precision_is_a_plan_option():
    plan = smla.Plan(16, 64, backend="cpu")
    assert plan.score_precision == "auto"  # the default: fp8 for an e4m3 q with an fp8 cache, else bf16
    assert "score_precision='auto'" in repr(plan)
    assert smla.Plan(16, 64, score_precision="bf16", backend="cpu").score_precision == "bf16"
    # every entry point defaults to "auto"
    import inspect
    for fn in (smla.sparse_mla, smla.Plan.__init__, smla.support, smla.kernel_for):
        assert inspect.signature(fn).parameters["score_precision"].default == "auto", fn
    for fmt in ["fp8_e4m3", "fp8_ds_mla"]:
        p8 = smla.Plan(16, 64, format=fmt, q_dtype="e4m3", score_precision="fp8", backend="cpu")
        assert p8.score_precision == "fp8" and p8.format == fmt and p8.q_dtype == "e4m3"
        assert "score_precision='fp8'" in repr(p8)
        assert smla.support(16, 64, format=fmt, q_dtype="e4m3", score_precision="fp8", backend="cpu") == ""
        # an e4m3 q with bf16 scores stays supported (the q is widened to bf16), and auto too
        assert smla.Plan(16, 64, format=fmt, q_dtype="e4m3", score_precision="bf16",
                         backend="cpu").score_precision == "bf16"
        assert smla.Plan(16, 64, format=fmt, q_dtype="e4m3", backend="cpu").score_precision == "auto"
        assert smla.support(16, 64, format=fmt, q_dtype="e4m3", backend="cpu") == ""


@pytest.mark.parametrize("fmt,q_dtype", [("fp8_ds_mla", "bf16"), ("fp8_e4m3", "bf16"), ("bf16", "bf16"),
                                         ("fp16", "fp16"), ("nvfp4_ds_mla", "bf16")])
def test_fp8_scores_need_an_e4m3_q(fmt, q_dtype):
    reason = smla.support(16, 64, format=fmt, q_dtype=q_dtype, score_precision="fp8", backend="cpu")
    assert "score precision fp8 multiplies an e4m3 q with fp8 rows" in reason, reason
    assert f"a {q_dtype} q with a {fmt} cache" in reason and "use score precision bf16" in reason, reason
    assert "\n" not in reason
    with pytest.raises(smla.UnsupportedError) as ei:
        smla.Plan(16, 64, format=fmt, q_dtype=q_dtype, score_precision="fp8", backend="cpu")
    _one_line(ei, reason)
    # the one-call path makes the same plan and is refused the same way
    rng = np.random.default_rng(31)
    cache, rows, _, _ = make_cache(rng, fmt, 20)
    q, _ = make_q(rng, 2, 16, 576, q_dtype)
    idx = random_idx(rng, 2, 64, len(rows))
    with pytest.raises(smla.UnsupportedError) as ei:
        smla.sparse_mla(q, cache, idx, format=fmt, softmax_scale=DS_SCALE, score_precision="fp8")
    _one_line(ei, "score precision fp8 multiplies an e4m3 q")
    # an e4m3 q with a cache that is not fp8 is refused before the score precision is looked at
    if fmt not in ("fp8_e4m3", "fp8_ds_mla"):
        assert "e4m3 q is only read with the fp8 caches" in smla.support(
            16, 64, format=fmt, q_dtype="e4m3", score_precision="fp8", backend="cpu")


@pytest.mark.parametrize("bad", ["fp16", "FP8", "", "e4m3", 8])
def test_invalid_score_precision_is_one_line(bad):
    words = ("score_precision", '"auto"', '"bf16"', '"fp8"', f'"{bad}"')
    with pytest.raises(smla.SmlaError) as ei:
        smla.Plan(16, 64, format="fp8_ds_mla", q_dtype="e4m3", score_precision=bad, backend="cpu")
    _one_line(ei, *words)
    with pytest.raises(smla.SmlaError) as ei:
        smla.support(16, 64, score_precision=bad, backend="cpu")
    _one_line(ei, *words)
    with pytest.raises(smla.SmlaError) as ei:
        smla.kernel_for(16, 64, score_precision=bad)
    _one_line(ei, *words)
    rng = np.random.default_rng(32)
    cache, rows, _, _ = make_cache(rng, "fp8_ds_mla", 20)
    q8 = ref.e4m3_encode(rng.standard_normal((2, 16, 576)))
    with pytest.raises(smla.SmlaError) as ei:
        smla.sparse_mla(q8, cache, random_idx(rng, 2, 64, len(rows)), format="fp8_ds_mla", softmax_scale=DS_SCALE,
                        score_precision=bad)
    _one_line(ei, *words)


@pytest.mark.parametrize("fmt", ["fp8_e4m3", "fp8_ds_mla"])
def test_cpu_fp8_scores_equal_bf16_scores(fmt):
    # The CPU reference accepts score_precision="fp8" and sums every product in float64 whatever
    # it says: the fp8 plan's result is the bf16 plan's, bit for bit, and both are the reference.
    rng = np.random.default_rng(33)
    T, H, K, N, q_scale = 5, 8, 40, 60, 0.05
    k_scale = 0.3 if fmt == "fp8_e4m3" else 1.0
    cache, rows, _, _ = make_cache(rng, fmt, N, k_scale=k_scale)
    q8 = ref.e4m3_encode(rng.standard_normal((T, H, 576)) * 20)
    idx = random_idx(rng, T, K, len(rows))
    counts = rng.integers(0, K + 1, size=T).astype(np.int32)
    results = {}
    for sp in ["bf16", "fp8", "auto"]:
        plan = smla.Plan(H, K, format=fmt, q_dtype="e4m3", score_precision=sp, max_rows=T, backend="cpu")
        out = np.full((T, H, 512), np.nan, np.float32)
        lse = np.full((T, H), np.nan, np.float32)
        plan.check(q8, cache, idx, out, softmax_scale=DS_SCALE, counts=counts, lse=lse, q_scale=q_scale,
                   k_scale=k_scale)
        plan.run(q8, cache, idx, out, softmax_scale=DS_SCALE, counts=counts, lse=lse, q_scale=q_scale,
                 k_scale=k_scale)
        results[sp] = (out, lse)
    np.testing.assert_array_equal(results["fp8"][0], results["bf16"][0])
    np.testing.assert_array_equal(results["fp8"][1], results["bf16"][1])
    np.testing.assert_array_equal(results["auto"][0], results["bf16"][0])
    np.testing.assert_array_equal(results["auto"][1], results["bf16"][1])
    want_out, want_lse = ref.sparse_mla(ref.e4m3_decode(q8), rows, idx, DS_SCALE, q_scale=q_scale, counts=counts)
    assert rel_l2(results["fp8"][0], want_out) < 1e-5 and lse_diff(results["fp8"][1], want_lse) < 1e-4
    # the one-call path takes the keyword too, with the same result
    out1, lse1 = smla.sparse_mla(q8, cache, idx, format=fmt, softmax_scale=DS_SCALE, counts=counts,
                                 q_scale=q_scale, k_scale=k_scale, out_dtype="f32", score_precision="fp8")
    np.testing.assert_array_equal(out1, results["bf16"][0])
    np.testing.assert_array_equal(lse1, results["bf16"][1])


def test_kernel_for_names_the_score_variant():
    base = "sm90/sparse_mla/fp8_ds_mla_d576"
    assert smla.kernel_for(64, 2048, format="fp8_ds_mla", q_dtype="e4m3", score_precision="fp8") == base + "/h64.ws.q8"
    # the default (auto) resolves: an e4m3 q with an fp8 cache gets fp8 scores, bf16 on request
    assert smla.kernel_for(64, 2048, format="fp8_ds_mla", q_dtype="e4m3") == base + "/h64.ws.q8"
    assert smla.kernel_for(64, 2048, format="fp8_ds_mla", q_dtype="e4m3", score_precision="auto") == base + "/h64.ws.q8"
    assert smla.kernel_for(64, 2048, format="fp8_ds_mla", q_dtype="e4m3", score_precision="bf16") == base + "/h64.ws"
    assert smla.kernel_for(64, 2048, format="fp8_e4m3", q_dtype="e4m3") == "sm90/sparse_mla/fp8_e4m3_d576/h64.ws.q8"
    assert smla.kernel_for(64, 2048, format="fp8_ds_mla") == base + "/h64.ws"  # a bf16 q: auto is bf16
    assert smla.kernel_for(64, 2048, format="fp8_e4m3", q_dtype="e4m3",
                           score_precision="fp8") == "sm90/sparse_mla/fp8_e4m3_d576/h64.ws.q8"
    assert smla.kernel_for(64, 2048, format="bf16") == "sm90/sparse_mla/bf16_d576/h64.ws"
    # H <= 16 with bf16 scores: the swap-AB kernel for the fp8 caches (fp8_e4m3 since session 12) and
    # nvfp4_ds_mla (session 12); auto keeps fp8_e4m3's e4m3 q on fp8 scores
    assert smla.kernel_for(16, 2048, format="fp8_ds_mla").endswith("/swapab")
    assert smla.kernel_for(16, 2048, format="fp8_e4m3").endswith("/swapab")
    assert smla.kernel_for(16, 2048, format="fp8_e4m3", q_dtype="e4m3", score_precision="bf16").endswith("/swapab")
    assert smla.kernel_for(16, 2048, format="fp8_e4m3", q_dtype="e4m3").endswith("/h64.ws.q8")
    assert smla.kernel_for(16, 2048, format="nvfp4_ds_mla").endswith("/swapab")
    # 17 <= H <= 32: swapab at N = 32 for fp8_ds_mla and fp8_e4m3 (session 14); nvfp4_ds_mla stays on h64.ws
    for h in (17, 24, 32):
        assert smla.kernel_for(h, 2048, format="fp8_ds_mla").endswith("/swapab")
        assert smla.kernel_for(h, 2048, format="fp8_ds_mla", q_dtype="e4m3").endswith("/swapab")
        assert smla.kernel_for(h, 2048, format="fp8_e4m3").endswith("/swapab")
        assert smla.kernel_for(h, 2048, format="fp8_e4m3", q_dtype="e4m3").endswith("/h64.ws.q8")
        assert smla.kernel_for(h, 2048, format="nvfp4_ds_mla").endswith("/h64.ws")
    assert smla.kernel_for(33, 2048, format="fp8_ds_mla").endswith("/h64.ws")
    assert smla.kernel_for(33, 2048, format="fp8_e4m3").endswith("/h64.ws")
    # no variant computes fp8 scores from a bf16 q: the kernel family alone
    assert smla.kernel_for(64, 2048, format="fp8_ds_mla", score_precision="fp8") == base
    assert smla.kernel_name(64, 2048, format="fp8_ds_mla", q_dtype="e4m3") == base


# ---------------------------------------------------------------------------------------------
# replay


def test_dump_and_replay(tmp_path):
    rng = np.random.default_rng(16)
    T, H, K, N = 4, 3, 20, 40
    cache, rows, _, _ = make_cache(rng, "fp8_ds_mla", N)
    q, qf = make_q(rng, T, H, 576)
    idx = random_idx(rng, T, K, len(rows))
    counts = np.array([20, 3, 0, 11], np.int32)
    sink = rng.standard_normal(H).astype(np.float32)
    path = tmp_path / "layer.safetensors"
    smla.dump_layer(path, q, cache, idx, format="fp8_ds_mla", softmax_scale=DS_SCALE, counts=counts, sink=sink,
                    lse_base="2")
    res_path = tmp_path / "result.safetensors"
    tensors, meta = smla.replay(path, out_dtype="f32", save=res_path)
    want_out, want_lse = smla.sparse_mla(q, cache, idx, format="fp8_ds_mla", softmax_scale=DS_SCALE, counts=counts,
                                         sink=sink, lse_base="2", out_dtype="f32")
    np.testing.assert_array_equal(tensors["out"], want_out)
    np.testing.assert_array_equal(tensors["lse"], want_lse)
    ref_out, ref_lse = ref.sparse_mla(qf, rows, idx, DS_SCALE, counts=counts, sink=sink, lse_base="2")
    assert rel_l2(tensors["out"], ref_out) < 1e-5 and lse_diff(tensors["lse"], ref_lse) < 1e-4
    # the saved result parses with the independent reader; bf16 output comes back as bits
    parsed, _ = ref.st_parse(res_path.read_bytes())
    assert parsed["out"][0] == "F32"
    t16, _ = smla.replay(path.read_bytes())
    assert t16["out"].dtype == np.uint16
    assert rel_l2(smla.bf16_to_float(t16["out"]), ref_out) <= 1e-2
    with pytest.raises(smla.SmlaError):
        smla.replay(b"not a safetensors file")
