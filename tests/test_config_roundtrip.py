"""Configs round-trip: ``to_dict``/``from_dict`` (also through JSON), and Hugging Face dicts through
``posenc.hf.rotary_config_to_hf`` / ``rotary_config_from_hf`` (both the ``rope_parameters`` and legacy forms)."""

from __future__ import annotations

import json

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import posenc
from posenc import RotaryConfig, RotaryEmbedding, rope_frequencies
from posenc.hf import rotary_config_from_hf, rotary_config_to_hf

positive_int = st.integers(1, 1 << 20)
factor_st = st.floats(1.0, 64.0)


def maybe(strategy):
    return st.none() | strategy


# (head_dim, partial_rotary_factor) pairs whose rotary dim is even and >= 4 (NTK needs > 2).
dims_st = st.tuples(st.sampled_from([8, 16, 24, 32, 64, 128, 256]), st.sampled_from([1.0, 0.5, 0.25])).filter(
    lambda t: int(t[0] * t[1]) % 2 == 0 and int(t[0] * t[1]) >= 4
)


def positive_list(n: int):
    return st.lists(st.floats(0.01, 64.0), min_size=n, max_size=n)


def scaling_st(rotary_dim: int, *, hf_only: bool = False):
    """Every valid scaling config (``hf_only``: those a Hugging Face config holds as they are)."""
    f = rotary_dim // 2
    linear = st.builds(posenc.LinearScaling, factor=factor_st)
    ntk = st.builds(posenc.NTKScaling, factor=factor_st)
    dynamic = st.builds(posenc.DynamicNTKScaling, factor=factor_st, max_position_embeddings=positive_int)

    @st.composite
    def yarn(draw):
        original = draw(positive_int)
        factor = draw(maybe(factor_st))
        max_pos = draw(st.integers(original, 64 * original)) if factor is None else draw(maybe(positive_int))
        beta_slow = draw(st.floats(0.01, 8.0))
        return posenc.YaRNScaling(
            original_max_position_embeddings=original,
            factor=factor,
            max_position_embeddings=max_pos,
            beta_slow=beta_slow,
            beta_fast=beta_slow + draw(st.floats(0.01, 64.0)),
            truncate=draw(st.booleans()),
            mscale=draw(maybe(st.floats(0.0, 2.0))),
            mscale_all_dim=draw(maybe(st.floats(0.0, 2.0))),
            attention_factor=draw(maybe(st.floats(0.01, 4.0))),
        )

    @st.composite
    def longrope(draw):
        factor = draw(maybe(st.floats(0.01, 64.0)))
        max_pos = draw(maybe(positive_int))
        attention_factor = draw(maybe(st.floats(0.01, 4.0)))
        if factor is None and max_pos is None and attention_factor is None:
            factor = 4.0
        return posenc.LongRoPEScaling(
            short_factor=draw(positive_list(f)),
            long_factor=draw(positive_list(f)),
            # 1 divides by log(1) = 0 in the default attention factor: test_errors_rope covers it.
            original_max_position_embeddings=draw(st.integers(2, 1 << 20)),
            factor=factor,
            max_position_embeddings=max_pos,
            attention_factor=attention_factor,
        )

    @st.composite
    def llama3(draw):
        low = draw(st.floats(0.01, 8.0))
        return posenc.Llama3Scaling(
            factor=draw(factor_st),
            low_freq_factor=low,
            high_freq_factor=low + draw(st.floats(0.01, 8.0)),
            original_max_position_embeddings=draw(positive_int),
        )

    ntk_mixed = st.builds(posenc.MixedNTKScaling, factor=factor_st, mixed_b=st.floats(0.05, 4.0))
    ntk_alpha = st.builds(posenc.NTKAlphaScaling, alpha=st.floats(1.0, 4096.0))

    @st.composite
    def telechat3_yarn(draw):
        beta_slow = draw(st.floats(0.01, 8.0))
        return posenc.TeleChat3YaRNScaling(
            factor=draw(factor_st),
            original_max_position_embeddings=draw(positive_int),
            beta_slow=beta_slow,
            beta_fast=beta_slow + draw(st.floats(0.01, 64.0)),
            truncate=draw(st.booleans()),
            attn_factor=draw(maybe(st.floats(0.01, 4.0))),
        )

    @st.composite
    def yarn_log(draw):
        beta_slow = draw(st.floats(0.01, 8.0))
        return posenc.YaRNLogScaling(
            factor=draw(factor_st),
            original_max_position_embeddings=draw(positive_int),
            beta_slow=beta_slow,
            beta_fast=beta_slow + draw(st.floats(0.01, 64.0)),
            extrapolation_factor=draw(st.floats(0.0, 2.0)),
        )

    # Written to HF configs in another form (NTK and NTK-by-alpha as a base, TeleChat3 as plain yarn) or refused
    # (yarn_log): posenc's own dicts round-trip, HF configs only for the rest.
    posenc_only = [ntk, ntk_alpha, telechat3_yarn(), yarn_log()]
    choices = [linear, dynamic, yarn(), longrope(), llama3(), ntk_mixed] + ([] if hf_only else posenc_only)
    return st.none() | st.one_of(choices)


@st.composite
def rotary_config_st(draw, *, hf_only: bool = False):
    head_dim, partial = draw(dims_st)
    return RotaryConfig(
        head_dim=head_dim,
        base=draw(st.floats(1.5, 1e7)),
        scaling=draw(scaling_st(int(head_dim * partial), hf_only=hf_only)),
        layout="half" if hf_only else draw(st.sampled_from(["half", "interleaved"])),
        partial_rotary_factor=partial,
    )


# --------------------------------------------------------------------------------------------------------------
# to_dict / from_dict


@given(config=rotary_config_st())
def test_rotary_config_round_trip(config):
    d = config.to_dict()
    assert RotaryConfig.from_dict(d) == config
    assert RotaryConfig.from_dict(json.loads(json.dumps(d))) == config  # to_dict holds plain JSON types
    assert RotaryEmbedding.from_config(d).config == config


@given(config=rotary_config_st())
def test_scaling_config_round_trip(config):
    scaling = config.scaling
    if scaling is None:
        assert posenc.parse_scaling(None) is None
        assert posenc.parse_scaling({"rope_type": "default"}) is None
        return
    d = scaling.to_dict()
    assert d["rope_type"] == scaling.rope_type
    assert type(scaling).from_dict(d) == scaling
    assert posenc.RopeScaling.from_dict(d) == scaling  # the base class dispatches on rope_type
    assert posenc.parse_scaling(json.loads(json.dumps(d))) == scaling
    legacy = {("type" if k == "rope_type" else k): v for k, v in d.items()}
    assert posenc.parse_scaling(legacy) == scaling


@given(config=rotary_config_st())
def test_dict_and_object_scalings_build_the_same_module(config):
    as_dict = RotaryConfig.from_dict(config.to_dict())
    a, b = RotaryEmbedding.from_config(config), RotaryEmbedding.from_config(as_dict)
    torch.testing.assert_close(a.inv_freq, b.inv_freq, rtol=0, atol=0)
    assert a.attention_factor == b.attention_factor


# --------------------------------------------------------------------------------------------------------------
# Hugging Face dicts


@st.composite
def hf_config_st(draw):
    """A Hugging Face model config dict, in either generation, from a valid posenc config."""
    config = draw(rotary_config_st(hf_only=True))
    rope = {"rope_type": "default"} if config.scaling is None else config.scaling.to_dict()
    out = {}
    if draw(st.booleans()):
        out["head_dim"] = config.head_dim
    else:
        heads = draw(st.sampled_from([1, 2, 4, 32]))
        out["hidden_size"], out["num_attention_heads"] = config.head_dim * heads, heads
    if "max_position_embeddings" in rope:
        out["max_position_embeddings"] = rope.pop("max_position_embeddings")  # HF keeps it at top level
    if draw(st.booleans()):  # transformers >= 5
        rope["rope_theta"] = config.base
        if config.partial_rotary_factor != 1.0:
            rope["partial_rotary_factor"] = config.partial_rotary_factor
        out["rope_parameters"] = rope
    else:  # legacy: rope_theta at top level, rope_scaling with the old "type" key or no dict at all
        out["rope_theta"] = config.base
        if config.partial_rotary_factor != 1.0:
            out["partial_rotary_factor"] = config.partial_rotary_factor
        if rope["rope_type"] != "default":
            out["rope_scaling"] = {("type" if k == "rope_type" else k): v for k, v in rope.items()}
    return out, config


@given(hf_and_config=hf_config_st(), legacy=st.booleans())
def test_hf_dict_round_trip(hf_and_config, legacy):
    hf, expected = hf_and_config
    config = rotary_config_from_hf(hf)
    assert config == expected
    runtime = "vllm" if isinstance(config.scaling, posenc.MixedNTKScaling) else "transformers"  # vLLM's form only
    exported = rotary_config_to_hf(config, legacy=legacy, runtime=runtime)
    assert rotary_config_from_hf(json.loads(json.dumps(exported))) == config
    assert ("rope_scaling" in exported) == legacy and ("rope_parameters" in exported) != legacy
    assert RotaryEmbedding.from_hf(exported).config == config


@given(
    dims=dims_st,
    base=st.floats(1.5, 1e7),
    factor=st.floats(1.0, 64.0),
    layout_legacy=st.booleans(),
)
def test_static_ntk_exports_as_default_rope_with_enlarged_base(dims, base, factor, layout_legacy):
    head_dim, partial = dims
    ntk = RotaryConfig(
        head_dim=head_dim, base=base, scaling=posenc.NTKScaling(factor=factor), partial_rotary_factor=partial
    )
    exported = rotary_config_to_hf(ntk, legacy=layout_legacy)
    back = rotary_config_from_hf(exported)
    assert back.scaling is None and back.partial_rotary_factor == partial and back.head_dim == head_dim
    rd = ntk.rotary_dim
    assert back.base == pytest.approx(base * factor ** (rd / (rd - 2)), rel=1e-15)
    expected, _ = rope_frequencies(head_dim, base=base, scaling=ntk.scaling, partial_rotary_factor=partial)
    torch.testing.assert_close(RotaryEmbedding.from_config(back).inv_freq, expected)
    torch.testing.assert_close(RotaryEmbedding.from_config(ntk).inv_freq, expected, rtol=0, atol=0)


@pytest.mark.parametrize(
    "hf,expected",
    [
        (  # Llama 3.1, transformers >= 5
            {
                "hidden_size": 4096,
                "num_attention_heads": 32,
                "max_position_embeddings": 131072,
                "rope_parameters": {
                    "rope_type": "llama3",
                    "rope_theta": 500000.0,
                    "factor": 8.0,
                    "low_freq_factor": 1.0,
                    "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 8192,
                },
            },
            RotaryConfig(
                head_dim=128,
                base=500000.0,
                scaling=posenc.Llama3Scaling(
                    factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=8192
                ),
            ),
        ),
        (  # GPT-NeoX: rotary_pct, legacy linear with the old "type" key
            {
                "hidden_size": 512,
                "num_attention_heads": 8,
                "rotary_pct": 0.25,
                "rope_theta": 10000,
                "rope_scaling": {"type": "linear", "factor": 2.0},
            },
            RotaryConfig(head_dim=64, partial_rotary_factor=0.25, scaling=posenc.LinearScaling(factor=2.0)),
        ),
        (  # Phi-3: original_max_position_embeddings at top level, no factor
            {
                "head_dim": 8,
                "max_position_embeddings": 131072,
                "original_max_position_embeddings": 4096,
                "rope_theta": 10000.0,
                "rope_scaling": {"type": "longrope", "short_factor": [1.0] * 4, "long_factor": [2.0] * 4},
            },
            RotaryConfig(
                head_dim=8,
                scaling=posenc.LongRoPEScaling(
                    short_factor=(1.0,) * 4,
                    long_factor=(2.0,) * 4,
                    original_max_position_embeddings=4096,
                    max_position_embeddings=131072,
                ),
            ),
        ),
        (  # dynamic reads the model's max_position_embeddings
            {"head_dim": 16, "max_position_embeddings": 2048, "rope_scaling": {"rope_type": "dynamic", "factor": 2}},
            RotaryConfig(head_dim=16, scaling=posenc.DynamicNTKScaling(factor=2.0, max_position_embeddings=2048)),
        ),
    ],
    ids=["llama3.1", "gpt-neox", "phi3", "dynamic"],
)
@pytest.mark.parametrize("legacy", [False, True])
def test_known_hf_configs_round_trip(hf, expected, legacy):
    config = rotary_config_from_hf(hf)
    assert config == expected
    assert rotary_config_from_hf(rotary_config_to_hf(config, legacy=legacy)) == config
