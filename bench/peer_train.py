"""The plain-PyTorch peer of strata's trainer (issue 45 item 2).

The same GPT-style decoder as models/decoder.h (pre-LN, learned positions, optional QK-LayerNorm,
GELU MLP x4, untied head or the ICR read-in / read-out), written with torch.nn modules and
F.scaled_dot_product_attention only: nothing of strata is imported. The data are an exact
re-implementation of strata's (data/counter_rng.h: splitmix64 keyed by (seed, step, micro),
Box-Muller normals; data/icr.cpp; data/char_corpus.cpp), so both trainers see the same batches at
the same steps; `check_data` compares them element for element against strata's own generator when
the library is importable.

Parameterisations (--param):
  sp   PyTorch's own initialisation of every module (nn.Linear: U(+-1/sqrt(fan_in)); nn.Embedding:
       N(0, 1)) and one learning rate for every parameter: what a plain PyTorch user writes; the
       position table zero, as a bare nn.Parameter(torch.zeros(T, D)) (nn.Embedding's N(0, 1) rows
       drown the ICR read-in's signal, std about 0.2, and nothing was learned: issue 45).
  mup  strata's muP table (torch/include/strata/torch/mup.h): token embedding and the ICR read-in
       N(0, 0.02^2) at lr eta, the position table zero at eta; q/k/v, MLP-in and the attention / MLP
       out-projections N(0, 1/fan_in) at lr eta * base / fan_in; the readout (LM head, ICR read-out)
       N(0, 1/fan_in^2) at eta * base / fan_in; LayerNorm weights 1 at eta. --zero-init 1: the
       reference's zero out-projections and readout (structured-attention.md section 6), which
       stall a 64-wide model (issue 45).

  python bench/peer_train.py icr --dim 8 --width 64 --heads 4 --layers 4 --steps 1500 --param sp
  python bench/peer_train.py charlm --width 64 --layers 4 --heads 1 --context 256 --steps 340

Writes one JSON line per evaluation and, with --csv, step,loss rows.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

# ---- data: strata's counter RNG (data/counter_rng.h) ------------------------------------------

_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
_GAMMA = 0x9E3779B97F4A7C15
_MASK = (1 << 64) - 1
STREAM_CHAR, STREAM_ICR = 1, 2


def _mix64_int(z: int) -> int:
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


def _mix64(z: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        z = (z ^ (z >> np.uint64(30))) * _M1
        z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


def counter_words(seed: int, step: int, micro: int, stream: int, count: int) -> np.ndarray:
    """The first `count` outputs of CounterRng(seed, step, micro, stream).next()."""
    s = _mix64_int((seed + _GAMMA * (stream + 1)) & _MASK)
    s = _mix64_int(s ^ step)
    s = _mix64_int(s ^ micro)
    k = np.arange(1, count + 1, dtype=np.uint64)
    with np.errstate(over="ignore"):
        return _mix64(np.uint64(s) + k * np.uint64(_GAMMA))


def counter_normals(seed: int, step: int, micro: int, stream: int, count: int) -> np.ndarray:
    """The first `count` CounterRng.normal() draws (Box-Muller, cos then sin of each pair)."""
    pairs = (count + 1) // 2
    w = counter_words(seed, step, micro, stream, 2 * pairs)
    u1 = ((w[0::2] >> np.uint64(11)) + np.uint64(1)).astype(np.float64) * 2.0**-53
    u2 = (w[1::2] >> np.uint64(11)).astype(np.float64) * 2.0**-53
    r = np.sqrt(-2.0 * np.log(u1))
    a = 6.283185307179586 * u2
    out = np.empty(2 * pairs)
    out[0::2], out[1::2] = r * np.cos(a), r * np.sin(a)
    return out[:count]


# ---- data: in-context regression (data/icr.cpp) -------------------------------------------------


def icr_stage(dim: int, start_dims: int, start_points: int, interval: int, updates: int, step: int):
    """(active_dims, points) at a training step, as data::icr_stage."""
    inc = max(1, (dim - start_dims + updates - 1) // updates)
    k = min(step // interval, 2 * dim)
    return min(start_dims + k * inc, dim), min(start_points + 2 * k * inc, 2 * dim)


def icr_batch(dim: int, active: int, points: int, batch: int, seed: int, step: int, micro: int):
    """(tokens batch x 2P x dim, targets batch x P) float32, as data::icr_batch."""
    per = dim + points * active
    z = counter_normals(seed, step, micro, STREAM_ICR, batch * per).reshape(batch, per)
    w = z[:, :dim]
    x = (z[:, dim:].reshape(batch, points, active) * (1.0 / math.sqrt(active))).astype(np.float32)
    y = np.einsum("bpj,bj->bp", x.astype(np.float64), w[:, :active]).astype(np.float32)
    tokens = np.zeros((batch, 2 * points, dim), np.float32)
    tokens[:, 0::2, :active] = x
    tokens[:, 1::2, 0] = y
    return torch.from_numpy(tokens), torch.from_numpy(y.copy())


# ---- data: character corpora (data/char_corpus.cpp) ---------------------------------------------


def load_char_splits(path: str, val_fraction: float = 0.1):
    """(train, val) id arrays: a line (with its '\\n') holding a byte outside '\\n' and 32..126 is
    dropped whole; id 0 = '\\n', c - 31 for the rest; the last val_fraction is val."""
    with open(path, "rb") as f:
        text = f.read()
    kept = bytearray()
    lines = text.split(b"\n")
    for i, line in enumerate(lines):
        piece = line + b"\n" if i + 1 < len(lines) else line  # the last piece has no '\n'
        if all(c == 10 or 32 <= c <= 126 for c in piece):
            kept += piece
    arr = np.frombuffer(bytes(kept), np.uint8).astype(np.int64)
    arr = np.where(arr == 10, 0, arr - 31)
    n_val = int(len(arr) * val_fraction)
    return arr[: len(arr) - n_val], arr[len(arr) - n_val :]


def char_windows(split: np.ndarray, batch: int, T: int, seed: int, step: int, micro: int) -> torch.Tensor:
    """batch x (T + 1) ids, as data::sample_char_windows (Lemire's high-word start)."""
    starts = len(split) - T
    w = counter_words(seed, step, micro, STREAM_CHAR, batch)
    begin = [(int(v) * starts) >> 64 for v in w]
    return torch.from_numpy(np.stack([split[b : b + T + 1] for b in begin]))


def char_corpus_path(name: str) -> str:
    if name == "tinyshakespeare":
        here = os.path.dirname(os.path.abspath(__file__))
        return os.path.join(here, "..", "..", "shared", "data", "text", "tinyshakespeare.txt")
    if name == "kjv":
        home = os.environ.get("STRATA_HOME") or os.path.join(os.environ["HOME"], ".cache", "strata")
        return os.path.join(home, "data", "kjv.txt")
    return name


# ---- the model ----------------------------------------------------------------------------------


class Attention(nn.Module):
    def __init__(self, width: int, heads: int, qk_ln: bool, scale: float, bias: bool):
        super().__init__()
        self.heads, self.hd, self.scale = heads, width // heads, scale
        self.q_proj = nn.Linear(width, width, bias=bias)
        self.k_proj = nn.Linear(width, width, bias=bias)
        self.v_proj = nn.Linear(width, width, bias=bias)
        self.out_proj = nn.Linear(width, width, bias=bias)
        self.q_ln = nn.LayerNorm(self.hd, bias=bias) if qk_ln else None
        self.k_ln = nn.LayerNorm(self.hd, bias=bias) if qk_ln else None

    def forward(self, x):  # B x T x D
        B, T, D = x.shape
        q, k, v = (p(x).view(B, T, self.heads, self.hd) for p in (self.q_proj, self.k_proj, self.v_proj))
        if self.q_ln is not None:
            q, k = self.q_ln(q), self.k_ln(k)
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                           is_causal=True, scale=self.scale)
        return self.out_proj(o.transpose(1, 2).reshape(B, T, D))


class Block(nn.Module):
    def __init__(self, width, heads, qk_ln, scale, bias):
        super().__init__()
        self.ln1 = nn.LayerNorm(width, bias=bias)
        self.attn = Attention(width, heads, qk_ln, scale, bias)
        self.ln2 = nn.LayerNorm(width, bias=bias)
        self.fc = nn.Linear(width, 4 * width, bias=bias)
        self.proj = nn.Linear(4 * width, width, bias=bias)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.proj(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    """vocab > 0: ids -> logits; vocab == 0: vectors of input_dim -> one scalar per token."""

    def __init__(self, vocab, input_dim, width, layers, heads, context, qk_ln, scale, bias=False):
        super().__init__()
        self.tok_emb = nn.Embedding(vocab, width) if vocab else None
        self.read_in = None if vocab else nn.Linear(input_dim, width, bias=bias)
        self.pos_emb = nn.Embedding(context, width)
        self.blocks = nn.ModuleList(Block(width, heads, qk_ln, scale, bias) for _ in range(layers))
        self.ln_f = nn.LayerNorm(width, bias=bias)
        self.head = nn.Linear(width, vocab if vocab else 1, bias=bias and not vocab)

    def forward(self, inp):
        x = self.tok_emb(inp) if self.tok_emb is not None else self.read_in(inp)
        x = x + self.pos_emb(torch.arange(inp.shape[1]))
        for b in self.blocks:
            x = b(x)
        return self.head(self.ln_f(x))


def mup_table(model: GPT, zero_init: bool):
    """name -> (init, fan_in for the lr or None): strata's muP table (see the module doc); zero_init:
    the reference's zero out-projections and readout instead."""
    table = {}
    for name, p in model.named_parameters():
        leaf = name.rsplit(".", 1)[0].rsplit(".", 1)[-1]
        if name.endswith("bias"):
            table[name] = ("zero", None)                      # biases: zero, lr eta
        elif p.dim() == 1:
            table[name] = ("ones", None)                      # LayerNorm weights
        elif leaf == "pos_emb":
            table[name] = ("zero", None)                      # position table: zero, lr eta
        elif leaf in ("tok_emb", "read_in"):
            table[name] = ("emb", None)                       # N(0, 0.02^2), lr eta
        elif leaf == "head":
            table[name] = ("zero" if zero_init else "readout", p.shape[1])  # N(0, 1/fan_in^2)
        elif leaf in ("out_proj", "proj"):
            table[name] = ("zero" if zero_init else "fan_in", p.shape[1])
        else:
            table[name] = ("fan_in", p.shape[1])              # q/k/v, MLP fc
    return table


def make_optimizer(model: GPT, a, gen: torch.Generator):
    if a.param == "sp":
        with torch.no_grad():
            model.pos_emb.weight.zero_()  # as a bare nn.Parameter(torch.zeros(T, D)): see the module doc
        return torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.95), eps=a.eps, weight_decay=0.0)
    groups = []
    with torch.no_grad():
        for name, p in model.named_parameters():
            init, fan_in = mup_table(model, bool(a.zero_init))[name]
            if init == "ones":
                p.fill_(1.0)
            elif init == "zero":
                p.zero_()
            elif init == "emb":
                p.normal_(0.0, 0.02, generator=gen)
            elif init == "readout":
                p.normal_(0.0, 1.0 / fan_in, generator=gen)
            else:
                p.normal_(0.0, fan_in**-0.5, generator=gen)
            groups.append({"params": [p], "lr": a.lr * (a.base_width / fan_in if fan_in else 1.0), "name": name})
    return torch.optim.AdamW(groups, betas=(0.9, 0.95), eps=a.eps, weight_decay=0.0)


# ---- training ------------------------------------------------------------------------------------


def lr_factor(step: int, warmup: int) -> float:
    """strata's schedule (models/trainer.cpp lr_factor) with schedule = constant."""
    return (step + 1) / warmup if step < warmup else 1.0


EVAL_SEED_OFFSET = 0x9E3779B97F4A7C15


def run(a, curve_out: list | None = None) -> list[dict]:
    """Trains as `a` says; returns the evaluation rows (also printed as JSON lines); the training
    curve (step, loss) goes to curve_out when given, and to a.csv when set."""
    torch.manual_seed(a.seed)
    torch.set_num_threads(a.threads)
    gen = torch.Generator().manual_seed(a.seed)
    if a.task == "icr":
        context = 4 * a.dim
        model = GPT(0, a.dim, a.width, a.layers, a.heads, context, a.qk_ln, a.scale_value, bool(a.bias))
    else:
        train, val = load_char_splits(char_corpus_path(a.corpus))
        model = GPT(96, 0, a.width, a.layers, a.heads, a.context, a.qk_ln, a.scale_value, bool(a.bias))
    opt = make_optimizer(model, a, gen)
    base_lrs = [g["lr"] for g in opt.param_groups]

    def icr_loss(active, points, batch, seed, step, micro):
        tokens, target = icr_batch(a.dim, active, points, batch, seed, step, micro)
        pred = model(tokens)[:, 0::2, 0]
        return pred, target

    def evaluate():
        model.eval()
        with torch.no_grad():
            if a.task == "icr":
                seed = (a.seed + EVAL_SEED_OFFSET) & _MASK  # strata's "val" prompts (its periodic evaluation)
                last = zero = 0.0
                n, bsz = a.eval_prompts, a.batch  # strata evaluates in batches of train.batch (micro = batch index)
                for k, begin in enumerate(range(0, n, bsz)):
                    b = min(bsz, n - begin)
                    pred, target = icr_loss(a.dim, 2 * a.dim, b, seed, 0, k)
                    last += (pred - target)[:, -1].square().sum().item()
                    zero += target[:, -1].square().sum().item()
                out = {"last_point_se": last / n, "last_point_zero_se": zero / n, "ratio": last / zero}
            else:
                T = a.context
                windows = (len(val) - 1) // T
                n = min(windows, a.eval_batches * a.batch) if a.eval_batches else windows
                tot = 0.0
                for begin in range(0, n, a.batch):
                    b = min(a.batch, n - begin)
                    ids = torch.from_numpy(np.stack([val[(begin + i) * T : (begin + i) * T + T + 1] for i in range(b)]))
                    logits = model(ids[:, :-1])
                    tot += F.cross_entropy(logits.reshape(-1, 96), ids[:, 1:].reshape(-1)).item() * b
                out = {"val_loss": tot / n, "val_bpc": tot / n / math.log(2)}
        model.train()
        return out

    rows = []
    curve = curve_out if curve_out is not None else []
    t0 = time.time()
    for step in range(a.steps):
        f = lr_factor(step, a.warmup)
        for g, lr0 in zip(opt.param_groups, base_lrs):
            g["lr"] = lr0 * f
        if a.task == "icr":
            active, points = icr_stage(a.dim, a.start_dims, a.start_points, a.interval, a.updates, step)
            pred, target = icr_loss(active, points, a.batch, a.seed, step, 0)
            loss = F.mse_loss(pred, target)
        else:
            ids = char_windows(train, a.batch, a.context, a.seed, step, 0)
            logits = model(ids[:, :-1])
            loss = F.cross_entropy(logits.reshape(-1, 96), ids[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if a.clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), a.clip)
        opt.step()
        curve.append((step + 1, loss.item()))
        if (step + 1) % a.eval_every == 0 or step + 1 == a.steps:
            row = {"step": step + 1, "loss": loss.item(), "elapsed_s": round(time.time() - t0, 2), **evaluate()}
            rows.append(row)
            print(json.dumps(row), flush=True)
    if a.csv:
        with open(a.csv, "w") as f:
            f.write("step,loss\n")
            for s, l in curve:
                f.write(f"{s},{l:.6g}\n")
    return rows


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("task", choices=["icr", "charlm"])
    p.add_argument("--param", choices=["sp", "mup"], default="sp")
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--qk-ln", type=int, default=1, help="QK-LayerNorm (1) or not (0)")
    p.add_argument("--bias", type=int, default=0, help="biases in the Linears and LayerNorms (1) or not (0)")
    p.add_argument("--scale", choices=["1/sqrt(d)", "8/d"], default="1/sqrt(d)")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--base-width", type=float, default=128, help="mup: lr eta * base / fan_in for matrices")
    p.add_argument("--zero-init", type=int, default=0,
                   help="mup: zero out-projections and readout (1, the reference's) or not (0)")
    p.add_argument("--eps", type=float, default=1e-8)
    p.add_argument("--clip", type=float, default=0.0)
    p.add_argument("--steps", type=int, default=1500)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--warmup", type=int, default=200)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=max(1, min(2, os.cpu_count() or 1)))
    p.add_argument("--eval-every", type=int, default=250)
    p.add_argument("--csv", default="")
    # icr
    p.add_argument("--dim", type=int, default=8)
    p.add_argument("--start-dims", type=int, default=None)
    p.add_argument("--start-points", type=int, default=None)
    p.add_argument("--interval", type=int, default=200)
    p.add_argument("--updates", type=int, default=15)
    p.add_argument("--eval-prompts", type=int, default=640)
    # charlm
    p.add_argument("--corpus", default="tinyshakespeare")
    p.add_argument("--context", type=int, default=256)
    p.add_argument("--eval-batches", type=int, default=8)
    a = p.parse_args(argv)
    a.start_dims = a.dim if a.start_dims is None else a.start_dims
    a.start_points = 2 * a.dim if a.start_points is None else a.start_points
    hd = a.width // a.heads
    a.scale_value = 1 / math.sqrt(hd) if a.scale == "1/sqrt(d)" else 8 / hd
    return a


if __name__ == "__main__":
    run(parse())
