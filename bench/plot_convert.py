#!/usr/bin/env python3
"""Plots `strata convert` results (convert.json) as score against attention FLOPs.

Left: STS-B test Spearman x 100 against the attention-FLOP fraction of the softmax model (mean over
the test sentences). Right, one line per passage length N: mean embedding cosine to the softmax
model against the FLOP fraction at that N. One marker per method kind; Monarch rows that replace a
subset of layers are hollow.

Usage: plot_convert.py IN.json OUT.png [--quiet]
Exit status: 0 written, 2 bad input, 3 matplotlib missing.
"""
import argparse
import json
import os
import sys

EXIT_BAD_INPUT = 2
EXIT_NO_MATPLOTLIB = 3
MARKERS = {"softmax": "*", "monarch": "o", "nystrom": "s", "performer": "^"}
COLORS = {"softmax": "black", "monarch": "tab:blue", "nystrom": "tab:orange", "performer": "tab:green"}


def fail(msg, code=EXIT_BAD_INPUT):
    print(f"plot_convert.py: {msg}", file=sys.stderr)
    sys.exit(code)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("json_in")
    ap.add_argument("png_out")
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args()
    try:
        with open(args.json_in) as f:
            rep = json.load(f)
        rows = rep["rows"]
        lengths = rep["long"]["lengths"]
    except (OSError, json.JSONDecodeError, KeyError, TypeError) as e:
        fail(f"argument IN: cannot read a convert report from '{args.json_in}': {e}")
    if not rows:
        fail(f"argument IN: '{args.json_in}' has no rows")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        fail("matplotlib is not installed", EXIT_NO_MATPLOTLIB)

    fig, axes = plt.subplots(1, 1 + len(lengths), figsize=(5 * (1 + len(lengths)), 4.2), squeeze=False)
    axes = axes[0]
    seen = set()
    for r in rows:
        kind = r["kind"]
        hollow = kind != "softmax" and r["layers"] != "all"
        style = dict(marker=MARKERS.get(kind, "x"), color=COLORS.get(kind, "gray"), linestyle="none",
                     markerfacecolor="none" if hollow else COLORS.get(kind, "gray"), markersize=8)
        label = kind if kind not in seen else None
        seen.add(kind)
        axes[0].plot(r["sts_flop_fraction"], r["sts_spearman"], label=label, **style)
        for i, n in enumerate(lengths):
            cell = next((c for c in r["long"] if c["n"] == n), None)
            if cell:
                axes[1 + i].plot(cell["flop_fraction"], cell["cosine_mean"], **style)
    soft = rep["sts"]["softmax_spearman"]
    axes[0].axhline(0.97 * soft, color="gray", linestyle=":", label="97% of softmax")
    axes[0].set_title(f"STS-B test ({rep['sts']['pairs']} pairs)")
    axes[0].set_xlabel("attention FLOPs / softmax")
    axes[0].set_ylabel("Spearman x 100")
    axes[0].legend(fontsize=8)
    for i, n in enumerate(lengths):
        ax = axes[1 + i]
        ax.set_title(f"passages of N = {n} tokens")
        ax.set_xlabel("attention FLOPs / softmax")
        ax.set_ylabel("mean cosine to softmax embedding")
        if n == 512:
            ax.axhline(0.95, color="gray", linestyle=":")
            ax.axvline(0.35, color="gray", linestyle=":")
    for ax in axes:
        ax.set_xscale("log")
        ax.grid(alpha=0.3)
    fig.suptitle("all-MiniLM-L6-v2, zero-shot attention conversion")
    fig.tight_layout()
    tmp = f"{args.png_out}.tmp.{os.getpid()}.png"  # atomic: a reader sees the old or the new PNG
    fig.savefig(tmp, dpi=110)
    os.replace(tmp, args.png_out)
    if not args.quiet:
        print(f"wrote {args.png_out}")


if __name__ == "__main__":
    main()
