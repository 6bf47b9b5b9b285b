"""Table resizing against hand-written linear / bicubic interpolation (PyTorch's conventions), plus properties."""

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from posenc.functional.learned import resize_table_1d, resize_table_2d
from reference.resize import bicubic_antialias_resize, bicubic_resize, linear_resize
from tolerances import bicubic_atol, unit_roundoff

DTYPES = [torch.float32, torch.float64, torch.bfloat16]


def _tol(dtype: torch.dtype) -> dict:
    """For float64-promoted outputs vs the float64 reference: ``tests/tolerances.bicubic_atol`` (linear resizing has
    fewer taps; antialiased downsampling has more but runs in float64 here), max|table| < 5 (checked in _table);
    bfloat16 rounds the result once more (u relative)."""
    if dtype == torch.float64:
        return dict(rtol=1e-12, atol=1e-12)
    atol = bicubic_atol(5.0)
    return dict(rtol=unit_roundoff(dtype) if dtype == torch.bfloat16 else 0.0, atol=atol)


def _table(*shape: int, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    table = torch.randn(*shape, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    assert table.abs().max() < 5.0  # what _tol assumes
    return table.to(dtype)


@pytest.mark.parametrize("length, new_len", [(8, 16), (8, 13), (16, 8), (7, 3), (5, 5), (1, 4), (6, 1), (2, 3)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_linear_matches_reference(length, new_len, dtype):
    table = _table(length, 6, dtype=dtype)
    got = resize_table_1d(table, new_len)
    assert got.dtype == dtype and got.shape == (new_len, 6) and got.is_contiguous()
    expected = torch.from_numpy(linear_resize(table.double().numpy(), new_len))
    torch.testing.assert_close(got.double(), expected, **_tol(dtype))


SIZES_2D = [
    ((4, 4), (8, 8)),  # (W, H) -> (W', H')
    ((7, 5), (11, 9)),
    ((5, 7), (3, 4)),
    ((14, 14), (24, 24)),
    ((6, 3), (6, 3)),
    ((1, 5), (4, 2)),
    ((3, 2), (1, 1)),
]


@pytest.mark.parametrize("old, new", SIZES_2D)
@pytest.mark.parametrize("dtype", DTYPES)
def test_bicubic_matches_reference(old, new, dtype):
    (w, h), (new_w, new_h) = old, new
    table = _table(h, w, 5, dtype=dtype)  # (H, W, D)
    got = resize_table_2d(table, (new_w, new_h))
    assert got.dtype == dtype and got.shape == (new_h, new_w, 5) and got.is_contiguous()
    expected = torch.from_numpy(bicubic_resize(table.double().numpy(), new_h, new_w))
    torch.testing.assert_close(got.double(), expected, **_tol(dtype))


@pytest.mark.parametrize("old, new", SIZES_2D)
def test_bicubic_antialias_matches_reference(old, new):
    """timm's ``resample_abs_pos_embed`` default: Pillow's a = -0.5 filter, different from MAE's also upsampling."""
    (w, h), (new_w, new_h) = old, new
    table = _table(h, w, 5)
    got = resize_table_2d(table, (new_w, new_h), antialias=True)
    expected = torch.from_numpy(bicubic_antialias_resize(table.numpy(), new_h, new_w))
    torch.testing.assert_close(got, expected, **_tol(torch.float64))


def test_antialias_differs_when_enlarging():
    table = _table(5, 7, 3)
    plain, smooth = resize_table_2d(table, (11, 9)), resize_table_2d(table, (11, 9), antialias=True)
    assert (plain - smooth).abs().max() > 1e-2


def test_matches_a_vit_pos_embed_resize():
    """The MAE / DeiT recipe on a flat ``(1, H*W, D)`` pos_embed: reshape (H, W), resize, flatten row-major."""
    w, h, new_w, new_h, d = 6, 4, 9, 7, 8
    pos_embed = _table(1, h * w, d, dtype=torch.float32)
    table = pos_embed.reshape(h, w, d)  # token y * W + x -> table[y, x]
    flat = resize_table_2d(table, (new_w, new_h)).reshape(1, new_h * new_w, d)
    expected = torch.from_numpy(bicubic_resize(table.double().numpy(), new_h, new_w)).reshape(1, -1, d)
    torch.testing.assert_close(flat.double(), expected, **_tol(torch.float32))


# ---- properties ---------------------------------------------------------------------------------------------------

size_st = st.integers(1, 12)


@given(length=size_st, dim=st.integers(1, 5), dtype=st.sampled_from(DTYPES))
def test_same_length_is_identity(length, dim, dtype):
    table = _table(length, dim, dtype=dtype)
    torch.testing.assert_close(resize_table_1d(table, length), table, rtol=0, atol=0)


@given(w=size_st, h=size_st, dim=st.integers(1, 4), dtype=st.sampled_from(DTYPES))
def test_same_size_is_identity(w, h, dim, dtype):
    table = _table(h, w, dim, dtype=dtype)
    torch.testing.assert_close(resize_table_2d(table, (w, h)), table, rtol=0, atol=0)


@given(w=st.integers(2, 10), h=size_st, new_w=st.integers(2, 16), new_h=size_st)
def test_orientation_x_stays_x(w, h, new_w, new_h):
    """A table that varies only along x (the width, fastest axis) still varies only along x after resizing."""
    profile = _table(1, w, 3)  # (1, W, D)
    table = profile.expand(h, w, 3)  # (H, W, D), constant along y
    out = resize_table_2d(table, (new_w, new_h))
    assert out.shape == (new_h, new_w, 3)
    torch.testing.assert_close(out, out[:1].expand_as(out), rtol=1e-12, atol=1e-12)  # constant along y
    torch.testing.assert_close(out[0], resize_table_2d(profile, (new_w, 1))[0], rtol=1e-12, atol=1e-12)
    assert (out[:, 1:] - out[:, :-1]).abs().max() > 1e-3  # and still varies along x


@given(w=size_st, h=st.integers(2, 10), new_w=size_st, new_h=st.integers(2, 16))
def test_orientation_y_stays_y(w, h, new_w, new_h):
    table = _table(h, 1, 3).expand(h, w, 3)  # constant along x
    out = resize_table_2d(table, (new_w, new_h))
    torch.testing.assert_close(out, out[:, :1].expand_as(out), rtol=1e-12, atol=1e-12)
    assert (out[1:] - out[:-1]).abs().max() > 1e-3


@given(length=st.integers(2, 10), new_len=st.integers(1, 30))
def test_linear_stays_inside_the_table_range(length, new_len):
    table = _table(length, 4)
    out = resize_table_1d(table, new_len)
    assert (out <= table.max(0).values + 1e-12).all() and (out >= table.min(0).values - 1e-12).all()


# ---- bad input ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "table, new_len, pattern",
    [
        (torch.zeros(4, 2), 0, r"new_len=0 is invalid"),
        (torch.zeros(4, 2), 2.0, r"new_len=2\.0 is invalid"),
        (torch.zeros(4, 2, 1), 3, r"table\.shape=.* is invalid: expected \(L, D\)"),
        (torch.zeros(4, 2, dtype=torch.int64), 3, r"table\.dtype=torch\.int64 is invalid"),
    ],
)
def test_bad_arguments_1d(table, new_len, pattern):
    with pytest.raises(ValueError, match=pattern):
        resize_table_1d(table, new_len)


@pytest.mark.parametrize(
    "table, new_size, kwargs, pattern",
    [
        (torch.zeros(3, 4, 2), (0, 3), {}, r"new_size\[0\]=0 is invalid"),
        (torch.zeros(3, 4, 2), (3, -1), {}, r"new_size\[1\]=-1 is invalid"),
        (torch.zeros(3, 4, 2), (3,), {}, r"new_size=\(3,\) is invalid: expected a pair \(W, H\)"),
        (torch.zeros(3, 4, 2), 5, {}, r"new_size=5 is invalid"),
        (torch.zeros(3, 4, 2), "ab", {}, r"new_size='ab' is invalid"),
        (torch.zeros(12, 2), (3, 4), {}, r"table\.shape=.* is invalid: expected \(H, W, D\)"),
        (torch.zeros(3, 4, 2), (3, 4), {"antialias": 1}, r"antialias=1 is invalid"),
    ],
)
def test_bad_arguments_2d(table, new_size, kwargs, pattern):
    with pytest.raises(ValueError, match=pattern):
        resize_table_2d(table, new_size, **kwargs)


def test_reference_is_not_f_interpolate():
    """Guard: the reference module must stay independent of torch (it is the oracle)."""
    import reference.resize as ref

    assert "torch" not in vars(ref) and isinstance(ref.linear_resize(np.ones((2, 1)), 3), np.ndarray)
