"""Hugging Face interop: positional configs in and out of transformers, and context extension of loaded models.

- ``rotary_config_from_hf`` / ``rotary_config_to_hf``: RoPE (``RotaryConfig``) from and to HF config keys;
  ``xdrope_config_*`` (HunYuan-VL's XD-RoPE), ``rope_3d_config_*`` (ERNIE-4.5-VL's and Bailing's 3-D RoPE).
- ``alibi_config_from_hf`` / ``alibi_config_to_hf``: ALiBi (``ALiBiConfig``) from and to BLOOM / MPT configs.
- ``positional_setup``: the posenc config(s) for any supported architecture's config.
- ``extend_context``: linear / ntk / dynamic / yarn / longrope / llama3 on a loaded RoPE model, the remapping
  methods (``REMAP_METHODS``), ``drope`` (DroPE: RoPE dropped from every layer), slope interpolation on an ALiBi
  model, in place; a patched bfloat16/float16 model computes its RoPE in float32 (``keep_rope_float32``) and a
  remapping method's attention spans in its own dtype, merged in float32; warnings past the patch's reach
  (``ReachExceededWarning``) and where cached decoding leaves the full forward (``CacheStaleWarning``).
- ``resolve_model`` / ``inspect_gguf`` / ``load_config`` / ``original_context`` / ``load_causal_lm``: pretrained
  models from GGUF files, transformers folders or ``"smollm2"``, offline; ``save_pretrained`` writes one back as a
  transformers folder (``load_causal_lm`` of it re-applies what the config does not carry), ``save_gguf`` as a GGUF
  file llama.cpp runs with its RoPE scaling (``posenc.gguf.rope``).

``import posenc.hf`` loads nothing more: the names are imported on first use (``__getattr__``).
"""

# ruff: noqa: F405  (the names of __all__ come from posenc.hf._api, star-imported for type checkers only)
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from posenc.hf._api import *  # noqa: F403

__all__ = [
    "ALIBI_MODEL_TYPES",
    "CacheStaleWarning",
    "METHODS",
    "METHOD_OPTIONS",
    "ModelSource",
    "PosencOnlyWarning",
    "REMAP_METHODS",
    "ROPE_MODEL_TYPES",
    "ReachExceededWarning",
    "ServedOnlyWarning",
    "alibi_config_from_hf",
    "alibi_config_to_hf",
    "extend_context",
    "inspect_gguf",
    "keep_rope_float32",
    "load_causal_lm",
    "load_config",
    "original_context",
    "positional_setup",
    "resolve_model",
    "rope_3d_config_from_hf",
    "rope_3d_config_to_hf",
    "rotary_config_from_hf",
    "rotary_config_to_hf",
    "save_gguf",
    "save_pretrained",
    "supported_model_types",
    "xdrope_config_from_hf",
    "xdrope_config_to_hf",
]


def __getattr__(name: str) -> object:
    """The names of ``__all__``, imported on first use, all at once, from ``posenc.hf._api`` (PEP 562).

    ``import posenc.hf`` (or a submodule such as ``posenc.hf.layers``) loads nothing more, so ``posenc check``'s
    readers import only the modules they read; transformers is imported when a model is loaded or patched.
    """
    if name not in __all__:
        raise AttributeError(f"module 'posenc.hf' has no attribute {name!r}")
    from posenc.hf import _api

    globals().update({n: getattr(_api, n) for n in __all__})
    return globals()[name]


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
