"""XPos against the formula-level torchscale reference, plus its defining properties."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch.testing import assert_close

from posenc.encodings.xpos import XPos, XPosConfig
from posenc.functional.xpos import xpos_scale, xpos_zeta
from reference.xpos import xpos as reference_xpos
from reference.xpos import xpos_factor

LAYOUTS = ("interleaved", "half")


def _positions(kind: str, batch: int, length: int) -> torch.Tensor:
    if kind == "arange":
        return torch.arange(length)
    if kind == "offset":
        return torch.arange(length) + 1000
    if kind == "batched":
        return torch.randint(0, 2000, (batch, length))
    if kind == "float":
        return torch.rand(length, dtype=torch.float64) * 300.0
    raise AssertionError(kind)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("head_dim", [8, 32, 64])
@pytest.mark.parametrize("kind", ["arange", "offset", "batched", "float"])
@pytest.mark.parametrize(("base", "scale_base", "center"), [(10000.0, 512.0, 0.0), (500.0, 64.0, 731.5)])
def test_matches_reference(layout, dtype, head_dim, kind, base, scale_base, center):
    b, h, hkv, s = 2, 4, 2, 7
    q = torch.randn(b, h, s, head_dim, dtype=torch.float64).to(dtype)
    k = torch.randn(b, hkv, s, head_dim, dtype=torch.float64).to(dtype)
    pos = _positions(kind, b, s)
    enc = XPos(head_dim, base=base, scale_base=scale_base, layout=layout, center=center)
    got_q, got_k = enc(q, k, pos)
    kw = dict(scale_base=scale_base, center=center, layout=layout)
    want_q = reference_xpos(q, pos, base=base, **kw).to(dtype)
    want_k = reference_xpos(k, pos, base=base, downscale=True, **kw).to(dtype)
    assert got_q.dtype == dtype and got_k.dtype == dtype
    # Each output is a difference of two terms of size ~factor * |x| (up to 1e6 here), so rounding is relative to
    # the channel's factor, not to the output: compare in units of the factor, with the dtype's default tolerance.
    q_factor, k_factor = xpos_factor(pos, head_dim, **kw), xpos_factor(pos, head_dim, downscale=True, **kw)
    assert_close(got_q.double() / q_factor, want_q.double() / q_factor, **_tolerance(dtype))
    assert_close(got_k.double() / k_factor, want_k.double() / k_factor, **_tolerance(dtype))


def _tolerance(dtype: torch.dtype) -> dict:
    """assert_close's defaults for ``dtype``, for tensors promoted to float64 before comparing."""
    return {
        torch.float64: dict(rtol=1e-7, atol=1e-7),
        torch.float32: dict(rtol=1.3e-6, atol=1e-5),
        torch.bfloat16: dict(rtol=1.6e-2, atol=1e-5),
    }[dtype]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_separate_key_positions_match_reference(layout):
    """Decoding / GQA shapes: 3 queries at the end of a 10-key cache, keys batched per row."""
    q = torch.randn(2, 4, 3, 16, dtype=torch.float64)
    k = torch.randn(2, 2, 10, 16, dtype=torch.float64)
    q_pos = torch.tensor([[7, 8, 9], [20, 21, 22]])
    k_pos = torch.stack((torch.arange(10), torch.arange(13, 23)))
    enc = XPos(16, layout=layout, scale_base=32.0)
    got_q, got_k = enc(q, k, q_pos, k_pos)
    assert_close(got_q, reference_xpos(q, q_pos, scale_base=32.0, layout=layout))
    assert_close(got_k, reference_xpos(k, k_pos, scale_base=32.0, layout=layout, downscale=True))


def test_gradient_matches_reference():
    q = torch.randn(1, 2, 5, 8, dtype=torch.float64, requires_grad=True)
    pos = torch.arange(5) * 37
    grad_out = torch.randn(1, 2, 5, 8, dtype=torch.float64)
    got = XPos(8, scale_base=16.0).rotate_one(q, pos)
    (got_grad,) = torch.autograd.grad(got, q, grad_out)
    want = reference_xpos(q, pos, scale_base=16.0)
    (want_grad,) = torch.autograd.grad(want, q, grad_out)
    assert_close(got_grad, want_grad)


def test_pair_norms_scale_by_zeta_power():
    """Rotation keeps each pair's norm; xPos multiplies it by zeta_i ** (+-(p - center) / scale_base)."""
    d, scale_base, center = 16, 64.0, 5.0
    x = torch.randn(1, 1, 6, d, dtype=torch.float64)
    pos = torch.tensor([0, 3, 50, 200, 999, 4000])
    enc = XPos(d, scale_base=scale_base, center=center)
    q, k = enc(x, x, pos)
    pair_norm = lambda t: t.unflatten(-1, (d // 2, 2)).norm(dim=-1)  # (..., S, D) -> (..., S, D/2)
    factor = xpos_zeta(d) ** ((pos[:, None].double() - center) / scale_base)  # (S, D/2)
    assert_close(pair_norm(q), pair_norm(x) * factor)
    assert_close(pair_norm(k), pair_norm(x) / factor)
    # zeta_i < 1: queries further along shrink, so q_m . k_n decays as m - n grows.
    assert bool((xpos_zeta(d) < 1).all())
    assert_close(xpos_scale(pos, dim=d, scale_base=scale_base, center=center), factor)


def _scores(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    return q @ k.transpose(-1, -2)  # (B, H, S, D) @ (B, H, D, T) -> (B, H, S, T)


@given(
    head_dim=st.sampled_from([2, 4, 8, 12]),
    layout=st.sampled_from(LAYOUTS),
    q_pos=st.lists(st.integers(0, 300), min_size=1, max_size=4),
    k_pos=st.lists(st.integers(0, 300), min_size=1, max_size=4),
    shift=st.integers(-2000, 2000),
    seed=st.integers(0, 2**16),
)
def test_scores_depend_on_distance_only(head_dim, layout, q_pos, k_pos, shift, seed):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(1, 1, len(q_pos), head_dim, dtype=torch.float64, generator=gen)
    k = torch.randn(1, 1, len(k_pos), head_dim, dtype=torch.float64, generator=gen)
    qp, kp = torch.tensor(q_pos), torch.tensor(k_pos)
    enc = XPos(head_dim, layout=layout, scale_base=128.0)
    before = _scores(*enc(q, k, qp, kp))
    after = _scores(*enc(q, k, qp + shift, kp + shift))
    assert_close(after, before, rtol=1e-9, atol=1e-9)


@given(
    head_dim=st.sampled_from([2, 4, 8, 12]),
    positions=st.lists(st.integers(-500, 3000), min_size=1, max_size=5),
    scale_base=st.sampled_from([16.0, 512.0]),
    center=st.sampled_from([0.0, 777.25]),
    seed=st.integers(0, 2**16),
)
def test_layouts_equal_up_to_channel_permutation(head_dim, positions, scale_base, center, seed):
    gen = torch.Generator().manual_seed(seed)
    x_int = torch.randn(1, 2, len(positions), head_dim, dtype=torch.float64, generator=gen)
    pos = torch.tensor(positions)
    # Interleaved pair (2i, 2i+1) is half-layout pair (i, i + D/2).
    to_half = torch.cat((torch.arange(0, head_dim, 2), torch.arange(1, head_dim, 2)))
    kw = dict(scale_base=scale_base, center=center)
    out_int = XPos(head_dim, layout="interleaved", **kw).rotate_one(x_int, pos)
    out_half = XPos(head_dim, layout="half", **kw).rotate_one(x_int[..., to_half], pos)
    assert_close(out_half, out_int[..., to_half])  # not bitwise: interleaved takes a complex multiply


@given(
    head_dim=st.sampled_from([4, 8, 12]),
    layout=st.sampled_from(LAYOUTS),
    positions=st.lists(st.integers(0, 2000), min_size=2, max_size=5),
    center=st.floats(-1500.0, 1500.0).filter(lambda c: abs(c) > 1.0),
    seed=st.integers(0, 2**16),
)
def test_center_cancels_in_scores(head_dim, layout, positions, center, seed):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(1, 1, len(positions), head_dim, dtype=torch.float64, generator=gen)
    k = torch.randn(1, 1, len(positions), head_dim, dtype=torch.float64, generator=gen)
    pos = torch.tensor(positions)
    q0, k0 = XPos(head_dim, layout=layout, scale_base=256.0)(q, k, pos)
    qc, kc = XPos(head_dim, layout=layout, scale_base=256.0, center=center)(q, k, pos)
    assert not torch.allclose(qc, q0) and not torch.allclose(kc, k0)
    assert_close(_scores(qc, kc), _scores(q0, k0), rtol=1e-9, atol=1e-9)


def test_center_keeps_long_positions_in_float32_range():
    """At 100k positions the float32 factors over/underflow; centring at the positions in use keeps them finite."""
    d, s = 64, 4
    q = torch.randn(1, 1, s, d)
    pos = torch.arange(s) + 100_000
    q_far, k_far = XPos(d)(q, q, pos)
    assert not bool(torch.isfinite(k_far).all())
    q_c, k_c = XPos(d, center=100_000.0)(q, q, pos)
    want = _scores(*XPos(d)(q.double(), q.double(), torch.arange(s))).float()
    assert_close(_scores(q_c, k_c), want)


def test_key_positions_default_to_query_positions():
    q, k = torch.randn(2, 4, 5, 8), torch.randn(2, 2, 5, 8)
    pos = torch.randint(0, 100, (2, 5))
    enc = XPos(8)
    got = enc(q, k, pos)
    want = enc.rotate(q, k, pos, pos)
    assert_close(got[0], want[0], rtol=0, atol=0)
    assert_close(got[1], want[1], rtol=0, atol=0)


def test_config_round_trip():
    config = XPosConfig(head_dim=32, base=500.0, scale_base=64.0, layout="half", center=12.5)
    assert XPosConfig.from_dict(config.to_dict()) == config
    assert XPos.from_config(config.to_dict()).config == config
    assert XPos.from_config(config).config == config


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(head_dim=7), "head_dim"),
        (dict(head_dim=0), "head_dim"),
        (dict(head_dim=8, scale_base=0.0), "scale_base"),
        (dict(head_dim=8, scale_base=-512.0), "scale_base"),
        (dict(head_dim=8, scale_base=float("inf")), "scale_base"),
        (dict(head_dim=8, base=1.0), "base"),
        (dict(head_dim=8, center=float("nan")), "center"),
        (dict(head_dim=8, layout="neox"), "layout"),
    ],
)
def test_bad_config(kwargs, match):
    with pytest.raises(ValueError, match=match):
        XPos(**kwargs)
    with pytest.raises(ValueError, match=match):
        XPosConfig(**kwargs)


def test_from_dict_rejects_unknown_keys():
    with pytest.raises(ValueError, match="scale"):
        XPosConfig.from_dict({"head_dim": 8, "scale": 512.0})


def test_bad_inputs():
    enc = XPos(8)
    q, k = torch.randn(2, 4, 5, 8), torch.randn(2, 2, 6, 8)
    pos, k_pos = torch.arange(5), torch.arange(6)
    with pytest.raises(ValueError, match=r"^positions\.shape"):
        enc(q, k, torch.arange(4), k_pos)
    with pytest.raises(ValueError, match=r"^positions\.shape"):
        enc(q, k, torch.zeros(3, 5, dtype=torch.long), k_pos)
    with pytest.raises(ValueError, match=r"^k_positions\.shape"):
        enc(q, k, pos, torch.arange(5))
    with pytest.raises(ValueError, match=r"^k_positions=None .*6 positions and q 5"):
        enc(q, k, pos)  # T = 6 keys, but positions has 5 entries
    with pytest.raises(ValueError, match=r"^q\.shape\[-1\]=16 .*head_dim = 8"):
        enc(torch.randn(2, 4, 5, 16), torch.randn(2, 2, 6, 16), pos, k_pos)
    with pytest.raises(ValueError, match=r"^q\.dim\(\)"):
        enc(q[0], k, pos, k_pos)
    with pytest.raises(ValueError, match=r"^k\.shape\[0\]"):
        enc(q, k[:1], pos, k_pos)
    with pytest.raises(ValueError, match=r"^positions\.dtype"):
        enc(q, k, torch.ones(5, dtype=torch.bool), k_pos)


def test_functional_bad_inputs():
    with pytest.raises(ValueError, match="dim"):
        xpos_zeta(7)
    with pytest.raises(ValueError, match="scale_base"):
        xpos_scale(torch.arange(3), dim=8, scale_base=0.0)


def test_compiles_without_graph_breaks():
    q, k = torch.randn(2, 4, 8, 16), torch.randn(2, 2, 8, 16)
    pos = torch.randint(0, 1000, (2, 8))
    enc = XPos(16, center=300.0)
    got_q, got_k = torch.compile(enc, fullgraph=True)(q, k, pos)
    want_q, want_k = enc(q, k, pos)
    assert_close(got_q, want_q)
    assert_close(got_k, want_k)
