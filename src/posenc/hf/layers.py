"""Per-layer encodings of NoPE/RoPE hybrids (Llama 4, SmolLM3, Granite-SWA) from a Hugging Face config.

Yang et al. 2025, "Rope to Nope and Back Again: A New Hybrid Attention Strategy" (arXiv:2501.18795), Llama 4 and
SmolLM3 keep RoPE in most layers and drop it (NoPE) in every 4th. Transformers describes this with
``no_rope_layers``, one flag per layer that is **1 where the layer uses RoPE** (despite the name), built when absent
as ``int((i + 1) % no_rope_layer_interval != 0)``; Llama 4 also scales the queries of its NoPE layers
(``attn_temperature_tuning``: ``posenc.NoPETemperature``).

Granite-SWA (IBM 2026; transformers ``granite_swa`` / ``granitemoe_swa``) gives every layer its own RoPE base instead:
``layer_rope_theta[i]``, ``0`` for a NoPE layer, every layer at ``rope_parameters["rope_theta"]`` when the list is
absent; one ``rope_parameters`` (its scaling) serves every RoPE layer, each at its own base.
``layer_rotary_configs`` gives each layer's ``RotaryConfig`` (None for NoPE) for any of these configs, and for
per-layer-type ``rope_parameters`` (Gemma 3/4, MiMo-V2-Flash: ``layer_types[i]`` picks the layer's entry).

Reference implementation checked against: transformers ``configuration_llama4.py`` / ``configuration_smollm3.py``
(``no_rope_layers``, ``no_rope_layer_interval``) and the attention modules' ``use_rope``; transformers 5.24
``modular_granite_swa.py`` (``GraniteSWAConfig.layer_rope_theta``, ``GraniteSWAModel.rotary_embs``: one rotary module
per distinct non-zero base, ``None`` position embeddings where the base is 0) (``tests/hf/test_layers.py``,
``tests/hf/test_granite_swa.py``). Llama 4 also L2-normalises q and k in its RoPE layers (``use_qk_norm``) and limits
them to chunks of ``attention_chunk_size`` tokens: neither is a positional encoding, so neither is covered here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, cast

from posenc._checks import check_positive_int, fail
from posenc.encodings.rotary_config import RotaryConfig
from posenc.encodings.rotary_hf import rope_parameters_of
from posenc.hf._common import as_dict
from posenc.hf.rotary import rotary_config_from_hf

#: Transformers' defaults for the hybrid fields, by ``model_type``: what a config dict without them means there.
HYBRID_DEFAULTS: dict[str, dict[str, Any]] = {
    "llama4_text": {"no_rope_layer_interval": 4, "attn_temperature_tuning": True, "floor_scale": 8192,
                    "attn_scale": 0.1},
    "smollm3": {"no_rope_layer_interval": 4, "attn_temperature_tuning": False},
}
#: Model types whose config gives each layer its own RoPE base, ``layer_rope_theta`` (0: NoPE).
LAYER_THETA_MODEL_TYPES = ("granite_swa", "granitemoe_swa")


def _text_config(config: Any) -> dict[str, Any]:
    """The language model's fields: Llama 4's multimodal config keeps them under ``text_config``."""
    d = as_dict(config)
    text = d.get("text_config")
    if isinstance(text, dict) and "num_hidden_layers" in text:
        d = dict(text)
    return {**HYBRID_DEFAULTS.get(cast(str, d.get("model_type")), {}), **{k: v for k, v in d.items() if v is not None}}


def layer_thetas(config: Any) -> tuple[float, ...] | None:
    """Per layer, the RoPE base Granite-SWA gives it (``layer_rope_theta``; 0: NoPE), as transformers reads it: every
    layer at ``rope_parameters["rope_theta"]`` where the list is absent. None for a config without per-layer bases.

    Args:
        config: a transformers ``PretrainedConfig`` (or a model holding one) or its ``config.json`` dict.

    Raises:
        ValueError: a list whose length is not ``num_hidden_layers``, or a base below 0.
    """
    d = _text_config(config)
    thetas = d.get("layer_rope_theta")
    if thetas is None:
        if d.get("model_type") not in LAYER_THETA_MODEL_TYPES:
            return None
        return (rotary_config_from_hf(d).base,) * check_positive_int("num_hidden_layers", d.get("num_hidden_layers"))
    n = check_positive_int("num_hidden_layers", d.get("num_hidden_layers"))
    numbers = all(isinstance(t, (int, float)) and not isinstance(t, bool) for t in thetas)
    if len(thetas) != n or not numbers or any(t != 0 and not t > 1 for t in thetas):
        fail("layer_rope_theta", thetas, f"{n} RoPE bases (num_hidden_layers), each > 1, or 0 for a NoPE layer")
    return tuple(float(t) for t in thetas)


def rope_layers(config: Any) -> tuple[bool, ...]:
    """Per layer, whether it applies RoPE, as transformers decides it.

    ``no_rope_layers`` when given (Llama 4 also ignores an empty list), else NoPE in every
    ``no_rope_layer_interval``-th layer (layers n, 2n, ... counting from 1); Granite-SWA: NoPE where
    ``layer_rope_theta`` is 0. A config with none of these fields (and not a model type that defaults them) uses RoPE
    everywhere.

    Args:
        config: a transformers ``PretrainedConfig`` (or a model holding one) or its ``config.json`` dict.
    """
    d = _text_config(config)
    n = check_positive_int("num_hidden_layers", d.get("num_hidden_layers"))
    thetas = layer_thetas(d)
    if thetas is not None:
        return tuple(t != 0 for t in thetas)
    flags = d.get("no_rope_layers")
    if flags:
        if len(flags) != n or any(f not in (0, 1) for f in flags):
            fail("no_rope_layers", flags, f"{n} flags (num_hidden_layers), 1 for a RoPE layer and 0 for NoPE")
        return tuple(bool(f) for f in flags)
    interval = d.get("no_rope_layer_interval")
    if interval is None:
        return (True,) * n
    interval = check_positive_int("no_rope_layer_interval", interval)
    return tuple((i + 1) % interval != 0 for i in range(n))


def nope_layer_config(config: Any) -> tuple[str, dict[str, Any]]:
    """``(name, kwargs)`` for ``posenc.build`` of the NoPE layers: Llama 4's temperature tuning, or plain NoPE."""
    d = _text_config(config)
    if d.get("attn_temperature_tuning"):
        for key in ("floor_scale", "attn_scale"):
            if key not in d:
                fail(key, None, "a value: attn_temperature_tuning is on (transformers' Llama 4 config has both)")
        return "nope_temperature", {"floor_scale": d["floor_scale"], "attn_scale": d["attn_scale"]}
    return "nope", {}


def layer_encodings(config: Any) -> tuple[str, ...]:
    """The registered encoding name of every layer: ``"rope"``, or ``"nope"`` / ``"nope_temperature"``."""
    nope, _ = nope_layer_config(config)
    return tuple("rope" if rope else nope for rope in rope_layers(config))


def layer_rotary_configs(config: Any) -> tuple[RotaryConfig | None, ...]:
    """Every layer's RoPE as transformers builds it, one ``RotaryConfig`` per layer, None for a NoPE layer.

    Per-layer-type ``rope_parameters`` (Gemma 3/4, MiMo-V2-Flash): the entry of ``layer_types[i]``; Granite-SWA: the
    one ``rope_parameters`` (scaling and all) at the layer's own base ``layer_rope_theta[i]``; otherwise the config's
    RoPE, in the layers ``rope_layers`` says rotate.

    Args:
        config: a transformers ``PretrainedConfig`` (or a model holding one) or its ``config.json`` dict.

    Raises:
        ValueError: a per-layer-type config whose ``layer_types`` are missing or name a type ``rope_parameters``
            lacks, or a bad ``layer_rope_theta``.
    """
    d = _text_config(config)
    params = rope_parameters_of(d)
    nested = sorted(k for k, v in params.items() if isinstance(v, Mapping))
    thetas = layer_thetas(d)
    uses_rope = rope_layers(d)
    types = d.get("layer_types")
    if nested and (not isinstance(types, list) or len(types) != len(uses_rope) or not set(types) <= set(nested)):
        fail("layer_types", types, f"{len(uses_rope)} layer types (num_hidden_layers), each one of {nested} "
             "(the per-layer-type rope_parameters)")
    shared = None if nested else rotary_config_from_hf(d)
    out: list[RotaryConfig | None] = []
    for i, rotates in enumerate(uses_rope):
        if not rotates:
            out.append(None)
        elif nested:
            out.append(rotary_config_from_hf(d, layer_type=cast(list, types)[i]))
        elif thetas is not None:
            out.append(dataclasses.replace(cast(RotaryConfig, shared), base=thetas[i]))
        else:
            out.append(shared)
    return tuple(out)
