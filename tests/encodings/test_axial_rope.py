"""AxialRoPE (RoPE-Axial, Heo et al. 2024) against the RoPE-ViT complex-number reference, plus properties."""

import dataclasses

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from posenc.encodings.axial_rope import AxialRoPE, AxialRoPEConfig
from posenc.encodings.rotary import RotaryEmbedding
from posenc.functional.axial_rope import axial_cos_sin, axial_inv_freq, grid_positions
from posenc.functional.rope import default_inv_freq
from reference.rope_vit import apply_rotary_emb, compute_axial_cis, compute_axial_cis_nd, init_t_nd, init_t_xy

GRIDS_2D = [(7, 5), (5, 7), (14, 14), (1, 9)]


def _qk(shape_q, shape_k, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(shape_q, generator=g, dtype=torch.float64).to(dtype)
    k = torch.randn(shape_k, generator=g, dtype=torch.float64).to(dtype)
    return q, k


def _tol(dtype):
    # inv_freq is float32 by the project's convention (as every float32 RoPE), so a float64 run matches the
    # float64 reference to float32 precision, not float64 precision.
    if dtype == torch.bfloat16:
        return {"rtol": 1e-2, "atol": 1e-2}
    return {"rtol": 1.3e-6, "atol": 1e-5}


# ---- positions and frequencies ---------------------------------------------------------------------------------


@pytest.mark.parametrize("end_x, end_y", GRIDS_2D)
def test_grid_positions_match_init_t_xy(end_x, end_y):
    t_x, t_y = init_t_xy(end_x, end_y)
    pos = grid_positions(end_x, end_y)
    assert pos.dtype == torch.float32
    torch.testing.assert_close(pos, torch.stack((t_x, t_y), dim=-1), rtol=0, atol=0)


@pytest.mark.parametrize("sizes", [(4, 3, 2), (2, 5, 3), (3,)])
def test_grid_positions_nd_first_axis_fastest(sizes):
    expected = torch.stack(init_t_nd(*sizes), dim=-1)
    torch.testing.assert_close(grid_positions(*sizes), expected, rtol=0, atol=0)


def test_grid_positions_are_a_row_major_flatten():
    # A (T, H, W) video flattened row-major: token index t*H*W + y*W + x has position (x, y, t).
    w, h, t = 4, 3, 2
    tt, yy, xx = torch.meshgrid(torch.arange(t), torch.arange(h), torch.arange(w), indexing="ij")
    expected = torch.stack((xx, yy, tt), dim=-1).reshape(-1, 3).float()  # (T*H*W, 3)
    torch.testing.assert_close(grid_positions(w, h, t), expected, rtol=0, atol=0)


@pytest.mark.parametrize("head_dim", [8, 16, 64, 96])
@pytest.mark.parametrize("base", [100.0, 10000.0])
def test_axial_inv_freq_2d_matches_rope_vit(head_dim, base):
    # RoPE-ViT: 1 / (theta ** (arange(0, dim, 4)[: dim // 4] / dim)), for x and for y.
    mag = 1.0 / (base ** (torch.arange(0, head_dim, 4, dtype=torch.float64)[: head_dim // 4] / head_dim))
    expected = torch.stack((mag, mag)).float()
    torch.testing.assert_close(axial_inv_freq(head_dim, n_axes=2, base=base), expected)


@pytest.mark.parametrize("head_dim, n_axes", [(12, 3), (48, 3), (16, 1), (16, 4)])
def test_axial_inv_freq_is_default_rope_per_axis(head_dim, n_axes):
    inv = axial_inv_freq(head_dim, n_axes=n_axes, base=100.0)
    expected = default_inv_freq(head_dim // n_axes, base=100.0).expand(n_axes, -1)
    torch.testing.assert_close(inv, expected, rtol=0, atol=0)


# ---- against the RoPE-ViT reference ----------------------------------------------------------------------------


@pytest.mark.parametrize("end_x, end_y", GRIDS_2D)
@pytest.mark.parametrize("head_dim", [16, 64])
@pytest.mark.parametrize("base", [100.0, 10000.0])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_matches_rope_vit_2d(end_x, end_y, head_dim, base, dtype):
    s = end_x * end_y
    q, k = _qk((2, 3, s, head_dim), (2, 1, s, head_dim), dtype)
    cis = compute_axial_cis(head_dim, end_x, end_y, theta=base, dtype=torch.float64)  # (S, D/2)
    ref_q, ref_k = apply_rotary_emb(q.double(), k.double(), cis)
    out_q, out_k = AxialRoPE(head_dim, base=base)(q, k, grid_positions(end_x, end_y))
    assert out_q.dtype == dtype and out_k.dtype == dtype
    torch.testing.assert_close(out_q, ref_q.to(dtype), **_tol(dtype))
    torch.testing.assert_close(out_k, ref_k.to(dtype), **_tol(dtype))


@pytest.mark.parametrize("end_x, end_y", [(7, 5), (14, 14)])
def test_matches_rope_vit_float32_code(end_x, end_y):
    # The paper's own float32 tables: angles up to ~200 rad lose ~1e-5 there, we compute them in float64.
    head_dim, s = 64, end_x * end_y
    q, k = _qk((1, 2, s, head_dim), (1, 2, s, head_dim), torch.float32)
    ref_q, ref_k = apply_rotary_emb(q, k, compute_axial_cis(head_dim, end_x, end_y, theta=100.0))
    out_q, out_k = AxialRoPE(head_dim)(q, k, grid_positions(end_x, end_y))
    torch.testing.assert_close(out_q, ref_q, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(out_k, ref_k, rtol=1e-4, atol=1e-4)


def test_keys_at_their_own_positions():
    head_dim, end_x, end_y = 32, 6, 4
    s = end_x * end_y
    q, k = _qk((2, 2, 5, head_dim), (2, 2, s, head_dim), torch.float64)
    cis = compute_axial_cis(head_dim, end_x, end_y, dtype=torch.float64)  # (S, D/2)
    pick = torch.tensor([3, 0, 23, 11, 7])
    ref_q, _ = apply_rotary_emb(q, q, cis[pick])
    _, ref_k = apply_rotary_emb(k, k, cis)
    pos = grid_positions(end_x, end_y)
    out_q, out_k = AxialRoPE(head_dim)(q, k, pos[pick], k_positions=pos)
    torch.testing.assert_close(out_q, ref_q)
    torch.testing.assert_close(out_k, ref_k)


@pytest.mark.parametrize("sizes", [(4, 3, 2), (2, 5, 3)])
@pytest.mark.parametrize("head_dim", [12, 48])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_matches_reference_3d(sizes, head_dim, dtype):
    s = sizes[0] * sizes[1] * sizes[2]
    q, k = _qk((2, 2, s, head_dim), (2, 2, s, head_dim), dtype)
    cis = compute_axial_cis_nd(head_dim, *sizes, theta=100.0, dtype=torch.float64)  # (S, D/2)
    ref_q, ref_k = apply_rotary_emb(q.double(), k.double(), cis)
    out_q, out_k = AxialRoPE(head_dim, n_axes=3)(q, k, grid_positions(*sizes))
    torch.testing.assert_close(out_q, ref_q.to(dtype), **_tol(dtype))
    torch.testing.assert_close(out_k, ref_k.to(dtype), **_tol(dtype))


def test_one_axis_is_plain_rope():
    q, k = _qk((2, 3, 10, 16), (2, 3, 10, 16), torch.float64)
    pos = torch.arange(10) * 3
    expected = RotaryEmbedding(16, base=100.0, layout="interleaved")(q, k, pos)
    out = AxialRoPE(16, n_axes=1)(q, k, pos.unsqueeze(-1))
    torch.testing.assert_close(out, expected)


# ---- positions: batched, integer, float ------------------------------------------------------------------------


def test_batched_positions_match_per_example():
    head_dim, s = 16, 12
    q, k = _qk((3, 2, s, head_dim), (3, 2, s, head_dim), torch.float64)
    pos = torch.randint(0, 50, (3, s, 2))
    rope = AxialRoPE(head_dim)
    out_q, out_k = rope(q, k, pos)
    for b in range(3):
        eq, ek = rope(q[b : b + 1], k[b : b + 1], pos[b])
        torch.testing.assert_close(out_q[b : b + 1], eq)
        torch.testing.assert_close(out_k[b : b + 1], ek)
    one_q, _ = rope(q, k, pos[:1])  # (1, S, N) broadcasts over the batch
    torch.testing.assert_close(one_q, rope(q, k, pos[0])[0])


def test_integer_and_float_positions_agree():
    q, k = _qk((1, 2, 35, 32), (1, 2, 35, 32), torch.float32)
    rope = AxialRoPE(32)
    pos = grid_positions(7, 5)
    torch.testing.assert_close(rope(q, k, pos.long()), rope(q, k, pos), rtol=0, atol=0)


def test_fractional_positions_match_reference_formula():
    # Resolution interpolation passes fractional grid coordinates; the angle is still position * frequency.
    head_dim = 16
    pos = torch.tensor([[0.5, 0.25], [1.75, 3.5], [2.0, 0.0]], dtype=torch.float64)
    inv = axial_inv_freq(head_dim).double()  # (2, F_a)
    angles = torch.cat((pos[:, :1] * inv[0], pos[:, 1:] * inv[1]), dim=-1)  # (S, F)
    q, k = _qk((1, 1, 3, head_dim), (1, 1, 3, head_dim), torch.float64)
    ref_q, ref_k = apply_rotary_emb(q, k, torch.polar(torch.ones_like(angles), angles))
    out_q, out_k = AxialRoPE(head_dim)(q, k, pos)
    torch.testing.assert_close(out_q, ref_q)
    torch.testing.assert_close(out_k, ref_k)


def test_cos_sin_tables():
    inv = axial_inv_freq(8, n_axes=2, base=100.0)  # (2, 2)
    pos = torch.tensor([[3.0, 5.0]])
    cos, sin = axial_cos_sin(pos, inv)
    angles = torch.tensor([[3.0, 3.0 * 0.1, 5.0, 5.0 * 0.1]], dtype=torch.float64)
    torch.testing.assert_close(cos, angles.cos().float())
    torch.testing.assert_close(sin, angles.sin().float())


# ---- properties ------------------------------------------------------------------------------------------------

AXES_AND_DIMS = st.sampled_from([(1, 8), (2, 8), (2, 32), (3, 12), (3, 48)])


@given(
    axes_dim=AXES_AND_DIMS,
    layout=st.sampled_from(["interleaved", "half"]),
    axis=st.integers(0, 2),
    shift=st.integers(-500, 500),
    seed=st.integers(0, 2**16),
)
def test_shift_along_one_axis_keeps_dot_products(axes_dim, layout, axis, shift, seed):
    n_axes, head_dim = axes_dim
    axis = axis % n_axes
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, 2, 6, head_dim, generator=g, dtype=torch.float64)
    k = torch.randn(1, 2, 9, head_dim, generator=g, dtype=torch.float64)
    q_pos = torch.randint(-20, 20, (6, n_axes), generator=g)
    k_pos = torch.randint(-20, 20, (9, n_axes), generator=g)
    offset = torch.zeros(n_axes, dtype=torch.long)
    offset[axis] = shift
    rope = AxialRoPE(head_dim, n_axes=n_axes, layout=layout)
    rq, rk = rope(q, k, q_pos, k_pos)
    sq, sk = rope(q, k, q_pos + offset, k_pos + offset)
    torch.testing.assert_close(sq @ sk.transpose(-1, -2), rq @ rk.transpose(-1, -2))


@given(axes_dim=AXES_AND_DIMS, layout=st.sampled_from(["interleaved", "half"]), seed=st.integers(0, 2**16))
def test_position_zero_is_identity(axes_dim, layout, seed):
    n_axes, head_dim = axes_dim
    q, k = _qk((2, 2, 5, head_dim), (2, 1, 5, head_dim), torch.float32, seed)
    out_q, out_k = AxialRoPE(head_dim, n_axes=n_axes, layout=layout)(q, k, torch.zeros(5, n_axes))
    torch.testing.assert_close(out_q, q, rtol=0, atol=0)
    torch.testing.assert_close(out_k, k, rtol=0, atol=0)


def _interleaved_to_half(head_dim):
    """Channel ``c`` of the half layout is channel ``perm[c]`` of the interleaved layout."""
    f = head_dim // 2
    return torch.cat((torch.arange(0, 2 * f, 2), torch.arange(1, 2 * f, 2)))


@given(axes_dim=AXES_AND_DIMS, seed=st.integers(0, 2**16))
def test_half_and_interleaved_agree_up_to_channel_permutation(axes_dim, seed):
    n_axes, head_dim = axes_dim
    q, k = _qk((1, 2, 7, head_dim), (1, 2, 7, head_dim), torch.float64, seed)
    pos = torch.randint(-30, 30, (7, n_axes), generator=torch.Generator().manual_seed(seed))
    perm = _interleaved_to_half(head_dim)
    iq, ik = AxialRoPE(head_dim, n_axes=n_axes, layout="interleaved")(q, k, pos)
    hq, hk = AxialRoPE(head_dim, n_axes=n_axes, layout="half")(q[..., perm], k[..., perm], pos)
    torch.testing.assert_close(hq, iq[..., perm])
    torch.testing.assert_close(hk, ik[..., perm])


def test_rotation_keeps_norms():
    q, k = _qk((2, 3, 35, 32), (2, 3, 35, 32), torch.float64)
    out_q, out_k = AxialRoPE(32)(q, k, grid_positions(7, 5) * 10)
    torch.testing.assert_close(out_q.norm(dim=-1), q.norm(dim=-1))
    torch.testing.assert_close(out_k.norm(dim=-1), k.norm(dim=-1))


# ---- config ----------------------------------------------------------------------------------------------------


def test_config_round_trip_and_from_config():
    config = AxialRoPEConfig(head_dim=48, n_axes=3, base=50.0, layout="half")
    assert AxialRoPEConfig.from_dict(config.to_dict()) == config
    rope = AxialRoPE.from_config(config.to_dict())
    assert rope.config == config
    torch.testing.assert_close(rope.inv_freq, axial_inv_freq(48, n_axes=3, base=50.0), rtol=0, atol=0)


def test_config_is_frozen():
    config = AxialRoPEConfig(head_dim=16)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.head_dim = 32


# ---- bad inputs ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"head_dim": 10, "n_axes": 2}, "head_dim"),
        ({"head_dim": 16, "n_axes": 3}, "head_dim"),
        ({"head_dim": 0}, "head_dim"),
        ({"head_dim": 16, "n_axes": 0}, "n_axes"),
        ({"head_dim": 16, "base": 1.0}, "base"),
        ({"head_dim": 16, "layout": "neox"}, "layout"),
    ],
)
def test_bad_config(kwargs, name):
    with pytest.raises(ValueError, match=rf"^{name}="):
        AxialRoPE(**kwargs)


def test_bad_config_key():
    with pytest.raises(ValueError, match=r"^config\['theta'\]"):
        AxialRoPEConfig.from_dict({"head_dim": 16, "theta": 100.0})


def test_axial_inv_freq_not_divisible():
    with pytest.raises(ValueError, match=r"^head_dim="):
        axial_inv_freq(20, n_axes=3)


@pytest.mark.parametrize(
    "positions",
    [
        torch.zeros(35, 3),  # wrong n_axes
        torch.zeros(34, 2),  # wrong S
        torch.zeros(35),  # 1-D: plain RoPE positions, not grid positions
        torch.zeros(3, 35, 2),  # wrong batch
        torch.zeros(1, 1, 35, 2),  # too many dims
    ],
)
def test_bad_positions(positions):
    q, k = _qk((2, 2, 35, 16), (2, 2, 35, 16), torch.float32)
    with pytest.raises(ValueError, match=r"^positions\.shape="):
        AxialRoPE(16)(q, k, positions)


def test_bad_key_positions():
    q, k = _qk((2, 2, 35, 16), (2, 2, 20, 16), torch.float32)
    with pytest.raises(ValueError, match=r"^k_positions\.shape="):
        AxialRoPE(16)(q, k, grid_positions(7, 5), grid_positions(7, 5))


def test_positions_not_a_tensor():
    q, k = _qk((1, 1, 2, 16), (1, 1, 2, 16), torch.float32)
    with pytest.raises(ValueError, match=r"^positions="):
        AxialRoPE(16)(q, k, [[0, 0], [1, 0]])


def test_head_dim_mismatch():
    q, k = _qk((1, 2, 35, 32), (1, 2, 35, 32), torch.float32)
    with pytest.raises(ValueError, match=r"^q\.shape\[-1\]="):
        AxialRoPE(16)(q, k, grid_positions(7, 5))


def test_batch_mismatch_and_rank():
    q, k = _qk((2, 2, 35, 16), (1, 2, 35, 16), torch.float32)
    with pytest.raises(ValueError, match=r"^k\.shape\[0\]="):
        AxialRoPE(16)(q, k, grid_positions(7, 5))
    with pytest.raises(ValueError, match=r"^q\.dim\(\)="):
        AxialRoPE(16)(q[0], k[0], grid_positions(7, 5))


def test_functional_bad_inputs():
    inv = axial_inv_freq(16)
    with pytest.raises(ValueError, match=r"^positions\.shape="):
        axial_cos_sin(torch.zeros(5, 3), inv)
    with pytest.raises(ValueError, match=r"^inv_freq\.shape="):
        axial_cos_sin(torch.zeros(5, 2), inv[0])
    with pytest.raises(ValueError, match=r"^positions\.dtype="):
        axial_cos_sin(torch.zeros(5, 2, dtype=torch.bool), inv)
    with pytest.raises(ValueError, match=r"^dtype="):
        axial_cos_sin(torch.zeros(5, 2), inv, dtype=torch.float16)
    with pytest.raises(ValueError, match=r"^sizes="):
        grid_positions()
    with pytest.raises(ValueError, match=r"^sizes\[1\]="):
        grid_positions(3, 0)
