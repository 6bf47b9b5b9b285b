"""XPos against the formula-level torchscale reference, plus its defining properties."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch.testing import assert_close

from posenc.encodings.xpos import XPos, XPosConfig
from posenc.functional.rope import apply_rotary, table_dtype
from posenc.functional.xpos import cos_sin_of, xpos_cos_sin, xpos_scale, xpos_zeta
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
    """At 100k positions the float32 factors over/underflow (refused); centring at the positions in use keeps them
    finite and the scores unchanged."""
    d, s = 64, 4
    q = torch.randn(1, 1, s, d)
    pos = torch.arange(s) + 100_000
    with pytest.raises(ValueError, match=r"^positions\[3\]=100003 is invalid"):
        XPos(d)(q, q, pos)
    q_c, k_c = XPos(d, center=100_000.0)(q, q, pos)
    want = _scores(*XPos(d)(q.double(), q.double(), torch.arange(s))).float()
    assert_close(_scores(q_c, k_c), want)


# --------------------------------------------------------------------------------------------------------------
# Position range: one of the factors zeta ** (+-(p - center) / scale_base) leaves the dtype's range

#: floor(xpos_max_distance) at scale_base=512: -ln(finfo.tiny) / ln(7/2) * 512 (zeta_0 = 2/7 for every D).
#: float16 inputs are limited by their output dtype, although their tables are float32.
LIMITS = {torch.float32: 35694, torch.bfloat16: 35694, torch.float16: 3966, torch.float64: 289519}


def _pairs_of_norm(shape: tuple, norm: float, dtype: torch.dtype, layout: str = "interleaved") -> torch.Tensor:
    """Random ``x`` whose every channel pair has the given norm (the factor multiplies the pair's norm)."""
    pairs = (-1, 2) if layout == "interleaved" else (2, -1)  # (2i, 2i + 1) or (i, i + D/2)
    x = torch.randn(*shape, dtype=torch.float64).unflatten(-1, pairs)
    member = -1 if layout == "interleaved" else -2
    return (x / x.norm(dim=member, keepdim=True) * norm).flatten(-2).to(dtype)


def test_default_refuses_positions_past_float32_range():
    """Used to return NaN keys at 40,000 (key factors (7/2) ** (40000/512) = 1e42 overflow float32) silently."""
    q, k = torch.randn(1, 2, 4, 64), torch.randn(1, 1, 4, 64)
    pos = torch.arange(4) + 40_000
    with pytest.raises(ValueError) as error:
        XPos(64)(q, k, pos)
    message = str(error.value)
    assert message.startswith(
        "positions[3]=40003 is invalid: expected |position - center| <= 35694.1 for torch.float32"
    )
    assert "zeta**(±(n - center)/scale_base) overflows/underflows torch.float32" in message


@pytest.mark.parametrize("dtype", list(LIMITS))
@pytest.mark.parametrize("layout", LAYOUTS)
def test_positions_up_to_the_limit_give_finite_outputs(dtype, layout):
    enc = XPos(64, layout=layout)
    limit = LIMITS[dtype]
    assert int(enc.max_distance(dtype)) == limit
    # Within the limit every factor lies in [tiny, 1 / tiny], so pairs of norm below tiny * max (~4) stay finite,
    # and no query or key pair is flushed to zero.
    x = _pairs_of_norm((2, 3, 4, 64), 3.9, dtype, layout)
    pos = torch.tensor([limit, -limit, 0, limit - 1])
    for out in enc(x, x, pos):
        assert out.dtype == dtype
        assert bool(torch.isfinite(out).all())
        pairs = out.unflatten(-1, (32, 2) if layout == "interleaved" else (2, 32))
        assert bool((pairs != 0).any(-1 if layout == "interleaved" else -2).all())


@pytest.mark.parametrize("dtype", list(LIMITS))
def test_the_limit_is_where_the_arithmetic_overflows(dtype):
    """The refusal is not over-cautious: keys whose pairs (norm 3.9) rotate onto a channel stay finite at the limit
    and overflow 25 positions (0.05 * scale_base) past it, on the unchecked path.

    There the largest key factor is (7/2) ** (25/512) = 1.063 times 1 / tiny, past the 4 / 3.9 = 1.026 of headroom.
    """
    enc = XPos(64)
    for position, finite in ((LIMITS[dtype], True), (LIMITS[dtype] + 25, False)):
        pos = torch.tensor([position])
        angles = pos.double()[:, None] * enc.inv_freq.double()  # (1, 32)
        x = (3.9 * torch.stack((angles.cos(), -angles.sin()), dim=-1)).flatten(-2).to(dtype)  # rotates to (3.9, 0)
        cos, sin = cos_sin_of(pos, enc.inv_freq, scale_base=512.0, center=0.0, downscale=True, dtype=table_dtype(dtype))
        assert bool(torch.isfinite(apply_rotary(x, cos, sin, layout="interleaved")).all()) == finite


@pytest.mark.parametrize("dtype", list(LIMITS))
@pytest.mark.parametrize("sign", [1, -1])
def test_positions_past_the_limit_are_refused(dtype, sign):
    enc = XPos(64, center=1000.0)
    q, k = torch.randn(1, 2, 3, 64).to(dtype), torch.randn(1, 1, 3, 64).to(dtype)
    far = 1000 + sign * (LIMITS[dtype] + 1)
    ok, bad = torch.tensor([1000, 1001, 1002]), torch.tensor([1000, far, 1002])
    with pytest.raises(ValueError, match=rf"^positions\[1\]={far} is invalid: .*for {dtype} .*center=1000.0"):
        enc(q, k, bad, ok)
    with pytest.raises(ValueError, match=rf"^k_positions\[1\]={far} is invalid: .*for {dtype}"):
        enc(q, k, ok, bad)
    with pytest.raises(ValueError, match=rf"^positions\[0, 1\]={far} is invalid: .*for {dtype}"):
        enc(q, k, bad[None])  # keys default to the query positions
    with pytest.raises(ValueError, match=rf"^positions\[1\]={far} is invalid"):
        enc.rotate_one(q, bad, downscale=True)


def test_float_positions_and_the_message_bounds():
    """The bounds in the message are rounded inwards: a refused float position is never shown as allowed."""
    enc = XPos(8, scale_base=64.0, center=0.5)
    limit = enc.max_distance(torch.float32)  # 4461.77...
    x = torch.randn(1, 1, 2, 8)
    enc(x, x, torch.tensor([0.5 + limit, 0.5 - limit], dtype=torch.float64))
    with pytest.raises(ValueError) as error:
        enc(x, x, torch.tensor([0.0, 0.5 + limit + 0.01], dtype=torch.float64))
    assert "|position - center| <= 4461.7 for torch.float32 (positions -4461.2 .. 4462.2 with center=0.5" in str(
        error.value
    )


def test_range_is_rechecked_after_an_in_place_change():
    """The extremes are read once per tensor (one host sync for all layers) until the tensor changes."""
    enc, x = XPos(16), torch.randn(1, 1, 4, 16)
    pos = torch.arange(4)
    enc(x, x, pos)
    enc(x, x, pos)
    pos[2] = 50_000
    with pytest.raises(ValueError, match=r"^positions\[2\]=50000"):
        enc(x, x, pos)
    view = torch.arange(8)[:4]
    enc(x, x, view)
    view._base[1] = -50_000  # an in-place change through the base bumps the view's version too
    with pytest.raises(ValueError, match=r"^positions\[1\]=-50000"):
        enc(x, x, view)
    with torch.inference_mode():  # no version counter: checked on every call
        pos = torch.arange(4)
        enc(x, x, pos)
        pos[0] = 50_000
        with pytest.raises(ValueError, match=r"^positions\[0\]=50000"):
            enc(x, x, pos)


def test_functions_refuse_positions_past_their_dtype():
    pos = torch.tensor([0, 289_520])  # past float64's limit; factors are float64
    with pytest.raises(ValueError, match=r"^positions\[1\]=289520 .*for torch\.float64"):
        xpos_scale(pos, dim=8)
    xpos_scale(torch.tensor([0, 289_519]), dim=8)
    inv_freq = XPos(8).inv_freq
    with pytest.raises(ValueError, match=r"^positions\[1\]=35695 .*for torch\.float32"):
        xpos_cos_sin(torch.tensor([0, 35_695]), inv_freq)
    cos, _ = xpos_cos_sin(torch.tensor([0, 35_695]), inv_freq, dtype=torch.float64)
    assert bool(torch.isfinite(cos).all())
    with pytest.raises(ValueError, match=r"^positions\[1\]=-35695 .*for torch\.float32"):
        XPos(8).cos_sin(torch.tensor([0, -35_695]), downscale=True)


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


def test_range_check_is_skipped_where_values_cannot_be_read():
    """Like the finiteness check: no host sync (no graph break) under torch.compile or vmap, none for meta tensors;
    the eager call in the same program refuses the same positions."""
    enc, q = XPos(16), torch.randn(1, 2, 4, 16)
    far = torch.arange(4) + 40_000
    q_far, k_far = torch.compile(enc, fullgraph=True)(q, q, far)
    assert not bool(torch.isfinite(k_far).all())  # what the eager check guards against
    rotated = torch.vmap(lambda p: enc.rotate_one(q[0], p))(far[None])
    assert rotated.shape == (1, 2, 4, 16)
    meta = XPos(16).to("meta")
    meta(q.to("meta"), q.to("meta"), far.to("meta"))
    with pytest.raises(ValueError, match=r"^positions\[3\]=40003"):
        enc(q, q, far)
