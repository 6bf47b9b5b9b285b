"""The race at the target: which models stay in contention, when sampling stops, which one is picked, and how sure.

Every raced model gets the same needles (passkey keys and RULER documents drawn from fixed sequences), round after
round, all of its cells at once, so the comparison is *paired*: on a needle both models see, what counts is where
they disagree (``posenc.lab.extend.stats.confidence.difference_interval``). Every interval is anytime-valid, so looking
after each round and stopping on a look costs no coverage.

The rule, in one sentence (``RULE``): a model stops being sampled once another one is better beyond noise; the pick
is the last method standing, or -- as soon as it is shown -- the cheapest to serve among those within ``DELTA`` of
every model still sampled; if the cap or the deadline comes first, the pick is the best estimate, reported as not
shown better, with each cheaper alternative's cost in rate.

- Pairs: each pair's mean difference over cells (each cell weighing the same) has the average of the cells' paired
  intervals, each at ``alpha / ((M - 1) * cells)``. That is enough for both claims the race makes: the best model
  is eliminated only if one of the ``M - 1`` pairs it is in fails, and a model worse than the best by more than
  ``DELTA`` is called within ``DELTA`` only if its pair with the best fails -- a union over ``M - 1`` pairs either
  way, so each happens with probability at most ``alpha``.
- The unpatched model is raced as a reference (does a method rescue retrieval at all?), never picked; it stops like
  any other model once shown worse.
- ``verdict`` works on a batch of races at once (leading dimension R): the suite's simulations run thousands.

Shapes: R races, M models, C cells; scores ``(R, M, C, N)`` with per-model counts ``n`` ``(R, M)`` (a model's
cells advance together).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from posenc.lab.extend.stats.confidence import ALPHA, disagreement_interval, probability_best, rate_interval
from posenc.lab.extend.stats.sampling import ROUND

#: The margin within which a cheaper method counts as as good as the best (in rate), when shown.
DELTA = 0.05

RULE = (
    "a model stops being sampled once another one is better beyond noise (paired needles, anytime-valid 95% "
    "intervals); the pick is the last method standing, or the cheapest to serve among those shown within "
    f"{DELTA:g} of every model still sampled; at the cap or deadline, the best estimate, not shown better"
)


@dataclass(frozen=True)
class Verdict:
    """One look at a batch of races. Shapes: (R, M) and (R,)."""

    active: torch.Tensor  # bool (R, M): still sampled
    stop: torch.Tensor  # bool (R,): nothing more to learn (or nothing to pick from)
    pick: torch.Tensor  # long (R,): the pick now (the best estimate where nothing is shown)
    shown: torch.Tensor  # bool (R,): the pick is shown -- best beyond noise of all, or cheapest within DELTA
    estimate: torch.Tensor  # float (R, M): pooled rate (each cell weighing the same)
    low: torch.Tensor  # float (R, M, M): low[r, i, j] bounds rate_i - rate_j from below
    high: torch.Tensor  # float (R, M, M)


def pair_intervals(scores: torch.Tensor, n: torch.Tensor, alpha: float = ALPHA) -> tuple[torch.Tensor, torch.Tensor]:
    """Bounds on ``rate_i - rate_j`` for every pair, from the needles both have (the first ``min(n_i, n_j)`` of each
    cell), found-or-not scores. Each cell's interval at ``alpha / ((M - 1) * cells)``, averaged over cells.

    Shapes:
        scores (R, M, C, N) in {0, 1}; n (R, M) -> low, high (R, M, M).
    """
    r, m, c, cap = scores.shape
    level = alpha / (max(1, m - 1) * c)
    a, b = scores[:, :, None], scores[:, None, :]  # (R, M, 1, C, N), (R, 1, M, C, N)
    wins = torch.cumsum((a > b).to(torch.float64), -1)  # (R, M, M, C, N): running counts
    disagree = torch.cumsum((a != b).to(torch.float64), -1)
    common = torch.minimum(n[:, :, None], n[:, None, :]).to(torch.long)  # (R, M, M)
    index = (common - 1).clamp(min=0)[..., None, None].expand(r, m, m, c, 1)
    w = torch.gather(wins, -1, index)[..., 0]  # (R, M, M, C)
    d = torch.gather(disagree, -1, index)[..., 0]
    k = common[..., None].expand(r, m, m, c).to(torch.float64)
    w, d = torch.where(k > 0, w, 0.0), torch.where(k > 0, d, 0.0)
    low, high = disagreement_interval(w, d, k, level)
    low, high = low.mean(-1), high.mean(-1)
    eye = torch.eye(m, dtype=torch.bool)
    return low.masked_fill(eye, 0.0), high.masked_fill(eye, 0.0)


def pooled(scores: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
    """Each model's rate over its first ``n`` needles per cell, each cell weighing the same. Shapes: (R, M, C, N),
    (R, M) -> (R, M)."""
    mask = torch.arange(scores.shape[-1]) < n[..., None, None]
    return (scores * mask).sum(-1).mean(-1) / n.clamp(min=1)


def pooled_interval(scores: torch.Tensor, n: torch.Tensor, alpha: float = ALPHA) -> tuple[torch.Tensor, torch.Tensor]:
    """The anytime-valid interval of each model's pooled rate: needle ``k`` of every cell averaged is one score in
    [0, 1], the same distribution for every ``k``. Shapes: (R, M, C, N), (R, M) -> low, high (R, M)."""
    return rate_interval(pooled(scores, n) * n, n, alpha)


def verdict(scores: torch.Tensor, n: torch.Tensor, active: torch.Tensor, tier: torch.Tensor,
            reference: torch.Tensor, *, alpha: float = ALPHA, delta: float = DELTA) -> Verdict:
    """One look: eliminate the models shown worse than another, then stop where the pick is shown.

    ``active`` (R, M): the models sampled until now; ``tier`` (M,): each model's serving cost (lower is cheaper);
    ``reference`` (M,): the unpatched model, never picked.
    """
    estimate = pooled(scores, n)
    low, high = pair_intervals(scores, n, alpha)
    worse = (low > 0).any(1)  # (R, M): some model is better beyond noise
    active = active & ~worse
    candidates = active & ~reference
    count = candidates.sum(1)
    others = active[:, :, None] & ~torch.eye(active.shape[1], dtype=torch.bool)  # (R, i, c): i active, i != c
    within = candidates & ((high <= delta) | ~others).all(1)  # c within delta of every active i
    big = torch.iinfo(torch.long).max
    tiers = tier.expand_as(candidates)
    cheapest = torch.where(candidates, tiers, big).min(1).values
    cheapest_within = torch.where(within, tiers, big).min(1).values
    equivalent = within.any(1) & (cheapest_within <= cheapest)
    stop = (count <= 1) | equivalent
    # The pick: among the shown-equivalent cheapest, the best estimate; else the best estimate among candidates
    # (then the cheaper, then the first in order on a tie).
    pool_from = torch.where(equivalent[:, None], within & (tiers == cheapest_within[:, None]), candidates)
    pool_from = torch.where(pool_from.any(1, keepdim=True), pool_from, ~reference.expand_as(pool_from))
    pick = best_estimate(estimate, pool_from, tiers)
    shown = (count == 1) | equivalent
    return Verdict(active, stop, pick, shown, estimate, low, high)


def best_estimate(estimate: torch.Tensor, allowed: torch.Tensor, tier: torch.Tensor) -> torch.Tensor:
    """The index of the highest estimate among ``allowed``; on a tie the cheaper tier, then the first.
    Shapes: (R, M) -> (R,)."""
    top = torch.where(allowed, estimate, -torch.inf).max(1, keepdim=True).values
    tied = allowed & (estimate >= top - 1e-12)
    cheapest = torch.where(tied, tier, torch.iinfo(torch.long).max).min(1, keepdim=True).values
    first = tied & (tier == cheapest)
    return first.to(torch.int8).argmax(1)  # the first True


#: Screening keeps the models that hold this much of the posterior chance of being the best.
SCREEN_MASS = 0.98


def credible_set(hits: torch.Tensor, n: torch.Tensor, allowed: torch.Tensor, mass: float = SCREEN_MASS) -> torch.Tensor:
    """Screening's survivors: the fewest of the ``allowed`` models whose posterior chances of having the highest
    rate add up to ``mass`` (Beta(1 + hits, 1 + misses) posteriors, ``probability_best``), the likeliest first;
    a model tied with the last one taken is taken too. With few needles the set is wide (in doubt, a candidate goes
    on); it narrows as rounds add needles.

    Shapes:
        hits, n: (R, M) (or (M,)); allowed: bool of the same shape -> bool of the same shape.
    """
    hits, n = torch.as_tensor(hits, dtype=torch.float64), torch.as_tensor(n, dtype=torch.float64)
    single = hits.dim() == 1
    hits, n, allowed = (x[None] if single else x for x in (hits, n, torch.as_tensor(allowed)))
    out = torch.zeros_like(allowed)
    for r in range(hits.shape[0]):
        idx = allowed[r].nonzero()[:, 0]
        if idx.numel() == 0:
            continue
        p, _ = probability_best(hits[r, idx], n[r, idx])
        order = torch.argsort(p, descending=True, stable=True)
        before = torch.cumsum(p[order], 0) - p[order]  # the mass of the likelier ones
        take = before < mass - 1e-12
        last = p[order][take].min()
        take |= p[order] >= last  # ties with the last one taken
        out[r, idx[order[take]]] = True
    return out[0] if single else out




def next_round(v: Verdict, n: torch.Tensor, cap: int, reference: torch.Tensor) -> torch.Tensor:
    """Which models get the next round (LUCB, Kalyanakrishnan et al. 2012, "PAC subset selection in stochastic
    multi-armed bandits"): while the pick is below the ``cap`` (needles per cell), the pick and its strongest
    challenger -- the other candidate with the highest upper bound on its lead over the pick; once the pick has the
    cap, the runner-up (the next best estimate) until it has it too; and the unpatched reference while it is still
    sampled. So the race ends with the pick and the runner-up at the cap, where models tied with them need not be:
    what more they would show is said as the pick's chance of being the best. Nothing once the verdict stops.
    Shapes: (R, M) -> bool (R, M).
    """
    r, m = n.shape
    rows = torch.arange(r)
    below = v.active & (n < cap)
    others = v.active & ~reference & (torch.arange(m) != v.pick[:, None])
    challenger = torch.where(others, v.high[rows, :, v.pick], -torch.inf).argmax(1)
    runner_up = torch.where(others, v.estimate, -torch.inf).argmax(1)  # the first on a tie
    pick_below = below[rows, v.pick]
    second = torch.where(pick_below, challenger, runner_up)
    out = torch.zeros_like(below)
    out[rows, v.pick] = True
    out[rows, second] |= others[rows, second]
    out |= v.active & reference
    return out & below & ~v.stop[:, None]


def race(
    scores: torch.Tensor, tier: torch.Tensor, reference: torch.Tensor, cap: int, *, first: int = ROUND,
    alpha: float = ALPHA, delta: float = DELTA, rounds: int | None = None,
) -> tuple[Verdict, torch.Tensor]:
    """The whole race on needles already drawn (``scores`` (R, M, C, N), N >= ``cap``): every model's first
    ``first`` needles per cell, then rounds of ``ROUND`` for the models ``next_round`` names, until the verdict stops,
    nobody is left below the cap, or after ``rounds`` rounds (a deadline). Deterministic in the scores: a resumed
    race replays it from the stored needles. Returns the last verdict and each model's needles per cell (R, M)."""
    r, m = scores.shape[:2]
    n = torch.full((r, m), min(first, cap), dtype=torch.long)
    active = torch.ones(r, m, dtype=torch.bool)
    v = verdict(scores, n, active, tier, reference, alpha=alpha, delta=delta)
    done = 0
    while rounds is None or done < rounds:
        chosen = next_round(v, n, cap, reference)
        if not chosen.any():
            break
        n = torch.where(chosen, (n + ROUND).clamp(max=cap), n)
        stopped = v.stop
        fresh = verdict(scores, n, v.active, tier, reference, alpha=alpha, delta=delta)
        v = _keep_stopped(v, fresh, stopped)
        done += 1
    return v, n


def _keep_stopped(old: Verdict, new: Verdict, stopped: torch.Tensor) -> Verdict:
    """``new`` for the races still running, ``old`` for those that had stopped (their n did not change)."""
    s1, s2, s3 = stopped[:, None], stopped[:, None, None], stopped
    return Verdict(
        active=torch.where(s1, old.active, new.active), stop=torch.where(s3, old.stop, new.stop),
        pick=torch.where(s3, old.pick, new.pick), shown=torch.where(s3, old.shown, new.shown),
        estimate=torch.where(s1, old.estimate, new.estimate), low=torch.where(s2, old.low, new.low),
        high=torch.where(s2, old.high, new.high),
    )
