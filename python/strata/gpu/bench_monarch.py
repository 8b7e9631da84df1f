"""Bench of MonarchAttention's Triton kernels against SDPA (flash) and the torch-ops path, on CUDA.

    python -m strata.gpu.bench_monarch OUT.json [--ns 256,1024,4096,16384] [--steps 1,2] [--quick]

Per N (bf16, 12 heads, d = 64, batch so that batch x N = 65536 tokens: every kernel's grid fills
the chip), for T in --steps: forward and forward + backward times (CUDA events through
triton.testing.do_bench, median, after warm-up; two input sets alternated so that the L2 does
not hold them) of
  * triton    strata.gpu.monarch (forward without the saved state; fwd+bwd: strata.monarch_attention
              through the registered autograd kernel),
  * torch_ops the ATen composition the C++ op used before (torch.ops.strata.monarch_attention's
              composite kernel, OpOverload.decompose),
  * sdpa      F.scaled_dot_product_attention with the flash backend (dense softmax attention: the
              issue's peer; Monarch approximates it),
with the ratio sdpa / triton and each one's fraction of its floor (max of FLOPs at the measured
bf16 matmul rate and minimal bytes, q k v read once and o written once, at the measured copy
rate). Errors: on batch 1, 2 heads, N <= 2048, triton bf16 against the float64 Monarch reference
(the C++ one, CPU) and SDPA bf16 against float64 softmax attention; the issue's rule is ours <= 2x
SDPA's. Writes JSON to OUT and prints a table last.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time

import torch
import torch.nn.functional as F


SMOKE = False  # --cpu-smoke: every code path once on CPU tensors (interpreter), host-clock times


def _bench(fn, inputs, warmup_ms=25, rep_ms=100):
    """Median ms of fn over the input sets in turn (do_bench times one callable: it alternates)."""
    state = {"i": 0}

    def call():
        x = inputs[state["i"] % len(inputs)]
        state["i"] += 1
        return fn(*x)

    if SMOKE:
        t = time.perf_counter()
        call()
        return (time.perf_counter() - t) * 1e3
    import triton.testing

    return triton.testing.do_bench(call, warmup=warmup_ms, rep=rep_ms, return_mode="median")


def _ceilings():
    """Measured copy bandwidth (bytes read + written per s) and bf16 matmul rate (FLOP/s)."""
    if SMOKE:
        return float("nan"), float("nan")  # a smoke run measures no ceiling: fractions come out NaN
    import triton.testing

    src = torch.empty(1 << 28, dtype=torch.uint8, device="cuda").random_(0, 255)  # 256 MiB
    dst = torch.empty_like(src)
    ms = triton.testing.do_bench(lambda: dst.copy_(src), warmup=25, rep=100, return_mode="median")
    copy = 2 * src.numel() / (ms * 1e-3)
    a = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    ms = triton.testing.do_bench(lambda: a @ b, warmup=25, rep=100, return_mode="median")
    mm = 2 * 8192 ** 3 / (ms * 1e-3)
    return copy, mm


def _rel(got, ref):
    got, ref = got.double().cpu(), ref.double().cpu()
    return ((got - ref).norm() / ref.norm()).item()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--ns", default="256,1024,4096,16384")
    ap.add_argument("--steps", default="1,2")
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=65536, help="batch x N per shape")
    ap.add_argument("--quick", action="store_true", help="short warm-up / repeat")
    ap.add_argument("--cpu-smoke", action="store_true",
                    help="no GPU: run every path once on CPU tensors (Triton interpreter; tiny sizes, "
                    "host-clock times that mean nothing), to check this script")
    a = ap.parse_args(argv)
    global SMOKE
    SMOKE = a.cpu_smoke
    dev_t = "cpu" if SMOKE else "cuda"
    if not SMOKE and not torch.cuda.is_available():
        print("bench_monarch: no CUDA device", file=sys.stderr)
        return 3
    import strata
    import strata.gpu as sg
    from strata.gpu import monarch as gm
    from torch.nn.attention import SDPBackend, sdpa_kernel

    t_start = time.time()
    rep = dict(warmup_ms=5, rep_ms=20) if a.quick else dict(warmup_ms=25, rep_ms=100)
    dev = "cpu (smoke)" if SMOKE else torch.cuda.get_device_name()
    copy_bw, mm_rate = _ceilings()
    res = dict(device=dev, torch=torch.__version__, strata=strata.__version__, paths=sg.paths(),
               copy_bytes_per_s=copy_bw, bf16_matmul_flops=mm_rate, heads=a.heads, dim=a.dim, rows=[], errors=[])
    H, D = a.heads, a.dim
    ns = [int(x) for x in a.ns.split(",")]
    if SMOKE:
        H, a.tokens, ns = 2, 64, [32, 64]
    dt = torch.float16 if SMOKE else torch.bfloat16  # the interpreter has no bf16 dot
    backend = SDPBackend.MATH if SMOKE else SDPBackend.FLASH_ATTENTION
    for N in ns:
        batch = max(1, a.tokens // N)
        sets = []
        for s in range(2):
            g = torch.Generator(device=dev_t).manual_seed(s)
            qkv = [torch.randn(batch, N, H, D, device=dev_t, dtype=dt, generator=g) for _ in range(3)]
            sets.append(qkv)
        grads = [torch.randn(batch, N, H, D, device=dev_t, dtype=dt) for _ in range(2)]
        io_bytes = 4 * batch * N * H * D * 2  # q, k, v read, o written (bf16)
        # SDPA flash (bshd -> bhsd views)
        sd_sets = [[t.transpose(1, 2) for t in s] for s in sets]
        with sdpa_kernel(backend):
            sdpa_fwd = _bench(lambda q, k, v: F.scaled_dot_product_attention(q, k, v), sd_sets, **rep)
            sd_req = [[t.detach().clone().requires_grad_() for t in s] for s in sd_sets]

            def sdpa_fb(q, k, v):
                o = F.scaled_dot_product_attention(q, k, v)
                o.backward(grads[0].transpose(1, 2))

            sdpa_fb_ms = _bench(sdpa_fb, sd_req, **rep)
        dense_flops = 4 * batch * H * N * N * D  # QK^T and PV
        for T in (int(x) for x in a.steps.split(",")):
            flops = strata.monarch_attention_flops(N, H, D, D, T, 0) * batch
            floor_fwd = max(flops / mm_rate, io_bytes / copy_bw) * 1e3
            tri_fwd = _bench(lambda q, k, v: gm.forward(q, k, v, T, save_state=False), sets, **rep)
            req = [[t.detach().clone().requires_grad_() for t in s] for s in sets]

            def tri_fb(q, k, v):
                if SMOKE:  # on the CPU the op has the CPU kernel: the launchers directly
                    o, st = gm.forward(q.detach(), k.detach(), v.detach(), T)
                    gm.backward(q.detach(), k.detach(), v.detach(), st, grads[0], T)
                    return
                o = strata.monarch_attention(q, k, v, num_steps=T)
                o.backward(grads[0])

            tri_fb_ms = _bench(tri_fb, req, **rep)
            op = torch.ops.strata.monarch_attention.default
            try:
                tops_fwd = _bench(lambda q, k, v: op.decompose(q, k, v, T), sets, **rep)
            except Exception as e:  # e.g. memory at large N
                tops_fwd = f"error: {type(e).__name__}: {str(e)[:120]}"
            row = dict(N=N, batch=batch, T=T, sdpa_fwd_ms=sdpa_fwd, sdpa_fwdbwd_ms=sdpa_fb_ms,
                       triton_fwd_ms=tri_fwd, triton_fwdbwd_ms=tri_fb_ms, torch_ops_fwd_ms=tops_fwd,
                       fwd_speedup_vs_sdpa=sdpa_fwd / tri_fwd, fwdbwd_speedup_vs_sdpa=sdpa_fb_ms / tri_fb_ms,
                       monarch_flops=flops, triton_fwd_floor_ms=floor_fwd,
                       triton_fwd_floor_fraction=floor_fwd / tri_fwd,
                       sdpa_fwd_floor_fraction=max(dense_flops / mm_rate, io_bytes / copy_bw) * 1e3 / sdpa_fwd,
                       state_bytes_fwd=gm.state_bytes(gm.make_call("bench", *sets[0], T, 0, "post", "stable", None,
                                                                      None, "bshd", "auto"), save_state=False))
            res["rows"].append(row)
            print(json.dumps(row), flush=True)
        del sets, grads, sd_sets, sd_req
        torch.cuda.empty_cache()
    # errors against float64 (small shapes: the Monarch reference materialises N x N on the CPU)
    for N in ((32,) if SMOKE else (256, 1024, 2048)):
        for T in (int(x) for x in a.steps.split(",")):
            g = torch.Generator().manual_seed(7)
            q, k, v = (torch.randn(1, N, 2, D, generator=g, dtype=torch.float64).to(dt) for _ in range(3))
            dout = torch.randn(1, N, 2, D, generator=g, dtype=torch.float64).to(dt)
            qd, kd, vd = (t.double().requires_grad_() for t in (q, k, v))
            ref = strata.monarch_attention(qd, kd, vd, num_steps=T)
            rg = torch.autograd.grad(ref, (qd, kd, vd), dout.double())
            qc, kc, vc = (t.to(dev_t).requires_grad_() for t in (q, k, v))
            if SMOKE:  # the launchers directly (on the CPU the op has the CPU kernel)
                out, st = gm.forward(qc, kc, vc, T)
                og = gm.backward(qc, kc, vc, st, dout, T)
            else:
                out = strata.monarch_attention(qc, kc, vc, num_steps=T)
                og = torch.autograd.grad(out, (qc, kc, vc), dout.cuda())
            # SDPA bf16 against float64 softmax attention, same inputs
            sq, sk, sv = (t.transpose(1, 2).to(dev_t).requires_grad_() for t in (q, k, v))
            with sdpa_kernel(backend):
                so = F.scaled_dot_product_attention(sq, sk, sv)
            sg_ = torch.autograd.grad(so, (sq, sk, sv), dout.transpose(1, 2).to(dev_t))
            dq64, dk64, dv64 = (t.transpose(1, 2).double().requires_grad_() for t in (q, k, v))
            so64 = F.scaled_dot_product_attention(dq64, dk64, dv64)
            sg64 = torch.autograd.grad(so64, (dq64, dk64, dv64), dout.transpose(1, 2).double())
            e = dict(N=N, T=T, triton_out=_rel(out, ref), sdpa_out=_rel(so, so64),
                     triton_grads=[_rel(x, y) for x, y in zip(og, rg)],
                     sdpa_grads=[_rel(x, y) for x, y in zip(sg_, sg64)])
            e["ok_2x_sdpa"] = e["triton_out"] <= 2 * e["sdpa_out"] and all(
                t <= 2 * s for t, s in zip(e["triton_grads"], e["sdpa_grads"]))
            res["errors"].append(e)
            print(json.dumps(e), flush=True)
    res["wall_s"] = time.time() - t_start
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1)
    print(f"\n{dev}  copy {copy_bw / 1e12:.2f} TB/s  bf16 mm {mm_rate / 1e12:.0f} TFLOP/s")
    print(f"{'N':>6} {'T':>2} {'sdpa fwd':>9} {'tri fwd':>9} {'x':>6} {'sdpa f+b':>9} {'tri f+b':>9} {'x':>6} "
          f"{'floor%':>7}")
    for r in res["rows"]:
        print(f"{r['N']:>6} {r['T']:>2} {r['sdpa_fwd_ms']:9.3f} {r['triton_fwd_ms']:9.3f} {r['fwd_speedup_vs_sdpa']:6.2f} "
              f"{r['sdpa_fwdbwd_ms']:9.3f} {r['triton_fwdbwd_ms']:9.3f} {r['fwdbwd_speedup_vs_sdpa']:6.2f} "
              f"{100 * r['triton_fwd_floor_fraction']:6.1f}%")
    for e in res["errors"]:
        print(f"err N={e['N']} T={e['T']} ours {e['triton_out']:.2e} sdpa {e['sdpa_out']:.2e} "
              f"grads ours {max(e['triton_grads']):.2e} sdpa {max(e['sdpa_grads']):.2e} ok={e['ok_2x_sdpa']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
