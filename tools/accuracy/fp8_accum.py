#!/usr/bin/env python3
"""What the fp8 tensor cores' short accumulator costs the scores (issue #19.5, docs/perf-history.md s10-q8-e4m3).

A model of Hopper's fp8 wgmma sum, in NumPy (float64, no GPU): every e4m3 x e4m3 product is exact; each hardware
step adds `--group` products to the accumulator after aligning all of them (the accumulator included) to the largest
exponent among them and dropping the bits more than `--align-bits` below it (truncation toward zero); the step's sum is
kept with `--acc-bits` mantissa bits (e8m13 by default: DeepSeek-V3's "about 14 bits"), also truncated. A chain of
wgmma instructions feeds that accumulator back in, so its error grows with the largest partial sum of the chain;
adding fresh chains in fp32 bounds it. The script runs the data of the Python GPU test
(tests/python/test_binding_torch_gpu.py, test_fp8_scores_plan_run_matches_cpu_reference) and of the C++ GPU cases
(tests/gpu/test_sparse_mla_quant.cpp; cpp-big: its *_big_scores cases, T = 65537 cut to 3000) through three schemes and prints §8's figures (out rel L2, LSE max abs, mean
signed LSE error) against the float64 reference on the same e4m3 values:

    chain   fp8_e4m3 before session 10: one chain over all 576 dims (18 k32 steps)
    p128    one chain per 128 dims (4 steps) and one for the 64-dim RoPE (2 steps), added in fp32
    dsmla   fp8_ds_mla's path: a chain per 128-dim tile times its scale, the RoPE in bf16 (exact here)

    python3 tools/accuracy/fp8_accum.py [--data python|cpp|cpp-big] [--align-bits 13] [--acc-bits 13] [--group 32]

It is a model, calibrated against the one measurement it must reproduce (the single chain's LSE errors on the Python
test's data, session 9 run 8); the GPU tests are the verdict.
"""
import argparse
import math

import numpy as np


def e4m3(x):
    """Round to the nearest e4m3 value (OCP fn: 3 mantissa bits, subnormals from 2^-9, max 448), ties to even."""
    x = np.asarray(x, dtype=np.float64)
    a = np.abs(x)
    e = np.floor(np.log2(np.maximum(a, 2.0**-9)))
    e = np.maximum(e, -6.0)  # subnormal spacing 2^-9 below 2^-6
    q = 2.0 ** (e - 3)
    r = np.round(a / q) * q  # np.round: ties to even
    return np.sign(x) * np.minimum(r, 448.0)


def bf16(x):
    x = np.asarray(x, dtype=np.float32)
    b = x.view(np.uint32).astype(np.uint64)
    b = (b + 0x7FFF + ((b >> 16) & 1)) >> 16 << 16
    return b.astype(np.uint32).view(np.float32).astype(np.float64)


def trunc_bits(x, bits, ref_exp):
    """x truncated toward zero to a multiple of 2^(ref_exp - bits)."""
    ulp = np.exp2(ref_exp - bits)
    return np.trunc(x / ulp) * ulp


def exponent(a):
    with np.errstate(divide="ignore"):
        return np.floor(np.log2(a))


def tc_chain(q, k, dims, args):
    """The tensor core's sum of q[..., d] * k[..., d] over `dims` as one chain of k32 instructions.
    q: [h, D], k: [n, D] -> [h, n]."""
    acc = np.zeros((q.shape[0], k.shape[0]))
    g = args.group
    for d0 in range(dims.start, dims.stop, g):
        prod = q[:, None, d0:d0 + g] * k[None, :, d0:d0 + g]  # exact in float64
        terms_max = np.maximum(np.abs(prod).max(axis=-1), np.abs(acc))
        e = exponent(np.where(terms_max > 0, terms_max, 1.0))[..., None]
        s = trunc_bits(prod, args.align_bits, e).sum(axis=-1) + trunc_bits(acc, args.align_bits, e[..., 0])
        es = exponent(np.where(s != 0, np.abs(s), 1.0))
        acc = trunc_bits(s, args.acc_bits, es)
    return acc


def scores(scheme, q, k, kscale, args):
    """Raw scores sum_d q_d k_d in code units (q, k: e4m3 codes; ds_mla tile scales applied)."""
    if scheme == "exact":
        if kscale is None:
            return q @ k.T
        s = sum((q[:, 128 * t:128 * t + 128] @ k[:, 128 * t:128 * t + 128].T) * kscale[None, :, t] for t in range(4))
        return s + q[:, 512:] @ k[:, 512:].T
    if scheme == "chain":
        return tc_chain(q, k, range(0, 576), args)
    if scheme in ("p128", "p64"):
        f32 = lambda x: x.astype(np.float32).astype(np.float64)
        w = int(scheme[1:])
        s = np.zeros((q.shape[0], k.shape[0]))
        for d0 in range(0, 512, w):
            s = f32(s + tc_chain(q, k, range(d0, d0 + w), args))
        return f32(s + tc_chain(q, k, range(512, 576), args))
    if scheme == "dsmla":
        f32 = lambda x: x.astype(np.float32).astype(np.float64)
        s = np.zeros((q.shape[0], k.shape[0]))
        for t in range(4):
            s = f32(s + tc_chain(q, k, range(128 * t, 128 * t + 128), args) * kscale[None, :, t])
        return f32(s + q[:, 512:] @ k[:, 512:].T)  # bf16 RoPE (fp32 accumulation: exact enough here)
    raise ValueError(scheme)


def make_python_data(fmt, T, H, K, N, rng):
    """The Python GPU test's data: q = e4m3(randn * 20) with q_scale 0.05; rows bf16(randn * 2), written with k_scale
    0.3 (fp8_e4m3) or per-tile power-of-two scales (fp8_ds_mla); 10% of the entries -1, 5% out of range, row 0 empty."""
    q = e4m3(rng.standard_normal((T, H, 576)) * 20)
    lat = bf16(rng.standard_normal((N, 512)) * 2)
    rope = bf16(rng.standard_normal((N, 64)) * 2)
    idx = rng.integers(0, N, size=(T, K))
    r = rng.random((T, K))
    valid = r >= 0.15
    if T > 1:
        valid[0] = False
    return q, 0.05, lat, rope, idx, valid


def make_cpp_data(fmt, T, H, K, N, rng, q_scale=0.05, k_scale=0.5):
    """The C++ GPU cases' data (devtools/testing.cpp): q = e4m3(N(0,1) / q_scale); fp8_e4m3 rows N(0, k_scale^2)
    written with k_scale; fp8_ds_mla rows N(0, 1); 10% invalid."""
    q = e4m3(rng.standard_normal((T, H, 576)) / q_scale)
    m = k_scale if fmt == "fp8_e4m3" else 1.0
    lat = rng.standard_normal((N, 512)).astype(np.float32).astype(np.float64) * m
    rope = rng.standard_normal((N, 64)).astype(np.float32).astype(np.float64) * m
    idx = rng.integers(0, N, size=(T, K))
    valid = rng.random((T, K)) >= 0.1
    return q, q_scale, lat, rope, idx, valid


def encode(fmt, lat, rope, k_scale):
    """Codes [N, 576] and (ds_mla) tile scales [N, 4]; the value of dim d is code * scale."""
    if fmt == "fp8_e4m3":
        return e4m3(np.concatenate([lat, rope], axis=1) / k_scale), None
    amax = np.abs(lat.reshape(-1, 4, 128)).max(axis=-1)
    sc = np.exp2(np.ceil(np.log2(np.maximum(amax / 448.0, 2.0**-126))))
    codes = e4m3(lat.reshape(-1, 4, 128) / sc[..., None]).reshape(-1, 512)
    return np.concatenate([codes, rope], axis=1), sc  # RoPE bf16 values, scale 1


def run_case(fmt, data, T, H, K, N, args, rng):
    softmax_scale = args.softmax_scale
    if data == "python":
        k_scale = 0.3 if fmt == "fp8_e4m3" else 1.0
        q, q_scale, lat, rope, idx, valid = make_python_data(fmt, T, H, K, N, rng)
    elif data == "cpp":
        k_scale = 0.5 if fmt == "fp8_e4m3" else 1.0
        q, q_scale, lat, rope, idx, valid = make_cpp_data(fmt, T, H, K, N, rng)
    else:  # cpp-big: the *_big_scores cases (fp8_e4m3 rows N(0, 4) at k_scale 2; fp8_ds_mla twice the softmax scale)
        k_scale = 2.0 if fmt == "fp8_e4m3" else 1.0
        q, q_scale, lat, rope, idx, valid = make_cpp_data(fmt, T, H, K, N, rng, k_scale=k_scale)
        if fmt != "fp8_e4m3":
            softmax_scale *= 2
    codes, tsc = encode(fmt, lat, rope, k_scale)
    vals = codes[:, :512] * (np.repeat(tsc, 128, axis=1) if tsc is not None else k_scale)
    mul = softmax_scale * q_scale * (k_scale if fmt == "fp8_e4m3" else 1.0)
    schemes = args.schemes.split(",") if fmt == "fp8_e4m3" else ["dsmla"]
    res = {s: {"lse_err": [], "num": 0.0, "den": 0.0} for s in schemes}
    for t in range(T):
        sel = idx[t][valid[t]]
        if sel.size == 0:
            continue
        kt = codes[sel]
        st = tsc[sel] if tsc is not None else None
        ref = scores("exact", q[t], kt, st, args) * mul
        m = ref.max(axis=1, keepdims=True)
        pr = np.exp(ref - m)
        lse_ref = m[:, 0] + np.log(pr.sum(axis=1))
        out_ref = (pr / pr.sum(axis=1, keepdims=True)) @ vals[sel]
        for s in schemes:
            got = scores(s, q[t], kt, st, args) * mul
            m2 = got.max(axis=1, keepdims=True)
            p2 = np.exp(got - m2)
            lse = m2[:, 0] + np.log(p2.sum(axis=1))
            out = (p2 / p2.sum(axis=1, keepdims=True)) @ vals[sel]
            res[s]["lse_err"].append(lse - lse_ref)
            res[s]["num"] += float(((out - out_ref) ** 2).sum())
            res[s]["den"] += float((out_ref ** 2).sum())
    for s in schemes:
        e = np.concatenate(res[s]["lse_err"])
        print(f"  {fmt:10s} {s:5s} T={T:3d} H={H:3d} K={K:4d}: out rel L2 {math.sqrt(res[s]['num'] / res[s]['den']):.2e}, "
              f"LSE max abs {np.abs(e).max():.2e}, mean signed {e.mean():+.2e}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default="python", choices=["python", "cpp", "cpp-big"])
    ap.add_argument("--align-bits", type=int, default=13, help="bits kept below the step's largest exponent")
    ap.add_argument("--acc-bits", type=int, default=13, help="mantissa bits of the accumulator between steps")
    ap.add_argument("--group", type=int, default=32, help="products per hardware step (k32 wgmma: 32)")
    ap.add_argument("--softmax-scale", type=float, default=0.1352338)
    ap.add_argument("--formats", default="fp8_e4m3,fp8_ds_mla")
    ap.add_argument("--schemes", default="chain,p128", help="fp8_e4m3's schemes: chain, p128, p64")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    print(f"data {args.data}: align {args.align_bits} bits, accumulator {args.acc_bits} bits, {args.group} products "
          f"per step")
    shapes = {"python": [(8, 64, 512, 3000), (3, 128, 2048, 5000), (130, 16, 200, 1000)],
              "cpp": [(2, 64, 300, 4096), (5, 16, 2048, 16384), (3, 128, 2048, 16384)],
              "cpp-big": [(8, 64, 512, 4096), (3, 128, 2048, 16384), (130, 16, 200, 4096), (3000, 2, 16, 65536)]}[args.data]
    for fmt in args.formats.split(","):
        for T, H, K, N in shapes:
            run_case(fmt, args.data, T, H, K, N, args, rng)


if __name__ == "__main__":
    main()
