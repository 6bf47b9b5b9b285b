"""ALiBi functions against the paper's ``get_slopes``, BLOOM, CROMA and naive loops, plus their defining properties."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch.testing import assert_close
from transformers.models.bloom.modeling_bloom import build_alibi_tensor

from posenc.functional.alibi import (
    alibi_2d_bias,
    alibi_bias,
    alibi_slopes,
    check_alibi_positions,
    interpolated_slopes,
)
from posenc.functional.axial_rope import grid_positions
from reference.alibi import alibi_2d, alibi_causal, alibi_symmetric, croma_2dalibi, get_slopes
from tolerances import bloom_slopes_rtol

EXACT = {"rtol": 0.0, "atol": 0.0}

# ---- slopes ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("num_heads", range(1, 129))
def test_slopes_match_paper_get_slopes(num_heads):
    expected = torch.tensor(get_slopes(num_heads), dtype=torch.float64).to(torch.float32)
    got = alibi_slopes(num_heads)
    assert got.dtype == torch.float32
    assert_close(got, expected, **EXACT)


def test_slopes_paper_values_for_8_and_16_heads():
    # Paper, section 3: 8 heads -> 1/2, 1/4, ..., 1/256; 16 heads interleave their geometric means, from 1/sqrt(2).
    assert_close(alibi_slopes(8), 2.0 ** -torch.arange(1.0, 9.0), **EXACT)
    assert_close(alibi_slopes(16)[1::2], alibi_slopes(8), **EXACT)
    assert_close(alibi_slopes(16)[0], torch.tensor(2.0**-0.5))


@pytest.mark.parametrize("num_heads", range(1, 129))
def test_slopes_match_bloom(num_heads):
    # BLOOM raises a float32-rounded base to integer powers in float32 (tests/tolerances.bloom_slopes_rtol).
    alibi = build_alibi_tensor(torch.ones(1, 2, dtype=torch.long), num_heads, torch.float32)  # (H, 1, 2)
    slope = alibi[:, 0, 1]  # key position 1: the slope
    assert_close(alibi_slopes(num_heads), slope, rtol=bloom_slopes_rtol(num_heads), atol=0.0)


def _causal_softmax(scores, bias, allowed):
    return torch.softmax((scores + bias).masked_fill(~allowed, float("-inf")), dim=-1)


@pytest.mark.parametrize("num_heads", [5, 8, 12, 16])
def test_causal_bias_softmax_equals_bloom(num_heads):
    b, t = 2, 11
    scores = torch.randn(b, num_heads, t, t)
    bloom = build_alibi_tensor(torch.ones(b, t, dtype=torch.long), num_heads, torch.float32)  # (B*H, 1, T)
    bloom = bloom.view(b, num_heads, 1, t)  # (B, H, 1, T), broadcast over queries
    ours = alibi_bias(torch.arange(t), torch.arange(t), alibi_slopes(num_heads))  # (1, H, T, T)
    causal = torch.ones(t, t, dtype=torch.bool).tril()
    assert_close(_causal_softmax(scores, ours, causal), _causal_softmax(scores, bloom, causal))


def test_causal_bias_softmax_equals_bloom_left_padded():
    # BLOOM numbers the non-padding tokens from 0 (cumsum - 1); the same positions as (B, S) rows give its weights.
    h, t = 6, 9
    mask = torch.ones(2, t, dtype=torch.long)
    mask[1, :3] = 0  # row 1 left-padded by 3
    positions = (mask.cumsum(-1) - 1) * mask  # (B, T)
    scores = torch.randn(2, h, t, t)
    bloom = build_alibi_tensor(mask, h, torch.float32).view(2, h, 1, t)  # (B, H, 1, T)
    ours = alibi_bias(positions, positions, alibi_slopes(h))  # (B, H, T, T)
    allowed = torch.ones(t, t, dtype=torch.bool).tril() & mask.bool()[:, None, None, :]  # (B, 1, T, T)
    got, expected = _causal_softmax(scores, ours, allowed), _causal_softmax(scores, bloom, allowed)
    assert_close(got[0], expected[0])
    assert_close(got[1, :, 3:], expected[1, :, 3:])  # padded queries attend to nothing: NaN rows in both


# ---- biases against the naive loops -----------------------------------------------------------------------------

POSITION_KINDS = ["arange", "offset", "batched", "mixed", "decode", "float32", "float64", "int32"]


def _positions(kind: str, b: int = 2, s: int = 6, t: int = 9):
    g = torch.Generator().manual_seed(1)
    if kind == "arange":
        return torch.arange(s), torch.arange(t)
    if kind == "offset":
        return torch.arange(s) + 100_000, torch.arange(t) + 100_000 - 3
    if kind == "batched":
        return torch.randint(0, 5000, (b, s), generator=g), torch.randint(0, 5000, (b, t), generator=g)
    if kind == "mixed":
        return torch.randint(0, 50, (b, s), generator=g), torch.arange(t).unsqueeze(0)
    if kind == "decode":
        return torch.tensor([t - 1]), torch.arange(t)
    if kind == "float32":
        return torch.rand(s, generator=g) * 300, torch.rand(b, t, generator=g) * 300
    if kind == "float64":
        return torch.rand(b, s, generator=g, dtype=torch.float64) * 1e6, torch.rand(t, generator=g, dtype=torch.float64)
    if kind == "int32":
        return torch.arange(s, dtype=torch.int32), torch.arange(t, dtype=torch.int32) * 7
    raise AssertionError(kind)


@pytest.mark.parametrize("kind", POSITION_KINDS)
@pytest.mark.parametrize("symmetric", [False, True])
@pytest.mark.parametrize("num_heads", [1, 6, 8])
def test_bias_matches_loops(kind, symmetric, num_heads):
    q_pos, k_pos = _positions(kind)
    slopes = alibi_slopes(num_heads)
    got = alibi_bias(q_pos, k_pos, slopes, symmetric=symmetric)
    expected = (alibi_symmetric if symmetric else alibi_causal)(q_pos, k_pos, slopes)
    assert got.dtype == torch.float32 and got.shape == expected.shape
    # Integer positions: exact distances, one rounding of m * d, so bit-exact. Float positions: float32 distances.
    tol = EXACT if not (q_pos.is_floating_point() or k_pos.is_floating_point()) else {"rtol": 1e-6, "atol": 1e-6}
    assert_close(got, expected.to(torch.float32), **tol)


@pytest.mark.parametrize("kind", ["grid", "batched", "float"])
@pytest.mark.parametrize("num_heads", [3, 8])
def test_2d_bias_matches_loops(kind, num_heads):
    g = torch.Generator().manual_seed(2)
    if kind == "grid":
        q_pos = k_pos = grid_positions(5, 3)
    elif kind == "batched":
        q_pos, k_pos = torch.randint(-20, 20, (2, 7, 2), generator=g), torch.randint(-20, 20, (1, 5, 2), generator=g)
    else:
        q_pos, k_pos = torch.rand(7, 2, generator=g) * 30, torch.rand(2, 4, 2, generator=g) * 30
    slopes = alibi_slopes(num_heads)
    expected = alibi_2d(q_pos, k_pos, slopes).to(torch.float32)
    # float32 sqrt, then float32 product: two roundings (as CROMA's), so within an ulp of the exact float64 loops.
    tol = {"rtol": 1e-6, "atol": 1e-6} if kind == "float" else {"rtol": 1.2e-7, "atol": 0.0}
    assert_close(alibi_2d_bias(q_pos, k_pos, slopes), expected, **tol)


@pytest.mark.parametrize("side", [2, 4, 6])
def test_2d_bias_matches_croma(side):
    pos = grid_positions(side, side)  # x fastest; CROMA lists (row, col): the same distances, token for token
    # CROMA multiplies float64 distances by float32 slopes (one rounding); posenc rounds the distance first.
    assert_close(alibi_2d_bias(pos, pos, alibi_slopes(16)), croma_2dalibi(16, side * side), rtol=1.2e-7, atol=0.0)


# ---- interpolation -------------------------------------------------------------------------------------------------

lengths = st.integers(1, 1 << 20)


@given(num_heads=st.integers(1, 64), train_len=lengths, eval_len=lengths)
def test_interpolation_identity_up_to_train_len(num_heads, train_len, eval_len):
    train_len, eval_len = max(train_len, eval_len), min(train_len, eval_len)
    slopes = alibi_slopes(num_heads)
    assert_close(interpolated_slopes(slopes, train_len=train_len, eval_len=eval_len), slopes, **EXACT)


@given(num_heads=st.integers(1, 64), train_len=lengths, extra=st.integers(1, 1 << 20))
def test_interpolation_scales_by_train_over_eval(num_heads, train_len, extra):
    eval_len = train_len + extra
    slopes = alibi_slopes(num_heads)
    got = interpolated_slopes(slopes, train_len=train_len, eval_len=eval_len)
    expected = (slopes.to(torch.float64) * (train_len / eval_len)).to(torch.float32)
    assert_close(got, expected, rtol=1.2e-7, atol=0.0)  # within an ulp of the exact product


@pytest.mark.parametrize("factor", [2, 4, 16])
def test_interpolation_power_of_two_ratio_is_exact(factor):
    slopes = alibi_slopes(12)
    assert_close(interpolated_slopes(slopes, train_len=1024, eval_len=1024 * factor), slopes / factor, **EXACT)


# ---- properties ------------------------------------------------------------------------------------------------------

ints = st.integers(-10_000, 10_000)


def int_positions(n_min=1, n_max=8):
    return st.lists(ints, min_size=n_min, max_size=n_max).map(torch.tensor)


@given(q_pos=int_positions(), k_pos=int_positions(), shift=st.integers(-(10**6), 10**6), symmetric=st.booleans())
def test_bias_depends_only_on_k_minus_q(q_pos, k_pos, shift, symmetric):
    slopes = alibi_slopes(6)
    got = alibi_bias(q_pos + shift, k_pos + shift, slopes, symmetric=symmetric)
    assert_close(got, alibi_bias(q_pos, k_pos, slopes, symmetric=symmetric), **EXACT)


@given(q_pos=int_positions(), k_pos=int_positions())
def test_symmetric_bias_is_symmetric_and_causal_antisymmetric(q_pos, k_pos):
    slopes = alibi_slopes(5)
    sym = alibi_bias(q_pos, k_pos, slopes, symmetric=True)
    assert_close(sym, alibi_bias(k_pos, q_pos, slopes, symmetric=True).transpose(-1, -2), **EXACT)
    causal = alibi_bias(q_pos, k_pos, slopes)
    assert_close(causal, -alibi_bias(k_pos, q_pos, slopes).transpose(-1, -2), **EXACT)
    assert_close(sym, -causal.abs(), **EXACT)


grid_points = st.lists(st.tuples(ints, ints), min_size=1, max_size=8).map(
    lambda p: torch.tensor(p, dtype=torch.float32)
)


@given(q_pos=grid_points, k_pos=grid_points, tx=ints, ty=ints, transform=st.sampled_from(["swap", "rot90", "flip"]))
def test_2d_bias_depends_only_on_distance(q_pos, k_pos, tx, ty, transform):
    slopes = alibi_slopes(4)
    expected = alibi_2d_bias(q_pos, k_pos, slopes)
    shift = torch.tensor([tx, ty], dtype=torch.float32)
    assert_close(alibi_2d_bias(q_pos + shift, k_pos + shift, slopes), expected, **EXACT)
    move = {
        "swap": lambda p: p.flip(-1),  # (x, y) -> (y, x)
        "rot90": lambda p: torch.stack((-p[:, 1], p[:, 0]), dim=-1),  # (x, y) -> (-y, x)
        "flip": lambda p: p * torch.tensor([-1.0, 1.0]),  # (x, y) -> (-x, y)
    }[transform]
    assert_close(alibi_2d_bias(move(q_pos), move(k_pos), slopes), expected, **EXACT)
    assert_close(alibi_2d_bias(k_pos, q_pos, slopes), expected.transpose(-1, -2), **EXACT)


@given(q_pos=int_positions(2, 6), k_pos=int_positions(2, 6), batch=st.integers(1, 3), symmetric=st.booleans())
def test_unbatched_positions_equal_batched(q_pos, k_pos, batch, symmetric):
    slopes = alibi_slopes(3)
    one = alibi_bias(q_pos, k_pos, slopes, symmetric=symmetric)  # (1, H, S, T)
    many = alibi_bias(q_pos.expand(batch, -1), k_pos.expand(batch, -1), slopes, symmetric=symmetric)
    assert_close(many, one.expand(batch, -1, -1, -1), **EXACT)
    assert_close(alibi_bias(q_pos.unsqueeze(0), k_pos, slopes, symmetric=symmetric), one, **EXACT)
    grid = torch.stack((q_pos, q_pos.flip(0)), dim=-1)  # (S, 2)
    assert_close(
        alibi_2d_bias(grid.expand(batch, -1, -1), grid, slopes),
        alibi_2d_bias(grid, grid, slopes).expand(batch, -1, -1, -1),
        **EXACT,
    )


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_positions_are_refused(dtype):
    """float16/bfloat16 cannot hold the integers a sequence reaches (bfloat16: 257 is 256), so positions cast with
    a half-precision model would silently share biases: refused, naming the argument."""
    slopes, good = alibi_slopes(4), torch.arange(4.0)
    half = good.to(dtype)
    with pytest.raises(ValueError, match=rf"^q_pos\.dtype={dtype} .*float32 or torch\.float64"):
        alibi_bias(half, good, slopes)
    with pytest.raises(ValueError, match=rf"^k_pos\.dtype={dtype} "):
        alibi_bias(good, half, slopes, symmetric=True)
    grid = torch.stack((good, good.flip(0)), dim=-1)  # (4, 2)
    with pytest.raises(ValueError, match=rf"^k_pos\.dtype={dtype} "):
        alibi_2d_bias(grid, grid.to(dtype), slopes)


# ---- bad input -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("num_heads", [0, -3, 2.0, True, None])
def test_bad_num_heads(num_heads):
    with pytest.raises(ValueError, match="num_heads"):
        alibi_slopes(num_heads)


@pytest.mark.parametrize(
    ("train_len", "eval_len", "name"), [(0, 8, "train_len"), (8, -1, "eval_len"), (8, 2.5, "eval_len")]
)
def test_bad_interpolation_lengths(train_len, eval_len, name):
    with pytest.raises(ValueError, match=name):
        interpolated_slopes(alibi_slopes(4), train_len=train_len, eval_len=eval_len)


@pytest.mark.parametrize(
    ("q_pos", "k_pos", "name"),
    [
        (torch.zeros(2, 3, 4), torch.arange(4), r"q_pos\.shape"),
        (torch.arange(4), torch.zeros(()), r"k_pos\.shape"),
        (torch.zeros(2, 4), torch.zeros(3, 4), r"k_pos\.shape"),
        ([0, 1, 2], torch.arange(3), "q_pos"),
        (torch.ones(3, dtype=torch.bool), torch.arange(3), r"q_pos\.dtype"),
    ],
)
def test_bad_sequence_positions(q_pos, k_pos, name):
    with pytest.raises(ValueError, match=name):
        alibi_bias(q_pos, k_pos, alibi_slopes(2))


@pytest.mark.parametrize(
    ("q_pos", "k_pos", "name"),
    [
        (torch.zeros(4, 3), torch.zeros(4, 2), r"q_pos\.shape"),
        (torch.zeros(4, 2), torch.zeros(4), r"k_pos\.shape"),
        (torch.zeros(2, 4, 2), torch.zeros(3, 4, 2), r"k_pos\.shape"),
    ],
)
def test_bad_grid_positions(q_pos, k_pos, name):
    with pytest.raises(ValueError, match=name):
        alibi_2d_bias(q_pos, k_pos, alibi_slopes(2))
    with pytest.raises(ValueError, match=name):
        check_alibi_positions(q_pos, k_pos, grid=True)


def test_bad_slopes():
    with pytest.raises(ValueError, match=r"slopes\.shape"):
        alibi_bias(torch.arange(3), torch.arange(3), torch.ones(2, 2))
