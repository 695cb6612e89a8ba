#!/usr/bin/env python3
"""What an e4m3 q costs in accuracy (issue #4, docs/perf-history.md session 8).

Runs smla's CPU reference (float64) twice over the same fp8_ds_mla (or fp8_e4m3) rows: once with a
bf16 q, once with that q quantized to e4m3 with a per-tensor scale amax / 448 (what a serving layer's
static q_scale does), and prints the relative L2 error of out and the largest LSE difference. This is
the error a kernel would add by quantizing a bf16 q itself before an fp8 tensor-core score; an e4m3 q
passed by the caller is read exactly.

    python3 tools/accuracy/e4m3_q.py [--format fp8_ds_mla] [--heads 64] [--tokens 4] [--topk 2048]
"""
import argparse

import numpy as np

import smla


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--format", default="fp8_ds_mla", choices=["fp8_ds_mla", "fp8_e4m3"])
    ap.add_argument("--heads", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=4)
    ap.add_argument("--topk", type=int, default=2048)
    ap.add_argument("--rows", type=int, default=16384)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()

    rng = np.random.default_rng(args.seed)
    T, H, K, N = args.tokens, args.heads, args.topk, args.rows
    kv = smla.encode_rows(args.format, rng.standard_normal((N, 512)), rng.standard_normal((N, 64)))
    idx = rng.integers(0, N, size=(T, K), dtype=np.int32)
    q = rng.standard_normal((T, H, 576)).astype(np.float32)
    q_bf16 = smla.bf16_bits(q)
    q_vals = smla.bf16_to_float(q_bf16)  # the bf16 q, quantized from here
    q_scale = float(np.abs(q_vals).max()) / 448.0
    q_e4m3 = smla.encode_rows("fp8_e4m3", q_vals[..., :512].reshape(-1, 512), q_vals[..., 512:].reshape(-1, 64),
                              k_scale=q_scale).reshape(T, H, 576)

    print(f"{args.format}, T = {T}, H = {H}, K = {K}, q_scale = {q_scale:.4g} (per tensor, amax / 448)")
    for scale_name, scale in [("1/sqrt(576)", 576 ** -0.5), ("DeepSeek-V3.2", 0.1352338), ("1/sqrt(192)", 192 ** -0.5)]:
        ref, ref_lse = smla.sparse_mla(q_bf16, kv, idx, format=args.format, softmax_scale=scale, out_dtype="f32")
        got, got_lse = smla.sparse_mla(q_e4m3, kv, idx, format=args.format, softmax_scale=scale, q_scale=q_scale,
                                       q_dtype="e4m3", out_dtype="f32")
        rel = np.linalg.norm(got - ref) / np.linalg.norm(ref)
        print(f"  softmax scale {scale_name:>14} ({scale:.4f}): out rel L2 {rel:.2e}, "
              f"LSE max abs {np.abs(got_lse - ref_lse).max():.2e}   (bar: 1e-2 / 1e-2, DESIGN.md 8: LSE 1e-3)")


if __name__ == "__main__":
    main()
