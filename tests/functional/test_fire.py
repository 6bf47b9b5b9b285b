"""FIRE functions against the paper's equations (float64 loops) and its listing's matrix form, gradients for every
parameter, and progressive interpolation: invariant to shifts below the threshold, normalised beyond it."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import nn
from torch.testing import assert_close

from posenc.functional.fire import fire_bias, fire_normalized_distance, fire_threshold
from reference.fire import fire, fire_listing
from tolerances import mlp_atol

EXACT = {"rtol": 0.0, "atol": 0.0}
B, S, T, H, W = 2, 4, 6, 3, 5


def _positions(kind):
    g = torch.Generator().manual_seed(3)
    return {
        "shared": (torch.arange(S) + 30, torch.arange(T) + 28),  # queries on both sides of the threshold, 31.6
        "batched": (torch.randint(0, 80, (B, S), generator=g), torch.randint(0, 80, (B, T), generator=g)),
        "mixed": (torch.randint(0, 80, (1, S), generator=g), torch.arange(T)),
        "float": (torch.rand(S, generator=g, dtype=torch.float64) * 80, torch.rand(B, T, generator=g) * 80),
    }[kind]


def _params(requires_grad=False, dtype=torch.float32):
    g = torch.Generator().manual_seed(7)
    params = {
        "c": torch.tensor(0.3),
        "L_multiplier": torch.tensor(-0.79),  # threshold |L_multiplier * init_L| = 31.6: the sign is dropped
        "w1": torch.randn(W, generator=g),
        "b1": torch.randn(W, generator=g),
        "w2": torch.randn(H, W, generator=g),
        "b2": torch.randn(H, generator=g),
    }
    return {k: v.to(dtype).requires_grad_(requires_grad) for k, v in params.items()}


INIT_L, EPS = 40.0, 1e-6


def _bias(q_pos, k_pos, p):
    threshold = fire_threshold(p["L_multiplier"], init_L=INIT_L)
    return fire_bias(q_pos, k_pos, p["c"], threshold, p["w1"], p["b1"], p["w2"], p["b2"], eps=EPS)


def _reference(q_pos, k_pos, p):
    return fire(q_pos, k_pos, init_L=INIT_L, eps=EPS, **p)


@pytest.mark.parametrize("kind", ["shared", "batched", "mixed", "float"])
def test_bias_matches_the_paper_equation(kind):
    q_pos, k_pos = _positions(kind)
    p = _params()
    got = _bias(q_pos, k_pos, p)
    assert got.dtype == torch.float32
    ref = _reference(q_pos, k_pos, {k: v.double() for k, v in p.items()})
    assert got.shape == ref.shape
    assert_close(got.double(), ref, rtol=0, atol=mlp_atol(p["w1"], p["b1"], p["w2"], p["b2"]))


def test_matches_the_listing_matrix_form():
    torch.manual_seed(2)
    mlp = nn.Sequential(nn.Linear(1, 32), nn.ReLU(), nn.Linear(32, 4))
    c, multiplier = torch.tensor(0.1), torch.tensor(1.0)
    pos = torch.arange(70)
    with torch.no_grad():
        got = fire_bias(
            pos,
            pos,
            c,
            fire_threshold(multiplier, init_L=50.0),
            mlp[0].weight[:, 0],
            mlp[0].bias,
            mlp[2].weight,
            mlp[2].bias,
            eps=1e-6,
        )
        ref = fire_listing(70, mlp, c, multiplier, 50.0, 1e-6)
    # the listing sums over the 32 units with a matmul, in another order
    assert_close(got, ref, rtol=0, atol=mlp_atol(mlp[0].weight[:, 0], mlp[0].bias, mlp[2].weight, mlp[2].bias))


def test_gradients_match_the_reference_for_every_parameter():
    q_pos, k_pos = _positions("shared")  # some queries below the threshold: L_multiplier gets a gradient
    p = _params(requires_grad=True)
    weights = torch.randn(1, H, S, T, dtype=torch.float64)
    (_bias(q_pos, k_pos, p).double() * weights).sum().backward()
    p64 = {k: v.detach().double().requires_grad_() for k, v in p.items()}
    (_reference(q_pos, k_pos, p64) * weights).sum().backward()
    for name in p:
        assert p[name].grad is not None and p[name].grad.abs().sum() > 0, name
        assert_close(p[name].grad.double(), p64[name].grad, rtol=1e-4, atol=1e-5, msg=name)


@given(shift=st.integers(-30, 30), s=st.integers(1, 6), extra=st.integers(0, 6))
def test_shift_invariant_while_queries_stay_below_the_threshold(shift, s, extra):
    k_pos = torch.arange(35 - s - extra, 35)  # queries at most 34 + shift <= 64, the threshold below
    q_pos = k_pos[extra:]
    p = _params()
    p["L_multiplier"] = torch.tensor(1.6)  # threshold 64
    assert_close(_bias(q_pos + shift, k_pos + shift, p), _bias(q_pos, k_pos, p), **EXACT)


def test_beyond_the_threshold_distances_are_normalised_by_the_query_position():
    c, threshold = torch.tensor(0.2), torch.tensor(16.0)
    q = torch.tensor([[100.0], [1000.0]])
    k = torch.tensor([[0.0, 50.0, 100.0], [0.0, 500.0, 1000.0]])
    x = fire_normalized_distance(q, k, c, threshold, eps=0.0)
    expected = torch.log1p(c * (q - k)) / torch.log1p(c * q)  # psi(i - j) / psi(i): the farthest key at 1
    assert_close(x, expected, **EXACT)
    assert_close(x[:, 0], torch.ones(2), **EXACT)
    p = _params()
    shifted = _bias(torch.arange(200, 204), torch.arange(196, 202), p)
    assert not torch.equal(shifted, _bias(torch.arange(100, 104), torch.arange(96, 102), p))


@given(q=st.integers(0, 10**6), frac=st.floats(0.0, 1.0), c=st.floats(1e-3, 10.0), threshold=st.floats(0.0, 4096))
def test_causal_normalised_distance_lies_in_the_unit_interval(q, frac, c, threshold):
    k = int(q * frac)
    x = fire_normalized_distance(torch.tensor(q), torch.tensor(k), torch.tensor(c), torch.tensor(threshold), eps=1e-6)
    assert 0.0 <= float(x) <= 1.0


def test_bad_input():
    pos = torch.arange(4)
    p = _params()
    t = fire_threshold(p["L_multiplier"], init_L=INIT_L)
    args = [p["c"], t, p["w1"], p["b1"], p["w2"], p["b2"]]
    for i, (bad, match) in enumerate(
        [
            (torch.ones(1), r"c\.shape=\(1,\)"),
            (torch.ones(2), r"threshold\.shape=\(2,\)"),
            (torch.ones(W, 1), r"w1\.shape=\(5, 1\)"),
            (torch.ones(W + 1), r"b1\.shape=\(6,\)"),
            (torch.ones(H, W + 1), r"w2\.shape=\(3, 6\)"),
            (torch.ones(H + 1), r"b2\.shape=\(4,\)"),
        ]
    ):
        with pytest.raises(ValueError, match=match):
            fire_bias(pos, pos, *args[:i], bad, *args[i + 1 :])
    with pytest.raises(ValueError, match=r"c=torch\.int64"):
        fire_bias(pos, pos, torch.tensor(1), *args[1:])
    with pytest.raises(ValueError, match=r"eps=-1"):
        fire_bias(pos, pos, *args, eps=-1)
    with pytest.raises(ValueError, match=r"q_pos\.dtype"):
        fire_bias(pos.half(), pos, *args)
    with pytest.raises(ValueError, match=r"init_L=-2"):
        fire_threshold(torch.tensor(1.0), init_L=-2)
