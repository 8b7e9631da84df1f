#!/usr/bin/env python3
"""Prints a `strata bench ...` / `strata demo` result JSON as Markdown (for docs/results.md).

A header with the machine, then the rows table (speedup: the median paired ratio with its min-max
over the timed rounds); for bench "attention", also the issue's targets with measured values and
met / not met.

Usage: md_table.py IN.json
"""
import argparse
import json
import sys

# (label, row filter, metric, bound): the dense-attention targets, N = 4096, d = 64.
ATTENTION_TARGETS = [
    ("fp32 fwd non-causal: % of fp32 FMA peak", ("fwd", "float32"), "pct_of_peak", 55.0),
    ("fp32 fwd non-causal: speedup vs SDPA", ("fwd", "float32"), "speedup_vs_peer", 1.0),
    ("fp32 fwd causal: speedup vs SDPA", ("fwd causal", "float32"), "speedup_vs_peer", 1.0),
    ("fp32 fwd+bwd non-causal: speedup vs SDPA", ("fwd+bwd", "float32"), "speedup_vs_peer", 1.2),
    ("bf16 fwd non-causal: speedup vs SDPA bf16", ("fwd", "bfloat16"), "speedup_vs_peer", 1.0),
    ("bf16 fwd causal: speedup vs SDPA bf16", ("fwd causal", "bfloat16"), "speedup_vs_peer", 1.0),
]


def shape_label(shape):
    """'B=4 H=8 N=4096 D=64' for the attention shape keys, key=value otherwise ('|' escaped)."""
    short = {"batch": "B", "heads": "H", "seq": "N", "head_dim": "D"}
    return " ".join(f"{short.get(k, k)}={v}" for k, v in shape.items()).replace("|", "\\|")


def fmt_err(x):
    """The relative error in 1.2e-06 form ('nan' for null)."""
    return "nan" if x is None else f"{x:.1e}"


def fmt_speedup(row):
    """'1.41x (1.36-1.45)': the median paired ratio and its min-max over the rounds (JSONs written
    before the spread was recorded: '1.41x')."""
    s = f"{row['speedup_vs_peer']:.2f}x"
    if row.get("speedup_min") is not None and row.get("speedup_max") is not None:
        s += f" ({row['speedup_min']:.2f}-{row['speedup_max']:.2f})"
    return s


def ref_errs(row):
    """'2.5e-03 / 1.9e-02' when the row was checked against a reference other than the peer, else '-'."""
    if row.get("ref_max_rel_err", None) is None and row.get("peer_ref_max_rel_err", None) is None:
        return "-"
    return f"{fmt_err(row.get('ref_max_rel_err'))} / {fmt_err(row.get('peer_ref_max_rel_err'))}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("input", metavar="IN.json")
    args = ap.parse_args()
    try:
        with open(args.input) as f:
            rep = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        print(f"md_table.py: argument IN: cannot read '{args.input}' as JSON: {e}", file=sys.stderr)
        sys.exit(2)
    rows = rep.get("rows", [])
    print(f"- date (UTC): {rep.get('date', '?')}")
    print(f"- machine: {rep.get('cpu_model', '?')}; `{rep.get('cpu', '?')}`")
    print(f"- threads: {rep.get('threads', '?')}; torch {rep.get('torch_version', '?')}")
    print(f"- measured fp32 FMA peak: {rep.get('peak_gflops', 0):.1f} GFLOP/s on all threads, "
          f"{rep.get('peak_gflops_per_core', 0):.1f} on one ({rep.get('peak_isa', '?')} loop)")
    print()
    multi = len({(r["method"], r["peer"]) for r in rows}) > 1
    if rows and multi:  # bench mlr / monarch: several peers, each row names its own
        print("| case | method | peer | dtype | shape | correct | rel err vs ref | ours ms | peer ms | speedup (min-max) | "
              "ours GFLOP/s | % of peak | peer GFLOP/s | FLOP / MAC ratio | reps |")
        print("|---|---|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for r in rows:
            err = r.get("ref_max_rel_err")
            err = r["max_rel_err"] if err is None else err
            ratio = r.get("flop_ratio_total", r.get("ideal_mac_ratio"))
            method, peer = (r[k].replace("|", "\\|") for k in ("method", "peer"))  # e.g. mlr:ranks=32|8|...
            print(f"| {r['case']} | {method} | {peer} | {r['dtype']} | {shape_label(r['shape'])} | "
                  f"{'yes' if r['correct'] else '**NO**'} | {fmt_err(err)} | "
                  f"{r['median_s'] * 1e3:.3f} | {r['peer_median_s'] * 1e3:.3f} | "
                  f"{fmt_speedup(r)} | {r['gflops']:.1f} | {r['pct_of_peak']:.1f} | "
                  f"{r.get('peer_gflops', 0):.1f} | {'-' if ratio is None else f'{ratio:.2f}x'} | "
                  f"{r.get('reps', '?')} |")
    elif rows:
        peer = rows[0]["peer"]
        print(f"| case | dtype | shape | correct | rel err vs {peer} | rel err vs ref (ours / {peer}) | "
              f"ours ms | {peer} ms | speedup (min-max) | ours GFLOP/s | % of peak | {peer} GFLOP/s | reps |")
        print("|---|---|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|")
        for r in rows:
            print(f"| {r['case']} | {r['dtype']} | {shape_label(r['shape'])} | "
                  f"{'yes' if r['correct'] else '**NO**'} | {fmt_err(r['max_rel_err'])} | {ref_errs(r)} | "
                  f"{r['median_s'] * 1e3:.1f} | {r['peer_median_s'] * 1e3:.1f} | "
                  f"{fmt_speedup(r)} | {r['gflops']:.1f} | {r['pct_of_peak']:.1f} | "
                  f"{r.get('peer_gflops', 0):.1f} | {r.get('reps', '?')} |")
    if rep.get("targets"):  # targets the command evaluated itself
        print()
        print("| target | bound | measured | met |")
        print("|---|---:|---:|---|")
        for t in rep["targets"]:
            op = "<=" if t.get("at_most") else ">="
            bound = "?" if t.get("bound") is None else f"{t['bound']:.3g}"
            measured = "not measured" if t.get("measured") is None else f"{t['measured']:.3f}"
            met = "yes" if t.get("met") else ("-" if t.get("measured") is None else "**no**")
            print(f"| {t['target'].replace('|', chr(92) + '|')} | {op} {bound} | {measured} | {met} |")
    if rep.get("bench") == "attention":
        print()
        print("| target (N=4096, d=64) | bound | measured | met |")
        print("|---|---:|---:|---|")
        for label, (case, dtype), metric, bound in ATTENTION_TARGETS:
            hit = [r for r in rows if r["case"] == case and r["dtype"] == dtype
                   and r["shape"].get("seq") == 4096 and r["shape"].get("head_dim") == 64]
            if not hit:
                print(f"| {label} | >= {bound:g} | not measured | - |")
                continue
            v = hit[0][metric]
            unit = "%" if metric == "pct_of_peak" else "x"
            met = "yes" if v >= bound and hit[0]["correct"] else "**no**"
            measured = fmt_speedup(hit[0]) if metric == "speedup_vs_peer" else f"{v:.2f}{unit}"
            low = hit[0].get("speedup_min")
            if met == "yes" and metric == "speedup_vs_peer" and low is not None and low < bound:
                met = "yes (median; not in every round)"
            print(f"| {label} | >= {bound:g}{unit} | {measured} | {met} |")


if __name__ == "__main__":
    main()
