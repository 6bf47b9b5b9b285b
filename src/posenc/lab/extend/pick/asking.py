"""How the deciding race asks a model for a document's keys: ``Asking`` (stored in ``pick.json`` as ``keys`` and
``ask``).

- ``document``: the K keys in one document and every question after it (``needles.keys.score_document``). With one
  key it is the single passkey, teacher-forced; with several, keys told apart by their door, RULER's multi-key task,
  which on SmolLM2 ranked methods otherwise than single passkeys (experiments/picking-a-method/README.md, "The
  deciding race: the evidence checked"). Every folder made before ``ask`` existed asks this way.
- ``blind`` (a new pick of several keys): each key asked in a branch of its own that sees the haystack with its own
  needle alone, no filler token reading any needle (``needles.keys.branches`` with ``filler_sees_needles=False``),
  run as a causal prefill of the filler and one masked suffix (``needles.blind.score_blind``): K single passkeys for
  about the cost of one forward. On the committed 16k documents it ordered the methods that attend to a far needle
  directly as one-key documents do (README, "Many keys in one forward, asked in branches"). Two kinds of method are
  asked otherwise, each tested against what it does (tests/lab/extend/pick/test_asking.py):

  - ``WINDOWED`` (LM-Infinite: its first tokens and a recent window): it reaches a needle at depth only through the
    filler after it, which a blind branch hides (0 of 16 blind keys where one-key documents find 7 of 16), so it
    gets one-key documents, the same document index as every other model (paired by document: each model's mean
    over its own keys in document ``d``).
  - ``ONE_FORWARD`` (Dual Chunk Attention: its logit factor follows the tokens a forward holds, so a cached filler
    is not what the one forward computes): the same blind branches in one forward with the T x T mask
    (``needles.keys.score_branches``).

Shapes: M models, D documents.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from posenc._checks import check_choice, check_positive_int
from posenc.lab.extend.settings.composed import parts

ASKS = ("blind", "document")
WINDOWED = frozenset({"lm_infinite"})
ONE_FORWARD = frozenset({"dca"})

Unit = tuple[str, float, int, str]


def _has(method: str, names: frozenset[str]) -> bool:
    return any(p in names for p in parts(method))


@dataclass(frozen=True)
class Asking:
    """``keys`` per document, asked the ``ask`` way (``ASKS``)."""

    keys: int
    ask: str = "document"

    def __post_init__(self) -> None:
        check_positive_int("keys", self.keys)
        check_choice("ask", self.ask, ASKS)

    def how(self, method: str) -> str:
        """The scorer ``HFTarget.keys`` runs for ``method``: "document", "split" (``score_blind``) or "branches"
        (``score_branches``, blind)."""
        if self.ask == "document" or _has(method, WINDOWED):
            return "document"
        return "branches" if _has(method, ONE_FORWARD) else "split"

    def keys_of(self, unit: Sequence[Any]) -> int:
        """Keys in each of ``unit``'s documents."""
        return 1 if self.ask == "blind" and _has(str(unit[0]), WINDOWED) else self.keys

    def counts(self, units: Sequence[Sequence[Any]], documents: int) -> torch.Tensor:
        """``(M, D)`` int64: the keys each model's documents hold (what ``paired`` floors each mean at)."""
        return torch.tensor([self.keys_of(u) for u in units], dtype=torch.int64)[:, None].expand(-1, documents)

    def text(self) -> str:
        """The documents in words, for ``pick.md`` and the plan."""
        k = f"{self.keys} key" if self.keys == 1 else f"{self.keys} keys"
        if self.ask == "document":
            return k
        windowed = ", ".join(sorted(WINDOWED))
        return f"{k} asked blind (each in its own branch; {windowed}: one key per document)"


def scorer(target: Any, model: Any, unit: Sequence[Any], length: int, asking: Asking,  # noqa: ANN401
           seed_of: Callable[[int], int]) -> Callable[[int], Any]:
    """Document ``d`` at ``length`` scored by ``model`` (``unit``'s): ``target.keys`` at ``seed_of(d)``."""
    k, how = asking.keys_of(unit), asking.how(str(unit[0]))
    return lambda d: target.keys(model, length, k, seed_of(d), how=how)
