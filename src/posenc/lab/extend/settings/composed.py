"""Composed methods, ``FREQUENCY+REMAP`` (``yarn+string``), for the study's users of these names: parsed by
``posenc.deploy.methods`` (``parse``), which the product path shares."""

from __future__ import annotations

from posenc.deploy.methods import SEP, calls, parse, parts

__all__ = ["SEP", "calls", "check", "parts", "remapping"]


def check(method: str) -> None:
    """A composed name's parts: a frequency method, then a remapping method that runs within a context
    (``posenc.deploy.methods.parse``).

    Raises:
        ValueError: naming ``methods``, the name, and what is allowed.
    """
    parse(method)


def remapping(method: str) -> str | None:
    """The remapping method in ``method`` (itself, or a composed name's second part), None for a frequency one."""
    return parse(method).remapping
