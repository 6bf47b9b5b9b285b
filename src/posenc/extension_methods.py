"""The RoPE frequency methods of context extension as the Hugging Face scaling config each one is: a table from the
method's name to the function building its ``rope_scaling`` dict from the factor and the pretraining length, as
transformers' ``ROPE_INIT_FUNCTIONS`` maps a ``rope_type`` to its frequencies. ``posenc.hf.extend_context`` (a
loaded transformers model) and the lab's ``scaled_encoding`` (a lab model) both build their scalings from it.
Standard library only."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

#: Llama 3.1's own ``low_freq_factor`` and ``high_freq_factor``: what ``llama3`` uses unless given others.
LLAMA3_DEFAULTS = {"low_freq_factor": 1.0, "high_freq_factor": 4.0}


def _linear(factor: float, original: int) -> dict[str, Any]:
    return {"rope_type": "linear", "factor": factor}


def _ntk(factor: float, original: int) -> dict[str, Any]:
    return {"rope_type": "ntk", "factor": factor}


def _dynamic(factor: float, original: int) -> dict[str, Any]:
    return {"rope_type": "dynamic", "factor": factor, "max_position_embeddings": original}  # its threshold


def _yarn(factor: float, original: int) -> dict[str, Any]:
    return {"rope_type": "yarn", "factor": factor, "original_max_position_embeddings": original}


def _llama3(factor: float, original: int) -> dict[str, Any]:
    return {"rope_type": "llama3", "factor": factor, **LLAMA3_DEFAULTS, "original_max_position_embeddings": original}


def _longrope(factor: float, original: int) -> dict[str, Any]:
    return {"rope_type": "longrope", "factor": factor, "original_max_position_embeddings": original}


#: ``method -> (factor, original length) -> rope_scaling dict``: Position Interpolation (Chen et al. 2023), NTK-aware
#: (bloc97), dynamic NTK (emozilla), YaRN (Peng et al. 2023), Llama 3.1's, LongRoPE (Ding et al. 2024; its
#: ``long_factor`` and ``short_factor`` come as options).
ROPE_SCALING_CONFIGS: dict[str, Callable[[float, int], dict[str, Any]]] = {
    "linear": _linear,
    "ntk": _ntk,
    "dynamic": _dynamic,
    "yarn": _yarn,
    "llama3": _llama3,
    "longrope": _longrope,
}


def rope_scaling_config(method: str, *, factor: float, original: int, **options: Any) -> dict[str, Any]:
    """The Hugging Face ``rope_scaling`` dict of ``method`` (a key of ``ROPE_SCALING_CONFIGS``) at ``factor`` for a
    model pretrained at ``original`` tokens, ``options`` (the method's own keys) overriding its defaults."""
    return {**ROPE_SCALING_CONFIGS[method](factor, original), **options}
