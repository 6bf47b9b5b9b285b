"""Per-layer encodings of NoPE/RoPE hybrids (Llama 4, SmolLM3) from a Hugging Face config.

Yang et al. 2025, "Rope to Nope and Back Again: A New Hybrid Attention Strategy" (arXiv:2501.18795), Llama 4 and
SmolLM3 keep RoPE in most layers and drop it (NoPE) in every 4th. Transformers describes this with
``no_rope_layers``, one flag per layer that is **1 where the layer uses RoPE** (despite the name), built when absent
as ``int((i + 1) % no_rope_layer_interval != 0)``; Llama 4 also scales the queries of its NoPE layers
(``attn_temperature_tuning``: ``posenc.NoPETemperature``).

Reference implementation checked against: transformers ``configuration_llama4.py`` / ``configuration_smollm3.py``
(``no_rope_layers``, ``no_rope_layer_interval``) and the attention modules' ``use_rope``
(``tests/hf/test_layers.py``). Llama 4 also L2-normalises q and k in its RoPE layers (``use_qk_norm``) and limits
them to chunks of ``attention_chunk_size`` tokens: neither is a positional encoding, so neither is covered here.
"""

from __future__ import annotations

from typing import Any, cast

from posenc._checks import check_positive_int, fail
from posenc.hf._common import as_dict

#: Transformers' defaults for the hybrid fields, by ``model_type``: what a config dict without them means there.
HYBRID_DEFAULTS: dict[str, dict[str, Any]] = {
    "llama4_text": {"no_rope_layer_interval": 4, "attn_temperature_tuning": True, "floor_scale": 8192,
                    "attn_scale": 0.1},
    "smollm3": {"no_rope_layer_interval": 4, "attn_temperature_tuning": False},
}  # fmt: skip


def _text_config(config: Any) -> dict[str, Any]:
    """The language model's fields: Llama 4's multimodal config keeps them under ``text_config``."""
    d = as_dict(config)
    text = d.get("text_config")
    if isinstance(text, dict) and "num_hidden_layers" in text:
        d = dict(text)
    return {**HYBRID_DEFAULTS.get(cast(str, d.get("model_type")), {}), **{k: v for k, v in d.items() if v is not None}}


def rope_layers(config: Any) -> tuple[bool, ...]:
    """Per layer, whether it applies RoPE, as transformers decides it.

    ``no_rope_layers`` when given (Llama 4 also ignores an empty list), else NoPE in every
    ``no_rope_layer_interval``-th layer (layers n, 2n, ... counting from 1); a config with neither field (and not
    a model type that defaults them) uses RoPE everywhere.

    Args:
        config: a transformers ``PretrainedConfig`` (or a model holding one) or its ``config.json`` dict.
    """
    d = _text_config(config)
    n = check_positive_int("num_hidden_layers", d.get("num_hidden_layers"))
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
