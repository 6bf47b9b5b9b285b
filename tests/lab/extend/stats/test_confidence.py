"""Anytime-valid confidence sequences, checked by seeded simulation against known true rates: coverage at every look
at once (so under any stopping rule) at least 95%, the bounds where the formulas put them, and paired differences
deciding sooner than unpaired rates would."""

from __future__ import annotations

import math

import pytest
import torch

from posenc.lab.common.report import wilson_interval
from posenc.lab.extend.stats.confidence import (
    difference_interval,
    disagreement_interval,
    probability_best,
    rate_interval,
)

LOOKS = torch.arange(4, 201, 4)  # a race's looks: after every round of 4, up to 200 samples


def _bernoulli(p, reps, n, seed):
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(reps, n, generator=g) < p).to(torch.float64)


@pytest.mark.parametrize("p", [0.02, 0.3, 0.7, 0.97])
def test_rate_interval_covers_at_every_look_at_once(p):
    """P(the true rate is outside the interval at ANY of 50 looks) <= 5%: any stopping rule reports a valid one."""
    x = _bernoulli(p, 2000, 200, seed=1)
    hits = torch.cumsum(x, 1)[:, LOOKS - 1]
    low, high = rate_interval(hits, LOOKS.to(torch.float64).expand_as(hits))
    missed = ((low > p) | (high < p)).any(1).to(torch.float64).mean()
    assert missed <= 0.05


def test_fixed_n_wilson_does_not_survive_optional_stopping():
    """Why the sequence is needed: stopping at the first look where Wilson's 95% interval excludes the truth would
    report a wrong interval far more often than 5% (Wilson's formula, ``wilson_interval``, vectorised here)."""
    p, z = 0.7, 1.959963984540054
    x = _bernoulli(p, 4000, 200, seed=2)
    n = LOOKS.to(torch.float64)
    rate = torch.cumsum(x, 1)[:, LOOKS - 1] / n
    centre = (rate + z * z / (2 * n)) / (1 + z * z / n)
    half = z * torch.sqrt(rate * (1 - rate) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    assert wilson_interval(float(rate[0, 0]), 4) == pytest.approx((float(centre[0, 0] - half[0, 0]),
                                                                    float(centre[0, 0] + half[0, 0])), abs=1e-12)
    missed = ((centre - half > p) | (centre + half < p)).any(1).to(torch.float64).mean()
    assert missed > 0.15


def test_rate_interval_is_the_mixture_boundary():
    """At each bound the beta-binomial mixture's likelihood ratio equals 1/alpha; inside it is below."""
    hits, n, alpha = 13.0, 20, 0.05
    low, high = (float(x) for x in rate_interval(hits, n, alpha))

    def log_ratio(p):
        s, f, a, b = hits, n - hits, 0.5, 0.5
        mix = math.lgamma(a + s) + math.lgamma(b + f) - math.lgamma(a + b + n) - (
            math.lgamma(a) + math.lgamma(b) - math.lgamma(a + b))
        return mix - s * math.log(p) - f * math.log(1 - p)

    assert log_ratio(low) == pytest.approx(math.log(1 / alpha), abs=1e-9)
    assert log_ratio(high) == pytest.approx(math.log(1 / alpha), abs=1e-9)
    assert log_ratio(hits / n) < math.log(1 / alpha)
    assert 0 < low < hits / n < high < 1


def test_rate_interval_ends_and_partial_credit():
    assert [float(x) for x in rate_interval(0, 10)][0] == 0.0 and float(rate_interval(10, 10)[1]) == 1.0
    assert [float(x) for x in rate_interval(0, 0)] == [0.0, 1.0]
    low, high = rate_interval(2.5, 4)  # RULER's fractional scores
    assert 0 < float(low) < 2.5 / 4 < float(high) < 1


@pytest.mark.parametrize(("pa", "pb", "coupled"), [(0.9, 0.7, True), (0.9, 0.7, False), (0.8, 0.8, False),
                                                   (0.5, 0.45, True)])
def test_difference_interval_covers_at_every_look_at_once(pa, pb, coupled):
    reps = 2000
    g = torch.Generator().manual_seed(3)
    u = torch.rand(reps, 200, generator=g)
    a = (u < pa).to(torch.float64)
    b = (u < pb).to(torch.float64) if coupled else (torch.rand(reps, 200, generator=g) < pb).to(torch.float64)
    d = a - b  # every look at once, from the running counts (difference_interval's own arithmetic)
    wins, disagree = torch.cumsum(d > 0, 1)[:, LOOKS - 1], torch.cumsum(d != 0, 1)[:, LOOKS - 1]
    low, high = disagreement_interval(wins, disagree, LOOKS)
    _, low_last, high_last = difference_interval(a, b)
    assert torch.equal(low_last, low[:, -1]) and torch.equal(high_last, high[:, -1])
    missed = ((low > pa - pb) | (high < pa - pb)).any(1)
    assert missed.to(torch.float64).mean() <= 0.05


def test_paired_needles_decide_sooner_than_independent_ones():
    """0.9 against 0.7 on the same needles (a needle hard for one is hard for the other) is shown better at n = 80
    nearly always; on independent needles much less often."""
    g = torch.Generator().manual_seed(4)
    u = torch.rand(2000, 80, generator=g)
    _, low, _ = difference_interval((u < 0.9).to(torch.float64), (u < 0.7).to(torch.float64))
    paired = (low > 0).to(torch.float64).mean()
    v = torch.rand(2000, 80, generator=g)
    _, low, _ = difference_interval((u < 0.9).to(torch.float64), (v < 0.7).to(torch.float64))
    independent = (low > 0).to(torch.float64).mean()
    assert paired > 0.95 and independent < 0.7


def test_difference_interval_of_partial_credit_and_of_nothing():
    a = torch.tensor([1.0, 0.5, 0.25, 1.0])
    b = torch.tensor([0.0, 0.5, 0.75, 1.0])
    estimate, low, high = difference_interval(a, b)
    assert float(estimate) == pytest.approx(0.125) and -1 <= float(low) < 0.125 < float(high) <= 1
    estimate, low, high = difference_interval(torch.zeros(0), torch.zeros(0))
    assert (float(estimate), float(low), float(high)) == (0.0, -1.0, 1.0)


def test_probability_best_and_expected_loss():
    p, loss = probability_best(torch.tensor([18.0, 14.0, 5.0]), torch.tensor([20.0, 20.0, 20.0]))
    assert float(p.sum()) == pytest.approx(1.0)
    assert float(p[0]) > 0.9 and float(p[2]) < 1e-3
    assert float(loss[0]) < float(loss[1]) < float(loss[2])
    again = probability_best(torch.tensor([18.0, 14.0, 5.0]), torch.tensor([20.0, 20.0, 20.0]))
    assert torch.equal(again[0], p)  # deterministic


def test_probability_best_is_the_posterior_integral():
    """The quadrature against 10^6 seeded posterior draws: within 4 standard errors of the draws (the quadrature's
    own error is far smaller); identical posteriors get identical chances, so ties stay ties."""
    hits, n = torch.tensor([18.0, 14.0, 5.0, 18.0, 20.0]), torch.tensor([20.0, 20.0, 20.0, 20.0, 24.0])
    p, loss = probability_best(hits, n)
    g = torch.Generator().manual_seed(7)
    draws = torch._standard_gamma((1 + hits).expand(10**6, 5).contiguous(), generator=g)
    draws = draws / (draws + torch._standard_gamma((1 + n - hits).expand(10**6, 5).contiguous(), generator=g))
    wins = torch.nn.functional.one_hot(draws.argmax(-1), 5).to(torch.float64).mean(0)
    regret = draws.max(-1).values[:, None] - draws
    assert (p - wins).abs().max() <= 4 * (wins * (1 - wins) / 10**6).sqrt().max() + 1e-9
    assert (loss - regret.mean(0)).abs().max() <= 4 * (regret.std(0) / 10**3).max()
    assert p[0] == p[3] and loss[0] == loss[3]
    equal, _ = probability_best(torch.full((13,), 4.0), torch.full((13,), 4.0))
    assert torch.allclose(equal, torch.full((13,), 1 / 13, dtype=torch.float64), rtol=0, atol=1e-12)
