"""Context extension of a loaded transformers RoPE model: new ``rope_parameters`` in its config, and every rotary
embedding module rebuilt from that config in place.

The new ``rope_parameters`` come from posenc's scaling configs (``posenc.scalings``, validated there) exported with
``rotary_config_to_hf``; static NTK, which transformers lacks, becomes default RoPE with the enlarged base. A p-RoPE
model (``"proportional"``) takes ``linear`` only: its rotating pairs are divided by the factor and the non-rotating
pairs stay at frequency 0 (HF's own ``factor`` key of that type); other methods are refused. Each
``*RotaryEmbedding`` module is then re-initialised by its own class from the updated config, and the state of that
fresh module (``inv_freq``, ``original_inv_freq``, ``attention_scaling``, ``rope_type``, ``max_seq_len_cached``, the
per-layer-type variants) replaces the old one's, so the patched model is the model transformers builds natively from
the new config, while the module objects (and any hooks on them) stay where they are. Granite-SWA's per-base modules
are rebuilt from per-base copies of the new config, as its model builds them (``posenc.hf._layer_theta``).
Reference: transformers ``modeling_rope_utils`` (``ROPE_INIT_FUNCTIONS``, ``dynamic_rope_update``); checked in
``tests/hf/test_extend.py`` by comparing logits with natively built models.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Mapping
from typing import Any, cast

import torch

from posenc._checks import fail
from posenc.encodings.rotary_config import RotaryConfig
from posenc.encodings.rotary_hf import DEFAULT_PARTIAL_ROTARY
from posenc.extension_methods import rope_scaling_config
from posenc.hf._cache_guard import guard_cache
from posenc.hf._common import architecture, rotary_modules
from posenc.hf._layer_theta import module_theta, theta_config
from posenc.hf._reach import (
    frequency_reach,
    layer_contexts,
    limited_by,
    model_context,
    type_context,
    watch_reach,
)
from posenc.hf.layers import LAYER_THETA_MODEL_TYPES
from posenc.hf.rope_float32 import keep_rope_float32
from posenc.hf.rotary import rotary_config_from_hf, rotary_config_to_hf
from posenc.hf.setup import positional_setup
from posenc.scalings import (
    DynamicNTKScaling,
    LinearScaling,
    Llama3Scaling,
    LongRoPEScaling,
    NTKScaling,
    ProportionalScaling,
    RopeScaling,
    YaRNScaling,
)

# rope types whose HF parameters carry original_max_position_embeddings.
_WITH_ORIGINAL = ("llama3", "yarn", "longrope")
_MODULE_STATE = frozenset(vars(torch.nn.Module()))
#: posenc's config class of each frequency method's ``rope_type``.
_SCALINGS: dict[str, type[RopeScaling]] = {
    cls.rope_type: cls
    for cls in (LinearScaling, NTKScaling, DynamicNTKScaling, YaRNScaling, Llama3Scaling, LongRoPEScaling)
}


def _scaling(method: str, factor: float, original: int, rotary_dim: int, options: dict[str, Any]) -> RopeScaling:
    """posenc's scaling config for ``method`` (``posenc.extension_methods``; validated by its dataclass)."""
    if method == "longrope":
        options = dict(options)
        if options.get("long_factor") is None:
            fail("long_factor", None, f"a list of rotary_dim // 2 = {rotary_dim // 2} positive numbers for 'longrope'")
        options.setdefault("short_factor", [1.0] * (rotary_dim // 2))  # unchanged frequencies up to the original
    config = rope_scaling_config(method, factor=factor, original=original, **options)
    return _SCALINGS[config.pop("rope_type")](**config)


def ntk_base(setup: RotaryConfig, scaling: NTKScaling, base: float) -> float:
    """The base static NTK gives a RoPE of ``base`` (``rotary_config_to_hf``'s ``base * factor ** (d / (d - 2))``)."""
    exported = rotary_config_to_hf(dataclasses.replace(setup, base=float(base), scaling=scaling))
    return float(exported["rope_parameters"]["rope_theta"])


def default_original(config: Any, layer_type: str | None, context: int | None = None) -> int:
    """The pretraining length: the scaling's own ``original_max_position_embeddings`` if it has one, else the
    context the layer type carries (``context``; default ``max_position_embeddings``)."""
    params = config.rope_parameters if layer_type is None else config.rope_parameters[layer_type]
    if params.get("rope_type") in _WITH_ORIGINAL and params.get("original_max_position_embeddings"):
        return int(params["original_max_position_embeddings"])
    return int(config.max_position_embeddings) if context is None else context


def _layer_params(config: Any, layer_type: str | None, model: torch.nn.Module) -> Mapping[str, Any]:
    params = config.rope_parameters
    if not isinstance(params, Mapping) or not params:
        fail("model", architecture(model), "a model whose config has rope_parameters")
    nested = sorted(k for k, v in params.items() if isinstance(v, Mapping))
    if nested:
        if layer_type not in nested:
            fail("layer_type", layer_type, f"one of {nested} (this config has per-layer-type rope_parameters)")
        return params[layer_type]
    if layer_type is not None:
        if config.model_type in LAYER_THETA_MODEL_TYPES:
            fail("layer_type", layer_type, f"None: {architecture(model)} has one rope_parameters for every RoPE "
                 "layer (layer_rope_theta gives each layer only its base, 0 for NoPE), so transformers has no config "
                 "that scales one layer type alone; the scaling reaches every RoPE layer at its own base")
        fail("layer_type", layer_type, "None: this config has one rope_parameters for every layer")
    return params


def _adopt(module: torch.nn.Module, fresh: torch.nn.Module) -> None:
    """Give ``module`` the state of ``fresh`` (same class), keeping its device, hooks and place in the model."""
    device = next(iter(module.buffers())).device
    fresh_state = {k: v for k, v in vars(fresh).items() if k not in _MODULE_STATE}
    for name in [k for k in vars(module) if k not in _MODULE_STATE and k not in fresh_state]:
        if not name.startswith("_") and name != "forward":  # stale caches such as LongRoPE's long_inv_freq
            delattr(module, name)
    for name in [b for b in module._buffers if b not in fresh._buffers]:
        del module._buffers[name]
    for name, buf in fresh._buffers.items():
        persistent = name not in fresh._non_persistent_buffers_set
        module.register_buffer(name, None if buf is None else buf.to(device), persistent=persistent)
    for name, value in fresh_state.items():
        setattr(module, name, value)


def extend_rope(
    model: torch.nn.Module,
    *,
    method: str,
    factor: float,
    original: int | None,
    target: int | None,
    layer_type: str | None,
    options: dict[str, Any],
    replace: bool = False,
) -> dict[str, Any]:
    """Apply ``method`` to a loaded transformers RoPE model in place; see ``posenc.hf.extend_context``."""
    config: Any = model.config  # a transformers PretrainedConfig
    modules = rotary_modules(model)
    if not modules:
        fail("model", architecture(model), "a model with rotary embedding modules (none holds an inv_freq buffer)")
    thetas = [module_theta(config, m) for _, m in modules]  # Granite-SWA: a module per layer base, from a copy
    for (name, m), theta in zip(modules, thetas, strict=True):
        if (theta is None and getattr(m, "config", None) is not config) or not hasattr(m, "rope_type"):
            fail(
                "model",
                architecture(model),
                f"a model whose rotary modules are transformers' *RotaryEmbedding built from model.config "
                f"({name!r}, a {type(m).__name__}, is not)",
            )
    old_params = _layer_params(config, layer_type, model)
    old_setup = rotary_config_from_hf(config, layer_type=layer_type)
    old_report = positional_setup(config) if config.model_type in LAYER_THETA_MODEL_TYPES else old_setup
    contexts = layer_contexts(model)  # per layer type (Gemma 3/4, MiMo): what each type's RoPE carries now
    current = type_context(model, layer_type)
    plan = plan_extension(
        old_setup.scaling,
        method=method,
        factor=factor,
        original=original,
        target=target,
        current=current,
        default_original=default_original(config, layer_type, current),
        rotary_dim=old_setup.rotary_dim,
        options=options,
        replace=replace,
        model=architecture(model),
    )
    scaling, original = plan.scaling, plan.original
    exported = rotary_config_to_hf(dataclasses.replace(old_setup, scaling=scaling))
    new_params = exported["rope_parameters"]
    if "partial_rotary_factor" in old_params:  # Phi-3 and GPT-NeoX configs read it unconditionally
        new_params.setdefault("partial_rotary_factor", old_params["partial_rotary_factor"])
    if config.model_type in DEFAULT_PARTIAL_ROTARY:  # MiMo: its default RoPE and its scalings read other defaults
        new_params.setdefault("partial_rotary_factor", old_setup.partial_rotary_factor)
    new_max = exported.get("max_position_embeddings", plan.target)  # dynamic NTK: its threshold, the original length
    new_contexts = None
    if contexts is not None:  # per layer type: the model claims no more than its least-reaching layers carry
        new_contexts = {**contexts, cast(str, layer_type): math.inf if method == "dynamic" else plan.target}
        new_max = model_context(config, new_contexts, layer_type, new_max, plan.target)

    updates: dict[str, Any] = {"max_position_embeddings": new_max}
    if layer_type is None:
        updates["rope_parameters"] = new_params
    else:
        updates["rope_parameters"] = {**config.rope_parameters, layer_type: new_params}
    if hasattr(config, "original_max_position_embeddings") and new_params["rope_type"] in _WITH_ORIGINAL:
        updates["original_max_position_embeddings"] = original  # Phi-3: transformers prefers the top-level key
    new_thetas = {t: t for t in thetas if t is not None}
    if config.model_type in LAYER_THETA_MODEL_TYPES and isinstance(scaling, NTKScaling):
        # Static NTK is a new base, and Granite-SWA's layers each have their own: every non-zero base grows by it.
        grown = [ntk_base(old_setup, scaling, t) if t else t for t in config.layer_rope_theta]
        new_thetas = {t: ntk_base(old_setup, scaling, t) for t in new_thetas}
        updates["layer_rope_theta"] = grown
    old_values = {k: copy.deepcopy(getattr(config, k)) for k in updates}

    trial = copy.deepcopy(config)
    for key, value in copy.deepcopy(updates).items():
        setattr(trial, key, value)
    try:
        trial.validate_rope()
    except Exception as err:  # noqa: BLE001 - transformers raises assorted types; re-raised as ValueError
        fail("method", method, f"a RoPE scaling that {architecture(model)} configs accept (transformers: {err})")

    for key, value in updates.items():
        setattr(config, key, value)
    try:
        fresh = [
            type(m)(config if t is None else theta_config(config, new_thetas[t]))
            for (_, m), t in zip(modules, thetas, strict=True)
        ]
    except Exception:
        for key, value in old_values.items():
            setattr(config, key, value)
        raise
    for (_, m), new in zip(modules, fresh, strict=True):
        _adopt(m, new)
    _check_patched(model, modules, fresh)
    new_setup = rotary_config_from_hf(config, layer_type=layer_type)
    new_report = positional_setup(config) if config.model_type in LAYER_THETA_MODEL_TYPES else new_setup
    guard_cache(model, modules, new_setup)
    reach, limiting = frequency_reach(config, new_contexts)  # dynamic: no fixed reach
    description = limited_by(plan.description, layer_type, limiting, reach)
    watch_reach(modules, reach, description)
    keep_rope_float32(model)  # a bfloat16/float16 model: tables and rotation in float32, cast once after
    return {
        "architecture": config.model_type,
        "model_class": type(model).__name__,
        "method": method,
        "factor": factor,
        "layer_type": layer_type,
        "original_max_position_embeddings": original,
        "max_position_embeddings": {"old": old_values["max_position_embeddings"], "new": new_max},
        "rope_parameters": {"old": copy.deepcopy(dict(old_params)), "new": copy.deepcopy(new_params)},
        "scaling": scaling,
        "previous_scaling": old_setup.scaling,
        "rule": plan.rule,
        "description": description,
        "positional_setup": {"old": old_report, "new": new_report},
        "modules_patched": len(modules),
        "module_names": [name for name, _ in modules],
        **({} if new_contexts is None else {"layer_contexts": {k: None if math.isinf(v) else int(v)
                                                                for k, v in new_contexts.items()}}),
    }


#: Methods that compose with themselves by multiplying their factor (over the same original length).
COMPOSABLE = ("linear", "dynamic", "yarn", "llama3")


@dataclasses.dataclass(frozen=True)
class Plan:
    """What ``extend_context`` will do to a RoPE model: the scaling, its original length, the target context, and
    how it relates to the model's current scaling (``rule``: ``"new"``, ``"composed"`` or ``"replaced"``)."""

    scaling: RopeScaling
    original: int
    target: int
    rule: str
    description: str


def plan_extension(
    old: RopeScaling | None,
    *,
    method: str,
    factor: float,
    original: int | None,
    target: int | None,
    current: int,
    default_original: int,
    rotary_dim: int,
    options: dict[str, Any],
    replace: bool,
    model: str,
) -> Plan:
    """The rule for extending a model whose RoPE may already be scaled (its weights were trained with that scaling,
    or an earlier call applied it):

    - no scaling: ``method`` at ``factor`` over the original length (default: the context the model has);
    - the same method (``linear``, ``dynamic``, ``yarn``, ``llama3``; ``linear`` on p-RoPE): composed, i.e. the
      method at the total factor ``old_factor * factor`` over the scaling's own original length, its other options
      kept unless given; the context grows by ``factor``. Exact for ``linear`` (and ``ntk``, whose result is a plain
      RoPE base); for YaRN and Llama 3 it is the papers' own re-extension (YaRN's 64k -> 128k models, s = 16 -> 32
      over the same 4k);
    - anything else (another method on a scaled model, ``longrope`` on ``longrope``): refused, since it would drop
      the frequencies the model was trained with; ``replace=True`` drops them knowingly.

    A context shorter than the model's current one is refused unless asked for (``max_position_embeddings``, or an
    explicit ``original_max_position_embeddings``: "treat this model as trained at that length").
    """
    replace_note = (
        "; pass replace=True to drop it (right only when the weights were not trained with it, e.g. a zero-shot "
        "scaling applied earlier)"
    )
    scaling: RopeScaling
    if old is None or replace:
        explicit = original is not None
        if original is None:
            original = default_original
        if target is None:
            target = lengthen(original, factor)
            if method != "dynamic" and target < current and not explicit:
                fail(
                    "factor",
                    factor,
                    f"a factor that reaches at least the model's context of {current} tokens: {method} x{factor:g} "
                    f"over original_max_position_embeddings={original} covers only {target} (pass a larger factor, "
                    "or max_position_embeddings or original_max_position_embeddings to shorten it on purpose)",
                )
        elif original > target:
            fail("original_max_position_embeddings", original, f"<= the target max_position_embeddings={target}")
        if isinstance(old, ProportionalScaling):
            if method != "linear":
                fail(
                    "method",
                    method,
                    f"'linear' for {model}, whose rope_parameters are p-RoPE ('proportional'): its rotating pairs are "
                    "interpolated by the scaling's own factor; other methods have no HF form there",
                )
            scaling = dataclasses.replace(old, factor=factor)
        else:
            scaling = _scaling(method, factor, original, rotary_dim, options)
        rule = "new" if old is None else "replaced"
        dropped = "" if old is None else f", replacing {_describe(old)}"
        return Plan(scaling, original, target, rule, f"{method} x{factor:g} over {original}{dropped}")
    proportional = isinstance(old, ProportionalScaling) and method == "linear"
    if not proportional and (old.rope_type != method or method not in COMPOSABLE):
        why = (
            "LongRoPE's factors are searched for one target length, so they do not compose"
            if method == old.rope_type
            else f"{method} would replace the {old.rope_type} frequencies the model runs with"
        )
        own = "linear" if isinstance(old, ProportionalScaling) else old.rope_type
        allowed = f"'{own}', which composes with it" if own in (*COMPOSABLE, "linear") and own != method else "none"
        if isinstance(old, ProportionalScaling):  # one rope_type per config: p-RoPE has no HF form but its own
            why, replace_note = "p-RoPE carries only its own linear factor in a transformers config", ""
        fail("method", method, f"{allowed}: {model}'s RoPE is already {_describe(old)}, and {why}{replace_note}")
    old_factor, old_original = _factor_of(old) or 1.0, _original_of(old)
    if original is not None and old_original is not None and original != old_original:
        fail(
            "original_max_position_embeddings",
            original,
            f"None or {old_original}: {model}'s {old.rope_type} scaling already fixes its original length"
            f"{replace_note}",
        )
    total = old_factor * factor
    # YaRN's max_position_embeddings would otherwise derive a factor of its own; linear takes no options.
    extra = {"max_position_embeddings": None} if method == "yarn" else {}
    scaling = dataclasses.replace(old, factor=total, **extra, **options)  # type: ignore[call-arg]  # COMPOSABLE: all have factor
    if target is None:
        target = lengthen(current, factor)
    original = old_original if old_original is not None else current
    description = f"{_describe(old)} then x{factor:g} = {method} x{total:g}"
    return Plan(scaling, original, target, "composed", description)


def _factor_of(scaling: RopeScaling) -> float | None:
    """The scaling's factor (YaRN/LongRoPE: derived where only lengths are given); None if it has none."""
    return getattr(scaling, "effective_factor", None) or getattr(scaling, "factor", None)


def _original_of(scaling: RopeScaling) -> int | None:
    """The length the scaling starts from: its original length (dynamic NTK: its threshold); None if it has none."""
    return getattr(scaling, "original_max_position_embeddings", None) or getattr(
        scaling, "max_position_embeddings", None
    )


def _describe(scaling: RopeScaling) -> str:
    factor, original = _factor_of(scaling), _original_of(scaling)
    text = scaling.rope_type + ("" if factor is None else f" x{factor:g}")
    return text + ("" if original is None else f" over {original}")


def _check_patched(model: torch.nn.Module, modules: list, fresh: list) -> None:
    """Every rotary module now holds its fresh state; none was missed. Never leave a model silently unpatched."""
    patched = {id(m) for _, m in modules}
    for name, m in rotary_modules(model):
        if id(m) not in patched:
            raise RuntimeError(f"posenc.hf.extend_context left {name!r} of {architecture(model)} unpatched")
    for (name, m), new in zip(modules, fresh, strict=True):
        same = m.rope_type == new.rope_type and all(
            b is None or torch.equal(b.cpu(), new._buffers[k].cpu()) for k, b in m._buffers.items()
        )
        if not same:
            raise RuntimeError(f"posenc.hf.extend_context failed to patch {name!r} of {architecture(model)}")


def lengthen(original: int, factor: float) -> int:
    """``ceil(original * factor)``, without a spurious extra position from float rounding."""
    target = original * factor
    return int(round(target)) if abs(target - round(target)) < 1e-9 * target else int(-(-target // 1))
