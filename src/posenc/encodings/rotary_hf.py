"""RoPE configs in and out of Hugging Face: read a transformers model config's RoPE, write posenc's back.

Pure translation between config dicts and ``RotaryConfig`` (transformers itself is never imported), in the core so
that ``RotaryEmbedding.from_hf`` / ``to_hf`` need not import the interop package ``posenc.hf``, which re-exports
these two functions.

Handles both config generations: transformers >= 5 ``rope_parameters`` (with ``rope_theta`` inside) and the
older ``rope_theta`` + ``rope_scaling`` (legacy ``type`` key), GPT-NeoX's ``rotary_pct`` / ``rotary_emb_base``,
Phi-3's top-level ``original_max_position_embeddings``, and per-layer-type nested ``rope_parameters`` (pick one
with ``layer_type``; Gemma 4's per-layer ``head_dim`` included; MiMo-V2-Flash's defaults where its config omits them,
``DEFAULT_ROPE_PARAMETERS`` and ``DEFAULT_PARTIAL_ROTARY``). For p-RoPE (``rope_type: "proportional"``, Gemma 4)
``partial_rotary_factor`` belongs to the scaling (``ProportionalScaling``): the whole head goes through the rotation.
Hugging Face models always use the ``"half"`` channel layout (weights from Meta checkpoints are permuted on
conversion), so configs read from HF get ``layout="half"``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

import torch

from posenc._checks import fail
from posenc.encodings.rotary_config import RotaryConfig
from posenc.scalings import MixedNTKScaling, NTKAlphaScaling, NTKScaling, YaRNLogScaling, parse_scaling

# Scalings that read the model's max_position_embeddings / original_max_position_embeddings in HF.
_NEEDS_MAX_POS = ("dynamic", "yarn", "longrope")
_NEEDS_ORIGINAL = ("llama3", "yarn", "longrope", "telechat3-yarn", "telechat3_yarn")

#: Per-layer-type ``rope_parameters`` transformers' config fills in where a config has none, by ``model_type``
#: (MiMo-V2-Flash: the pretrained bases, ``configuration_mimo_v2_flash.py``).
DEFAULT_ROPE_PARAMETERS: dict[str, dict[str, dict[str, Any]]] = {
    "mimo_v2_flash": {
        "full_attention": {"rope_type": "default", "rope_theta": 5_000_000.0, "partial_rotary_factor": 0.334},
        "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0, "partial_rotary_factor": 0.334},
    },
}
#: The fraction of the head a model's own default RoPE rotates where its ``rope_parameters`` entry gives none, by
#: ``model_type`` (MiMo-V2-Flash's ``compute_default_rope_parameters``); its scalings (``ROPE_INIT_FUNCTIONS``) read
#: 1 there. ``posenc.hf.extend_context`` writes the fraction out for these models.
DEFAULT_PARTIAL_ROTARY: dict[str, float] = {"mimo_v2_flash": 0.334}


def as_dict(config: Any) -> dict[str, Any]:
    """A ``PretrainedConfig`` (or a model holding one) or a ``config.json`` dict, as a plain dict."""
    if isinstance(config, torch.nn.Module) and hasattr(config, "config"):
        config = config.config
    if isinstance(config, Mapping):
        return dict(config)
    if hasattr(config, "to_dict"):
        return config.to_dict()
    fail("config", type(config).__name__, "a transformers PretrainedConfig, its dict, or a model holding one")
    raise AssertionError  # unreachable


def rotary_config_from_hf(config: Any, *, layer_type: str | None = None) -> RotaryConfig:
    """A ``RotaryConfig`` equal to the RoPE that transformers builds for ``config``.

    Args:
        config: a ``PretrainedConfig`` or a ``config.json`` dict.
        layer_type: for configs whose ``rope_parameters`` are nested by layer type (e.g. Gemma 3's
            ``"full_attention"`` / ``"sliding_attention"``), the one to read.
    """
    cfg = as_dict(config)
    head_dim = cfg.get("head_dim")
    if head_dim is None:
        if not cfg.get("hidden_size") or not cfg.get("num_attention_heads"):
            fail("config", "{...}", "a 'head_dim', or 'hidden_size' and 'num_attention_heads'")
        head_dim = cfg["hidden_size"] // cfg["num_attention_heads"]
    params = rope_parameters_of(cfg)
    nested = {k: v for k, v in params.items() if isinstance(v, Mapping)}
    if nested:
        if layer_type not in nested:
            fail("layer_type", layer_type, f"one of {sorted(nested)} (this config has per-layer rope_parameters)")
        params = nested[layer_type]
    elif layer_type is not None:
        fail("layer_type", layer_type, "None: this config has one rope_parameters for every layer")
    params = dict(params)
    head_dim = _layer_head_dim(cfg, layer_type) or head_dim
    base = params.pop("rope_theta", None) or cfg.get("rope_theta") or cfg.get("rotary_emb_base") or 10000.0
    own_partial = params.pop("partial_rotary_factor", None)
    partial = own_partial or cfg.get("partial_rotary_factor") or cfg.get("rotary_pct") or 1.0
    rope_type = params.get("rope_type") or params.get("type") or "default"
    if own_partial is None and cfg.get("model_type") in DEFAULT_PARTIAL_ROTARY and layer_type is not None:
        partial = _per_type_partial(cfg, nested, layer_type)
    if rope_type == "proportional":  # p-RoPE: the fraction picks the pairs that rotate; the whole head goes through
        given = [v for v in (own_partial, cfg.get("partial_rotary_factor")) if v is not None]
        params["partial_rotary_factor"], partial = (given[0] if given else 1.0), 1.0  # 0.0 (NoPE) kept as given
    if rope_type in _NEEDS_MAX_POS and "max_position_embeddings" not in params and cfg.get("max_position_embeddings"):
        params["max_position_embeddings"] = cfg["max_position_embeddings"]
    if rope_type in _NEEDS_ORIGINAL:
        if cfg.get("original_max_position_embeddings"):  # Phi-3 keeps it at top level, and HF prefers it there
            params["original_max_position_embeddings"] = cfg["original_max_position_embeddings"]
        elif "original_max_position_embeddings" not in params and cfg.get("max_position_embeddings"):
            params["original_max_position_embeddings"] = cfg["max_position_embeddings"]
    if rope_type == "default":
        params = {}
    return RotaryConfig(
        head_dim=int(head_dim),
        base=float(base),
        scaling=parse_scaling(params or None),
        layout="half",
        partial_rotary_factor=float(partial),
    )


def rope_parameters_of(cfg: Mapping[str, Any]) -> Mapping[str, Any]:
    """A config dict's ``rope_parameters`` (else its ``rope_scaling``, else what its config class fills in:
    ``DEFAULT_ROPE_PARAMETERS``), possibly nested by layer type; ``{}`` for none."""
    filled = DEFAULT_ROPE_PARAMETERS.get(cast(str, cfg.get("model_type")), {})
    return cfg.get("rope_parameters") or cfg.get("rope_scaling") or filled


def _per_type_partial(cfg: Mapping[str, Any], nested: Mapping[str, Mapping[str, Any]], layer_type: str) -> float:
    """The fraction MiMo-V2-Flash's rotary module rotates for ``layer_type`` when the type's entry gives none.

    It builds the layer types in sorted order; the first with a scaling runs ``standardize_rope_params``, which copies
    a top-level ``partial_rotary_factor`` into every entry without one, so that type and the later ones read it.
    Otherwise its default RoPE reads ``DEFAULT_PARTIAL_ROTARY`` and a scaling 1.0 (``ROPE_INIT_FUNCTIONS``' default).
    """
    top = cfg.get("partial_rotary_factor")
    types = sorted(set(cfg.get("layer_types") or nested))
    kinds = {t: nested[t].get("rope_type") or nested[t].get("type") or "default" for t in types if t in nested}
    if top is not None and any(kinds[t] != "default" for t in kinds if t <= layer_type):
        return float(top)
    return DEFAULT_PARTIAL_ROTARY[cfg["model_type"]] if kinds.get(layer_type, "default") == "default" else 1.0


def _layer_head_dim(cfg: Mapping[str, Any], layer_type: str | None) -> int | None:
    """Gemma 4 gives its full-attention layers their own ``head_dim`` in ``per_layer_config`` (keyed by layer
    index); the first layer of ``layer_type`` decides, as every layer of a type gets the same override."""
    per_layer, types = cfg.get("per_layer_config"), cfg.get("layer_types")
    if layer_type is None or not isinstance(per_layer, Mapping) or not types or layer_type not in types:
        return None
    index = list(types).index(layer_type)
    override = per_layer.get(str(index), per_layer.get(index))
    return override.get("head_dim") if isinstance(override, Mapping) else None


#: What ``rotary_config_to_hf`` writes for: transformers (whose rope types every dict it writes must be), or vLLM.
RUNTIMES = ("transformers", "vllm")


def rotary_config_to_hf(config: RotaryConfig, *, legacy: bool = False, runtime: str = "transformers") -> dict[str, Any]:
    """The HF config keys for this RoPE: ``head_dim`` and ``rope_parameters`` (transformers >= 5), or with
    ``legacy=True`` the older ``rope_theta`` / ``rope_scaling`` / ``partial_rotary_factor`` keys.

    Static NTK, which HF lacks, and NTK-by-alpha are exported exactly as default RoPE with the enlarged base; other
    scalings as their ``to_hf_dict()`` (TeleChat3's YaRN as plain ``"yarn"`` with its attention factor). Mixed NTK
    exists only in vLLM's form (``{"rope_type": "ntk", "factor", "mixed_b"}``, ``NTKScalingRotaryEmbedding``), which
    transformers fails on (it has no ``"ntk"`` rope type): it is written with ``runtime="vllm"`` and refused for
    ``"transformers"`` (the default). Grok's ``yarn_log`` is refused: no runtime reads it from ``rope_scaling``.
    ``max_position_embeddings`` is included when the scaling carries it.
    """
    if runtime not in RUNTIMES:
        fail("runtime", runtime, f"one of {list(RUNTIMES)}")
    if config.layout != "half":
        fail(
            "layout",
            config.layout,
            "'half' for Hugging Face (HF models use the half layout; permute q/k projection weights to convert)",
        )
    base, scaling = config.base, config.scaling
    if isinstance(scaling, (NTKScaling, NTKAlphaScaling)):
        dim = config.rotary_dim
        scale = scaling.factor if isinstance(scaling, NTKScaling) else scaling.alpha
        base, scaling = base * scale ** (dim / (dim - 2)), None
    if isinstance(scaling, YaRNLogScaling):
        fail(
            "scaling",
            "yarn_log",
            "a scaling with a rope_scaling form: Grok's yarn_log lives in top-level config keys that only vLLM's Grok "
            "model reads (rope_type, scaling_factor, ...), and no runtime reads it from rope_scaling",
        )
    if isinstance(scaling, MixedNTKScaling) and runtime != "vllm":
        fail(
            "scaling",
            "ntk_mixed",
            f"a scaling {runtime} runs: mixed NTK is vLLM's {{'rope_type': 'ntk', 'mixed_b': ...}} "
            "(NTKScalingRotaryEmbedding), which vLLM runs and transformers cannot load (it has no 'ntk' rope type: "
            "KeyError 'ntk'); write it for vLLM with rotary_config_to_hf(config, runtime='vllm')",
        )
    rope: dict[str, Any] = {"rope_type": "default"} if scaling is None else scaling.to_hf_dict()
    max_pos = rope.pop("max_position_embeddings", None)
    out: dict[str, Any] = {"head_dim": config.head_dim}
    if max_pos is not None:
        out["max_position_embeddings"] = max_pos
    if legacy:
        out["rope_theta"] = base
        out["rope_scaling"] = None if scaling is None else rope
        if config.partial_rotary_factor != 1.0:
            out["partial_rotary_factor"] = config.partial_rotary_factor
        return out
    rope["rope_theta"] = base
    if config.partial_rotary_factor != 1.0:
        rope["partial_rotary_factor"] = config.partial_rotary_factor
    out["rope_parameters"] = rope
    return out
