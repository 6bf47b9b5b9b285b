"""The deciding race's evidence: documents of K keys, one long forward each, kept key by key in ``needles.csv``.

A document (``posenc.lab.extend.needles.keys``) holds K passkeys at K depths and asks for each in a question suffix;
one forward scores every answer teacher-forced: ``found`` (exact match) and ``logprob`` (nats; ``prob`` is its
exponential, the chance that sampling at temperature 1 writes the key). Document ``d`` at length ``T`` is the same for
every model (its seed is ``document_seed(seed, T, d)``), so models are compared on the same documents (paired), and
a document is the unit of sampling (its keys are correlated: ``posenc.lab.extend.stats.paired`` clusters by it).

Shapes: M models, D documents, K keys per document.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from posenc.lab.common.runfiles import KeyedCSV

#: One row per key: the model (the study's unit columns), the document's length and index, the key's index and depth.
KEY = ("method", "factor", "finetune_steps", "finetune_positions", "length", "document", "key")
NEEDLES = KeyedCSV(
    columns=(*KEY, "depth", "found", "logprob", "tokens", "seconds"),
    key=KEY,
    ints=frozenset({"finetune_steps", "length", "document", "key", "found", "tokens"}),
    floats=frozenset({"factor", "depth", "logprob", "seconds"}),
    command="posenc extend --pick",
)
NEEDLES_FILE = "needles.csv"

Unit = tuple[str, float, int, str]


def document_seed(seed: int, length: int, document: int) -> int:
    """Document ``document`` at ``length`` tokens: the same keys, labels, depths and question order for every model."""
    return (seed * 1_000_003 + length * 7_919 + document * 104_729) % 2**31


def read(path: Path) -> list[dict[str, Any]]:
    return NEEDLES.read(path) if path.is_file() else []


def unit_of(row: dict[str, Any]) -> Unit:
    return (row["method"], float(row["factor"]), int(row["finetune_steps"]), row["finetune_positions"])


def documents_of(rows: Sequence[dict[str, Any]], unit: Unit, length: int, keys: int) -> int:
    """How many documents ``unit`` has at ``length``: the first ones, 0..n-1, each with all its keys."""
    have: dict[int, int] = {}
    for r in rows:
        if unit_of(r) == unit and r["length"] == length:
            have[r["document"]] = have.get(r["document"], 0) + 1
    n = 0
    while have.get(n, 0) >= keys:
        n += 1
    return n


def measure(
    path: Path,
    score: Callable[[int], Any],
    unit: Unit,
    length: int,
    documents: range,
    *,
    stop: Callable[[], bool] = lambda: False,
    say: Callable[[str], None] | None = None,
    name: str = "",
) -> int:
    """Score ``documents`` of ``unit`` at ``length`` (``score(seed) -> KeyScores``, ``HFTarget.keys`` bound to the
    model), each document's keys written to ``path`` as soon as its forward ends (atomically); returns how many were
    measured (``stop()`` is asked before each one: the deadline)."""
    done = 0
    for d in documents:
        if stop():
            break
        start = time.perf_counter()
        s = score(d)
        seconds = time.perf_counter() - start
        rows = [
            {"method": unit[0], "factor": unit[1], "finetune_steps": unit[2], "finetune_positions": unit[3],
             "length": length, "document": d, "key": i, "depth": float(s.depths[i]), "found": int(bool(s.found[i])),
             "logprob": float(s.logprob[i]), "tokens": int(s.tokens[i]), "seconds": seconds}
            for i in range(len(s.found))
        ]
        NEEDLES.upsert(path, rows)
        done += 1
        if say is not None:
            found = sum(bool(x) for x in s.found)
            say(f"  {name} at {length}: document {d + 1}, {found}/{len(rows)} keys found, {seconds:.1f} s")
    return done


def tensors(rows: Sequence[dict[str, Any]], units: Sequence[Unit], length: int, keys: int,
            documents: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(found, prob, present)`` each (M, D, K) float64 / bool: every key's scores at ``length`` for ``units`` over
    the first ``documents`` documents (absent keys are 0 and not present)."""
    index = {u: i for i, u in enumerate(units)}
    shape = (len(units), documents, keys)
    found = torch.zeros(shape, dtype=torch.float64)
    prob = torch.zeros(shape, dtype=torch.float64)
    present = torch.zeros(shape, dtype=torch.bool)
    for r in rows:
        i = index.get(unit_of(r))
        if i is None or r["length"] != length or r["document"] >= documents or r["key"] >= keys:
            continue
        at = (i, r["document"], r["key"])
        found[at], prob[at], present[at] = float(r["found"]), math.exp(r["logprob"]), True
    return found, prob, present

