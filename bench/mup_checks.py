"""muP's own checks for strata's parameterisation (issue 45 item 1), as plots in docs/:

  coord   the coordinate check (Yang et al., Tensor Programs V, appendix D.1): the RMS of each
          layer's output over the first steps of training, at widths 32..256. Under muP it stays
          flat across widths; under SP (PyTorch's init, one lr) it grows with the width. The model is
          bench/peer_train.py's GPT with strata's roles declared (strata.mup: mup_init_ /
          mup_param_groups, base width 128) or PyTorch's init (strata.mup.sp_init_) and one lr.
  sweep   the learning-rate sweep at 3 widths with strata's own trainer (`strata train`, char LM):
          the final training loss against the base lr; the optimum should not move by more than one
          grid step across widths under muP.

  python bench/mup_checks.py coord --out docs/plots/mup_coord_check.png
  python bench/mup_checks.py sweep --strata build/release/strata --out docs/plots/mup_lr_sweep.png
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import peer_train  # noqa: E402
import strata  # noqa: E402
from strata.mup import MupRole  # noqa: E402


class RolesGPT(peer_train.GPT):
    """The peer GPT with strata's muP roles declared (models/decoder.cpp's)."""

    def mup_roles(self):
        roles = {"head.weight": MupRole.readout(self.head.in_features), "pos_emb.weight": MupRole.position()}
        if self.read_in is not None:
            roles["read_in.weight"] = MupRole.input(self.read_in.in_features)
        for i, b in enumerate(self.blocks):
            roles[f"blocks.{i}.attn.out_proj.weight"] = MupRole.output(b.attn.out_proj.in_features)
            roles[f"blocks.{i}.proj.weight"] = MupRole.output(b.proj.in_features)
        return roles


def coord_check(param: str, widths, steps: int, lr: float, seeds=(0, 1, 2)):
    """{width: {layer: [rms after step 0..steps-1]}} averaged over seeds (char LM, T = 64)."""
    train, _ = peer_train.load_char_splits(peer_train.char_corpus_path("tinyshakespeare"))
    out = {}
    for w in widths:
        acc = {}
        for seed in seeds:
            torch.manual_seed(seed)
            heads = max(1, w // 32)  # head dim 32 at every width
            model = RolesGPT(96, 0, w, 4, heads, 64, True, (w // heads) ** -0.5, False)
            gen = torch.Generator().manual_seed(seed)
            if param == "mup":
                strata.mup.mup_init_(model, generator=gen)
                opt = strata.mup.mup_adamw(model, lr, base_width=128, eps=1e-8)
            else:
                strata.mup.sp_init_(model, generator=gen)
                opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
            taps = {}
            hooks = [b.register_forward_hook(lambda m, i, o, k=f"block {j}": taps.__setitem__(k, o))
                     for j, b in enumerate(model.blocks)]
            hooks.append(model.head.register_forward_hook(lambda m, i, o: taps.__setitem__("logits", o)))
            for step in range(steps):
                ids = peer_train.char_windows(train, 16, 64, seed, step, 0)
                logits = model(ids[:, :-1])
                for k, t in taps.items():
                    acc.setdefault(k, [0.0] * steps)[step] += t.detach().pow(2).mean().sqrt().item() / len(seeds)
                loss = F.cross_entropy(logits.reshape(-1, 96), ids[:, 1:].reshape(-1))
                opt.zero_grad()
                loss.backward()
                opt.step()
            for h in hooks:
                h.remove()
        out[w] = acc
    return out


def plot_coord(results, steps, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    layers = list(next(iter(results["mup"].values())).keys())
    fig, axes = plt.subplots(2, len(layers), figsize=(3.2 * len(layers), 6), squeeze=False)
    for r, param in enumerate(["sp", "mup"]):
        for c, layer in enumerate(layers):
            ax = axes[r][c]
            for t in [0, steps // 2, steps - 1]:
                ws = sorted(results[param])
                ax.plot(ws, [results[param][w][layer][t] for w in ws], marker="o", label=f"step {t}")
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_title(f"{param}: {layer}", fontsize=9)
            ax.set_xlabel("width")
            if c == 0:
                ax.set_ylabel("RMS of the output")
            ax.legend(fontsize=7)
    fig.suptitle("coordinate check (char LM, 4 layers, T = 64, batch 16; mean of 3 seeds)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def sweep(exe, widths, lrs, steps, param, threads):
    """{width: {lr: mean training loss of the last 20 steps}} from `strata train` (char LM)."""
    out = {}
    for w in widths:
        out[w] = {}
        for lr in lrs:
            with tempfile.TemporaryDirectory() as tmp:
                sets = [f"model.width={w}", f"model.heads={max(1, w // 32)}", "model.layers=2",
                        "model.qk_layernorm=true", "data.context=64", f"train.steps={steps}", "train.batch=16",
                        f"train.warmup={steps // 10}", f"train.lr={lr}", f"train.param={param}",
                        f"train.threads={threads}", "train.eval_every=100000", "train.checkpoint_every=100000"]
                cmd = [exe, "train", os.path.join(ROOT, "configs/charlm.toml"), "--out", os.path.join(tmp, "r"),
                       "--no-progress"]
                for s in sets:
                    cmd += ["--set", s]
                subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
                with open(os.path.join(tmp, "r", "train.csv")) as f:
                    rows = f.read().strip().split("\n")[1:]
                losses = [float(r.split(",")[2]) for r in rows]
                out[w][lr] = sum(losses[-20:]) / 20
                print(json.dumps({"width": w, "lr": lr, "param": param, "loss": out[w][lr]}), flush=True)
    return out


def plot_sweep(results, path, steps):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(results), figsize=(5 * len(results), 4), squeeze=False)
    for ax, (param, res) in zip(axes[0], results.items()):
        for w, by_lr in sorted(res.items()):
            lrs = sorted(by_lr)
            ax.plot(lrs, [by_lr[x] for x in lrs], marker="o", label=f"width {w}")
            best = min(lrs, key=lambda x: by_lr[x])
            ax.plot([best], [by_lr[best]], marker="*", markersize=14, color=ax.lines[-1].get_color())
        ax.set_xscale("log")
        ax.set_xlabel("base learning rate")
        ax.set_ylabel(f"training loss (nats/char, last 20 of {steps} steps)")
        ax.set_title(f"strata train, char LM, {param}")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("check", choices=["coord", "sweep"])
    p.add_argument("--out", required=True)
    p.add_argument("--json", default="")
    p.add_argument("--strata", default=os.path.join(ROOT, "build/release/strata"))
    p.add_argument("--widths", default="32,64,128,256")
    p.add_argument("--steps", type=int, default=0)
    p.add_argument("--lrs", default="3e-4,1e-3,3e-3,1e-2,3e-2")
    p.add_argument("--params", default="mup,sp")
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args()
    widths = [int(w) for w in a.widths.split(",")]
    torch.set_num_threads(a.threads)
    if a.check == "coord":
        steps = a.steps or 10
        res = {param: coord_check(param, widths, steps, 1e-2) for param in ["sp", "mup"]}
        plot_coord(res, steps, a.out)
    else:
        steps = a.steps or 300
        lrs = [float(x) for x in a.lrs.split(",")]
        res = {param: sweep(a.strata, widths, lrs, steps, param, a.threads) for param in a.params.split(",")}
        plot_sweep(res, a.out, steps)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({str(k): v for k, v in res.items()}, f, indent=1, default=str)


if __name__ == "__main__":
    main()
