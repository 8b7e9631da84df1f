# The dense bf16 forward (and forward + backward) on each compute engine this CPU has (amx_bf16,
# avx512_bf16) and in fp32 compute, in one process, rounds in alternating order after a warm-up:
# the figures behind the automatic choice in include/strata/cpu.h (Compute) and docs/results.md's
# dense section.
# Run: STRATA_LIB=build/release/torch/libstrata_torch.so PYTHONPATH=python python bench/bf16_engines.py
import statistics, time, torch, strata
torch.manual_seed(0)
B, H, N, D = 4, 8, 4096, 64
q, k, v, g = (torch.randn(B, H, N, D).bfloat16() for _ in range(4))
engines = [e for e in ("amx_bf16", "avx512_bf16") if e in strata.info()["cpu_features"]] + ["fp32"]


def fwd(c):
    t = time.perf_counter(); strata.attention_forward(q, k, v, layout="bhsd", compute=c); return time.perf_counter() - t


def fwd_bwd(c):
    t = time.perf_counter()
    o, lse = strata.attention_forward(q, k, v, layout="bhsd", compute=c)
    strata.attention_backward(q, k, v, o, lse, g, layout="bhsd", compute=c)
    return time.perf_counter() - t


info = strata.info()
print(f"B={B} H={H} N={N} D={D} bfloat16, {info['threads']} threads; compute=auto takes {info['bf16_auto']} here "
      f"(vdpbf16ps {info['bf16_dot_rates'][0]:.1f} vs fp32 FMA {info['bf16_dot_rates'][1]:.1f} GMAC/s, one thread)")
for name, once in (("forward", fwd), ("forward + backward", fwd_bwd)):
    times = {c: [] for c in engines}
    for c in engines: once(c)  # warm-up
    for r in range(5):
        for c in engines if r % 2 == 0 else engines[::-1]: times[c].append(once(c))
    print(name)
    for c, ts in times.items():
        print(f"  {c:12s} median {1e3 * statistics.median(ts):7.1f} ms  (min {1e3 * min(ts):.1f}, max {1e3 * max(ts):.1f})")
