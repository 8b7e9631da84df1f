"""Stress run of strata's two thread pools (issue 48 item 7): every kernel family, RUNS calls per pool,
beside a busy process, each call checked head by head against the float64 reference and against
the first call on the same inputs (bit for bit), with the kernel workspace poisoned (NaN) on every
call (STRATA_POISON_WORKSPACE=1), so a kernel that reads scratch it did not write gives NaN.

    python bench/stress_pools.py [--runs 100] [--pools own,torch] [--threads 4] [--load 1] [--json OUT]

Each pool runs in a fresh interpreter (STRATA_THREAD_POOL=<pool>, STRATA_NUM_THREADS and torch's
intra-op threads = --threads: more threads than cores on purpose, so that regions are preempted
mid-way). --load busy processes (a spin loop each) run beside it. Per call and per head (per
(batch, head) slice of an attention output or input gradient; per row block of the others):
  wrong     normwise error against the float64 reference above the family's bound (below), or NaN
  unstable  not bitwise equal to the first call of the same pool on the same inputs (a race:
            strata's results do not depend on thread timing; tests/python/test_threads.py)
Bounds: 2e-5 relative (max |ours - ref| / max |ref| over the slice), 10x the largest error a quiet
run of these sizes shows (fp32 sums of <= 512 products: ~1e-6) and 10x below the 2e-4 of the one
wrong Monarch row ever seen (include/strata/torch/threads.h).
Exit status 1 when any call is wrong or unstable. Prints one line per family and pool; --json
writes them with the CPU's name.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

BOUND = 2e-5
SEEDS = 4  # distinct inputs per family; call i uses seed i % SEEDS (its reference computed once)


def _cases():
    """name -> fn(tensors dict) -> list of (name, tensor, head_dim_or_None) outputs; inputs(seed, dtype)."""
    import torch
    import strata

    def randn(g, *shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64)

    def qkv_inputs(B, N, Hq, Hkv, d):
        def make(seed):
            g = torch.Generator().manual_seed(seed)
            return {"q": randn(g, B, N, Hq, d), "k": randn(g, B, N, Hkv, d), "v": randn(g, B, N, Hkv, d),
                    "dout": randn(g, B, N, Hq, d)}
        return make

    def with_grads(fn, grads):
        def run(t):
            ins = {n: x.detach().clone().requires_grad_(n in grads) for n, x in t.items() if n != "dout"}
            out = fn(**ins)
            out.backward(t["dout"])
            return [("out", out.detach())] + [(f"d{n}", ins[n].grad) for n in grads]
        return run

    qkv = ("q", "k", "v")
    cases = {
        "attention causal": (qkv_inputs(2, 197, 4, 2, 40),
                             with_grads(lambda q, k, v: strata.attention(q, k, v, causal=True), qkv)),
        "attention window": (qkv_inputs(2, 197, 4, 4, 24),
                             with_grads(lambda q, k, v: strata.attention(q, k, v, window=(31, 7)), qkv)),
        "mlr": (qkv_inputs(2, 256, 4, 4, 32),
                with_grads(lambda q, k, v: strata.mlr_attention(q, k, v, [16, 8, 8], context=256), qkv)),
    }
    for T in (1, 2, 3):
        for N in (256, 250):
            cases[f"monarch T={T} N={N}"] = (
                qkv_inputs(2, N, 4, 4, 32),
                with_grads(lambda q, k, v, T=T: strata.monarch_attention(q, k, v, num_steps=T), qkv))

    def mlp_inputs(seed):
        g = torch.Generator().manual_seed(seed)
        D, H = 64, 256
        return {"x": randn(g, 2, 97, D), "w1": randn(g, H, D) / 8, "b1": randn(g, H), "w2": randn(g, D, H) / 16,
                "b2": randn(g, D), "ln_weight": 1 + randn(g, D) / 4, "ln_bias": randn(g, D) / 4,
                "dout": randn(g, 2, 97, D)}

    cases["gelu_mlp"] = (mlp_inputs, with_grads(
        lambda x, w1, b1, w2, b2, ln_weight, ln_bias: strata.gelu_mlp(x, w1, b1, w2, b2, ln_weight=ln_weight,
                                                                      ln_bias=ln_bias, residual=True),
        ("x", "w1", "w2", "ln_weight")))

    def ln_inputs(seed):
        t = mlp_inputs(seed)
        g = torch.Generator().manual_seed(seed + 100)
        return {"x": t["x"], "w": t["w1"], "b": t["b1"], "ln_weight": t["ln_weight"], "dout": randn(g, 2, 97, 256)}

    cases["ln_linear"] = (ln_inputs, with_grads(
        lambda x, w, b, ln_weight: strata.ln_linear(x, w, b, ln_weight=ln_weight), ("x", "w", "ln_weight")))

    for spec_name, spec in (("monarch", strata.structured.monarch(256, 16)),
                            ("btt", strata.structured.btt(256, 256, rank=2)),
                            ("mlr", strata.structured.mlr(256, [32, 16, 8]))):
        shapes = spec.factor_shapes()

        def st_inputs(seed, shapes=shapes, spec=spec):
            g = torch.Generator().manual_seed(seed)
            t = {"x": randn(g, 2, 97, spec.in_features), "dout": randn(g, 2, 97, spec.out_features)}
            for i, s in enumerate(shapes):
                t[f"f{i}"] = randn(g, *s) / (s[-1] ** 0.5)
            return t

        names = tuple(["x"] + [f"f{i}" for i in range(len(shapes))])
        cases[f"structured {spec_name}"] = (st_inputs, with_grads(
            lambda spec=spec, **t: strata.structured_linear(t["x"], spec, [t[f"f{i}"] for i in range(len(t) - 1)]),
            names))
    return cases


def _slices(t):
    """The per-head slices of t: (b, h) of a B x N x H x d tensor; 4 row blocks of anything else."""
    if t.dim() == 4:
        return [(f"b{b}h{h}", t[b, :, h]) for b in range(t.shape[0]) for h in range(t.shape[2])]
    flat = t.reshape(t.shape[0], -1) if t.dim() > 1 else t.reshape(1, -1)
    n = max(1, flat.shape[0] // 4)
    return [(f"rows{i}", flat[i:i + n]) for i in range(0, flat.shape[0], n)]


def _child(runs: int, families: list, bound: float) -> dict:
    import torch
    torch.set_num_threads(int(os.environ["STRATA_NUM_THREADS"]))
    cases = _cases()
    report = {}
    for name, (make, run) in cases.items():
        if families and not any(name.startswith(f) for f in families):
            continue
        inputs = [make(s) for s in range(SEEDS)]
        refs = [run(t) for t in inputs]  # float64: the reference path of every op
        firsts = [None] * SEEDS
        wrong = unstable = 0
        worst = 0.0
        where = ""
        t0 = time.perf_counter()
        for i in range(runs):
            s = i % SEEDS
            outs = run({n: x.float() for n, x in inputs[s].items()})
            if firsts[s] is None:
                firsts[s] = outs
            for (oname, o), (_, r), (_, f) in zip(outs, refs[s], firsts[s]):
                if not torch.equal(o, f):
                    unstable += 1
                    where = where or f"call {i}: {oname} differs from call {s}'s"
                for (sl, os_), (_, rs) in zip(_slices(o.double()), _slices(r)):
                    err = float((os_ - rs).abs().max() / rs.abs().max().clamp_min(1e-30))
                    if not err <= bound:  # NaN counts as wrong
                        wrong += 1
                        where = where or f"call {i}: {oname} {sl} error {err:.2e}"
                    worst = max(worst, err) if err == err else float("nan")
        report[name] = {"runs": runs, "wrong_slices": wrong, "unstable_outputs": unstable, "max_rel_error": worst,
                        "first_problem": where, "seconds": round(time.perf_counter() - t0, 2)}
        print(json.dumps({name: report[name]}), flush=True)
    return report


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=100)
    ap.add_argument("--pools", default="own,torch")
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--load", type=int, default=1, help="busy processes beside the run")
    ap.add_argument("--families", default="", help="comma-separated name prefixes (default: all)")
    ap.add_argument("--bound", type=float, default=BOUND,
                    help="the relative error bound (a tiny one, e.g. 1e-8, shows that the checks fail)")
    ap.add_argument("--json", default="")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.runs < 1 or a.threads < 1 or a.load < 0:
        ap.error(f"--runs and --threads expect integers >= 1 and --load >= 0, got {a.runs}, {a.threads}, {a.load}")
    families = [f for f in a.families.split(",") if f]
    if a.child:
        _child(a.runs, families, a.bound)
        return 0
    pools = [p for p in a.pools.split(",") if p]
    for p in pools:
        if p not in ("own", "torch"):
            ap.error(f"--pools: expected own and/or torch, got '{p}'")
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(a.load)]
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    result = {"cpu": cpu, "cores": os.cpu_count(), "threads": a.threads, "load": a.load, "bound": a.bound, "pools": {}}
    bad = False
    try:
        for pool in pools:
            env = dict(os.environ, STRATA_THREAD_POOL=pool, STRATA_POISON_WORKSPACE="1",
                       STRATA_NUM_THREADS=str(a.threads), OMP_NUM_THREADS=str(a.threads))
            cmd = [sys.executable, __file__, "--child", "--runs", str(a.runs), "--families", a.families,
                   "--bound", str(a.bound)]
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
            rows = {}
            for line in proc.stdout.splitlines():
                if line.startswith("{"):
                    rows.update(json.loads(line))
            if proc.returncode != 0:
                print(proc.stderr[-3000:], file=sys.stderr)
                bad = True
            for name, r in rows.items():
                ok = r["wrong_slices"] == 0 and r["unstable_outputs"] == 0
                bad |= not ok
                print(f"{pool:5s} {name:24s} {r['runs']} calls  wrong {r['wrong_slices']:3d}  unstable "
                      f"{r['unstable_outputs']:3d}  max err {r['max_rel_error']:.1e}  {r['seconds']:6.1f} s  "
                      f"{'ok' if ok else 'FAIL: ' + r['first_problem']}", flush=True)
            result["pools"][pool] = rows
    finally:
        for b in busy:
            b.kill()
    print(f"CPU: {cpu}, {os.cpu_count()} cores, {a.threads} threads, {a.load} busy process(es): "
          f"{'every call right and bitwise stable' if not bad else 'FAILURES above'}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
