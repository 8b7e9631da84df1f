#!/usr/bin/env python3
"""The plot or table of one `strata experiment` (models/experiment.h) from its OUT/summary.json.

  icr     OUT/icr_d<d>.png per input dimension d: squared error at the last point (test prompts)
          against non-embedding training FLOPs, one line per method through its runs (widths);
          faint: each run's validation curve (eval.csv).
  charlm  OUT/charlm.png: validation bits/char against training FLOPs, one line per method x width
          (each run's eval.csv), the final whole-split value as a marker.
  etth1   OUT/table.md: test MSE / MAE per horizon for each method (encoder + attention), mean +- the
          sample standard deviation over seeds where there are several, next to the published
          PatchTST/42, PatchTST/64 and DLinear rows (../shared/design/experiments.md section 3).

Usage: plot_experiment.py SUMMARY.json OUT_DIR [--quiet]
Exit status: 0 written, 2 bad input, 3 matplotlib missing (icr, charlm).
"""
import argparse
import csv
import json
import math
import os
import sys

EXIT_BAD_INPUT = 2
EXIT_NO_MATPLOTLIB = 3

# Published test MSE / MAE on ETTh1 (multivariate), horizons 96, 192, 336, 720 (experiments.md).
PUBLISHED = [
    ("PatchTST/42 (L=336)", [(0.375, 0.399), (0.414, 0.421), (0.431, 0.436), (0.449, 0.466)]),
    ("PatchTST/64 (L=512)", [(0.370, 0.400), (0.413, 0.429), (0.422, 0.440), (0.447, 0.468)]),
    ("DLinear (L=336)", [(0.375, 0.399), (0.405, 0.416), (0.439, 0.443), (0.472, 0.490)]),
]
HORIZONS = [96, 192, 336, 720]


def fail(msg, code=EXIT_BAD_INPUT):
    print(f"plot_experiment.py: {msg}", file=sys.stderr)
    sys.exit(code)


def read_eval(run_dir):
    """eval.csv rows as dicts of floats ([] when there is none)."""
    path = os.path.join(run_dir, "eval.csv")
    if not os.path.exists(path) or os.path.getsize(path) == 0:
        return []
    out = []
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            try:
                out.append({k: float(v) for k, v in r.items()})
            except (TypeError, ValueError):
                continue  # a row torn by a kill
    return out


def pyplot():
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        fail("matplotlib is not installed (scripts/setup.sh installs it)", EXIT_NO_MATPLOTLIB)
    return plt


def mean_std(values):
    m = sum(values) / len(values)
    if len(values) < 2:
        return m, None
    return m, math.sqrt(sum((v - m) ** 2 for v in values) / (len(values) - 1))


def save(fig, path, quiet):
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=110)
    except OSError as e:
        fail(f"cannot write '{path}': {e}")
    if not quiet:
        print(f"wrote {path}")


def rel(metrics):
    """The last-point error relative to predicting 0 on the same prompts (1 = nothing learned);
    the raw error where a record predates last_point_zero_se (its prompts' zero level is ~1)."""
    z = metrics.get("last_point_zero_se")
    return metrics["last_point_se"] / z if z else metrics["last_point_se"]


def plot_icr(summary, out, quiet):
    plt = pyplot()
    runs = summary["runs"]
    for d in sorted({r["data"]["dim"] for r in runs}):
        fig, ax = plt.subplots(figsize=(7, 4.8))
        methods = []
        for r in runs:
            if r["data"]["dim"] == d and r["method"] not in methods:
                methods.append(r["method"])
        for i, m in enumerate(methods):
            color = f"C{i % 10}"
            mine = sorted((r for r in runs if r["data"]["dim"] == d and r["method"] == m), key=lambda r: r["train_flops"])
            for r in mine:
                ev = read_eval(os.path.join(out, r["folder"]))
                if ev and "last_point_se" in ev[0]:
                    ax.plot([e["flops"] for e in ev], [rel(e) for e in ev], color=color, alpha=0.25, lw=0.8)
            xs = [r["train_flops"] for r in mine]
            ys = [rel(r["test"]) for r in mine]
            ax.plot(xs, ys, "o-", color=color, label=m)
            for r, x, y in zip(mine, xs, ys):
                ax.annotate(f"D={r['model']['width']}", (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")
        ax.axhline(1.0, color="gray", ls=":", lw=1, label="predict 0")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("non-embedding training FLOPs")
        ax.set_ylabel("last-point squared error / predicting 0's\n(test prompts; curves: val prompts)")
        ax.set_title(f"in-context regression, d = {d} ({summary['size']} size)")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8)
        save(fig, os.path.join(out, f"icr_d{d}.png"), quiet)
        plt.close(fig)


def plot_charlm(summary, out, quiet):
    plt = pyplot()
    runs = summary["runs"]
    methods = []
    for r in runs:
        if r["method"] not in methods:
            methods.append(r["method"])
    widths = sorted({r["model"]["width"] for r in runs})
    styles = ["-", "--", ":", "-."]
    fig, ax = plt.subplots(figsize=(8, 5))
    for r in runs:
        color = f"C{methods.index(r['method']) % 10}"
        ls = styles[widths.index(r["model"]["width"]) % len(styles)]
        label = f"{r['method']} D={r['model']['width']}"
        ev = read_eval(os.path.join(out, r["folder"]))
        if ev and "val_bpc" in ev[0]:
            ax.plot([e["flops"] for e in ev], [e["val_bpc"] for e in ev], ls, color=color, label=label)
            label = None
        ax.plot([r["train_flops"]], [r["val"]["val_bpc"]], "o", color=color, label=label)
    ax.set_xscale("log")
    ax.set_xlabel("training FLOPs (non-embedding, 3 x forward)")
    ax.set_ylabel("validation bits / char (marker: whole split at the end)")
    ax.set_title(f"character LM ({summary['size']} size)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7, ncol=2)
    save(fig, os.path.join(out, "charlm.png"), quiet)
    plt.close(fig)


def fmt_cell(mse, mae):
    def one(v):
        m, s = mean_std(v)
        return f"{m:.3f}" if s is None else f"{m:.3f} ± {s:.3f}"
    return f"{one(mse)} / {one(mae)}"


def table_etth1(summary, out, quiet):
    runs = summary["runs"]
    horizons = sorted({r["data"]["horizon"] for r in runs} | set(HORIZONS))
    methods = []
    for r in runs:
        if r["method"] not in methods:
            methods.append(r["method"])
    lines = [f"ETTh1, test MSE / MAE (standardised), size '{summary['size']}'; mean ± sample std over seeds "
             f"where n > 1 (n in brackets)", ""]
    lines.append("| method | " + " | ".join(str(h) for h in horizons) + " |")
    lines.append("|---|" + "---|" * len(horizons))
    for m in methods:
        cells = []
        for h in horizons:
            mine = [r for r in runs if r["method"] == m and r["data"]["horizon"] == h and r.get("test")]
            if not mine:
                cells.append("")
                continue
            cell = fmt_cell([r["test"]["mse"] for r in mine], [r["test"]["mae"] for r in mine])
            cells.append(cell + (f" ({len(mine)})" if len(mine) > 1 else ""))
        lines.append(f"| {m.replace('|', chr(92) + '|')} | " + " | ".join(cells) + " |")
    for name, vals in PUBLISHED:
        by_h = dict(zip(HORIZONS, vals))
        lines.append(f"| {name} (published) | " +
                     " | ".join(f"{by_h[h][0]:.3f} / {by_h[h][1]:.3f}" if h in by_h else "" for h in horizons) + " |")
    best = summary.get("best")
    if best:
        means = ", ".join(f"{k.replace('|', chr(92) + '|')}: {v:.4f}" for k, v in sorted(best["means"].items(), key=lambda kv: kv[1]))
        lines += ["", f"Best method by {best['metric']} (mean over its horizons, seed of the config; never test): "
                      f"**{best['method'].replace('|', chr(92) + '|')}**; repeated with more seeds. Means: {means}."]
    path = os.path.join(out, "table.md")
    try:
        with open(path + ".tmp", "w") as f:
            f.write("\n".join(lines) + "\n")
        os.replace(path + ".tmp", path)
    except OSError as e:
        fail(f"cannot write '{path}': {e}")
    if not quiet:
        print(f"wrote {path}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("summary")
    ap.add_argument("out")
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args()
    try:
        with open(args.summary) as f:
            summary = json.load(f)
    except (OSError, ValueError) as e:
        fail(f"argument SUMMARY.json: cannot read '{args.summary}': {e}")
    if not isinstance(summary, dict) or not isinstance(summary.get("runs"), list):
        fail(f"argument SUMMARY.json: '{args.summary}' is not an experiment summary (no 'runs' list)")
    if not summary["runs"]:
        fail(f"argument SUMMARY.json: '{args.summary}' has no runs yet")
    kind = summary.get("kind")
    try:
        if kind == "icr":
            plot_icr(summary, args.out, args.quiet)
        elif kind == "charlm":
            plot_charlm(summary, args.out, args.quiet)
        elif kind == "etth1":
            table_etth1(summary, args.out, args.quiet)
        else:
            fail(f"argument SUMMARY.json: unknown kind {kind!r} (expected icr, charlm or etth1)")
    except (KeyError, TypeError) as e:
        fail(f"argument SUMMARY.json: a run record lacks {e}")


if __name__ == "__main__":
    main()
