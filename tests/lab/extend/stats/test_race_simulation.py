"""The pick's statistics checked like code: seeded simulations of races and screenings with known true needle rates.

Each mix is a set of methods with true retrieval rates (the unpatched model first, a reference never picked), drawn
as needles the way a real pick draws them -- the same needle for every model, so a needle hard for one is harder for
the others (``coupled``: one uniform draw per needle, each model finding it when the draw is under its rate), or
independently. The race and the screening run exactly as ``--pick`` runs them (``posenc.lab.extend.stats.race.race``,
``posenc.lab.extend.pick.racing.replay_screen``), on 2 cells (passkey, RULER) and the cap of 20 the issue asks for.

What must hold (issue 47): a method 0.2 or more worse than the best is picked at most 2% of the time; the 0.9 run-time
patch beats the 0.7 config at least 95% of the time (the cheaper one only when shown within 0.05); screening keeps
the best at least 95% of the time; reported intervals cover the truth at least 95% of the time wherever sampling
stopped; and the race spends fewer needles than a fixed design reaching the same error.
"""

from __future__ import annotations

import functools

import pytest
import torch

from posenc.lab.extend.pick import racing
from posenc.lab.extend.stats import race

CAP = 20
#: (name, true rates -- the unpatched model first --, serving tiers: 0 a config every engine reads ... 3 a patch)
MIXES = [
    ("0.9 patch vs 0.7 config", [0.0, 0.9, 0.7], [9, 3, 0]),
    ("0.9 vs three 0.7", [0.0, 0.9, 0.7, 0.7, 0.7], [9, 3, 0, 0, 1]),
    ("0.9 vs four 0.6", [0.0, 0.9, 0.6, 0.6, 0.6, 0.6], [9, 3, 0, 0, 1, 3]),
    ("a mix like the H200 race at 16k", [0.0, 0.5, 0.75, 1.0, 0.5], [9, 0, 0, 3, 3]),
]


def _needles(rates, reps, cap, *, coupled, seed, cells=2):
    rates = torch.as_tensor(rates, dtype=torch.float64)
    m = rates.shape[0]
    g = torch.Generator().manual_seed(seed)
    u = torch.rand(reps, 1, cells, cap, generator=g).expand(reps, m, cells, cap) if coupled else torch.rand(
        reps, m, cells, cap, generator=g)
    return (u < rates[:, None, None]).to(torch.float64)


def _race(rates, tiers, *, coupled, reps=1000, cap=CAP, seed=0):
    """The needles, verdict and counts of ``reps`` seeded races; each run once per process (its tensors are only
    read): a mix's pick test and interval test, and the patch-vs-config test, share their races."""
    return _raced(tuple(rates), tuple(tiers), coupled, reps, cap, seed)


@functools.cache
def _raced(rates, tiers, coupled, reps, cap, seed):  # noqa: ANN001, ANN202
    x = _needles(rates, reps, cap, coupled=coupled, seed=seed)
    reference = torch.tensor([True] + [False] * (len(rates) - 1))
    v, n = race.race(x, torch.tensor(tiers), reference, cap)
    return x, v, n


@pytest.mark.parametrize("coupled", [True, False])
@pytest.mark.parametrize(("name", "rates", "tiers"), MIXES, ids=[m[0] for m in MIXES])
def test_a_method_02_worse_is_picked_at_most_2_percent(name, rates, tiers, coupled):
    _, v, _ = _race(rates, tiers, coupled=coupled)
    truth = torch.tensor(rates)
    worse = (truth.max() - truth[v.pick] >= 0.2 - 1e-9).to(torch.float64).mean()
    assert worse <= 0.02, f"{name}: {float(worse):.3f}"
    assert not bool((v.pick == 0).any())  # the unpatched reference is never picked


@pytest.mark.parametrize("coupled", [True, False])
def test_the_better_patch_beats_the_cheaper_config_unless_shown_equivalent(coupled):
    """0.9 as a run-time patch against 0.7 as a config every engine reads: the old rule (ties by overlapping
    intervals go to the cheaper) picked the 0.7 in 71.5% of races. The config may win only by being shown within
    0.05 of the patch -- which at a true gap of 0.2 happens in at most alpha of races."""
    _, v, _ = _race([0.0, 0.9, 0.7], [9, 3, 0], coupled=coupled)
    assert (v.pick == 1).to(torch.float64).mean() >= 0.95
    assert (v.shown & (v.pick == 2)).to(torch.float64).mean() <= race.ALPHA


@pytest.mark.parametrize("coupled", [True, False])
@pytest.mark.parametrize(("name", "rates", "tiers"), MIXES, ids=[m[0] for m in MIXES])
def test_reported_intervals_cover_wherever_the_race_stopped(name, rates, tiers, coupled):
    x, v, n = _race(rates, tiers, coupled=coupled)
    truth = torch.tensor(rates, dtype=torch.float64)
    low, high = race.pooled_interval(x, n)
    covered = ((low <= truth) & (truth <= high)).to(torch.float64).mean()
    assert covered >= 0.95, f"{name}: {float(covered):.3f}"
    cell_low, cell_high = race.rate_interval((x * (torch.arange(CAP) < n[..., None, None])).sum(-1),
                                             n[..., None].expand(-1, -1, 2))
    per_cell = ((cell_low <= truth[:, None]) & (truth[:, None] <= cell_high)).to(torch.float64).mean()
    assert per_cell >= 0.95


def test_fewer_needles_than_a_fixed_design_with_the_same_error():
    """0.9 against four at 0.6, cap 40: racing stops sampling the clearly worse ones; every model to the cap (the
    fixed design, best estimate picked) spends 6 x 2 x 40 needles for no lower error."""
    rates, tiers = [0.0, 0.9, 0.6, 0.6, 0.6, 0.6], [9, 3, 0, 0, 1, 3]
    x, v, n = _race(rates, tiers, coupled=False, cap=40, reps=500)
    truth = torch.tensor(rates)
    raced_error = (truth[v.pick] < truth.max()).to(torch.float64).mean()
    fixed = race.best_estimate(race.pooled(x, torch.full_like(n, 40)), torch.tensor(rates) > -1, torch.tensor(tiers))
    fixed_error = (truth[fixed] < truth.max()).to(torch.float64).mean()
    spent, fixed_spent = n.sum(1).to(torch.float64).mean() * 2, 6 * 2 * 40
    assert raced_error <= fixed_error + 0.01
    assert spent < 0.8 * fixed_spent, f"{float(spent):.0f} of {fixed_spent}"


def _screen(rates, *, coupled, reps, seed=0):
    """``replay_screen`` on simulated passkeys at the screening length (one cell): the survivors of each screening."""
    x = _needles(rates, reps, racing.SCREEN_CAP, coupled=coupled, seed=seed, cells=1)
    field = racing.Field([(str(i),) for i in range(len(rates))], [("passkey", 0, 0.5)], racing.SCREEN_CAP)
    counts = torch.full((len(rates),), racing.SCREEN_CAP)
    return [racing.replay_screen(field, x[r : r + 1], counts) for r in range(reps)]


@pytest.mark.parametrize("coupled", [True, False])
@pytest.mark.parametrize(
    ("name", "rates"),
    [("0.9 among twelve 0.6", [0.9] + [0.6] * 12), ("0.9 and 0.8 among eleven 0.6", [0.9, 0.8] + [0.6] * 11),
     ("0.9 among twelve 0.7", [0.9] + [0.7] * 12)],
    ids=["0.9-vs-12x0.6", "0.9-0.8-vs-11x0.6", "0.9-vs-12x0.7"],
)
def test_screening_keeps_the_best_95_percent(name, rates, coupled):
    """The old screening (four passkeys each, the best four by rank) cut the best of 0.9 among twelve at 0.6 before
    the race in 20.6% of picks."""
    looks = _screen(rates, coupled=coupled, reps=200)
    kept = torch.tensor([bool(look.look[0]) for look in looks]).to(torch.float64).mean()
    assert kept >= 0.95, f"{name}: {float(kept):.3f}"
    assert all(not look.wanted for look in looks)  # every screening finished on the needles given


@pytest.mark.parametrize("rates", [[0.9, 0.6, 0.2], [0.7, 0.7, 0.5], [1.0, 0.0, 0.5]])
def test_a_studys_cells_stopped_by_the_rule_report_intervals_that_cover(rates):
    """``posenc extend --stop-width`` (not the pick): each cell stops once its interval is disjoint from its group's
    best or at most 0.3 wide (``sampling.decided``). With Wilson's fixed-n interval the audit found 91.5-93.5%
    coverage, and 0% for cells stopped at n = 4 for being clearly below the best; the anytime-valid interval the rule
    now uses and reports covers at least 95% wherever a cell stopped."""
    from posenc.lab.extend.stats.confidence import rate_interval

    reps, cap, width = 2000, 20, 0.3
    truth = torch.tensor(rates, dtype=torch.float64)
    x = _needles(rates, reps, cap, coupled=False, seed=5, cells=1)[:, :, 0]  # (R, M, N)
    n = torch.full((reps, len(rates)), 4)
    stopped = torch.zeros(reps, len(rates), dtype=torch.bool)
    for _ in range(cap // 4):
        hits = (x * (torch.arange(cap) < n[..., None])).sum(-1)
        low, high = rate_interval(hits, n)
        best = (hits / n).argmax(1)
        best_low, best_high = low.gather(1, best[:, None]), high.gather(1, best[:, None])
        disjoint = (high < best_low) | (low > best_high)
        stopped |= (high - low <= width) | disjoint | (n >= cap)
        n = torch.where(stopped, n, n + 4)
    hits = (x * (torch.arange(cap) < n[..., None])).sum(-1)
    low, high = rate_interval(hits, n)
    covered = (low <= truth) & (truth <= high)
    assert covered.to(torch.float64).mean() >= 0.95
    early = n <= 4
    if early.any():
        assert covered[early].to(torch.float64).mean() >= 0.95


def test_the_plans_tied_race_expects_the_needles_a_race_spends_within_1_5x():
    """The plan's expectation of the race (``racing.tied_race``: LUCB on a tie, the pick and its strongest challenger
    to the cap) against the mean needles the race spends on each mix, simulated: within 1.5x either way, the issue's
    bound for the plan's time. On a tie the reference needs 3 rounds to be shown below, the others 1-2."""
    assert racing.tied_race(4, 2, CAP).tolist() == [12, 20, 20, 8, 8]
    for name, rates, tiers in MIXES:
        _, _, n = _race(rates, tiers, coupled=True, reps=300)
        spent = float(n.sum(1).double().mean())
        expected = float(racing.tied_race(len(rates) - 1, 2, CAP).sum())
        assert 1 / 1.5 <= expected / spent <= 1.5, f"{name}: expected {expected}, simulated mean {spent:.1f}"
