"""Name -> class registries, so configs can be written as plain dicts (and Hugging Face ``rope_type`` strings)."""

from __future__ import annotations

from typing import TypeVar

from posenc._checks import fail

T = TypeVar("T", bound=type)

_ROPE_SCALINGS: dict[str, type] = {}


def register_scaling(cls: T) -> T:
    """Class decorator: make a ``RopeScaling`` subclass available under its ``rope_type``."""
    name = cls.rope_type
    if name in _ROPE_SCALINGS and _ROPE_SCALINGS[name] is not cls:
        fail("rope_type", name, f"a name not already registered (taken by {_ROPE_SCALINGS[name].__name__})")
    _ROPE_SCALINGS[name] = cls
    return cls


def scaling_class(rope_type: str) -> type:
    """The scaling config class registered as ``rope_type``."""
    if rope_type not in _ROPE_SCALINGS:
        fail("rope_type", rope_type, f"one of {available_scalings()}")
    return _ROPE_SCALINGS[rope_type]


def available_scalings() -> list[str]:
    """Registered rope scaling types, ``"default"`` (no scaling) first."""
    return ["default", *sorted(_ROPE_SCALINGS)]
