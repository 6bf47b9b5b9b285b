"""Sandwich module: registry, config (ratios through JSON), the bias against embedding dot products, score_mod ==
bias (eagerly and through compiled FlexAttention), the frequency buffer through dtype and device moves, and bad
input."""

import json

import pytest
import torch
from torch.testing import assert_close

import posenc
from bias_grid import COMPILED, EXACT, B, H, check_compiled_attention, positions, score_mod_grid
from posenc.encodings.sandwich import Sandwich, SandwichConfig
from posenc.functional.sandwich import sandwich_bias, sandwich_frequencies
from reference.sandwich import sandwich


def test_registered_and_built_by_name():
    enc = posenc.build("sandwich", num_heads=8, dim=512, head_dim=64, max_len=128)
    assert isinstance(enc, Sandwich) and enc.config == SandwichConfig(num_heads=8)  # dim is the model's, not d'
    assert enc.config.pe_dim == 128 and enc.config.head_ratios() == (1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0)
    assert Sandwich.has_bias and list(enc.parameters()) == [] and enc.state_dict() == {}


@pytest.mark.parametrize(
    "config",
    [SandwichConfig(num_heads=8), SandwichConfig(num_heads=3, pe_dim=16, base=500.0, ratios=(1, 0.5, 2.5))],
)
def test_config_round_trip(config):
    assert SandwichConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config  # ratios: list -> tuple
    assert Sandwich.from_config(config.to_dict()).config == config
    if config.ratios is not None:
        assert config.ratios == (1.0, 0.5, 2.5) and config.to_dict()["ratios"] == [1.0, 0.5, 2.5]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"num_heads": 0}, r"num_heads=0"),
        ({"num_heads": 2, "pe_dim": 5}, r"pe_dim=5.*even"),
        ({"num_heads": 2, "pe_dim": 0}, r"pe_dim=0"),
        ({"num_heads": 2, "base": 1}, r"base=1"),
        ({"num_heads": 2, "ratios": (1.0,)}, r"ratios=\(1\.0,\).*2 compression ratios"),
        ({"num_heads": 2, "ratios": (1.0, -1.0)}, r"ratios\[1\]=-1\.0"),
        ({"num_heads": 2, "ratios": (1.0, float("nan"))}, r"ratios\[1\]=nan"),
        ({"num_heads": 2, "ratios": 2.0}, r"ratios=2\.0"),
    ],
)
def test_bad_config(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SandwichConfig(**kwargs)
    heads = kwargs.pop("num_heads")
    with pytest.raises(ValueError, match=match):
        Sandwich(heads, **kwargs)


@pytest.mark.parametrize("kind", ["shared", "one_row", "batched", "mixed", "float"])
@pytest.mark.parametrize("kwargs", [{}, {"pe_dim": 16, "ratios": (1.0, 1.0, 0.5, 3.0)}, {"base": 100.0}])
def test_bias_and_score_mod(kind, kwargs):
    q_pos, k_pos = positions(kind)
    enc = Sandwich(H, **kwargs)
    c = enc.config
    bias = enc.bias(q_pos, k_pos)
    assert_close(bias, sandwich_bias(q_pos, k_pos, sandwich_frequencies(c.pe_dim, c.head_ratios(), base=c.base)))
    ref = sandwich(q_pos, k_pos, pe_dim=c.pe_dim, ratios=list(c.head_ratios()), base=c.base)
    assert_close(bias.double(), ref, rtol=0, atol=3e-4)  # float32 angles at distances up to 1000
    assert_close(score_mod_grid(enc, q_pos, k_pos), bias.expand(B, -1, -1, -1), **EXACT)
    assert_close(enc(q_pos, k_pos), bias, **EXACT)
    assert_close(enc(q_pos), enc.bias(q_pos, q_pos), **EXACT)


@pytest.mark.parametrize(("backend", "device"), COMPILED)
def test_compiled_attention_is_the_bias_without_graph_breaks(backend, device):
    check_compiled_attention(Sandwich(H, pe_dim=32), backend, device)


@pytest.mark.parametrize("cast", [lambda m: m.to(torch.bfloat16), lambda m: m.half(), lambda m: m.double()])
def test_frequencies_stay_float32_through_dtype_casts(cast):
    enc = Sandwich(6)
    cast(enc)
    assert enc.frequencies.dtype == torch.float32
    assert_close(enc.frequencies, sandwich_frequencies(128, enc.config.head_ratios()), **EXACT)
    assert "_frequencies" not in enc.state_dict()  # rebuilt from the config, never saved


def test_meta_build_then_to_empty():
    with torch.device("meta"):
        enc = Sandwich(H)
    assert enc.frequencies.is_meta
    enc.to_empty(device="cpu")
    assert_close(enc.frequencies, sandwich_frequencies(128, enc.config.head_ratios()), **EXACT)


def test_bad_input():
    enc = Sandwich(H)
    pos = torch.arange(6)
    for hook in (enc.bias, enc.score_mod):
        with pytest.raises(ValueError, match=r"num_heads=4.*the number of heads of q, 8"):
            hook(pos, pos, q=torch.randn(1, 8, 6, 8))
        with pytest.raises(ValueError, match=r"q_pos\.dtype=torch\.bool"):
            hook(pos.bool(), pos)
        with pytest.raises(ValueError, match=r"k_pos\[2\]=inf"):
            hook(pos, torch.tensor([0.0, 1.0, float("inf")]))
