"""The KV cache of a transformers model whose RoPE frequencies change with the length (``dynamic``, ``longrope``),
kept as close to the full forward as a cache allows once ``posenc.hf.extend_context`` patched it: ``guard_cache``
installs the re-rotation of the cached keys (``posenc.hf._cache_rerotate``) or, where it cannot, a guard that warns;
``CacheStaleWarning`` says where cached decoding still leaves the full forward."""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any, cast

import torch

from posenc.hf._reach import rotary_positions
from posenc.hf.rotary import rotary_config_from_hf
from posenc.scalings import LongRoPEScaling, RopeScaling


class CacheStaleWarning(UserWarning):
    """A cached forward of a model whose RoPE frequencies (``dynamic``, ``longrope``) or remapping method's logit
    factor (Dual Chunk Attention) depend on the length ran at a length that changes them for tokens its cache holds,
    so it differs from the full forward: the cached keys were rotated to the new frequencies but earlier tokens'
    hidden states keep those of their own step (or, where posenc found no attention module to hook, the cached keys
    keep their old rotation). Given once per cache: each ``generate`` (or hand-made cache) that goes stale warns
    once; Python's warning filters decide whether a repeat is shown (default: once per place in a process)."""


_GUARD_ATTR = "_posenc_cache_guard"


def length_dependent_layer_types(config: Any, setup: Any) -> dict[str | None, RopeScaling]:
    """The layer types whose frequencies change with the length (``dynamic``, ``longrope``) and their scaling:
    key ``None`` for a config with one ``rope_parameters`` for every layer, else the per-layer-type keys (Gemma 3/4)."""
    params = config.rope_parameters
    nested = sorted(k for k, v in params.items() if isinstance(v, Mapping))
    if not nested:
        scaling = setup.scaling
        return {None: scaling} if scaling is not None and scaling.depends_on_length else {}
    found: dict[str | None, RopeScaling] = {}
    for layer_type in nested:
        scaling = rotary_config_from_hf(config, layer_type=layer_type).scaling
        if scaling is not None and scaling.depends_on_length:
            found[layer_type] = scaling
    return found


def guard_cache(model: torch.nn.Module, modules: list[tuple[str, torch.nn.Module]], setup: Any) -> None:
    """Keep cached decoding of a ``dynamic``/``longrope`` model as close to the full forward as a cache allows
    (``posenc.hf._cache_rerotate``); earlier hooks, wrappers and guards are removed first, so a second
    ``extend_context`` replaces them.

    - Hooks on the attention modules of the layers whose frequencies change re-rotate the cached keys to each call's
      frequencies. That makes cached decoding equal the full forward only where no attention layer follows the first
      such layer; otherwise earlier tokens' hidden states (so the later layers' keys and values) keep the frequencies
      of the step that computed them (dynamic scaling with a KV cache as YaRN, Peng et al. 2023, section 3.3,
      defines it), and the first call that re-rotates a cache's keys warns once for that cache (``CacheStaleWarning``).
    - ``longrope``: ``generate`` drops its cache once when the sequence passes ``original_max_position_embeddings``
      and re-encodes the sequence with the long factors (Phi-3's own rule), so generation equals the full forward.
    - Where no attention module is recognised or the model has several rotary modules: the former guard, which warns
      once per module and sequence (one that starts at position 0) when a call continues a cache at a length whose
      frequencies differ from the previous call's.
    """
    from posenc.encodings.rotary import RotaryEmbedding
    from posenc.hf._cache_rerotate import (
        attention_modules,
        exact_with_cache,
        install_rerotation,
        reencode_at_switch,
        remove_rerotation,
    )

    for _, m in modules:
        handle = getattr(m, _GUARD_ATTR, None)
        if handle is not None:
            handle.remove()
            delattr(m, _GUARD_ATTR)
    remove_rerotation(model)
    dependent = length_dependent_layer_types(model.config, setup)
    if not dependent:
        return
    kinds = " and ".join(sorted({s.rope_type for s in dependent.values()}))
    notify = None
    if not exact_with_cache(model, set(dependent)):

        def notify() -> None:  # once per cache (posenc.hf._cache_rerotate)
            message = (
                f"posenc.hf.extend_context: this {kinds} model's RoPE frequencies changed since its KV cache was "
                "filled. posenc rotated the cached keys to the current frequencies, but the earlier tokens' "
                "hidden states, and so every later layer's cached keys and values, keep the frequencies of the "
                "step that computed them: cached decoding differs from the full forward at this length (it is "
                "dynamic scaling with a KV cache as YaRN, section 3.3, defines it). Run without the cache "
                "(use_cache=False) for the full forward"
            )
            if "longrope" in kinds:
                message += "; generate re-encodes the sequence once at LongRoPE's switch instead"
            warnings.warn(message + ".", CacheStaleWarning, stacklevel=2)

    if len(modules) == 1 and attention_modules(model):
        if install_rerotation(model, modules[0][1], set(dependent), notify=notify):
            longropes = [cast(LongRoPEScaling, s) for s in dependent.values() if s.rope_type == "longrope"]
            switches = {s.original_max_position_embeddings for s in longropes}
            if switches and hasattr(type(model), "prepare_inputs_for_generation"):
                reencode_at_switch(model, min(switches))
        return  # else no layer of the extended type: nothing goes stale
    scaling = setup.scaling
    if scaling is None or not scaling.depends_on_length:
        return
    rope = RotaryEmbedding.from_config(setup)
    for _, m in modules:
        state: dict[str, Any] = {"length": None, "warned": False}

        def check(module, args, kwargs, state=state):  # noqa: ANN001, ANN202 - forward pre-hook
            positions = rotary_positions(args, kwargs)
            if positions is None or torch.compiler.is_compiling() or positions.numel() == 0:
                return None
            if module.__dict__.get("_posenc_drope") is not None:
                return None  # DroPE: the module returns no rotation, so its frequencies leave the cache alone
            start, length = int(positions.min()), int(positions.max()) + 1
            last, state["length"] = state["length"], length
            if start == 0:
                state["warned"] = False  # a new sequence, so a new cache: its own warning
            if start > 0 and last is not None and not state["warned"] and not rope.same_frequencies(last, length):
                state["warned"] = True
                warnings.warn(
                    f"posenc.hf.extend_context: this {scaling.rope_type} model changes its RoPE frequencies between "
                    f"length {last} and {length}, but the KV cache holds keys rotated with the old ones and posenc "
                    "found no attention module to re-rotate them in, so cached generation now differs from the full "
                    "forward. Run without the cache (use_cache=False).",
                    CacheStaleWarning,
                    stacklevel=2,
                )
            return None

        setattr(m, _GUARD_ATTR, m.register_forward_pre_hook(check, with_kwargs=True))
