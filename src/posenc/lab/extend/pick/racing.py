"""``--pick``'s rounds: screening's credible set and the race's paired elimination, as ``run_extend`` round policies.

Both decide from ``samples.csv`` alone (each needle's score by its index; ``posenc.lab.extend.study.run.SAMPLES``) and
replay their rounds from the start at every look, so a pick stopped anywhere and resumed takes the same rounds:

- ``screen``: at the screening length, every candidate gets a first round; after each round the candidates holding
  ``race.SCREEN_MASS`` of the posterior chance of being the best (``race.credible_set``, over every candidate, so one
  dropped early comes back if the others fall) get another, up to ``SCREEN_CAP`` needles per cell, until at most
  ``KEEP`` remain; the set goes on to the race -- all of it, when still wider (in doubt a candidate goes on).
- ``race_rounds``: at the target, the models ``race.next_round`` names (the pick, its strongest challenger, the
  unpatched reference while not eliminated) get rounds until the verdict stops or the pick and its challenger have
  the cap.

Every round waits for ``Deadline``: past it, sampling stops and the pick is made from what was measured.

Shapes: M models, C cells (rate measurements: passkey at a length and depth, a RULER task at a length), N samples.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from posenc.lab.extend.pick import rules
from posenc.lab.extend.stats import race
from posenc.lab.extend.stats.rates import is_rate_metric, model_of

if TYPE_CHECKING:
    from posenc.lab.extend.settings.config import ExtendConfig
    from posenc.lab.extend.targets.base import PretrainedTarget

#: Screening: needles per cell at most (rounds of ``race.ROUND``), and how many candidates the race should get.
SCREEN_CAP = 12
KEEP = 4


@dataclasses.dataclass
class Deadline:
    """Wall-clock time this invocation may sample until (``--budget``); None: no deadline."""

    at: float | None = None
    hit: bool = False

    @classmethod
    def after(cls, seconds: float | None) -> Deadline:
        return cls(None if seconds is None else time.monotonic() + seconds)

    def passed(self) -> bool:
        if self.at is not None and time.monotonic() >= self.at:
            self.hit = True
        return self.hit


@dataclasses.dataclass(frozen=True)
class Field:
    """The models and rate cells a stage samples, with their cap (needles per cell)."""

    units: list[tuple]
    cells: list[tuple]  # (metric, length, depth)
    cap: int

    @classmethod
    def of(cls, units: Sequence[tuple], grid: Sequence[tuple], cap: int) -> Field:
        return cls(list(units), [m for m in grid if is_rate_metric(m[0])], cap)


def stored(field: Field, samples: dict[tuple, list[float | None]]) -> tuple[torch.Tensor, torch.Tensor]:
    """The stored needles as ``(1, M, C, cap)`` scores and each cell's count ``(M, C)``: the needles it has from index
    0 without a gap (the scores past it are 0)."""
    m, c = len(field.units), len(field.cells)
    scores = torch.zeros(1, m, c, field.cap, dtype=torch.float64)
    counts = torch.zeros(m, c, dtype=torch.long)
    for i, unit in enumerate(field.units):
        for j, (metric, length, depth) in enumerate(field.cells):
            got = samples.get((unit, metric, length, depth), [])[: field.cap]
            have = next((k for k, x in enumerate(got) if x is None), len(got))
            scores[0, i, j, :have] = torch.tensor(got[:have], dtype=torch.float64)
            counts[i, j] = have
    return scores, counts


def together(field: Field, per_cell: torch.Tensor) -> torch.Tensor:
    """Each model's count ``(M,)`` from its cells' ``(M, C)``: the needles every one of its cells has (a model's cells
    advance together; a round cut between them leaves the first ones ahead)."""
    return per_cell.min(dim=1).values if field.cells else torch.full((len(field.units),), field.cap)


def needles(field: Field, samples: dict[tuple, list[float | None]]) -> tuple[torch.Tensor, torch.Tensor]:
    """The stored needles as ``(1, M, C, cap)`` scores and each model's count ``(M,)`` (``together``)."""
    scores, per_cell = stored(field, samples)
    return scores, together(field, per_cell)


@dataclasses.dataclass(frozen=True)
class Replay:
    """Where a stage stands: the models' needle counts it has used, those that need another round (empty: done),
    and the last look (a ``race.Verdict`` for the race; screening's set as a bool (M,) tensor)."""

    n: torch.Tensor  # (M,)
    wanted: list[int]
    look: Any


def replay_race(field: Field, scores: torch.Tensor, counts: torch.Tensor, tier: torch.Tensor,
                reference: torch.Tensor) -> Replay:
    """The race's rounds from the first one, as far as the stored needles go."""
    n = torch.full((1, len(field.units)), min(race.ROUND, field.cap), dtype=torch.long)
    if bool((counts < n[0]).any()):  # the first round (run_extend measures it) is not complete
        return Replay(n[0], [i for i in range(len(field.units)) if counts[i] < n[0, i]], None)
    v = race.verdict(scores, n, torch.ones_like(n, dtype=torch.bool), tier, reference)
    while True:
        chosen = race.next_round(v, n, field.cap, reference)[0]
        if not chosen.any():
            return Replay(n[0], [], v)
        more = torch.where(chosen, (n[0] + race.ROUND).clamp(max=field.cap), n[0])
        lacking = [i for i in range(len(field.units)) if chosen[i] and counts[i] < more[i]]
        if lacking:
            return Replay(n[0], lacking, v)
        n = more[None]
        v = race.verdict(scores, n, v.active, tier, reference)


def replay_screen(field: Field, scores: torch.Tensor, counts: torch.Tensor, keep: int = KEEP) -> Replay:
    """Screening's rounds from the first one, as far as the stored needles go. The unpatched model (``none``), a
    reference, gets the first round only and is never in the set."""
    m = len(field.units)
    n = torch.full((m,), min(race.ROUND, field.cap), dtype=torch.long)
    if bool((counts < n).any()):
        return Replay(n, [i for i in range(m) if counts[i] < n[i]], None)
    candidates = torch.tensor([u[0] != "none" for u in field.units])
    while True:
        hits = torch.stack([scores[0, i, :, : n[i]].sum() / scores.shape[2] for i in range(m)])  # pooled over cells
        kept = race.credible_set(hits, n.to(torch.float64), candidates)
        chosen = kept & (n < field.cap)
        if int(kept.sum()) <= keep or not chosen.any():
            return Replay(n, [], kept)
        more = torch.where(chosen, (n + race.ROUND).clamp(max=field.cap), n)
        lacking = [i for i in range(m) if chosen[i] and counts[i] < more[i]]
        if lacking:
            return Replay(n, lacking, kept)
        n = more


def tiers(units: Sequence[tuple], model_type: str | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The race's serving tier of each model (cheaper first; the unpatched model last) and which is the reference."""
    tier = torch.tensor([rules.SERVING[rules.serving(u[0], model_type)][0] if u[0] != "none" else 9 for u in units])
    return tier, torch.tensor([u[0] == "none" for u in units])


def race_replay(
    units: Sequence[tuple], model_type: str | None, *, fixed: bool
) -> Callable[[Field, torch.Tensor, torch.Tensor], Replay]:
    """The race's replay over ``units`` (the unpatched model first): paired elimination and LUCB rounds, or with
    ``fixed`` every model to the cap (``--stop-width 0``)."""
    tier, reference = tiers(units, model_type)

    def replay(field: Field, scores: torch.Tensor, counts: torch.Tensor) -> Replay:
        if not fixed:
            return replay_race(field, scores, counts, tier, reference)
        n = counts.clamp(max=field.cap)
        wanted = [i for i in range(len(field.units)) if counts[i] < field.cap]
        if bool((n == 0).any()):  # a model not measured yet (a deadline in the first pass): no look, as replay_race
            return Replay(n, wanted, None)
        full = torch.full((1, len(field.units)), field.cap, dtype=torch.long)
        v = race.verdict(scores, torch.minimum(full, n[None]), torch.ones_like(full, dtype=torch.bool), tier, reference)
        return Replay(n, wanted, dataclasses.replace(v, stop=torch.tensor([not wanted]) & v.shown))

    return replay


def tied_race(candidates: int, cells: int, cap: int) -> torch.Tensor:
    """Each model's needles per cell when the race runs on a tie -- every candidate finds every needle, the unpatched
    reference (first) none --, the usual case among the methods screening sends on and the plan's expectation of the
    race's length: the pick and its strongest challenger reach the cap, the others get a round or two (LUCB) and the
    reference is sampled until it is shown below. ``race.race`` itself is run, so the count follows its rules.
    Shapes: () -> (1 + candidates,) long."""
    scores = torch.ones(1, 1 + candidates, cells, cap, dtype=torch.float64)
    scores[:, 0] = 0.0
    reference = torch.tensor([True] + [False] * candidates)
    _, n = race.race(scores, torch.zeros(1 + candidates, dtype=torch.long), reference, cap)
    return n[0]


def policy(replay: Callable[[Field, torch.Tensor, torch.Tensor], Replay], cap: int, deadline: Deadline) -> Callable:
    """A ``run_extend`` ``more_rounds``: replay, measure one round for each model the replay wants, repeat -- until
    the replay is done or the deadline passes."""
    from posenc.lab.extend.study.report import label
    from posenc.lab.extend.study.run import (
        add_samples,
        model_for,
        read_results,
        read_samples,
        result_key,
        upsert_results,
    )

    def more_rounds(target: PretrainedTarget, cfg: ExtendConfig, units: Sequence[tuple], grid: Sequence[tuple],
                    results: Path, study: Any, described: dict, samples: Path | None) -> None:
        if samples is None:
            raise ValueError("--pick races pretrained models only (their needles are kept one by one)")
        field = Field.of(units, grid, cap)
        while not deadline.passed():
            scores, counts = needles(field, read_samples(samples))
            wanted = replay(field, scores, counts).wanted
            if not wanted:
                return
            rows = {result_key(r): r for r in read_results(results)}
            measured = False
            for i in wanted:
                if deadline.passed():
                    return
                unit = field.units[i]
                name = label(*unit)
                model, described[name], _ = model_for(target, unit)
                with study.bar(f"{name}: a round") as tick:
                    for row in [r for r in rows.values() if model_of(r) == unit and is_rate_metric(r["metric"])]:
                        if row["n"] >= int(counts[i]) + race.ROUND or row["n"] >= cap:
                            continue  # this cell has the round already (a resumed round cut mid-way)
                        count = min(race.ROUND, cap - row["n"])
                        fresh = add_samples(target, model, dict(row), count, tick, samples)
                        upsert_results(results, [fresh])
                        rows[result_key(fresh)] = fresh
                        measured = True
                del model
            if not measured:  # the rows are ahead of samples.csv: a stage measured without keeping its needles
                raise ValueError(f"{samples}: the needles of {[label(*field.units[i]) for i in wanted]} are not kept "
                                 "one by one (a stage measured at fixed counts); start the pick in a new folder")

    return more_rounds
