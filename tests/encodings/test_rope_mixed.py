"""RoPEMixed (RoPE-Mixed, Heo et al. 2024) against the RoPE-ViT complex-number reference: init, forward, gradients."""

import dataclasses

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from posenc.encodings.axial_rope import AxialRoPE
from posenc.encodings.rope_mixed import RoPEMixed, RoPEMixedConfig
from posenc.functional.axial_rope import grid_positions
from posenc.functional.rope import apply_rotary, default_inv_freq
from posenc.functional.rope_mixed import init_mixed_freqs, mixed_angles, mixed_cos_sin
from reference.rope_vit import apply_rotary_emb, compute_mixed_cis, init_random_2d_freqs, init_t_xy


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _qk(shape_q, shape_k, dtype, seed=0):
    g = _gen(seed)
    q = torch.randn(shape_q, generator=g, dtype=torch.float64).to(dtype)
    k = torch.randn(shape_k, generator=g, dtype=torch.float64).to(dtype)
    return q, k


def _reference(q, k, freqs, end_x, end_y):
    """RoPE-ViT's forward in float64: compute_mixed_cis on the init_t_xy grid, then apply_rotary_emb."""
    t_x, t_y = init_t_xy(end_x, end_y, dtype=torch.float64)
    cis = compute_mixed_cis(freqs.to(torch.float64), t_x, t_y, freqs.shape[1])  # (H, S, F)
    return apply_rotary_emb(q, k, cis)


# ---- initialisation --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("head_dim, num_heads", [(16, 3), (64, 6), (4, 1)])
@pytest.mark.parametrize("base", [10.0, 100.0])
@pytest.mark.parametrize("seed", [0, 7])
def test_init_matches_rope_vit(head_dim, num_heads, base, seed):
    ours = init_mixed_freqs(head_dim, num_heads, base=base, generator=_gen(seed))
    exact = init_random_2d_freqs(head_dim, num_heads, theta=base, generator=_gen(seed), dtype=torch.float64)
    paper = init_random_2d_freqs(head_dim, num_heads, theta=base, generator=_gen(seed))  # the paper's float32 code
    assert ours.shape == (2, num_heads, head_dim // 2) and ours.dtype == torch.float32
    torch.testing.assert_close(ours, exact.float())
    torch.testing.assert_close(ours, paper)
    module = RoPEMixed(head_dim, num_heads, base=base, generator=_gen(seed))
    assert isinstance(module.freqs, torch.nn.Parameter) and module.freqs.requires_grad
    torch.testing.assert_close(module.freqs.detach(), ours, rtol=0, atol=0)


def test_init_uses_global_rng_without_generator():
    torch.manual_seed(3)
    ours = init_mixed_freqs(32, 4)
    torch.manual_seed(3)
    torch.testing.assert_close(ours, init_random_2d_freqs(32, 4))


def test_per_layer_init_matches_rope_vit_loop():
    # RoPE-ViT draws every block's frequencies in turn; one module per layer from one generator does the same.
    depth, head_dim, num_heads = 4, 32, 3
    g = _gen(11)
    layers = [RoPEMixed(head_dim, num_heads, generator=g) for _ in range(depth)]
    g = _gen(11)
    expected = [init_random_2d_freqs(head_dim, num_heads, generator=g, dtype=torch.float64) for _ in range(depth)]
    for layer, ref in zip(layers, expected, strict=True):
        torch.testing.assert_close(layer.freqs.detach(), ref.float())
    assert not torch.equal(layers[0].freqs, layers[1].freqs)


@pytest.mark.parametrize("head_dim, base", [(16, 10.0), (64, 100.0)])
def test_rotate_false_init_is_axial(head_dim, base):
    mag = default_inv_freq(head_dim // 2, base=base)  # (F/2,) = RoPE-ViT's 1/(theta**(arange(0, D, 4)/D))
    zeros = torch.zeros_like(mag)
    expected = torch.stack(
        (torch.cat((mag, zeros)).expand(3, -1), torch.cat((zeros, mag)).expand(3, -1))
    )  # (2, H, F): x moves the first half of the pairs, y the second
    freqs = RoPEMixed(head_dim, 3, base=base, rotate=False).freqs.detach()
    torch.testing.assert_close(freqs, expected, rtol=0, atol=0)
    # The paper's float32 code leaves cos(pi/2) = -4.4e-8 where we have exact zeros.
    torch.testing.assert_close(freqs, init_random_2d_freqs(head_dim, 3, theta=base, rotate=False))


def test_rotate_false_equals_axial_rope():
    q, k = _qk((2, 4, 35, 32), (2, 4, 35, 32), torch.float32)
    pos = grid_positions(7, 5)
    mixed = RoPEMixed(32, 4, base=10.0, rotate=False)(q, k, pos)
    axial = AxialRoPE(32, base=10.0)(q, k, pos)
    torch.testing.assert_close(mixed, axial)


def test_reset_parameters_redraws_reproducibly():
    module = RoPEMixed(16, 2, generator=_gen(5))
    with torch.no_grad():
        module.freqs.zero_()
    module.reset_parameters(generator=_gen(5))
    torch.testing.assert_close(module.freqs.detach(), init_mixed_freqs(16, 2, generator=_gen(5)), rtol=0, atol=0)


# ---- forward against the reference -----------------------------------------------------------------------------


@pytest.mark.parametrize("end_x, end_y", [(7, 5), (5, 7), (14, 14)])
@pytest.mark.parametrize("head_dim, num_heads", [(16, 2), (64, 3)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_forward_matches_rope_vit(end_x, end_y, head_dim, num_heads, dtype):
    s = end_x * end_y
    q, k = _qk((2, num_heads, s, head_dim), (2, num_heads, s, head_dim), dtype)
    rope = RoPEMixed(head_dim, num_heads, generator=_gen(1))
    ref_q, ref_k = _reference(q.double(), k.double(), rope.freqs.detach(), end_x, end_y)
    with torch.no_grad():
        out_q, out_k = rope(q, k, grid_positions(end_x, end_y))
    assert out_q.dtype == dtype and out_k.dtype == dtype
    tol = {"rtol": 1e-2, "atol": 1e-2} if dtype == torch.bfloat16 else {}
    torch.testing.assert_close(out_q, ref_q.to(dtype), **tol)
    torch.testing.assert_close(out_k, ref_k.to(dtype), **tol)


def test_forward_with_trained_freqs_copied_in():
    # Arbitrary (e.g. trained) frequencies: copy the same tensor into both.
    freqs = torch.randn(2, 3, 8, generator=_gen(2), dtype=torch.float64)
    rope = RoPEMixed(16, 3).double()
    with torch.no_grad():
        rope.freqs.copy_(freqs)
    q, k = _qk((1, 3, 20, 16), (1, 3, 20, 16), torch.float64)
    ref_q, ref_k = _reference(q, k, freqs, 5, 4)
    out_q, out_k = rope(q, k, grid_positions(5, 4))
    torch.testing.assert_close(out_q, ref_q)
    torch.testing.assert_close(out_k, ref_k)


def test_keys_at_their_own_positions_and_batched_positions():
    rope = RoPEMixed(16, 2, generator=_gen(4)).double()
    q, k = _qk((3, 2, 6, 16), (3, 2, 9, 16), torch.float64)
    q_pos = torch.randint(0, 30, (3, 6, 2), generator=_gen(5))
    k_pos = torch.randint(0, 30, (3, 9, 2), generator=_gen(6))
    out_q, out_k = rope(q, k, q_pos, k_pos)
    freqs = rope.freqs.detach()
    for b in range(3):
        cis_q = compute_mixed_cis(freqs, q_pos[b, :, 0].double(), q_pos[b, :, 1].double(), 2)  # (H, S, F)
        cis_k = compute_mixed_cis(freqs, k_pos[b, :, 0].double(), k_pos[b, :, 1].double(), 2)  # (H, T, F)
        ref_q, _ = apply_rotary_emb(q[b], q[b], cis_q)
        _, ref_k = apply_rotary_emb(k[b], k[b], cis_k)
        torch.testing.assert_close(out_q[b], ref_q)
        torch.testing.assert_close(out_k[b], ref_k)


def test_integer_and_float_positions_agree():
    rope = RoPEMixed(32, 2, generator=_gen(0))
    q, k = _qk((1, 2, 35, 32), (1, 2, 35, 32), torch.float32)
    pos = grid_positions(7, 5)
    with torch.no_grad():
        torch.testing.assert_close(rope(q, k, pos.long()), rope(q, k, pos), rtol=0, atol=0)


def test_mixed_angles_formula():
    freqs = torch.tensor([[[1.0, 2.0]], [[10.0, 20.0]]])  # (2, H=1, F=2)
    pos = torch.tensor([[1.0, 0.0], [0.0, 1.0], [3.0, 2.0]])  # (S, 2)
    expected = torch.tensor([[[1.0, 2.0], [10.0, 20.0], [23.0, 46.0]]], dtype=torch.float64)  # (H, S, F)
    torch.testing.assert_close(mixed_angles(pos, freqs), expected, rtol=0, atol=0)
    cos, sin = mixed_cos_sin(pos.unsqueeze(0), freqs)  # batched: (1, H, S, F)
    torch.testing.assert_close(cos, expected.cos().float().unsqueeze(0))
    torch.testing.assert_close(sin, expected.sin().float().unsqueeze(0))


# ---- gradients -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("end_x, end_y", [(7, 5), (4, 4)])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_gradients_match_rope_vit_autograd(end_x, end_y, dtype):
    head_dim, num_heads, s = 16, 3, end_x * end_y
    rope = RoPEMixed(head_dim, num_heads, generator=_gen(8)).to(dtype)
    q0, k0 = _qk((2, num_heads, s, head_dim), (2, num_heads, s, head_dim), dtype)
    w_q, w_k = _qk((2, num_heads, s, head_dim), (2, num_heads, s, head_dim), torch.float64, seed=9)

    q, k = q0.clone().requires_grad_(), k0.clone().requires_grad_()
    out_q, out_k = rope(q, k, grid_positions(end_x, end_y))
    ((out_q.double() * w_q).sum() + (out_k.double() * w_k).sum()).backward()

    ref_freqs = rope.freqs.detach().double().requires_grad_()
    ref_qin, ref_kin = q0.double().requires_grad_(), k0.double().requires_grad_()
    ref_q, ref_k = _reference(ref_qin, ref_kin, ref_freqs, end_x, end_y)
    ((ref_q * w_q).sum() + (ref_k * w_k).sum()).backward()

    tol = {} if dtype == torch.float64 else {"rtol": 1e-4, "atol": 1e-4}
    torch.testing.assert_close(out_q.detach().double(), ref_q.detach(), **tol)
    assert rope.freqs.grad is not None
    torch.testing.assert_close(rope.freqs.grad.double(), ref_freqs.grad, **tol)
    torch.testing.assert_close(q.grad.double(), ref_qin.grad, **tol)
    torch.testing.assert_close(k.grad.double(), ref_kin.grad, **tol)


def test_gradcheck():
    rope = RoPEMixed(8, 2, generator=_gen(3)).double()
    q, k = _qk((1, 2, 6, 8), (1, 2, 6, 8), torch.float64)
    q.requires_grad_()
    pos = grid_positions(3, 2)

    def f(freqs, q):
        cos, sin = mixed_cos_sin(pos, freqs, dtype=torch.float64)
        return apply_rotary(q, cos, sin, layout="interleaved")

    assert torch.autograd.gradcheck(f, (rope.freqs, q))


# ---- properties ------------------------------------------------------------------------------------------------


@given(
    head_dim=st.sampled_from([4, 16, 32]),
    num_heads=st.integers(1, 3),
    shift=st.tuples(st.integers(-300, 300), st.integers(-300, 300)),
    seed=st.integers(0, 2**16),
)
def test_2d_shift_keeps_dot_products(head_dim, num_heads, shift, seed):
    g = _gen(seed)
    rope = RoPEMixed(head_dim, num_heads, generator=g).double()
    q = torch.randn(1, num_heads, 6, head_dim, generator=g, dtype=torch.float64)
    k = torch.randn(1, num_heads, 8, head_dim, generator=g, dtype=torch.float64)
    q_pos = torch.randint(-20, 20, (6, 2), generator=g)
    k_pos = torch.randint(-20, 20, (8, 2), generator=g)
    offset = torch.tensor(shift)
    with torch.no_grad():
        rq, rk = rope(q, k, q_pos, k_pos)
        sq, sk = rope(q, k, q_pos + offset, k_pos + offset)
    torch.testing.assert_close(sq @ sk.transpose(-1, -2), rq @ rk.transpose(-1, -2))


@given(head_dim=st.sampled_from([4, 16, 32]), num_heads=st.integers(1, 3), seed=st.integers(0, 2**16))
def test_position_zero_is_identity(head_dim, num_heads, seed):
    rope = RoPEMixed(head_dim, num_heads, generator=_gen(seed))
    q, k = _qk((2, num_heads, 5, head_dim), (2, num_heads, 5, head_dim), torch.float32, seed)
    with torch.no_grad():
        out_q, out_k = rope(q, k, torch.zeros(5, 2))
    torch.testing.assert_close(out_q, q, rtol=0, atol=0)
    torch.testing.assert_close(out_k, k, rtol=0, atol=0)


# ---- config ----------------------------------------------------------------------------------------------------


def test_config_round_trip_and_from_config():
    config = RoPEMixedConfig(head_dim=32, num_heads=4, base=100.0, rotate=False)
    assert RoPEMixedConfig.from_dict(config.to_dict()) == config
    rope = RoPEMixed.from_config(config.to_dict(), generator=_gen(0))
    assert rope.config == config
    assert rope.freqs.shape == (2, 4, 16)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.num_heads = 2


def test_state_dict_holds_freqs():
    rope = RoPEMixed(16, 2, generator=_gen(0))
    other = RoPEMixed(16, 2, generator=_gen(1))
    other.load_state_dict(rope.state_dict())
    torch.testing.assert_close(other.freqs, rope.freqs, rtol=0, atol=0)
    assert list(rope.state_dict()) == ["freqs"]


# ---- bad inputs ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args, kwargs, name",
    [
        ((10, 2), {}, "head_dim"),
        ((0, 2), {}, "head_dim"),
        ((16, 0), {}, "num_heads"),
        ((16, 2), {"base": 0.5}, "base"),
        ((16, 2), {"rotate": 1}, "rotate"),
    ],
)
def test_bad_config(args, kwargs, name):
    with pytest.raises(ValueError, match=rf"^{name}="):
        RoPEMixed(*args, **kwargs)
    with pytest.raises(ValueError, match=rf"^{name}="):
        init_mixed_freqs(*args, **kwargs)


def test_bad_config_key():
    with pytest.raises(ValueError, match=r"^config\['theta'\]"):
        RoPEMixedConfig.from_dict({"head_dim": 16, "num_heads": 2, "theta": 10.0})


def test_num_heads_mismatch():
    rope = RoPEMixed(16, 4)
    q, k = _qk((1, 2, 35, 16), (1, 2, 35, 16), torch.float32)
    with pytest.raises(ValueError, match=r"^num_heads=4 .*heads of q, 2 "):
        rope(q, k, grid_positions(7, 5))
    with pytest.raises(ValueError, match=r"^num_heads=4 .*heads of x, 2 "):
        rope.rotate_one(q, grid_positions(7, 5))


def test_fewer_key_heads_is_refused():
    rope = RoPEMixed(16, 4)
    q, k = _qk((1, 4, 35, 16), (1, 2, 35, 16), torch.float32)
    with pytest.raises(ValueError, match=r"^k\.shape=.*num_heads"):
        rope(q, k, grid_positions(7, 5))


def test_head_dim_mismatch():
    rope = RoPEMixed(16, 2)
    q, k = _qk((1, 2, 35, 32), (1, 2, 35, 32), torch.float32)
    with pytest.raises(ValueError, match=r"^q\.shape\[-1\]="):
        rope(q, k, grid_positions(7, 5))


@pytest.mark.parametrize("positions", [torch.zeros(35, 3), torch.zeros(35), torch.zeros(34, 2), torch.zeros(2, 35, 2)])
def test_bad_positions(positions):
    rope = RoPEMixed(16, 2)
    q, k = _qk((1, 2, 35, 16), (1, 2, 35, 16), torch.float32)
    with pytest.raises(ValueError, match=r"^positions\.shape="):
        rope(q, k, positions)


def test_bad_key_positions():
    rope = RoPEMixed(16, 2)
    q, k = _qk((1, 2, 35, 16), (1, 2, 35, 16), torch.float32)
    with pytest.raises(ValueError, match=r"^k_positions\.shape="):
        rope(q, k, grid_positions(7, 5), grid_positions(5, 5, 1))


def test_functional_bad_inputs():
    freqs = init_mixed_freqs(16, 2)
    with pytest.raises(ValueError, match=r"^positions\.shape="):
        mixed_angles(torch.zeros(5, 3), freqs)
    with pytest.raises(ValueError, match=r"^freqs\.shape="):
        mixed_angles(torch.zeros(5, 2), freqs[0])
    with pytest.raises(ValueError, match=r"^positions\.dtype="):
        mixed_angles(torch.zeros(5, 2, dtype=torch.bool), freqs)
    with pytest.raises(ValueError, match=r"^dtype="):
        mixed_cos_sin(torch.zeros(5, 2), freqs, dtype=torch.bfloat16)
