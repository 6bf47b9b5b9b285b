"""Sandwich functions against dot products of sinusoidal embeddings (float64, Vaswani's formula), the per-head
frequencies, and the bias's defining properties: a function of the distance, 0 at distance 0, compression ratios."""

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch.testing import assert_close

from posenc.functional.sandwich import sandwich_bias, sandwich_frequencies, sandwich_kernel, sandwich_ratios
from reference.sandwich import sandwich
from tolerances import gamma, ulps, unit_roundoff

EXACT = {"rtol": 0.0, "atol": 0.0}
B, S, T = 2, 5, 7


def _positions(kind):
    g = torch.Generator().manual_seed(3)
    return {
        "shared": (torch.arange(S) + 10, torch.arange(T) + 6),
        "one_row": (torch.arange(S).unsqueeze(0) + 2, torch.arange(T).unsqueeze(0) * 3),
        "batched": (torch.randint(0, 1000, (B, S), generator=g), torch.randint(0, 1000, (B, T), generator=g)),
        "mixed": (torch.randint(0, 1000, (B, S), generator=g), torch.arange(T)),
        "float": (torch.rand(S, generator=g, dtype=torch.float64) * 100, torch.rand(B, T, generator=g) * 100),
    }[kind]


def _tolerance(q_pos, k_pos):
    """float32 angles: each term's error grows as ``distance * 2**-24``-ish (see posenc.functional.sandwich)."""
    reach = float(q_pos.double().abs().max() + k_pos.double().abs().max())
    return {"rtol": 0.0, "atol": 1e-5 + 1e-7 * reach}


@pytest.mark.parametrize("kind", ["shared", "one_row", "batched", "mixed", "float"])
@pytest.mark.parametrize(("pe_dim", "ratios"), [(128, None), (128, "ones"), (16, (0.5, 3.0, 7.25)), (2, None)])
def test_bias_is_the_embeddings_dot_product_minus_half_the_dimension(kind, pe_dim, ratios):
    q_pos, k_pos = _positions(kind)
    ratios = sandwich_ratios(3) if ratios is None else (1.0, 1.0, 1.0) if ratios == "ones" else ratios
    got = sandwich_bias(q_pos, k_pos, sandwich_frequencies(pe_dim, ratios))
    assert got.dtype == torch.float32
    ref = sandwich(q_pos, k_pos, pe_dim=pe_dim, ratios=list(ratios))
    assert got.shape == ref.shape
    assert_close(got.double(), ref, **_tolerance(q_pos, k_pos))


@pytest.mark.parametrize("distance", [1000, 10**4, 10**5])
def test_error_stays_within_the_documented_bound_at_long_distances(distance):
    q_pos, k_pos = torch.tensor([distance]), torch.tensor([0, 1, distance // 3, distance - 1])
    got = sandwich_bias(q_pos, k_pos, sandwich_frequencies(128, sandwich_ratios(4)))
    assert_close(
        got.double(), sandwich(q_pos, k_pos, pe_dim=128, ratios=list(sandwich_ratios(4))), rtol=0, atol=1e-7 * distance
    )


def test_frequencies_and_default_ratios():
    assert sandwich_ratios(8) == (1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0)  # 8h/H
    assert sandwich_ratios(4) == (2.0, 4.0, 6.0, 8.0)
    assert sandwich_ratios(16)[:2] == (0.5, 1.0)
    freqs = sandwich_frequencies(8, (1.0, 4.0), base=100.0)
    assert freqs.dtype == torch.float32 and freqs.shape == (2, 4)
    expected = [[100.0 ** (-2 * k / 8) / r for k in range(4)] for r in (1.0, 4.0)]
    assert_close(freqs, torch.tensor(expected, dtype=torch.float64).float(), **EXACT)


def test_a_ratio_compresses_distances():
    """Head ratio ``r`` at distance ``r d`` is head ratio 1 at distance ``d`` (exactly, for powers of two)."""
    x = torch.arange(40)
    compressed = sandwich_bias(4 * x[-5:], 4 * x, sandwich_frequencies(32, (4.0,)))
    assert_close(compressed, sandwich_bias(x[-5:], x, sandwich_frequencies(32, (1.0,))), **EXACT)


@given(shift=st.integers(-1000, 100000), s=st.integers(1, 8), t=st.integers(1, 8), batch=st.booleans())
def test_depends_only_on_distance(shift, s, t, batch):
    g = torch.Generator().manual_seed(s * 31 + t)
    q_pos = torch.randint(0, 500, (2, s) if batch else (s,), generator=g)
    k_pos = torch.randint(0, 500, (2, t) if batch else (t,), generator=g)
    freqs = sandwich_frequencies(64, sandwich_ratios(3))
    bias = sandwich_bias(q_pos, k_pos, freqs)
    assert_close(sandwich_bias(q_pos + shift, k_pos + shift, freqs), bias, **EXACT)
    # Transposed, elements fall elsewhere in the vectorised loops: SLEEF and libm may differ by an ulp of each sine
    # there (4 u relative), 8 u on its square; every term has the bias's sign, so the sum keeps that relative bound.
    assert_close(sandwich_bias(k_pos, q_pos, freqs), bias.transpose(-1, -2), **ulps(4.5))


def test_zero_on_the_diagonal_negative_elsewhere():
    pos = torch.arange(300)
    bias = sandwich_bias(pos, pos, sandwich_frequencies(128, sandwich_ratios(8)))[0]  # (H, L, L)
    assert (bias.diagonal(dim1=-2, dim2=-1) == 0).all()
    off = ~torch.eye(300, dtype=torch.bool)
    assert (bias[:, off] < 0).all()
    assert bias.min() >= -128  # each of the 64 terms cos(x) - 1 lies in [-2, 0]


def test_kernel_sums_cosines():
    d = torch.tensor([0.0, 1.0, 2.5, 40.0])
    freqs = torch.tensor([1.0, 0.1, 0.01])
    got = sandwich_kernel(d, freqs * 0.5)
    expected = [sum(math.cos(x * f) - 1 for f in freqs.tolist()) for x in d.tolist()]
    # Per term: the float32 angle rounds once (u |angle|, and |d(cos - 1)/d angle| <= 1), sin, square and doubling
    # 3 u |term|; the float32 sum of the terms 2 gamma(F) sum |term|.
    u, f = unit_roundoff(), len(freqs)
    angle = [sum(u * abs(x * w) for w in freqs.tolist()) for x in d.tolist()]
    size = [sum(abs(math.cos(x * w) - 1) for w in freqs.tolist()) for x in d.tolist()]
    atol = torch.tensor(angle) + (3 * u + 2 * gamma(f)) * torch.tensor(size)
    assert ((got.double() - torch.tensor(expected, dtype=torch.float64)).abs() <= atol).all()


def test_bad_input():
    pos = torch.arange(4)
    with pytest.raises(ValueError, match=r"pe_dim=7"):
        sandwich_frequencies(7, (1.0,))
    with pytest.raises(ValueError, match=r"pe_dim=0"):
        sandwich_frequencies(0, (1.0,))
    with pytest.raises(ValueError, match=r"base=1\.0"):
        sandwich_frequencies(8, (1.0,), base=1.0)
    with pytest.raises(ValueError, match=r"ratios\[1\]=0\.0"):
        sandwich_frequencies(8, (1.0, 0.0))
    with pytest.raises(ValueError, match=r"ratios=\(\)"):
        sandwich_frequencies(8, ())
    with pytest.raises(ValueError, match=r"ratios='12'"):
        sandwich_frequencies(8, "12")
    with pytest.raises(ValueError, match=r"frequencies\.shape=\(4,\)"):
        sandwich_bias(pos, pos, torch.ones(4))
    with pytest.raises(ValueError, match=r"q_pos\.dtype"):
        sandwich_bias(pos.half(), pos, torch.ones(2, 4))
    with pytest.raises(ValueError, match=r"num_heads=0"):
        sandwich_ratios(0)


@pytest.mark.parametrize(("num_heads", "head_dim", "s", "t"), [(8, 64, 24, 24), (4, 16, 5, 40), (12, 128, 33, 33)])
def test_nemo_form_is_posenc_with_its_frequencies_times_its_head_scale(num_heads, head_dim, s, t):
    """NVIDIA NeMo's Sandwich, written out (``tests/reference/sandwich_nemo.py``), as a second reference: its
    frequencies ``k = 1..d'/2`` are posenc's with ratio ``10000 ** (2/d')`` (every head), and its head ``n`` divides
    that bias by ``8n/H`` where posenc's default divides the distance. So, full tensors:
    ``nemo[n] * (8n/H) == sandwich_bias(ratios=[10000 ** (2/d')] * H, pe_dim=d')[n]``. Where the two readings differ
    (compressing the distance vs scaling the bias) is documented in ``posenc.functional.sandwich``."""
    from reference.sandwich_nemo import nemo_sandwich

    nemo = nemo_sandwich(s, t, num_heads=num_heads, head_dim=head_dim)
    scale = torch.tensor([8.0 * n / num_heads for n in range(1, num_heads + 1)], dtype=torch.float64)
    ratios = [10000.0 ** (2.0 / head_dim)] * num_heads
    got = sandwich_bias(torch.arange(t - s, t), torch.arange(t), sandwich_frequencies(head_dim, ratios))[0]
    assert_close(got.double(), nemo * scale[:, None, None], **_tolerance(torch.arange(t), torch.arange(t)))
    # posenc's default (distance / r_h) is another function of the head than NeMo's (bias / r_h): not equal past h=1
    default = sandwich_bias(
        torch.arange(t - s, t), torch.arange(t), sandwich_frequencies(head_dim, sandwich_ratios(num_heads))
    )[0].double()
    assert (default[-1] - nemo[-1]).abs().max() > 0.1
