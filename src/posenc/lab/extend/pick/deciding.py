"""``--pick``'s deciding race: screening, the race and the cost inside the context, all on documents of K keys.

The stages, in order (each resumable from its files; ``--budget`` is a deadline asked before every forward):

1. ``screen-ppl/``: perplexity past L at the target T for every candidate and the unpatched model (a study, as
   before); a candidate above ``rules.PPL_BREAK`` times the best breaks the language model and is out.
2. ``inside.csv`` + ``needles.csv`` at L: the cost inside the original context (``inside``) for the unpatched model
   and every candidate left.
3. ``needles.csv`` at T: the race. Every model left (with ``keep_short``, but those costing short prompts) gets
   documents at T in looks (``paired``'s plan); after each look ``paired.decide`` says which models are still
   sampled and whether the race is decided -- the pick shown better than every other, or the cheapest to serve shown
   within ``delta`` of every model, or no model retrieving (every upper bound below ``paired``'s floor). Screening
   is the race's first look, at the target, on the same scores: nothing is assumed to carry over from another
   length or task.

Every decision is replayed from ``needles.csv``, so a pick stopped anywhere and resumed takes the same looks.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from posenc.lab.extend.pick import evidence, inside, rules
from posenc.lab.extend.pick.asking import Asking, scorer
from posenc.lab.extend.stats import paired
from posenc.lab.extend.stats.rates import UNPATCHED
from posenc.lab.extend.study.report import label
from posenc.lab.extend.targets.base import PretrainedTarget

#: Keys per document, how they are asked (``asking``), and documents per model at most at the target, for a new pick
#: where the user gives none. Sixteen keys asked blind: sixteen single passkeys for about the cost of one one-key
#: forward (15.7x the keys per forward-second at 16k, experiments/picking-a-method/README.md, "Blind branches without
#: the T x T mask"). Asked in the document instead (``--ask document``, and ``--keys 1`` where no ``--ask`` is given:
#: the single passkey, teacher-forced), several labelled keys measure multi-key retrieval, which on SmolLM2 did not
#: rank methods as single passkeys do (README, "The deciding race: the evidence checked").
KEYS = 16
ASK = "blind"
DOCUMENTS = 32
#: Documents per model at the race's first look (``plan_of``).
FIRST_LOOK = 8

Unit = tuple[str, float, int, str]


@dataclass(frozen=True)
class Race:
    """The race replayed from the needles: its looks so far, the last decision, and each model's documents."""

    units: list[Unit]
    look: int  # documents of the last completed look (0: before the first)
    decision: Any  # paired.Decision on keys found at that look (what decides), None before the first
    prob_decision: Any  # the same rule on the answer probability (reported beside)
    documents: dict[Unit, int]  # documents each model has at T
    arrays: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None  # (found, prob, present), each (M, D, K)
    wanted: dict[Unit, int]  # documents each model needs for the next look (0: none)
    over: bool  # decided, or every look done


def race_units(candidates: Sequence[Unit], costs: dict[Unit, inside.Cost], keep_short: bool) -> list[Unit]:
    """The unpatched model, then the candidates (with ``keep_short``, those that do not cost short prompts)."""
    kept = [u for u in candidates if not (keep_short and u in costs and costs[u].worse)]
    return [UNPATCHED, *kept]


def serving_costs(units: Sequence[Unit], model_type: str | None) -> list[int]:
    """Each model's serving tier (lower is cheaper); the unpatched model costs nothing."""
    return [0 if u[0] == "none" else rules.SERVING[rules.serving(u[0], model_type)][0] for u in units]


def plan_of(cap: int) -> paired.Plan:
    """The looks: 8, 16, 32, ... documents per model still sampled, then the cap (``--trials``)."""
    return paired.Plan.doubling(first=min(FIRST_LOOK, cap), cap=cap)


def replay(rows: Sequence[dict[str, Any]], units: Sequence[Unit], target: int, asking: Asking, cap: int,
           model_type: str | None, delta: float, *, cut: bool = False) -> Race:
    """The race as the stored needles have it: look after look, the models each look sampled (the first look: every
    model), until a look is incomplete (``wanted`` says what it needs) or the race is over. ``cut``: the race ends
    here (a deadline, an interrupt): the last complete look is decided as final (``paired.decide``'s ``final``)."""
    units = list(units)
    plan = plan_of(cap)
    have = {u: evidence.documents_of(rows, u, target, asking.keys_of(u)) for u in units}
    found, prob, present = evidence.tensors(rows, units, target, asking.keys, max([cap, *have.values()]))
    keys = asking.counts(units, present.shape[1])
    cost = serving_costs(units, model_type)
    sampled = torch.ones(len(units), dtype=torch.bool)
    decision = prob_decision = None
    done = 0
    for index, n in enumerate(plan.looks):
        need = {u: n if bool(sampled[i]) and have[u] < n else 0 for i, u in enumerate(units)}
        if any(need.values()):
            if cut and done:
                decision, prob_decision = _decisions(found, prob, present, units, have, done, cost, delta, keys,
                                                      plan, final=True)
            return Race(units, done, decision, prob_decision, have, (found, prob, present), need, False)
        last = index == len(plan.looks) - 1
        decision, prob_decision = _decisions(found, prob, present, units, have, n, cost, delta, keys, plan,
                                              final=last)
        done = n
        sampled = decision.sampled & sampled
        if decision.status != "open" or not bool(sampled.any()):
            break
    return Race(units, done, decision, prob_decision, have, (found, prob, present), dict.fromkeys(units, 0), True)


def _decisions(found: torch.Tensor, prob: torch.Tensor, present: torch.Tensor, units: Sequence[Unit],
               have: dict[Unit, int], n: int, cost: list[int], delta: float, keys: torch.Tensor, plan: paired.Plan, *,
               final: bool) -> tuple[Any, Any]:
    """The look at ``n`` documents: on keys found (what decides: the retrieval rate itself) and on the answer
    probability (reported beside: on the committed needles it ranked methods as exact match does, but a key found
    can have a low probability -- YaRN x4's at 12k, 0.16 -- so it does not decide)."""
    measured = torch.zeros(len(units), present.shape[1], dtype=torch.bool)  # (M, D): the documents each has of n
    for i, u in enumerate(units):
        measured[i, : min(have[u], n)] = True
    return tuple(paired.decide(paired.cluster_means(scores, present), measured, cost=cost, reference=0, delta=delta,
                               plan=plan, keys=keys, final=final) for scores in (found, prob))  # type: ignore[return-value]


def run_race(
    path: Path,
    units: Sequence[Unit],
    target_length: int,
    asking: Asking,
    cap: int,
    model_type: str | None,
    delta: float,
    scorer: Callable[[Unit], Callable[[int], Any]],  # unit -> (document -> KeyScores)
    *,
    seed: int,
    stop: Callable[[], bool],
    say: Callable[[str], None] | None,
) -> Race:
    """Measure look after look until the race is over or ``stop()`` (the deadline); returns the race replayed.
    ``scorer(unit)`` gives a model's ``score(document) -> KeyScores`` (loading and patching it once per look)."""
    while True:
        state = replay(evidence.read(path), units, target_length, asking, cap, model_type, delta)
        if state.over or stop():
            return state
        for unit, n in state.wanted.items():
            if n == 0 or stop():
                continue
            evidence.measure(path, scorer(unit), unit, target_length, range(state.documents[unit], n), stop=stop,
                             say=say, name=label(*unit))


def inside_costs(rows_inside: Sequence[dict[str, Any]], needle_rows: Sequence[dict[str, Any]],
                 units: Sequence[Unit], original: int, asking: Asking) -> dict[Unit, inside.Cost]:
    """Each model's cost inside L against the unpatched model (which must be measured), from the stored rows."""
    quarter, whole = inside.lengths(original)
    base = [inside.ppl_of(rows_inside, UNPATCHED, n) for n in (quarter, whole)]
    everyone = [UNPATCHED, *[u for u in units if u != UNPATCHED]]
    n_docs = inside.DOCUMENTS
    found, _, present = evidence.tensors(needle_rows, everyone, whole, asking.keys, n_docs)
    keys = asking.counts(everyone, n_docs)
    means = paired.cluster_means(found, present)  # (M, D)
    measured = present.any(dim=-1)
    level = 1 - paired.ALPHA / max(1, len(everyone) - 1)  # one comparison per candidate, against the unpatched model
    estimate, low, high = paired.pair_intervals(means, measured, level, keys=keys,
                                                plan=paired.Plan(looks=(n_docs,)))
    out = {}
    for i, u in enumerate(everyone):
        ppl = [inside.ppl_of(rows_inside, u, n) for n in (quarter, whole)]
        ratios = tuple(None if p is None or b is None else p / b for p, b in zip(ppl, base, strict=True))
        k = int(present[i].sum())
        share = float(found[i][present[i]].mean()) if k else None
        diff = None
        if k and i and bool(measured[0].any()):
            diff = (float(estimate[i, 0]), float(low[i, 0]), float(high[i, 0]))
        out[u] = inside.Cost(u, ratios, share, diff, k)  # type: ignore[arg-type]
    return out


def scoring(target: PretrainedTarget, model: Any, unit: Unit, length: int, asking: Asking,  # noqa: ANN401
            seed: int) -> Callable[[int], Any]:
    """Document ``d`` at ``length`` scored by ``model`` (``unit``'s), asked as ``asking`` says: ``HFTarget.keys`` at
    ``evidence.document_seed``."""
    return scorer(target, model, unit, length, asking, lambda d: evidence.document_seed(seed, length, d))


def measure_inside(path_inside: Path, path_needles: Path, target: PretrainedTarget, units: Sequence[Unit],
                   model_for: Callable[[Unit], Any], asking: Asking, *, seed: int, stop: Callable[[], bool],
                   say: Callable[[str], None] | None) -> bool:
    """Perplexity at L/4 and L and ``inside.DOCUMENTS`` documents of keys at L for each model missing them; True
    when every model has them all."""
    quarter, whole = inside.lengths(target.original_len)
    for unit in [UNPATCHED, *[u for u in units if u != UNPATCHED]]:
        rows = inside.read(path_inside)
        ppl_missing = [n for n in (quarter, whole) if inside.ppl_of(rows, unit, n) is None]
        have = evidence.documents_of(evidence.read(path_needles), unit, whole, asking.keys_of(unit))
        if not ppl_missing and have >= inside.DOCUMENTS:
            continue
        if stop():
            return False
        model = model_for(unit)
        for n in ppl_missing:
            score, _ = target.perplexity(model, n, max_tokens=whole)  # L held-out tokens at each length
            inside.INSIDE.upsert(path_inside, [{
                "method": unit[0], "factor": unit[1], "finetune_steps": unit[2], "finetune_positions": unit[3],
                "length": n, "ppl": score.ppl, "tokens": score.tokens}])
            if say is not None:
                ppl = "n/a" if score.ppl is None else f"{score.ppl:.3f}"
                say(f"  {label(*unit)}: perplexity {ppl} at {n} tokens (inside the context)")
        evidence.measure(path_needles, scoring(target, model, unit, whole, asking, seed), unit, whole,
                         range(have, inside.DOCUMENTS), stop=stop, say=say, name=label(*unit))
    return all(evidence.documents_of(evidence.read(path_needles), u, whole, asking.keys_of(u)) >= inside.DOCUMENTS
               for u in [UNPATCHED, *units])
