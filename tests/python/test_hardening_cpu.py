"""Bad input through the Python package on the CPU backend (issue #20): every case below either
raised nothing useful (a crash, a nanobind TypeError dump, an IndexError, a message that blamed the
wrong argument) or silently produced garbage. Each must now be one SmlaError line that names the
argument and the fix, or the defined result.

Skips when the package is not importable (see conftest.py).
"""

import numpy as np
import pytest

smla = pytest.importorskip("smla", reason="the smla package is not importable; run scripts/test or scripts/python-test")

as_strided = np.lib.stride_tricks.as_strided


def one_line_error(excinfo, *words):
    """The error is an SmlaError (not a TypeError / IndexError), one line, naming `words`."""
    e = excinfo.value
    assert isinstance(e, smla.SmlaError), f"{type(e).__name__}: {e}"
    msg = str(e)
    assert "\n" not in msg, msg
    for w in words:
        assert w in msg, f"{w!r} not in {msg!r}"
    return msg


def small_problem(T=2, H=4, K=8, N=16, seed=0):
    rng = np.random.default_rng(seed)
    q = smla.bf16_bits(rng.standard_normal((T, H, 576)))
    kv = smla.bf16_bits(rng.standard_normal((N, 576)))
    idx = rng.integers(-1, N, (T, K)).astype(np.int32)
    return q, kv, idx


# ---------------------------------------------------------------------------------------------
# crashes


def test_paged_cache_with_row_stride_zero_is_refused():
    q, kv, idx = small_problem()
    row = kv[0].view(np.uint8)  # 1152 bytes
    paged = np.broadcast_to(row, (4, 8, 1152))  # strides (0, 0, 1): every row the same memory
    with pytest.raises(smla.SmlaError) as e:
        smla.sparse_mla(q, paged, idx, format="bf16", softmax_scale=0.1)
    one_line_error(e, "kv", "stride")
    plan = smla.Plan(4, 8, format="bf16", backend="cpu", max_rows=4)
    out = np.empty((2, 4, 512), np.uint16)
    lse = np.empty((2, 4), np.float32)
    with pytest.raises(smla.SmlaError) as e:
        plan.run(q, paged, idx, out, lse=lse, softmax_scale=0.1)
    one_line_error(e, "kv", "stride")
    # a writable cache with row stride 0 (as_strided), for the writer
    buf = np.zeros(4 * 1152, np.uint8)
    cache = as_strided(buf, shape=(4, 8, 1152), strides=(1152, 0, 1))
    lat = smla.bf16_bits(np.ones((1, 512)))
    rope = smla.bf16_bits(np.ones((1, 64)))
    with pytest.raises(smla.SmlaError) as e:
        smla.write_cache(lat, rope, np.array([3], np.int32), cache, format="bf16")
    one_line_error(e, "cache", "stride")
    # 2-D caches with row stride 0 or overlapping rows, and a paged cache with block stride 0
    with pytest.raises(smla.SmlaError) as e:
        smla.sparse_mla(q, np.broadcast_to(row, (16, 1152)), idx, format="bf16", softmax_scale=0.1)
    one_line_error(e, "kv", "stride")
    with pytest.raises(smla.SmlaError) as e:
        smla.sparse_mla(q, as_strided(buf, shape=(2, 2, 1152), strides=(0, 1152, 1)), idx, format="bf16",
                        softmax_scale=0.1)
    one_line_error(e, "kv", "stride")


# ---------------------------------------------------------------------------------------------
# silent garbage


@pytest.mark.parametrize("fmt,dtype", [("bf16", np.float16), ("bf16", np.float32), ("bf16", np.float64),
                                       ("fp16", np.float32), ("fp8_ds_mla", np.float32),
                                       ("fp8_e4m3", np.float16), ("nvfp4_ds_mla", np.float32)])
def test_kv_of_the_wrong_element_type_is_refused(fmt, dtype):
    q, _, idx = small_problem()
    rb = smla.row_bytes(fmt)
    item = np.dtype(dtype).itemsize
    kv = np.zeros((16, (rb + item - 1) // item), dtype)
    if fmt in ("fp8_e4m3", "fp8_ds_mla"):
        q = q.view(np.uint8)[..., :576]  # an e4m3 q for the fp8 formats
        q = np.ascontiguousarray(q)
    with pytest.raises(smla.SmlaError) as e:
        smla.sparse_mla(q, kv, idx, format=fmt, softmax_scale=0.1)
    one_line_error(e, "kv", fmt)
    cache = np.zeros((2, 8, kv.shape[1]), dtype)
    with pytest.raises(smla.SmlaError) as e:
        smla.write_cache(smla.bf16_bits(np.ones((1, 512))), smla.bf16_bits(np.ones((1, 64))),
                         np.array([0], np.int32), cache, format=fmt)
    one_line_error(e, "cache", fmt)


def test_kv_element_types_that_carry_the_format_are_accepted():
    q, kv, idx = small_problem()
    want, _ = smla.sparse_mla(q, kv, idx, format="bf16", softmax_scale=0.1, out_dtype="f32")
    for a in (kv.view(np.uint8), kv.view(np.int16), kv.view(np.int8)):
        got, _ = smla.sparse_mla(q, a, idx, format="bf16", softmax_scale=0.1, out_dtype="f32")
        assert np.array_equal(got, want)


def test_outputs_overlapping_inputs_or_each_other_are_refused():
    T, H, K, N = 2, 4, 8, 16
    q, kv, idx = small_problem(T, H, K, N)
    # lse inside out's buffer
    out = np.empty((T, H, 512), np.uint16)
    lse = as_strided(out.view(np.float32), shape=(T, H), strides=(H * 4, 4))
    with pytest.raises(smla.SmlaError) as e:
        smla.sparse_mla(q, kv, idx, format="bf16", softmax_scale=0.1, out=out, lse=lse)
    one_line_error(e, "lse", "out", "overlap")
    # out inside the KV rows
    big = smla.bf16_bits(np.random.default_rng(1).standard_normal((64, 576)))
    out_in_kv = as_strided(big, shape=(T, H, 512), strides=(H * 1152, 1152, 2))
    with pytest.raises(smla.SmlaError) as e:
        smla.sparse_mla(q, big, idx, format="bf16", softmax_scale=0.1, out=out_in_kv)
    one_line_error(e, "out", "kv", "overlap")
    # out inside the indices
    idx_big = np.full((T, 4096), -1, np.int32)
    idx_big[:, :K] = idx
    out_in_idx = as_strided(idx_big.view(np.uint16), shape=(T, H, 512), strides=(4096 * 4, 1024, 2))
    with pytest.raises(smla.SmlaError) as e:
        smla.sparse_mla(q, kv, idx_big, format="bf16", softmax_scale=0.1, out=out_in_idx)
    one_line_error(e, "out", "idx", "overlap")
    # lse inside q
    lse_in_q = as_strided(q.view(np.float32), shape=(T, H), strides=(H * 1152, 4))
    with pytest.raises(smla.SmlaError) as e:
        smla.sparse_mla(q, kv, idx, format="bf16", softmax_scale=0.1, lse=lse_in_q)
    one_line_error(e, "lse", "q", "overlap")
    # an output that overlaps itself (rows written twice)
    self_overlap = as_strided(np.empty(8 * 512, np.uint16), shape=(T, H, 512), strides=(0, 1024, 2))
    with pytest.raises(smla.SmlaError) as e:
        smla.sparse_mla(q, kv, idx, format="bf16", softmax_scale=0.1, out=self_overlap)
    one_line_error(e, "out", "overlap")
    # the writer: cache over the source latent; the conversion in place
    cache = np.zeros((4, 1152), np.uint8)
    lat = as_strided(cache.view(np.uint16), shape=(1, 512), strides=(1152, 2))
    with pytest.raises(smla.SmlaError) as e:
        smla.write_cache(lat, None, np.array([1], np.int32), cache, format="bf16", src_dtype="bf16")
    one_line_error(e, "cache", "latent", "overlap")
    pos = np.array([[0, 1, -1, 2]], np.int32)
    bt = np.array([[0]], np.int32)
    with pytest.raises(smla.SmlaError) as e:
        smla.convert_indices(pos, bt, block_size=64, phys=pos)
    one_line_error(e, "phys", "positions", "overlap")
    # finish_empty_rows: lse inside out
    out2 = np.ones((T, H, 512), np.float32)
    with pytest.raises(smla.SmlaError) as e:
        smla.finish_empty_rows(np.zeros(T, np.int32), out2, as_strided(out2, shape=(T, H), strides=(H * 2048, 4)))
    one_line_error(e, "overlap")


def test_outputs_side_by_side_in_one_buffer_are_accepted():
    """Disjoint parts of one allocation are fine: out and lse carved from one byte buffer."""
    T, H, K, N = 2, 4, 8, 16
    q, kv, idx = small_problem(T, H, K, N)
    want_out, want_lse = smla.sparse_mla(q, kv, idx, format="bf16", softmax_scale=0.1)
    buf = np.empty(T * H * 512 * 2 + T * H * 4, np.uint8)
    out = buf[: T * H * 1024].view(np.uint16).reshape(T, H, 512)
    lse = buf[T * H * 1024:].view(np.float32).reshape(T, H)
    smla.sparse_mla(q, kv, idx, format="bf16", softmax_scale=0.1, out=out, lse=lse)
    assert np.array_equal(out, want_out) and np.array_equal(lse, want_lse)


def test_int64_slot_mapping_is_not_narrowed_into_another_slot():
    lat = smla.bf16_bits(np.ones((2, 512)))
    rope = smla.bf16_bits(np.ones((2, 64)))
    for slots in (np.array([2**32 + 5, -(2**32) + 6], np.int64), np.array([2**31, 2**63 - 1], np.int64)):
        cache = np.zeros((2, 8, 1152), np.uint8)
        try:
            smla.write_cache(lat, rope, slots, cache, format="bf16")
        except smla.SmlaError as e:
            assert "slot_mapping" in str(e)
        assert not cache.any(), "a slot past int32 wrote a row"
    # in range: written exactly as int32 slots would be
    cache64 = np.zeros((2, 8, 1152), np.uint8)
    cache32 = np.zeros((2, 8, 1152), np.uint8)
    smla.write_cache(lat, rope, np.array([5, -1], np.int64), cache64, format="bf16")
    smla.write_cache(lat, rope, np.array([5, -1], np.int32), cache32, format="bf16")
    assert np.array_equal(cache64, cache32) and cache64.any()


def test_int64_req_of_token_is_not_narrowed_into_another_request():
    pos = np.array([[0, 1, 2], [0, 1, 2]], np.int32)
    bt = np.array([[0], [1]], np.int32)
    try:
        phys, counts = smla.convert_indices(pos, bt, block_size=64, req_of_token=np.array([0, 2**32 + 1], np.int64))
    except smla.SmlaError as e:
        assert "req_of_token" in str(e)
    else:
        assert counts.tolist() == [3, 0] and phys[1].tolist() == [-1, -1, -1]
    phys, counts = smla.convert_indices(pos, bt, block_size=64, req_of_token=np.array([1, 0], np.int64))
    assert phys.tolist() == [[64, 65, 66], [0, 1, 2]] and counts.tolist() == [3, 3]


# ---------------------------------------------------------------------------------------------
# errors that were not clear


@pytest.mark.parametrize("which", ["out", "lse"])
def test_read_only_outputs_give_one_line(which):
    q, kv, idx = small_problem()
    out = np.empty((2, 4, 512), np.uint16)
    lse = np.empty((2, 4), np.float32)
    {"out": out, "lse": lse}[which].flags.writeable = False
    with pytest.raises(Exception) as e:
        smla.sparse_mla(q, kv, idx, format="bf16", softmax_scale=0.1, out=out, lse=lse)
    one_line_error(e, which, "read-only")
    plan = smla.Plan(4, 8, format="bf16", backend="cpu", max_rows=4)
    with pytest.raises(Exception) as e:
        plan.run(q, kv, idx, out, lse=lse, softmax_scale=0.1)
    one_line_error(e, which, "read-only")


def test_read_only_cache_gives_one_line():
    cache = np.zeros((2, 8, 1152), np.uint8)
    cache.flags.writeable = False
    with pytest.raises(Exception) as e:
        smla.write_cache(smla.bf16_bits(np.ones((1, 512))), smla.bf16_bits(np.ones((1, 64))),
                         np.array([0], np.int32), cache, format="bf16")
    one_line_error(e, "cache", "read-only")
    out = np.ones((2, 4, 512), np.float32)
    out.flags.writeable = False
    with pytest.raises(Exception) as e:
        smla.finish_empty_rows(np.zeros(2, np.int32), out)
    one_line_error(e, "out", "read-only")
    phys = np.empty((1, 3), np.int32)
    phys.flags.writeable = False
    with pytest.raises(Exception) as e:
        smla.convert_indices(np.zeros((1, 3), np.int32), np.zeros((1, 1), np.int32), block_size=64, phys=phys)
    one_line_error(e, "phys", "read-only")


def test_q_of_the_wrong_rank_gives_one_line():
    _, kv, idx = small_problem()
    for q in (np.zeros(576, np.uint16), np.zeros((2, 576), np.uint16), np.zeros((), np.uint16)):
        with pytest.raises(Exception) as e:
            smla.sparse_mla(q, kv, idx, format="bf16", softmax_scale=0.1)
        one_line_error(e, "q")
    with pytest.raises(Exception) as e:
        smla.sparse_mla((np.zeros(512, np.uint16), np.zeros(64, np.uint16)), kv, idx, format="bf16",
                        softmax_scale=0.1)
    one_line_error(e, "q")


@pytest.mark.parametrize("kwargs,word", [
    ({"num_heads": 2**31}, "num_heads"), ({"num_heads": -(2**40)}, "num_heads"), ({"topk": 2**33}, "topk"),
    ({"max_rows": 2**70}, "max_rows"), ({"num_heads": "x"}, "num_heads"), ({"topk": None}, "topk"),
    ({"graph_sizes": [2**64]}, "graph_sizes"), ({"device": 2**40}, "device"), ({"rope_dim": 1.5}, "rope_dim")])
def test_plan_arguments_out_of_range_give_one_line(kwargs, word):
    args = dict(num_heads=4, topk=8, format="bf16", backend="cpu", max_rows=4)
    args.update(kwargs)
    with pytest.raises(Exception) as e:
        smla.Plan(**args)
    one_line_error(e, word)


def test_scales_that_are_not_finite_float32_give_one_line():
    q, kv, idx = small_problem()
    for v in (None, "0.1", 1e39, -1e39, float("nan"), float("inf")):
        with pytest.raises(Exception) as e:
            smla.sparse_mla(q, kv, idx, format="bf16", softmax_scale=v)
        one_line_error(e, "softmax_scale")
    with pytest.raises(Exception) as e:
        smla.sparse_mla(q, kv, idx, format="bf16", softmax_scale=1e39)
    msg = one_line_error(e, "float32")
    with pytest.raises(Exception) as e:
        smla.sparse_mla(q, kv, idx, format="bf16", softmax_scale=0.1, k_scale=None)
    one_line_error(e, "k_scale")
    plan = smla.Plan(4, 8, format="bf16", backend="cpu", max_rows=4)
    with pytest.raises(Exception) as e:
        plan.run(q, kv, idx, np.empty((2, 4, 512), np.uint16), lse=np.empty((2, 4), np.float32),
                 softmax_scale=None)
    one_line_error(e, "softmax_scale")
    assert msg


def test_negative_token_stride_blames_the_token_stride():
    q, kv, idx = small_problem(T=3)
    with pytest.raises(smla.SmlaError) as e:
        smla.sparse_mla(q[::-1], kv, idx, format="bf16", softmax_scale=0.1)
    msg = one_line_error(e, "q", "token")
    assert "head stride" not in msg
    with pytest.raises(smla.SmlaError) as e:
        smla.sparse_mla(q[:, ::-1], kv, idx, format="bf16", softmax_scale=0.1)
    one_line_error(e, "q", "head")


def test_finish_empty_rows_blames_counts():
    out = np.ones((3, 2, 512), np.float32)
    with pytest.raises(smla.SmlaError) as e:
        smla.finish_empty_rows(np.zeros(5, np.int32), out)
    msg = one_line_error(e, "counts")
    assert msg.startswith("counts"), msg
