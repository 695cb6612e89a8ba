"""smla.TieredCache (HiSparse) on the CPU backend: the host-backed decode loop of docs/python.md,
with attention over the hot buffer checked bit for bit against attention over the same rows in the
full (resident) cache, the hot rows against the pool, the counters, the plan-time rule, bad input
and the decode-batch helper.

Skips when the package is not installed (pip install . or scripts/python-test).
"""

import os
import re

import numpy as np
import pytest

smla = pytest.importorskip("smla", reason="the smla package is not installed; run scripts/python-test")


DOCS = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "python.md")
DOCS_MARKER = "<!-- tests/python/test_tiered_cpu.py runs this block -->"


def test_docs_decode_loop_runs_as_written(capsys):
    """docs/python.md's host-backed decode loop, run as written (issue #21's worked example). Its
    positions are K distinct valid positions per request and step, so every one is a hit or a miss
    exactly once: hits + misses = steps x B x K; every miss copies one row."""
    text = open(DOCS, encoding="utf-8").read()
    assert DOCS_MARKER in text, "docs/python.md lost the marker of its tested HiSparse example"
    m = re.search(re.escape(DOCS_MARKER) + r"\s*```python\n(.*?)```", text, re.S)
    assert m, "no ```python block right after the marker"
    ns = {"__name__": "docs_example"}
    exec(compile(m.group(1), "docs/python.md (HiSparse example)", "exec"), ns)
    printed = capsys.readouterr().out
    c = ns["tc"].counters(ns["state"])
    assert str(c) in printed, printed
    K, B = ns["K"], ns["B"]
    assert c["steps"] == 6 and c["errors"] == 0
    assert c["hits"] + c["misses"] == 6 * B * K
    assert c["misses"] >= B * (K - 1)  # the first step finds only the newest rows hot
    assert c["bytes"] == c["misses"] * ns["tc"].row_bytes


def decode_loop(fmt, steps=6, seed=0):
    """The docs/python.md example, returning what the test checks."""
    rng = np.random.default_rng(seed)
    K, H, B, L, block = 64, 16, 3, 1024, 64
    tc = smla.TieredCache(format=fmt, topk=K, max_requests=B, max_positions=L)
    blocks = L // block
    pool = np.zeros((B * blocks, block, tc.row_bytes), np.uint8)  # the host pool (pinned memory on a GPU)
    table = rng.permutation(B * blocks).astype(np.int32).reshape(B, blocks)
    hot, state, ws = tc.new_buffers(like=pool)
    plan = smla.Plan(num_heads=H, topk=K, format=fmt, max_rows=B, backend="cpu")

    def slots_of(r, pos):
        pos = np.asarray(pos)
        return (table[r, pos // block] * block + pos % block).astype(np.int32)

    def write(r, pos):  # new tokens of request r at positions pos; the last one is its newest
        n = len(pos)
        latent = smla.bf16_bits(rng.standard_normal((n, 512)))
        rope = smla.bf16_bits(rng.standard_normal((n, 64)))
        hot_rows = np.full(n, -1, np.int32)
        hot_rows[-1] = tc.newest_hot_row(r)
        tc.write(latent, rope, slots_of(r, pos), pool, hot, hot_rows=hot_rows)

    lens = np.array([200, 333, 500], np.int32)
    for r in range(B):  # prefill
        write(r, np.arange(lens[r]))
    prev = [None] * B
    checks = []
    for step in range(steps):
        positions = np.empty((B, K), np.int32)
        for r in range(B):  # an indexer's top-k: half of the last step's rows, half new
            fresh = rng.choice(lens[r], K, replace=False)
            if prev[r] is not None:
                fresh[: K // 2] = prev[r][: K // 2]
            positions[r] = fresh
            prev[r] = rng.permutation(fresh)
        positions[1, :5] = -1  # padding
        if step == 2:
            positions[2, :] = -1  # an empty row: out 0, LSE -inf
        phys, counts = tc.resolve(positions, lens, pool, table, hot, state, workspace=ws)
        q = smla.bf16_bits(rng.standard_normal((B, H, 576)))
        out = np.empty((B, H, 512), np.uint16)
        lse = np.empty((B, H), np.float32)
        plan.run(q, hot, phys, out, softmax_scale=smla.DEEPSEEK_V32_SOFTMAX_SCALE, counts=counts, lse=lse)
        checks.append((positions.copy(), lens.copy(), phys.copy(), counts.copy(), q, out, lse, hot.copy()))
        for r in range(B):  # decode: one new token per request
            write(r, [lens[r]])
            lens[r] += 1
    return tc, pool, table, state, checks


@pytest.mark.parametrize("fmt", ["bf16", "fp8_ds_mla", "nvfp4_ds_mla"])
def test_decode_loop_matches_resident(fmt):
    tc, pool, table, state, checks = decode_loop(fmt)
    B, H = 3, 16
    flat = pool.reshape(-1, tc.row_bytes)
    plan = smla.Plan(num_heads=H, topk=64, format=fmt, max_rows=B, backend="cpu")
    total_valid = 0
    for positions, lens, phys, counts, q, out, lse, hot in checks:
        valid = (positions >= 0) & (positions < lens[:, None])
        assert (counts == valid.sum(1)).all()
        total_valid += int(valid.sum())
        # Every output row of the hot buffer holds the pool row of its position, in entry order.
        for r in range(B):
            want_pos = positions[r][valid[r]]
            got = phys[r, : counts[r]]
            assert (phys[r, counts[r]:] == -1).all()
            pool_rows = table[r, want_pos // 64] * 64 + want_pos % 64
            assert np.array_equal(hot[got, : tc.row_bytes], flat[pool_rows])
            if want_pos.size:
                assert got.max() < (r + 1) * tc.hot_slots and got.min() >= r * tc.hot_slots
        # Attention over the hot buffer == attention over the same rows resident, bit for bit.
        rphys, rcounts = smla.convert_indices(np.where(valid, positions, -1).astype(np.int32), table, block_size=64)
        assert np.array_equal(rcounts, counts)
        out_res = np.empty_like(out)
        lse_res = np.empty_like(lse)
        plan.run(q, flat, rphys, out_res, softmax_scale=smla.DEEPSEEK_V32_SOFTMAX_SCALE, counts=rcounts, lse=lse_res)
        assert np.array_equal(out, out_res)
        assert np.array_equal(lse.view(np.uint32), lse_res.view(np.uint32))
    assert np.isneginf(checks[2][6][2]).all() and (checks[2][5][2] == 0).all()  # the empty row
    c = tc.counters(state)
    assert c["steps"] == len(checks) and c["errors"] == 0
    assert c["misses"] > 0 and c["hits"] > 0
    assert c["bytes"] == c["misses"] * tc.row_bytes
    assert c["hits"] + c["misses"] <= total_valid


def test_plan_rule_and_sizes():
    tc = smla.TieredCache(format="fp8_ds_mla", topk=2048, max_requests=2, max_positions=1000)
    assert tc.hot_slots == 4224 and tc.row_bytes == 656 and tc.hot_rows == 2 * 4224
    assert tc.newest_hot_row(1) == 2 * 4224 - 1
    assert tc.device_bytes == tc.hot_buffer_bytes + tc.state_bytes + tc.workspace_bytes
    with pytest.raises(smla.SmlaError, match="at least 6145"):
        smla.TieredCache(topk=2048, max_tokens_per_request=3)
    b = smla.max_tiered_decode_batch(1 << 30)
    assert b == 319
    assert smla.max_tiered_decode_batch(1 << 30, attention_workspace=lambda rows: rows << 20) < b


def test_invalidate_rewritten_position():
    tc = smla.TieredCache(format="bf16", topk=4, max_requests=1, max_positions=64)
    pool = np.zeros((1, 64, 1152), np.uint8)
    pool[0, :, 0] = np.arange(64)  # row p starts with byte p
    table = np.array([[0]], np.int32)
    hot, state, ws = tc.new_buffers(like=pool)
    pos = np.array([[1, 2, 3, -1]], np.int32)
    lens = np.array([20], np.int32)
    phys, counts = tc.resolve(pos, lens, pool, table, hot, state)
    pool[0, 2, 0] = 200  # position 2 rewritten in the pool
    phys, counts = tc.resolve(pos, lens, pool, table, hot, state)
    assert hot[phys[0, 1], 0] == 2  # still hot: the stale row
    tc.invalidate(state, np.array([0], np.int32), np.array([2], np.int32))
    phys, counts = tc.resolve(pos, lens, pool, table, hot, state)
    assert hot[phys[0, 1], 0] == 200 and counts[0] == 3
    assert tc.counters(state)["misses"] == 4


def test_bad_input():
    tc = smla.TieredCache(format="bf16", topk=4, max_requests=2, max_positions=64)
    pool = np.zeros((2, 64, 1152), np.uint8)
    table = np.array([[0], [1]], np.int32)
    hot, state, ws = tc.new_buffers(like=pool)
    pos = np.array([[0, 1, 2, 3], [0, 1, 2, 3]], np.int32)
    with pytest.raises(smla.SmlaError, match="max_positions"):
        tc.resolve(pos, np.array([65, 10], np.int32), pool, table, hot, state)
    with pytest.raises(smla.SmlaError, match="has no hot buffer"):
        tc.resolve(pos, np.array([10, 10], np.int32), pool, table, hot, state,
                   req_of_token=np.array([0, 2], np.int32))
    with pytest.raises(smla.SmlaError, match="hot buffer too small"):
        tc.resolve(pos, np.array([10, 10], np.int32), pool, table, hot[:-1], state)
    with pytest.raises(smla.SmlaError, match="host-pool row"):
        tc.resolve(pos, np.array([10, 10], np.int32), pool[:1], table, hot, state)
    assert tc.counters(state)["steps"] == 0
