"""muP-style training support, as the structured-attention paper trains (Kuang et al., ICML 2025,
section 3.5; the reference code's ``src/muP.py``). The same rules as the C++ ``strata/torch/mup.h``.

Every trainable parameter has a ROLE (:class:`MupRole`), which gives its init and its Adam
learning rate (``eta`` = the base learning rate; ``base_width`` = 128, the width at which muP's
rates equal one lr for every matrix: the reference's 768 gave a 64-wide model 12x eta on every
matrix, and such models did not learn):

=================  ======================================  =========================
role               init                                    lr
=================  ======================================  =========================
hidden(fan_in)     N(0, 1/fan_in) (q/k/v, MLP-in)          eta * base_width / fan_in
output(fan_in)     N(0, 1/fan_in) (attention / MLP out-    eta * base_width / fan_in
                   proj; 0 with zero_outputs)
readout(fan_in)    N(0, 1/fan_in^2) (LM head, read-out;    eta * base_width / fan_in
                   0 with zero_outputs)
structured_core    N(0, std^2), std 1/sqrt(fan_in) unless  eta * base_width / fan_in
                   given (BTT and bilinear-MLR cores)
gain               1 (LayerNorm weights)                   eta
bias               0                                       eta
embedding          N(0, 0.02^2)                            eta
position           0 (a learned position table)            eta
input(fan_in)      N(0, 0.02^2) (a read-in from data       eta (its fan_in is the data's
                   features: the reference's ICR read-in)  width, not the model's)
=================  ======================================  =========================

``mup_init_(model, zero_outputs=True)`` zero-initialises the output projections and the readout, as
the reference does; at width 64 that stalled in-context regression at the zero predictor's error
for 1,500 steps, where random ones learn (issue 45). Position tables start at 0 in both
parameterisations: random rows (``nn.Embedding``'s N(0, 1)) drowned the ICR read-in's signal.

:func:`sp_init_` is the standard parameterisation beside it: PyTorch's own init per role (every
matrix but a structured core as ``nn.Linear``, U(+-1/sqrt(fan_in)); embeddings as ``nn.Embedding``,
N(0, 1); gains 1, biases 0; structured cores as muP; position tables 0), trained with one
learning rate.

The optimizer is AdamW with betas (0.9, 0.95), eps 1e-20 (sic, the reference's) and weight decay
0 (when given, it applies to parameters of >= 2 dims, as in the reference).

Roles are DECLARED, not guessed from names: a module with a ``mup_roles()`` method returns
``{relative dotted name: MupRole}`` for parameters of its subtree (e.g. ``{"lm_head.weight":
MupRole.output(d)}``); an ancestor's declaration overrides a descendant's. Undeclared parameters
of ``torch.nn.Linear`` (weight: hidden with fan_in = in_features; bias: bias), ``torch.nn.Embedding``
(embedding) and ``torch.nn.LayerNorm`` (gain, bias) get those defaults; any other undeclared
trainable parameter raises ``ValueError`` naming it.

Example (a later trainer)::

    model = MyLM(...)                       # its modules declare their roles
    strata.mup.mup_init_(model)
    opt = strata.mup.mup_adamw(model, base_lr=3e-3)   # or torch.optim.AdamW(mup_param_groups(...), ...)

The forward-time RMS cap of the structured cores (:func:`rms_cap`) is applied by the modules that
own them (:mod:`strata.bilinear`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

import torch

from . import _check

__all__ = [
    "MupRole",
    "mup_params",
    "mup_init_",
    "sp_init_",
    "mup_param_groups",
    "mup_adamw",
    "rms_cap",
    "rms_cap_sigma",
]

_KINDS = ("hidden", "output", "readout", "structured_core", "gain", "bias", "embedding", "position", "input")
_MATRIX_KINDS = ("hidden", "output", "readout", "structured_core")


@dataclass(frozen=True)
class MupRole:
    """A parameter's muP role: ``kind`` (one of hidden, output, readout, structured_core, gain,
    bias, embedding, position, input), the matrix roles' ``fan_in``, and an init std (0: the rule's)."""

    kind: str
    fan_in: int = 1
    init_std: float = 0.0

    def __post_init__(self):
        if self.kind not in _KINDS:
            _check.fail("MupRole", "kind", f"one of {', '.join(_KINDS)}", repr(self.kind))
        _check.integer(self.fan_in, "MupRole", "fan_in", minimum=1)
        std = _check.real(self.init_std, "MupRole", "init_std")
        # 0 means the rule's std; a negative or NaN one was silently replaced by it (issue 48 item 4)
        if not (std == 0 or (math.isfinite(std) and std > 0)):
            _check.fail("MupRole", "init_std", "0 (the rule's std) or a finite number > 0", repr(self.init_std))

    @staticmethod
    def hidden(fan_in: int) -> "MupRole":
        return MupRole("hidden", fan_in)

    @staticmethod
    def output(fan_in: int) -> "MupRole":
        return MupRole("output", fan_in)

    @staticmethod
    def readout(fan_in: int) -> "MupRole":
        return MupRole("readout", fan_in)

    @staticmethod
    def position() -> "MupRole":
        return MupRole("position")

    @staticmethod
    def structured_core(fan_in: int, std: float = 0.0) -> "MupRole":
        return MupRole("structured_core", fan_in, std)

    @staticmethod
    def gain() -> "MupRole":
        return MupRole("gain")

    @staticmethod
    def bias() -> "MupRole":
        return MupRole("bias")

    @staticmethod
    def embedding(std: float = 0.02) -> "MupRole":
        return MupRole("embedding", 1, std)

    @staticmethod
    def input(fan_in: int, std: float = 0.02) -> "MupRole":
        return MupRole("input", fan_in, std)

    @property
    def is_matrix(self) -> bool:
        return self.kind in _MATRIX_KINDS

    def resolved_std(self) -> float:
        """The std of the normal init (0 for the constant inits)."""
        if self.kind in ("hidden", "output"):
            return 1.0 / math.sqrt(self.fan_in)
        if self.kind == "readout":
            return 1.0 / self.fan_in
        if self.kind == "structured_core":
            return self.init_std if self.init_std > 0 else 1.0 / math.sqrt(self.fan_in)
        if self.kind in ("embedding", "input"):
            return self.init_std if self.init_std > 0 else 0.02
        return 0.0

    def lr(self, base_lr: float, base_width: float = 128) -> float:
        """base_lr * base_width / fan_in for the matrix roles, base_lr otherwise."""
        return base_lr * base_width / self.fan_in if self.is_matrix else base_lr


def _default_roles(module: torch.nn.Module) -> Dict[str, MupRole]:
    """The roles of the torch modules whose parameters are unambiguous (see the module docstring)."""
    if isinstance(module, torch.nn.Linear):
        return {"weight": MupRole.hidden(module.in_features), "bias": MupRole.bias()}
    if isinstance(module, torch.nn.Embedding):
        return {"weight": MupRole.embedding()}
    if isinstance(module, torch.nn.LayerNorm):
        return {"weight": MupRole.gain(), "bias": MupRole.bias()}
    return {}


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def mup_params(model: torch.nn.Module) -> List[Tuple[str, torch.nn.Parameter, MupRole]]:
    """(name, parameter, role) for every trainable parameter of model, once each (tied
    parameters under their first name), in ``named_parameters()`` order.

    Raises ValueError naming a trainable parameter without a role, or a declaration naming no
    parameter."""
    where = "mup_params"
    if not isinstance(model, torch.nn.Module):
        _check.fail(where, "model", "a torch.nn.Module", repr(type(model).__name__), TypeError)
    all_names = {name for name, _ in model.named_parameters(remove_duplicate=False)}
    modules = list(model.named_modules(remove_duplicate=False))  # pre-order: ancestors first
    declared: Dict[str, MupRole] = {}
    for prefix, module in modules:
        roles = getattr(module, "mup_roles", None)
        if not callable(roles):
            continue
        for rel, role in roles().items():
            full = _join(prefix, rel)
            if full not in all_names:
                _check.fail(where, "model", f"mup_roles() of module {prefix!r} to name parameters of its subtree",
                            f"{rel!r}, which is none")
            if not isinstance(role, MupRole):
                _check.fail(where, "model", f"a MupRole for {full!r}", repr(role), TypeError)
            declared.setdefault(full, role)  # the first (the outermost) declaration wins
    for prefix, module in modules:
        for rel, role in _default_roles(module).items():
            declared.setdefault(_join(prefix, rel), role)
    out = []
    for name, p in model.named_parameters():  # deduplicated: tied tensors once
        if not p.requires_grad:
            continue
        if name not in declared:
            _check.fail(where, "model", "a muP role for every trainable parameter (declared by mup_roles() of its "
                        "module or an ancestor, or a torch Linear / Embedding / LayerNorm parameter)",
                        f"none for {name!r}")
        out.append((name, p, declared[name]))
    return out


@torch.no_grad()
def mup_init_(model: torch.nn.Module, generator: Optional[torch.Generator] = None, *,
              zero_outputs: bool = False) -> torch.nn.Module:
    """Initialises every trainable parameter of model by its role, in place; returns model.
    zero_outputs: the output projections and readout 0 (the reference's) instead of random."""
    if not isinstance(zero_outputs, bool):
        _check.fail("mup_init_", "zero_outputs", "a bool", repr(zero_outputs), TypeError)
    for _, p, role in mup_params(model):
        if role.kind in ("position", "bias") or (zero_outputs and role.kind in ("output", "readout")):
            p.zero_()
        elif role.kind == "gain":
            p.fill_(1.0)
        else:
            p.normal_(0.0, role.resolved_std(), generator=generator)
    return model


@torch.no_grad()
def sp_init_(model: torch.nn.Module, generator: Optional[torch.Generator] = None) -> torch.nn.Module:
    """The standard parameterisation's init, by role (the module docstring); in place; returns
    model. Train it with one learning rate (e.g. ``torch.optim.AdamW(model.parameters(), lr)``)."""
    for _, p, role in mup_params(model):
        if role.kind in ("hidden", "output", "readout", "input"):
            bound = 1.0 / math.sqrt(role.fan_in)
            p.uniform_(-bound, bound, generator=generator)
        elif role.kind == "structured_core":
            p.normal_(0.0, role.resolved_std(), generator=generator)
        elif role.kind == "embedding":
            p.normal_(0.0, 1.0, generator=generator)
        elif role.kind == "gain":
            p.fill_(1.0)
        else:
            p.zero_()
    return model


def mup_param_groups(model: torch.nn.Module, base_lr: float, *, base_width: float = 128,
                     weight_decay: float = 0.0) -> List[dict]:
    """The optimizer parameter groups of model for base learning rate ``base_lr`` (eta): one per
    distinct (lr, weight_decay), in order of first appearance, each
    ``{"params": [...], "names": [...], "lr": float, "weight_decay": float}``
    (torch.optim accepts the extra "names" key and keeps it in ``optimizer.param_groups``)."""
    where = "mup_param_groups"
    base_lr = _check.real(base_lr, where, "base_lr")
    base_width = _check.real(base_width, where, "base_width")
    weight_decay = _check.real(weight_decay, where, "weight_decay")
    if not (math.isfinite(base_lr) and base_lr >= 0):
        _check.fail(where, "base_lr", "a finite number >= 0", repr(base_lr))
    if not (math.isfinite(base_width) and base_width > 0):
        _check.fail(where, "base_width", "a finite number > 0", repr(base_width))
    if not (math.isfinite(weight_decay) and weight_decay >= 0):
        _check.fail(where, "weight_decay", "a finite number >= 0", repr(weight_decay))
    groups: Dict[Tuple[float, float], dict] = {}
    for name, p, role in mup_params(model):
        lr = role.lr(base_lr, base_width)
        wd = weight_decay if p.dim() >= 2 else 0.0  # the reference's rule
        g = groups.setdefault((lr, wd), {"params": [], "names": [], "lr": lr, "weight_decay": wd})
        g["params"].append(p)
        g["names"].append(name)
    return list(groups.values())


def mup_adamw(model: torch.nn.Module, base_lr: float, *, base_width: float = 128, weight_decay: float = 0.0,
              betas: Tuple[float, float] = (0.9, 0.95), eps: float = 1e-20) -> torch.optim.AdamW:
    """AdamW over :func:`mup_param_groups` with the reference's betas and eps (torch's default
    weight decay of 1e-2 is not used: every group carries its own, 0 by default)."""
    groups = mup_param_groups(model, base_lr, base_width=base_width, weight_decay=weight_decay)
    return torch.optim.AdamW(groups, lr=base_lr, betas=betas, eps=eps, weight_decay=weight_decay)


def rms_cap_sigma(d_in: int, d_out: int) -> float:
    """sigma* = sqrt(min(d_in, d_out)) / d_in, the RMS the cap allows."""
    d_in = _check.integer(d_in, "rms_cap", "d_in", minimum=1)
    d_out = _check.integer(d_out, "rms_cap", "d_out", minimum=1)
    return math.sqrt(min(d_in, d_out)) / d_in


def rms_cap(w: torch.Tensor, d_in: int, d_out: int) -> torch.Tensor:
    """The forward-time RMS cap of a structured core w whose matrix maps d_in to d_out:
    ``w / max(1, RMS(w) / sigma*)``, RMS(w) = sqrt(mean(w^2) + 1e-8), differentiable (through
    RMS(w) when capped, as the reference's). One op: ``torch.ops.strata.mup_rms_cap``."""
    w = _check.tensor(w, "rms_cap", "w")
    return torch.ops.strata.mup_rms_cap(w, _check.integer(d_in, "rms_cap", "d_in"),
                                        _check.integer(d_out, "rms_cap", "d_out"))
