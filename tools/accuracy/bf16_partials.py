#!/usr/bin/env python3
"""What bf16 split-K partials cost the output (issue #19.3, docs/perf-history.md s10-partials).

A NumPy model (float64 reference, no GPU) of the SM90 kernel's split-K numerics on one row of a head: scores in fp32
from bf16 q and rows, per split the running max, P = exp2 in fp32 rounded to bf16 for the PV product (fp32
accumulate), l summed in fp32, the partial O / l stored as fp32 (before) or rounded to bf16 (after), the LSE merge in
fp32 (combine.cuh's weights), the output rounded to bf16. Prints DESIGN.md §8's out rel L2 (whole tensor) against the
float64 reference on the same bf16 inputs, both ways, for T = 1..32-like splits of K = 2048.

    python3 tools/accuracy/bf16_partials.py [--rows 256] [--seed 0]

It is a model: the fp8 score paths' own score error is not in it (it adds in quadrature; their measured out rel L2
is 1.6-1.9e-3 today, perf-history s10). The GPU tests are the verdict.
"""
import argparse

import numpy as np


def bf16(x):
    """Round float32 values to bf16 (nearest, ties to even), returned as float32."""
    x = np.asarray(x, dtype=np.float32)
    b = x.view(np.uint32).astype(np.uint64)
    b = (b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000
    return b.astype(np.uint32).view(np.float32)


def run(rows, K, S, q_std, v_mul, rng, scale=1.0 / np.sqrt(576.0)):
    D, DV = 576, 512
    q = bf16(rng.standard_normal((rows, D)) * (q_std / v_mul))  # the latent is K too: q scaled back
    kv = bf16(rng.standard_normal((rows, K, D)))
    kv = bf16(kv.astype(np.float64) * v_mul)  # a scaled cache: the latent (V) and its RoPE part
    v = kv[:, :, :DV]
    k = kv
    s64 = np.einsum("rd,rkd->rk", q.astype(np.float64), k.astype(np.float64)) * scale
    p64 = np.exp(s64 - s64.max(axis=1, keepdims=True))
    ref = np.einsum("rk,rkv->rv", p64 / p64.sum(axis=1, keepdims=True), v.astype(np.float64))
    s32 = (s64 / scale).astype(np.float32) * np.float32(scale * np.log2(np.e))  # log2 domain, fp32
    chunk = -(-K // S)
    outs = {}
    for mode in ("fp32", "bf16"):
        parts, lses = [], []
        for j in range(S):
            sl = slice(j * chunk, min(K, (j + 1) * chunk))
            ss = s32[:, sl]
            m = ss.max(axis=1, keepdims=True)
            p = np.exp2(ss - m).astype(np.float32)
            o = np.einsum("rk,rkv->rv", bf16(p).astype(np.float32), v[:, sl].astype(np.float32), dtype=np.float32)
            l = p.sum(axis=1, dtype=np.float32)
            part = (o / l[:, None]).astype(np.float32)
            parts.append(bf16(part) if mode == "bf16" else part)
            lses.append(((m[:, 0] + np.log2(l)) * np.float32(np.log(2.0))).astype(np.float32))
        lse = np.stack(lses, 1)
        mx = lse.max(axis=1, keepdims=True)
        e = np.exp(lse - mx).astype(np.float32)
        w = (e / e.sum(axis=1, keepdims=True)).astype(np.float32)
        out = np.zeros((rows, DV), np.float32)
        for j in range(S):
            out += w[:, j : j + 1] * parts[j]
        outs[mode] = bf16(out).astype(np.float64)
    ref_norm = np.linalg.norm(ref)
    return {m: np.linalg.norm(o - ref) / ref_norm for m, o in outs.items()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=256)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    rng = np.random.default_rng(a.seed)
    print(f"{'case':44s} {'fp32 partials':>14s} {'bf16 partials':>14s}")
    for name, K, S, q_std, v_mul in [
        ("T = 1, H >= 16 (32 splits of 64)", 2048, 32, 1.0, 1.0),
        ("T = 32, H = 128 (2 splits of 1024)", 2048, 2, 1.0, 1.0),
        ("T = 32, H <= 64 (4 splits of 512)", 2048, 4, 1.0, 1.0),
        ("batch-invariant-like (8 splits of 256)", 2048, 8, 1.0, 1.0),
        ("32 splits, V x 1e4", 2048, 32, 1.0, 1e4),
        ("32 splits, large scores (q std 8)", 2048, 32, 8.0, 1.0),
        ("no split (for scale)", 2048, 1, 1.0, 1.0),
    ]:
        r = run(a.rows, K, S, q_std, v_mul, rng)
        print(f"{name:44s} {r['fp32']:14.3e} {r['bf16']:14.3e}")


if __name__ == "__main__":
    main()
