"""Input validation: every failure is a ``ValueError`` naming the parameter, its value and what is allowed."""

from __future__ import annotations

import math
from collections.abc import Sequence


def fail(name: str, value: object, allowed: str) -> None:
    """Raise the project's standard error for a bad argument."""
    raise ValueError(f"{name}={value!r} is invalid: expected {allowed}")


def check_positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        fail(name, value, "a positive integer")
    return value


def check_number(name: str, value: object, *, minimum: float | None = None, above: float | None = None) -> float:
    """A finite real number, optionally ``>= minimum`` or ``> above``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
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
