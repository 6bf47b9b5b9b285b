"""FIRE module: registry, config, the listing's initial values and names, the bias against the equations and the
listing, score_mod == bias (eagerly and through compiled FlexAttention), gradients to every parameter through bias
and score_mod, progressive interpolation, float32 math in a bf16 model, and bad input."""

import copy
import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch.testing import assert_close

import posenc
from bias_grid import (
    COMPILED,
    EXACT,
    B,
    H,
    S,
    T,
    check_compiled_attention,
    positions,
    score_mod_grid,
)
from posenc.encodings.fire import FIRE, FIREConfig
from reference.fire import fire, fire_listing
from tolerances import grad_atols, mlp_atol


def _positions(kind):
    return positions(kind, high=100, shared=(14, 10))  # queries on both sides of the threshold, 16


def _fire(**kwargs):
    torch.manual_seed(1)
    enc = FIRE(H, **{"mlp_width": 6, "init_L": 16.0, **kwargs})
    with torch.no_grad():
        enc.mlp[2].weight.normal_()  # nn.Linear's init is small: make every head's bias matter
        enc.c.fill_(0.3)
        enc.L_multiplier.fill_(-1.0)  # the threshold is |L_multiplier * init_L|
    return enc


def _atol(enc):
    """Two float32 evaluations of the MLP (or one against float64): tests/tolerances.mlp_atol."""
    return mlp_atol(enc.mlp[0].weight[:, 0], enc.mlp[0].bias, enc.mlp[2].weight, enc.mlp[2].bias)


def _reference(enc, q_pos, k_pos):
    first, second = enc.mlp[0], enc.mlp[2]
    params = {"w1": first.weight[:, 0], "b1": first.bias, "w2": second.weight, "b2": second.bias}
    params |= {"c": enc.c, "L_multiplier": enc.L_multiplier}
    params = {k: v.detach().double() for k, v in params.items()}
    return fire(q_pos, k_pos, init_L=enc.config.init_L, eps=enc.config.eps, **params)


def test_registered_and_built_by_name():
    enc = posenc.build("fire", num_heads=6, dim=64, head_dim=16, max_len=128)
    assert isinstance(enc, FIRE) and enc.config == FIREConfig(num_heads=6)
    assert FIRE.has_bias and FIRE.position_kind == "sequence"


def test_initial_values_and_names_follow_the_listing():
    enc = FIRE(8)
    assert enc.config == FIREConfig(num_heads=8, mlp_width=32, init_c=0.1, init_L=512.0, eps=1e-6)
    assert_close(enc.c, torch.tensor(0.1), **EXACT)
    assert_close(enc.L_multiplier, torch.tensor(1.0), **EXACT)
    assert_close(enc.threshold(), torch.tensor(512.0), **EXACT)
    shapes = {k: tuple(v.shape) for k, v in enc.state_dict().items()}
    assert shapes == {"c": (), "L_multiplier": (), "mlp.0.weight": (32, 1), "mlp.0.bias": (32,),
                      "mlp.2.weight": (8, 32), "mlp.2.bias": (8,)}


@pytest.mark.parametrize(
    "config",
    [FIREConfig(num_heads=8), FIREConfig(num_heads=3, mlp_width=4, init_c=2.0, init_L=2048.0, eps=1e-3)],
)
def test_config_round_trip(config):
    assert FIREConfig.from_dict(config.to_dict()) == config
    assert FIRE.from_config(config.to_dict()).config == config


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"num_heads": 0}, r"num_heads=0"),
        ({"num_heads": 2, "mlp_width": 0}, r"mlp_width=0"),
        ({"num_heads": 2, "init_c": 0.0}, r"init_c=0\.0"),
        ({"num_heads": 2, "init_c": -0.1}, r"init_c=-0\.1"),
        ({"num_heads": 2, "init_L": 0}, r"init_L=0"),
        ({"num_heads": 2, "init_L": float("inf")}, r"init_L=inf"),
        ({"num_heads": 2, "eps": 0.0}, r"eps=0\.0"),
    ],
)
def test_bad_config(kwargs, match):
    with pytest.raises(ValueError, match=match):
        FIREConfig(**kwargs)
    heads = kwargs.pop("num_heads")
    with pytest.raises(ValueError, match=match):
        FIRE(heads, **kwargs)


@pytest.mark.parametrize("kind", ["shared", "one_row", "batched", "mixed", "float"])
def test_bias_and_score_mod(kind):
    q_pos, k_pos = _positions(kind)
    enc = _fire()
    with torch.no_grad():
        bias = enc.bias(q_pos, k_pos)
        assert bias.dtype == torch.float32
        assert_close(bias.double(), _reference(enc, q_pos, k_pos), rtol=0, atol=_atol(enc))
        assert_close(score_mod_grid(enc, q_pos, k_pos), bias.expand(B, -1, -1, -1), **EXACT)
        assert_close(enc(q_pos, k_pos), bias, **EXACT)
        assert_close(enc(q_pos), enc.bias(q_pos, q_pos), **EXACT)


def test_default_module_matches_the_listing():
    torch.manual_seed(0)
    enc = FIRE(H, init_L=40.0)
    with torch.no_grad():
        got = enc(torch.arange(60))
        ref = fire_listing(60, enc.mlp, enc.c, enc.L_multiplier, 40.0, 1e-6)
    assert_close(got, ref, rtol=0, atol=_atol(enc))


def test_gradients_reach_every_parameter_through_bias_and_score_mod():
    q_pos, k_pos = _positions("shared")  # queries below the threshold too: L_multiplier gets a gradient
    weights = torch.randn(B, H, S, T)
    grads = []
    for path in ("bias", "score_mod"):
        enc = _fire()
        out = enc.bias(q_pos, k_pos) if path == "bias" else score_mod_grid(enc, q_pos, k_pos)
        grads.append(torch.autograd.grad((out * weights).sum(), list(enc.parameters())))
    reference = _fire()
    names = [n for n, _ in reference.named_parameters()]

    def bias_of(*params):
        return torch.func.functional_call(reference, dict(zip(names, params, strict=True)), (q_pos, k_pos))

    atols = grad_atols(lambda *ps: bias_of(*ps).expand(B, H, S, T), list(reference.parameters()), weights)
    for name, g_bias, g_mod, atol in zip(names, *grads, atols, strict=True):
        assert g_bias.abs().sum() > 0, name
        assert_close(g_mod, g_bias, rtol=0, atol=atol, msg=name)


@pytest.mark.parametrize("backend", ["eager", "sdpa"])
def test_attention_trains_every_parameter(backend):
    enc = _fire()
    q, k, v = torch.randn(3, B, H, 24, 8).unbind(0)  # positions 0..23 straddle the threshold (16)
    out = posenc.attention(q, k, v, encoding=enc, backend=backend)
    grads = torch.autograd.grad(out.square().sum(), list(enc.parameters()))
    assert all(g.abs().sum() > 0 for g in grads)


@given(shift=st.integers(-14, 2), s=st.integers(1, 5), extra=st.integers(0, 5))
def test_shift_invariant_below_the_threshold(shift, s, extra):
    enc = _fire()
    k_pos = torch.arange(14 - s - extra, 14)  # queries stay at or below 16, the threshold
    q_pos = k_pos[extra:]
    with torch.no_grad():
        assert_close(enc.bias(q_pos + shift, k_pos + shift), enc.bias(q_pos, k_pos), **EXACT)


def test_beyond_the_threshold_the_bias_follows_the_query_position():
    """Progressive interpolation: past the threshold, the same distances get another bias as the query moves on
    (they are normalised by ``psi(i)``), and the farthest key (position 0) maps to ~1 for every query."""
    enc = _fire()
    with torch.no_grad():
        near = enc.bias(torch.tensor([100]), torch.tensor([0, 50, 100]))
        far = enc.bias(torch.tensor([1100]), torch.tensor([1000, 1050, 1100]))  # same distances, later query
        assert (near - far).abs().max() > 0.1  # the same distances, not the same bias
        far_ref = _reference(enc, torch.tensor([1100]), torch.tensor([1000, 1050, 1100]))
        assert_close(far.double(), far_ref, rtol=0, atol=_atol(enc))
        # The key at distance i (position 0) always maps to ~1: every query past the threshold sees the same bias.
        first = [enc.bias(torch.tensor([i]), torch.tensor([0]))[0, :, 0, 0] for i in (100, 1000, 100000)]
    # psi(i) / (psi(i) + eps) is 1 - eps / psi(i): within eps / psi(100) of the query at 100, moved through the MLP
    w2_w1 = float((enc.mlp[2].weight.detach().abs() @ enc.mlp[0].weight.detach().abs()).max())
    atol = _atol(enc) + w2_w1 * enc.config.eps / math.log1p(abs(float(enc.c.detach())) * 100)
    assert_close(first[1], first[0], rtol=0, atol=atol)
    assert_close(first[2], first[0], rtol=0, atol=atol)


@pytest.mark.parametrize(("backend", "device"), COMPILED)
def test_compiled_attention_is_the_bias_without_graph_breaks(backend, device):
    check_compiled_attention(_fire(), backend, device, t=24, q_offset=16)


def test_low_precision_model_keeps_float32_math():
    enc = _fire()
    with torch.no_grad():
        for p in enc.parameters():
            p.copy_(p.bfloat16().float())
    pos = torch.arange(10, 20)
    ref = enc.bias(pos, pos)
    low = copy.deepcopy(enc).to(torch.bfloat16)
    assert low.c.dtype == torch.bfloat16 and low.mlp[0].weight.dtype == torch.bfloat16
    assert_close(low.bias(pos, pos), ref, **EXACT)
    assert_close(score_mod_grid(low, pos[:S], pos[:T]), ref[..., :S, :T].expand(B, -1, -1, -1), **EXACT)


def test_meta_build():
    with torch.device("meta"):
        enc = FIRE(H)
    assert all(p.is_meta for p in enc.parameters())


def test_meta_build_then_loaded_keeps_its_constants():
    """Built on meta, moved with to_empty and loaded (as Hugging Face loads): the score_mod's eps and init_L (float32
    buffers, not saved) are rebuilt from the config, so its scores are the original's bias."""
    want = _fire(eps=1e-3)  # eps large enough to move the bias
    with torch.device("meta"):
        enc = FIRE(H, mlp_width=6, init_L=16.0, eps=1e-3)
    enc.to_empty(device="cpu").load_state_dict(want.state_dict())
    q_pos, k_pos = _positions("batched")
    with torch.no_grad():
        assert_close(score_mod_grid(enc, q_pos, k_pos), want.bias(q_pos, k_pos).expand(B, -1, -1, -1), **EXACT)


def test_bad_input():
    enc = FIRE(H)
    pos = torch.arange(6)
    for hook in (enc.bias, enc.score_mod):
        with pytest.raises(ValueError, match=r"num_heads=4.*the number of heads of q, 2"):
            hook(pos, pos, q=torch.randn(1, 2, 6, 8))
        with pytest.raises(ValueError, match=r"k_pos\.dtype=torch\.bfloat16"):
            hook(pos, pos.bfloat16())
        with pytest.raises(ValueError, match=r"q_pos\.shape=\(2, 3, 6\)"):
            hook(torch.zeros(2, 3, 6), pos)
