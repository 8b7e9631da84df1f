"""Argument checks shared by every strata wrapper (strata, strata.mlr, strata.monarch).

No silent coercion: a bool argument takes only ``bool`` (or ``numpy.bool_``), an integer argument
only ``int`` or a numpy integer (never ``bool``, never a float, never a string), so that
``causal="False"`` or ``window=(2.7, 0)`` raise instead of running something else. Every error
names the function and the argument, says what was expected and what came::

    mlr_attention: argument 'causal': expected a bool, got 'False' (str)

Wrong types raise ``TypeError``, wrong values ``ValueError`` (the ops' own checks raise
``RuntimeError``, see the package docstring).
"""

from __future__ import annotations

import numbers
from typing import Any, List, Optional, Sequence, Tuple

import torch

try:  # numpy is optional: its scalars are accepted when it is there
    import numpy as _np

    _NP_BOOL: Tuple[type, ...] = (_np.bool_,)
except ImportError:  # pragma: no cover - numpy ships with torch's usual installs
    _NP_BOOL = ()


def _got(value: Any) -> str:
    """The 'got ...' part of a message: the value and its type."""
    text = repr(value)
    if len(text) > 80:
        text = text[:77] + "..."
    return f"{text} ({type(value).__name__})"


def fail(where: str, arg: str, expected: str, got: str, exc: type = ValueError):
    """Raises exc with the package's message format (never returns)."""
    raise exc(f"{where}: argument '{arg}': expected {expected}, got {got}")


def is_int(value: Any) -> bool:
    """True for int and numpy integers; False for bool (an int subclass), floats, strings, ..."""
    return isinstance(value, numbers.Integral) and not isinstance(value, (bool,) + _NP_BOOL)


def boolean(value: Any, where: str, arg: str) -> bool:
    """value as a bool; only bool or numpy.bool_ (TypeError otherwise)."""
    if isinstance(value, (bool,) + _NP_BOOL):
        return bool(value)
    fail(where, arg, "a bool (True or False)", _got(value), TypeError)


def integer(value: Any, where: str, arg: str, minimum: Optional[int] = None) -> int:
    """value as an int; only int or numpy integers (TypeError otherwise), >= minimum when given
    (ValueError otherwise)."""
    if not is_int(value):
        fail(where, arg, "an int", _got(value), TypeError)
    value = int(value)
    if minimum is not None and value < minimum:
        fail(where, arg, f"an int >= {minimum}", repr(value))
    return value


def integers(where: str, **named: Any) -> List[int]:
    """The keyword arguments, each checked by :func:`integer` under its keyword, in order."""
    return [integer(x, where, name) for name, x in named.items()]


def embed_and_heads(embed_dim: Any, num_heads: Any, where: str) -> Tuple[int, int]:
    """(embed_dim, num_heads) of an attention module: ints >= 1, num_heads dividing embed_dim."""
    d = integer(embed_dim, where, "embed_dim", minimum=1)
    h = integer(num_heads, where, "num_heads", minimum=1)
    if d % h != 0:
        fail(where, "num_heads", f"a divisor of embed_dim = {d}", repr(h))
    return d, h


def optional_integer(value: Any, where: str, arg: str, minimum: Optional[int] = None) -> Optional[int]:
    """None, or value as by :func:`integer`."""
    return None if value is None else integer(value, where, arg, minimum)


def real(value: Any, where: str, arg: str) -> float:
    """value as a float; int, float or numpy real scalars, not bool (TypeError otherwise)."""
    if isinstance(value, numbers.Real) and not isinstance(value, (bool,) + _NP_BOOL):
        return float(value)
    fail(where, arg, "a number (int or float)", _got(value), TypeError)


def optional_real(value: Any, where: str, arg: str) -> Optional[float]:
    """None, or value as by :func:`real`."""
    return None if value is None else real(value, where, arg)


def string(value: Any, where: str, arg: str) -> str:
    """value, which must be a str (TypeError otherwise); its content is the op's to check."""
    if isinstance(value, str):
        return value
    fail(where, arg, "a str", _got(value), TypeError)


def tensor(value: Any, where: str, arg: str) -> torch.Tensor:
    """value, which must be a torch.Tensor (TypeError otherwise)."""
    if isinstance(value, torch.Tensor):
        return value
    fail(where, arg, "a torch.Tensor", _got(value), TypeError)


def tensors(where: str, **named: Any) -> List[torch.Tensor]:
    """The keyword arguments, each checked by :func:`tensor` under its keyword, in order."""
    return [tensor(t, where, name) for name, t in named.items()]


def optional_tensor(value: Any, where: str, arg: str) -> Optional[torch.Tensor]:
    """None, or a torch.Tensor (TypeError otherwise)."""
    return None if value is None else tensor(value, where, arg)


def int_list(value: Any, where: str, arg: str) -> List[int]:
    """A sequence of ints (numpy ints too) or a 1-D int64 tensor, as a list of ints.

    Not a str, not a scalar, no bools or floats among the elements (TypeError naming the element,
    e.g. ``argument 'ranks[1]'``)."""
    if isinstance(value, torch.Tensor):
        if value.dim() != 1 or value.dtype != torch.int64:
            fail(where, arg, "a 1-D int64 tensor or a sequence of ints",
                 f"a {value.dim()}-D {str(value.dtype).replace('torch.', '')} tensor", TypeError)
        return [int(x) for x in value.tolist()]
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence) and not _is_array(value):
        fail(where, arg, "a sequence of ints (a list, tuple or 1-D int64 tensor)", _got(value), TypeError)
    out = []
    for i, x in enumerate(value):
        out.append(integer(x, where, f"{arg}[{i}]"))
    return out


def optional_int_tensor(value: Any, where: str, arg: str) -> Optional[torch.Tensor]:
    """None, a tensor (passed on: the op checks its dtype and shape by name), or a sequence of
    ints as a 1-D int64 tensor."""
    if value is None or isinstance(value, torch.Tensor):
        return value
    return torch.tensor(int_list(value, where, arg), dtype=torch.int64)


def int_pair(value: Any, where: str, arg: str) -> Tuple[int, int]:
    """A pair (a, b) of ints (TypeError otherwise)."""
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence) and not _is_array(value):
        fail(where, arg, "a pair (left, right) of ints", _got(value), TypeError)
    if len(value) != 2:
        fail(where, arg, "a pair (left, right) of ints", f"{len(value)} elements: {value!r}", TypeError)
    return integer(value[0], where, f"{arg}[0]"), integer(value[1], where, f"{arg}[1]")


def _is_array(value: Any) -> bool:
    """A 1-D numpy array (a sequence in all but registration)."""
    return type(value).__module__ == "numpy" and getattr(value, "ndim", None) == 1
