"""Sinusoidal encodings against Vaswani's formula, MAE's 2-D sin-cos and Hugging Face, plus their properties."""

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from posenc.functional.axial_rope import grid_positions
from posenc.functional.sinusoidal import sinusoidal_2d_encoding, sinusoidal_encoding
from reference.sinusoidal import get_1d_sincos_pos_embed_from_grid, get_2d_sincos_pos_embed, vaswani
from tolerances import ulps

DTYPES = [torch.float64, torch.float32, torch.bfloat16]


def _tol(dtype: torch.dtype) -> dict:
    """For outputs promoted to float64 and compared with the float64 reference. float64: the reference's own
    rounding of ``p / base ** (2i / d)`` at p ~ 1e5 is ~1e-11; other dtypes: the float64 value rounded once (angles
    and sin/cos are float64 whatever the dtype), within one unit roundoff relative, on any CPU."""
    return dict(rtol=0.0, atol=1e-10) if dtype == torch.float64 else ulps(0.5, dtype)


def _positions(kind: str) -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    return {
        "arange": torch.arange(37),
        "large": 100_000 + torch.arange(9) * 997,
        "batched": torch.randint(0, 5000, (3, 11), generator=g),
        "float": torch.rand(13, dtype=torch.float64, generator=g) * 300.0,
    }[kind]


def _vaswani(positions: torch.Tensor, dim: int, base: float) -> torch.Tensor:
    rows = [vaswani(row.tolist(), dim, base) for row in positions.reshape(-1, positions.shape[-1])]
    return torch.from_numpy(np.stack(rows)).reshape(*positions.shape, dim)  # (..., S, D)


# ---- 1-D: Vaswani et al. --------------------------------------------------------------------------------------


@pytest.mark.parametrize("dim", [2, 8, 64, 130])
@pytest.mark.parametrize("base", [10000.0, 500.0])
@pytest.mark.parametrize("kind", ["arange", "large", "batched", "float"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_matches_vaswani_formula(dim, base, kind, dtype):
    pos = _positions(kind)
    got = sinusoidal_encoding(pos, dim, base=base, dtype=dtype)
    assert got.dtype == dtype and got.shape == (*pos.shape, dim)
    torch.testing.assert_close(got.double(), _vaswani(pos, dim, base), **_tol(dtype))


@pytest.mark.parametrize("dim", [4, 32, 768])
def test_matches_hugging_face_distilbert(dim):
    """DistilBERT: ``pos / 10000 ** (2 * (j // 2) / dim)``, sin on even channels, cos on odd (float64 -> float32)."""
    distilbert = pytest.importorskip("transformers.models.distilbert.modeling_distilbert")
    if not hasattr(distilbert, "create_sinusoidal_embeddings"):
        pytest.skip("this transformers has no create_sinusoidal_embeddings")
    n_pos = 512
    expected = distilbert.create_sinusoidal_embeddings(n_pos, dim, out=torch.empty(n_pos, dim))
    torch.testing.assert_close(sinusoidal_encoding(torch.arange(n_pos), dim), expected)


def test_shift_is_a_rotation_of_each_pair():
    """Vaswani et al.'s motivation: PE(p + k) is a fixed linear map (a rotation per pair) of PE(p)."""
    dim, k = 16, 7
    pe = sinusoidal_encoding(torch.arange(40), dim, dtype=torch.float64)  # (S, D)
    shifted = sinusoidal_encoding(torch.arange(40) + k, dim, dtype=torch.float64)
    sin_k, cos_k = sinusoidal_encoding(torch.tensor([k]), dim, dtype=torch.float64)[0].view(-1, 2).unbind(-1)
    s, c = pe[:, 0::2], pe[:, 1::2]  # (S, D/2)
    expected = torch.stack((s * cos_k + c * sin_k, c * cos_k - s * sin_k), dim=-1).flatten(-2)
    torch.testing.assert_close(shifted, expected)


# ---- 2-D: MAE ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("width, height", [(4, 4), (7, 5), (5, 7), (1, 6), (14, 14)])
@pytest.mark.parametrize("dim", [4, 16, 64])
@pytest.mark.parametrize("base", [10000.0, 100.0])
@pytest.mark.parametrize("dtype", DTYPES)
def test_2d_matches_mae(width, height, dim, base, dtype):
    expected = torch.from_numpy(get_2d_sincos_pos_embed(dim, height, width, base))  # (H*W, D)
    got = sinusoidal_2d_encoding(grid_positions(width, height), dim, base=base, dtype=dtype)
    assert got.dtype == dtype and got.shape == (width * height, dim)
    torch.testing.assert_close(got.double(), expected, **_tol(dtype))


def test_2d_x_block_first_on_a_non_square_grid():
    """Token 1 of a 3-wide grid is (x=1, y=0): only the first half (x) moves away from token 0's encoding."""
    got = sinusoidal_2d_encoding(grid_positions(3, 2), 8, dtype=torch.float64)
    x_half, y_half = (got[1] - got[0]).split(4)
    assert x_half.abs().max() > 0.1 and y_half.abs().max() == 0
    x_half, y_half = (got[3] - got[0]).split(4)  # token 3 is (x=0, y=1)
    assert x_half.abs().max() == 0 and y_half.abs().max() > 0.1


def test_2d_is_hugging_face_aimv2_with_axes_swapped():
    """AIMv2 lays out ``[sin y | cos y | sin x | cos x]`` (y first), MAE ``[x | y]``: equal with columns (y, x)."""
    aimv2 = pytest.importorskip("transformers.models.aimv2.modeling_aimv2")
    if not hasattr(aimv2, "build_2d_sinusoidal_position_embedding"):
        pytest.skip("this transformers has no build_2d_sinusoidal_position_embedding")
    width, height, dim = 6, 4, 32
    expected = aimv2.build_2d_sinusoidal_position_embedding(height, width, embed_dim=dim, dtype=torch.float64)
    got = sinusoidal_2d_encoding(grid_positions(width, height).flip(-1), dim, dtype=torch.float64)
    torch.testing.assert_close(got, expected)


@pytest.mark.parametrize("dim", [4, 24])
def test_2d_halves_are_mae_1d_and_vaswani_deinterleaved(dim):
    pos = torch.rand(10, 2, dtype=torch.float64) * 50
    got = sinusoidal_2d_encoding(pos, dim, dtype=torch.float64)
    for axis, half in enumerate(got.split(dim // 2, dim=-1)):
        mae = torch.from_numpy(get_1d_sincos_pos_embed_from_grid(dim // 2, pos[:, axis].numpy()))
        torch.testing.assert_close(half, mae)
        one_d = sinusoidal_encoding(pos[:, axis], dim // 2, dtype=torch.float64)  # (S, D/2), interleaved
        torch.testing.assert_close(half, torch.cat((one_d[:, 0::2], one_d[:, 1::2]), dim=-1))


# ---- properties ---------------------------------------------------------------------------------------------------

batch_st, length_st = st.integers(1, 3), st.integers(1, 9)
dtype_st = st.sampled_from([torch.float32, torch.float64, torch.bfloat16, torch.float16])


@given(half=st.integers(1, 40), batch=batch_st, length=length_st, dtype=dtype_st, two_d=st.booleans())
def test_shape_and_dtype(half, batch, length, dtype, two_d):
    dim = 4 * half if two_d else 2 * half
    fn, tail = (sinusoidal_2d_encoding, (2,)) if two_d else (sinusoidal_encoding, ())
    for shape in ((length, *tail), (batch, length, *tail)):
        out = fn(torch.randint(0, 1000, shape), dim, dtype=dtype)
        assert out.shape == (*shape[: len(shape) - len(tail)], dim) and out.dtype == dtype


@given(
    values=st.lists(st.integers(0, 1 << 20), min_size=1, max_size=8),
    float_dtype=st.sampled_from([torch.float32, torch.float64]),
    two_d=st.booleans(),
)
def test_integer_positions_equal_float_positions(values, float_dtype, two_d):
    ints = torch.tensor(values)
    fn = sinusoidal_2d_encoding if two_d else sinusoidal_encoding
    if two_d:
        ints = torch.stack((ints, ints.flip(0)), dim=-1)  # (S, 2)
    torch.testing.assert_close(fn(ints, 8), fn(ints.to(float_dtype), 8), rtol=0, atol=0)


@given(batch=batch_st, length=length_st, two_d=st.booleans())
def test_shared_positions_equal_batched_positions(batch, length, two_d):
    fn, tail = (sinusoidal_2d_encoding, (2,)) if two_d else (sinusoidal_encoding, ())
    pos = torch.randint(0, 10_000, (length, *tail))
    batched = pos.expand(batch, *pos.shape)  # (B, S) or (B, S, 2)
    torch.testing.assert_close(fn(batched, 12), fn(pos, 12).expand(batch, length, 12), rtol=0, atol=0)


def test_bfloat16_output_is_the_float64_encoding_rounded_once():
    """At large positions a bf16 computation would be off by whole radians; here only the final rounding is bf16."""
    pos = 1_000_000 + torch.arange(16) * 12_345
    got = sinusoidal_encoding(pos, 64, dtype=torch.bfloat16)
    torch.testing.assert_close(got, _vaswani(pos, 64, 10000.0).to(torch.bfloat16), rtol=0, atol=0)


# ---- bad input ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, pattern",
    [
        (dict(dim=7), r"dim=7 is invalid: expected a multiple of 2"),
        (dict(dim=0), r"dim=0 is invalid"),
        (dict(dim=8.0), r"dim=8\.0 is invalid"),
        (dict(dim=8, base=1.0), r"base=1\.0 is invalid"),
        (dict(dim=8, base=float("inf")), r"base=inf is invalid"),
        (dict(dim=8, dtype=torch.int64), r"dtype=torch\.int64 is invalid"),
    ],
)
def test_bad_arguments_1d(kwargs, pattern):
    with pytest.raises(ValueError, match=pattern):
        sinusoidal_encoding(torch.arange(3), **kwargs)


@pytest.mark.parametrize(
    "positions, dim, pattern",
    [
        (torch.arange(3), 6, r"dim=6 is invalid: expected a multiple of 4"),
        (torch.arange(3), 8, r"positions\.shape=torch\.Size\(\[3\]\) is invalid"),
        (torch.zeros(3, 3), 8, r"positions\.shape=.* is invalid: expected \(S, 2\)"),
        (torch.zeros(3, 2, dtype=torch.bool), 8, r"positions\.dtype=torch\.bool is invalid"),
    ],
)
def test_bad_arguments_2d(positions, dim, pattern):
    with pytest.raises(ValueError, match=pattern):
        sinusoidal_2d_encoding(positions, dim)


@pytest.mark.parametrize(
    "positions, pattern",
    [
        (torch.zeros(2, 3, 4), r"positions\.shape=.* is invalid"),
        ([0, 1, 2], r"positions\.shape='list' is invalid"),
        (torch.tensor([True, False]), r"positions\.dtype=torch\.bool is invalid"),
        (torch.zeros(3, dtype=torch.complex64), r"positions\.dtype=torch\.complex64 is invalid"),
    ],
)
def test_bad_positions_1d(positions, pattern):
    with pytest.raises(ValueError, match=pattern):
        sinusoidal_encoding(positions, 8)
