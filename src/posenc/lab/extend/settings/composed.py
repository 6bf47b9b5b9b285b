"""Composed methods, ``FREQUENCY+REMAP`` (``yarn+string``): a frequency method stretches the context ``factor``
times, then a remapping method that runs within a model's context (``posenc.remapping.WITHIN_TRAINING``: STRING)
remaps distances inside the stretched one -- as STRING's paper (An et al. 2025) runs it on Llama 3.1, whose RoPE is
itself scaled. ``posenc.hf.extend_context`` composes them (a remapping method's original length is the model's
current context); these names let one study measure the pair beside single methods.
"""

from __future__ import annotations

from posenc._checks import fail

#: Separates the two parts of a composed method name.
SEP = "+"


def parts(method: str) -> tuple[str, str | None]:
    """``("yarn", "string")`` for ``"yarn+string"``, ``("yarn", None)`` for ``"yarn"`` (not checked)."""
    first, sep, second = method.partition(SEP)
    return (first, second) if sep else (method, None)


def check(method: str) -> None:
    """A composed name's parts: a frequency method, then a remapping method that runs within a context.

    Raises:
        ValueError: naming ``methods``, the name, and what is allowed.
    """
    from posenc.hf.extend import FREQUENCY_METHODS
    from posenc.remapping import WITHIN_TRAINING

    first, second = parts(method)
    if second is None:
        return
    allowed = (
        f"FREQUENCY+REMAP, e.g. 'yarn+string': one of {list(FREQUENCY_METHODS)}, then one of {list(WITHIN_TRAINING)}"
    )
    if SEP in second:
        fail("methods", method, f"two parts at most, {allowed}")
    if first not in FREQUENCY_METHODS or second not in WITHIN_TRAINING:
        fail("methods", method, f"{allowed} (a remapping method that runs within the stretched context; the others "
             "extend past it, and one method alone does that)")  # fmt: skip


def remapping(method: str) -> str | None:
    """The remapping method in ``method`` (itself, or a composed name's second part), None for a frequency one."""
    from posenc.hf.extend import REMAP_METHODS

    first, second = parts(method)
    if second is not None:
        return second
    return first if first in REMAP_METHODS else None


def calls(
    method: str, factor: float, *, original: int | None = None, layer_types: tuple[str | None, ...] = (None,)
) -> str:
    """The ``posenc.hf.extend_context`` calls that make ``method`` at ``factor`` on a loaded model, with the arguments
    a study passes (``posenc.lab.extend.targets.hf.HFTarget``): the original length, each layer type patched."""
    from posenc.hf._record import number

    first, second = parts(method)
    if first == "drope":  # no factor, no context length, every layer
        return "posenc.hf.extend_context(model, 'drope')"
    made = []
    for layer_type in layer_types:
        extra = "" if original is None else f", original_max_position_embeddings={original}"
        extra += "" if layer_type is None else f", layer_type={layer_type!r}"
        made.append(f"posenc.hf.extend_context(model, {first!r}, {number(factor)}{extra})")
    if second is not None:
        made += [f"posenc.hf.extend_context(model, {second!r}, 1)"] * len(layer_types)
    return "; ".join(made)
