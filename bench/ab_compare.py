#!/usr/bin/env python3
"""A/B of two builds from their bench JSON files (the shared schema of `strata bench ...`).

    python bench/ab_compare.py --old a1.json [a2.json ...] --new b1.json [b2.json ...] [--label NAME]

Rows are matched by (case, method, dtype, shape); each side's time per row is the median over its
files of the rows' median_s. Prints old / new per row (> 1: the new build is faster) and one
summary line: rows, min, median, max of that ratio (an A/B before and after a change: the quick benches).
"""
import argparse
import json
import statistics
import sys


def rows_by_key(paths):
    times = {}
    for path in paths:
        with open(path) as f:
            for r in json.load(f)["rows"]:
                key = (r["case"], r.get("method", ""), r.get("dtype", ""), json.dumps(r.get("shape", {}), sort_keys=True))
                times.setdefault(key, []).append(r["median_s"])
    return {k: statistics.median(v) for k, v in times.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old", nargs="+", required=True)
    ap.add_argument("--new", nargs="+", required=True)
    ap.add_argument("--label", default="")
    a = ap.parse_args()
    old, new = rows_by_key(a.old), rows_by_key(a.new)
    common = [k for k in old if k in new]
    if not common:
        sys.exit("ab_compare: argument '--new': no row matches a row of --old (case, method, dtype, shape)")
    ratios = []
    for k in common:
        r = old[k] / new[k]
        ratios.append(r)
        shape = " ".join(f"{n}={v}" for n, v in json.loads(k[3]).items())
        print(f"{k[0]:<24} {k[1]:<18} {k[2]:<9} {shape:<40} old {old[k]*1e3:9.2f} ms  new {new[k]*1e3:9.2f} ms  old/new {r:.3f}")
    print(f"| {a.label} | {len(ratios)} | {min(ratios):.3f} | {statistics.median(ratios):.3f} | {max(ratios):.3f} |")


if __name__ == "__main__":
    main()
