#!/usr/bin/env python3
"""Stall samples of h64.ws (bf16, main 464459f) by warpgroup role and tile-loop phase.

Reads the per-SASS-line tables of session 12's ncu run (build-carry/s12/ncu/ncu-bf16-h{128,64}.csv.gz,
made by the commands in docs/perf-history.md#s12-bf16-inflight-check) and prints what
docs/perf-history.md#s13-bf16-h128-ncu quotes. The row ranges below are that binary's SASS (the same
instantiation at both H); the anchors are checked, so a table from another build fails loudly.
Usage: read_ncu.py DIR   (DIR holds the two .csv.gz files)
"""
import collections
import csv
import gzip
import io
import sys

ANCHORS = {  # row -> text that must appear in its SASS
    122: "USETMAXREG.TRY_ALLOC.CTAPOOL UP0, 0xd8",  # consumer 1 (216 registers) starts
    319: "SYNCS.ARRIVE.TRANS64.A1T0",  # consumer 1: first instruction after bar_sync(bar_p(b))
    474: "WARPGROUP.DEPBAR.LE gsb0, 0x0",  # consumer 1: its P V done
    1642: "USETMAXREG.TRY_ALLOC.CTAPOOL UP0, 0xe8",  # scorer (232) starts
    2550: "BAR.RED.AND",  # scorer: the landed test's named barrier
    2554: "WARPGROUP.DEPBAR.LE gsb0, 0x0",  # scorer: not-landed path, P V0 done
    2785: "WARPGROUP.DEPBAR.LE gsb0, 0x2",  # scorer: landed path
    2788: "WARPGROUP.DEPBAR.LE gsb0, 0x0",  # scorer: S(t + 1) done
    4104: "USETMAXREG.DEALLOC.CTAPOOL 0x38",  # producer (56) starts
    4248: "BRA",  # producer: retry branch of the empty[b][0] wait
}
ROLES = [("prologue (all)", 0, 122), ("consumer 1", 122, 1642), ("scorer", 1642, 4104), ("producer", 4104, 4586),
         ("out-of-line", 4586, None)]
SCORER = [
    ("pre-loop: Q, tile 0's S", 1642, 2006),
    ("mask, max, exp, pack, O rescale", 2006, 2445),
    ("P.V0 issue (4 RS m64n256k16)", 2445, 2504),
    ("P store (stmatrix, fence), f, bar.arrive", 2504, 2529),
    ("landed test (2 mbar tests, vote, bar.red)", 2529, 2554),
    ("not landed: P.V0 wait, empty[b][0]", 2554, 2556),
    ("wait full[b'][0] (rows)", 2556, 2568),
    ("S(t+1) dims 0-255 issue (16 HGMMA)", 2568, 2653),
    ("wait full[b'][1] (rows)", 2653, 2658),
    ("S(t+1) dims 256-575 issue (20 HGMMA)", 2658, 2785),
    ("landed path: wait<2>, empty[b][0]", 2785, 2787),
    ("S(t+1) done (wait<0>)", 2787, 2789),
    ("valid bits, loop back", 2789, 2826),
    ("epilogue: row sums, O stores", 2826, 4104),
]
SINGLE = [("consumer 1: wait for P (bar_p)", 319), ("consumer 1: its P.V done", 474),
          ("producer: empty[b][0] wait", 4248), ("producer: empty[b][1] wait", 4369),
          ("producer: tile row ids (ldg)", 4542), ("scorer: 1st HGMMA of S dims 256-575", 2661)]


def load(path):
    with gzip.open(path, "rt") as f:
        lines = f.read().splitlines()
    start = next(i for i, l in enumerate(lines) if l.startswith('"Address"'))
    return list(csv.DictReader(io.StringIO("\n".join(lines[start:]))))


def main(d):
    for h in (128, 64):
        rows = load(f"{d}/ncu-bf16-h{h}.csv.gz")
        for i, want in ANCHORS.items():
            if want not in rows[i]["Source"]:
                sys.exit(f"row {i}: expected '{want}', found '{rows[i]['Source'].strip()}' (another build?)")
        keys = [k for k in rows[0] if k.startswith("stall_") and "Not Issued" not in k]
        smp = [int(r["Warp Stall Sampling (All Samples)"] or 0) for r in rows]
        tot = sum(smp)

        def s(a, b):
            return sum(smp[a:b])

        print(f"== H = {h}: {tot} samples")
        for name, a, b in ROLES:
            print(f"  {name:28s} {s(a, b):6d}  {100 * s(a, b) / tot:5.1f} %")
        sc, loop = s(1642, 4104), s(2006, 2826)
        print(f"  scorer phases (share of the scorer's samples / of its tile loop):")
        for name, a, b in SCORER:
            why = collections.Counter()
            for r, n in zip(rows[a:b], smp[a:b]):
                named = 0.0
                for k in keys:
                    v = float(r[k] or 0)
                    why[k[6:]] += v
                    named += v
                why["gmma (unnamed)"] += n - named
            top = ", ".join(f"{k} {100 * v / max(s(a, b), 1):.0f}" for k, v in why.most_common(3) if v > 0)
            inloop = f"{100 * s(a, b) / loop:5.1f}" if 2006 <= a < 2826 else "    -"
            print(f"    {name:44s} {s(a, b):6d} {100 * s(a, b) / sc:5.1f} {inloop}   [{top}]")
        for name, i in SINGLE:
            role = s(122, 1642) if i < 1642 else (s(1642, 4104) if i < 4104 else s(4104, 4586))
            print(f"  {name:40s} {smp[i]:6d}  {100 * smp[i] / role:5.1f} % of its role")
        ex = lambda i: int(rows[i]["Instructions Executed"] or 0)
        print(f"  landed test false: {ex(2554)} of {ex(2552)} warp-iterations")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "build-carry/s12/ncu")
