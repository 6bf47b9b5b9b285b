"""What a remapping method is: branches, each a pair of position maps and a region of (query, key) pairs.

A *remapping* method (Self-Extend, Dual Chunk Attention, ReRoPE, LM-Infinite) keeps RoPE's frequencies and changes
which positions a query and a key are rotated at, depending on where the pair lies. It is described by its
``branches()``: for a query at position ``i`` and a key at position ``j <= i``, exactly one branch (or none: the
pair is masked) scores the pair, as ``q_i`` rotated at ``branch.query(i)`` dotted with ``k_j`` rotated at
``branch.key(j)``, times ``branch.query_scale(i)`` where the method scales logits and ``logit_factor(S)`` where it
scales them by the sequence's length ``S``. One softmax runs over every
scored pair of a query. ``posenc.remapping.remap_attention`` executes any such description without an L x L matrix.
A region written as a ``KeyInterval`` (every built-in method's) also tells the operator which tiles of keys it covers
wholly, so those run without a mask (``posenc.remapping._tiles``); any other callable region is masked everywhere.

Shapes:
    position maps: positions (..., N) -> (..., N) (integer or float); regions: i (..., S, 1), j (..., 1, T) ->
    bool (..., S, T); query_scale: i (..., S) -> (..., S) float; KeyInterval bounds: i (...) -> (...) integer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from posenc._checks import fail
from posenc._config import DictConfig

PositionMap = Callable[[torch.Tensor], torch.Tensor]
Region = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True, slots=True)
class KeyInterval:
    """A region that is, for each query position ``i``, an interval of key positions: ``first(i) <= j < end(i)``
    (``None``: no bound on that side), ``first`` and ``end`` both nondecreasing in ``i``.

    Distances and chunks are such intervals (``j > i - w`` is ``first = i - w + 1``; "the chunk before" is
    ``c (i // c - 1) <= j < c (i // c)``). Monotone bounds make a box of pairs decidable from its corners: every
    ``(i, j)`` with ``i`` in ``[i_lo, i_hi]`` and ``j`` in ``[j_lo, j_hi]`` is inside when ``first(i_hi) <= j_lo`` and
    ``j_hi < end(i_lo)``, and outside when ``j_hi < first(i_lo)`` or ``end(i_hi) <= j_lo``
    (``posenc.remapping._tiles.classify``).

    Shapes:
        region: i (..., S, 1), j (..., 1, T) -> bool (..., S, T); first, end: i (...) -> (...) integer.
    """

    first: PositionMap | None = None
    end: PositionMap | None = None

    def __call__(self, i: torch.Tensor, j: torch.Tensor) -> torch.Tensor:
        if self.first is None and self.end is None:
            return torch.ones(torch.broadcast_shapes(i.shape, j.shape), dtype=torch.bool, device=j.device)
        if self.end is None:
            return j >= self.first(i)  # type: ignore[misc]  # first is set where end is not
        if self.first is None:
            return j < self.end(i)
        return (j >= self.first(i)) & (j < self.end(i))


@dataclass(frozen=True, kw_only=True, slots=True)
class Branch:
    """One branch of a remapping method.

    Attributes:
        name: what the branch is called in its paper (``"neighbor"``, ``"grouped"``, ``"intra"``...).
        query: the position query ``i`` is rotated at.
        key: the position key ``j`` is rotated at.
        region: which pairs ``(i, j)`` (with ``j <= i``) this branch scores; the branches' regions are disjoint.
            A ``KeyInterval`` where it is one (distances, chunks: each key compared with a per-query bound, no
            integer difference over every pair of a block), which lets the operator skip the mask on tiles of keys
            wholly inside it; any callable ``(i, j) -> bool`` otherwise.
        query_scale: a per-query logit factor (ReRoPE's ``log`` scaling), or None.
    """

    name: str
    query: PositionMap
    key: PositionMap
    region: Region
    query_scale: PositionMap | None = None


def identity(positions: torch.Tensor) -> torch.Tensor:
    return positions


class RemapMethod(DictConfig):
    """Base of the method configs (frozen ``kw_only`` dataclasses): a name, branches, and the length it reaches."""

    __slots__ = ()
    name: str = ""

    def branches(self) -> tuple[Branch, ...]:  # pragma: no cover - every method defines it
        raise NotImplementedError

    def reach(self, original: int) -> float:
        """The longest sequence whose every pair is scored at a relative distance below ``original`` (the
        pretraining length); ``inf`` when there is no limit."""
        raise NotImplementedError  # pragma: no cover

    def check_target(self, original: int, target: int) -> None:
        """Refuse parameters that reach less than ``target`` tokens for a model trained on ``original``."""
        reach = self.reach(original)
        if reach < target:
            name, value = self.limiting_parameter()
            fail(
                name,
                value,
                f"a value with which {self.name} reaches {target} tokens from a pretraining length of {original}"
                f" (reaches {int(reach)})",
            )

    def limiting_parameter(self) -> tuple[str, object]:  # pragma: no cover
        raise NotImplementedError

    @property
    def depends_on_length(self) -> bool:
        """True where ``logit_factor`` reads the sequence's length (Dual Chunk Attention with ``mscale > 0``)."""
        return False

    def logit_factor(self, length: torch.Tensor) -> torch.Tensor | None:
        """A factor on every logit of a query, from the length ``S`` of its sequence (Dual Chunk Attention's
        ``m(S)**2``); None where the method has none. ``length``: float64, any shape -> the same shape."""
        return None
