"""Refuse a malformed ``"posenc"`` record in a ``config.json`` (hand-edited, cut, or written by something else) with
one ``ValueError`` naming the key, its value and what is allowed, before ``posenc.hf.load_causal_lm`` re-applies it
or ``posenc check`` compares runtimes with it.

The record is what ``posenc.hf._record.config_record`` writes: ``{"version": str, "extensions": [entry, ...]}``, each
entry with ``method``, ``factor``, ``in_config`` (true exactly for a frequency method: the config carries it; false
for what loading applies again), and optionally ``arguments`` (``extend_context``'s keyword arguments),
``options``, ``original_max_position_embeddings``, ``max_position_embeddings``, ``rope_parameters`` and
``layer_contexts``. A wrong ``in_config`` is refused too: loading would apply a frequency method the config already
holds a second time, or skip a remapping method the config does not carry.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from posenc._checks import fail
from posenc.hf._methods import DROP_METHODS, FREQUENCY_METHODS
from posenc.remapping import METHODS as REMAP_METHODS

#: Keyword arguments of ``extend_context`` recorded when given (``None``/``False`` are its defaults).
ARGUMENTS = ("original_max_position_embeddings", "max_position_embeddings", "layer_type", "replace")
_METHODS = (*FREQUENCY_METHODS, *REMAP_METHODS, *DROP_METHODS)  # posenc.hf.extend.METHODS
_WHERE = "(config.json's 'posenc' record, as posenc.hf.save_pretrained writes it)"


def _positive_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def check_record(record: Any) -> list[dict[str, Any]]:
    """The record's entries, as dicts; raises on anything ``posenc.hf._record.entry`` would not have written.

    Raises:
        ValueError: naming the key (``posenc``, ``posenc.extensions``, ``posenc.extensions[i].factor``, ...), its
            value and what is allowed.
    """
    if not isinstance(record, Mapping):
        fail("posenc", record, f"a mapping with an 'extensions' list {_WHERE}")
    extensions = record.get("extensions")
    if not isinstance(extensions, list):
        fail("posenc.extensions", extensions, f"a list of the extend_context calls made {_WHERE}")
    if "version" in record and not isinstance(record["version"], str):
        fail("posenc.version", record["version"], f"the posenc version that wrote it, a string {_WHERE}")
    out = []
    for i, item in enumerate(extensions):
        name = f"posenc.extensions[{i}]"
        if not isinstance(item, Mapping):
            fail(name, item, f"a mapping with 'method', 'factor' and 'in_config' {_WHERE}")
        method = item.get("method")
        if not isinstance(method, str) or method not in _METHODS:
            fail(f"{name}.method", method, f"one of {list(_METHODS)} {_WHERE}")
        factor = item.get("factor")
        if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not 1 <= factor < math.inf:
            fail(f"{name}.factor", factor, f"a finite number >= 1, the call's factor {_WHERE}")
        # A frequency method is in the config (RoPE: with its rope_parameters recorded beside it; on ALiBi it is a
        # hook, applied again); any other method is applied again.
        frequency, in_config = method in FREQUENCY_METHODS, item.get("in_config")
        allowed = (True, False) if frequency and "rope_parameters" not in item else (frequency,)
        if not isinstance(in_config, bool) or in_config not in allowed:
            fail(f"{name}.in_config", in_config, f"{' or '.join(str(a).lower() for a in allowed)} for {method!r} "
                 f"(whether config.json carries it; loading applies the others again) {_WHERE}")
        arguments = item.get("arguments", {})
        if not isinstance(arguments, Mapping):
            fail(f"{name}.arguments", arguments, f"a mapping of extend_context's keyword arguments {_WHERE}")
        for key, value in arguments.items():
            where = f"{name}.arguments.{key}"
            if key not in ARGUMENTS:
                fail(where, value, f"one of the arguments {list(ARGUMENTS)} {_WHERE}")
            if key == "layer_type" and not isinstance(value, str):
                fail(where, value, f"a layer type, a string {_WHERE}")
            if key == "replace" and not isinstance(value, bool):
                fail(where, value, f"true or false {_WHERE}")
            if key.endswith("max_position_embeddings") and not _positive_int(value):
                fail(where, value, f"a positive integer {_WHERE}")
        options = item.get("options", {})
        if not isinstance(options, Mapping):
            fail(f"{name}.options", options, f"a mapping of the method's options {_WHERE}")
        for key in ("original_max_position_embeddings", "max_position_embeddings"):
            if item.get(key) is not None and not _positive_int(item[key]):
                fail(f"{name}.{key}", item[key], f"a positive integer or null {_WHERE}")
        if item.get("rope_parameters") is not None and not isinstance(item["rope_parameters"], Mapping):
            fail(f"{name}.rope_parameters", item["rope_parameters"], f"a mapping, the RoPE posenc measured {_WHERE}")
        contexts = item.get("layer_contexts")
        if contexts is not None and (
            not isinstance(contexts, Mapping) or not all(v is None or _positive_int(v) for v in contexts.values())
        ):
            fail(f"{name}.layer_contexts", contexts, "a mapping of layer type to a positive integer, or null for "
                 f"no limit {_WHERE}")
        out.append(dict(item))
    return out
