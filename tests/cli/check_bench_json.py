#!/usr/bin/env python3
"""Runs one `strata bench ...` and checks its exit status and result JSON (a ctest of label cli).

  check_bench_json.py STRATA JSON [--min-reps N] [--corrupt OUTPUT --bad-cases C ...
                      [--good-cases C ...]] -- BENCH ARGS...

Without --corrupt: the bench must exit 0, every row must be correct, and every row must carry the
spread of its paired ratios with speedup_min <= speedup_q1 <= speedup_vs_peer <= speedup_q3 <=
speedup_max, and at least --min-reps timed rounds.
With --corrupt OUTPUT: the bench runs with STRATA_BENCH_TEST_CORRUPT=OUTPUT (the harness's test
hook: ours' OUTPUT is perturbed after timing, before the check); it must exit 1, every row whose
case is in --bad-cases must be marked incorrect (the check read what was timed), and every row
whose case is in --good-cases must stay correct (the hook hit only that output).
"""
import argparse
import json
import os
import subprocess
import sys


def fail(msg):
    print(f"check_bench_json.py: FAIL: {msg}", file=sys.stderr)
    sys.exit(1)


def main():
    argv = sys.argv[1:]
    if "--" not in argv:
        fail("expected '--' before the bench arguments")
    split = argv.index("--")
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("strata")
    ap.add_argument("json")
    ap.add_argument("--min-reps", type=int, default=1)
    ap.add_argument("--corrupt", default="")
    ap.add_argument("--bad-cases", nargs="*", default=[])
    ap.add_argument("--good-cases", nargs="*", default=[])
    args = ap.parse_args(argv[:split])
    bench_args = argv[split + 1:]

    env = dict(os.environ)
    env.pop("STRATA_BENCH_TEST_CORRUPT", None)
    if args.corrupt:
        env["STRATA_BENCH_TEST_CORRUPT"] = args.corrupt
    if os.path.exists(args.json):
        os.remove(args.json)
    cmd = [args.strata, *bench_args, "--json", args.json]
    print("running:", " ".join(cmd), f"(STRATA_BENCH_TEST_CORRUPT={args.corrupt})" if args.corrupt else "", flush=True)
    rc = subprocess.run(cmd, env=env).returncode
    expected_rc = 1 if args.corrupt else 0
    if rc != expected_rc:
        fail(f"exit status {rc}, expected {expected_rc}")
    with open(args.json) as f:
        report = json.load(f)
    rows = report["rows"]
    if not rows:
        fail("the JSON has no rows")

    for i, r in enumerate(rows):
        where = f"row {i} ({r['case']}, {r['method']} vs {r['peer']})"
        keys = ("speedup_min", "speedup_q1", "speedup_vs_peer", "speedup_q3", "speedup_max")
        missing = [k for k in keys if r.get(k) is None]
        if missing:
            fail(f"{where} lacks {', '.join(missing)}")
        vals = [r[k] for k in keys]
        if any(a > b * (1 + 1e-12) for a, b in zip(vals, vals[1:])):
            fail(f"{where}: expected {' <= '.join(keys)}, got {vals}")
        # bfloat16 attention rows carry the same row in fp32 compute and the double-reference
        # errors (attention_runner.h); the bf16 products' speedup over fp32 compute is paired.
        if report["bench"] == "attention" and r["dtype"] == "bfloat16":
            bf16_keys = ("compute", "fp32_compute_median_s", "fp32_compute_max_rel_err", "speedup_vs_fp32_compute",
                         "speedup_vs_fp32_compute_min", "speedup_vs_fp32_compute_max", "ref64_max_rel_err",
                         "fp32_compute_ref64_max_rel_err", "peer_ref64_max_rel_err")
            missing = [k for k in bf16_keys if r.get(k) is None]
            if missing:
                fail(f"{where} (bfloat16) lacks {', '.join(missing)}")
            if not r["speedup_vs_fp32_compute_min"] <= r["speedup_vs_fp32_compute"] <= r["speedup_vs_fp32_compute_max"]:
                fail(f"{where}: speedup_vs_fp32_compute outside its min-max")
        if r["reps"] < args.min_reps:
            fail(f"{where}: {r['reps']} timed rounds, expected at least {args.min_reps}")
        if not args.corrupt and not r["correct"]:
            fail(f"{where} failed its correctness check in a clean run")
        if args.corrupt and r["case"] in args.bad_cases and r["correct"]:
            fail(f"{where} passed its check although ours' '{args.corrupt}' was corrupted after timing")
        if args.corrupt and r["case"] in args.good_cases and not r["correct"]:
            fail(f"{where} failed although only '{args.corrupt}' of other groups was corrupted")
    if args.corrupt:
        hit = [r for r in rows if r["case"] in args.bad_cases]
        if not hit:
            fail(f"no row of the cases {args.bad_cases} in the JSON")
    print(f"check_bench_json.py: OK ({len(rows)} rows)")


if __name__ == "__main__":
    main()
