"""posenc.hf.layers: which layers of a NoPE/RoPE hybrid rotate, == transformers' Llama 4 and SmolLM3 modules."""

import pytest
from transformers import Gemma3TextConfig, Llama4Config, Llama4TextConfig, LlamaConfig, SmolLM3Config
from transformers.models.llama4.modeling_llama4 import Llama4TextAttention
from transformers.models.smollm3.modeling_smollm3 import SmolLM3Attention

import posenc
from posenc import RotaryConfig
from posenc.hf import rotary_config_from_hf
from posenc.hf.layers import layer_encodings, layer_rotary_configs, nope_layer_config, rope_layers

SMALL = {"hidden_size": 16, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 8}


def _uses_rope(config, attention_class):
    """What transformers' attention modules actually do, layer by layer."""
    return tuple(bool(attention_class(config, i).use_rope) for i in range(config.num_hidden_layers))


@pytest.mark.parametrize(
    "fields",
    [
        {"num_hidden_layers": 8},  # the default interval, 4
        {"num_hidden_layers": 7, "no_rope_layer_interval": 3},
        {"num_hidden_layers": 5, "no_rope_layers": [1, 0, 0, 1, 1]},  # an explicit, irregular pattern
        {"num_hidden_layers": 3, "no_rope_layer_interval": 1},  # NoPE everywhere
    ],
)
@pytest.mark.parametrize(
    ("config_class", "attention_class"), [(SmolLM3Config, SmolLM3Attention), (Llama4TextConfig, Llama4TextAttention)]
)
def test_rope_layers_equal_transformers(fields, config_class, attention_class):
    config = config_class(**SMALL, **fields)
    want = _uses_rope(config, attention_class)
    assert rope_layers(config) == want
    assert rope_layers(config.to_dict()) == want  # a config.json dict
    nope = "nope_temperature" if config_class is Llama4TextConfig else "nope"
    assert layer_encodings(config) == tuple("rope" if r else nope for r in want)


def test_multimodal_llama4_reads_its_text_config():
    config = Llama4Config(text_config={**SMALL, "num_hidden_layers": 6, "no_rope_layer_interval": 3})
    want = _uses_rope(config.text_config, Llama4TextAttention)
    assert want == (True, True, False, True, True, False)
    assert rope_layers(config) == rope_layers(config.to_dict()) == want


def test_dicts_without_the_fields_mean_transformers_defaults():
    smollm3 = {"model_type": "smollm3", "num_hidden_layers": 8}
    assert rope_layers(smollm3) == _uses_rope(SmolLM3Config(**SMALL, num_hidden_layers=8), SmolLM3Attention)
    llama4 = {"model_type": "llama4_text", "num_hidden_layers": 4}
    assert nope_layer_config(llama4) == ("nope_temperature", {"floor_scale": 8192, "attn_scale": 0.1})
    assert rope_layers(LlamaConfig(num_hidden_layers=3)) == (True, True, True)  # not a hybrid: RoPE everywhere
    assert rope_layers({"model_type": "llama", "num_hidden_layers": 2}) == (True, True)


def test_nope_layer_config_builds_llama4s_temperature():
    config = Llama4TextConfig(**SMALL, num_hidden_layers=4, floor_scale=64, attn_scale=0.25)
    name, options = nope_layer_config(config)
    encoding = posenc.build(name, **options)
    assert encoding.config == posenc.NoPETemperatureConfig(floor_scale=64, attn_scale=0.25)
    off = Llama4TextConfig(**SMALL, num_hidden_layers=4, attn_temperature_tuning=False)
    assert nope_layer_config(off) == ("nope", {}) and "nope_temperature" not in layer_encodings(off)
    assert nope_layer_config(SmolLM3Config(**SMALL, num_hidden_layers=4)) == ("nope", {})


def test_errors():
    with pytest.raises(ValueError, match=r"no_rope_layers=\[1, 0\] is invalid: expected 3 flags"):
        rope_layers({"num_hidden_layers": 3, "no_rope_layers": [1, 0]})
    with pytest.raises(ValueError, match=r"no_rope_layers=\[1, 2\] is invalid"):
        rope_layers({"num_hidden_layers": 2, "no_rope_layers": [1, 2]})
    with pytest.raises(ValueError, match=r"num_hidden_layers=None is invalid"):
        rope_layers({"no_rope_layer_interval": 4})
    with pytest.raises(ValueError, match=r"no_rope_layer_interval=0 is invalid"):
        rope_layers({"num_hidden_layers": 2, "no_rope_layer_interval": 0})
    with pytest.raises(ValueError, match=r"floor_scale=None is invalid: expected a value"):
        nope_layer_config({"num_hidden_layers": 2, "attn_temperature_tuning": True})
    with pytest.raises(ValueError, match=r"config='str' is invalid: expected a transformers PretrainedConfig"):
        rope_layers("llama")


def test_layer_rotary_configs_follow_the_layers_rules():
    """Each layer's ``RotaryConfig``: None where a hybrid has NoPE, the per-layer-type entry where rope_parameters are
    nested (Gemma 3); Granite-SWA's bases are in tests/hf/test_granite_swa.py, MiMo's types in test_mimo_v2_flash.py."""
    smollm3 = SmolLM3Config(**SMALL, num_hidden_layers=4, rope_parameters={"rope_type": "linear", "factor": 2.0,
                                                                           "rope_theta": 1e5})
    rope = rotary_config_from_hf(smollm3)
    assert layer_rotary_configs(smollm3) == (rope, rope, rope, None) and rope.scaling is not None
    types = ["sliding_attention", "full_attention", "sliding_attention"]
    gemma3 = Gemma3TextConfig(**SMALL, num_hidden_layers=3, layer_types=types)
    by_type = {t: rotary_config_from_hf(gemma3, layer_type=t) for t in ("sliding_attention", "full_attention")}
    assert layer_rotary_configs(gemma3) == tuple(by_type[t] for t in gemma3.layer_types)
    assert layer_rotary_configs(LlamaConfig(**SMALL, num_hidden_layers=2)) == (RotaryConfig(head_dim=8),) * 2
    with pytest.raises(ValueError, match=r"layer_types=None is invalid: expected 3 layer types"):
        layer_rotary_configs({**gemma3.to_dict(), "layer_types": None})
