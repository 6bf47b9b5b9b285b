"""LM-Infinite (Han et al. 2024, "LM-Infinite: Zero-Shot Extreme Length Generalization for Large Language
Models", NAACL 2024, arXiv:2308.16137).

A Λ-shaped mask: each query sees its nearest ``window`` tokens (``L``, the pretraining length) with their normal
positions, and the first ``global_tokens`` tokens; the distance to those is capped at ``window`` (the query
rotated at ``window``, the key un-rotated, at 0). Everything else is masked. Reach unlimited.
Reference implementation: ``Glaciohound/LM-Infinite`` (``models/llama.py`` with ``models/lambda_attention.py``;
``convert_llama_model(model, local_branch=L, global_branch=10)``, ``limit_distance = local_branch``), checked in
``tests/reference/remapping.py``. Attention sinks with a rolling cache (Xiao et al. 2024, StreamingLLM) mask the
middle too, but re-index positions within the cache: ``streaming_llm.py``, which says how the two differ.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from posenc._checks import check_positive_int, fail
from posenc.remapping._branch import Branch, KeyInterval, RemapMethod, identity


@dataclass(frozen=True, kw_only=True, slots=True)
class LMInfinite(RemapMethod):
    """LM-Infinite with a local ``window`` (also the distance cap) and ``global_tokens`` starting tokens."""

    window: int
    global_tokens: int = 10
    name = "lm_infinite"

    def __post_init__(self) -> None:
        check_positive_int("window", self.window)
        check_positive_int("global_tokens", self.global_tokens)

    @classmethod
    def for_target(
        cls, original: int, target: int, *, window: int | None = None, global_tokens: int | None = None
    ) -> LMInfinite:
        """The reference's drop-in settings: ``window = L`` (local branch and distance limit), 10 global tokens."""
        window = original if window is None else window
        method = cls(window=window, global_tokens=10 if global_tokens is None else global_tokens)
        if method.window > original:
            fail("window", window, f"at most the pretraining length {original} (it caps every distance)")
        method.check_target(original, target)
        return method

    def reach(self, original: int) -> float:
        return math.inf if self.window <= original else 0

    def limiting_parameter(self) -> tuple[str, object]:
        return "window", self.window

    def branches(self) -> tuple[Branch, ...]:
        w, n = self.window, self.global_tokens
        return (
            # local j > i - w; global j <= i - w and j < n
            Branch(name="local", query=identity, key=identity, region=KeyInterval(first=lambda i: i - w + 1)),
            Branch(
                name="global",
                query=lambda i: torch.full_like(i, w),
                key=torch.zeros_like,
                region=KeyInterval(end=lambda i: torch.clamp(i - w + 1, max=n)),
            ),
        )
