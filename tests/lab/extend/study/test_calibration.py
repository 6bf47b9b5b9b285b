"""The cost model's fit to timed forwards (``cost.calibration_lengths``, ``fit_forward_times``, ``fitted_l0``): what
the study's ETA and the pick's plan extrapolate to long targets."""

from __future__ import annotations

import random

import pytest

from posenc.lab.extend.targets import cost


@pytest.mark.parametrize(
    ("longest", "sizes"),
    [(100, (100,)), (2047, (1024,)), (2048, (1024, 2048)), (3000, (1024, 3000)), (4096, (1024, 4096)),
     (8192, (1024, 4096)), (8193, (1024, 4096, 8192)), (32768, (1024, 4096, 8192))],
)
def test_calibration_times_each_length_at_least_twice_the_last_and_8192_only_beyond_it(longest, sizes):
    assert cost.calibration_lengths(longest) == sizes


@pytest.mark.parametrize("sizes", [(1024, 4096, 8192), (1024, 2048, 4096, 8192)])
def test_the_fit_recovers_linear_and_quadratic_parts_apart_from_a_fixed_cost(sizes):
    c, a, b = 0.05, 8e-4, 3.2e-8
    fit = cost.fit_forward_times([(n, c + a * n + b * n * n) for n in sizes])
    assert fit == pytest.approx((a, b), rel=1e-9)


def test_a_fit_with_no_positive_part_falls_back_to_the_two_longest_points_then_to_none():
    # timing noise made c negative: the two longest points, without c
    points = [(1024, 0.5), (4096, 3.0 + 4096**2 * 1e-8), (8192, 6.0 + 8192**2 * 1e-8)]
    a, b = cost.fit_forward_times(points)
    assert (a, b) == pytest.approx((3.0 / 4096, 1e-8), rel=1e-9)
    assert cost.fit_forward_times([(1024, 1.0), (4096, 3.0)]) is None  # b < 0
    assert cost.fit_forward_times([(1024, 1.0), (4096, 4.0), (8192, 8.0)]) is None  # b = 0: linear
    assert cost.fit_forward_times([(1024, 1.0)]) is None


def test_a_fitted_crossover_is_kept_within_2x_of_the_models_own():
    assert cost.fitted_l0((1e-3, 1e-3 / 15000), 7784) == pytest.approx(15000, rel=1e-12)
    assert cost.fitted_l0((1e-3, 1e-3 / 4000), 7784) == pytest.approx(4000, rel=1e-12)
    assert cost.fitted_l0((1e-3, 1e-3 / 18284), 7784) == 7784  # the Xeon's noisy fits (6,899, 18,284, ~132k)
    assert cost.fitted_l0((1e-3, 1e-3 / 132_000), 7784) == 7784
    assert cost.fitted_l0(None, 7784) == 7784


def test_with_timing_noise_the_estimate_at_4x_the_longest_forward_is_within_1_5x():
    """Seeded simulation of the estimate a study and a pick make: SmolLM2-like costs on the 2-core Xeon (fixed
    0.05 s, 0.5 ms per token, 6.25e-8 s per token squared: a crossover of 8,000 tokens against the model's own 7,784;
    a 20,480-token forward about 36 s, as measured there), each timing off by a Gaussian 10% (single forwards on that
    machine scattered about that much), calibrated at 1024, 4096 and 8192 tokens and scaled to 32,768. With the
    fitted crossover kept only within 2x of the model's, the estimate is within 1.5x of the true time in >= 99% of
    2,000 draws; with any fitted crossover, not even 90% are."""
    c, a, b, length, model_l0 = 0.05, 5e-4, 6.25e-8, 32768, 7784.0

    def within(guarded, rng):
        points = [(n, (c + a * n + b * n * n) * (1 + rng.gauss(0, 0.10))) for n in (1024, 4096, 8192)]
        fit = cost.fit_forward_times(points)
        l0 = cost.fitted_l0(fit, model_l0) if guarded else (fit[0] / fit[1] if fit else model_l0)
        estimate = points[-1][1] * cost.forward_cost(length, l0) / cost.forward_cost(8192, l0)
        return 1 / 1.5 <= estimate / (c + a * length + b * length**2) <= 1.5

    rng = random.Random(0)
    guarded = sum(within(True, rng) for _ in range(2000))
    unguarded = sum(within(False, rng) for _ in range(2000))
    assert guarded >= 0.99 * 2000 and unguarded < 0.9 * 2000
