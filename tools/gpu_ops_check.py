"""strata's public ops on a GPU (the torch-op path) against the CPU's double-precision reference,
then timed against torch's own kernels on that GPU. One prepared check for a lent device machine.

    python tools/gpu_ops_check.py OUT.json [--device cuda] [--no-timing]

Correctness: each case runs its op on DEVICE in float32 and in bfloat16, the output and the input
gradients (a fixed random cotangent) compared with the same op on CPU float64 tensors (the double
reference; exact gradients). Error = max |x - ref| / max |ref| over each tensor; bounds: float32
1e-4 (fp32 round-off over <= 1e3-term sums; TF32 is switched off so matmuls are true fp32) and
bfloat16 4e-2 (inputs rounded to 8 bits of mantissa: ~4e-3 per operand, products summed in fp32,
outputs rounded again; SDPA's own bf16 error is of the same order).

Timing (CUDA events, median of REPS after warm-up), bfloat16, d = 64 and 12 heads as the
MonarchAttention paper: strata.attention (the SDPA call plus strata's mask handling) and
strata.monarch_attention (T = 1, 2; the torch-op composition) against SDPA (flash) at
N = 1024 .. 16384; strata.mlr_attention (8 levels, context N: the regions' fast case) against
causal SDPA at the same N, forward and forward + backward.

Writes OUT.json: {"device", "torch", "cases": [...], "timing": [...], "ok": bool}. Exit 1 when a
case is outside its bound. On the CPU (--device cpu) it checks the CPU kernels the same way.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

import strata
from strata import structured as st

BOUND = {torch.float32: 1e-4, torch.bfloat16: 4e-2}


def rel_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    """max |x - ref| / max |ref| (0 when both are zero)."""
    x, ref = x.detach().double().cpu(), ref.detach().double().cpu()
    den = ref.abs().max().item()
    num = (x - ref).abs().max().item()
    return num / den if den > 0 else num


def run_case(name, fn, inputs, device, dtype):
    """fn(*inputs) on device / dtype against fn on CPU float64: output and every input's gradient."""
    g = torch.Generator().manual_seed(1)
    ref_in = [t.double().requires_grad_(True) if t.is_floating_point() else t for t in inputs]
    ref_out = fn(*ref_in)
    cot = torch.randn(ref_out.shape, generator=g, dtype=torch.float64)
    ref_grads = torch.autograd.grad(ref_out, [t for t in ref_in if t.requires_grad], cot)

    dev_in = [t.to(device=device, dtype=dtype).requires_grad_(True) if t.is_floating_point() else t.to(device)
              for t in inputs]
    out = fn(*dev_in)
    grads = torch.autograd.grad(out, [t for t in dev_in if t.requires_grad], cot.to(device=device, dtype=out.dtype))
    errs = {"out": rel_err(out, ref_out)}
    for i, (a, b) in enumerate(zip(grads, ref_grads)):
        errs[f"grad{i}"] = rel_err(a, b)
    worst = max(errs.values())
    finite = all(math.isfinite(e) for e in errs.values()) and bool(torch.isfinite(out).all())
    ok = finite and worst <= BOUND[dtype] and out.device.type == torch.device(device).type and out.dtype == dtype
    return {"case": name, "dtype": str(dtype).replace("torch.", ""), "errors": errs, "worst": worst,
            "bound": BOUND[dtype], "ok": ok}


def cases():
    """(name, fn, inputs): awkward sizes, every option family, GQA and a shared query, both layouts."""
    g = torch.Generator().manual_seed(0)
    r = lambda *s: torch.randn(*s, generator=g)
    out = []
    q, k, v = r(2, 97, 4, 40), r(2, 97, 4, 40), r(2, 97, 4, 24)
    out.append(("attention plain N=97 d=40", lambda q, k, v: strata.attention(q, k, v), [q, k, v]))
    out.append(("attention causal", lambda q, k, v: strata.attention(q, k, v, causal=True), [q, k, v]))
    out.append(("attention window (16, 0) + 3 global",
                lambda q, k, v: strata.attention(q, k, v, window=(16, 0), num_global=3), [q, k, v]))
    mask = torch.ones(2, 97, dtype=torch.bool)
    mask[1, 60:] = False
    out.append(("attention key padding", lambda q, k, v, m: strata.attention(q, k, v, key_padding_mask=m),
                [q, k, v, mask]))
    qs, ks, vs = r(2, 7, 4, 40), r(2, 33, 4, 40), r(2, 33, 4, 24)
    out.append(("attention seq_q 7 < seq_k 33 causal (bottom-right)",
                lambda q, k, v: strata.attention(q, k, v, causal=True), [qs, ks, vs]))
    kg, vg = r(2, 97, 1, 40), r(2, 97, 1, 24)
    out.append(("attention GQA heads_kv=1", lambda q, k, v: strata.attention(q, k, v, causal=True), [q, kg, vg]))
    q1 = r(2, 97, 1, 40)
    out.append(("attention shared query heads_q=1", lambda q, k, v: strata.attention(q, k, v), [q1, k, v]))
    out.append(("attention layout bhsd", lambda q, k, v: strata.attention(q, k, v, layout="bhsd"),
                [q.transpose(1, 2).contiguous(), k.transpose(1, 2).contiguous(), v.transpose(1, 2).contiguous()]))

    qm, km, vm = r(2, 100, 3, 16), r(2, 100, 3, 16), r(2, 100, 3, 16)
    out.append(("mlr 8|4|4 context 128 causal", lambda q, k, v: strata.mlr_attention(q, k, v, [8, 4, 4], context=128),
                [qm, km, vm]))
    out.append(("mlr 8|4|2|2 level_average",
                lambda q, k, v: strata.mlr_attention(q, k, v, [8, 4, 2, 2], context=128, level_average=True),
                [qm, km, vm]))

    qe, ke, ve = r(2, 96, 3, 16), r(2, 96, 3, 16), r(2, 96, 3, 16)
    out.append(("mlr 8|4|2|2 non-causal N = context = 96 (encoder)",
                lambda q, k, v: strata.mlr_attention(q, k, v, [8, 4, 2, 2], context=96, causal=False, level_average=True),
                [qe, ke, ve]))
    out.append(("mlr 8|4|4 non-causal (the general composition)",
                lambda q, k, v: strata.mlr_attention(q, k, v, [8, 4, 4], context=128, causal=False), [qm, km, vm]))
    ql, kl, vl = r(1, 1025, 2, 16), r(1, 1025, 1, 16), r(1, 1025, 1, 24)
    out.append(("mlr 4|4|4|2|2 N=1025 context 2048 GQA 1/L",
                lambda q, k, v: strata.mlr_attention(q, k, v, [4, 4, 4, 2, 2], context=2048, divide_by_num_levels=True),
                [ql, kl, vl]))

    qn, kn, vn = r(2, 100, 3, 24), r(2, 100, 3, 24), r(2, 100, 3, 24)
    for T in (1, 3):
        out.append((f"monarch N=100 B=10 T={T}", lambda q, k, v, T=T: strata.monarch_attention(q, k, v, num_steps=T),
                    [qn, kn, vn]))
    out.append(("monarch N=100 B=16 (padded) T=2",
                lambda q, k, v: strata.monarch_attention(q, k, v, num_steps=2, block_size=16), [qn, kn, vn]))

    x = r(37, 64)
    for label, spec in (("btt 64", st.btt(64, 64)), ("monarch 64", st.monarch(64)),
                        ("mlr 48 16|8", st.mlr(48, [16, 8])), ("low_rank 64x40 r5", st.low_rank(64, 40, 5)),
                        ("kronecker 8x8 (x) 8x8", st.kronecker(8, 8, 8, 8))):
        xin = x[:, :spec.in_features]
        fac = [r(*s) / math.sqrt(s[-2]) for s in spec.factor_shapes()]
        out.append((f"structured_linear {label}",
                    lambda x, *f, spec=spec: st.structured_linear(x, spec, list(f)), [xin, *fac]))
    return out


def cuda_ms(fn, reps: int) -> list:
    """Milliseconds per call of fn, one CUDA-event pair per call, after 3 warm-up calls."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return times


def median_ms(fn, reps: int):
    """Median milliseconds of fn, or the error's text (a failed row is a result, not a stop)."""
    try:
        return statistics.median(cuda_ms(fn, reps))
    except Exception as e:
        return f"{type(e).__name__}: {e}"[:300]


def ratio(a, b):
    return a / b if isinstance(a, float) and isinstance(b, float) else None


def timing(device, reps):
    """bf16, batch 1, 12 heads, d = 64: strata's ops on the GPU against SDPA on the same tensors."""
    rows = []
    H, d = 12, 64
    for N in (1024, 4096, 16384):
        q, k, v = (torch.randn(1, N, H, d, device=device, dtype=torch.bfloat16) for _ in range(3))
        qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
        sdpa = median_ms(lambda: F.scaled_dot_product_attention(qt, kt, vt), reps)
        row = {"N": N, "heads": H, "head_dim": d, "dtype": "bfloat16", "sdpa_ms": sdpa,
               "strata_attention_ms": median_ms(lambda: strata.attention(q, k, v), reps)}
        for T in (1, 2):
            row[f"monarch_T{T}_ms"] = median_ms(lambda: strata.monarch_attention(q, k, v, num_steps=T), reps)
            row[f"monarch_T{T}_speedup_over_sdpa"] = ratio(sdpa, row[f"monarch_T{T}_ms"])
        rows.append(row)
        print(json.dumps(row), flush=True)
    for N in (1024, 4096, 16384):
        q, k, v = (torch.randn(1, N, H, d, device=device, dtype=torch.bfloat16) for _ in range(3))
        qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
        sdpa = median_ms(lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=True), reps)
        ranks = [32, 8, 6, 4, 4, 4, 4, 2]
        mlr = lambda q, k, v: strata.mlr_attention(q, k, v, ranks, context=N, level_average=True)
        ms = median_ms(lambda: mlr(q, k, v), reps)
        row = {"N": N, "heads": H, "head_dim": d, "dtype": "bfloat16", "sdpa_causal_ms": sdpa,
               "mlr_8_levels_ms": ms, "mlr_speedup_over_sdpa": ratio(sdpa, ms)}
        # forward + backward (a training step's attention), gradients of q, k, v
        qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
        dout = torch.randn_like(q)

        def step(fn):
            out = fn()
            torch.autograd.grad(out, (qg, kg, vg), dout)

        sdpa_fb = median_ms(lambda: step(lambda: F.scaled_dot_product_attention(
            qg.transpose(1, 2), kg.transpose(1, 2), vg.transpose(1, 2), is_causal=True).transpose(1, 2)), reps)
        mlr_fb = median_ms(lambda: step(lambda: mlr(qg, kg, vg)), reps)
        row.update({"sdpa_causal_fwd_bwd_ms": sdpa_fb, "mlr_fwd_bwd_ms": mlr_fb,
                    "mlr_fwd_bwd_speedup_over_sdpa": ratio(sdpa_fb, mlr_fb)})
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--no-timing", action="store_true")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--mlr-regions-half", action="store_true",
                    help="let bf16 / fp16 MLR on CUDA take the regions path (STRATA_MLR_REGIONS_CUDA_HALF=1), "
                         "to check it before it is made the default")
    a = ap.parse_args()
    if a.mlr_regions_half:
        os.environ["STRATA_MLR_REGIONS_CUDA_HALF"] = "1"  # read at the first MLR call, after this
    if a.device.startswith("cuda"):
        if not torch.cuda.is_available():
            print("gpu_ops_check: --device cuda but torch sees no CUDA device", file=sys.stderr)
            return 3
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        name = torch.cuda.get_device_name(0)
    else:
        name = "cpu"
    res = {"device": name, "torch": torch.__version__, "strata": strata.info(), "cases": [], "timing": [],
           "mlr_regions_half": a.mlr_regions_half}
    t0 = time.time()
    for label, fn, inputs in cases():
        for dtype in (torch.float32, torch.bfloat16):
            try:
                c = run_case(label, fn, inputs, a.device, dtype)
            except Exception as e:  # a failure is a result: record it and go on
                c = {"case": label, "dtype": str(dtype).replace("torch.", ""), "ok": False,
                     "error": f"{type(e).__name__}: {e}"[:500]}
            res["cases"].append(c)
            print(json.dumps(c), flush=True)
    res["check_s"] = time.time() - t0
    if a.device.startswith("cuda") and not a.no_timing:
        try:
            res["timing"] = timing(a.device, a.reps)
        except Exception as e:
            res["timing_error"] = f"{type(e).__name__}: {e}"[:500]
    res["ok"] = all(c["ok"] for c in res["cases"])
    with open(a.out, "w") as f:
        json.dump(res, f, indent=2, default=str)
    bad = [f"{c['case']} ({c['dtype']})" for c in res["cases"] if not c["ok"]]
    print(f"gpu_ops_check: {len(res['cases']) - len(bad)}/{len(res['cases'])} within bounds on {name}"
          + (f"; outside: {bad}" if bad else ""), flush=True)
    return 0 if not bad else 1


if __name__ == "__main__":
    sys.exit(main())
