"""p-RoPE (``rope_type: "proportional"``, ``posenc.build("p_rope")``): frequencies bit-equal to transformers'
``ROPE_INIT_FUNCTIONS["proportional"]``, rotations equal to HF's modules (Llama, Gemma 4), the HF config round trip,
and the properties: the non-rotating pairs pass through bit for bit, scores depend on distance only."""

from __future__ import annotations

import json

import pytest
import torch
from torch.testing import assert_close

import posenc
from hf_oracle import angle_atol, hf_config, hf_frequencies, hf_rotary, neox_apply
from posenc import ProportionalScaling, RotaryConfig, RotaryEmbedding
from posenc.hf import positional_setup, rotary_config_from_hf, rotary_config_to_hf
from tolerances import frequency_rtol

HEAD_DIMS = [8, 64, 80, 128, 256, 512]
FRACTIONS = [0.0, 0.25, 0.3, 0.5, 0.75, 1.0]  # 0.3 * 64 = 19.2: the reference floors it to 9 rotating pairs
BASES = [10000.0, 1e6]


def _params(p, factor=None, base=None):
    d = {"rope_type": "proportional", "partial_rotary_factor": p}
    if factor is not None:
        d["factor"] = factor
    if base is not None:
        d["rope_theta"] = base
    return d


# ---------------------------------------------------------------------------------------------------------------
# Frequencies: transformers' own function, bit for bit


@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("p", FRACTIONS)
@pytest.mark.parametrize("base", BASES)
@pytest.mark.parametrize("factor", [None, 2.0, 8.0])
def test_frequencies_bit_equal_to_hf(head_dim, p, base, factor):
    want, want_factor = hf_frequencies(hf_config(head_dim, base=base, rope_parameters=_params(p, factor)))
    got, got_factor = posenc.rope_frequencies(head_dim, base=base, scaling=_params(p, factor, base))
    assert got.dtype == torch.float32 and got.shape == (head_dim // 2,)
    assert torch.equal(got, want)
    assert got_factor == want_factor == 1.0
    module = RotaryEmbedding(head_dim, base=base, scaling=ProportionalScaling(partial_rotary_factor=p, factor=factor))
    assert torch.equal(module.inv_freq, want)
    if factor is None:
        assert torch.equal(posenc.build("p_rope", head_dim=head_dim, p=p, base=base).inv_freq, want)


@pytest.mark.parametrize(("head_dim", "p", "rotating"), [(64, 0.3, 9), (80, 0.25, 10), (256, 0.25, 32), (64, 0.0, 0)])
def test_the_highest_frequencies_rotate_at_ropes_own_values(head_dim, p, rotating):
    """Pair i < int(p * D // 2) keeps base ** (-2i / D) (over the whole head, not the rotating part); the rest are 0."""
    inv_freq, _ = posenc.rope_frequencies(head_dim, scaling={"rope_type": "proportional", "partial_rotary_factor": p})
    exact = torch.tensor([10000.0 ** (-2 * i / head_dim) for i in range(rotating)], dtype=torch.float64)
    assert_close(inv_freq[:rotating].double(), exact, rtol=1e-6, atol=0)
    assert torch.equal(inv_freq[rotating:], torch.zeros(head_dim // 2 - rotating))


# ---------------------------------------------------------------------------------------------------------------
# Rotations: HF modules built from proportional configs


@pytest.mark.parametrize("p", [0.25, 0.5, 0.75])
@pytest.mark.parametrize("factor", [None, 4.0])
def test_from_hf_rotates_like_the_hf_module(p, factor):
    config = hf_config(64, base=10000.0, rope_parameters=_params(p, factor))
    rope = RotaryEmbedding.from_hf(config)
    assert rope.config.scaling == ProportionalScaling(partial_rotary_factor=p, factor=factor)
    assert rope.config.partial_rotary_factor == 1.0 and rope.config.rotary_dim == 64
    q, k = torch.randn(2, 4, 300, 64), torch.randn(2, 2, 300, 64)
    positions = torch.arange(300) * 5
    cos, sin = hf_rotary(config)(q, positions[None].expand(2, -1))
    want_q, want_k = neox_apply(q, k, cos, sin)
    got_q, got_k = rope(q, k, positions)
    atol = angle_atol(positions.max() + 1, q)
    assert_close(got_q, want_q, rtol=1e-5, atol=atol)
    assert_close(got_k, want_k, rtol=1e-5, atol=atol)


def test_gemma4_full_attention_is_proportional_at_its_own_head_dim():
    transformers = pytest.importorskip("transformers")
    from transformers.models.gemma4.modeling_gemma4 import Gemma4TextRotaryEmbedding

    config = transformers.Gemma4TextConfig(num_hidden_layers=6)  # the 6th layer is full attention
    hf = Gemma4TextRotaryEmbedding(config)
    full = rotary_config_from_hf(config, layer_type="full_attention")
    assert full == RotaryConfig(head_dim=512, base=1e6, scaling=ProportionalScaling(partial_rotary_factor=0.25))
    assert torch.equal(RotaryEmbedding.from_config(full).inv_freq, hf.full_attention_inv_freq)
    sliding = rotary_config_from_hf(config.to_dict(), layer_type="sliding_attention")
    assert sliding == RotaryConfig(head_dim=256, base=10000.0)
    got = RotaryEmbedding.from_config(sliding).inv_freq
    assert_close(got, hf.sliding_attention_inv_freq, rtol=frequency_rtol(10000.0), atol=0)


# ---------------------------------------------------------------------------------------------------------------
# HF configs in and out


@pytest.mark.parametrize("p", [0.0, 0.25, 1.0])
@pytest.mark.parametrize("factor", [None, 2.0])
def test_hf_round_trip(p, factor):
    config = RotaryConfig(head_dim=256, base=1e6, scaling=ProportionalScaling(partial_rotary_factor=p, factor=factor))
    exported = rotary_config_to_hf(config)
    assert exported == {"head_dim": 256, "rope_parameters": {**_params(p, factor), "rope_theta": 1e6}}
    assert rotary_config_from_hf(exported) == config  # 0.0 (NoPE) read back as 0.0, not a default
    legacy = rotary_config_to_hf(config, legacy=True)
    assert legacy == {"head_dim": 256, "rope_theta": 1e6, "rope_scaling": _params(p, factor)}
    assert rotary_config_from_hf(legacy) == config
    # transformers builds the same frequencies from the exported keys
    hf = hf_config(256, base=1e6, rope_parameters=exported["rope_parameters"])
    assert torch.equal(RotaryEmbedding.from_config(config).inv_freq, hf_frequencies(hf)[0])


def test_top_level_partial_rotary_factor_is_the_fraction():
    """Older configs keep partial_rotary_factor next to rope_parameters; transformers moves it inside."""
    cfg = {"head_dim": 64, "partial_rotary_factor": 0.25, "rope_parameters": {"rope_type": "proportional"}}
    assert rotary_config_from_hf(cfg).scaling == ProportionalScaling(partial_rotary_factor=0.25)
    hf = hf_config(64, base=10000.0, rope_parameters={"rope_type": "proportional"}, partial_rotary_factor=0.25)
    assert torch.equal(RotaryEmbedding.from_hf(hf).inv_freq, hf_frequencies(hf)[0])
    assert rotary_config_from_hf({"head_dim": 64, "rope_parameters": {"rope_type": "proportional"}}).scaling == (
        ProportionalScaling(partial_rotary_factor=1.0)  # HF's default: every pair rotates
    )


def test_positional_setup_of_a_llama_with_proportional_rope():
    config = hf_config(64, base=10000.0, rope_parameters=_params(0.5))
    assert positional_setup(config) == RotaryConfig(head_dim=64, scaling=ProportionalScaling(partial_rotary_factor=0.5))


def test_config_dict_round_trip_and_build_by_name():
    enc = posenc.build("p_rope", dim=256, num_heads=4, head_dim=64, max_len=512, p=0.25, layout="interleaved")
    assert isinstance(enc, RotaryEmbedding)
    d = enc.config.to_dict()
    assert d["scaling"] == {"rope_type": "proportional", "partial_rotary_factor": 0.25}
    assert RotaryEmbedding.from_config(json.loads(json.dumps(d))).config == enc.config
    assert posenc.parse_scaling(d["scaling"]) == ProportionalScaling(partial_rotary_factor=0.25)
    assert posenc.RopeScaling.from_dict({**d["scaling"], "factor": 3.0}).factor == 3.0
    assert "proportional" in posenc.available_scalings()


# ---------------------------------------------------------------------------------------------------------------
# Properties


@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("p", [0.25, 0.75])
def test_non_rotating_pairs_pass_through_bit_for_bit(layout, dtype, p):
    rope = posenc.build("p_rope", head_dim=64, p=p, layout=layout)
    rotating = int(p * 64 // 2)
    q, k = torch.randn(2, 4, 50, 64).to(dtype), torch.randn(2, 2, 50, 64).to(dtype)
    positions = torch.arange(50) * 20011 + 7  # up to ~1e6
    rq, rk = rope(q, k, positions)
    channels = torch.arange(64)
    pair = channels % 32 if layout == "half" else channels // 2
    still = pair >= rotating
    assert torch.equal(rq[..., still], q[..., still]) and torch.equal(rk[..., still], k[..., still])
    assert (rq[..., ~still] != q[..., ~still]).float().mean() > 0.9  # the rest really turn


@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("shift", [1, 100, 99991])
def test_scores_depend_only_on_distance(layout, shift):
    rope = posenc.build("p_rope", head_dim=32, p=0.5, layout=layout)
    q, k = torch.randn(1, 2, 8, 32, dtype=torch.float64), torch.randn(1, 2, 8, 32, dtype=torch.float64)
    pos = torch.tensor([0, 1, 5, 17, 60, 200, 999, 4000])

    def scores(offset):
        rq, rk = rope(q, k, pos + offset)
        return rq @ rk.transpose(-1, -2)

    assert_close(scores(shift), scores(0), rtol=0, atol=1e-9)


def test_p_one_is_rope_and_p_zero_is_nope():
    q, k = torch.randn(1, 2, 40, 64), torch.randn(1, 2, 40, 64)
    pos = torch.arange(40) * 7
    full = posenc.build("p_rope", head_dim=64, p=1.0)(q, k, pos)
    rope = posenc.build("rope", head_dim=64)(q, k, pos)
    assert_close(full[0], rope[0], rtol=0, atol=1e-5)  # float32- vs float64-rounded frequencies: an ulp apart
    none = posenc.build("p_rope", head_dim=64, p=0.0)(q, k, pos)
    assert torch.equal(none[0], q) and torch.equal(none[1], k)


# ---------------------------------------------------------------------------------------------------------------
# Errors


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"partial_rotary_factor": 1.5}, r"partial_rotary_factor=1\.5 is invalid: expected a number in \[0, 1\]"),
        ({"partial_rotary_factor": -0.1}, r"partial_rotary_factor=-0\.1 is invalid"),
        ({"partial_rotary_factor": "half"}, r"partial_rotary_factor='half'"),
        ({"partial_rotary_factor": 0.5, "factor": 0.5}, r"factor=0\.5 is invalid: expected a number >= 1"),
    ],
)
def test_bad_scaling(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ProportionalScaling(**kwargs)


def test_partial_rotary_of_the_embedding_must_stay_one():
    msg = r"partial_rotary_factor=0\.5 is invalid: expected 1\.0 with rope_type 'proportional'"
    for scaling in (ProportionalScaling(partial_rotary_factor=0.25), _params(0.25)):
        with pytest.raises(ValueError, match=msg):
            RotaryEmbedding(64, scaling=scaling, partial_rotary_factor=0.5)
        with pytest.raises(ValueError, match=msg):
            posenc.rope_frequencies(64, scaling=scaling, partial_rotary_factor=0.5)
    # the fraction inside an HF dict is p-RoPE's own, not a disagreement with partial_rotary_factor=1.0
    assert RotaryEmbedding(64, scaling=_params(0.25)).config.scaling == ProportionalScaling(partial_rotary_factor=0.25)
    with pytest.raises(ValueError, match=r"rope_scaling\['beta_fast'\]=32"):
        RotaryEmbedding(64, scaling={**_params(0.25), "beta_fast": 32})
    with pytest.raises(ValueError, match=r"p_rope: fraction=0\.5"):
        posenc.build("p_rope", head_dim=64, fraction=0.5)
    with pytest.raises(ValueError, match=r"partial_rotary_factor=2"):
        posenc.build("p_rope", head_dim=64, p=2)
