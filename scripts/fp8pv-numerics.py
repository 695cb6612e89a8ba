#!/usr/bin/env python3
"""Numerics model of swapab's P V on the e4m3 tensor cores (docs/perf-history.md#s13-fp8pv).

Emulates, on random fp8_ds_mla rows like the GPU tests' (latent N(0, 1) times a per-row magnitude, per-128-dim
tile scales), the output error of:
  bf16  today's path: P * scale_j * 2^56 rounded to bf16, fp32 accumulation;
  fp8   the new path: v = f16(f16(P) * f16(scale_j * F_j)) with F_j = 2^(7 - floor(log2(max_rows scale_j))),
        hi = e4m3_rn(v), lo = e4m3_rn(v - hi) (exact in f16), each tile's products into a fresh accumulator
        through a model of the fp8 wgmma's accumulation (per k32 instruction: every term and C truncated toward
        zero at 2^(E - F) with E the largest exponent among them, F fraction bits), added to fp32 O times 1 / F_j;
  fp8hi the same with hi only (no lo): why the split is needed.
The scores are exact (the S path is unchanged: the LSE is too); the reference is float64 on the dequantized rows.
Prints out's relative L2 error per case (worst of the draws), and in parentheses the worst 128-dim latent tile's
own relative L2 error (one F for all four tiles j loses there when a tile's scales are far below the others').
"""
import argparse
import numpy as np


def e4m3(x):
    """Round to nearest even e4m3 (finite, saturating at 448), exact in float64."""
    x = np.asarray(x, dtype=np.float64)
    a = np.abs(x)
    e = np.floor(np.log2(np.where(a > 0, a, 1.0)))
    e = np.maximum(e, -6.0)  # subnormals: ulp 2^-9
    ulp = np.exp2(e - 3)
    r = np.round(a / ulp) * ulp
    r = np.minimum(r, 448.0)
    return np.sign(x) * r


def bf16(x):
    x = np.asarray(x, dtype=np.float32)
    b = x.view(np.uint32).astype(np.uint64)
    b = (b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000
    return b.astype(np.uint32).view(np.float32).astype(np.float64)


def f16(x):
    return np.asarray(x, dtype=np.float64).astype(np.float16).astype(np.float64)


def trunc_sum(c, terms, fbits):
    """C + sum(terms over axis 0), each truncated toward zero at 2^(E - fbits), E the largest exponent."""
    allt = np.concatenate([c[None], terms], axis=0)
    if fbits is None:
        return np.float32(allt.sum(axis=0)).astype(np.float64)
    a = np.abs(allt).max(axis=0)
    E = np.floor(np.log2(np.where(a > 0, a, 1.0)))
    q = np.exp2(E - fbits)
    t = np.trunc(allt / q) * q
    return t.sum(axis=0).astype(np.float32).astype(np.float64)


def run_case(rng, K, H, row_mag_spread, pow2_scales, score_mul, fbits_list, group_step=0.0):
    D, R = 512, 64
    lat = rng.standard_normal((K, D)) * np.exp2(rng.uniform(-row_mag_spread, row_mag_spread, (K, 1)))
    lat *= np.repeat(np.exp2(-group_step * np.arange(4)), 128)[None, :]  # 128-dim group j times 2^(-group_step j)
    rope = rng.standard_normal((K, R))
    scales = np.empty((K, 4))
    codes = np.empty((K, D))
    for j in range(4):
        blk = lat[:, 128 * j:128 * (j + 1)]
        amax = np.abs(blk).max(axis=1)
        s = np.exp2(np.ceil(np.log2(amax / 448.0))) if pow2_scales else (amax / 448.0).astype(np.float32)
        scales[:, j] = s
        codes[:, 128 * j:128 * (j + 1)] = e4m3(blk / s[:, None])
    V = codes * np.repeat(scales, 128, axis=1)  # dequantized latent
    q = bf16(rng.standard_normal((H, D + R)))
    Kfull = np.concatenate([V, bf16(rope)], axis=1)
    sm = score_mul / np.sqrt(D + R)
    S = (q @ Kfull.T) * sm * np.log2(np.e)  # log2 domain, (H, K)
    # reference
    m = S.max(axis=1, keepdims=True)
    p = np.exp2(S - m)
    ref = (p @ V) / p.sum(axis=1, keepdims=True)  # (H, D)

    def model(mode, fbits):
        O = np.zeros((D, H))
        l = np.zeros(H)
        mrun = np.full(H, -np.inf)
        for t0 in range(0, K, 64):
            x = S[:, t0:t0 + 64]
            mn = np.maximum(mrun, x.max(axis=1))
            f = np.where(np.isinf(mrun), 0.0, np.exp2(np.float32(mrun - mn)))
            mrun = mn
            P = np.exp2((x - mn[:, None]).astype(np.float32)).astype(np.float64)  # (H, 64)
            l = l * f + P.sum(axis=1)
            O *= f[None, :]
            for j in range(4):
                c = codes[t0:t0 + 64, 128 * j:128 * (j + 1)]  # (64 rows, 128 dims)
                s = scales[t0:t0 + 64, j]
                if mode == 'bf16':
                    B = bf16(P * (s[None, :] * 2.0 ** 56))  # (H, 64)
                    O[128 * j:128 * (j + 1)] += (c.T @ B.T) * 2.0 ** -56
                    continue
                smax = scales[t0:t0 + 64].max() if mode.endswith('1f') else s.max()
                E = np.floor(np.log2(smax))
                F = 2.0 ** (7 - E)
                v = f16(f16(P) * f16(s * F)[None, :])
                hi = e4m3(v)
                lo = e4m3(f16(v - hi)) if mode.startswith('fp8') and not mode.startswith('fp8hi') else np.zeros_like(hi)
                acc = np.zeros((128, H))
                for ks in range(2):  # the kernel's order: per k32 step, hi then lo
                    for part in (hi, lo):
                        cc = c[32 * ks:32 * ks + 32]  # (32, 128)
                        pp = part[:, 32 * ks:32 * ks + 32]  # (H, 32)
                        terms = cc[:, :, None] * pp.T[:, None, :]  # (32, 128, H), exact products
                        acc = trunc_sum(acc, terms, fbits)
                O[128 * j:128 * (j + 1)] += acc / F
        return (O / l[None, :]).T

    res = {}
    res['bf16'] = model('bf16', None)
    for fb in fbits_list:
        res[f'fp8 F={fb}'] = model('fp8', fb)
    res['fp8 one F per tile, F=13'] = model('fp8_1f', 13)
    res['fp8hi F=13'] = model('fp8hi', 13)
    def err(v):  # out's rel L2, and the worst 128-dim latent tile's own rel L2
        g = max(np.linalg.norm(v[:, 128 * j:128 * j + 128] - ref[:, 128 * j:128 * j + 128]) /
                np.linalg.norm(ref[:, 128 * j:128 * j + 128]) for j in range(4))
        return np.array([np.linalg.norm(v - ref) / np.linalg.norm(ref), g])
    return {k: err(v) for k, v in res.items()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--seed', type=int, default=1)
    ap.add_argument('--trials', type=int, default=2)
    a = ap.parse_args()
    rng = np.random.default_rng(a.seed)
    cases = [  # (K, H, per-row magnitude spread in binades, pow2 scales, score multiplier, group j at 2^(-step j))
        (2048, 16, 0.0, True, 1.0, 0), (2048, 16, 0.0, True, 8.0, 0), (2048, 16, 4.0, True, 1.0, 0),
        (2048, 16, 4.0, False, 4.0, 0), (128, 16, 0.0, True, 1.0, 0), (128, 8, 8.0, False, 16.0, 0),
        (2048, 16, 0.0, True, 1.0, 3), (2048, 16, 4.0, False, 4.0, 4)]
    for K, H, spread, p2, mul, gstep in cases:
        worst = {}
        for _ in range(a.trials):
            r = run_case(rng, K, H, spread, p2, mul, [13, 10, None], gstep)
            for k, v in r.items():
                worst[k] = np.maximum(worst.get(k, 0.0), v)
        print(f"K={K:5d} H={H:2d} row spread 2^±{spread:g} {'pow2' if p2 else 'fp32'} scales, scores x{mul:g}, "
              f"group step 2^-{gstep:g}: " +
              ", ".join(f"{k} {v[0]:.2e} (tile {v[1]:.2e})" for k, v in worst.items()))


if __name__ == '__main__':
    main()
