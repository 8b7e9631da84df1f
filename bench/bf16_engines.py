# The dense bf16 forward on each compute engine this CPU has (amx_bf16, avx512_bf16) and in fp32
# compute, in one process, rounds in alternating order after a warm-up: the figures behind the
# automatic choice in include/strata/cpu.h (Compute) and docs/results.md's dense section.
# Run: STRATA_LIB=build/release/torch/libstrata_torch.so PYTHONPATH=python python bench/bf16_engines.py
import statistics, time, torch, strata
torch.manual_seed(0)
B, H, N, D = 4, 8, 4096, 64
q, k, v = (torch.randn(B, H, N, D).bfloat16() for _ in range(3))
engines = [e for e in ("amx_bf16", "avx512_bf16") if e in strata.info()["cpu_features"]] + ["fp32"]
def once(c):
    t = time.perf_counter(); strata.attention_forward(q, k, v, layout="bhsd", compute=c); return time.perf_counter() - t
times = {c: [] for c in engines}
for c in engines: once(c)  # warm-up
for r in range(5):
    for c in engines if r % 2 == 0 else engines[::-1]: times[c].append(once(c))
print(f"B={B} H={H} N={N} D={D} bfloat16 forward, {strata.info()['threads']} threads")
for c, ts in times.items():
    print(f"{c:12s} median {1e3 * statistics.median(ts):7.1f} ms  (min {1e3 * min(ts):.1f}, max {1e3 * max(ts):.1f})")
