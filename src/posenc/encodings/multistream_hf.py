"""Reading multi-stream RoPE settings out of Hugging Face configs: what the multi-stream encodings' translations share.

Pure functions of config dicts (transformers itself is never imported). Each encoding's reader lives in its own
module (``posenc.encodings.xdrope.xdrope_config_from_hf``, ...) and takes the released checkpoint form (``rope_theta``
+ ``rope_scaling``, legacy ``type`` key) and the form transformers >= 5 normalises it to (``rope_parameters``), at the
top level or under ``text_config``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from posenc._checks import fail
from posenc.encodings.rotary_hf import as_dict


def text_config_dict(config: Any) -> dict[str, Any]:
    """The language model's config dict: ``text_config`` where the model nests one (vision-language models)."""
    cfg = as_dict(config)
    text = cfg.get("text_config")
    return as_dict(text) if isinstance(text, Mapping) or hasattr(text, "to_dict") else cfg


def rope_dict(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """``rope_parameters`` (transformers >= 5) or ``rope_scaling`` (released configs), with ``rope_type`` set."""
    params = dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or {})
    params["rope_type"] = params.get("rope_type") or params.get("type") or "default"
    params.pop("type", None)
    return params


def config_head_dim(cfg: Mapping[str, Any], *keys: str) -> int:
    """The first of ``keys`` the config sets, else ``hidden_size // num_attention_heads``."""
    for key in keys:
        if cfg.get(key):
            return int(cfg[key])
    if not cfg.get("hidden_size") or not cfg.get("num_attention_heads"):
        fail("config", "{...}", f"one of {list(keys)}, or 'hidden_size' and 'num_attention_heads'")
    return int(cfg["hidden_size"]) // int(cfg["num_attention_heads"])


def config_base(cfg: Mapping[str, Any], params: Mapping[str, Any]) -> float:
    """``rope_theta`` from the rope dict, else the config's top level, else 10000."""
    return float(params.get("rope_theta") or cfg.get("rope_theta") or 10000.0)
