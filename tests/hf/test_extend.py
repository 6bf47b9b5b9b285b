"""``posenc.hf.extend_context`` on tiny RoPE models: the patched model equals the one transformers builds natively
from the scaled config (same weights), at three times the original length.

The expected configs are written out here by hand from Hugging Face's documented ``rope_parameters`` keys, not
taken from ``extend_context``'s output. Static NTK has no transformers type: its reference is default RoPE with the
enlarged base ``base * factor ** (d / (d - 2))`` (d the rotary dimension).
"""

from __future__ import annotations

import pytest
import torch

from hf.test_extend_remap import CONFIG_SWITCHES, SWITCHES
from hf.tiny import ORIGINAL, ROPE_KINDS, logits, tiny_config, tiny_model
from posenc.hf import extend_context, positional_setup
from posenc.scalings import rope_frequencies

FACTOR = 4.0
METHODS = ("linear", "ntk", "dynamic", "yarn", "longrope", "llama3")
# Phi-3's config class accepts only default RoPE and LongRoPE (its validate_rope raises on the rest).
PHI3_METHODS = ("ntk", "longrope")


def _rotary_dim(kind: str) -> int:
    return 4 if kind == "gpt_neox" else 8  # head_dim 8; GPT-NeoX rotates half of it (rotary_pct=0.5)


def _long_factor(kind: str) -> list[float]:
    return [1.0 + 1.5 * i for i in range(_rotary_dim(kind) // 2)]


def _options(kind: str, method: str) -> dict:
    return {"long_factor": _long_factor(kind)} if method == "longrope" else {}


def expected_overrides(kind: str, method: str, factor: float = FACTOR) -> dict:
    """The config keys of the natively scaled model, written out from transformers' documented keys."""
    params = dict(tiny_config(kind).rope_parameters)  # rope_theta (and partial_rotary_factor) as HF set them
    length = int(ORIGINAL * factor)
    original = {"original_max_position_embeddings": ORIGINAL}
    if method == "ntk":
        d = _rotary_dim(kind)
        return {"rope_parameters": {**params, "rope_theta": params["rope_theta"] * factor ** (d / (d - 2))}}
    if method == "dynamic":  # transformers reads max_position_embeddings as the length where scaling starts
        return {"rope_parameters": {**params, "rope_type": "dynamic", "factor": factor}}
    if method == "linear":
        scaled = {"rope_type": "linear", "factor": factor}
    elif method == "yarn":
        scaled = {"rope_type": "yarn", "factor": factor, **original}
    elif method == "llama3":
        scaled = {"rope_type": "llama3", "factor": factor, "low_freq_factor": 1.0, "high_freq_factor": 4.0, **original}
    else:
        f = _rotary_dim(kind) // 2
        scaled = {
            "rope_type": "longrope",
            "factor": factor,
            "short_factor": [1.0] * f,
            "long_factor": _long_factor(kind),
            **original,
        }
    out = {"rope_parameters": {**params, **scaled}, "max_position_embeddings": length}
    if kind == "phi3":
        out["original_max_position_embeddings"] = ORIGINAL
    return out


# Every method on every architecture whose config class takes it.
FULL = ("llama", "gpt_neox")  # also checked against posenc's own frequencies below
CASES = [(kind, method) for kind in ROPE_KINDS if kind not in ("phi3", "gemma3_text") for method in METHODS]
CASES += [("phi3", method) for method in PHI3_METHODS]


@pytest.mark.parametrize(("kind", "method"), CASES)
def test_patched_equals_native(kind, method, ids):
    model = tiny_model(kind)
    before = logits(model, ids)
    report = extend_context(model, method, FACTOR, **_options(kind, method))
    native = tiny_model(kind, model.state_dict(), **expected_overrides(kind, method))

    torch.testing.assert_close(logits(model, ids), logits(native, ids), rtol=0, atol=0)
    assert not torch.allclose(logits(model, ids), before)  # the comparison is not vacuous
    if method in ("dynamic", "longrope"):  # length-dependent: back below the original length, then long again
        for length in (ORIGINAL // 2, ids.shape[1]):
            torch.testing.assert_close(logits(model, ids[:, :length]), logits(native, ids[:, :length]), rtol=0, atol=0)
    assert report["architecture"] == kind and report["method"] == method and report["factor"] == FACTOR
    assert report["modules_patched"] == 1 and report["module_names"][0].endswith("rotary_emb")
    assert report["original_max_position_embeddings"] == ORIGINAL
    assert report["max_position_embeddings"] == {
        "old": ORIGINAL,
        "new": ORIGINAL if method == "dynamic" else int(ORIGINAL * FACTOR),
    }


@pytest.mark.parametrize(
    ("kind", "method"), [(k, m) for k, m in CASES if k in FULL and m not in ("dynamic", "longrope")]
)
def test_posenc_frequencies_match_patched_module(kind, method):
    """Back to posenc: the new ``RotaryConfig`` read from the patched config gives the module's ``inv_freq``."""
    model = tiny_model(kind)
    report = extend_context(model, method, FACTOR, **_options(kind, method))
    setup = positional_setup(model.config)
    assert setup == report["positional_setup"]["new"]
    if method == "ntk":  # transformers has no NTK type: it comes back as default RoPE with the enlarged base
        assert setup.scaling is None and setup.base > report["positional_setup"]["old"].base
    else:
        assert type(setup.scaling) is type(report["scaling"])
    inv_freq, attention = rope_frequencies(
        setup.head_dim, base=setup.base, scaling=setup.scaling, partial_rotary_factor=setup.partial_rotary_factor
    )
    rotary = model.get_submodule(report["module_names"][0])
    torch.testing.assert_close(inv_freq, rotary.inv_freq, rtol=2e-6, atol=0)
    assert attention == pytest.approx(rotary.attention_scaling, rel=1e-12)


def test_gemma3_one_layer_type(ids):
    model = tiny_model("gemma3_text")
    params = {k: dict(v) for k, v in model.config.rope_parameters.items()}
    report = extend_context(model, "linear", 8.0, layer_type="full_attention")
    params["full_attention"].update(rope_type="linear", factor=8.0)
    native = tiny_model("gemma3_text", model.state_dict(), rope_parameters=params, max_position_embeddings=8 * ORIGINAL)
    torch.testing.assert_close(logits(model, ids), logits(native, ids), rtol=0, atol=0)
    assert report["layer_type"] == "full_attention" and report["modules_patched"] == 1
    assert positional_setup(model.config)["sliding_attention"].scaling is None


def test_gemma3_needs_layer_type():
    with pytest.raises(ValueError, match="layer_type=None.*full_attention"):
        extend_context(tiny_model("gemma3_text"), "linear", 2.0)


def test_explicit_lengths(ids):
    """A longer original length and an explicit target reach the config as given."""
    model = tiny_model("llama")
    report = extend_context(model, "yarn", 2.0, original_max_position_embeddings=48, max_position_embeddings=100)
    params = {**model.config.rope_parameters}
    assert params["original_max_position_embeddings"] == 48 and model.config.max_position_embeddings == 100
    native = tiny_model(
        "llama",
        model.state_dict(),
        rope_parameters={"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 48, "rope_theta": 1e4},
        max_position_embeddings=100,
    )
    torch.testing.assert_close(logits(model, ids), logits(native, ids), rtol=0, atol=0)
    assert report["max_position_embeddings"] == {"old": ORIGINAL, "new": 100}


def test_a_second_call_with_replace_replaces_the_first(ids):
    """Another method on a scaled model needs ``replace=True`` (tests/hf/test_extend_rules.py has the rule)."""
    twice = tiny_model("llama")
    extend_context(twice, "longrope", 2.0, long_factor=[2.0] * 4)
    extend_context(twice, "yarn", FACTOR, original_max_position_embeddings=ORIGINAL, replace=True)
    assert not hasattr(twice.model.rotary_emb, "long_inv_freq")  # LongRoPE's cache went with it
    native = tiny_model("llama", twice.state_dict(), **expected_overrides("llama", "yarn"))
    torch.testing.assert_close(logits(twice, ids), logits(native, ids), rtol=0, atol=0)


def test_yarn_options(ids):
    model = tiny_model("qwen2")
    extend_context(model, "yarn", FACTOR, beta_fast=16.0, beta_slow=2.0, attention_factor=1.25)
    overrides = expected_overrides("qwen2", "yarn")
    overrides["rope_parameters"].update(beta_fast=16.0, beta_slow=2.0, attention_factor=1.25)
    native = tiny_model("qwen2", model.state_dict(), **overrides)
    torch.testing.assert_close(logits(model, ids), logits(native, ids), rtol=0, atol=0)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("route", sorted({**SWITCHES, **CONFIG_SWITCHES}))
def test_every_way_of_switching_the_attention_keeps_the_scaling(method, route, ids):
    """A frequency method lives in the config and the rotary module, which every attention implementation reads:
    switched to SDPA by any route transformers offers, the patched model equals transformers' own model of the
    scaled config under SDPA."""
    model = tiny_model("llama")
    extend_context(model, method, FACTOR, **_options("llama", method))
    native = tiny_model("llama", model.state_dict(), **expected_overrides("llama", method))
    native.set_attn_implementation("sdpa")
    {**SWITCHES, **CONFIG_SWITCHES}[route](model, "sdpa")
    assert model.config._attn_implementation == "sdpa"
    torch.testing.assert_close(logits(model, ids), logits(native, ids), rtol=0, atol=0)
