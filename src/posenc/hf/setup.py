"""``positional_setup``: the posenc object describing how a transformers architecture encodes positions."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from posenc._checks import fail
from posenc.encodings.alibi import ALiBiConfig
from posenc.encodings.rotary import RotaryConfig
from posenc.encodings.rotary_hf import rope_parameters_of
from posenc.hf._common import as_dict
from posenc.hf.alibi import ALIBI_MODEL_TYPES, alibi_config_from_hf
from posenc.hf.layers import LAYER_THETA_MODEL_TYPES, layer_rotary_configs
from posenc.hf.rotary import rotary_config_from_hf

#: Architectures whose RoPE transformers builds with a ``*RotaryEmbedding`` module driven by ``rope_parameters``,
#: each checked in ``tests/hf`` (a model type absent here is refused, not guessed at). Gemma 4's full-attention layers
#: are p-RoPE (``"proportional"``) at their own ``head_dim``; Granite-SWA gives each layer its own base (0: NoPE);
#: MiMo-V2-Flash has a base and a partial rotary per layer type.
ROPE_MODEL_TYPES = (
    "llama",
    "mistral",
    "qwen2",
    "qwen3",
    "phi3",
    "gpt_neox",
    "gemma",
    "gemma2",
    "gemma3_text",
    "gemma4_text",
    "granite_swa",
    "granitemoe_swa",
    "mimo_v2_flash",
)

# What some common architectures use instead, for the error message.
_NOT_HANDLED = {
    "gpt2": "learned absolute position embeddings",
    "opt": "learned absolute position embeddings",
    "bert": "learned absolute position embeddings",
    "roberta": "learned absolute position embeddings",
    "t5": "T5 relative position buckets",
    "mt5": "T5 relative position buckets",
    "gptj": "GPT-J's interleaved rotary table (no rope_parameters)",
    "falcon": "RoPE or ALiBi depending on the config (not handled yet)",
}


def supported_model_types() -> tuple[str, ...]:
    """Every ``config.model_type`` that ``positional_setup`` and ``extend_context`` handle."""
    return (*ROPE_MODEL_TYPES, *ALIBI_MODEL_TYPES)


def check_model_type(kind: object, *, where: str = "config.model_type") -> str:
    """Raise the standard ``ValueError`` naming ``kind`` unless it is a supported architecture."""
    if kind in ROPE_MODEL_TYPES or kind in ALIBI_MODEL_TYPES:
        return kind
    uses = f"; {kind!r} uses {_NOT_HANDLED[kind]}" if kind in _NOT_HANDLED else ""
    fail(
        where,
        kind,
        f"a RoPE architecture {list(ROPE_MODEL_TYPES)} or an ALiBi one {list(ALIBI_MODEL_TYPES)}{uses}",
    )
    raise AssertionError  # unreachable


def positional_setup(
    config: Any,
) -> RotaryConfig | dict[str, RotaryConfig] | tuple[RotaryConfig | None, ...] | ALiBiConfig:
    """How a transformers model encodes positions, as posenc configs.

    Args:
        config: a ``PretrainedConfig``, its ``config.json`` dict, or a model holding one.

    Returns:
        A ``RotaryConfig`` for the RoPE family (Phi-3's LongRoPE, GPT-NeoX's partial rotary and every scaling
        included); for configs with per-layer-type RoPE (Gemma 3), ``{layer_type: RotaryConfig}``; for a RoPE base
        per layer (Granite-SWA's ``layer_rope_theta``), one ``RotaryConfig`` per layer, None for its NoPE layers
        (``posenc.hf.layers.layer_rotary_configs``); an ``ALiBiConfig`` for BLOOM and MPT.

    Raises:
        ValueError: naming ``config.model_type`` for an architecture that is not handled.
    """
    cfg = as_dict(config)
    kind = check_model_type(cfg.get("model_type"))
    if kind in ALIBI_MODEL_TYPES:
        return alibi_config_from_hf(cfg)
    if kind in LAYER_THETA_MODEL_TYPES:
        return layer_rotary_configs(cfg)
    params = rope_parameters_of(cfg)
    nested = sorted(k for k, v in params.items() if isinstance(v, Mapping))
    if nested:
        return {layer_type: rotary_config_from_hf(cfg, layer_type=layer_type) for layer_type in nested}
    return rotary_config_from_hf(cfg)
