"""``posenc.hf.extend_context`` on p-RoPE models (``rope_type: "proportional"``: a tiny Llama, and a tiny Gemma 4 whose
full-attention layers use it): ``linear`` divides the rotating pairs' frequencies by the factor through HF's own
``factor`` key, so the patched model equals the one transformers builds natively from that config; the other methods
have no HF form there and are refused."""

from __future__ import annotations

import pytest
import torch
import transformers

from hf.test_extend_errors import _assert_unchanged, _snapshot
from hf.tiny import ORIGINAL, logits, tiny_model
from posenc import ProportionalScaling, RotaryConfig, RotaryEmbedding
from posenc.hf import extend_context, positional_setup

P_ROPE = {"rope_type": "proportional", "partial_rotary_factor": 0.5, "rope_theta": 10000.0}  # 2 of 4 pairs rotate


def _model(state_dict=None, **overrides):
    return tiny_model("llama", state_dict, **{"rope_parameters": dict(P_ROPE), **overrides})


@pytest.mark.parametrize("factor", [2.0, 4.0])
def test_linear_is_the_proportional_factor(factor, ids):
    model = _model()
    before = logits(model, ids)
    report = extend_context(model, "linear", factor)
    native = _model(
        model.state_dict(),
        rope_parameters={**P_ROPE, "factor": factor},
        max_position_embeddings=int(ORIGINAL * factor),
    )
    torch.testing.assert_close(logits(model, ids), logits(native, ids), rtol=0, atol=0)
    assert not torch.allclose(logits(model, ids), before)
    assert report["scaling"] == ProportionalScaling(partial_rotary_factor=0.5, factor=factor)
    assert model.config.rope_parameters == {**P_ROPE, "factor": factor}
    assert positional_setup(model.config) == RotaryConfig(head_dim=8, scaling=report["scaling"])
    inv_freq = model.model.rotary_emb.inv_freq
    assert torch.equal(inv_freq[2:], torch.zeros(2))  # the non-rotating pairs stay at frequency zero


def test_a_second_linear_composes_with_the_first(ids):
    """The rule of tests/hf/test_extend_rules.py: linear x2 then x4 is linear x8, the context 32 -> 64 -> 256."""
    twice = _model()
    extend_context(twice, "linear", 2.0)
    assert extend_context(twice, "linear", 4.0)["rule"] == "composed"
    native = _model(twice.state_dict(), rope_parameters={**P_ROPE, "factor": 8.0}, max_position_embeddings=256)
    torch.testing.assert_close(logits(twice, ids), logits(native, ids), rtol=0, atol=0)


@pytest.mark.parametrize("method", ["ntk", "dynamic", "yarn", "llama3", "longrope"])
def test_other_methods_are_refused_and_the_model_unchanged(method):
    model = _model()
    before = _snapshot(model)
    options = {"long_factor": [2.0, 2.0, 2.0, 2.0]} if method == "longrope" else {}
    expected = rf"method='{method}' is invalid: expected 'linear', which composes.*proportional"
    with pytest.raises(ValueError, match=expected):
        extend_context(model, method, 2.0, **options)
    _assert_unchanged(model, before)


# ---------------------------------------------------------------------------------------------------------------
# Gemma 4: sliding-attention layers are plain RoPE, full-attention layers p-RoPE at their own (larger) head_dim

GEMMA4 = dict(
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    global_head_dim=16,  # the full-attention layers' head_dim (per_layer_config)
    vocab_size=64,
    vocab_size_per_layer_input=64,
    hidden_size_per_layer_input=8,
    max_position_embeddings=ORIGINAL,
    sliding_window=16,
    layer_types=["sliding_attention", "full_attention"],
    pad_token_id=0,
)
GEMMA4_ROPE = {
    "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
    "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1e6},
}


def _gemma4(state_dict=None, **overrides):
    config = transformers.Gemma4TextConfig(**{**GEMMA4, **overrides})
    config._attn_implementation = "eager"
    model = transformers.Gemma4ForCausalLM(config).eval()
    if state_dict is not None:
        model.load_state_dict(state_dict)
    return model


def test_gemma4_positional_setup_reads_each_layer_type():
    model = _gemma4()
    setup = positional_setup(model)
    assert setup == {
        "full_attention": RotaryConfig(head_dim=16, base=1e6, scaling=ProportionalScaling(partial_rotary_factor=0.25)),
        "sliding_attention": RotaryConfig(head_dim=8, base=10000.0),
    }
    rotary = model.model.rotary_emb
    full = RotaryEmbedding.from_config(setup["full_attention"])
    assert torch.equal(full.inv_freq, rotary.full_attention_inv_freq)  # 2 of 8 pairs rotate
    sliding = RotaryEmbedding.from_config(setup["sliding_attention"])
    torch.testing.assert_close(sliding.inv_freq, rotary.sliding_attention_inv_freq, rtol=2e-7, atol=0)


@pytest.mark.parametrize(("layer_type", "method"), [("full_attention", "linear"), ("sliding_attention", "yarn")])
def test_gemma4_patched_equals_native(layer_type, method, ids):
    model = _gemma4()
    before = logits(model, ids)
    extend_context(model, method, 4.0, layer_type=layer_type)
    params = {k: dict(v) for k, v in GEMMA4_ROPE.items()}
    if method == "linear":
        params[layer_type]["factor"] = 4.0
    else:
        params[layer_type].update(rope_type="yarn", factor=4.0, original_max_position_embeddings=ORIGINAL)
    native = _gemma4(model.state_dict(), rope_parameters=params, max_position_embeddings=4 * ORIGINAL)
    torch.testing.assert_close(logits(model, ids), logits(native, ids), rtol=0, atol=0)
    assert not torch.allclose(logits(model, ids), before)


def test_gemma4_full_attention_refuses_other_methods():
    model = _gemma4()
    rotary = model.model.rotary_emb
    before = {k: b.clone() for k, b in rotary._buffers.items()}
    with pytest.raises(ValueError, match=r"method='yarn' is invalid: expected 'linear', which composes.*gemma4_text"):
        extend_context(model, "yarn", 4.0, layer_type="full_attention")
    assert all(torch.equal(rotary._buffers[k], b) for k, b in before.items())
    assert model.config.rope_parameters["full_attention"] == GEMMA4_ROPE["full_attention"]
