"""Granite-SWA (transformers ``granite_swa`` / ``granitemoe_swa``): a RoPE base per layer, 0 for a NoPE layer.

posenc reads each layer's RoPE as transformers builds it (``layer_rotary_configs``, ``positional_setup``: the cos/sin
each attention module receives, None for the NoPE layers), and ``extend_context`` scales every RoPE layer at its own
base while the NoPE layers stay without positions: the patched model equals the one transformers builds natively from
the scaled config (the expected configs are written out here by hand), and what ``save_pretrained`` writes reloads as
that model. The tiny model (``tests/hf/tiny.py``): layer 0 full attention without RoPE, layer 2 full attention at
base 5e5, the sliding layers 1 and 3 at base 1e4.
"""

from __future__ import annotations

import json

import pytest
import torch
import transformers

from hf.test_extend_errors import _assert_unchanged, _snapshot
from hf.tiny import ORIGINAL, logits, tiny_config, tiny_model
from hf_oracle import angle_atol
from posenc import NTKScaling, RotaryConfig, YaRNScaling
from posenc.hf import extend_context, positional_setup, save_pretrained
from posenc.hf.layers import layer_rotary_configs, layer_thetas, rope_layers
from posenc.runtimes.check import check
from posenc.scalings import rope_frequencies

THETAS = [0, 10000.0, 500000.0, 10000.0]  # tests/hf/tiny.py
FACTOR = 4.0
ROTARY_DIM = 8  # head_dim 8 (hidden 32 / 4 heads), whole head
LONG = [1.0, 1.5, 2.5, 4.0]  # LongRoPE factors, one per pair


def _options(method: str) -> dict:
    return {"long_factor": LONG} if method == "longrope" else {}


def expected_overrides(kind: str, method: str, factor: float = FACTOR) -> dict:
    """The natively scaled config's keys, from transformers' documented ``rope_parameters``: one scaling for every RoPE
    layer, each still at its ``layer_rope_theta`` base (static NTK: every non-zero base times factor^(d/(d-2)))."""
    params = dict(tiny_config(kind).rope_parameters)  # {"rope_type": "default", "rope_theta": 10000.0}
    original = {"original_max_position_embeddings": ORIGINAL}
    length = {"max_position_embeddings": int(ORIGINAL * factor)}
    if method == "ntk":
        grow = factor ** (ROTARY_DIM / (ROTARY_DIM - 2))
        return {"rope_parameters": {**params, "rope_theta": params["rope_theta"] * grow},
                "layer_rope_theta": [t * grow for t in THETAS]}
    if method == "dynamic":  # transformers reads max_position_embeddings as the length where scaling starts
        return {"rope_parameters": {**params, "rope_type": "dynamic", "factor": factor}}
    scaled = {
        "linear": {"rope_type": "linear", "factor": factor},
        "yarn": {"rope_type": "yarn", "factor": factor, **original},
        "llama3": {"rope_type": "llama3", "factor": factor, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   **original},
        "longrope": {"rope_type": "longrope", "factor": factor, "short_factor": [1.0] * 4, "long_factor": LONG,
                     **original},
    }[method]
    return {"rope_parameters": {**params, **scaled}, **length}


@torch.no_grad()
def _received(model: torch.nn.Module, ids: torch.Tensor) -> list:
    """The ``position_embeddings`` (cos, sin) each layer's attention receives in a forward (None: no RoPE)."""
    seen: dict[int, object] = {}
    handles = [
        layer.self_attn.register_forward_pre_hook(
            lambda _m, _a, kw, i=i: seen.__setitem__(i, kw["position_embeddings"]), with_kwargs=True
        )
        for i, layer in enumerate(model.model.layers)
    ]
    model(ids, use_cache=False)
    for h in handles:
        h.remove()
    return [seen[i] for i in range(len(model.model.layers))]


def assert_reading_is_what_layers_receive(model: torch.nn.Module, ids: torch.Tensor) -> None:
    """posenc's per-layer reading of ``model.config`` (``layer_rotary_configs``, also of its config.json dict) gives
    the cos/sin each attention receives (HF's float32 angles against posenc's float64 ones: ``angle_atol``), over the
    rotary channels, and None exactly where the layer gets none."""
    configs = layer_rotary_configs(model.config)
    assert configs == layer_rotary_configs(model.config.to_dict())
    positions = torch.arange(ids.shape[1])
    for i, (setup, got) in enumerate(zip(configs, _received(model, ids), strict=True)):
        if setup is None:
            assert got is None, f"layer {i}: posenc reads NoPE, the layer gets RoPE"
            continue
        assert got is not None, f"layer {i}: posenc reads RoPE, the layer gets none"
        partial = setup.partial_rotary_factor
        inv_freq, factor = rope_frequencies(
            setup.head_dim, base=setup.base, scaling=setup.scaling, partial_rotary_factor=partial, seq_len=ids.shape[1]
        )
        angles = positions.double()[:, None] * inv_freq.double()
        emb = torch.cat((angles, angles), dim=-1)
        for want, have in zip((emb.cos() * factor, emb.sin() * factor), got, strict=True):
            torch.testing.assert_close(have[0].double(), want, rtol=0, atol=angle_atol(ids.shape[1], want))


@pytest.mark.parametrize("kind", ["granite_swa", "granitemoe_swa"])
def test_the_reading_is_what_each_layer_receives(kind, ids):
    model = tiny_model(kind)
    assert layer_thetas(model.config) == tuple(THETAS)
    assert positional_setup(model.config) == layer_rotary_configs(model.config)
    assert rope_layers(model.config) == (False, True, True, True)
    assert positional_setup(model.config) == (
        None,
        RotaryConfig(head_dim=8, base=10000.0),
        RotaryConfig(head_dim=8, base=500000.0),
        RotaryConfig(head_dim=8, base=10000.0),
    )
    assert_reading_is_what_layers_receive(model, ids)


def test_a_config_without_layer_bases_is_rope_everywhere_at_the_global_base(ids):
    """``layer_rope_theta`` absent: transformers fills it with ``rope_parameters["rope_theta"]`` (a config.json dict
    without it reads the same)."""
    model = tiny_model(
        "granite_swa", layer_rope_theta=None, rope_parameters={"rope_type": "default", "rope_theta": 5e4}
    )
    assert model.config.layer_rope_theta == [5e4] * 4
    raw = {k: v for k, v in model.config.to_dict().items() if k != "layer_rope_theta"}
    assert layer_thetas(raw) == (5e4,) * 4 and layer_rotary_configs(raw) == layer_rotary_configs(model.config)
    assert_reading_is_what_layers_receive(model, ids)


METHODS = ("linear", "ntk", "dynamic", "yarn", "longrope", "llama3")
CASES = [("granite_swa", m) for m in METHODS] + [("granitemoe_swa", "yarn")]


@pytest.mark.parametrize(("kind", "method"), CASES)
def test_patched_equals_native(kind, method, ids):
    model = tiny_model(kind)
    before = logits(model, ids)
    report = extend_context(model, method, FACTOR, **_options(method))
    native = tiny_model(kind, model.state_dict(), **expected_overrides(kind, method))

    torch.testing.assert_close(logits(model, ids), logits(native, ids), rtol=0, atol=0)
    assert not torch.allclose(logits(model, ids), before)  # the comparison is not vacuous
    if method in ("dynamic", "longrope"):  # length-dependent: back below the original length, then long again
        for length in (ORIGINAL // 2, ids.shape[1]):
            torch.testing.assert_close(logits(model, ids[:, :length]), logits(native, ids[:, :length]), rtol=0, atol=0)
    # every rotary module: the unused global one and one per distinct non-zero base
    assert report["module_names"] == ["model.rotary_emb", "model.rotary_embs.0", "model.rotary_embs.1"]
    assert report["positional_setup"]["new"] == positional_setup(model.config)
    assert report["positional_setup"]["new"][0] is None  # the NoPE layer stays NoPE
    if method != "ntk":
        assert model.config.layer_rope_theta == THETAS
    assert_reading_is_what_layers_receive(model, ids)


def test_yarn_reaches_every_rope_layer_at_its_own_base():
    model = tiny_model("granite_swa")
    report = extend_context(model, "yarn", 2.0)
    scaling = YaRNScaling(factor=2.0, original_max_position_embeddings=ORIGINAL, max_position_embeddings=2 * ORIGINAL)
    assert report["positional_setup"]["old"] == positional_setup(tiny_config("granite_swa"))
    assert report["positional_setup"]["new"] == tuple(
        None if t == 0 else RotaryConfig(head_dim=8, base=t, scaling=scaling) for t in THETAS
    )
    bases = [m.config.rope_parameters["rope_theta"] for m in model.model.rotary_embs]
    assert bases == [10000.0, 500000.0]  # looked up by base in GraniteSWAModel.forward
    ntk = tiny_model("granite_swa")
    assert extend_context(ntk, "ntk", 2.0)["scaling"] == NTKScaling(factor=2.0)
    assert ntk.config.layer_rope_theta[0] == 0  # a NoPE layer is not given a base


def test_a_second_call_composes(ids):
    """The rule of tests/hf/test_extend_rules.py holds per base: yarn x2 then x2 is yarn x4 over 32 on every layer."""
    twice = tiny_model("granite_swa")
    extend_context(twice, "yarn", 2.0)
    assert extend_context(twice, "yarn", 2.0)["rule"] == "composed"
    native = tiny_model("granite_swa", twice.state_dict(), **expected_overrides("granite_swa", "yarn"))
    torch.testing.assert_close(logits(twice, ids), logits(native, ids), rtol=0, atol=0)


def test_layer_type_is_refused_and_the_model_unchanged():
    """One ``rope_parameters`` serves every RoPE layer: transformers has no config that scales one layer type."""
    model = tiny_model("granite_swa")
    before = _snapshot(model)
    with pytest.raises(ValueError, match=r"layer_type='full_attention' is invalid: expected None: granite_swa .*"
                                         r"layer_rope_theta gives each layer only its base"):
        extend_context(model, "yarn", 2.0, layer_type="full_attention")
    _assert_unchanged(model, before)


def test_bad_layer_bases_are_refused():
    config = tiny_config("granite_swa").to_dict()
    with pytest.raises(ValueError, match=r"layer_rope_theta=\[0, 10000.0\] is invalid: expected 4 RoPE bases"):
        layer_thetas({**config, "layer_rope_theta": [0, 10000.0]})
    with pytest.raises(ValueError, match=r"layer_rope_theta=\[0, 1, 2, 3\] is invalid: expected 4 RoPE bases .*> 1"):
        layer_rotary_configs({**config, "layer_rope_theta": [0, 1, 2, 3]})


@pytest.mark.parametrize("method", ["yarn", "ntk"])
@pytest.mark.parametrize("writer", ["transformers", "posenc"])
def test_what_save_pretrained_writes_reloads_as_the_patched_model(method, writer, tmp_path, ids):
    model = tiny_model("granite_swa")
    extend_context(model, method, FACTOR)
    out = tmp_path / "out"
    if writer == "transformers":
        model.save_pretrained(out)
    else:
        save_pretrained(model, None, out, check=False)
    saved = json.loads((out / "config.json").read_text())
    assert layer_rotary_configs(saved) == positional_setup(model.config)  # the config.json dict reads the same
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(out, attn_implementation="eager").eval()
    assert type(reloaded) is type(model)
    torch.testing.assert_close(logits(reloaded, ids), logits(model, ids), rtol=0, atol=0)
    if writer == "posenc":  # posenc check: transformers runs the folder as posenc's record says it measured it
        (row,) = check(out, "transformers")
        assert row.status == "same", row.verdict
        assert row.rotary.startswith("0/8")  # the NoPE layer is read as one
