"""``extend_context(model, "yarn+string", F)``: the composed method ``posenc export`` and ``posenc extend`` name, as
the two calls it stands for (the frequency method, then STRING within the stretched context)."""

from __future__ import annotations

import copy

import pytest
import torch

pytest.importorskip("transformers")

from hf.tiny import logits, tiny_model  # noqa: E402 - after the skip
from posenc.hf import extend_context  # noqa: E402
from posenc.hf._record import extensions  # noqa: E402


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
@pytest.mark.parametrize("first", ["yarn", "linear"])
def test_a_composed_method_is_the_two_calls(kind, first):
    composed = tiny_model(kind)
    twice = copy.deepcopy(composed)
    described = extend_context(composed, f"{first}+string", 2.0)
    frequency = extend_context(twice, first, 2.0)
    remapped = extend_context(twice, "string", 1.0)
    original = composed.config.max_position_embeddings // 2
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, composed.config.vocab_size, (2, 3 * original // 2), generator=generator)
    torch.testing.assert_close(logits(composed, ids), logits(twice, ids), rtol=0, atol=0)
    assert described["frequency"]["scaling"] == frequency["scaling"]
    assert described["parameters"] == remapped["parameters"]
    assert [r["method"] for r in extensions(composed)] == [first, "string"] == [r["method"] for r in extensions(twice)]


@pytest.mark.parametrize(
    ("method", "extra", "match"),
    [
        ("yarn+self_extend", {}, r"method='yarn\+self_extend' is invalid: expected one of"),
        ("string+yarn", {}, r"method='string\+yarn' is invalid"),
        ("yarn+string", {"beta_fast": 16}, "beta_fast=16 is invalid: expected no option with the composed"),
        ("yarn+string", {"layer_type": "full_attention"}, "layer_type='full_attention' is invalid: expected None"),
    ],
)
def test_a_bad_composed_method_leaves_the_model_unchanged(method, extra, match):
    model = tiny_model("llama")
    before = copy.deepcopy(model.config.to_dict())
    with pytest.raises(ValueError, match=match):
        extend_context(model, method, 2.0, **extra)
    assert model.config.to_dict() == before and not extensions(model)
