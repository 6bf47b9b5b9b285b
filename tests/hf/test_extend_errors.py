"""``posenc.hf.extend_context`` refuses bad input with a ``ValueError`` naming it, and leaves the model unchanged."""

from __future__ import annotations

import pytest
import torch
import transformers

from hf.tiny import ORIGINAL, tiny_model
from posenc.hf import extend_context


def _snapshot(model):
    rotary = model.model.rotary_emb
    return (
        model.config.to_dict(),
        {k: b.clone() for k, b in rotary._buffers.items()},
        rotary.rope_type,
        rotary.attention_scaling,
    )


def _assert_unchanged(model, snapshot):
    config, buffers, rope_type, attention = snapshot
    rotary = model.model.rotary_emb
    assert model.config.to_dict() == config
    assert rotary._buffers.keys() == buffers.keys()
    for k, b in buffers.items():
        torch.testing.assert_close(rotary._buffers[k], b, rtol=0, atol=0)
    assert (rotary.rope_type, rotary.attention_scaling) == (rope_type, attention)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"method": "linear", "factor": 0.5}, r"factor=0\.5.*>= 1"),
        ({"method": "linear", "factor": float("nan")}, "factor=nan"),
        ({"method": "linear", "factor": True}, "factor=True"),
        ({"method": "pi", "factor": 2.0}, "method='pi'.*'linear'"),
        ({"method": "yarn", "factor": 2.0, "beta_fst": 4.0}, "beta_fst=4.0.*beta_fast"),
        ({"method": "linear", "factor": 2.0, "beta_fast": 4.0}, "beta_fast=4.0.*'linear'"),
        ({"method": "yarn", "factor": 2.0, "beta_fast": 0.5}, "beta_fast=0.5"),
        (
            {"method": "linear", "factor": 2.0, "original_max_position_embeddings": 64, "max_position_embeddings": 48},
            "original_max_position_embeddings=64.*max_position_embeddings=48",
        ),
        (
            {"method": "linear", "factor": 2.0, "original_max_position_embeddings": 0},
            "original_max_position_embeddings=0",
        ),
        ({"method": "dynamic", "factor": 2.0, "max_position_embeddings": 128}, "max_position_embeddings=128.*dynamic"),
        ({"method": "longrope", "factor": 2.0}, "long_factor=None.*4 positive numbers"),
        ({"method": "longrope", "factor": 2.0, "long_factor": [1.0, 2.0]}, r"len\(long_factor\)=2"),
        ({"method": "linear", "factor": 2.0, "layer_type": "full_attention"}, "layer_type='full_attention'"),
    ],
)
def test_bad_input_is_refused_and_model_unchanged(kwargs, match):
    model = tiny_model("llama")
    before = _snapshot(model)
    with pytest.raises(ValueError, match=match):
        extend_context(model, **kwargs)
    _assert_unchanged(model, before)


def test_scaling_the_config_class_rejects():
    """Phi-3's config accepts only default RoPE and LongRoPE: a linear Phi-3 could not be saved and reloaded."""
    model = tiny_model("phi3")
    before = _snapshot(model)
    with pytest.raises(ValueError, match=r"method='linear'.*phi3 \(Phi3ForCausalLM\)"):
        extend_context(model, "linear", 2.0)
    _assert_unchanged(model, before)


def test_unhandled_architectures_are_named():
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_embd=32, n_head=4, n_layer=1, vocab_size=64))
    with pytest.raises(ValueError, match=r"model_type of GPT2LMHeadModel='gpt2'.*learned absolute"):
        extend_context(gpt2, "linear", 2.0)
    with pytest.raises(ValueError, match="model=.*Linear.*transformers model"):
        extend_context(torch.nn.Linear(2, 2), "linear", 2.0)


def test_a_rope_model_without_rotary_modules():
    """A supported model type whose rotary module is gone is refused, never run unpatched."""
    model = tiny_model("llama")
    model.model.rotary_emb = torch.nn.Identity()
    with pytest.raises(ValueError, match=r"llama \(LlamaForCausalLM\).*none holds an inv_freq"):
        extend_context(model, "linear", 2.0)


def test_factor_one_is_the_identity(ids):
    model = tiny_model("llama")
    with torch.no_grad():
        before = model(ids).logits
        report = extend_context(model, "linear", 1.0)
        torch.testing.assert_close(model(ids).logits, before, rtol=0, atol=0)
    assert report["max_position_embeddings"] == {"old": ORIGINAL, "new": ORIGINAL}
