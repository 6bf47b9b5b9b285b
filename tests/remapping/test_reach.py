"""Each remapping method's ``reach(L)`` against a brute-force count over its own position maps (the branches the
operator rotates by): the longest length ``S`` at which every causal pair it scores sits at a remapped distance below
the pretraining length ``L`` -- no more (a claimed reach where one pair is at a distance pretraining never saw), and no
less."""

from __future__ import annotations

import math

import pytest
import torch

from posenc.remapping import ReRoPE, SelfExtend, String, remap_method


def largest_distances(method, n: int) -> torch.Tensor:
    """``out[S - 1]``: the largest remapped distance of a pair the method scores in a sequence of ``S`` tokens,
    ``S = 1..n``, counted over the query, key and region maps of its branches, in float64."""
    i = torch.arange(n)[:, None]
    j = torch.arange(n)[None, :]
    causal = j <= i
    row = torch.full((n,), -math.inf, dtype=torch.float64)
    for branch in method.branches():
        region = branch.region(i, j) & causal
        distance = branch.query(i.expand(n, n)).double() - branch.key(j.expand(n, n)).double()
        row = torch.maximum(row, distance.masked_fill(~region, -math.inf).amax(dim=1))
    return torch.cummax(row, dim=0).values  # a sequence of S tokens holds every query below S


def counted_reach(method, original: int, n: int) -> int:
    """The longest ``S <= n`` whose largest scored distance is below ``original``."""
    below = largest_distances(method, n) < original
    return n if bool(below.all()) else int(torch.nonzero(~below)[0])


@pytest.mark.parametrize("original", [5, 16, 23, 40])
def test_self_extend_reach_is_the_counted_one(original):
    """Every window from 1 to past ``L`` (where neighbours alone reach ``L``), every group from 1 (plain RoPE) to 6."""
    for window in range(1, original + 3):
        for group in range(1, 7):
            method = SelfExtend(window=window, group=group)
            claimed = method.reach(original)
            assert claimed == int(claimed)
            assert counted_reach(method, original, int(claimed) + 2 * group + 2) == claimed, method


def test_self_extend_w_mod_g_is_no_longer_claimed():
    """The issue's case: x2 over 64 (W = 16, G = 3) at 160 scores the pair (159, 0) at 159 // 3 + 16 - 5 = 64."""
    method = remap_method("self_extend", original=64, target=128)
    assert method == SelfExtend(window=16, group=3)
    assert method.reach(64) == 159
    assert float(largest_distances(method, 160)[-1]) == 64
    assert remap_method("self_extend", original=64, target=256).reach(64) >= 256  # x4: G 5 reached 255, now G 6


@pytest.mark.parametrize("original", [16, 32, 64])
@pytest.mark.parametrize("factor", [1.5, 2.0, 3.0, 4.0, 5.5])
def test_the_paper_rule_reaches_its_target(original, factor):
    target = math.ceil(original * factor)
    method = remap_method("self_extend", original=original, target=target)
    assert counted_reach(method, original, target) == target
    smaller = SelfExtend(window=method.window, group=method.group - 1)  # the rule takes the smallest group
    assert method.group == 2 or smaller.reach(original) < target


@pytest.mark.parametrize(("offset", "window"), [(10, 4), (20, 4), (32, 8), (7, 3), (5, 2)])
def test_string_reach_is_the_counted_one(offset, window):
    method = String(shifted_offset=offset, local_window=window)
    assert counted_reach(method, 32, int(method.reach(32)) + 8) == method.reach(32)


@pytest.mark.parametrize(("window", "leak"), [(4, 2.19), (8, 1.5), (3, 3.0), (1, 1.01)])
def test_leaky_rerope_never_claims_more_than_the_counted_reach(window, leak):
    """``W + (L - 1 - W) leak + 1``: at most ``leak`` tokens short of the counted reach, never past it."""
    method = ReRoPE(window=window, leak=leak)
    claimed = math.floor(method.reach(32))
    counted = counted_reach(method, 32, claimed + math.ceil(leak) + 8)
    assert claimed <= counted < claimed + leak + 1
