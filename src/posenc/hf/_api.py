"""The names ``posenc.hf`` exports (``posenc.hf.__all__``), imported together on first use (``posenc.hf.__getattr__``),
each from the module that defines it."""

# ruff: noqa: F401

from posenc.hf._cache_guard import CacheStaleWarning
from posenc.hf._reach import ReachExceededWarning
from posenc.hf.alibi import ALIBI_MODEL_TYPES, alibi_config_from_hf, alibi_config_to_hf
from posenc.hf.extend import METHOD_OPTIONS, METHODS, REMAP_METHODS, extend_context
from posenc.hf.gguf_export import save_gguf
from posenc.hf.load import ModelSource, inspect_gguf, load_causal_lm, load_config, original_context, resolve_model
from posenc.hf.rope_float32 import keep_rope_float32
from posenc.hf.rotary import (
    rope_3d_config_from_hf,
    rope_3d_config_to_hf,
    rotary_config_from_hf,
    rotary_config_to_hf,
    xdrope_config_from_hf,
    xdrope_config_to_hf,
)
from posenc.hf.save import PosencOnlyWarning, ServedOnlyWarning, save_pretrained
from posenc.hf.setup import ROPE_MODEL_TYPES, positional_setup, supported_model_types
