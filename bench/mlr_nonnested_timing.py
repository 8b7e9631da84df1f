# MLR attention with block lists that do not nest (the kernel's general path) vs nested ones of the same
# ranks: fwd and fwd+bwd wall time (median of 7 calls after a warm-up). docs/notes.md, "Block lists
# that do not nest". Run: STRATA_LIB=build/release/torch/libstrata_torch.so PYTHONPATH=python python bench/mlr_nonnested_timing.py
import time, statistics, torch, strata
torch.manual_seed(0)
T, H, D = 4096, 8, 64
torch.set_num_threads(2)
def rnd(): return torch.randn(1, H, T, D)
q, k, v = rnd(), rnd(), rnd()
cases = {"nested 4096|1024|256|64 (16x4)": ([16]*4, [4096, 1024, 256, 64]),
         "non-nested 4096|1000|300|70 (16x4)": ([16]*4, [4096, 1000, 300, 70])}
def timeit(f, n=7):
    f(); ts = []
    for _ in range(n):
        t = time.perf_counter(); f(); ts.append(time.perf_counter() - t)
    return statistics.median(ts) * 1e3, min(ts) * 1e3, max(ts) * 1e3
for name, (r, b) in cases.items():
    fwd = lambda: strata.mlr_attention(q, k, v, r, block_sizes=b, layout="bhsd")
    qq, kk, vv = (x.clone().requires_grad_() for x in (q, k, v))
    def fb():
        o = strata.mlr_attention(qq, kk, vv, r, block_sizes=b, layout="bhsd"); o.sum().backward()
    print(f"{name}: fwd {timeit(fwd)[0]:.1f} ms (min {timeit(fwd)[1]:.1f}); fwd+bwd {timeit(fb)[0]:.1f} ms", flush=True)
