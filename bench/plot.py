#!/usr/bin/env python3
"""Turns a `strata bench ...` / `strata demo` result JSON into a PNG.

One figure row per dtype; left: speedup of ours over the peer vs the swept size (1.0 = parity;
the median paired ratio, with its min-max over the timed rounds as an error bar when the JSON has
speedup_min / speedup_max), right: achieved GFLOP/s vs the swept size, ours solid and the peer dashed, with the measured fp32
FMA peak as a line. Rows that failed the correctness check are marked with a red x.

Usage: plot.py IN.json OUT.png [--x seq] [--quiet]
Exit status: 0 written, 2 bad input, 3 matplotlib missing.
"""
import argparse
import json
import sys
from collections import defaultdict

EXIT_BAD_INPUT = 2
EXIT_NO_MATPLOTLIB = 3
ROW_KEYS = ("case", "method", "peer", "shape", "dtype", "correct", "speedup_vs_peer", "gflops",
            "peer_median_s", "median_s")


def fail(msg, code=EXIT_BAD_INPUT):
    """Prints `plot.py: msg` to stderr and exits with `code`."""
    print(f"plot.py: {msg}", file=sys.stderr)
    sys.exit(code)


def load(path, xkey):
    """Returns the report dict; checks every row has the schema's keys and shape[xkey]."""
    try:
        with open(path) as f:
            rep = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        fail(f"argument IN: cannot read '{path}' as JSON: {e}")
    if not isinstance(rep, dict) or not isinstance(rep.get("rows"), list):
        fail(f"argument IN: expected an object with a 'rows' list in '{path}'")
    if not rep["rows"]:
        fail(f"argument IN: '{path}' has no rows to plot")
    for i, row in enumerate(rep["rows"]):
        missing = [k for k in ROW_KEYS if k not in row]
        if missing:
            fail(f"argument IN: row {i} lacks {', '.join(missing)}")
        if xkey not in row["shape"]:
            fail(f"argument --x: row {i}'s shape has no '{xkey}' (has {', '.join(row['shape'])})")
    return rep


def series_label(row, xkey, multi=False):
    """The legend label of a row's series: case plus the shape entries other than x and batch
    (plus "method vs peer" when the report has several methods or peers)."""
    extra = " ".join(f"{k}={v}" for k, v in row["shape"].items() if k not in (xkey, "batch", "heads"))
    label = f"{row['case']} {extra}".strip()
    return f"{label} ({row['method']} vs {row['peer']})" if multi else label


def peer_gflops(row):
    """The peer's GFLOP/s (from the row, or from ours scaled by the time ratio)."""
    if row.get("peer_gflops") is not None:
        return row["peer_gflops"]
    return row["gflops"] * row["median_s"] / row["peer_median_s"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("input", metavar="IN.json", help="result JSON written by strata bench / demo")
    ap.add_argument("output", metavar="OUT.png", help="PNG to write")
    ap.add_argument("--x", default="seq", help="shape entry on the x axis (default: seq)")
    ap.add_argument("--quiet", action="store_true", help="print nothing on success")
    args = ap.parse_args()
    rep = load(args.input, args.x)

    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        fail(f"matplotlib is not installed for {sys.executable} ({e})", EXIT_NO_MATPLOTLIB)

    # Several peers (bench mlr / monarch): one series per (case, shape, method, peer).
    multi = len({(row["method"], row["peer"]) for row in rep["rows"]}) > 1
    by_dtype = defaultdict(lambda: defaultdict(list))
    for row in rep["rows"]:
        by_dtype[row["dtype"]][series_label(row, args.x, multi)].append(row)
    dtypes = sorted(by_dtype, key=lambda d: (d != "float32", d))
    # Many series (several peers): taller figure, legends under the axes, log-scale y.
    nseries = max(len(by_dtype[d]) for d in dtypes)
    height = 4.6 + (0.16 * nseries if multi else 0)
    fig, axes = plt.subplots(len(dtypes), 2, figsize=(13, height * len(dtypes)), squeeze=False)
    method = "ours" if multi else rep["rows"][0]["method"]
    peer = "the peer" if multi else rep["rows"][0]["peer"]
    peak = rep.get("peak_gflops")
    for r, dtype in enumerate(dtypes):
        ax_s, ax_g = axes[r]
        ticks = sorted({row["shape"][args.x] for rows in by_dtype[dtype].values() for row in rows})
        for i, (label, rows) in enumerate(sorted(by_dtype[dtype].items())):
            rows.sort(key=lambda row: row["shape"][args.x])
            xs = [row["shape"][args.x] for row in rows]
            color = f"C{i % 10}"
            ys = [row["speedup_vs_peer"] for row in rows]
            ax_s.plot(xs, ys, "o-", color=color, label=label)
            spread = [(row.get("speedup_min"), row.get("speedup_max")) for row in rows]
            if all(lo is not None and hi is not None for lo, hi in spread):
                ax_s.errorbar(xs, ys, yerr=[[y - lo for y, (lo, _) in zip(ys, spread)],
                                            [hi - y for y, (_, hi) in zip(ys, spread)]],
                              fmt="none", ecolor=color, elinewidth=1, capsize=3, alpha=0.7)
            ax_g.plot(xs, [row["gflops"] for row in rows], "o-", color=color, label=f"{label} ({method})")
            ax_g.plot(xs, [peer_gflops(row) for row in rows], "s--", color=color, alpha=0.6,
                      label=f"{label} ({peer})")
            bad = [row for row in rows if not row["correct"]]
            if bad:
                ax_s.plot([row["shape"][args.x] for row in bad], [row["speedup_vs_peer"] for row in bad],
                          "x", color="red", markersize=12, mew=2)
        ax_s.axhline(1.0, color="gray", lw=1, ls=":")
        ax_s.set_title(f"{dtype}: speedup of {method} over {peer} (>1: ours faster)")
        ax_s.set_ylabel("speedup (peer time / our time; bars: min-max over rounds)")
        if peak:
            ax_g.axhline(peak, color="black", lw=1, ls=":", label=f"fp32 FMA peak {peak:.0f}")
        ax_g.set_title(f"{dtype}: achieved GFLOP/s (solid: {method}, dashed: {peer})")
        ax_g.set_ylabel("GFLOP/s")
        for ax in (ax_s, ax_g):
            ax.set_xscale("log", base=2)
            ax.set_xticks(ticks, [str(t) for t in ticks])
            ax.minorticks_off()
            ax.set_xlabel(args.x)
            ax.grid(True, which="both", alpha=0.3)
        if multi:
            for ax in (ax_s, ax_g):
                ax.set_yscale("log")
            ax_s.legend(fontsize=6, loc="upper center", bbox_to_anchor=(0.5, -0.14))
            ax_g.legend(fontsize=5, ncol=2, loc="upper center", bbox_to_anchor=(0.5, -0.14))
        else:
            ax_s.legend(fontsize=7)
            ax_g.legend(fontsize=6, ncol=2)
    fig.suptitle(f"strata bench {rep.get('bench', '?')}: {rep.get('cpu_model', rep.get('cpu', ''))}, "
                 f"{rep.get('threads', '?')} threads, torch {rep.get('torch_version', '?')}, "
                 f"{rep.get('date', '')}", fontsize=10)
    fig.tight_layout()
    try:
        fig.savefig(args.output, dpi=110)
    except OSError as e:
        fail(f"argument OUT: cannot write '{args.output}': {e}")
    if not args.quiet:
        print(f"plot.py: wrote {args.output}")


if __name__ == "__main__":
    main()
