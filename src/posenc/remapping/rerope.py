"""ReRoPE and Leaky ReRoPE (Su 2023, "Rectified Rotary Position Embeddings", https://kexue.fm/archives/9708).

Inside the ``window`` RoPE is unchanged; beyond it the relative distance is clamped to ``window`` (ReRoPE: the
query rotated at ``window``, the key at 0) or grows ``leak`` times slower (Leaky ReRoPE: distance
``window + (i - j - window) / leak``, the query at ``window + (i - window) / leak`` and the key at ``j / leak``).
Every query is also scaled by ``max(1, log(i + 1) / log(L))`` for pretraining length ``L`` (the reference's
``log_scale``), so attention stays as sharp past ``L``. ReRoPE's reach is unlimited: no distance exceeds ``window``.
Reference implementation: ``bojone/rerope`` (``rerope_patch.py``, ``leaky_rerope_patch.py``), checked in
``tests/reference/remapping.py``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import cast

import torch

from posenc._checks import check_number, check_positive_int, fail
from posenc.remapping._branch import Branch, KeyInterval, RemapMethod, identity


@dataclass(frozen=True, kw_only=True, slots=True)
class ReRoPE(RemapMethod):
    """ReRoPE (``leak=None``) or Leaky ReRoPE (``leak > 1``) with a ``window``; ``log_scale_length`` is the ``L``
    of the query scaling (None: no scaling)."""

    window: int
    leak: float | None = None
    log_scale_length: int | None = None

    def __post_init__(self) -> None:
        check_positive_int("window", self.window)
        if self.leak is not None:
            check_number("leak", self.leak, above=1.0)
            object.__setattr__(self, "leak", float(self.leak))
        if self.log_scale_length is not None:
            check_positive_int("log_scale_length", self.log_scale_length)
            if self.log_scale_length < 2:
                fail("log_scale_length", self.log_scale_length, "at least 2 (it divides by log(L))")

    @classmethod
    def for_target(
        cls,
        original: int,
        target: int,
        *,
        window: int | None = None,
        leak: float | str | None = None,
        log_scale: bool = True,
    ) -> ReRoPE:
        """The reference's settings: ``window = L / 8`` (512 for a 4k model) and the log scaling over ``L``; Leaky
        ReRoPE (``leak="auto"``) takes the smallest leak (to 0.01, above 1) that keeps the largest distance at
        ``target`` below ``L``: ``(target - 1 - window) / (L - 1 - window)``."""
        window = max(1, original // 8) if window is None else window
        check_positive_int("window", window)
        if window >= original:
            fail("window", window, f"less than the pretraining length {original}")
        if leak == "auto":  # Leaky ReRoPE: the smallest leak keeping every distance at ``target`` below ``L``
            leak = math.ceil(100 * max(1.01, (target - 1 - window) / (original - 1 - window))) / 100
        leak = cast("float | None", leak)  # "auto" replaced by its number above
        method = cls(window=window, leak=leak, log_scale_length=original if log_scale else None)
        method.check_target(original, target)
        return method

    @property
    def name(self) -> str:  # type: ignore[override]
        return "rerope" if self.leak is None else "leaky_rerope"

    @property
    def leaky(self) -> bool:
        return self.leak is not None

    def reach(self, original: int) -> float:
        if self.leak is None:
            return math.inf
        return self.window + (original - 1 - self.window) * self.leak + 1

    def limiting_parameter(self) -> tuple[str, object]:
        return "leak", self.leak

    def branches(self) -> tuple[Branch, ...]:
        w, leak = self.window, self.leak
        near_keys, far_keys = KeyInterval(first=lambda i: i - w + 1), KeyInterval(end=lambda i: i - w + 1)
        scale = None if self.log_scale_length is None else _log_scale(self.log_scale_length)
        if leak is None:
            far = Branch(
                name="clamped", query=lambda i: torch.full_like(i, w), key=torch.zeros_like,
                region=far_keys, query_scale=scale,
            )
        else:
            far = Branch(
                name="leaky", query=lambda i: w + (i.double() - w) / leak, key=lambda j: j.double() / leak,
                region=far_keys, query_scale=scale,
            )
        near = Branch(name="window", query=identity, key=identity, region=near_keys, query_scale=scale)
        return near, far


def _log_scale(length: int):  # noqa: ANN202
    log_l = math.log(length)
    return lambda i: torch.clamp((i.double() + 1).log() / log_l, min=1.0)
