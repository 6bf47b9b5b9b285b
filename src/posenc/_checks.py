"""Input validation: every failure is a ``ValueError`` naming the parameter, its value and what is allowed."""

from __future__ import annotations

import math
import weakref
from collections.abc import Sequence

import torch

from posenc._fail import fail as fail  # the standard error, importable without torch (the command line's checks)


def check_positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        fail(name, value, "a positive integer")
    return value


def check_number(name: str, value: object, *, minimum: float | None = None, above: float | None = None) -> float:
    """A finite real number, optionally ``>= minimum`` or ``> above``.

    Traceable: under ``torch.compile`` a Python number the caller passes per call (``seq_len``, ``scale``) turns
    symbolic once it changes between calls (dynamo's automatic dynamic shapes, kept per code object across
    compilations), and ``math.isfinite`` on a symbolic number breaks the graph. Comparisons become guards instead
    (NaN fails both; a symbolic ``inf`` is not caught: its value is unknown while tracing).
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not -math.inf < value < math.inf:
        fail(name, value, "a finite number")
    if minimum is not None and value < minimum:
        fail(name, value, f"a number >= {minimum}")
    if above is not None and value <= above:
        fail(name, value, f"a number > {above}")
    return float(value)


def check_choice(name: str, value: object, choices: Sequence[str]) -> str:
    if value not in choices:
        fail(name, value, f"one of {list(choices)}")
    return value  # type: ignore[return-value]


def broadcasts_to(shape: Sequence[int], target: Sequence[int]) -> bool:
    """``shape`` broadcasts to ``target`` without enlarging it (``torch.broadcast_shapes`` costs ~30 µs a call)."""
    if len(shape) > len(target):
        return False
    return all(n in (1, t) for n, t in zip(reversed(shape), reversed(target), strict=False))


# ---------------------------------------------------------------------------------------------------------------
# Positions

#: What a positions tensor may hold: integers, or floats that represent every integer a sequence reaches.
POSITION_DTYPES = "an integer dtype, torch.float32 or torch.float64"

_LOW_PRECISION = (
    "float16 and bfloat16 hold whole numbers exactly only up to 2048 and 256 (torch.arange(5000, 5016).half() is "
    "5000, 5000, 5000, 5004, ...), so positions cast with the model (.half(), .to(torch.bfloat16)) silently shift "
    "tokens; build positions as integers or float32 and keep them out of the model's dtype cast"
)

# Floating position tensors already found finite, by id: (weak reference, version counter). The same positions go
# through every layer of a model (and through ``attention`` and then the encoding's hooks): one host sync per
# tensor and forward instead of one per layer. An in-place change bumps the version and forces a new check.
_FINITE: dict[int, tuple[weakref.ref, int]] = {}
_FINITE_SLOTS = 16


def check_positions(positions: object, name: str = "positions", *, finite: bool = True) -> torch.Tensor:
    """``positions`` must be a tensor of exact positions: an integer dtype, float32 or float64, and finite.

    The dtype check is free. The finiteness check (floating point only) reads the tensor back to the host, once
    per tensor (see ``_FINITE``); it is skipped where reading values is impossible or would break a graph: under
    ``torch.compile``/``torch.jit`` tracing, ``vmap``/``grad`` transforms, fake, meta and other subclass tensors,
    and during CUDA graph capture. ``finite=False`` leaves it to the caller (a check that reads the values anyway).
    """
    if not isinstance(positions, torch.Tensor):
        fail(name, type(positions).__name__, f"a torch.Tensor of positions ({POSITION_DTYPES})")
    dtype = positions.dtype
    if dtype == torch.bool or positions.is_complex():
        fail(f"{name}.dtype", dtype, POSITION_DTYPES)
    if positions.is_floating_point() and dtype not in (torch.float32, torch.float64):
        fail(f"{name}.dtype", dtype, f"{POSITION_DTYPES}: {_LOW_PRECISION}")
    if finite and positions.is_floating_point() and _readable(positions) and not _known_finite(positions):
        ok = torch.isfinite(positions).all()
        if not bool(ok):  # the one host sync
            where = tuple((~torch.isfinite(positions)).nonzero()[0].tolist())
            index = f"[{', '.join(map(str, where))}]" if where else ""
            fail(f"{name}{index}", positions[where].item(), "a finite position (NaN or inf ones turn outputs into NaN)")
        _remember_finite(positions)
    return positions


def _readable(t: torch.Tensor) -> bool:
    """Values can be read back without breaking a trace or a transform."""
    if torch.compiler.is_compiling() or torch.jit.is_tracing():
        return False
    if type(t) not in (torch.Tensor, torch.nn.Parameter) or t.is_meta:
        return False
    if torch._C._functorch.is_functorch_wrapped_tensor(t):
        return False
    return not (t.is_cuda and torch.cuda.is_current_stream_capturing())


def _known_finite(t: torch.Tensor) -> bool:
    if t.is_inference():  # no version counter: always checked
        return False
    entry = _FINITE.get(id(t))
    return entry is not None and entry[0]() is t and entry[1] == t._version


def _remember_finite(t: torch.Tensor) -> None:
    if t.is_inference():
        return
    if len(_FINITE) >= _FINITE_SLOTS:
        _FINITE.pop(next(iter(_FINITE)), None)
    _FINITE[id(t)] = (weakref.ref(t), t._version)


def check_same_device(name: str, t: torch.Tensor, device: torch.device, what: str) -> None:
    """``t`` must be on ``device`` (``what`` names where that device comes from, e.g. "q's device")."""
    if t.device != device:
        fail(f"{name}.device", t.device, f"{what}, {device}")


def check_key_count(key_count: object, positions: torch.Tensor) -> torch.Tensor:
    """``key_count``: how many keys each query at ``positions`` sees (``posenc.attention`` counts them from its mask),
    an integer tensor ``(S,)`` or ``(1|B, S)`` on the positions' device, ``S`` their query length. Values are not
    read (no host sync); a count below 1 is the caller's fully masked query, which the factors treat as 1."""
    s = positions.shape[-1]
    batch = positions.shape[0] if positions.dim() == 2 else None
    shapes = f"({s},) or (1, {s})" + ("" if batch in (None, 1) else f" or ({batch}, {s})")
    if not isinstance(key_count, torch.Tensor):
        fail("key_count", type(key_count).__name__, f"an integer tensor {shapes}: the keys each query sees")
    if key_count.is_floating_point() or key_count.is_complex() or key_count.dtype == torch.bool:
        fail("key_count.dtype", key_count.dtype, "an integer dtype (a number of keys per query)")
    ok = key_count.dim() in (1, 2) and key_count.shape[-1] == s
    ok = ok and (key_count.dim() == 1 or key_count.shape[0] == 1 or batch in (None, key_count.shape[0]))
    if not ok:
        fail("key_count.shape", tuple(key_count.shape), f"{shapes}, one count per query")
    check_same_device("key_count", key_count, positions.device, "the positions' device")
    return key_count
