"""smla.TieredCache with PyTorch CUDA tensors and a pinned host pool: the CUDA resolver and the
tiered cache writer equal the CPU backend (NumPy copies of the same inputs) step by step — hot
buffer, state, physical rows, counts, counters — and attention over the hot buffer equals the CPU
run's bits where the CPU and CUDA attention agree (the same kernel on both hot buffers is compared).

Skips with a reason without PyTorch, a CUDA device, or a CUDA build of smla.
"""

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device visible to PyTorch", allow_module_level=True)
smla = pytest.importorskip("smla", reason="the smla package is not installed; run scripts/python-test")
if not smla.built_with_cuda():
    pytest.skip("this smla build has no CUDA backend", allow_module_level=True)

DEV = torch.device("cuda:0")


@pytest.mark.parametrize("fmt", ["bf16", "fp8_ds_mla"])
def test_cuda_resolver_equals_cpu(fmt):
    rng = np.random.default_rng(5)
    K, B, L, block = 128, 4, 2048, 64
    tc = smla.TieredCache(format=fmt, topk=K, max_requests=B, max_tokens_per_request=2, max_positions=L)
    blocks = L // block
    pool_np = np.zeros((B * blocks, block, tc.row_bytes), np.uint8)
    pool_pinned = torch.zeros(pool_np.shape, dtype=torch.uint8, pin_memory=True)
    table = rng.permutation(B * blocks).astype(np.int32).reshape(B, blocks)
    table_d = torch.from_numpy(table).to(DEV)
    hot_np, state_np, ws_np = tc.new_buffers(like=pool_np)
    hot_np[:] = 0
    probe = torch.empty(1, device=DEV)
    hot_d, state_d, ws_d = tc.new_buffers(like=probe)
    hot_d.zero_()

    def write(r, pos):
        n = len(pos)
        latent = smla.bf16_bits(rng.standard_normal((n, 512)))
        rope = smla.bf16_bits(rng.standard_normal((n, 64)))
        slots = (table[r, np.asarray(pos) // block] * block + np.asarray(pos) % block).astype(np.int32)
        hot_rows = np.full(n, -1, np.int32)
        hot_rows[-1] = tc.newest_hot_row(r)
        tc.write(latent, rope, slots, pool_np, hot_np, hot_rows=hot_rows)
        tc.write(torch.from_numpy(latent.view(np.int16)).to(DEV).view(torch.bfloat16),
                 torch.from_numpy(rope.view(np.int16)).to(DEV).view(torch.bfloat16),
                 torch.from_numpy(slots).to(DEV), pool_pinned, hot_d, hot_rows=torch.from_numpy(hot_rows).to(DEV))
        torch.cuda.synchronize()

    lens = np.array([300, 700, 1000, 150], np.int32)
    for r in range(B):
        write(r, np.arange(lens[r]))
    assert np.array_equal(pool_pinned.numpy(), pool_np), "the tiered writer's pool rows differ from the CPU's"
    prev = [None] * B
    for step in range(8):
        req_of = np.repeat(np.arange(B), 2)[: 2 * B - (step % 3)].astype(np.int32)
        positions = np.empty((len(req_of), K), np.int32)
        for t, r in enumerate(req_of):
            p = rng.integers(0, lens[r] + 5, K).astype(np.int32) - 2  # some invalid on both ends
            if prev[r] is not None and step % 4 != 0:
                p[: K // 2] = prev[r][: K // 2]
            positions[t] = p
        for r in range(B):
            prev[r] = positions[req_of == r][0] if (req_of == r).any() else prev[r]
        phys_np, counts_np = tc.resolve(positions, lens, pool_np, table, hot_np, state_np, workspace=ws_np,
                                        req_of_token=req_of)
        phys_d, counts_d = tc.resolve(torch.from_numpy(positions).to(DEV), torch.from_numpy(lens).to(DEV),
                                      pool_pinned, table_d, hot_d, state_d, workspace=ws_d,
                                      req_of_token=torch.from_numpy(req_of).to(DEV))
        torch.cuda.synchronize()
        assert np.array_equal(phys_d.cpu().numpy(), phys_np), f"step {step}"
        assert np.array_equal(counts_d.cpu().numpy(), counts_np), f"step {step}"
        assert np.array_equal(hot_d.cpu().numpy(), hot_np), f"step {step}: hot buffers differ"
        st = state_d.cpu().numpy()
        assert np.array_equal(st[256:], state_np[256:]), f"step {step}: map / stamps differ"
        assert tc.counters(state_d) == tc.counters(state_np)
        if step == 4:  # forget some positions of requests 1 and 2 on both sides
            rq = np.array([1, 2, 1, -1, 2], np.int32)
            ps = np.array([3, 7, 100, 5, 149], np.int32)
            tc.invalidate(state_np, rq, ps)
            tc.invalidate(state_d, torch.from_numpy(rq).to(DEV), torch.from_numpy(ps).to(DEV))
        for r in range(B):
            write(r, [lens[r]])
            lens[r] += 1
    c = tc.counters(state_d)
    assert c["misses"] > 0 and c["hits"] > 0 and c["errors"] == 0


def test_cuda_refuses_pageable_pool():
    tc = smla.TieredCache(format="bf16", topk=8, max_requests=1, max_positions=64)
    hot, state, ws = tc.new_buffers(like=torch.empty(1, device=DEV))
    pool = np.zeros((1, 64, 1152), np.uint8)  # pageable host memory
    pos = torch.zeros((1, 8), dtype=torch.int32, device=DEV)
    with pytest.raises(smla.SmlaError, match="not pinned"):
        tc.resolve(pos, torch.tensor([10], dtype=torch.int32, device=DEV), pool,
                   torch.zeros((1, 1), dtype=torch.int32, device=DEV), hot, state, workspace=ws)
