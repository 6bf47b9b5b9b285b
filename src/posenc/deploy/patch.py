"""``apply``: a parsed method patched onto a loaded (or meta-device) transformers model, every layer type it changes,
and what changed -- the description, and the texts a report shows (which layers, a remapping method's parameters).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from posenc._checks import fail
from posenc.deploy.methods import Method


@dataclass(frozen=True)
class Applied:
    """What ``apply`` did: ``description`` (``extend_context``'s, with ``layer_types``, ``layers_changed``, per-type
    ``rope_parameters`` and a composed method's ``frequency``), ``layers_note`` (which layers changed, in words) and
    ``remap_note`` (a remapping method's parameters in words; None for the others). ``keeps_note``: a remapping
    method or DroPE, whose ``layers_note`` does not replace one already shown."""

    description: dict
    layers_note: str
    remap_note: str | None = None
    keeps_note: bool = False


def patched_count(description: Mapping[str, Any]) -> int:
    """How many modules ``extend_context`` says it patched (keys like ``modules_patched``), 0 if it does not say."""
    total = 0
    for key, value in description.items():
        if "patched" in str(key).lower():
            if isinstance(value, int) and not isinstance(value, bool):
                total += value
            elif isinstance(value, (list, tuple, set)):
                total += len(value)
    return total


def apply(
    model: torch.nn.Module,
    method: Method,
    factor: float,
    *,
    original: int,
    layer_types: tuple[str | None, ...] = (None,),
    config: Any = None,
    layers: int | None = None,
) -> Applied:
    """Patch ``model`` itself with ``method`` at ``factor`` (``posenc.hf.extend_context`` for each of
    ``layer_types``; a composed method: its frequency method, then its remapping method within the stretched
    context, whose original length is the model's current one). ``original``: the context the model was trained
    for; ``config``: the model's config as read (default ``model.config``); ``layers``: its decoder layers (default
    from the config).

    Raises:
        ValueError: what ``extend_context`` refuses, and a patch that reports no module patched (the model would
            be used unpatched under a method's name).
    """
    from posenc.deploy.source import layer_count
    from posenc.hf import ALIBI_MODEL_TYPES, extend_context

    config = model.config if config is None else config
    n = layer_count(config) if layers is None else layers
    if method.drops:  # RoPE dropped from every layer, whatever the layer type: no factor, no original length
        description = dict(extend_context(model, method.name))
        description["layer_types"] = None
        description["layers_changed"] = list(description["layers"])
        return Applied(description, f"all {n} layers (DroPE: RoPE dropped, cos = 1, sin = 0)", keeps_note=True)
    first, remap = method.parts
    described = [
        extend_context(model, first, factor, original_max_position_embeddings=original, layer_type=layer_type)
        for layer_type in layer_types
    ]
    stretched = dict(described[-1])
    if remap is not None:  # then within the stretched context (its original length: the model's current one)
        described = [extend_context(model, remap, 1.0, layer_type=t) for t in layer_types]
    description = dict(described[-1])
    if not isinstance(description, Mapping) or patched_count(description) < 1:
        fail(
            "method",
            method.name,
            f"a patch that changes {config.model_type}'s positions; extend_context reported {description!r}, so the "
            "model would be measured unpatched",
        )
    changed = _changed_layers(config, layer_types, n)
    description["layer_types"] = list(layer_types) if layer_types != (None,) else None
    description["layers_changed"] = changed
    if len(described) > 1:
        description["rope_parameters"] = {
            d["layer_type"]: d["rope_parameters"] for d in described if "rope_parameters" in d
        }
    alibi = config.model_type in ALIBI_MODEL_TYPES
    note = _layers_text(description, changed, config, layer_types, n, alibi)
    if "parameters" not in description:
        return Applied(description, note)
    remap_note = description["description"]  # a remapping method: what the paper's rule set its parameters to
    if remap is not None:
        remap_note = f"{stretched.get('description', first)}, then {remap_note}"
        description["frequency"] = stretched
    return Applied(description, note, remap_note, keeps_note=True)


def _changed_layers(config: Any, layer_types: tuple[str | None, ...], layers: int) -> list[int]:
    if layer_types == (None,):
        return list(range(layers))
    types = list(getattr(config, "layer_types", None) or ())
    return [i for i, t in enumerate(types) if t in layer_types]


def _layers_text(description: Mapping[str, Any], changed: list[int], config: Any,
                 layer_types: tuple[str | None, ...], n: int, alibi: bool) -> str:
    names = ", ".join(description.get("module_names", ())[:3])
    if "parameters" in description:
        remapped = description.get("layer_type")
        if remapped is None:
            return f"all {n} layers (remapping: the rotary module returns the identity, each attention remaps)"
        kept = sorted({t for t in (getattr(config, "layer_types", None) or ()) if t != remapped})
        layers = description.get("layers", changed)
        shown = ", ".join(map(str, layers[:12])) + (", ..." if len(layers) > 12 else "")
        return (f"the {remapped} layers only: {len(layers)} of {n} (layers {shown}; remapping: their rotary output is "
                f"the identity, their attention remaps); {', '.join(kept)} layers unchanged (their own RoPE, "
                "window and SDPA attention)")
    if layer_types == (None,):
        how = "a hook on each block" if alibi else f"rotary embedding {names}"
        return f"all {n} layers ({how})"
    kept = sorted({t for t in (getattr(config, "layer_types", None) or ()) if t not in layer_types})
    patched = [str(t) for t in layer_types]
    if not kept:
        return f"all {n} layers, of every type: {', '.join(patched)} (rotary embedding {names})"
    shown = ", ".join(map(str, changed[:12])) + (", ..." if len(changed) > 12 else "")
    return (
        f"the {', '.join(patched)} layers only: {len(changed)} of {n} (layers {shown}; rotary embedding "
        f"{names}); {', '.join(kept)} layers unchanged"
    )
