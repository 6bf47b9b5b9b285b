"""The race on multi-key documents: paired, clustered intervals at planned looks, and the rule that decides the pick.

Each long forward is one *document* holding ``K`` keys at different depths; a key scores ``found`` (0/1, exact match)
or ``prob`` (the teacher-forced chance of writing the whole answer, in [0, 1]). Every model reads the same documents
in the same order, so models are compared on *paired* documents, and the keys of one document are correlated, so the
document is the unit of sampling (a *cluster*). Following Miller (2024, "Adding Error Bars to Evals: A Statistical
Approach to Language Model Evaluations", arXiv:2411.00640, sections 2.2-2.3): a model's score in a document is the
mean over its keys (``cluster_means``); with equal cluster sizes the clustered standard error of the mean is the
standard error of these document means, and two models are compared by the mean of their per-document differences
(the paired difference, whose variance drops by twice the covariance the shared documents induce).

Intervals (``clustered_interval``): Student's t on the document means, ``mean +- t_{n-1} s / sqrt(n)`` -- widened,
where the data look cleaner than ``K`` needles can, by a *binomial floor*. A mean difference ``mu`` between two
models' found-rates needs at least a fraction ``|mu|`` of keys where the two disagree, and ``K`` keys scored
independently given the document then have a document-mean variance of at least ``|mu| (1 - |mu|) / K`` (a rate
``mu``: ``mu (1 - mu) / K``); positively correlated keys only add variance, which ``s^2`` sees once a document shows
it. The interval is (the hull of) ``{mu : |mean - mu| <= t sqrt(max(s^2, floor(mu)) / n)}``: the t interval or the
Wilson-type interval of ``n K`` needles, whichever is wider on each side. So documents where both models found every
key (all differences 0) give ``[-w / (1 + w), w / (1 + w)]``, ``w = t^2 / (n K)`` -- about what ``n K`` independent
needles could show, never zero width -- and near 0 or 1 the bound is Wilson's, not Wald's (the t interval alone misses
rates near 1 at a few documents: ``test_the_floor_is_what_keeps_small_n_honest``). For ``prob`` the floor is the
variance the same keys would have if scored by sampling; it is conservative there (a teacher-forced chance can vary
less). Two places where independent keys would claim too much, both seen in the simulations: a model's own mean takes
the design effect its documents show (``_design``: Kish's, pooled over the race's models, so a model's clean record
borrows the clustering the others show: 92.7% coverage without it at ICC 0.8, K 16); and a pair with a model stuck at
0 or 1 (the unpatched model finding nothing) is the other model's mean, shifted, so it takes that model's interval too
(a method failing one kind of document in four, against a reference dropped at the first look: 82% without either).
What no interval that decides at ~32 documents can see is a failure of whole documents rarer than about ``1 / n`` that
no model has shown yet; these intervals are CLT-based, as Miller's are (a bound valid for any law on [-1, 1] is at
least ``log(1 / alpha) / n`` wide: 0.14 at 32 documents, so it could never show 0.05).

The plan (``Plan``): looks at planned document counts, doubling from 8 to the cap (8 16 32). A pair is judged on the
documents both models measured, cut to the last planned count they reach, so every interval ever computed is one of
``L`` fixed-n intervals; each comparison's error is spent across the looks in proportion to the documents each adds
(linear spending, Lan & DeMets 1983, "Discrete sequential boundaries for clinical trials", Biometrika 70(3): 1/4,
1/4, 1/2), and Bonferroni's union bound over the looks makes any stopping -- the rule's, or a deadline's after any
look -- keep the coverage. The first look is 8, not 4: four documents all of one kind (1 in 8 with two kinds of
document) look like no variance at all, and a t interval at 4 documents then missed a pair 9% of the time.
Across comparisons: Bonferroni (not Holm: a step-down order does not survive models leaving the race between looks).
Every claim the race makes about the best model ``b`` fails only if the interval of ``mean_b - mean_j`` lies entirely
below the truth for some ``j`` (it is eliminated; a worse pick is shown better or within ``delta`` of it), one side of
``M - 1`` pairs, so each pair's two-sided level is ``1 - min(alpha, 2 alpha / (M - 1))``: those claims err with
probability at most ``alpha``, and every reported interval still covers with at least ``1 - alpha``. A model's own
mean (``none``: no model reaches ``floor``; ``useful``: the pick does) at ``1 - alpha / M``.

The rule (``decide``): a model is *shown worse* when another's lower bound on the difference is above 0, and *far
worse* when it is above ``delta``. The *contenders* are the models not shown worse: a ``1 - alpha`` confidence set for
the best, what a deadline reports. A model ``c`` is *within* when the upper bound of ``mean_j - mean_c`` is below
``delta`` for every contender ``j`` (then also for every other model: one shown worse than a contender is below it).
Among the models within, the cheapest (on a tie the higher estimate) is the pick: ``better`` when it is the only
contender left (so shown above every other model, directly or through the one that beat it; this ends the race at
once, as the last method standing did), ``within`` otherwise, declared once no cheaper model that is not far worse
is left to be shown within (or at the last look, or a deadline). ``none`` (checked first): every model's upper bound
is below ``floor``. ``reference``: the unpatched model is the one contender and every method is far worse than some
model. ``open``: not decided; the pick is then the cheapest model shown within if any, else the best estimate among
the contenders (the cheaper on a tie). The unpatched model (``reference``) is compared (``above_reference``) but
never picked. A model is *sampled* (gets the next look's documents) while the race is open, it is below the cap,
and it is a contender or a method not far worse.

Measured by ``tests/lab/extend/stats/test_paired.py`` (seeded, 600 races a row; 2-core AMD EPYC). The audit's two
scenarios, the unpatched model at 0 raced too ("shown": better for the gap, within for the ties; "docs": the most
documents any model read, over the races shown; "forwards": all models' documents, mean over all races)::

    scenario      K  ICC  score  shown  docs median/p90  forwards
    gap 0.2       8  0.0  found  100.0%     8 / 16         28.5
    gap 0.2       8  0.0  prob   100.0%     8 /  8         24.0
    gap 0.2       8  0.3  found  100.0%    16 / 16         38.6
    gap 0.2       8  0.3  prob   100.0%    16 / 16         32.1
    gap 0.2       8  0.8  found  99.3%    32 / 32         62.9
    gap 0.2       8  0.8  prob   99.5%    32 / 32         60.9
    gap 0.2      16  0.0  found  100.0%     8 /  8         24.3
    gap 0.2      16  0.0  prob   100.0%     8 /  8         24.0
    gap 0.2      16  0.3  found  100.0%    16 / 16         34.0
    gap 0.2      16  0.3  prob   100.0%     8 / 16         30.5
    gap 0.2      16  0.8  found  99.2%    32 / 32         61.0
    gap 0.2      16  0.8  prob   99.7%    32 / 32         59.6
    ties at 0.98  8  0.0  found  99.3%    32 / 32         59.9
    ties at 0.98  8  0.0  prob   99.8%    32 / 32         67.3
    ties at 0.98  8  0.3  found  99.5%    32 / 32         62.0
    ties at 0.98  8  0.3  prob   99.7%    32 / 32         63.3
    ties at 0.98  8  0.8  found  91.5%    32 / 32         66.7
    ties at 0.98  8  0.8  prob   94.8%    32 / 32         65.4
    ties at 0.98 16  0.0  found  99.0%    16 / 32         43.8
    ties at 0.98 16  0.0  prob   100.0%    16 / 16         40.0
    ties at 0.98 16  0.3  found  99.8%    16 / 32         47.3
    ties at 0.98 16  0.3  prob   99.8%    16 / 32         42.5
    ties at 0.98 16  0.8  found  95.3%    16 / 32         53.4
    ties at 0.98 16  0.8  prob   96.2%    16 / 32         53.1

Against the one-needle-per-forward race (``race.race``, capped at 400 / 1600 needles so that it decides; ICC 0.3;
200 / 48 races), long forwards until decided, mean over races: the issue's >= 10x holds near ties (where the old
race needed ~1000 forwards), not for a clear gap (which it decided in ~100; the first look here is 8 documents)::

    scenario       old forwards  new: K=8 found  K=16 found  K=16 prob  ratio (K=8 found .. K=16 prob)
    gap 0.2               106           38.6        34.0       30.5    2.7x   3.1x   3.5x
    ties at 0.98         1042           62.0        47.3       42.5   16.8x  22.0x  24.5x

Shapes: M models, D documents, K keys; leading batch dimensions ``...`` (many races at once) anywhere a tensor is
taken. float64 throughout.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from posenc._checks import fail

#: The error of every decision and the level (``1 - ALPHA``) of every reported interval.
ALPHA = 0.05
#: The margin within which a cheaper method counts as as good as the best (in rate), when shown.
DELTA = 0.05
#: The least rate that counts as retrieving at all.
FLOOR = 0.5
#: ``Decision.code`` indexes this.
STATUSES = ("open", "better", "within", "none", "reference")
OPEN, BETTER, WITHIN, NONE, REFERENCE = range(5)

_F64 = torch.float64


@dataclass(frozen=True, kw_only=True)
class Plan:
    """The planned looks: the document counts at which the race decides (each model's first ``looks[l]``
    documents), increasing; the last is the cap. ``spent()``: the share of each comparison's error spent at each
    look, ``(looks[l] - looks[l - 1]) / cap``."""

    looks: tuple[int, ...] = (8, 16, 32)

    def __post_init__(self) -> None:
        looks = tuple(self.looks)
        bad = (not looks or any(isinstance(n, bool) or not isinstance(n, int) or n < 2 for n in looks)
               or any(b <= a for a, b in zip(looks, looks[1:], strict=False)))
        if bad:
            fail("looks", self.looks, "increasing document counts, each an integer >= 2")
        object.__setattr__(self, "looks", looks)

    @classmethod
    def doubling(cls, first: int = 8, cap: int = 32) -> Plan:
        """``first, 2 first, 4 first, ...`` below ``cap``, then ``cap``."""
        if isinstance(first, bool) or not isinstance(first, int) or first < 2:
            fail("first", first, "an integer >= 2")
        if isinstance(cap, bool) or not isinstance(cap, int) or cap < first:
            fail("cap", cap, f"an integer >= first ({first})")
        looks, n = [], first
        while n < cap:
            looks.append(n)
            n *= 2
        return cls(looks=(*looks, cap))

    @property
    def cap(self) -> int:
        return self.looks[-1]

    def spent(self) -> torch.Tensor:
        """Shapes: -> (L,), summing to 1."""
        n = torch.tensor((0, *self.looks), dtype=_F64)
        return torch.diff(n) / n[-1]

    def look(self, n: torch.Tensor) -> torch.Tensor:
        """The index of the last look at or below ``n`` documents, -1 before the first. Shapes: any -> the same."""
        return torch.searchsorted(torch.tensor(self.looks), n.to(torch.long), right=True) - 1


# -- Student's t ------------------------------------------------------------------------------------------------------


def _t_cdf(t: float, df: int) -> float:
    """P(T <= t) for t >= 0, exact for integer ``df`` (Abramowitz & Stegun 26.7.3-26.7.4, finite sums in theta)."""
    theta = math.atan(t / math.sqrt(df))
    s, c2 = math.sin(theta), math.cos(theta) ** 2
    if df % 2 == 0:
        term = total = 1.0
        for k in range(1, df // 2):
            term *= c2 * (2 * k - 1) / (2 * k)
            total += term
        inside = s * total
    else:
        total = 0.0
        if df > 1:
            term = total = math.cos(theta)
            for k in range(1, (df - 1) // 2):
                term *= c2 * (2 * k) / (2 * k + 1)
                total += term
        inside = 2 / math.pi * (theta + s * total)
    return 0.5 + 0.5 * inside


@functools.cache
def t_quantile(p: float, df: int) -> float:
    """Student's t quantile ``t_df(p)`` for ``0.5 <= p < 1`` and integer ``df >= 1`` (bisection on the exact CDF, to
    ~1e-12 relative)."""
    if not 0.5 <= p < 1:
        fail("p", p, "a probability in [0.5, 1)")
    if isinstance(df, bool) or not isinstance(df, int) or df < 1:
        fail("df", df, "an integer >= 1")
    lo, hi = 0.0, 1.0
    while _t_cdf(hi, df) < p:
        lo, hi = hi, 2 * hi
    for _ in range(200):
        mid = (lo + hi) / 2
        if _t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-12 * hi:
            break
    return hi


def _quantiles(p: torch.Tensor, df: torch.Tensor) -> torch.Tensor:
    """``t_quantile`` elementwise, each distinct (p, df) computed once; inf where ``df < 1``."""
    p, df = torch.broadcast_tensors(p.to(_F64), df.to(_F64))
    out = torch.full(p.shape, math.inf, dtype=_F64)
    ok = df >= 1
    if ok.any():
        pairs, inverse = torch.unique(torch.stack([p[ok], df[ok]], -1), dim=0, return_inverse=True)
        values = torch.tensor([t_quantile(a, int(b)) for a, b in pairs.tolist()], dtype=_F64)
        out[ok] = values[inverse]
    return out


# -- intervals ---------------------------------------------------------------------------------------------------------


def cluster_means(scores: torch.Tensor, present: torch.Tensor | None = None) -> torch.Tensor:
    """Each model's score in each document: the mean over the document's keys (the document is the cluster). A
    document with no key present is NaN (mark it not measured).

    Shapes:
        scores (..., M, D, K); present bool (..., M, D, K) or None (every key) -> (..., M, D), float64.
    """
    scores = torch.as_tensor(scores, dtype=_F64)
    if present is None:
        return scores.mean(-1)
    present = torch.as_tensor(present, dtype=torch.bool).expand_as(scores)
    count = present.sum(-1)
    total = torch.where(present, scores, 0.0).sum(-1)
    return torch.where(count > 0, total / count.clamp(min=1), math.nan)


def _floor_side(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``{mu in [0, 1] : (x - mu)^2 <= w mu (1 - mu)}`` as (low, high, nonempty): Wilson's quadratic."""
    disc = w * (4 * x * (1 - x) + w)
    root = disc.clamp(min=0).sqrt()
    low = (2 * x + w - root) / (2 * (1 + w))
    high = (2 * x + w + root) / (2 * (1 + w))
    return low.clamp(0, 1), high.clamp(0, 1), (disc >= 0) & (high >= 0)


def clustered_interval(
    x: torch.Tensor, mask: torch.Tensor, level: float | torch.Tensor = 1 - ALPHA, *,
    inverse_keys: float | torch.Tensor = 1.0, signed: bool = False, least: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The mean of the documents' scores where ``mask`` and its two-sided ``level`` interval: Student's t on the
    document means with the binomial floor (module docstring): ``{mu : |mean - mu| <= t_{n-1} sqrt(max(s^2,
    f mu (1 - mu)) / n)}`` (``|mu| (1 - |mu|)`` when ``signed``), ``f`` the mean of the documents' ``1 / K``. Scores
    in [0, 1] (``signed``: differences in [-1, 1]); fewer than 2 documents give the whole range, estimate 0 when none.
    ``least``: a lower bound on ``f`` (an estimated design effect over ``K``, ``mean_intervals``).

    Shapes:
        x, mask (..., D); level, inverse_keys () or broadcast to (..., D) (``inverse_keys``) / (...) (``level``)
        -> estimate, low, high (...).
    """
    x = torch.as_tensor(x, dtype=_F64)
    mask = torch.as_tensor(mask, dtype=torch.bool).expand_as(x)
    x = torch.where(mask, x, 0.0)
    n = mask.sum(-1).to(_F64)
    count = n.clamp(min=1)
    mean = x.sum(-1) / count
    var = (torch.where(mask, (x - mean[..., None]) ** 2, 0.0).sum(-1) / (n - 1).clamp(min=1))
    inverse = torch.as_tensor(inverse_keys, dtype=_F64).expand_as(x)
    f = torch.where(mask, inverse, 0.0).sum(-1) / count
    if least is not None:
        f = torch.maximum(f, least)
    c = _quantiles((1 + torch.as_tensor(level, dtype=_F64)) / 2, n - 1)
    c = torch.where(n >= 2, c, 0.0)  # replaced by the whole range below
    half = c * (var / count).sqrt()
    low, high = mean - half, mean + half
    w = c**2 * f / count
    a, b, ok = _floor_side(mean, w)
    low = torch.minimum(low, torch.where(ok, a, math.inf))
    high = torch.maximum(high, torch.where(ok, b, -math.inf))
    if signed:
        a, b, ok = _floor_side(-mean, w)  # mu <= 0, seen as -mu
        low = torch.minimum(low, torch.where(ok, -b, math.inf))
        high = torch.maximum(high, torch.where(ok, -a, -math.inf))
    bottom = -1.0 if signed else 0.0
    low, high = low.clamp(bottom, 1.0), high.clamp(bottom, 1.0)
    few = n < 2
    return mean, torch.where(few, bottom, low), torch.where(few, 1.0, high)


def _inverse_keys(keys: int | torch.Tensor | None, shape: torch.Size) -> torch.Tensor:
    """``1 / K`` per (model, document): ``keys`` an int (every document), counts (..., M, D), or None (one needle
    per document: the most conservative floor)."""
    if keys is None:
        return torch.ones((), dtype=_F64).expand(shape)
    k = torch.as_tensor(keys, dtype=_F64)
    if bool((k < 1).any()):
        fail("keys", keys, "key counts >= 1")
    return (1 / k).expand(shape)


def _at_looks(mask: torch.Tensor, plan: Plan | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``mask`` cut to its first ``plan.looks[l]`` documents, ``l`` the last look it reaches; the share of the error
    spent there; and whether a look was reached. Shapes: (..., D) -> (..., D), (...), (...)."""
    n = mask.sum(-1)
    if plan is None:
        return mask, torch.ones(n.shape, dtype=_F64), n >= 2
    look = plan.look(n)
    reached = look >= 0
    planned = torch.tensor((0, *plan.looks))[look + 1]  # 0 before the first look
    kept = mask & (torch.cumsum(mask.to(torch.long), -1) <= planned[..., None])
    kept = torch.where(reached[..., None], kept, mask)  # before the first look: the estimate from what there is
    return kept, plan.spent()[look.clamp(min=0)], reached


def _design(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The floor's ``f`` as the documents show it: the variance of document means over the variance of one needle
    at their mean, ``s^2 / (mean (1 - mean))`` (Kish's design effect over ``K``: ``1 / K`` for independent keys, 1
    for documents found or lost whole), pooled over the models of a race (the keys' correlation is mostly the
    documents', which every model reads) and the larger of that and the model's own. A model's clean record (every
    key found) then borrows the clustering the other models show, rather than claiming ``n K`` independent needles.
    0 where nothing shows it. Shapes: (..., M, D) -> (..., M)."""
    n = mask.sum(-1).to(_F64)
    mean = x.sum(-1) / n.clamp(min=1)
    squares = torch.where(mask, (x - mean[..., None]) ** 2, 0.0).sum(-1)
    needle = (n - 1).clamp(min=0) * mean * (1 - mean)
    pooled = squares.sum(-1, keepdim=True) / needle.sum(-1, keepdim=True)
    own = squares / needle
    ratio = torch.maximum(torch.nan_to_num(pooled, nan=0.0, posinf=0.0), torch.nan_to_num(own, nan=0.0, posinf=0.0))
    return ratio


def pair_intervals(
    means: torch.Tensor, measured: torch.Tensor, level: float = 1 - ALPHA, *, keys: int | torch.Tensor | None = None,
    plan: Plan | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``mean_i - mean_j`` over the documents both models measured, with its clustered paired interval
    (``clustered_interval``: documents i.i.d., the per-document difference the unit; Miller 2024). With ``plan``,
    the documents are cut to the last planned look both reach and ``level`` is spent across the looks (the interval
    at look ``l`` has level ``1 - (1 - level) spent[l]``); before the first look the interval is [-1, 1]. ``keys``:
    keys per document (the floor's resolution ``1 / K``); None: one.

    A model at 0 or 1 (to within one key of the ``n K``: the unpatched model finding nothing, a model finding
    everything) cannot vary, so the differences show only the other model's spread: the interval then also holds
    each model's own Wilson-type interval (its floor with the design effect, ``mean_intervals``) shifted by the
    other's mean. Else a method whose documents split into kinds (cells) it handles differently, against a
    reference dropped at the first look, would be judged as though its clean first documents were ``n K``
    independent needles; and a model of one key per document that found all of them (LM-Infinite in a blind race,
    beside models of 16 keys: ``posenc.lab.extend.pick.asking``) would be taken as exactly 1 (the suite's mixed
    simulation: pair coverage down to 0.79 without it).

    Shapes:
        means (..., M, D); measured bool (..., M, D); keys int or (..., M, D) -> estimate, low, high (..., M, M),
        ``[..., i, j]`` about ``mean_i - mean_j`` (0 on the diagonal).
    """
    means = torch.as_tensor(means, dtype=_F64)
    measured = torch.as_tensor(measured, dtype=torch.bool).expand_as(means)
    m = means.shape[-2]
    inverse = _inverse_keys(keys, means.shape)
    own, _, _ = _at_looks(measured, plan)
    design = _design(torch.where(own, means, 0.0), own)  # (..., M)
    a, b = means[..., :, None, :], means[..., None, :, :]  # (..., M, 1, D), (..., 1, M, D)
    common = measured[..., :, None, :] & measured[..., None, :, :]
    used, share, reached = _at_looks(common, plan)
    pair_level = 1 - (1 - level) * share
    pair_inverse = (inverse[..., :, None, :] + inverse[..., None, :, :]) / 2
    d = torch.where(used, a - b, 0.0)  # NaN of unmeasured documents never enters
    estimate, low, high = clustered_interval(d, used, pair_level, inverse_keys=pair_inverse, signed=True)
    n = used.sum(-1).to(_F64)
    c = _quantiles((1 + pair_level) / 2, n - 1)
    sides = []
    for x, inv, g in ((a, inverse[..., :, None, :], design[..., :, None]),
                      (b, inverse[..., None, :, :], design[..., None, :])):
        x = torch.where(used, x, 0.0)
        mean = x.sum(-1) / n.clamp(min=1)
        f = torch.where(used, inv.expand_as(used), 0.0).sum(-1) / n.clamp(min=1)
        w = torch.where(n >= 2, c**2, 0.0) * torch.maximum(f, g) / n.clamp(min=1)
        wilson_low, wilson_high, _ = _floor_side(mean, w)
        flat = mean * (1 - mean) <= f / n.clamp(min=1) + 1e-15  # at 0 or 1 to within a key of the n K
        sides.append((mean, flat, wilson_low, wilson_high))
    (mean_a, flat_a, low_a, high_a), (mean_b, flat_b, low_b, high_b) = sides
    flat = flat_a | flat_b  # either flat: each model's own interval, shifted by the other's mean
    low = torch.minimum(low, torch.where(flat, torch.minimum(low_a - mean_b, mean_a - high_b), math.inf))
    high = torch.maximum(high, torch.where(flat, torch.maximum(high_a - mean_b, mean_a - low_b), -math.inf))
    low, high = torch.where(reached, low.clamp(min=-1.0), -1.0), torch.where(reached, high.clamp(max=1.0), 1.0)
    eye = torch.eye(m, dtype=torch.bool)
    return estimate.masked_fill(eye, 0.0), low.masked_fill(eye, 0.0), high.masked_fill(eye, 0.0)


def mean_intervals(
    means: torch.Tensor, measured: torch.Tensor, level: float = 1 - ALPHA, *, keys: int | torch.Tensor | None = None,
    plan: Plan | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each model's mean score over its measured documents with its clustered interval (the same construction as
    ``pair_intervals``, on [0, 1]).

    Shapes:
        means, measured (..., M, D) -> estimate, low, high (..., M).
    """
    means = torch.as_tensor(means, dtype=_F64)
    measured = torch.as_tensor(measured, dtype=torch.bool).expand_as(means)
    inverse = _inverse_keys(keys, means.shape)
    used, share, reached = _at_looks(measured, plan)
    x = torch.where(used, means, 0.0)
    estimate, low, high = clustered_interval(x, used, 1 - (1 - level) * share, inverse_keys=inverse,
                                             least=_design(x, used))
    return estimate, torch.where(reached, low, 0.0), torch.where(reached, high, 1.0)


# -- the decision ------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Decision:
    """One look at a race (or a batch of races: leading dimensions ``...``).

    Shapes: code, pick, above_reference, useful (...); contenders, within, sampled, documents, mean, mean_low,
    mean_high (..., M); estimate, low, high (..., M, M) about ``mean_i - mean_j``.
    """

    code: torch.Tensor  # long: an index of STATUSES
    pick: torch.Tensor  # long: the pick (never the reference)
    contenders: torch.Tensor  # bool: not shown worse than any model, a 1 - alpha confidence set for the best
    within: torch.Tensor  # bool: shown within delta of every model
    sampled: torch.Tensor  # bool: gets the next look's documents
    documents: torch.Tensor  # long: documents measured
    mean: torch.Tensor
    mean_low: torch.Tensor
    mean_high: torch.Tensor
    estimate: torch.Tensor
    low: torch.Tensor
    high: torch.Tensor
    above_reference: torch.Tensor  # bool: the pick is shown better than the reference (False without one)
    useful: torch.Tensor  # bool: the pick's lower bound is at least the floor

    @property
    def status(self) -> str | list:
        """``STATUSES[code]``: a string for one race, nested lists for a batch."""
        if self.code.dim() == 0:
            return STATUSES[int(self.code)]
        return _names(self.code.tolist())


def _names(codes: list | int) -> list | str:
    return STATUSES[codes] if isinstance(codes, int) else [_names(c) for c in codes]


def _first(allowed: torch.Tensor) -> torch.Tensor:
    return allowed.to(torch.int8).argmax(-1)


def _best(mean: torch.Tensor, allowed: torch.Tensor, tier: torch.Tensor) -> torch.Tensor:
    """The highest mean among ``allowed``; on a tie the cheaper, then the first. Shapes: (..., M) -> (...)."""
    top = torch.where(allowed, mean, -math.inf).max(-1, keepdim=True).values
    tied = allowed & (mean >= top - 1e-12)
    cheapest = torch.where(tied, tier, torch.iinfo(torch.long).max).min(-1, keepdim=True).values
    return _first(tied & (tier == cheapest))


def _cheapest(mean: torch.Tensor, allowed: torch.Tensor, tier: torch.Tensor) -> torch.Tensor:
    """The cheapest among ``allowed``; on a tie the higher mean, then the first. Shapes: (..., M) -> (...)."""
    cheapest = torch.where(allowed, tier, torch.iinfo(torch.long).max).min(-1, keepdim=True).values
    return _best(mean, allowed & (tier == cheapest), tier)


def _take(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    return torch.gather(x, -1, index[..., None])[..., 0]


def decide(
    means: torch.Tensor, measured: torch.Tensor, *, cost: Sequence[int] | torch.Tensor, reference: int | None = None,
    delta: float = DELTA, alpha: float = ALPHA, floor: float = FLOOR, plan: Plan | None = None,
    keys: int | torch.Tensor | None = None, final: bool | torch.Tensor = False,
) -> Decision:
    """One look: the intervals of the plan, then the rule (module docstring). ``cost``: each model's serving tier
    (lower is cheaper); ``reference``: the unpatched model's row, compared but never picked; ``keys``: keys per
    document (the floor's resolution); ``final``: no more documents will come (the last look, a deadline), so
    ``within`` is declared even while a cheaper model could still be shown within. A race at its cap is final.

    Shapes:
        means (..., M, D) document scores (``cluster_means``); measured bool (..., M, D); cost (M,);
        keys int or (..., M, D); final () or (...) -> Decision with leading dimensions (...).
    """
    means = torch.as_tensor(means, dtype=_F64)
    if means.dim() < 2:
        fail("means", tuple(means.shape), "a shape (..., M, D)")
    measured = torch.as_tensor(measured, dtype=torch.bool).expand_as(means)
    m = means.shape[-2]
    tier = torch.as_tensor(cost, dtype=torch.long)
    if tier.shape != (m,):
        fail("cost", cost, f"one serving tier per model ({m})")
    if reference is not None and (isinstance(reference, bool) or not isinstance(reference, int)
                                  or not 0 <= reference < m):
        fail("reference", reference, f"None or a model index in [0, {m})")
    if not 0 < alpha < 1:
        fail("alpha", alpha, "a level in (0, 1)")
    if not 0 < delta < 1:
        fail("delta", delta, "a margin in (0, 1)")
    if not 0 <= floor <= 1:
        fail("floor", floor, "a rate in [0, 1]")
    if m - (reference is not None) < 1:
        fail("means", tuple(means.shape), "at least one model besides the reference")
    plan = plan or Plan()
    is_reference = torch.zeros(m, dtype=torch.bool)
    if reference is not None:
        is_reference[reference] = True

    pair_alpha = min(alpha, 2 * alpha / max(1, m - 1))
    estimate, low, high = pair_intervals(means, measured, 1 - pair_alpha, keys=keys, plan=plan)
    mean, mean_low, mean_high = mean_intervals(means, measured, 1 - alpha / m, keys=keys, plan=plan)
    eye = torch.eye(m, dtype=torch.bool)
    contenders = ~((low > 0) & ~eye).any(-2)  # [..., i, j]: i above j
    far = ((low > delta) & ~eye).any(-2)
    candidates = ~is_reference & torch.ones_like(contenders)
    close = (high < delta) | ~contenders[..., :, None] | eye  # [..., j, c]: j at most delta above c, or not needed
    within = candidates & close.all(-2)
    viable = candidates & ~far
    documents = measured.sum(-1)
    wanted = contenders | viable
    final = torch.as_tensor(final, dtype=torch.bool) | (~wanted | (documents >= plan.cap)).all(-1)

    shown = within.any(-1)
    chosen = _cheapest(mean, within, tier)
    sole = contenders.sum(-1) == 1
    better = shown & sole & _take(contenders, chosen)
    cheaper_left = (viable & (tier < _take(tier.expand_as(viable), chosen)[..., None])).any(-1)
    settled = shown & (final | ~cheaper_left)
    none = (mean_high < floor).all(-1)
    if reference is not None:  # the unpatched model alone on top, no method even close
        nothing = sole & contenders[..., reference] & ~shown & ~viable.any(-1)
    else:
        nothing = torch.zeros_like(shown)
    code = torch.full(shown.shape, OPEN, dtype=torch.long)
    code = torch.where(nothing, REFERENCE, code)
    code = torch.where(settled, WITHIN, code)
    code = torch.where(better, BETTER, code)
    code = torch.where(none, NONE, code)

    in_race = candidates & contenders
    fallback = _best(mean, torch.where(in_race.any(-1, keepdim=True), in_race, candidates), tier)
    pick = torch.where(shown & ~none & ~nothing, chosen, fallback)
    sampled = wanted & (code == OPEN)[..., None] & (documents < plan.cap)
    above = _take(low[..., :, reference], pick) > 0 if reference is not None else torch.zeros_like(shown)
    useful = _take(mean_low, pick) >= floor
    return Decision(code, pick, contenders, within, sampled, documents, mean, mean_low, mean_high, estimate, low,
                    high, above, useful)


def replay(
    means: torch.Tensor, *, cost: Sequence[int] | torch.Tensor, reference: int | None = None, delta: float = DELTA,
    alpha: float = ALPHA, floor: float = FLOOR, plan: Plan | None = None, keys: int | torch.Tensor | None = None,
    deadline: int | None = None,
) -> Decision:
    """The whole race on documents already measured for every model (document ``t`` the same for all): every model
    gets the first look's documents; after each look the models ``decide`` names get the next look's; it ends when
    decided, at the cap, or after ``deadline`` looks (the last look decided as final). Deterministic in ``means``.

    Shapes:
        means (..., M, D) with D >= the plan's cap -> the last Decision (``documents``: what each model got).
    """
    plan = plan or Plan()
    means = torch.as_tensor(means, dtype=_F64)
    if means.shape[-1] < plan.cap:
        fail("means", tuple(means.shape), f"at least the plan's cap ({plan.cap}) documents")
    looks = plan.looks if deadline is None else plan.looks[:deadline]
    if not looks:
        fail("deadline", deadline, f"None or a look count in [1, {len(plan.looks)}]")
    n = torch.full(means.shape[:-1], looks[0], dtype=torch.long)
    order = torch.arange(means.shape[-1])
    for index in range(len(looks)):
        last = index == len(looks) - 1
        decision = decide(means, order < n[..., None], cost=cost, reference=reference, delta=delta, alpha=alpha,
                          floor=floor, plan=plan, keys=keys, final=last)
        if last:
            break
        n = torch.where(decision.sampled, looks[index + 1], n)
    return decision


# -- prob against found --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RateRelation:
    """How the mean teacher-forced chance relates to the found rate, per model. Shapes: (M,) each."""

    found: torch.Tensor  # the found rate (documents weighing the same)
    prob: torch.Tensor  # the mean chance
    difference: torch.Tensor  # prob - found, paired by key, averaged by document
    low: torch.Tensor  # its clustered interval
    high: torch.Tensor
    prob_found: torch.Tensor  # the mean chance on keys found (NaN: none)
    prob_missed: torch.Tensor  # the mean chance on keys missed (NaN: none)


def rate_relation(
    found: torch.Tensor, prob: torch.Tensor, present: torch.Tensor | None = None, level: float = 1 - ALPHA,
) -> RateRelation:
    """Both means and their paired difference ``prob - found`` with a clustered ``level`` interval (documents the
    clusters; floor at the keys' resolution), plus the chance on keys found and missed: where ``prob`` runs above the
    found rate, greedy decoding loses keys sampling would write; below it, the answer is found with little margin.

    Shapes:
        found, prob (..., M, D, K); present bool like them or None -> RateRelation of (..., M).
    """
    found, prob = torch.as_tensor(found, dtype=_F64), torch.as_tensor(prob, dtype=_F64)
    present = torch.ones_like(found, dtype=torch.bool) if present is None else torch.as_tensor(
        present, dtype=torch.bool).expand_as(found)
    f, p = cluster_means(found, present), cluster_means(prob, present)
    measured = present.any(-1)
    keys = present.sum(-1).clamp(min=1)
    diff, low, high = clustered_interval(torch.where(measured, p - f, 0.0), measured, level,
                                         inverse_keys=1 / keys.to(_F64), signed=True)
    rate_found = clustered_interval(torch.where(measured, f, 0.0), measured, level)[0]
    rate_prob = clustered_interval(torch.where(measured, p, 0.0), measured, level)[0]
    hit, miss = present & (found > 0.5), present & (found <= 0.5)
    on_hit = torch.where(hit, prob, 0.0).sum((-2, -1)) / hit.sum((-2, -1))
    on_miss = torch.where(miss, prob, 0.0).sum((-2, -1)) / miss.sum((-2, -1))
    return RateRelation(rate_found, rate_prob, diff, low, high, on_hit, on_miss)


def clustering(means: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """How much a document's keys move together, pooled over models: ``f = sum s^2 / sum mean (1 - mean)`` (the
    variance of the document means over one key's, each model's weighted by its documents less one; ``_design``'s
    pooled part). With ``K`` keys and an intra-document correlation ``rho`` it is ``(1 + (K - 1) rho) / K``, so
    ``1 / f`` is what a document is worth in independent keys (Kish's effective sample size); NaN where no model
    varies. Pass the models with the same ``K``.

    Shapes:
        means, mask (..., M, D) -> (...).
    """
    means = torch.as_tensor(means, dtype=_F64)
    mask = torch.as_tensor(mask, dtype=torch.bool).expand_as(means)
    n = mask.sum(-1).to(_F64)
    mean = torch.where(mask, means, 0.0).sum(-1) / n.clamp(min=1)
    squares = torch.where(mask, (means - mean[..., None]) ** 2, 0.0).sum(-1)
    needle = (n - 1).clamp(min=0) * mean * (1 - mean)
    total = needle.sum(-1)
    return torch.where(total > 0, squares.sum(-1) / total.clamp(min=1e-300), math.nan)
