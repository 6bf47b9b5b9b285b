"""KERPLE functions against the paper's kernels (float64 loops), the reference code's causal form, and the kernels'
defining properties; gradients against the reference's."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch.testing import assert_close

from posenc.functional.kerple import kerple_bias, kerple_constrained, kerple_init
from reference.kerple import kerple, kerple_repo_causal

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


def _params(kernel, heads=3):
    g = torch.Generator().manual_seed(5)
    r1 = torch.rand(heads, generator=g) * 2 + 0.05
    r2 = torch.rand(heads, generator=g) * (1.9 if kernel == "power" else 1.0) + 0.05
    return r1, r2


@pytest.mark.parametrize("kind", ["shared", "one_row", "batched", "mixed", "float"])
@pytest.mark.parametrize("kernel", ["log", "power"])
def test_bias_matches_the_paper_kernels(kind, kernel):
    q_pos, k_pos = _positions(kind)
    r1, r2 = _params(kernel)
    got = kerple_bias(q_pos, k_pos, r1, r2, kernel=kernel)
    assert got.dtype == torch.float32
    ref = kerple(q_pos, k_pos, r1.double(), r2.double(), kernel)
    assert got.shape == ref.shape
    assert_close(got.double(), ref, rtol=2e-6, atol=1e-5)


@pytest.mark.parametrize("kernel", ["log", "power"])
def test_gradients_match_the_reference(kernel):
    q_pos, k_pos = _positions("batched")
    r1, r2 = (p.requires_grad_() for p in _params(kernel))
    weights = torch.randn(B, 3, S, T, dtype=torch.float64)
    (kerple_bias(q_pos, k_pos, r1, r2, kernel=kernel).double() * weights).sum().backward()
    r1_64, r2_64 = (p.detach().double().requires_grad_() for p in (r1, r2))
    (kerple(q_pos, k_pos, r1_64, r2_64, kernel) * weights).sum().backward()
    assert_close(r1.grad.double(), r1_64.grad, rtol=1e-5, atol=1e-4)
    assert_close(r2.grad.double(), r2_64.grad, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("kernel", ["log", "power"])
def test_matches_the_reference_code_causal_form(kernel):
    """chijames/KERPLE: log ``-bias_p log(1 + bias_a d)``, power ``-bias_a d ** bias_p``, both clamped."""
    bias_p = torch.tensor([2.5, 1.3, 0.004, -0.2])  # above 2 and below 0.01 exercise the bounds
    bias_a = torch.tensor([0.7, 0.001, 0.3, 1.5])
    r1, r2 = (bias_p, bias_a) if kernel == "log" else (bias_a, bias_p)
    pos = torch.arange(12)
    got = kerple_bias(pos, pos, *kerple_constrained(r1, r2, kernel=kernel), kernel=kernel)[0]  # (H, L, L)
    ref = kerple_repo_causal(12, bias_p, bias_a, kernel)
    lower = torch.ones(12, 12, dtype=torch.bool).tril()  # the reference's values above the diagonal are masked
    assert_close(got.double()[:, lower], ref[:, lower], rtol=2e-6, atol=1e-6)


@pytest.mark.parametrize("kernel", ["log", "power"])
def test_constrained_clamps_values_and_passes_gradients_through(kernel):
    raw = torch.tensor([-1.0, 0.004, 0.5, 3.0], requires_grad=True)
    r1, r2 = kerple_constrained(raw, raw, kernel=kernel)
    assert_close(r1, torch.tensor([0.01, 0.01, 0.5, 3.0]), **EXACT)
    assert_close(r2, torch.tensor([0.01, 0.01, 0.5, 2.0 if kernel == "power" else 3.0]), **EXACT)
    weights = torch.tensor([1.0, -2.0, 3.0, 4.0])
    ((r1 + 10 * r2) * weights).sum().backward()
    assert_close(raw.grad, 11 * weights, **EXACT)  # straight through: the identity's gradient, bounds or not


def test_init_draws_as_the_reference():
    torch.manual_seed(1)
    r1, r2 = kerple_init(4096, kernel="log")
    assert r1.dtype == r2.dtype == torch.float32 and r1.shape == r2.shape == (4096,)
    assert r1.min() >= 0 and r1.max() < 2 and r1.max() > 1.95 and r2.min() >= 0 and r2.max() < 1 and r2.max() > 0.97
    r1, r2 = kerple_init(4096, kernel="power")
    assert r1.max() < 1 and r1.max() > 0.97 and r2.max() < 2 and r2.max() > 1.95


@pytest.mark.parametrize("kernel", ["log", "power"])
@given(shift=st.integers(-1000, 100000), s=st.integers(1, 8), t=st.integers(1, 8), batch=st.booleans())
def test_depends_only_on_distance_and_is_symmetric(kernel, shift, s, t, batch):
    g = torch.Generator().manual_seed(s * 31 + t)
    shape = (2, s) if batch else (s,)
    q_pos = torch.randint(0, 500, shape, generator=g)
    k_pos = torch.randint(0, 500, (2, t) if batch else (t,), generator=g)
    r1, r2 = _params(kernel)
    bias = kerple_bias(q_pos, k_pos, r1, r2, kernel=kernel)
    assert_close(kerple_bias(q_pos + shift, k_pos + shift, r1, r2, kernel=kernel), bias, **EXACT)
    # Transposed, elements fall elsewhere in the vectorised loops: SLEEF and libm may differ by an ulp there.
    assert_close(kerple_bias(k_pos, q_pos, r1, r2, kernel=kernel), bias.transpose(-1, -2), rtol=3e-7, atol=0)


@pytest.mark.parametrize("kernel", ["log", "power"])
def test_zero_on_the_diagonal_and_decreasing_with_distance(kernel):
    pos = torch.arange(50)
    bias = kerple_bias(pos[-1:], pos, *_params(kernel), kernel=kernel)[0, :, 0]  # (H, 50): distance 49 .. 0
    assert (bias[:, -1] == 0).all()
    assert (bias[:, 1:] > bias[:, :-1]).all()  # nearer keys get a larger (less negative) bias


def test_bad_input():
    pos = torch.arange(4)
    r1, r2 = _params("log")
    with pytest.raises(ValueError, match=r"kernel='exp'"):
        kerple_bias(pos, pos, r1, r2, kernel="exp")
    with pytest.raises(ValueError, match=r"r1\.shape=\(3, 1\)"):
        kerple_bias(pos, pos, r1[:, None], r2)
    with pytest.raises(ValueError, match=r"r2\.shape=\(2,\)"):
        kerple_bias(pos, pos, r1, r2[:2])
    with pytest.raises(ValueError, match=r"q_pos\.shape"):
        kerple_bias(torch.zeros(2, 2, 2), pos, r1, r2)
    with pytest.raises(ValueError, match=r"k_pos\.dtype"):
        kerple_bias(pos, pos.to(torch.bfloat16), r1, r2)
    with pytest.raises(ValueError, match=r"kernel='linear'"):
        kerple_constrained(r1, r2, kernel="linear")
