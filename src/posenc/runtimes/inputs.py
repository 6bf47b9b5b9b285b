"""The keys ``posenc check`` reads, checked before any runtime reader reads them: a bad value is one ``ValueError``
naming the file, the key, its value and what is allowed -- never a traceback from deep inside a reader, and never a
verdict computed from a value no runtime would load.

- a ``config.json``: the number of decoder layers (``num_hidden_layers`` or an alias, in ``text_config`` for a
  multimodal wrapper), ``max_position_embeddings``, and in every RoPE dict (``rope_parameters``, ``rope_scaling``,
  flat or per layer type, and the top-level ``rope_theta`` / ``partial_rotary_factor`` /
  ``original_max_position_embeddings``) the numbers the scalings compute with; ``dual_chunk_attention_config``'s
  sizes.
- a GGUF header: ``{arch}.context_length`` and ``{arch}.block_count`` (llama.cpp requires both), and the RoPE keys
  llama.cpp reads with the type it reads them as (``llama_model_loader::get_key`` refuses a key stored with another
  type: a ``rope.freq_base`` stored as a string does not load).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, NoReturn

#: The config keys transformers' config classes take the number of decoder layers from (``attribute_map`` aliases).
LAYER_KEYS = ("num_hidden_layers", "n_layer", "n_layers", "num_layers")
#: RoPE dict keys: what each must be. "positive": a finite number > 0; "number": finite; "length": an integer > 0;
#: "fraction": in (0, 1]; "factors": a list of finite numbers > 0; "name": a string.
_ROPE_KEYS = {
    "rope_theta": "positive",
    "factor": "positive",
    "original_max_position_embeddings": "length",
    "beta_fast": "positive",
    "beta_slow": "positive",
    "attention_factor": "positive",
    "mscale": "number",
    "mscale_all_dim": "number",
    "extrapolation_factor": "number",
    "low_freq_factor": "positive",
    "high_freq_factor": "positive",
    "partial_rotary_factor": "fraction",
    "short_factor": "factors",
    "long_factor": "factors",
    "rope_type": "name",
    "type": "name",
}
_ALLOWED = {
    "positive": "a finite number > 0",
    "number": "a finite number",
    "length": "a positive integer (tokens)",
    "fraction": "a number in (0, 1]",
    "factors": "a list of finite numbers > 0",
    "name": "a string",
}
#: GGUF RoPE keys under the architecture: (the value type llama.cpp reads, what the value must be).
_GGUF_KEYS = {
    "context_length": ("int", "length"),
    "block_count": ("int", "length"),
    "embedding_length": ("int", "length"),
    "rope.dimension_count": ("int", "length"),
    "rope.freq_base": ("float32", "positive"),
    "rope.freq_base_swa": ("float32", "positive"),
    "rope.scaling.type": ("string", "name"),
    "rope.scaling.factor": ("float32", "non-negative"),
    "rope.scale_linear": ("float32", "non-negative"),
    "rope.scaling.attn_factor": ("float32", "positive"),
    "rope.scaling.original_context_length": ("int", "length"),
}
_INTS = ("uint8", "int8", "uint16", "int16", "uint32", "int32", "uint64", "int64")


def _bad(path: Any, key: str, value: Any, allowed: str) -> NoReturn:
    raise ValueError(f"{key}={value!r} in {path} is invalid: expected {allowed}")


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _fits(value: Any, rule: str) -> bool:
    if rule == "name":
        return isinstance(value, str)
    if rule == "factors":
        return isinstance(value, (list, tuple)) and bool(value) and all(_is_number(v) and v > 0 for v in value)
    if not _is_number(value):
        return False
    if rule == "length":
        return float(value).is_integer() and value > 0
    return {"positive": value > 0, "non-negative": value >= 0, "fraction": 0 < value <= 1, "number": True}[rule]


def check_config(config: Mapping[str, Any], path: Any) -> None:
    """Refuse a ``config.json`` dict whose layer count or RoPE keys no runtime computes with.

    Raises:
        ValueError: naming ``path``, the key (``rope_parameters['factor']``), its value and what is allowed.
    """
    parts = [("", config)]
    if isinstance(config.get("text_config"), Mapping):
        parts.append(("text_config.", config["text_config"]))
    counts = [(prefix + k, part[k]) for prefix, part in parts for k in LAYER_KEYS if part.get(k) is not None]
    if not counts:
        raise ValueError(f"{path} has no num_hidden_layers (nor {', '.join(LAYER_KEYS[1:])}, at the top or in "
                         "text_config): expected the number of decoder layers, a positive integer")
    for key, value in counts:
        if not _fits(value, "length"):
            _bad(path, key, value, "the number of decoder layers, a positive integer")
    for prefix, part in parts:
        for key in ("max_position_embeddings", "original_max_position_embeddings"):
            if part.get(key) is not None and not _fits(part[key], "length"):
                _bad(path, prefix + key, part[key], _ALLOWED["length"])
        _check_rope(path, {k: part[k] for k in ("rope_theta", "partial_rotary_factor") if k in part}, prefix[:-1])
        for name in ("rope_parameters", "rope_scaling"):
            value = part.get(name)
            if value is None:
                continue
            if not isinstance(value, Mapping):
                _bad(path, prefix + name, value, "a dict of RoPE parameters (or null)")
            nested = [k for k, v in value.items() if isinstance(v, Mapping)]
            for layer_type in nested:
                _check_rope(path, value[layer_type], f"{prefix}{name}[{layer_type!r}]")
            _check_rope(path, {k: v for k, v in value.items() if k not in nested}, prefix + name)
        dca = part.get("dual_chunk_attention_config")
        if dca is not None:
            if not isinstance(dca, Mapping):
                _bad(path, prefix + "dual_chunk_attention_config", dca, "a dict (chunk_size, local_size, ...)")
            for key in ("chunk_size", "local_size", "original_max_position_embeddings"):
                if dca.get(key) is not None and not _fits(dca[key], "length"):
                    _bad(path, f"{prefix}dual_chunk_attention_config[{key!r}]", dca[key], _ALLOWED["length"])


def _check_rope(path: Any, params: Mapping[str, Any], where: str) -> None:
    for key, value in params.items():
        rule = _ROPE_KEYS.get(key)
        if rule is None or value is None:  # None: transformers reads it as absent
            continue
        if not _fits(value, rule):
            name = f"{where}[{key!r}]" if where else key
            _bad(path, name, value, _ALLOWED[rule])


def check_gguf(header: Any) -> None:
    """Refuse a GGUF header without the keys llama.cpp requires, or with a RoPE key of a type or value llama.cpp
    does not load (``posenc.gguf.header.GGUFHeader``).

    Raises:
        ValueError: naming the file, the key, its value (and stored type) and what is allowed.
    """
    meta, types = header.metadata, getattr(header, "value_types", {}) or {}
    arch = meta.get("general.architecture")
    for name in ("context_length", "block_count"):
        if f"{arch}.{name}" not in meta:
            raise ValueError(f"{header.path} has no {arch}.{name}: expected a positive integer (llama.cpp requires "
                             "it to load the file)")
    for name, (kind, rule) in _GGUF_KEYS.items():
        key = f"{arch}.{name}"
        if key not in meta:
            continue
        value, stored = meta[key], types.get(key)
        if kind == "float32":
            typed = stored == "float32" if stored else isinstance(value, float)
        elif kind == "int":
            typed = stored in _INTS if stored else isinstance(value, int) and not isinstance(value, bool)
        else:
            typed = isinstance(value, str)
        allowed = f"{_ALLOWED.get(rule, 'a finite number >= 0')}, stored as {'an integer' if kind == 'int' else kind}"
        if not typed:
            _bad(header.path, key, value, f"{allowed} (the file stores a {stored or type(value).__name__}; "
                 "llama.cpp refuses a key of another type)")
        if not _fits(value, rule):
            _bad(header.path, key, value, allowed)


def check_source(source: Any) -> None:
    """``check_gguf`` for a GGUF ``posenc.runtimes.Source``, ``check_config`` (naming its ``config.json``) otherwise."""
    if source.kind == "gguf":
        check_gguf(source.gguf)
    else:
        check_config(source.config or {}, source.path / "config.json" if source.kind == "folder" else source.path)
