"""Helpers shared by the ``posenc.hf`` modules: configs as dicts, and naming a model in error messages."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from posenc._checks import fail


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


def model_type(config: Any) -> str | None:
    """``config.model_type`` of a config object or dict (``None`` if it has none)."""
    if isinstance(config, Mapping):
        return config.get("model_type")
    return getattr(config, "model_type", None)


def architecture(model: Any) -> str:
    """``"llama (LlamaForCausalLM)"``: the model type and class, for error messages."""
    config = getattr(model, "config", None)
    return f"{model_type(config) if config is not None else None!s} ({type(model).__name__})"
