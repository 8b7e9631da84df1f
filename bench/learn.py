"""strata's trainer against its plain-PyTorch peer (bench/peer_train.py): the same model, sizes,
seeds, data and optimiser, trained by both; the loss curves and the evaluations compared
(issue 45 item 2). Both run in this process's machine one after the other with the same thread
count.

  python bench/learn.py --strata build/release/strata [--cases icr-d4,icr-d8,charlm-d64]
                        [--params sp,mup] [--seeds 0] [--steps N] [--json out.json] [--md out.md]

A case passes when strata's mean training loss over the last fifth of the steps is within 5% of
the peer's, and so is its last evaluation (ICR: last-point error over the zero predictor's; char
LM: validation bits/char). Exit status 1 when a case fails.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import peer_train  # noqa: E402


def icr_case(d: int):
    """ICR at dim d, no curriculum: width 64, 4 heads, 4 layers, batch 64, 1,500 steps, lr 1e-3."""
    sets = [f"data.dim={d}", f"data.start_dims={d}", f"data.start_points={2 * d}", "model.width=64",
            "model.heads=4", "model.layers=4", "train.steps=1500", "train.batch=64", "train.warmup=200",
            "train.lr=1e-3", "model.attention=mha:scale=1/sqrt(d)"]
    peer = ["icr", "--dim", str(d), "--width", "64", "--heads", "4", "--layers", "4", "--steps", "1500",
            "--batch", "64", "--warmup", "200", "--lr", "1e-3", "--scale", "1/sqrt(d)"]
    return "configs/icr.toml", sets, peer


# name -> (config, strata --set overrides, peer arguments): the same run described twice.
CASES = {
    # the ICR case: d = 8, width 64, 4 heads (head dim 16), 4 layers, batch 64, no curriculum
    "icr-d8": icr_case(8),
    # the same at d = 4 (T = 16): where a model of this size leaves the plateau within 1,500 steps
    "icr-d4": icr_case(4),
    # char LM at D = 64 (1 head of 64), 4 layers, T = 256, batch 16, QK-LayerNorm as the reference
    "charlm-d64": ("configs/charlm.toml",
                   ["model.width=64", "model.heads=1", "model.layers=4", "model.qk_layernorm=true",
                    "data.context=256", "train.steps=600", "train.batch=16", "train.warmup=60", "train.lr=3e-3",
                    "train.clip=1.0", "train.eval_batches=8", "model.attention=mha:scale=1/sqrt(d)"],
                   ["charlm", "--width", "64", "--heads", "1", "--layers", "4", "--qk-ln", "1", "--context", "256",
                    "--steps", "600", "--batch", "16", "--warmup", "60", "--lr", "3e-3", "--clip", "1.0",
                    "--eval-batches", "8", "--scale", "1/sqrt(d)"]),
}


def read_csv(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def run_strata(exe, config, sets, param, seed, steps, threads, eval_every, out):
    cmd = [exe, "train", os.path.join(ROOT, config), "--out", out, "--no-progress"]
    sets = list(sets) + [f"train.param={param}", f"seed={seed}", f"train.threads={threads}",
                         f"train.eval_every={eval_every}", f"train.checkpoint_every={10**6}", "train.eps=1e-20"]
    if steps:
        sets.append(f"train.steps={steps}")
    for s in sets:
        cmd += ["--set", s]
    t0 = time.time()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    seconds = time.time() - t0
    losses = [float(r["loss"]) for r in read_csv(os.path.join(out, "train.csv"))]
    evals = read_csv(os.path.join(out, "eval.csv"))
    return losses, evals, seconds


def metric_of(task, row):
    if task == "icr":
        return float(row["last_point_se"]) / float(row["last_point_zero_se"])
    return float(row["val_bpc"])


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--strata", required=True, help="the strata executable")
    p.add_argument("--cases", default="icr-d4,icr-d8,charlm-d64")
    p.add_argument("--params", default="sp,mup")
    p.add_argument("--seeds", default="0")
    p.add_argument("--steps", type=int, default=0, help="override every case's step count")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--eval-every", type=int, default=250)
    p.add_argument("--tolerance", type=float, default=0.05)
    p.add_argument("--json", default="")
    p.add_argument("--md", default="")
    a = p.parse_args()
    rows = []
    for case in a.cases.split(","):
        config, sets, peer_args = CASES[case]
        task = peer_args[0]
        for param in a.params.split(","):
            for seed in [int(s) for s in a.seeds.split(",")]:
                with tempfile.TemporaryDirectory() as tmp:
                    losses, evals, s_sec = run_strata(a.strata, config, sets, param, seed, a.steps, a.threads,
                                                      a.eval_every, os.path.join(tmp, "run"))
                pa = peer_train.parse(peer_args + ["--param", param, "--seed", str(seed), "--threads", str(a.threads),
                                                   "--eval-every", str(a.eval_every), "--eps", "1e-20"] +
                                      (["--steps", str(a.steps)] if a.steps else []))
                t0 = time.time()
                curve = []
                peer_rows = peer_train.run(pa, curve_out=curve)
                p_sec = time.time() - t0
                n = len(losses)
                tail = max(1, n // 5)
                s_tail = sum(losses[-tail:]) / tail
                p_tail = sum(l for _, l in curve[-tail:]) / tail
                s_eval = metric_of(task, evals[-1])
                p_eval = peer_rows[-1]["ratio"] if task == "icr" else peer_rows[-1]["val_bpc"]
                row = {"case": case, "param": param, "seed": seed, "steps": n,
                       "strata_tail_loss": s_tail, "peer_tail_loss": p_tail, "tail_ratio": s_tail / p_tail,
                       "strata_eval": s_eval, "peer_eval": p_eval, "eval_ratio": s_eval / p_eval,
                       "strata_eval_curve": [(int(r["step"]), metric_of(task, r)) for r in evals],
                       "peer_eval_curve": [(r["step"], r["ratio"] if task == "icr" else r["val_bpc"]) for r in peer_rows],
                       "strata_s": round(s_sec, 1), "peer_s": round(p_sec, 1)}
                row["pass"] = abs(row["tail_ratio"] - 1) <= a.tolerance and abs(row["eval_ratio"] - 1) <= a.tolerance
                rows.append(row)
                print(json.dumps({k: v for k, v in row.items() if not k.endswith("_curve")}), flush=True)
    meta = {"machine": platform.processor() or platform.machine(), "threads": a.threads,
            "date": time.strftime("%Y-%m-%d"), "tolerance": a.tolerance}
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)
    if a.md:
        with open(a.md, "w") as f:
            f.write("| case | param | seed | steps | strata loss (last 1/5) | peer | ratio | strata eval | peer eval "
                    "| ratio | within 5% |\n|---|---|---|---|---|---|---|---|---|---|---|\n")
            for r in rows:
                f.write(f"| {r['case']} | {r['param']} | {r['seed']} | {r['steps']} | {r['strata_tail_loss']:.4f} | "
                        f"{r['peer_tail_loss']:.4f} | {r['tail_ratio']:.3f} | {r['strata_eval']:.4f} | "
                        f"{r['peer_eval']:.4f} | {r['eval_ratio']:.3f} | {'yes' if r['pass'] else 'NO'} |\n")
    sys.exit(0 if all(r["pass"] for r in rows) else 1)


if __name__ == "__main__":
    main()
