"""Helpers shared by the ``posenc.hf`` modules: configs as dicts, and naming a model in error messages."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from posenc.encodings.rotary_hf import as_dict  # noqa: F401 - re-exported for posenc.hf


def model_type(config: Any) -> str | None:
    """``config.model_type`` of a config object or dict (``None`` if it has none)."""
    if isinstance(config, Mapping):
        return config.get("model_type")
    return getattr(config, "model_type", None)


def architecture(model: Any) -> str:
    """``"llama (LlamaForCausalLM)"``: the model type and class, for error messages."""
    config = getattr(model, "config", None)
    return f"{model_type(config) if config is not None else None!s} ({type(model).__name__})"


def rotary_modules(model: Any) -> list[tuple[str, Any]]:
    """Every submodule holding an ``inv_freq`` buffer (or a per-layer-type ``<type>_inv_freq``)."""
    return [
        (name, m)
        for name, m in model.named_modules()
        if any(b == "inv_freq" or (b.endswith("_inv_freq") and "original" not in b) for b in m._buffers)
    ]
