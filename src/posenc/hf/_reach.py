"""How far a patched model reaches, and a warning, once per model, for an input past it.

A context extension is made for a length; past it the model attends over distances (rotary angles) it never saw,
in pretraining or through the extension, as an unpatched model past its ``max_position_embeddings``. What each
method reaches: ``ReachExceededWarning``; per-layer-type configs: ``frequency_reach``; the hook that warns:
``watch_reach``; a reloaded folder: ``watch_config_reach``.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Mapping
from typing import Any, cast

import torch

from posenc.hf import _record

_STATE = "_posenc_reach"  # on each rotary module: the model's _Reach (shared), or None
_HOOK = "_posenc_reach_hook"  # on each rotary module: the id of its pre-hook


class ReachExceededWarning(UserWarning):
    """An input longer than a patched model reaches (``posenc.hf.extend_context``: a remapping method's reach, a
    frequency method's extended context): past it the model attends over distances it never saw. Given once per
    model.

    - a remapping method reaches ``method.reach(original)`` tokens, the longest sequence whose every (query, key) pair
      it scores at a distance below the length ``original`` it was derived over (Self-Extend ``G (L - W + W // G)``,
      STRING ``L + offset - W``, Leaky ReRoPE); DCA, ReRoPE, LM-Infinite and StreamingLLM have no limit;
    - a frequency method with a target (``linear``, ``ntk``, ``yarn``, ``longrope``, ``llama3``; ``linear`` on p-RoPE)
      reaches the context it extended the model to, the ``max_position_embeddings`` it wrote; ``dynamic`` has no limit
      (it rescales with the length).

    The last ``extend_context`` call sets the model's reach (a remapping method after YaRN: the remapping method's,
    counted over the YaRN model's context). ALiBi's slope interpolation has no such warning (BLOOM records no training
    length).
    """


@dataclasses.dataclass
class _Reach:
    tokens: int
    what: str
    warned: bool = False


def rotary_positions(args: tuple, kwargs: dict[str, Any]) -> torch.Tensor | None:
    """The ``position_ids`` a transformers rotary module is called with (``forward(x, position_ids, ...)``)."""
    positions = kwargs.get("position_ids", args[1] if len(args) > 1 else None)
    return positions if isinstance(positions, torch.Tensor) else None


def watch_reach(modules: list[tuple[str, torch.nn.Module]], reach: float | None, what: str) -> None:
    """Warn once (``ReachExceededWarning``) when a forward of the model whose rotary ``modules`` these are runs a
    sequence longer than ``reach`` tokens; ``what`` names the patch (e.g. ``"yarn x2 over 32"``). ``None`` or ``inf``:
    no limit. Replaces the reach an earlier call set.

    A forward pre-hook on each rotary module -- which every forward runs once, before any layer, with the call's
    ``position_ids`` -- warns the first time a sequence is longer (largest position + 1) than the reach: a prefill, or
    the step of ``generate`` that passes it.
    """
    state = None if reach is None or math.isinf(reach) else _Reach(int(reach), what)
    for _, module in modules:
        module.__dict__[_STATE] = state  # one object for every module: once per model
        if state is not None and module.__dict__.get(_HOOK) not in module._forward_pre_hooks:  # once per module
            module.__dict__[_HOOK] = module.register_forward_pre_hook(_check, with_kwargs=True).id


def _check(module: torch.nn.Module, args: tuple, kwargs: dict[str, Any]) -> None:
    state = module.__dict__.get(_STATE)
    if state is None or state.warned or torch.compiler.is_compiling():
        return None
    positions = rotary_positions(args, kwargs)
    if positions is None or positions.numel() == 0:
        return None
    length = int(positions.max()) + 1
    if length > state.tokens:
        state.warned = True
        warnings.warn(
            f"posenc.hf.extend_context: a sequence of {length} tokens is past the reach of {state.what}, "
            f"{state.tokens} tokens: past it the model attends over distances it never saw, as an unpatched model "
            "past its max_position_embeddings (extend with a larger factor to reach further). Warned once per model.",
            ReachExceededWarning,
            stacklevel=2,
        )
    return None


def _nested_types(config: Any) -> list[str]:
    """The per-layer-type keys of ``config.rope_parameters`` (Gemma 3/4, MiMo-V2-Flash); none for one shared entry."""
    params = getattr(config, "rope_parameters", None)
    return sorted(k for k, v in params.items() if isinstance(v, Mapping)) if isinstance(params, Mapping) else []


def layer_contexts(model: torch.nn.Module) -> dict[str, float] | None:
    """Per layer type of a per-layer-type config, the context its RoPE carries: ``inf`` for ``dynamic`` (no limit),
    else the one the model's last recorded ``extend_context`` call left it (``"layer_contexts"`` in the record),
    else the model's ``max_position_embeddings``. None for a config with one ``rope_parameters``."""
    config: Any = model.config
    types = _nested_types(config)
    if not types:
        return None
    recorded: Mapping[str, Any] = next(
        (
            e["layer_contexts"]
            for e in reversed(_record.extensions(model))
            if isinstance(e.get("layer_contexts"), Mapping)
        ),
        {},
    )
    out: dict[str, float] = {}
    for name in types:
        if config.rope_parameters[name].get("rope_type") == "dynamic":
            out[name] = math.inf
        elif isinstance(recorded.get(name), int):
            out[name] = recorded[name]
        else:
            out[name] = int(config.max_position_embeddings)
    return out


def type_context(model: torch.nn.Module, layer_type: str | None) -> int:
    """The context ``layer_type``'s RoPE carries (``layer_contexts``); the model's ``max_position_embeddings`` for
    ``None``, a config with one ``rope_parameters``, or a ``dynamic`` type."""
    config: Any = model.config
    contexts = layer_contexts(model) or {}
    found = contexts.get(layer_type, math.inf) if layer_type is not None else math.inf
    return int(config.max_position_embeddings) if math.isinf(found) else int(found)


def frequency_reach(config: Any, contexts: Mapping[str, float] | None) -> tuple[float, str | None]:
    """How far a frequency-scaled model reaches, and the layer type that limits it (None: one ``rope_parameters``).

    One ``rope_parameters``: its ``max_position_embeddings`` (``dynamic``: ``inf``). Per layer type (``contexts``,
    from ``layer_contexts``): the least over its RoPE layers of the layer's type context, a sliding-window layer
    (``layer_types[i] == "sliding_attention"``) unlimited where ``sliding_window`` fits in it (its distances stay
    below the window); ``inf`` where no layer is limited.

    Each layer type carries its own context (``layer_contexts``: the extended one for the types a call extended, the
    model's context as loaded for the others, none for ``dynamic``), and ``max_position_embeddings`` is set to the
    reach (Gemma 3/4, MiMo-V2-Flash), never more (a ``dynamic`` layer type keeps it as its threshold).
    """
    if contexts is None:
        params = getattr(config, "rope_parameters", None) or {}
        dynamic = isinstance(params, Mapping) and params.get("rope_type") == "dynamic"
        return (math.inf if dynamic else float(config.max_position_embeddings)), None
    from posenc.hf.layers import rope_layers

    window = getattr(config, "sliding_window", None)
    reach, limiting = math.inf, None
    for name, rotates in zip(getattr(config, "layer_types", None) or (), rope_layers(config), strict=False):
        own = contexts.get(name, math.inf) if rotates else math.inf
        if name == "sliding_attention" and isinstance(window, int) and window <= own:
            own = math.inf
        if own < reach:
            reach, limiting = own, name
    return reach, limiting


def model_context(config: Any, contexts: Mapping[str, float], layer_type: str | None, asked: int, target: int) -> int:
    """The ``max_position_embeddings`` of a per-layer-type config once ``layer_type`` carries ``contexts[layer_type]``:
    ``asked`` (the call's own: ``dynamic``'s threshold) for a ``dynamic`` call; the current one where another type
    runs ``dynamic`` (it reads it as its threshold); else the model's reach (``frequency_reach``), ``target`` where
    no layer limits it."""
    if math.isinf(contexts[cast(str, layer_type)]):
        return asked
    if any(math.isinf(v) for k, v in contexts.items() if k != layer_type):
        return int(config.max_position_embeddings)
    reach, _ = frequency_reach(config, contexts)
    return target if math.isinf(reach) else int(reach)


def limited_by(what: str, layer_type: str | None, limiting: str | None, reach: float) -> str:
    """``what`` (a call's description) with the layer type it extended and, where another type limits the model's
    reach, that type and reach."""
    if layer_type is None:
        return what
    what = f"{what} on the {layer_type} layers"
    if limiting is None or limiting == layer_type or math.isinf(reach):
        return what
    return f"{what} (the model reaches as far as its {limiting} layers: {int(reach)} tokens)"


def watch_config_reach(model: torch.nn.Module, modules: list[tuple[str, torch.nn.Module]]) -> None:
    """The reach warning of a model reloaded with frequency methods in its config (``posenc.hf.load_causal_lm`` on a
    folder ``posenc.hf.save_pretrained`` wrote), as ``extend_context`` set it: ``frequency_reach`` of its config and
    recorded layer contexts, named after the record's last frequency call."""
    items = [e for e in _record.extensions(model) if e.get("in_config")]
    if not items:
        return
    last = items[-1]
    layer_type = last.get("arguments", {}).get("layer_type")
    reach, limiting = frequency_reach(model.config, layer_contexts(model))
    what = f"{_record.label(last)} over {last.get('original_max_position_embeddings')} (posenc's record)"
    watch_reach(modules, reach, limited_by(what, layer_type, limiting, reach))
