"""``fail``: the project's standard error for a bad argument, in a module that imports nothing (``posenc._checks``,
which imports torch, re-exports it), so the command line can refuse bad input before torch is imported."""

from __future__ import annotations

from typing import NoReturn


def fail(name: str, value: object, allowed: str) -> NoReturn:
    """Raise the project's standard error for a bad argument."""
    raise ValueError(f"{name}={value!r} is invalid: expected {allowed}")
