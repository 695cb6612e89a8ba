"""The smla package with PyTorch CUDA tensors on an SM90 GPU (the lent H200): results against the
CPU reference within DESIGN.md §8 tolerances, Plan.run without allocations, CUDA-graph capture and
replay, the torch.library custom ops under torch.compile (fullgraph: no graph breaks), and the
serving kernels (cache writers, index conversion, empty rows) bit-equal to the CPU backend.

Skips with a reason without PyTorch, a CUDA device, or a CUDA build of smla.
"""

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device visible to PyTorch", allow_module_level=True)
smla = pytest.importorskip("smla", reason="the smla package is not installed; run scripts/python-test")
if not smla.built_with_cuda():
    pytest.skip("this smla build has no CUDA backend", allow_module_level=True)
_REASON = smla.support(16, 64, backend="cuda")
if _REASON:
    pytest.skip(f"smla's CUDA backend cannot run here: {_REASON}", allow_module_level=True)

import smla.torch_ops  # noqa: E402  registers torch.ops.smla.*

DEV = torch.device("cuda:0")
DS_SCALE = smla.DEEPSEEK_V32_SOFTMAX_SCALE


def rel_l2(got, want):
    got = np.asarray(got, np.float64)
    want = np.asarray(want, np.float64)
    den = np.linalg.norm(want)
    return np.linalg.norm(got - want) / (den if den > 0 else 1.0)


def lse_diff(got, want):
    got = np.asarray(got, np.float64)
    want = np.asarray(want, np.float64)
    both = np.isneginf(got) & np.isneginf(want)
    with np.errstate(invalid="ignore"):
        d = np.where(both, 0.0, np.abs(got - want))
    return float(np.nan_to_num(d, nan=np.inf).max()) if d.size else 0.0


def host(t):
    """numpy view of a CPU copy (bf16 as uint16 bits, so the CPU backend reads the same bits)."""
    t = t.detach().cpu().contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(np.uint16)
    return t.numpy()


def make_problem(T, H, K, N, dtype=torch.bfloat16, rope_dim=64, seed=0, counts=False, sink=False,
                 all_invalid_row=True, poison_unselected=True):
    g = torch.Generator(device="cpu").manual_seed(seed)
    D = 512 + rope_dim
    q = torch.randn(T, H, D, generator=g).to(dtype).to(DEV)
    kv = torch.randn(N, D, generator=g).to(dtype)
    idx = torch.randint(0, N, (T, K), generator=g, dtype=torch.int32)
    r = torch.rand(T, K, generator=g)
    idx[r < 0.1] = -1
    idx[(r >= 0.1) & (r < 0.15)] = N + 5
    if all_invalid_row and T > 1:
        idx[0] = -1
    cnt = torch.randint(0, K + 1, (T,), generator=g, dtype=torch.int32) if counts else None
    if cnt is not None and T > 2:
        cnt[2] = 0
    if poison_unselected:
        used = torch.zeros(N, dtype=torch.bool)
        for t in range(T):
            n = K if cnt is None else int(cnt[t])
            sel = idx[t, :n]
            sel = sel[(sel >= 0) & (sel < N)].long()
            used[sel] = True
        kv[~used] = float("nan")  # a kernel that reads a row it should skip produces NaN
    snk = torch.randn(H, generator=g).float().to(DEV) if sink else None
    return q, kv.to(DEV), idx.to(DEV), None if cnt is None else cnt.to(DEV), snk


def cpu_reference(q, kv, idx, fmt, counts=None, sink=None, lse_base="e", rope_dim=64, softmax_scale=DS_SCALE):
    return smla.sparse_mla(host(q), host(kv), host(idx), format=fmt, softmax_scale=softmax_scale,
                           counts=None if counts is None else host(counts), sink=None if sink is None else host(sink),
                           lse_base=lse_base, rope_dim=rope_dim, out_dtype="f32")


CASES = [
    # T, H, K, N, dtype, rope_dim, counts, sink, lse_base
    (1, 1, 77, 300, torch.bfloat16, 64, False, False, "e"),
    (5, 16, 64, 1000, torch.bfloat16, 64, True, True, "2"),
    (9, 48, 300, 2000, torch.bfloat16, 64, False, False, "e"),
    (4, 128, 2048, 5000, torch.bfloat16, 64, True, False, "e"),
    (6, 3, 130, 500, torch.float16, 64, False, True, "e"),
    (3, 96, 200, 700, torch.bfloat16, 0, True, False, "e"),
    (130, 64, 64, 4000, torch.bfloat16, 64, False, False, "e"),
]


@pytest.mark.parametrize("T,H,K,N,dtype,rope_dim,counts,sink,lse_base", CASES)
def test_sparse_mla_cuda_matches_cpu_reference(T, H, K, N, dtype, rope_dim, counts, sink, lse_base):
    q, kv, idx, cnt, snk = make_problem(T, H, K, N, dtype, rope_dim, seed=T * 1000 + H, counts=counts, sink=sink)
    fmt = "fp16" if dtype == torch.float16 else "bf16"
    out = torch.full((T, H, 512), float("nan"), dtype=dtype, device=DEV)  # poisoned
    lse = torch.full((T, H), float("nan"), dtype=torch.float32, device=DEV)
    smla.sparse_mla(q, kv, idx, format=fmt, softmax_scale=DS_SCALE, counts=cnt, sink=snk, lse_base=lse_base,
                    rope_dim=rope_dim, out=out, lse=lse)
    torch.cuda.synchronize()
    want_out, want_lse = cpu_reference(q, kv, idx, fmt, cnt, snk, lse_base, rope_dim)
    got = out.float().cpu().numpy()
    assert np.isfinite(got).all()
    assert rel_l2(got, want_out) <= 1e-2
    assert lse_diff(lse.cpu().numpy(), want_lse) <= 1e-3
    # the allocating path and the (q_nope, q_pe) pair give the same bits
    if rope_dim:
        q_pair = (q[..., :512], q[..., 512:])
        out2, lse2 = smla.sparse_mla(q_pair, kv, idx, format=fmt, softmax_scale=DS_SCALE, counts=cnt, sink=snk,
                                     lse_base=lse_base)
        assert out2.dtype == dtype
        torch.testing.assert_close(out2, out, rtol=0, atol=0)
        torch.testing.assert_close(lse2, lse, rtol=0, atol=0)


def test_paged_kv_and_empty_call():
    T, H, K, nb, B = 4, 16, 100, 40, 64
    q, kv, _, _, _ = make_problem(T, H, K, nb * B, poison_unselected=False)
    paged = kv.view(nb, B, 576)
    idx = torch.randint(0, nb * B, (T, K), dtype=torch.int32, device=DEV)
    out, lse = smla.sparse_mla(q, paged, idx, format="bf16", softmax_scale=0.1)
    want_out, want_lse = cpu_reference(q, kv, idx, "bf16", softmax_scale=0.1)
    assert rel_l2(out.float().cpu().numpy(), want_out) <= 1e-2
    assert lse_diff(lse.cpu().numpy(), want_lse) <= 1e-3
    e_out, e_lse = smla.sparse_mla(q[:0], kv, idx[:0], format="bf16", softmax_scale=0.1)
    assert e_out.shape == (0, H, 512) and e_lse.shape == (0, H)


def test_plan_run_allocates_nothing():
    T, H, K, N = 8, 64, 512, 4000
    q, kv, idx, cnt, _ = make_problem(T, H, K, N, counts=True)
    plan = smla.Plan(H, K, format="bf16", max_rows=64, graph_sizes=[8, 16])
    ws = plan.new_workspace(q)
    out = torch.empty(T, H, 512, dtype=torch.bfloat16, device=DEV)
    lse = torch.empty(T, H, dtype=torch.float32, device=DEV)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    plan.run(q, kv, idx, out, softmax_scale=DS_SCALE, counts=cnt, lse=lse, workspace=ws)
    assert torch.cuda.memory_allocated() == before
    torch.cuda.synchronize()
    want_out, want_lse = cpu_reference(q, kv, idx, "bf16", cnt)
    assert rel_l2(out.float().cpu().numpy(), want_out) <= 1e-2
    assert lse_diff(lse.cpu().numpy(), want_lse) <= 1e-3
    with pytest.raises(smla.SmlaError, match="workspace too small"):
        if plan.workspace_bytes > 0:
            plan.run(q, kv, idx, out, softmax_scale=DS_SCALE, counts=cnt, lse=lse, workspace=ws[:0])
        else:
            raise smla.SmlaError("workspace too small (plan needs none)")
    with pytest.raises(smla.SmlaError, match=r"the plan runs on cuda:0 but the tensors are on cpu"):
        plan.run(q.cpu(), kv.cpu(), idx.cpu(), out.cpu(), softmax_scale=DS_SCALE, counts=cnt.cpu(), lse=lse.cpu())


def test_errors_and_unsupported_formats():
    q, kv, idx, _, _ = make_problem(2, 16, 64, 100, poison_unselected=False)
    with pytest.raises(smla.SmlaError, match=r"all tensors must be on one device"):
        smla.sparse_mla(q, kv.cpu(), idx, format="bf16", softmax_scale=0.1)
    with pytest.raises(smla.SmlaError, match=r"idx must be int32"):
        smla.sparse_mla(q, kv, idx.long(), format="bf16", softmax_scale=0.1)
    fp8 = torch.zeros(100, 656, dtype=torch.uint8, device=DEV)
    reason = smla.support(16, 64, format="fp8_ds_mla", backend="cuda")
    if reason:
        with pytest.raises(smla.UnsupportedError, match="fp8_ds_mla"):
            smla.sparse_mla(q, fp8, idx, format="fp8_ds_mla", softmax_scale=0.1)


def test_cuda_graph_capture_and_replay():
    T, H, K, N = 4, 32, 256, 3000
    q, kv, idx, cnt, _ = make_problem(T, H, K, N, counts=True, poison_unselected=False)
    plan = smla.Plan(H, K, format="bf16", max_rows=T, graph_sizes=[T])
    ws = plan.new_workspace(q)
    out = torch.empty(T, H, 512, dtype=torch.bfloat16, device=DEV)
    lse = torch.empty(T, H, dtype=torch.float32, device=DEV)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm-up outside capture
        plan.run(q, kv, idx, out, softmax_scale=DS_SCALE, counts=cnt, lse=lse, workspace=ws)
        smla.sparse_mla(q, kv, idx, format="bf16", softmax_scale=DS_SCALE, counts=cnt)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        plan.run(q, kv, idx, out, softmax_scale=DS_SCALE, counts=cnt, lse=lse, workspace=ws)
        out2, lse2 = smla.sparse_mla(q, kv, idx, format="bf16", softmax_scale=DS_SCALE, counts=cnt)  # allocating path
    for step in range(3):
        q.copy_(torch.randn_like(q, dtype=torch.float32).to(q.dtype))
        idx.copy_(torch.randint(-1, N, idx.shape, dtype=torch.int32, device=DEV))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        want_out, want_lse = cpu_reference(q, kv, idx, "bf16", cnt)
        assert rel_l2(out.float().cpu().numpy(), want_out) <= 1e-2, step
        assert lse_diff(lse.cpu().numpy(), want_lse) <= 1e-3, step
        torch.testing.assert_close(out2, out, rtol=0, atol=0)
        torch.testing.assert_close(lse2, lse, rtol=0, atol=0)


def test_custom_op_under_torch_compile():
    T, H, K, N = 6, 16, 128, 1000
    q, kv, idx, cnt, snk = make_problem(T, H, K, N, counts=True, sink=True, poison_unselected=False)

    def layer(q, kv, idx, cnt, snk):
        q_nope, q_pe = q[..., :512] * 1.0, q[..., 512:]  # some torch work around the op
        out, lse = torch.ops.smla.sparse_mla(q_nope, q_pe, kv, idx, cnt, snk, "bf16", DS_SCALE, 1.0, 1.0, 64, "e")
        return out.float() * 2.0, lse + 1.0

    torch._dynamo.reset()
    compiled = torch.compile(layer, fullgraph=True)  # fullgraph: a graph break raises
    got_out, got_lse = compiled(q, kv, idx, cnt, snk)
    want_out, want_lse = layer(q, kv, idx, cnt, snk)
    torch.testing.assert_close(got_out, want_out, rtol=0, atol=0)
    torch.testing.assert_close(got_lse, want_lse, rtol=0, atol=0)
    ref_out, ref_lse = cpu_reference(q, kv, idx, "bf16", cnt, snk)
    assert rel_l2(got_out.cpu().numpy() / 2.0, ref_out) <= 1e-2
    assert lse_diff(got_lse.cpu().numpy() - 1.0, ref_lse) <= 1e-3
    explain = torch._dynamo.explain(layer)(q, kv, idx, cnt, snk)
    assert explain.graph_break_count == 0

    # the out-variant and the serving ops compile too
    out = torch.empty(T, H, 512, dtype=torch.bfloat16, device=DEV)
    lse = torch.empty(T, H, dtype=torch.float32, device=DEV)

    def layer_out(q, kv, idx, cnt, snk, out, lse):
        torch.ops.smla.sparse_mla_out(q, None, kv, idx, cnt, snk, out, lse, "bf16", DS_SCALE, 1.0, 1.0, 64, "e")
        return out.float().sum()

    torch.compile(layer_out, fullgraph=True)(q, kv, idx, cnt, snk, out, lse)
    torch.testing.assert_close(out.float() * 2.0, got_out, rtol=0, atol=0)
    torch.library.opcheck(torch.ops.smla.sparse_mla.default, (q, None, kv, idx, cnt, snk, "bf16", DS_SCALE),
                          test_utils=("test_schema", "test_faketensor"))


@pytest.mark.parametrize("fmt", ["bf16", "fp16", "fp8_e4m3", "fp8_ds_mla", "nvfp4_ds_mla"])
def test_write_cache_cuda_equals_cpu(fmt):
    N, nb, B = 50, 8, 16
    dt = torch.float16 if fmt == "fp16" else torch.bfloat16
    g = torch.Generator(device="cpu").manual_seed(7)
    latent = (torch.randn(N, 512, generator=g) * 5).to(dt).to(DEV)
    rope = (torch.randn(N, 64, generator=g) * 5).to(dt).to(DEV)
    slots = torch.randperm(nb * B, generator=g)[:N].to(torch.int64)  # vLLM's int64 slot_mapping
    slots[4] = -1
    slots = slots.to(DEV)
    rb = smla.row_bytes(fmt, 64)
    cache = torch.full((nb, B, rb), 0xAB, dtype=torch.uint8, device=DEV)
    smla.write_cache(latent, rope, slots, cache, format=fmt, k_scale=0.3)
    torch.ops.smla.write_cache(latent, rope, slots, cache, fmt, 0.3)  # the op writes the same bytes
    want = np.full((nb, B, rb), 0xAB, np.uint8)
    smla.write_cache(host(latent), host(rope), host(slots), want, format=fmt, k_scale=0.3,
                     src_dtype="fp16" if fmt == "fp16" else "bf16")
    np.testing.assert_array_equal(cache.cpu().numpy(), want)


@pytest.mark.parametrize("world", [1, 2])
def test_convert_indices_and_finish_empty_rows_cuda_equal_cpu(world):
    g = torch.Generator(device="cpu").manual_seed(11)
    R, M, B, T, K = 4, 10, 64, 9, 300
    table = torch.randperm(64, generator=g)[: R * M].view(R, M).to(torch.int32)
    table[2, 6:] = -1
    req = torch.randint(0, R, (T,), generator=g, dtype=torch.int32)
    pos = torch.randint(-2, M * B * world + 50, (T, K), generator=g, dtype=torch.int32)
    pos[1] = -1
    for rank in range(world):
        phys, counts = smla.convert_indices(pos.to(DEV), table.to(DEV), block_size=B, block_stride_rows=B + 8,
                                            req_of_token=req.to(DEV), dcp_world=world, dcp_rank=rank,
                                            dcp_interleave=4)
        want_phys, want_counts = smla.convert_indices(pos.numpy(), table.numpy(), block_size=B, block_stride_rows=B + 8,
                                                      req_of_token=req.numpy(), dcp_world=world, dcp_rank=rank,
                                                      dcp_interleave=4)
        np.testing.assert_array_equal(phys.cpu().numpy(), want_phys)
        np.testing.assert_array_equal(counts.cpu().numpy(), want_counts)
        op_phys, op_counts = torch.ops.smla.convert_indices(pos.to(DEV), table.to(DEV), req.to(DEV), B, B + 8, world,
                                                            rank, 4)
        torch.testing.assert_close(op_phys, phys, rtol=0, atol=0)
        torch.testing.assert_close(op_counts, counts, rtol=0, atol=0)
    H = 8
    out = torch.ones(T, H, 512, dtype=torch.bfloat16, device=DEV)
    lse = torch.ones(T, H, dtype=torch.float32, device=DEV)
    smla.finish_empty_rows(counts, out, lse)
    empty = (counts <= 0).cpu()
    assert bool((out[empty.to(DEV)] == 0).all()) and bool(torch.isneginf(lse[empty.to(DEV)]).all())
    assert bool((out[(~empty).to(DEV)] == 1).all())


def test_merge_partials_torch_equals_numpy():
    g = torch.Generator(device="cpu").manual_seed(3)
    W, T, H = 3, 5, 4
    outs = [torch.randn(T, H, 512, generator=g) for _ in range(W)]
    lses = [torch.randn(T, H, generator=g) for _ in range(W)]
    lses[0][0] = -math.inf
    lses[1][0] = math.nan
    lses[2][0] = math.inf
    got_out, got_lse = smla.merge_partials([o.to(DEV) for o in outs], [x.to(DEV) for x in lses])
    want_out, want_lse = smla.merge_partials([o.numpy() for o in outs], [x.numpy() for x in lses])
    np.testing.assert_allclose(got_out.cpu().numpy(), want_out, rtol=1e-5, atol=1e-6)
    assert lse_diff(got_lse.cpu().numpy(), want_lse) < 1e-5


def test_current_stream_helper():
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        assert smla.current_stream() == s.cuda_stream
    q, kv, idx, _, _ = make_problem(2, 16, 64, 100, poison_unselected=False)
    with torch.cuda.stream(s):
        out, _ = smla.sparse_mla(q, kv, idx, format="bf16", softmax_scale=0.1, stream=s)
    s.synchronize()
    want, _ = cpu_reference(q, kv, idx, "bf16", softmax_scale=0.1)
    assert rel_l2(out.float().cpu().numpy(), want) <= 1e-2


def _readme_layer_class():
    """The SparseMLAAttention example of docs/python.md, executed as written."""
    import pathlib
    import re

    text = (pathlib.Path(__file__).resolve().parents[2] / "docs" / "python.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    src = next(b for b in blocks if "class SparseMLAAttention" in b)
    ns = {}
    exec(compile(src, "docs/python.md", "exec"), ns)
    return ns["SparseMLAAttention"]


def test_readme_vllm_style_layer():
    Layer = _readme_layer_class()
    g = torch.Generator(device="cpu").manual_seed(21)
    H, topk, B, nb = 16, 96, 16, 20
    layer = Layer(H, topk=topk, max_tokens=64, graph_sizes=(4,))
    # two requests: 30 and 45 tokens already cached, one new (decode) token each
    lens = [30, 45]
    table = torch.full((2, 8), -1, dtype=torch.int32)
    perm = torch.randperm(nb, generator=g).to(torch.int32)
    table[0, :2], table[1, :3] = perm[:2], perm[2:5]
    kv_cache = torch.zeros(nb, B, 576, dtype=torch.bfloat16, device=DEV)
    hist = [torch.randn(n, 576, generator=g).to(torch.bfloat16) for n in lens]
    for r, h in enumerate(hist):  # fill the history through the same writer
        slots = torch.tensor([int(table[r, p // B]) * B + p % B for p in range(len(h))], dtype=torch.int64)
        smla.write_cache(h[:, :512].to(DEV), h[:, 512:].to(DEV), slots.to(DEV), kv_cache, format="bf16")
    T = 2
    kv_c = torch.randn(T, 512, generator=g).to(torch.bfloat16).to(DEV)
    k_pe = torch.randn(T, 64, generator=g).to(torch.bfloat16).to(DEV)
    slot_mapping = torch.tensor([int(table[r, lens[r] // B]) * B + lens[r] % B for r in range(T)],
                                dtype=torch.int64, device=DEV)
    positions = torch.full((T, topk), -1, dtype=torch.int32)
    positions[0, :20] = torch.randperm(lens[0] + 1, generator=g)[:20].to(torch.int32)
    # row 1: an empty selection (all -1) -> out 0, lse -inf
    ql_nope = torch.randn(T, H, 512, generator=g).to(torch.bfloat16).to(DEV)
    q_pe = torch.randn(T, H, 64, generator=g).to(torch.bfloat16).to(DEV)
    req = torch.arange(T, dtype=torch.int32, device=DEV)
    out, lse = layer(ql_nope, q_pe, kv_c, k_pe, kv_cache, slot_mapping, positions.to(DEV), req, table.to(DEV))
    torch.cuda.synchronize()
    # reference: rows of request 0 in logical order, the new token appended
    rows0 = torch.cat([hist[0], torch.cat([kv_c[0], k_pe[0]]).cpu()[None]])
    q0 = torch.cat([ql_nope[0], q_pe[0]], dim=-1)[None]
    want_out, want_lse = cpu_reference(q0, rows0, positions[:1, :20].contiguous(), "bf16",
                                       softmax_scale=smla.DEEPSEEK_V32_SOFTMAX_SCALE)
    assert rel_l2(out[:1].float().cpu().numpy(), want_out) <= 1e-2
    assert lse_diff(lse[:1].cpu().numpy(), want_lse) <= 1e-3
    assert bool((out[1] == 0).all()) and bool(torch.isneginf(lse[1]).all())


# ---------------------------------------------------------------------------------------------
# issue #20 on CUDA tensors: the inputs the CPU suite refuses (test_hardening_cpu.py) are refused
# here too, before any launch, or give the defined result


def one_line(excinfo, *words):
    msg = str(excinfo.value)
    assert isinstance(excinfo.value, smla.SmlaError) and "\n" not in msg, msg
    for w in words:
        assert w in msg, f"{w!r} not in {msg!r}"


def test_cuda_bad_inputs_are_refused_before_launch():
    T, H, K, N = 3, 16, 64, 200
    q, kv, idx, _, _ = make_problem(T, H, K, N, poison_unselected=False)
    # a paged cache whose rows (or blocks) are one row of memory: expand() gives stride 0
    paged = kv[:1].view(torch.uint8).view(1, 1, 1152).expand(4, 8, 1152)
    with pytest.raises(smla.SmlaError) as e:
        smla.sparse_mla(q, paged, idx, format="bf16", softmax_scale=0.1)
    one_line(e, "kv", "stride")
    # a float32 cache for bf16, a float32 cache for fp8_ds_mla
    with pytest.raises(smla.SmlaError) as e:
        smla.sparse_mla(q, kv.float(), idx, format="bf16", softmax_scale=0.1)
    one_line(e, "kv", "bf16")
    with pytest.raises(smla.SmlaError) as e:
        smla.sparse_mla(q.view(torch.uint8)[..., :576].contiguous(), torch.zeros(N, 164, device=DEV), idx,
                        format="fp8_ds_mla", softmax_scale=0.1)
    one_line(e, "kv", "fp8_ds_mla")
    # lse inside out, out inside kv, out inside idx, an output overlapping itself
    out = torch.empty(T, H, 512, dtype=torch.bfloat16, device=DEV)
    lse_in_out = out.view(torch.float32).view(T, H * 256)[:, :H]  # heads contiguous, inside out's rows
    with pytest.raises(smla.SmlaError) as e:
        smla.sparse_mla(q, kv, idx, format="bf16", softmax_scale=0.1, out=out, lse=lse_in_out)
    one_line(e, "overlap")
    out_in_kv = kv[: T * H].view(T, H, 576)[..., :512]
    with pytest.raises(smla.SmlaError) as e:
        smla.sparse_mla(q, kv, idx, format="bf16", softmax_scale=0.1, out=out_in_kv)
    one_line(e, "out", "kv", "overlap")
    big_idx = torch.full((T, T * H * 512), -1, dtype=torch.int32, device=DEV)
    big_idx[:, :K] = idx
    out_in_idx = big_idx.view(torch.bfloat16)[:, : H * 512].reshape(T, H, 512)
    with pytest.raises(smla.SmlaError) as e:
        smla.sparse_mla(q, kv, big_idx, format="bf16", softmax_scale=0.1, out=out_in_idx)
    one_line(e, "out", "idx", "overlap")
    with pytest.raises(smla.SmlaError) as e:
        smla.sparse_mla(q, kv, idx, format="bf16", softmax_scale=0.1, out=out[:1].expand(T, H, 512))
    one_line(e, "out", "overlap")
    # q of the wrong rank, Plan integers, scales
    with pytest.raises(smla.SmlaError) as e:
        smla.sparse_mla(q[0, 0], kv, idx, format="bf16", softmax_scale=0.1)
    one_line(e, "q")
    with pytest.raises(smla.SmlaError) as e:
        smla.Plan(2**31, 64)
    one_line(e, "num_heads")
    with pytest.raises(smla.SmlaError) as e:
        smla.sparse_mla(q, kv, idx, format="bf16", softmax_scale=None)
    one_line(e, "softmax_scale")
    # finish_empty_rows with 5 counts for 3 rows blames counts
    with pytest.raises(smla.SmlaError) as e:
        smla.finish_empty_rows(torch.zeros(5, dtype=torch.int32, device=DEV), out)
    assert str(e.value).startswith("counts")
    torch.cuda.synchronize()  # nothing was launched that could fail asynchronously


def test_cuda_int64_slots_and_requests_are_narrowed_exactly():
    lat = torch.ones(2, 512, dtype=torch.bfloat16, device=DEV)
    rope = torch.ones(2, 64, dtype=torch.bfloat16, device=DEV)
    cache = torch.zeros(2, 8, 1152, dtype=torch.uint8, device=DEV)
    smla.write_cache(lat, rope, torch.tensor([2**32 + 5, -(2**32) + 6], dtype=torch.int64, device=DEV), cache,
                     format="bf16")
    assert not bool(cache.any()), "a slot outside int32 wrote a row"
    pos = torch.tensor([[0, 1, 2], [0, 1, 2]], dtype=torch.int32, device=DEV)
    bt = torch.tensor([[0], [1]], dtype=torch.int32, device=DEV)
    phys, counts = smla.convert_indices(pos, bt, block_size=64,
                                        req_of_token=torch.tensor([0, 2**32 + 1], dtype=torch.int64, device=DEV))
    assert counts.tolist() == [3, 0] and phys[1].tolist() == [-1, -1, -1]


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_any_device():
    """Tensors on cuda:1 run on cuda:1 (one call and a plan made for device 1), whatever the
    current device is."""
    dev1 = torch.device("cuda:1")
    q, kv, idx, cnt, _ = make_problem(4, 16, 128, 1000, counts=True, poison_unselected=False)
    q1, kv1, idx1, cnt1 = q.to(dev1), kv.to(dev1), idx.to(dev1), cnt.to(dev1)
    want_out, want_lse = cpu_reference(q, kv, idx, "bf16", cnt)
    with torch.cuda.device(0):
        out, lse = smla.sparse_mla(q1, kv1, idx1, format="bf16", softmax_scale=DS_SCALE, counts=cnt1)
        assert out.device == dev1
        plan = smla.Plan(16, 128, format="bf16", max_rows=4, device=1)
        ws = plan.new_workspace(q1)
        out2 = torch.empty_like(out)
        lse2 = torch.empty_like(lse)
        plan.run(q1, kv1, idx1, out2, softmax_scale=DS_SCALE, counts=cnt1, lse=lse2, workspace=ws)
    torch.cuda.synchronize(dev1)
    assert rel_l2(out.float().cpu().numpy(), want_out) <= 1e-2
    assert lse_diff(lse.cpu().numpy(), want_lse) <= 1e-3
    torch.testing.assert_close(out2, out, rtol=0, atol=0)


# ---------------------------------------------------------------------------------------------
# fp8 scores: Plan(score_precision="fp8"), and the default "auto", run h64.ws.q8 (S = q·k on the fp8
# tensor cores) for an e4m3 q over an fp8 cache; DESIGN.md §8's fp8-product bar against the reference on the same e4m3
# q and the dequantized rows: rel L2 <= 5e-3, LSE abs <= 1e-2, mean signed LSE error within 1e-3


@pytest.mark.parametrize("fmt", ["fp8_ds_mla", "fp8_e4m3"])
@pytest.mark.parametrize("T,H,K,N", [(8, 64, 512, 3000), (3, 128, 2048, 5000), (130, 16, 200, 1000)])
def test_fp8_scores_plan_run_matches_cpu_reference(fmt, T, H, K, N):
    q_scale = 0.05
    k_scale = 0.3 if fmt == "fp8_e4m3" else 1.0
    reason = smla.support(H, K, format=fmt, q_dtype="e4m3", score_precision="fp8", backend="cuda")
    assert reason == "", reason
    assert smla.kernel_for(H, K, format=fmt, q_dtype="e4m3", score_precision="fp8",
                           device=0) == f"sm90/sparse_mla/{fmt}_d576/h64.ws.q8"
    # fp8_ds_mla at H <= 32: auto and bf16 scores run the swap-AB kernel, the q widened exactly (perf-history s11,
    # s14-swapab-n32); fp8_e4m3 at H <= 32: bf16 scores run it too (session 12), auto stays on the fp8 tensor cores
    small = fmt == "fp8_ds_mla" and H <= 32
    small_bf16 = H <= 32
    assert smla.kernel_for(H, K, format=fmt, q_dtype="e4m3", device=0).endswith(
        "/swapab" if small else "/h64.ws.q8")  # auto
    assert smla.kernel_for(H, K, format=fmt, q_dtype="e4m3", score_precision="bf16", device=0).endswith(
        "/swapab" if small_bf16 else "/h64.ws")

    g = torch.Generator(device="cpu").manual_seed(T * 1000 + H)
    q8 = (torch.randn(T, H, 576, generator=g) * 20).to(torch.float8_e4m3fn).to(DEV)
    latent = (torch.randn(N, 512, generator=g) * 2).to(torch.bfloat16).to(DEV)
    rope = (torch.randn(N, 64, generator=g) * 2).to(torch.bfloat16).to(DEV)
    cache = torch.zeros(N, smla.row_bytes(fmt, 64), dtype=torch.uint8, device=DEV)
    smla.write_cache(latent, rope, torch.arange(N, dtype=torch.int32, device=DEV), cache, format=fmt,
                     k_scale=k_scale)
    idx = torch.randint(0, N, (T, K), generator=g, dtype=torch.int32)
    r = torch.rand(T, K, generator=g)
    idx[r < 0.1] = -1
    idx[(r >= 0.1) & (r < 0.15)] = N + 5
    if T > 1:
        idx[0] = -1  # an all-invalid row: out 0, LSE -inf
    used = torch.zeros(N, dtype=torch.bool)
    sel = idx[(idx >= 0) & (idx < N)].long()
    used[sel] = True
    cache[~used.to(DEV)] = 0xFF  # unselected rows are NaN (e4m3 0xff, fp32 scales 0xffffffff)
    idx = idx.to(DEV)

    plan = smla.Plan(H, K, format=fmt, q_dtype="e4m3", score_precision="fp8", max_rows=T)
    assert plan.score_precision == "fp8"
    ws = plan.new_workspace(q8)
    out = torch.full((T, H, 512), float("nan"), dtype=torch.bfloat16, device=DEV)  # poisoned
    lse = torch.full((T, H), float("nan"), dtype=torch.float32, device=DEV)
    plan.run(q8, cache, idx, out, softmax_scale=DS_SCALE, lse=lse, q_scale=q_scale, k_scale=k_scale, workspace=ws)
    torch.cuda.synchronize()

    want_out, want_lse = smla.sparse_mla(q8.view(torch.uint8).cpu().numpy(), cache.cpu().numpy(), host(idx),
                                         format=fmt, softmax_scale=DS_SCALE, q_scale=q_scale, k_scale=k_scale,
                                         out_dtype="f32")
    got_out, got_lse = out.float().cpu().numpy(), lse.cpu().numpy()
    assert np.isfinite(got_out).all()
    err = rel_l2(got_out, want_out)
    lerr = lse_diff(got_lse, want_lse)
    finite = np.isfinite(want_lse)
    assert (np.isneginf(got_lse) == np.isneginf(want_lse)).all()
    mean = float(np.mean(got_lse[finite].astype(np.float64) - want_lse[finite]))
    print(f"[fp8 S] {fmt} T={T} H={H} K={K}: out rel L2 {err:.2e}, LSE max abs {lerr:.2e}, mean signed {mean:+.2e}")
    assert err <= 5e-3
    assert lerr <= 1e-2
    assert abs(mean) <= 1e-3, "the fp8 score sums are biased"

    # the plan's precision travels in the params it builds: a bf16-score plan gives the h64.ws
    # result (within the bf16 bar), the one-call path and the custom op take the keyword too;
    # the default (auto) plan, one call and op run h64.ws.q8: the fp8 plan's result, bit for bit
    # (fp8_ds_mla at H <= 32: swapab, the bf16 plan's result bit for bit, checked below)
    plan_auto = smla.Plan(H, K, format=fmt, q_dtype="e4m3", max_rows=T)
    assert plan_auto.score_precision == "auto"
    out_a = torch.empty_like(out)
    lse_a = torch.empty_like(lse)
    plan_auto.run(q8, cache, idx, out_a, softmax_scale=DS_SCALE, lse=lse_a, q_scale=q_scale, k_scale=k_scale,
                  workspace=plan_auto.new_workspace(q8))
    out_a1, lse_a1 = smla.sparse_mla(q8, cache, idx, format=fmt, softmax_scale=DS_SCALE, q_scale=q_scale,
                                     k_scale=k_scale)
    out_a2, lse_a2 = torch.ops.smla.sparse_mla(q8, None, cache, idx, None, None, fmt, DS_SCALE, q_scale, k_scale)
    torch.cuda.synchronize()
    if not small:
        torch.testing.assert_close(out_a, out, rtol=0, atol=0)
        torch.testing.assert_close(lse_a, lse, rtol=0, atol=0)
    for o, x in [(out_a1, lse_a1), (out_a2, lse_a2)]:
        assert rel_l2(o.float().cpu().numpy(), want_out) <= 5e-3
        assert lse_diff(x.cpu().numpy(), want_lse) <= 1e-2
    plan16 = smla.Plan(H, K, format=fmt, q_dtype="e4m3", score_precision="bf16", max_rows=T)
    out16 = torch.empty_like(out)
    lse16 = torch.empty_like(lse)
    plan16.run(q8, cache, idx, out16, softmax_scale=DS_SCALE, lse=lse16, q_scale=q_scale, k_scale=k_scale,
               workspace=plan16.new_workspace(q8))
    out1, lse1 = smla.sparse_mla(q8, cache, idx, format=fmt, softmax_scale=DS_SCALE, q_scale=q_scale,
                                 k_scale=k_scale, score_precision="fp8")
    out2, lse2 = torch.ops.smla.sparse_mla(q8, None, cache, idx, None, None, fmt, DS_SCALE, q_scale, k_scale, 64,
                                           "e", "fp8")
    torch.cuda.synchronize()
    assert rel_l2(out16.float().cpu().numpy(), want_out) <= 1e-2
    assert lse_diff(lse16.cpu().numpy(), want_lse) <= 1e-3
    if small:  # auto ran the bf16 path: its result, bit for bit
        torch.testing.assert_close(out_a, out16, rtol=0, atol=0)
        torch.testing.assert_close(lse_a, lse16, rtol=0, atol=0)
    for o, x in [(out1, lse1), (out2, lse2)]:
        assert rel_l2(o.float().cpu().numpy(), want_out) <= 5e-3
        assert lse_diff(x.cpu().numpy(), want_lse) <= 1e-2


def test_fp8_scores_custom_op_under_torch_compile():
    T, H, K, N = 4, 16, 128, 600
    g = torch.Generator(device="cpu").manual_seed(5)
    q8 = (torch.randn(T, H, 576, generator=g) * 20).to(torch.float8_e4m3fn).to(DEV)
    cache = torch.zeros(N, smla.row_bytes("fp8_ds_mla", 64), dtype=torch.uint8, device=DEV)
    smla.write_cache((torch.randn(N, 512, generator=g) * 2).to(torch.bfloat16).to(DEV),
                     (torch.randn(N, 64, generator=g) * 2).to(torch.bfloat16).to(DEV),
                     torch.arange(N, dtype=torch.int32, device=DEV), cache, format="fp8_ds_mla")
    idx = torch.randint(0, N, (T, K), generator=g, dtype=torch.int32).to(DEV)

    def layer(q8, cache, idx):
        out, lse = torch.ops.smla.sparse_mla(q8, None, cache, idx, None, None, "fp8_ds_mla", DS_SCALE, 0.05, 1.0,
                                             64, "e", "fp8")
        return out.float() * 2.0, lse + 1.0

    torch._dynamo.reset()
    got_out, got_lse = torch.compile(layer, fullgraph=True)(q8, cache, idx)
    want_out, want_lse = smla.sparse_mla(q8.view(torch.uint8).cpu().numpy(), cache.cpu().numpy(), host(idx),
                                         format="fp8_ds_mla", softmax_scale=DS_SCALE, q_scale=0.05, out_dtype="f32")
    assert rel_l2(got_out.cpu().numpy() / 2.0, want_out) <= 5e-3
    assert lse_diff(got_lse.cpu().numpy() - 1.0, want_lse) <= 1e-2
    torch.library.opcheck(torch.ops.smla.sparse_mla.default,
                          (q8, None, cache, idx, None, None, "fp8_ds_mla", DS_SCALE, 0.05, 1.0, 64, "e", "fp8"),
                          # test_schema multiplies the inputs, which PyTorch does not implement for
                          # float8_e4m3fn ("mul_cuda"); the schema itself is checked with a bf16 q elsewhere.
                          test_utils=("test_faketensor",))
    with pytest.raises(smla.SmlaError, match=r'score_precision must be "auto", "bf16" or "fp8"'):
        torch.ops.smla.sparse_mla(q8, None, cache, idx, None, None, "fp8_ds_mla", DS_SCALE, 0.05, 1.0, 64, "e", "f8")
