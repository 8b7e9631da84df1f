"""A character-level language model in plain PyTorch with strata's MLR attention.

Trains a small GPT-style decoder (pre-LayerNorm blocks of ``strata.MLRAttention`` and a fused GELU
MLP, ``strata.GeluMLP``; learned positions) on tinyshakespeare with ``torch.compile``, then samples from it. The same script
runs data-parallel under torchrun (DistributedDataParallel; Gloo on the CPU, NCCL on CUDA):

    python examples/train_charlm.py                          # the default size, a few minutes on 2 cores
    python examples/train_charlm.py --size smoke --out /tmp/lm
    torchrun --nproc-per-node 2 examples/train_charlm.py --size smoke --out /tmp/lm2
    python examples/train_charlm.py --size smoke --out /tmp/lm --resume     # continue a run

Data: ../shared/data/text/tinyshakespeare.txt beside the repository (or --data / $STRATA_SHARED_DIR),
checked against its sha256 (shared/data/README.md). Vocabulary: '\\n' and the 95 printable ASCII
characters (id 0 = '\\n', id c - 31 for c), the reference code's; the last 10% of the text is val.

Batches: the global batch at step s is a pure function of (seed, s); rank r of W reads only rows
[r*B/W, (r+1)*B/W) of it. So a 2-rank run takes the same steps as a 1-rank run with the same global
batch (DDP averages the ranks' gradients: the mean over the global batch), and a resumed run takes
the uninterrupted run's steps. The checkpoint (OUT/checkpoint.pt: model, AdamW state, step, the
arguments) is written by rank 0 atomically (temp file, fsync, rename) and resumes under any number
of ranks. Rank 0 logs one JSON line per step to OUT/log.jsonl (step, loss averaged over ranks, lr,
tokens/s) and the final val loss and sample to OUT/summary.json.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import math
import os
import sys
import time
from pathlib import Path

SIZES = {
    # width, layers, heads, MLR ranks (sum = width / heads), seq (= the model's context), global batch, steps
    "smoke": dict(width=32, layers=2, heads=2, ranks="8|4|2|2", seq=64, batch=8, steps=30, lr=3e-3, warmup=5),
    "small": dict(width=128, layers=4, heads=4, ranks="16|8|4|4", seq=256, batch=16, steps=300, lr=1e-3, warmup=30),
}
TINYSHAKESPEARE_SHA256 = "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"
VOCAB = 96


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", choices=sorted(SIZES), default="small", help="defaults for the options below")
    for name, kind in (("width", int), ("layers", int), ("heads", int), ("ranks", str), ("seq", int),
                       ("batch", int), ("steps", int), ("lr", float), ("warmup", int)):
        p.add_argument(f"--{name}", type=kind, default=None, help=f"(default: the size's; global batch for --batch)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=Path("runs/charlm_example"), help="log, checkpoint, summary")
    p.add_argument("--resume", action="store_true", help="continue from OUT/checkpoint.pt")
    p.add_argument("--checkpoint-every", type=int, default=0, help="steps between checkpoints (0: at the end only)")
    p.add_argument("--stop-after", type=int, default=0, help="leave after this step (as if killed; for tests)")
    p.add_argument("--no-compile", action="store_true", help="eager PyTorch instead of torch.compile")
    p.add_argument("--device", default=None,
                   help="cpu or cuda (default: cuda:LOCAL_RANK when CUDA is available; strata's ops then run "
                   "on their ATen path)")
    p.add_argument("--data", type=Path, default=None, help="tinyshakespeare.txt (default: shared/data/text/)")
    p.add_argument("--sample-tokens", type=int, default=200)
    p.add_argument("--prompt", default="ROMEO:")
    p.add_argument("--temperature", type=float, default=0.8)
    p.add_argument("--val-batches", type=int, default=4)
    args = p.parse_args(argv)
    for key, value in SIZES[args.size].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    return args


# ---- distributed setup (before importing strata: its thread pool reads STRATA_NUM_THREADS once) ----


LOCAL_RANK = 0


def init_distributed():
    """(rank, world, local_world) from torchrun's environment; 1 process without it. Each rank gets
    an equal share of the cores for torch's and strata's threads unless the user set them."""
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    global LOCAL_RANK
    LOCAL_RANK = int(os.environ.get("LOCAL_RANK", 0))
    if world > 1:
        threads = str(max(1, (os.cpu_count() or 1) // local_world))
        os.environ.setdefault("STRATA_NUM_THREADS", threads)
        os.environ.setdefault("OMP_NUM_THREADS", threads)
    return rank, world, local_world


RANK, WORLD, LOCAL_WORLD = init_distributed()

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import strata  # noqa: E402


def log0(*a):
    if RANK == 0:
        print(*a, flush=True)


# ---- data -----------------------------------------------------------------------------------------


def find_data(path) -> Path:
    if path is not None:
        return Path(path)
    here = Path(__file__).resolve().parent.parent
    dirs = [os.environ.get("STRATA_SHARED_DIR"), here / "shared", here.parent / "shared"]
    for d in dirs:
        if d and (Path(d) / "data/text/tinyshakespeare.txt").is_file():
            return Path(d) / "data/text/tinyshakespeare.txt"
    sys.exit("train_charlm: tinyshakespeare.txt not found in shared/data/text beside the repository; "
             "pass --data PATH or set STRATA_SHARED_DIR (shared/data/README.md says where it comes from)")


def load_corpus(path: Path):
    """(train ids, val ids) as uint8 tensors; the file checked against its sha256."""
    raw = path.read_bytes()
    if path.name == "tinyshakespeare.txt" and hashlib.sha256(raw).hexdigest() != TINYSHAKESPEARE_SHA256:
        sys.exit(f"train_charlm: {path} is not the expected tinyshakespeare.txt (sha256 differs from "
                 f"{TINYSHAKESPEARE_SHA256}); restore it from shared/data")
    ids = torch.frombuffer(bytearray(raw), dtype=torch.uint8).long()
    keep = (ids == 10) | ((ids >= 32) & (ids <= 126))
    if not bool(keep.all()):
        sys.exit(f"train_charlm: {path} holds {int((~keep).sum())} bytes outside the vocabulary "
                 "('\\n' and printable ASCII)")
    ids = torch.where(ids == 10, 0, ids - 31).to(torch.uint8)
    n_val = len(ids) // 10
    return ids[: len(ids) - n_val], ids[len(ids) - n_val:]


def encode(text: str) -> list:
    return [0 if c == "\n" else ord(c) - 31 for c in text if c == "\n" or 32 <= ord(c) <= 126]


def decode(ids) -> str:
    return "".join("\n" if i == 0 else chr(i + 31) for i in ids)


def batch_rows(ids: torch.Tensor, seq: int, batch: int, seed: int, step: int, rank: int, world: int):
    """This rank's rows of the global batch of step ``step``: (inputs, targets), int64 rows x seq.
    The window starts are drawn for the whole global batch (a pure function of seed and step), and
    each rank gathers only its slice."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    starts = torch.randint(0, len(ids) - seq - 1, (batch,), generator=g)
    per = batch // world
    rows = torch.stack([ids[s: s + seq + 1] for s in starts[rank * per: (rank + 1) * per].tolist()]).long()
    return rows[:, :-1], rows[:, 1:]


# ---- model ----------------------------------------------------------------------------------------


class Block(torch.nn.Module):
    """x + attn(ln1(x)), then x + mlp(ln2(x)): the second half is one fused call each way
    (``strata.GeluMLP``: its ``norm`` is ln2; on CUDA it runs as ATen ops)."""

    def __init__(self, width: int, heads: int, ranks: str, context: int):
        super().__init__()
        self.ln1 = torch.nn.LayerNorm(width)
        self.attn = strata.MLRAttention(width, heads, ranks, context=context, level_average=True)
        self.mlp = strata.GeluMLP(width, 4 * width, norm=True, residual=True)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return self.mlp(x)


class CharLM(torch.nn.Module):
    """Token + learned position embeddings, pre-LN blocks, final LN, untied head."""

    def __init__(self, width: int, layers: int, heads: int, ranks: str, context: int):
        super().__init__()
        self.context = context
        self.tok = torch.nn.Embedding(VOCAB, width)
        self.pos = torch.nn.Parameter(torch.zeros(context, width))
        self.blocks = torch.nn.ModuleList(Block(width, heads, ranks, context) for _ in range(layers))
        self.ln = torch.nn.LayerNorm(width)
        self.head = torch.nn.Linear(width, VOCAB, bias=False)
        torch.nn.init.normal_(self.pos, std=0.02)

    def forward(self, idx):  # idx: batch x seq (seq <= context) -> logits batch x seq x VOCAB
        x = self.tok(idx) + self.pos[: idx.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


def lr_at(step: int, args) -> float:
    """Linear warm-up, then cosine decay to 10% at the last step: a function of the step alone."""
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    t = (step - args.warmup) / max(1, args.steps - args.warmup)
    return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, t))))


# ---- checkpoints ----------------------------------------------------------------------------------

MODEL_KEYS = ("width", "layers", "heads", "ranks", "seq", "batch", "seed")


def save_checkpoint(path: Path, model, optimizer, step: int, args) -> None:
    """Atomically: torch.save to a temp file in the same folder, fsync, rename over the old one,
    fsync the folder. A kill at any moment leaves the old or the new checkpoint, never a torn one."""
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step,
             "args": {k: getattr(args, k) for k in MODEL_KEYS}}
    with open(tmp, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def load_checkpoint(path: Path, model, optimizer, args) -> int:
    """The step to continue from; the model and optimizer restored. A missing, corrupt or
    incompatible checkpoint is an error that names the file."""
    if not path.is_file():
        sys.exit(f"train_charlm: --resume: no checkpoint at {path}")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # a truncated or foreign file
        sys.exit(f"train_charlm: --resume: cannot read {path} ({type(e).__name__}: {e})")
    mine = {k: getattr(args, k) for k in MODEL_KEYS}
    if state.get("args") != mine:
        sys.exit(f"train_charlm: --resume: {path} was written with {state.get('args')}, this run has {mine}")
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    return int(state["step"])


# ---- training -------------------------------------------------------------------------------------


def mean_over_ranks(value: float) -> float:
    if WORLD == 1:
        return value
    t = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(t)
    return t.item() / WORLD


@torch.no_grad()
def val_loss(model, val_ids, args, device) -> float:
    losses = []
    for i in range(args.val_batches):  # fixed val batches (seed -1 - i), sharded as the train ones
        x, y = (t.to(device) for t in batch_rows(val_ids, args.seq, args.batch, -1 - i, 0, RANK, WORLD))
        losses.append(F.cross_entropy(model(x).flatten(0, 1), y.flatten()).item())
    return mean_over_ranks(sum(losses) / len(losses))


@torch.no_grad()
def sample(model, prompt: str, tokens: int, temperature: float, seed: int, device) -> str:
    """Autoregressive sampling, recomputing the forward over the last `context` tokens each step."""
    g = torch.Generator().manual_seed(seed)
    ids = encode(prompt) or [0]
    for _ in range(tokens):
        logits = model(torch.tensor([ids[-model.context:]], device=device))[0, -1].double().cpu()
        if temperature <= 0:
            nxt = int(logits.argmax())
        else:
            nxt = int(torch.multinomial(torch.softmax(logits / temperature, -1), 1, generator=g))
        ids.append(nxt)
    return decode(ids)


def leave_process_group(barrier: bool) -> None:
    """Ends this rank's part in the process group, every rank together (a barrier unless the caller
    has just passed one). The caller drops its DDP wrapper (and the compiled step over it) first. A
    rank tearing Gloo down while rank 0 still sampled aborted with "terminate called without an
    active exception" (1 of ~6 runs before the barrier). It was seen once more with the barrier alone
    (a clean-clone CI run at 149ecdf; 0 of 8 runs here): DDP's reducer, which holds the group and its
    Gloo work, was still alive at destroy_process_group and freed only at interpreter exit."""
    gc.collect()  # the dropped wrapper's reference cycles, if any, before the group goes
    if barrier:
        dist.barrier()
    dist.destroy_process_group()


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.batch % WORLD != 0:
        sys.exit(f"train_charlm: --batch {args.batch} (the global batch) must be a multiple of the {WORLD} ranks")
    device = torch.device(args.device or (f"cuda:{LOCAL_RANK}" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", LOCAL_RANK)
    if WORLD > 1:
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    train_ids, val_ids = load_corpus(find_data(args.data))
    torch.manual_seed(args.seed)  # the same initial model on every rank (DDP also broadcasts rank 0's)
    model = CharLM(args.width, args.layers, args.heads, args.ranks, args.seq).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
    args.out.mkdir(parents=True, exist_ok=True)
    ckpt = args.out / "checkpoint.pt"
    start = load_checkpoint(ckpt, model, optimizer, args) if args.resume else 0
    net = model if WORLD == 1 else torch.nn.parallel.DistributedDataParallel(
        model, device_ids=[device.index] if device.type == "cuda" else None)
    step_fn = net if args.no_compile else torch.compile(net)
    log0(f"train_charlm: {sum(p.numel() for p in model.parameters())} parameters, {WORLD} rank(s), "
         f"steps {start}..{args.steps} on {device}, strata {strata.__version__} ({strata.info()['isa']}), "
         f"{'eager' if args.no_compile else 'torch.compile'}")
    log = open(args.out / "log.jsonl", "a") if RANK == 0 else None
    t0, tokens = time.time(), 0
    for step in range(start, args.steps):
        x, y = (t.to(device) for t in batch_rows(train_ids, args.seq, args.batch, args.seed, step, RANK, WORLD))
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, args)
        loss = F.cross_entropy(step_fn(x).flatten(0, 1), y.flatten())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        tokens += args.batch * args.seq
        mean_loss = mean_over_ranks(loss.item())
        if log:
            rate = tokens / max(time.time() - t0, 1e-9)
            log.write(json.dumps({"step": step, "loss": mean_loss, "lr": lr_at(step, args), "tokens_per_s": rate}) + "\n")
            log.flush()
            if step % 10 == 0 or step == args.steps - 1:
                print(f"step {step + 1}/{args.steps}  loss {mean_loss:.4f}  {rate:,.0f} tokens/s", flush=True)
        done = step + 1
        if RANK == 0 and ((args.checkpoint_every and done % args.checkpoint_every == 0) or done == args.steps):
            save_checkpoint(ckpt, model, optimizer, done, args)
        if WORLD > 1:
            dist.barrier()  # the checkpoint is complete before any rank goes on (or stops)
        if args.stop_after and done >= args.stop_after:
            log0(f"train_charlm: stopped after step {done} (--stop-after)")
            if WORLD > 1:
                del step_fn, net  # DDP holds the group: gone before it (leave_process_group)
                leave_process_group(barrier=False)  # the barrier above: every rank is here
            return 0
    val = val_loss(model, val_ids, args, device)
    if RANK == 0:
        text = sample(model, args.prompt, args.sample_tokens, args.temperature, args.seed, device)
        print(f"val loss {val:.4f} ({val / math.log(2):.3f} bits/char)\n--- sample ---\n{text}\n--------------")
        summary = {"val_loss": val, "val_bits_per_char": val / math.log(2), "steps": args.steps, "ranks": WORLD,
                   "sample": text}
        (args.out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    if WORLD > 1:
        del step_fn, net  # DDP holds the group: gone before it (leave_process_group)
        leave_process_group(barrier=True)  # rank 0 may still be sampling
    return 0


if __name__ == "__main__":
    sys.exit(main())
