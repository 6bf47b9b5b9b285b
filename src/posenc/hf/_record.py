"""What ``posenc.hf.extend_context`` applied to a model: kept on the model, written into the folders
``posenc.hf.save_pretrained`` writes, and re-applied by ``posenc.hf.load_causal_lm``.

Every piece of advice posenc prints about re-applying an extension is built here from that record (``replay``,
``reapply``), so that following it literally rebuilds the model posenc measured. ``extend_context`` keeps the record
in the model's config as well, so a folder written by any save of it (posenc's or the model's own
``save_pretrained``) carries it, and ``posenc.hf.load_causal_lm`` rebuilds the measured model from either. The
record's form: ``entry``.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from typing import Any

import torch

from posenc._version import __version__
from posenc.hf._methods import DROP_METHODS, FREQUENCY_METHODS
from posenc.hf._record_check import ARGUMENTS, check_record

#: The config.json key holding the record.
CONFIG_KEY = "posenc"
_ATTR = "_posenc_extensions"
#: Keyword arguments of ``extend_context`` recorded when given (``None``/``False`` are its defaults).
_ARGUMENTS = ARGUMENTS


def _jsonable(value: Any) -> Any:
    """``value`` as config.json holds it (a tensor or array as a list); its repr where JSON has no form for it."""
    if hasattr(value, "tolist"):
        value = value.tolist()
    elif isinstance(value, tuple):
        value = list(value)
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return repr(value)
    return value


def entry(
    method: str, factor: float, arguments: Mapping[str, Any], options: Mapping[str, Any], description: Mapping
) -> dict[str, Any]:
    """One call to ``extend_context`` and what it resolved to (``description``: what it returned).

    The record is a list of JSON-able dicts, one per call (``method``, ``factor``, the arguments given, the original
    length and context it resolved to, and ``in_config``: whether a saved ``config.json`` carries it, as frequency
    methods on a RoPE model do; for those also ``rope_parameters``, exactly the parameters the extended model ran with,
    from which ``posenc.runtimes.check`` rebuilds what posenc measured). In ``config.json`` it is the ``"posenc"`` key:
    ``{"version": ..., "extensions": [...]}``.
    """
    context = description.get("max_position_embeddings")
    out = {
        "method": method,
        "factor": float(factor),
        "arguments": {k: _jsonable(v) for k, v in arguments.items() if v is not None and v is not False},
        "options": {k: _jsonable(v) for k, v in options.items()},
        "original_max_position_embeddings": description.get("original_max_position_embeddings"),
        "max_position_embeddings": context.get("new") if isinstance(context, Mapping) else None,
        "in_config": method in FREQUENCY_METHODS and "slopes" not in description,  # ALiBi: a hook, not a config key
    }
    if isinstance(description.get("layer_contexts"), Mapping):  # per layer type: the context each one carries
        out["layer_contexts"] = dict(description["layer_contexts"])
    params = description.get("rope_parameters")
    if isinstance(params, Mapping) and isinstance(params.get("new"), Mapping):  # what posenc measured, exactly
        out["rope_parameters"] = _jsonable(copy.deepcopy(dict(params["new"])))
    return out


def extensions(model: torch.nn.Module) -> list[dict[str, Any]]:
    """Every extension the model runs, in order: those its config came with (a folder posenc saved) and the calls
    made since. A model loaded by plain transformers from such a folder runs only what its config carries."""
    found = model.__dict__.get(_ATTR)
    if found is not None:
        return found
    saved = getattr(getattr(model, "config", None), CONFIG_KEY, None)
    inherited = [dict(e, loaded=True) for e in saved_extensions(saved) if e.get("in_config")]
    model.__dict__[_ATTR] = inherited
    return inherited


def saved_extensions(record: Any) -> list[dict[str, Any]]:
    """The ``extensions`` list of a config's ``"posenc"`` record (none without one); a malformed record raises a
    ``ValueError`` naming the key (``posenc.hf._record_check``)."""
    return [] if record is None else check_record(record)


def add(model: torch.nn.Module, item: dict[str, Any]) -> None:
    """Append one call's ``entry`` to the model's record, and keep the record in ``model.config`` (key
    ``CONFIG_KEY``), so that every save of the config writes it: ``posenc.hf.save_pretrained``, the model's own
    ``save_pretrained`` and ``push_to_hub``, a Trainer checkpoint."""
    extensions(model).append(item)
    keep_in_config(model)


def keep_in_config(model: torch.nn.Module) -> None:
    """``model.config``'s ``CONFIG_KEY`` set to the model's record (removed when it runs no extension)."""
    config = getattr(model, "config", None)
    if config is None:
        return
    record = config_record(model)
    if record is None:
        config.__dict__.pop(CONFIG_KEY, None)
    else:
        setattr(config, CONFIG_KEY, record)


def mark_loaded(model: torch.nn.Module, items: list[dict[str, Any]]) -> None:
    """The model's record is ``items``, all of them made by loading it (none "since it was loaded")."""
    model.__dict__[_ATTR] = [dict(e, loaded=True) for e in items]


def config_record(model: torch.nn.Module) -> dict[str, Any] | None:
    """The ``"posenc"`` block for the model's saved ``config.json``; None when it runs no extension."""
    found = [{k: v for k, v in e.items() if k != "loaded"} for e in extensions(model)]
    return {"version": __version__, "extensions": copy.deepcopy(found)} if found else None


def number(value: float) -> str:
    """``value`` as short as Python reads it back exactly: ``2`` for 2.0, ``2.3333333333333335`` in full."""
    short = f"{value:g}"
    return short if float(short) == value else repr(float(value))


def label(item: Mapping[str, Any]) -> str:
    """``"yarn x2"``: an entry's method and factor (DroPE: its name alone, it has no factor)."""
    if item["method"] in DROP_METHODS:
        return str(item["method"])
    return f"{item['method']} x{number(item['factor'])}"


def call(item: Mapping[str, Any], *, explicit: bool = False) -> str:
    """The ``extend_context`` call of one entry: as it was made, or (``explicit``) over the original length it
    resolved to, which rebuilds it on a model whose config already holds the extended context."""
    arguments = dict(item.get("arguments", {}))
    if explicit and item.get("original_max_position_embeddings") is not None:
        arguments["original_max_position_embeddings"] = item["original_max_position_embeddings"]
    text = [f"model, {item['method']!r}"]
    if item["method"] not in DROP_METHODS:  # DroPE has no factor
        text[0] += f", {number(item['factor'])}"
    text += [f"{k}={arguments[k]!r}" for k in _ARGUMENTS if k in arguments]
    text += [f"{k}={v!r}" for k, v in item.get("options", {}).items()]
    return f"posenc.hf.extend_context({', '.join(text)})"


def replay(model: torch.nn.Module) -> str:
    """The calls made on ``model`` since it was loaded, in order, separated by ``; ``.

    The same arguments on the same loaded model give the same model: advice for "save the model as loaded and re-apply
    it after loading".
    """
    made = [e for e in extensions(model) if not e.get("loaded")]
    return "; ".join(call(e) for e in made)


def not_in_config(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The entries a saved config does not carry: what loading the folder must apply again."""
    return [e for e in items if not e.get("in_config")]


def reapply(model: torch.nn.Module) -> str:
    """The calls that rebuild ``model`` on its saved folder loaded by transformers, separated by ``; ``.

    The calls that a saved folder's config does not carry (a remapping method, ALiBi's slope interpolation), with the
    original length they were applied over made explicit -- the saved config already holds the extended
    ``max_position_embeddings``, from which ``extend_context`` would otherwise derive another one.
    """
    return "; ".join(call(e, explicit=True) for e in not_in_config(extensions(model)))
