"""A method name parsed once (``Method``, ``parse``), and the methods ``posenc export`` writes.

Nothing here imports torch at module level: the command line refuses a misspelt ``--method``
(``check_export_method``) before torch is imported. A composed name, ``FREQUENCY+REMAP`` (``yarn+string``), is a
frequency method that stretches the context ``factor`` times, then a remapping method that runs within a model's
context (``posenc.remapping.WITHIN_TRAINING``: STRING) remapping distances inside the stretched one, as STRING's paper
(An et al. 2025) runs it on Llama 3.1, whose RoPE is itself scaled.
"""

from __future__ import annotations

from dataclasses import dataclass

from posenc._fail import fail

#: Separates the two parts of a composed method name.
SEP = "+"

#: What export writes from a factor alone: the frequency methods a saved config runs as posenc measures them
#: (``dynamic`` to a folder only; a ``.gguf`` file takes linear, ntk, yarn, llama3) and ``dca_vllm`` (vLLM's and
#: SGLang's Dual Chunk Attention, a Qwen2/Qwen3 folder only); each one's model and path are checked later
#: (``posenc.deploy.formats.check_save``).
EXPORT_METHODS = ("yarn", "linear", "ntk", "llama3", "dynamic", "dca_vllm")

#: ``posenc.hf.extend.METHODS``, mirrored here (no torch; tests/test_cli_startup.py checks it): every method name.
KNOWN_METHODS = (
    "linear", "ntk", "dynamic", "yarn", "longrope", "llama3", "self_extend", "dca", "dca_vllm", "rerope",
    "leaky_rerope", "lm_infinite", "string", "streaming_llm", "drope",
)

#: Methods posenc extend measures that export refuses whatever the model, and why.
REFUSED = {
    "none": "an extension method: export writes an extended model (the source itself is the unextended one)",
    "drope": "a method export can make from a factor alone: DroPE has no factor, and RoPE-trained weights without "
    "RoPE are not a DroPE model until recalibrated (its authors fine-tune every parameter at the original context), "
    "so there is nothing to export before that fine-tune; posenc extend MODEL --methods drope --finetune-steps N "
    "--save DIR recalibrates it and writes it through posenc.hf.save_pretrained (posenc.hf.load_causal_lm loads it "
    "back as DroPE; GGUF cannot hold it)",
    "longrope": "a method export can make from a factor alone: LongRoPE's per-frequency long_factor comes from a "
    "search (no option sets it); in Python, posenc.hf.extend_context(model, 'longrope', F, long_factor=[...]) then "
    "posenc.hf.save_pretrained (or save_gguf) writes it",
}


def check_export_method(method: object) -> str:
    """``method`` unless export refuses it whatever the model: the standard ``ValueError`` naming what it accepts (a
    method it knows but never writes: why). Imports nothing (the command line calls it before torch)."""
    accepted = f"one of {list(EXPORT_METHODS)}"
    if not isinstance(method, str) or not method:
        fail("method", method, accepted)
    if "," in method:
        fail("method", method, "one method: export writes one model (posenc extend measures several)")
    for part in method.split(SEP):
        if part in REFUSED:
            fail("method", part if SEP in method else method, REFUSED[part])
    for part in method.split(SEP):
        if part not in KNOWN_METHODS:
            fail("method", part, accepted)  # the misspelt part of a composed one ('yarm' of 'yarm+string')
    return method


def parts(method: str) -> tuple[str, str | None]:
    """``("yarn", "string")`` for ``"yarn+string"``, ``("yarn", None)`` for ``"yarn"`` (not checked)."""
    first, sep, second = method.partition(SEP)
    return (first, second) if sep else (method, None)


def drops(method: str) -> bool:
    """Whether ``method`` drops RoPE instead of scaling it (``drope``, ``posenc.hf._drope_patch``): no factor, one
    model per study, recalibrated at the original context when fine-tuned."""
    from posenc.hf._methods import DROP_METHODS  # imports nothing heavy (posenc.hf binds its API on first use)

    return method in DROP_METHODS


@dataclass(frozen=True)
class Method:
    """A method name, parsed: ``name`` as given (``"yarn+string"``), ``first`` the method applied with the factor
    (``"yarn"``; a single method itself), ``then`` the remapping method applied within the stretched context (a
    composed name's second part, else None), and ``factor`` (None where not given).

    ``remapping`` is the remapping method in it (``then``, or ``first`` when that is one), ``frequency`` the frequency
    method in it (None for a remapping method alone and DroPE), ``drops`` whether it is DroPE."""

    name: str
    first: str
    then: str | None = None
    factor: float | None = None

    @property
    def parts(self) -> tuple[str, str | None]:
        return self.first, self.then

    @property
    def drops(self) -> bool:
        return drops(self.first)

    @property
    def remapping(self) -> str | None:
        if self.then is not None:
            return self.then
        from posenc.hf.extend import REMAP_METHODS

        return self.first if self.first in REMAP_METHODS else None

    @property
    def frequency(self) -> str | None:
        from posenc.hf._methods import FREQUENCY_METHODS

        return self.first if self.first in FREQUENCY_METHODS else None

    @property
    def label(self) -> str:
        """``yarn x2`` (``drope``: no factor), as the study's tables name the model."""
        factor = 1.0 if self.factor is None else self.factor
        return self.name if self.name in ("none", "drope") and factor == 1 else f"{self.name} x{factor:g}"


def parse(method: str, factor: float | None = None) -> Method:
    """``method`` (a name of ``posenc.hf.extend.METHODS`` or a composed ``FREQUENCY+REMAP``) as a ``Method``; a
    composed name's parts are checked: a frequency method, then a remapping method that runs within a context.

    Raises:
        ValueError: naming ``methods``, the name, and what is allowed.
    """
    first, second = parts(method)
    if second is not None:
        from posenc.hf._methods import FREQUENCY_METHODS
        from posenc.remapping import WITHIN_TRAINING

        allowed = (
            f"FREQUENCY+REMAP, e.g. 'yarn+string': one of {list(FREQUENCY_METHODS)}, then one of "
            f"{list(WITHIN_TRAINING)}"
        )
        if SEP in second:
            fail("methods", method, f"two parts at most, {allowed}")
        if first not in FREQUENCY_METHODS or second not in WITHIN_TRAINING:
            fail("methods", method, f"{allowed} (a remapping method that runs within the stretched context; the "
                 "others extend past it, and one method alone does that)")
    return Method(name=method, first=first, then=second, factor=factor)


def calls(
    method: str, factor: float, *, original: int | None = None, layer_types: tuple[str | None, ...] = (None,)
) -> str:
    """The ``posenc.hf.extend_context`` calls that make ``method`` at ``factor`` on a loaded model, with the arguments
    ``posenc.deploy.patch.apply`` passes: the original length, each layer type patched."""
    from posenc.hf._record import number

    first, second = parts(method)
    if drops(first):  # no factor, no context length, every layer
        return "posenc.hf.extend_context(model, 'drope')"
    made = []
    for layer_type in layer_types:
        extra = "" if original is None else f", original_max_position_embeddings={original}"
        extra += "" if layer_type is None else f", layer_type={layer_type!r}"
        made.append(f"posenc.hf.extend_context(model, {first!r}, {number(factor)}{extra})")
    if second is not None:
        made += [f"posenc.hf.extend_context(model, {second!r}, 1)"] * len(layer_types)
    return "; ".join(made)


def rebuild(
    model: str, method: str, factor: float, *, dtype: str = "float32", original: int | None = None,
    layer_types: tuple[str | None, ...] = (None,),
) -> str:
    """The Python that rebuilds ``model`` patched with ``method`` at ``factor``: loaded as ``posenc.deploy`` loads it
    (in ``dtype``, a name), then patched by the calls ``posenc.deploy.patch.apply`` makes (``calls``)."""
    extra = "" if dtype == "float32" else f", dtype={dtype!r}"
    made = calls(method, factor, original=original, layer_types=layer_types)
    return f"model, tokenizer = posenc.hf.load_causal_lm({model!r}{extra}); {made}"
