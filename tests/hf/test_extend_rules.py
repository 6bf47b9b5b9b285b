"""``extend_context`` on a model that is already scaled: one rule for every method and every call (issue 22,
findings 3-5). The same method composes (total factor over the scaling's own original length, context x factor),
anything that would drop the model's frequencies is refused unless ``replace=True``, no context shrinks silently,
and a patched length-switching model warns where transformers' KV cache goes stale.

Every expected config below is written out by hand from transformers' documented ``rope_parameters`` keys; the
patched model's logits must equal, bit for bit, those of the model transformers builds natively from it.
"""

from __future__ import annotations

import warnings

import pytest
import torch

from hf.test_extend_errors import _assert_unchanged, _snapshot
from hf.tiny import ORIGINAL, logits, tiny_model
from posenc.hf import CacheStaleWarning, extend_context
from posenc.scalings import Llama3Scaling

THETA = {"rope_theta": 10000.0}
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0}
LLAMA3_MODEL = {"rope_parameters": {**LLAMA3, "original_max_position_embeddings": ORIGINAL, **THETA}}


def _llama3_model():
    return tiny_model("llama", **LLAMA3_MODEL, max_position_embeddings=8 * ORIGINAL)


def _same_as_native(model, ids, **config):
    native = tiny_model(model.config.model_type, model.state_dict(), **config)
    torch.testing.assert_close(logits(model, ids), logits(native, ids), rtol=0, atol=0)


def test_linear_twice_compounds(ids):
    """The issue's finding 3: linear x2 twice claimed 128 tokens with frequencies for 64. Now x4 over 32."""
    model = tiny_model("llama")
    first = extend_context(model, "linear", 2.0)
    second = extend_context(model, "linear", 2.0)
    assert (first["rule"], second["rule"]) == ("new", "composed")
    assert second["description"] == "linear x2 then x2 = linear x4"
    assert model.config.max_position_embeddings == 4 * ORIGINAL
    _same_as_native(
        model,
        ids,
        rope_parameters={"rope_type": "linear", "factor": 4.0, **THETA},
        max_position_embeddings=4 * ORIGINAL,
    )


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_yarn_twice_is_yarn_at_the_total_factor(kind, ids):
    model = tiny_model(kind)
    extend_context(model, "yarn", 2.0)
    report = extend_context(model, "yarn", 2.0)
    assert report["description"] == f"yarn x2 over {ORIGINAL} then x2 = yarn x4"
    params = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": ORIGINAL, **THETA}
    _same_as_native(model, ids, rope_parameters=params, max_position_embeddings=4 * ORIGINAL)


def test_dynamic_twice_compounds(ids):
    model = tiny_model("llama")
    extend_context(model, "dynamic", 2.0)
    extend_context(model, "dynamic", 3.0)
    _same_as_native(model, ids, rope_parameters={"rope_type": "dynamic", "factor": 6.0, **THETA})


def test_a_trained_llama3_scaling_composes_with_llama3(ids):
    model = _llama3_model()
    report = extend_context(model, "llama3", 2.0)
    assert report["previous_scaling"] == Llama3Scaling(
        factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=ORIGINAL
    )
    assert report["max_position_embeddings"] == {"old": 8 * ORIGINAL, "new": 16 * ORIGINAL}
    params = {**LLAMA3, "factor": 16.0, "original_max_position_embeddings": ORIGINAL, **THETA}
    _same_as_native(model, ids, rope_parameters=params, max_position_embeddings=16 * ORIGINAL)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        # Finding 4: yarn on a llama3 model dropped the llama3 frequencies and shrank the context 256 -> 64.
        (
            {"method": "yarn", "factor": 2.0},
            r"method='yarn'.*'llama3', which composes.*llama3 x8 over 32.*replace=True",
        ),
        (
            {"method": "yarn", "factor": 2.0, "original_max_position_embeddings": 8 * ORIGINAL},
            r"method='yarn'.*would replace the llama3 frequencies",
        ),
        ({"method": "linear", "factor": 2.0}, r"method='linear'.*llama3"),
        (
            {"method": "llama3", "factor": 2.0, "original_max_position_embeddings": 64},
            r"original_max_position_embeddings=64.*None or 32.*already fixes its original length",
        ),
        # replace=True still may not shrink the context: yarn x2 over 32 covers 64 of the model's 256 tokens.
        ({"method": "yarn", "factor": 2.0, "replace": True}, r"factor=2\.0.*context of 256 tokens.*covers only 64"),
        ({"method": "yarn", "factor": 2.0, "replace": "yes"}, r"replace='yes'.*True or False"),
    ],
)
def test_what_would_drop_a_scaling_is_refused_and_the_model_unchanged(kwargs, match):
    model = _llama3_model()
    before = _snapshot(model)
    with pytest.raises(ValueError, match=match):
        extend_context(model, **kwargs)
    _assert_unchanged(model, before)


def test_longrope_twice_is_refused():
    model = tiny_model("llama")
    extend_context(model, "longrope", 2.0, long_factor=[2.0] * 4)
    before = _snapshot(model)
    with pytest.raises(ValueError, match="LongRoPE's factors are searched for one target length"):
        extend_context(model, "longrope", 2.0, long_factor=[3.0] * 4)
    _assert_unchanged(model, before)


def test_replace_drops_the_scaling_on_purpose(ids):
    model = _llama3_model()
    report = extend_context(model, "yarn", 8.0, replace=True)
    assert report["rule"] == "replaced" and "replacing llama3 x8 over 32" in report["description"]
    params = {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": ORIGINAL, **THETA}
    _same_as_native(model, ids, rope_parameters=params, max_position_embeddings=8 * ORIGINAL)


def test_a_shorter_context_only_when_asked():
    """Refused when it would follow from defaults (the llama3 cases above); allowed when the caller says so: an
    explicit target, or an explicit original length ("treat this model as trained at 8 tokens", as the lab does)."""
    model = tiny_model("llama")
    report = extend_context(model, "linear", 2.0, original_max_position_embeddings=8, max_position_embeddings=16)
    assert model.config.max_position_embeddings == 16 and report["max_position_embeddings"]["new"] == 16
    other = tiny_model("llama")
    assert extend_context(other, "yarn", 2.0, original_max_position_embeddings=8)["max_position_embeddings"] == {
        "old": ORIGINAL,
        "new": 16,
    }


@pytest.mark.parametrize("kind", ["bloom", "mpt"])
def test_alibi_twice_compounds_or_replaces(kind, ids):
    twice = tiny_model(kind)
    extend_context(twice, "linear", 2.0)
    report = extend_context(twice, "linear", 4.0)
    assert report["rule"] == "composed"
    once = tiny_model(kind, twice.state_dict())
    extend_context(once, "linear", 8.0)
    torch.testing.assert_close(logits(twice, ids), logits(once, ids), rtol=0, atol=0)
    assert extend_context(twice, "linear", 4.0, replace=True)["rule"] == "replaced"
    four = tiny_model(kind, twice.state_dict())
    extend_context(four, "linear", 4.0)
    torch.testing.assert_close(logits(twice, ids), logits(four, ids), rtol=0, atol=0)


# ---------------------------------------------------------------------------------------------------------------
# Finding 5: transformers' cache holds keys rotated with the frequencies of the step that wrote them


def _generate(model, length, new_tokens):
    ids = torch.randint(1, 64, (1, length), generator=torch.Generator().manual_seed(0))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.generate(ids, max_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
    return [w for w in caught if issubclass(w.category, CacheStaleWarning)]


def test_cached_generation_across_the_switch_warns():
    """Dynamic NTK: the cached keys are re-rotated (tests/hf/test_cache_rerotate.py), but the deeper layers' cache
    was computed from hidden states of earlier lengths, so cached generation still differs from the full forward."""
    model = tiny_model("llama")
    extend_context(model, "dynamic", 4.0)
    assert _generate(model, ORIGINAL - 8, 4) == []  # stays within the original length: nothing stale
    caught = _generate(model, ORIGINAL - 2, 6)
    assert len(caught) == 1 and "cached decoding differs from the full forward" in str(caught[0].message)


def test_the_drift_the_warning_is_about_is_real():
    """The warned-about case, measured in float64 (eager attention's float32 softmax leaves ~1e-8): past the
    switch, a cached step differs from the no-cache forward even with the cached keys re-rotated."""
    model = tiny_model("mistral").double()
    extend_context(model, "longrope", 4.0, long_factor=[1.0 + 1.5 * i for i in range(4)])
    ids = torch.randint(1, 64, (1, ORIGINAL), generator=torch.Generator().manual_seed(1))
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", CacheStaleWarning)
        out = model(ids, use_cache=True)
        nxt = torch.tensor([[5]])
        cached = model(nxt, cache=out.past_key_values, use_cache=True).logits[:, -1]
    full = logits(model, torch.cat([ids, nxt], dim=1))[:, -1]
    assert (cached - full).abs().max() > 1e-6


@pytest.mark.parametrize(
    ("kind", "method"), [("llama", "yarn"), ("llama", "linear"), ("phi3", "longrope"), ("mistral", "longrope")]
)
def test_no_warning_where_no_cache_goes_stale(kind, method):
    """Fixed frequencies never go stale; at the LongRoPE switch generate drops its cache and re-encodes (Phi-3's own
    generation code does; posenc's patch does it for the other architectures)."""
    model = tiny_model(kind)
    extend_context(model, method, 4.0, **({"long_factor": [2.0] * 4} if method == "longrope" else {}))
    assert _generate(model, ORIGINAL - 2, 6) == []


def test_a_second_call_replaces_the_guard():
    model = tiny_model("llama")
    extend_context(model, "dynamic", 2.0)
    extend_context(model, "dynamic", 2.0)
    assert len(model.model.rotary_emb._forward_pre_hooks) == 1  # keep_rope_float32's float32 tables, once
    for layer in model.model.layers:  # the cache finder and the re-rotation, each once
        assert len(layer.self_attn._forward_pre_hooks) == 2
    assert len(_generate(model, ORIGINAL - 2, 6)) == 1
