#!/usr/bin/env python3
"""Runs `strata bench memory` and checks its JSON: a row per --seq, and for strata and SDPA a peak
above the inputs of at least what the outputs alone must take (o, dq, dk, dv: as many bytes as the
inputs q, k, v, dout), so a measurement that reads nothing (0, or the wrong process) fails.

    check_memory_json.py STRATA JSON -- bench memory ARGS...
"""
import json
import subprocess
import sys


def main():
    strata, path = sys.argv[1], sys.argv[2]
    args = sys.argv[sys.argv.index("--") + 1:]
    subprocess.run([strata, *args, "--json", path], check=True)
    with open(path) as f:
        rep = json.load(f)
    seqs = [int(a) for i, a in enumerate(args) if i > 0 and args[i - 1] == "--seq"]
    rows = rep["rows"]
    assert [r["shape"]["seq"] for r in rows] == seqs, f"rows for seq {[r['shape']['seq'] for r in rows]}, expected {seqs}"
    for r in rows:
        for key in ("ours_peak_bytes", "peer_peak_bytes"):
            assert r[key] >= 0.9 * r["inputs_bytes"], f"{key} = {r[key]} < 0.9 x the outputs' {r['inputs_bytes']} bytes: {r}"
        assert abs(r["ratio"] - r["ours_peak_bytes"] / r["peer_peak_bytes"]) < 1e-9
    print(f"check_memory_json: {len(rows)} rows ok")


if __name__ == "__main__":
    main()
