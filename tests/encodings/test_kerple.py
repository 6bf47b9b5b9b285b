"""KERPLE module: registry, config, the bias and its score_mod (eagerly and through compiled FlexAttention),
gradients to ``r1``/``r2`` through bias and score_mod, float32 math in a bf16 model, and bad input."""

import copy

import pytest
import torch
from torch.testing import assert_close

import posenc
from bias_grid import (
    EXACT,
    B,
    H,
    S,
    T,
    check_compiled_attention,
    positions,
    score_mod_grid,
)
from posenc.encodings.kerple import KERPLE, KERPLEConfig
from posenc.functional.kerple import kerple_bias
from reference.kerple import kerple
from tolerances import grad_atols


def test_registered_and_built_by_name():
    enc = posenc.build("kerple", num_heads=6, dim=64, head_dim=16, max_len=128)
    assert isinstance(enc, KERPLE) and enc.config == KERPLEConfig(num_heads=6)
    assert posenc.build("kerple", num_heads=2, kernel="power").config.kernel == "power"
    assert KERPLE.has_bias and KERPLE.position_kind == "sequence"
    assert [n for n, _ in enc.named_parameters()] == ["r1", "r2"]
    assert "num_heads=6, kernel='log'" in repr(enc)


@pytest.mark.parametrize("config", [KERPLEConfig(num_heads=8), KERPLEConfig(num_heads=3, kernel="power")])
def test_config_round_trip(config):
    assert KERPLEConfig.from_dict(config.to_dict()) == config
    assert KERPLE.from_config(config.to_dict()).config == config


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"num_heads": 0}, r"num_heads=0"),
        ({"num_heads": 2.0}, r"num_heads=2\.0"),
        ({"num_heads": True}, r"num_heads=True"),
        ({"num_heads": 2, "kernel": "exp"}, r"kernel='exp'.*\['log', 'power'\]"),
    ],
)
def test_bad_config(kwargs, match):
    with pytest.raises(ValueError, match=match):
        KERPLEConfig(**kwargs)
    heads = kwargs.pop("num_heads")
    with pytest.raises(ValueError, match=match):
        KERPLE(heads, **kwargs)


@pytest.mark.parametrize("kernel", ["log", "power"])
def test_initial_parameters_follow_the_reference_draws(kernel):
    torch.manual_seed(0)
    enc = KERPLE(2048, kernel=kernel)
    top1, top2 = (2.0, 1.0) if kernel == "log" else (1.0, 2.0)
    for p, top in ((enc.r1, top1), (enc.r2, top2)):
        assert p.dtype == torch.float32 and p.shape == (2048,)
        assert p.min() >= 0 and p.max() < top and p.max() > 0.97 * top


@pytest.mark.parametrize("kind", ["shared", "one_row", "batched", "mixed", "float"])
@pytest.mark.parametrize("kernel", ["log", "power"])
def test_bias_and_score_mod(kind, kernel):
    q_pos, k_pos = positions(kind)
    enc = KERPLE(H, kernel=kernel)
    with torch.no_grad():
        enc.r1[0], enc.r2[1] = -0.5, 3.0  # out of bounds: clamped in both paths
        bias = enc.bias(q_pos, k_pos)
        r1, r2 = enc.kernel_parameters()
        assert_close(bias, kerple_bias(q_pos, k_pos, r1, r2, kernel=kernel), **EXACT)
        assert_close(bias.double(), kerple(q_pos, k_pos, r1.double(), r2.double(), kernel), rtol=2e-6, atol=1e-5)
        assert_close(score_mod_grid(enc, q_pos, k_pos), bias.expand(B, -1, -1, -1), **EXACT)
    assert_close(enc(q_pos), enc.bias(q_pos, q_pos), **EXACT)
    assert_close(enc(q_pos, k_pos), bias, **EXACT)


@pytest.mark.parametrize("kernel", ["log", "power"])
def test_gradients_reach_r1_r2_through_bias_and_score_mod(kernel):
    q_pos, k_pos = positions("batched")
    weights = torch.randn(B, H, S, T)
    grads = []
    for path in ("bias", "score_mod"):
        torch.manual_seed(4)
        enc = KERPLE(H, kernel=kernel)
        out = enc.bias(q_pos, k_pos) if path == "bias" else score_mod_grid(enc, q_pos, k_pos)
        grads.append(torch.autograd.grad((out * weights).sum(), [enc.r1, enc.r2]))
    torch.manual_seed(4)
    reference = KERPLE(H, kernel=kernel)

    def bias_of(r1, r2):
        params = {"r1": r1, "r2": r2}
        return torch.func.functional_call(reference, params, (q_pos, k_pos)).expand(B, H, S, T)

    atols = grad_atols(bias_of, [reference.r1, reference.r2], weights)
    for g_bias, g_mod, atol in zip(*grads, atols, strict=True):
        assert g_bias.abs().min() > 0
        assert_close(g_mod, g_bias, rtol=0, atol=atol)


@pytest.mark.parametrize("backend", ["eager", "sdpa"])
def test_attention_trains_the_kernel(backend):
    enc = KERPLE(H)
    q, k, v = torch.randn(3, B, H, 12, 8).unbind(0)
    out = posenc.attention(q, k, v, encoding=enc, backend=backend)
    r1, r2 = torch.autograd.grad(out.square().sum(), [enc.r1, enc.r2])
    assert r1.abs().min() > 0 and r2.abs().min() > 0


# flex compiles each kernel's score_mod; the sdpa path adds enc.bias whatever the kernel: compiled once (power)
@pytest.mark.parametrize(("kernel", "backend", "device"), [
    ("log", "flex", "cpu"), ("power", "flex", "cpu"), ("power", "sdpa", "cpu"),
    pytest.param("log", "flex", "cuda", marks=pytest.mark.gpu),
    pytest.param("power", "flex", "cuda", marks=pytest.mark.gpu),
])
def test_compiled_attention_is_the_bias_without_graph_breaks(backend, device, kernel):
    check_compiled_attention(KERPLE(H, kernel=kernel), backend, device)


def test_low_precision_model_keeps_float32_math():
    enc = KERPLE(H, kernel="power")
    with torch.no_grad():
        for p in enc.parameters():
            p.copy_(p.bfloat16().float())
    pos = torch.arange(3000, 3040)
    ref = enc.bias(pos, pos)
    low = copy.deepcopy(enc).to(torch.bfloat16)
    assert low.r1.dtype == torch.bfloat16
    assert_close(low.bias(pos, pos), ref, **EXACT)
    assert_close(score_mod_grid(low, pos[:S], pos[:T]), ref[..., :S, :T].expand(B, -1, -1, -1), **EXACT)


def test_meta_build():
    with torch.device("meta"):
        enc = KERPLE(H)
    assert enc.r1.is_meta and enc.r2.is_meta


def test_bad_input():
    enc = KERPLE(H)
    pos = torch.arange(6)
    for hook in (enc.bias, enc.score_mod):
        with pytest.raises(ValueError, match=r"num_heads=4.*the number of heads of q, 3"):
            hook(pos, pos, q=torch.randn(1, 3, 6, 8))
        with pytest.raises(ValueError, match=r"q_pos\.dtype=torch\.float16"):
            hook(pos.half(), pos)
        with pytest.raises(ValueError, match=r"k_pos\.shape=\(3, 6\)"):
            hook(torch.zeros(2, 6), torch.zeros(3, 6))
        with pytest.raises(ValueError, match=r"q_pos\[1\]=nan"):
            hook(torch.tensor([0.0, float("nan")]), pos)
