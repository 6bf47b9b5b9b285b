"""MiMo-V2-Flash (transformers ``mimo_v2_flash``): another RoPE base per layer type, both rotating part of the head.

posenc reads each layer's RoPE as transformers builds it (``positional_setup`` per layer type, ``layer_rotary_configs``
per layer: the cos/sin each attention module receives), including what MiMo's config class fills in where a config
omits it (its per-type bases, and a partial rotary of 0.334 for its own default RoPE but 1 for a scaling).
``extend_context(..., layer_type=...)`` scales the layer type asked for and leaves the other alone: the patched model
equals the one transformers builds natively from the scaled config (the expected configs are written out here by
hand), and what ``save_pretrained`` writes reloads as that model. The tiny model (``tests/hf/tiny.py``): a full
layer at base 5e6 and a sliding one at 1e4, head_dim 24 of which int(24 * 0.334) = 8 channels rotate.
"""

from __future__ import annotations

import copy
import json

import pytest
import torch
import transformers

from hf.test_granite_swa import assert_reading_is_what_layers_receive
from hf.tiny import ORIGINAL, logits, tiny_config, tiny_model
from posenc import LinearScaling, RotaryConfig, YaRNScaling
from posenc.hf import extend_context, positional_setup, rotary_config_from_hf, save_pretrained
from posenc.hf.layers import layer_rotary_configs
from posenc.runtimes.check import check

FACTOR = 4.0
PARTIAL = 0.334
LONG = [1.0, 1.5, 2.5, 4.0]  # LongRoPE factors, one per rotating pair (4 of them)
YARN = {"rope_type": "yarn", "rope_theta": 5e6, "factor": 2.0, "original_max_position_embeddings": ORIGINAL}
FULL = RotaryConfig(head_dim=24, base=5e6, partial_rotary_factor=PARTIAL)
SLIDING = RotaryConfig(head_dim=24, base=1e4, partial_rotary_factor=PARTIAL)


def _options(method: str) -> dict:
    return {"long_factor": LONG} if method == "longrope" else {}


def expected_overrides(method: str, layer_type: str = "full_attention", factor: float = FACTOR) -> dict:
    """The natively scaled config's keys, from transformers' documented ``rope_parameters``: the scaling in
    ``layer_type``'s entry with its base and partial rotary, the other type's entry as it was."""
    params = copy.deepcopy(tiny_config("mimo_v2_flash").rope_parameters)
    own = params[layer_type]  # {"rope_type": "default", "rope_theta": ..., "partial_rotary_factor": 0.334}
    original = {"original_max_position_embeddings": ORIGINAL}
    length = {"max_position_embeddings": int(ORIGINAL * factor)}
    if method == "ntk":  # default RoPE at base * factor^(d/(d-2)), d the 8 rotary channels
        own["rope_theta"] *= factor ** (8 / 6)
        return {"rope_parameters": params}
    if method == "dynamic":  # transformers reads max_position_embeddings as the length where scaling starts
        own.update(rope_type="dynamic", factor=factor)
        return {"rope_parameters": params}
    own.update({
        "linear": {"rope_type": "linear", "factor": factor},
        "yarn": {"rope_type": "yarn", "factor": factor, **original},
        "llama3": {"rope_type": "llama3", "factor": factor, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   **original},
        "longrope": {"rope_type": "longrope", "factor": factor, "short_factor": [1.0] * 4, "long_factor": LONG,
                     **original},
    }[method])
    return {"rope_parameters": params, **length}


def test_the_reading_is_what_each_layer_receives(ids):
    model = tiny_model("mimo_v2_flash")
    assert positional_setup(model.config) == {"full_attention": FULL, "sliding_attention": SLIDING}
    assert FULL.rotary_dim == 8
    assert layer_rotary_configs(model.config) == (FULL, SLIDING)
    assert_reading_is_what_layers_receive(model, ids)


@pytest.mark.parametrize(
    ("rope_parameters", "top", "partials"),
    [
        # transformers' own defaults where the config gives none: the pretrained bases, 0.334 each
        (None, None, (PARTIAL, PARTIAL)),
        # an entry without partial_rotary_factor: MiMo's default RoPE rotates 0.334, a scaling (YaRN) the whole head
        ({"full_attention": YARN, "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}, None,
         (1.0, PARTIAL)),
        # a top-level partial_rotary_factor reaches the entries only through a scaling's standardize_rope_params,
        # which the rotary module runs for the first type with a scaling (types in sorted order) and the ones after
        # (with the scaling on the sliding type alone, transformers' _init_weights then fails on the full type's
        # buffer: no model to compare)
        ({"full_attention": YARN, "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}, 0.5, (0.5, 0.5)),
    ],
)
def test_what_mimos_config_fills_in_is_read_as_transformers_runs_it(rope_parameters, top, partials, ids):
    extra = {} if top is None else {"partial_rotary_factor": top}
    raw = {**tiny_config("mimo_v2_flash").to_dict(), "rope_parameters": copy.deepcopy(rope_parameters), **extra}
    if rope_parameters is None:
        del raw["rope_parameters"]
    got = tuple(setup.partial_rotary_factor for setup in layer_rotary_configs(raw))  # before transformers fills it
    assert got == partials
    model = tiny_model("mimo_v2_flash", rope_parameters=copy.deepcopy(rope_parameters), **extra)
    assert_reading_is_what_layers_receive(model, ids)


METHODS = ("linear", "ntk", "dynamic", "yarn", "longrope", "llama3")


@pytest.mark.parametrize("method", METHODS)
def test_patched_full_layers_equal_native(method, ids):
    model = tiny_model("mimo_v2_flash")
    before = logits(model, ids)
    sliding = model.model.rotary_emb.sliding_attention_inv_freq.clone()
    report = extend_context(model, method, FACTOR, layer_type="full_attention", **_options(method))
    native = tiny_model("mimo_v2_flash", model.state_dict(), **expected_overrides(method))

    torch.testing.assert_close(logits(model, ids), logits(native, ids), rtol=0, atol=0)
    assert not torch.allclose(logits(model, ids), before)  # the comparison is not vacuous
    if method in ("dynamic", "longrope"):  # length-dependent: back below the original length, then long again
        for length in (ORIGINAL // 2, ids.shape[1]):
            torch.testing.assert_close(logits(model, ids[:, :length]), logits(native, ids[:, :length]), rtol=0, atol=0)
    # the sliding layers are left alone; the full ones keep their base and their partial rotary
    assert torch.equal(model.model.rotary_emb.sliding_attention_inv_freq, sliding)
    assert (
        model.config.rope_parameters["sliding_attention"]
        == tiny_config("mimo_v2_flash").rope_parameters["sliding_attention"]
    )
    assert model.config.rope_parameters["full_attention"]["partial_rotary_factor"] == PARTIAL
    assert report["module_names"] == ["model.rotary_emb"] and report["layer_type"] == "full_attention"
    assert positional_setup(model.config)["sliding_attention"] == SLIDING
    assert_reading_is_what_layers_receive(model, ids)


def test_the_sliding_layers_alone(ids):
    model = tiny_model("mimo_v2_flash")
    report = extend_context(model, "linear", FACTOR, layer_type="sliding_attention")
    native = tiny_model("mimo_v2_flash", model.state_dict(), **expected_overrides("linear", "sliding_attention"))
    torch.testing.assert_close(logits(model, ids), logits(native, ids), rtol=0, atol=0)
    assert report["positional_setup"]["new"] == RotaryConfig(
        head_dim=24, base=1e4, partial_rotary_factor=PARTIAL, scaling=LinearScaling(factor=FACTOR)
    )
    assert positional_setup(model.config)["full_attention"] == FULL


def test_a_full_head_scaling_keeps_its_partial_rotary_through_ntk(ids):
    """A YaRN entry without ``partial_rotary_factor`` rotates the whole head; ``ntk`` with ``replace=True`` turns it
    into default RoPE, whose own default would be 0.334: posenc writes the 1.0 out, so the head still rotates whole."""
    params = {"full_attention": YARN, "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}
    model = tiny_model("mimo_v2_flash", rope_parameters=copy.deepcopy(params))
    extend_context(model, "ntk", FACTOR, layer_type="full_attention", replace=True)
    assert model.config.rope_parameters["full_attention"]["partial_rotary_factor"] == 1.0
    assert model.model.rotary_emb.full_attention_inv_freq.numel() == 12  # 24 channels, 12 pairs
    assert_reading_is_what_layers_receive(model, ids)


def test_a_layer_type_is_needed_and_the_model_unchanged():
    model = tiny_model("mimo_v2_flash")
    config = model.config.to_dict()
    buffers = {k: b.clone() for k, b in model.model.rotary_emb._buffers.items()}
    with pytest.raises(ValueError, match=r"layer_type=None is invalid: expected one of \['full_attention', 'sliding_"):
        extend_context(model, "yarn", 2.0)
    assert model.config.to_dict() == config
    for k, b in buffers.items():
        assert torch.equal(model.model.rotary_emb._buffers[k], b)


@pytest.mark.parametrize("writer", ["transformers", "posenc"])
def test_what_save_pretrained_writes_reloads_as_the_patched_model(writer, tmp_path, ids):
    model = tiny_model("mimo_v2_flash")
    extend_context(model, "yarn", FACTOR, layer_type="full_attention")
    out = tmp_path / "out"
    if writer == "transformers":
        model.save_pretrained(out)
    else:
        save_pretrained(model, None, out, check=False)
    saved = json.loads((out / "config.json").read_text())
    scaling = YaRNScaling(factor=FACTOR, original_max_position_embeddings=ORIGINAL, max_position_embeddings=128)
    assert rotary_config_from_hf(saved, layer_type="full_attention") == RotaryConfig(
        head_dim=24, base=5e6, partial_rotary_factor=PARTIAL, scaling=scaling
    )
    assert layer_rotary_configs(saved) == layer_rotary_configs(model.config)
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(out, attn_implementation="eager").eval()
    assert type(reloaded) is type(model)
    torch.testing.assert_close(logits(reloaded, ids), logits(model, ids), rtol=0, atol=0)
    if writer == "posenc":  # posenc check: transformers runs the folder as posenc's record says it measured it
        (row,) = check(out, "transformers")
        assert row.status == "same", row.verdict
