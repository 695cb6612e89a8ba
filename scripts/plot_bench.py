#!/usr/bin/env python3
"""Draws `smla bench --json` output as a PNG: roofline fraction (max(bytes/copy, flops/gemm) / time,
ceilings measured in the same run) against rows T, one line per head count (dotted: the fraction of
the gather limit of memory-bound cases, where the JSON has it), and a second panel of achieved
TFLOP/s and GB/s.

usage: scripts/plot_bench.py bench.json bench.png
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(src: str, dst: str) -> None:
    with open(src) as f:
        data = json.load(f)
    cases = data["cases"]
    heads = sorted({c["H"] for c in cases}, reverse=True)
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(13, 5))
    for h in heads:
        cs = sorted((c for c in cases if c["H"] == h), key=lambda c: c["T"])
        ts = [c["T"] for c in cs]
        line, = ax.plot(ts, [c["roofline_fraction"] for c in cs], marker="o", label=f"H={h}")
        g = [(c["T"], c["gather_fraction"]) for c in cs if c.get("gather_fraction", 0) > 0]
        if g:
            ax.plot([x for x, _ in g], [y for _, y in g], marker="s", linestyle=":", color=line.get_color(),
                    label=f"H={h} of the gather limit")
        ax2.plot(ts, [c["tflops"] for c in cs], marker="o", label=f"H={h} TFLOP/s")
        ax2.plot(ts, [1000 * c["tbps"] for c in cs], marker="x", linestyle="--", label=f"H={h} GB/s")
    ax.axhline(0.85, color="gray", linestyle=":", label="target 0.85")
    ax.set_xscale("log", base=2)
    ax.set_ylim(0, 1.05)
    ax.set_xlabel("rows T (query tokens)")
    ax.set_ylabel("fraction of the measured roofline (dotted: of the gather limit)")
    k = cases[0]["K"] if cases else 0
    ax.set_title(f"{data['device']}: sparse MLA {cases[0]['format'] if cases else ''}, K={k}\n"
                 f"ceilings: GEMM {data['gemm_tflops']:.0f} TFLOP/s, copy {data['copy_tbps']:.2f} TB/s"
                 + (f", gather {data['gather_tbps']:.2f} TB/s of {data['gather_row_bytes']}-B rows"
                    if data.get("gather_tbps") else ""))
    ax.legend()
    ax2.set_xscale("log", base=2)
    ax2.set_yscale("log")
    ax2.set_xlabel("rows T")
    ax2.set_title("achieved TFLOP/s (solid) and GB/s (dashed)")
    ax2.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    fig.savefig(dst, dpi=110)
    print(f"wrote {dst}")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
