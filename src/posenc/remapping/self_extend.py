"""Self-Extend (Jin et al. 2024, "LLM Maybe LongLM: Self-Extend LLM Context Window Without Tuning",
arXiv:2401.01325).

Two branches: neighbours closer than ``window`` keep their positions; farther keys are seen through *grouped*
positions, the key at ``j // group`` and the query at ``i // group + window - window // group``, so that the grouped
distance continues where the window ends. Reach: ``group * (L - window + window // group)`` tokens for pretraining
length ``L``, the longest sequence whose largest grouped distance, ``(S - 1) // group + window - window // group``
at the pair (``S - 1``, 0), is below ``L`` (the paper's ``(L - window) * group + window`` is ``window mod group``
more: there the last query scores key 0 at distance ``L``). Reference implementation: ``datamllab/LongLM``
(``self_extend_patch/Llama.py``: ``self_extend_forward``, ``group_size_1`` = ``group``, ``group_size_2`` =
``window``), checked in ``tests/reference/remapping.py``. The query shift uses integer division ``window // group``
as the reference's flash-attention and decoding paths do (``Llama.py``'s eager path divides exactly, which gives
fractional positions when ``group`` does not divide ``window``); the reference's optional query log-scaling (off by
default there) is not applied.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from posenc._checks import check_positive_int, fail
from posenc.remapping._branch import Branch, KeyInterval, RemapMethod, identity


@dataclass(frozen=True, kw_only=True, slots=True)
class SelfExtend(RemapMethod):
    """Self-Extend with neighbour ``window`` (``W``) and ``group`` size (``G``)."""

    window: int
    group: int
    name = "self_extend"

    def __post_init__(self) -> None:
        check_positive_int("window", self.window)
        check_positive_int("group", self.group)

    @classmethod
    def for_target(
        cls, original: int, target: int, *, window: int | None = None, group: int | None = None
    ) -> SelfExtend:
        """The paper's rule: a window of ``original // 4`` (the paper's settings keep it well inside the pretraining
        length), and the smallest group reaching ``target`` (``reach``): from the paper's
        ``G = ceil((target - W) / (original - W))`` up, one more where ``W mod G`` leaves it short."""
        window = max(1, original // 4) if window is None else window
        check_positive_int("window", window)
        if window >= original:
            fail("window", window, f"less than the pretraining length {original}")
        if group is None:
            group = max(1, math.ceil((target - window) / (original - window)))
            while cls(window=window, group=group).reach(original) < target:
                group += 1
        method = cls(window=window, group=group)
        if method.group == 1:
            fail("group", group, "at least 2 (group 1 is plain RoPE: Self-Extend would change nothing)")
        method.check_target(original, target)
        return method

    def reach(self, original: int) -> float:
        """``G (L - W + W // G)``: the longest length ``S`` with ``(S - 1) // G + W - W // G < L``; below ``W`` there
        are no grouped pairs, and neighbours stay below ``W < L``."""
        w, g = self.window, self.group
        return float(max(g * (original - w + w // g), min(w, original)))

    def limiting_parameter(self) -> tuple[str, object]:
        return "group", self.group

    def branches(self) -> tuple[Branch, ...]:
        w, g = self.window, self.group
        shift = w - w // g
        return (
            # neighbours j > i - w, grouped j <= i - w
            Branch(name="neighbor", query=identity, key=identity, region=KeyInterval(first=lambda i: i - w + 1)),
            Branch(
                name="grouped",
                query=lambda i: torch.div(i, g, rounding_mode="floor") + shift,
                key=lambda j: torch.div(j, g, rounding_mode="floor"),
                region=KeyInterval(end=lambda i: i - w + 1),
            ),
        )
