#!/usr/bin/env python3
"""Plots training runs (`strata train` run folders) on one PNG: the training loss and each run's
headline evaluation metric against the optimizer step (left) and against training FLOPs (right).

Each run folder holds train.csv (step,lr,loss,grad_norm,tokens,flops,elapsed_s) and eval.csv
(step,flops,<metric>,...; the first metric is the headline one). The training loss is shown as a
moving average over `--smooth` steps (faint: the raw values), the evaluation metric as markers.
Runs are labelled by their folder name (or --labels).

Usage: plot_runs.py OUT.png RUN_DIR [RUN_DIR ...] [--metric NAME] [--smooth N] [--labels A,B,..] [--quiet]
Exit status: 0 written, 2 bad input, 3 matplotlib missing.
"""
import argparse
import csv
import os
import sys

EXIT_BAD_INPUT = 2
EXIT_NO_MATPLOTLIB = 3


def fail(msg, code=EXIT_BAD_INPUT):
    print(f"plot_runs.py: {msg}", file=sys.stderr)
    sys.exit(code)


def read_csv(path):
    try:
        with open(path, newline="") as f:
            rows = list(csv.DictReader(f))
    except OSError as e:
        fail(f"cannot read '{path}': {e}")
    out = []
    for r in rows:
        try:
            out.append({k: float(v) for k, v in r.items()})
        except (TypeError, ValueError):
            continue  # a row torn by a kill
    return out


def smooth(values, n):
    out, acc = [], 0.0
    for i, v in enumerate(values):
        acc += v
        if i >= n:
            acc -= values[i - n]
        out.append(acc / min(i + 1, n))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("png_out")
    ap.add_argument("runs", nargs="+")
    ap.add_argument("--metric", default="", help="eval metric to plot (default: each run's first)")
    ap.add_argument("--smooth", type=int, default=20)
    ap.add_argument("--labels", default="")
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args()
    if args.smooth < 1:
        fail(f"argument --smooth: expected an integer >= 1, got {args.smooth}")
    labels = args.labels.split(",") if args.labels else [os.path.basename(os.path.normpath(r)) for r in args.runs]
    if len(labels) != len(args.runs):
        fail(f"argument --labels: expected {len(args.runs)} labels (one per run), got {len(labels)}")
    runs = []
    for run, label in zip(args.runs, labels):
        if not os.path.isdir(run):
            fail(f"argument RUN_DIR: '{run}' is not a run folder")
        train = read_csv(os.path.join(run, "train.csv"))
        ev_path = os.path.join(run, "eval.csv")
        ev = read_csv(ev_path) if os.path.exists(ev_path) and os.path.getsize(ev_path) > 0 else []
        if not train:
            fail(f"run '{run}': train.csv has no rows")
        runs.append((label, train, ev))
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        fail("matplotlib is not installed (scripts/setup.sh installs it)", EXIT_NO_MATPLOTLIB)

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    metric_name = args.metric
    for i, (label, train, ev) in enumerate(runs):
        color = f"C{i % 10}"
        steps = [r["step"] for r in train]
        flops = [r["flops"] for r in train]
        loss = [r["loss"] for r in train]
        sm = smooth(loss, args.smooth)
        for ax, x in ((axes[0], steps), (axes[1], flops)):
            ax.plot(x, loss, color=color, alpha=0.15, linewidth=0.8)
            ax.plot(x, sm, color=color, label=f"{label} train", linewidth=1.5)
        if ev:
            keys = [k for k in ev[0].keys() if k not in ("step", "flops")]
            name = args.metric or (keys[0] if keys else "")
            if name and name in ev[0]:
                metric_name = metric_name or name
                axes[0].plot([r["step"] for r in ev], [r[name] for r in ev], "o--", color=color, label=f"{label} {name}")
                axes[1].plot([r["flops"] for r in ev], [r[name] for r in ev], "o--", color=color, label=f"{label} {name}")
    axes[0].set_xlabel("optimizer step")
    axes[1].set_xlabel("training FLOPs (non-embedding, 3 x forward)")
    axes[1].set_xscale("log")
    for ax in axes:
        ax.set_ylabel("loss" + (f" / {metric_name}" if metric_name else ""))
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    try:
        fig.savefig(args.png_out, dpi=110)
    except OSError as e:
        fail(f"argument OUT.png: cannot write '{args.png_out}': {e}")
    if not args.quiet:
        print(f"wrote {args.png_out}")


if __name__ == "__main__":
    main()
