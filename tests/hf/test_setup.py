"""``posenc.hf.positional_setup``, ``alibi_config_from_hf`` / ``alibi_config_to_hf``: transformers configs read into
posenc configs, checked against what transformers' own modules compute (``inv_freq``, ALiBi slopes)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
import transformers
import transformers.models.bloom.modeling_bloom as bloom
import transformers.models.mpt.modeling_mpt as mpt

from hf.tiny import ORIGINAL, ROPE_KINDS, tiny_config, tiny_model
from posenc import ALiBiConfig, LongRoPEScaling, RotaryConfig
from posenc.functional import alibi_slopes
from posenc.hf import alibi_config_from_hf, alibi_config_to_hf, positional_setup, rotary_config_from_hf
from posenc.scalings import rope_frequencies
from tolerances import bloom_slopes_rtol, mpt_slopes_rtol


def _hf_inv_freq(model, layer_type=None):
    rotary = model.model.rotary_emb if hasattr(model, "model") else model.gpt_neox.rotary_emb
    return getattr(rotary, "inv_freq" if layer_type is None else f"{layer_type}_inv_freq")


@pytest.mark.parametrize("kind", [k for k in ROPE_KINDS if k != "gemma3_text"])
def test_rope_setup_gives_the_model_frequencies(kind):
    model = tiny_model(kind)
    setup = positional_setup(model)  # a model, its config and its dict read alike
    assert setup == positional_setup(model.config) == positional_setup(model.config.to_dict())
    partial = 0.5 if kind == "gpt_neox" else 1.0
    assert setup == RotaryConfig(head_dim=8, base=10000.0, partial_rotary_factor=partial)
    inv_freq, _ = rope_frequencies(8, base=setup.base, partial_rotary_factor=setup.partial_rotary_factor)
    torch.testing.assert_close(inv_freq, _hf_inv_freq(model), rtol=2e-7, atol=0)


def test_phi3_longrope_setup():
    """Phi-3 keeps original_max_position_embeddings at the top level of its config."""
    short, long = [1.0, 1.1, 1.2, 1.3], [1.0, 2.0, 4.0, 8.0]
    params = {"rope_type": "longrope", "short_factor": short, "long_factor": long}
    model = tiny_model(
        "phi3", rope_parameters=params, max_position_embeddings=4 * ORIGINAL, original_max_position_embeddings=ORIGINAL
    )
    setup = positional_setup(model.config)
    assert setup.scaling == LongRoPEScaling(
        short_factor=short,
        long_factor=long,
        original_max_position_embeddings=ORIGINAL,
        max_position_embeddings=4 * ORIGINAL,
    )
    rotary = model.model.rotary_emb
    for seq_len in (ORIGINAL, 4 * ORIGINAL):  # short factors, then long ones
        inv_freq, attention = setup.scaling.frequencies(8, base=setup.base, seq_len=seq_len)
        hf_inv_freq, hf_attention = transformers.modeling_rope_utils.ROPE_INIT_FUNCTIONS["longrope"](
            model.config, None, seq_len=seq_len
        )
        torch.testing.assert_close(inv_freq, hf_inv_freq, rtol=2e-7, atol=0)
        assert attention == pytest.approx(hf_attention, rel=1e-12) == pytest.approx(rotary.attention_scaling)


def test_gemma3_per_layer_type_setup():
    model = tiny_model("gemma3_text")
    setup = positional_setup(model.config)
    assert setup == {
        "full_attention": RotaryConfig(head_dim=8, base=1e6),
        "sliding_attention": RotaryConfig(head_dim=8, base=1e4),
    }
    for layer_type, rope in setup.items():
        inv_freq, _ = rope_frequencies(8, base=rope.base)
        torch.testing.assert_close(inv_freq, _hf_inv_freq(model, layer_type), rtol=2e-7, atol=0)


@pytest.mark.parametrize("heads", [1, 4, 6, 12, 16])
def test_alibi_slopes_are_bloom_and_mpt_slopes(heads):
    bloom_config = tiny_config("bloom", n_head=heads, hidden_size=4 * heads)
    mpt_config = tiny_config("mpt", n_heads=heads, d_model=4 * heads)
    assert positional_setup(bloom_config) == ALiBiConfig(num_heads=heads) == alibi_config_from_hf(mpt_config)
    slopes = alibi_slopes(heads)
    torch.testing.assert_close(slopes, bloom._get_alibi_slopes(heads, "cpu"), rtol=bloom_slopes_rtol(heads), atol=0)
    mpt_bias = mpt.build_mpt_alibi_tensor(heads, 2)  # (H, 1, 2): [-m_h, 0]
    torch.testing.assert_close(slopes, -mpt_bias[:, 0, 0], rtol=mpt_slopes_rtol(heads), atol=0)


@pytest.mark.parametrize("kind", ["bloom", "mpt"])
def test_alibi_config_round_trip(kind):
    config = ALiBiConfig(num_heads=6)
    keys = alibi_config_to_hf(config, model_type=kind)
    assert alibi_config_from_hf(tiny_config(kind, **keys)) == config
    assert alibi_config_from_hf({"model_type": kind, **keys}) == config


def test_alibi_errors():
    with pytest.raises(ValueError, match=r"alibi_bias_max'\]=16.*ignores"):
        alibi_config_from_hf(tiny_config("mpt", attn_config={"alibi_bias_max": 16}))
    with pytest.raises(ValueError, match=r"alibi'\]=False"):
        alibi_config_from_hf(tiny_config("mpt", attn_config={"alibi": False}))
    with pytest.raises(ValueError, match="model_type='llama'"):
        alibi_config_from_hf(tiny_config("llama"))
    with pytest.raises(ValueError, match="symmetric=True"):
        alibi_config_to_hf(ALiBiConfig(num_heads=4, symmetric=True), model_type="bloom")
    with pytest.raises(ValueError, match="eval_len=64"):
        alibi_config_to_hf(ALiBiConfig(num_heads=4, train_len=32, eval_len=64), model_type="mpt")
    with pytest.raises(ValueError, match="model_type='falcon'"):
        alibi_config_to_hf(ALiBiConfig(num_heads=4), model_type="falcon")


@pytest.mark.parametrize(
    ("config", "match"),
    [
        (transformers.GPT2Config(), "model_type='gpt2'.*learned absolute position embeddings"),
        (transformers.T5Config(), "model_type='t5'.*T5 relative position buckets"),
        (transformers.BertConfig(), "model_type='bert'"),
        ({"hidden_size": 32}, "model_type=None"),
    ],
)
def test_unhandled_architectures_are_named(config, match):
    with pytest.raises(ValueError, match=match):
        positional_setup(config)


def test_old_imports_and_no_transformers_at_import():
    """``posenc.hf`` was a module: its names still import, and importing it does not import transformers."""
    assert rotary_config_from_hf(tiny_config("llama")) == RotaryConfig(head_dim=8)
    code = "import sys, posenc.hf; posenc.hf.rotary_config_to_hf; assert 'transformers' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
