"""``extend_context``: run a loaded transformers model at a longer context than it was trained for.

RoPE models (Llama, Mistral, Qwen2/3, Phi-3, GPT-NeoX, Gemma 1/2/3/4, Granite-SWA, MiMo-V2-Flash) take any of posenc's
scalings: ``linear`` (Position Interpolation, Chen et al. 2023), ``ntk`` (static NTK-aware), ``dynamic`` (dynamic
NTK), ``yarn`` (Peng et al. 2023), ``longrope`` (Ding et al. 2024) and ``llama3`` (Meta 2024); see
``posenc.hf._rope_patch``. A
model whose RoPE is p-RoPE (``rope_type: "proportional"``, e.g. Gemma 4's full-attention layers) takes ``linear``
only, applied to its rotating pairs.
The remapping methods ``self_extend`` (Jin et al. 2024), ``dca`` and ``dca_vllm`` (Dual Chunk Attention, An et al.
2024, as ChunkLlama runs it and as vLLM serves it), ``rerope``
and ``leaky_rerope`` (Su 2023), ``lm_infinite`` (Han et al. 2024), ``string`` (An et al. 2025; also at factor 1, the
training length) and ``streaming_llm`` (Xiao et al. 2024) keep the frequencies and change which positions each
(query, key) pair is rotated at; see ``posenc.remapping`` and ``posenc.hf._remap_patch``.
``drope`` (DroPE, Gelberg et al. 2025) drops RoPE from every layer, as the authors' code does; see
``posenc.hf._drope_patch``.
ALiBi models (BLOOM, MPT) take ``linear``, which for ALiBi is slope interpolation (Al-Khateeb et al. 2023); see
``posenc.hf._alibi_patch``. transformers is imported only when a model is patched.
"""

from __future__ import annotations

from typing import Any

import torch

from posenc._checks import check_choice, check_number, check_positive_int, fail
from posenc.hf import _record
from posenc.hf._common import architecture, model_type
from posenc.hf._methods import DROP_METHODS, FREQUENCY_METHODS
from posenc.hf.alibi import ALIBI_MODEL_TYPES
from posenc.hf.setup import check_model_type
from posenc.remapping import METHODS as REMAPPING

#: Frequency methods: new RoPE frequencies, in the config (``rope_parameters``).
#: Remapping methods (``posenc.remapping``): the same frequencies, other positions per (query, key) pair.
REMAP_METHODS = tuple(REMAPPING)
#: DroPE: no RoPE at all, in every layer; it has no factor.
METHODS = (*FREQUENCY_METHODS, *REMAP_METHODS, *DROP_METHODS)
#: Joins a composed method, ``FREQUENCY+REMAP`` (``"yarn+string"``; ``posenc.deploy.methods``).
COMPOSE = "+"
#: The keyword options each method accepts (frequency methods: names and defaults as in Hugging Face
#: ``rope_parameters``; remapping methods: the parameters ``posenc.remapping.remap_method`` derives, to override).
METHOD_OPTIONS: dict[str, tuple[str, ...]] = {
    "linear": (),
    "ntk": (),
    "dynamic": (),
    "yarn": ("beta_fast", "beta_slow", "mscale", "mscale_all_dim", "attention_factor", "truncate"),
    "longrope": ("long_factor", "short_factor", "attention_factor"),
    "llama3": ("low_freq_factor", "high_freq_factor"),
    **{name: options for name, (_, options) in REMAPPING.items()},
    "drope": ("softmax_scale",),
}


#: The one rule for a context factor, in the library and on the command line: the context grows by it. At 1 every
#: method but STRING (which remaps distances within the original context) is the model as it is: the library takes
#: that (the identity); a study or an export refuses it, since it would measure or write the unpatched model under a
#: method's name. DroPE has none (``DROPE_FACTOR_RULE``).
FACTOR_RULE = "a number >= 1 (the context grows by it; 1 keeps the original context)"
#: DroPE removes RoPE: no factor scales it and no context length follows from one (a NoPE model has no positions
#: to run out of), so the factor is left out (None) or 1, the only value that means nothing.
DROPE_FACTOR_RULE = (
    "None (or 1) for 'drope': it drops RoPE from every layer, which no factor scales, and sets no context length "
    "(a NoPE model has no positions to run out of)"
)


def check_factor(factor: object, method: str | None = None, *, name: str = "factor", as_model: bool = False) -> float:
    """``factor`` by ``FACTOR_RULE``; with ``as_model`` (a study measures, an export writes the patched model), a
    factor of 1 only for a method that changes the model at 1 (``posenc.remapping.WITHIN_TRAINING``: STRING).

    Raises:
        ValueError: naming ``name``, the factor and the rule.
    """
    from posenc.remapping import WITHIN_TRAINING

    value = check_number(name, factor, minimum=1.0)
    if as_model and value == 1 and method not in WITHIN_TRAINING:
        which = f"for {method}: at 1 it is" if method else "(at 1 every method but STRING is"
        fail(name, factor, f"a factor > 1 {which} the unpatched model, measured or written under a method's name"
             f"{'' if method else ')'}; only {', '.join(WITHIN_TRAINING)} changes the model at 1 (it remaps "
             "within the original context)")
    return value


def extend_context(
    model: torch.nn.Module,
    method: str,
    factor: float | None = None,
    *,
    original_max_position_embeddings: int | None = None,
    max_position_embeddings: int | None = None,
    layer_type: str | None = None,
    replace: bool = False,
    **options: Any,
) -> dict[str, Any]:
    """Extend the context of a loaded transformers model in place; return what changed.

    RoPE models get new ``rope_parameters`` (and ``max_position_embeddings``) in ``model.config`` and every rotary
    embedding module rebuilt from it, so the model equals the one transformers builds from the new config (for
    ``ntk``, which transformers lacks: default RoPE with base ``base * factor ** (d / (d - 2))``). ALiBi models get
    every slope multiplied by ``1 / factor``.

    A model that is already scaled (trained with a scaling, like Llama 3.1 or Qwen2.5-1M, or extended by an earlier
    call) follows one rule for every method and every call: the same method composes -- its total factor is the
    product, over the scaling's own original length, and the context grows by ``factor`` (``linear``, ``dynamic``,
    ``yarn``, ``llama3``; ``linear`` on p-RoPE; ALiBi's slope interpolation; ``ntk`` needs nothing, its result is
    a plain RoPE base) -- and anything else is refused, because it would drop the frequencies the model runs with
    (``replace=True`` drops them on purpose). A result shorter than the current context is refused unless asked
    for (``max_position_embeddings``, or an explicit ``original_max_position_embeddings``). The returned ``rule``
    and ``description`` say which case applied.

    What persists: a RoPE model's scaling is in its config, and each call is recorded on the model and in its config
    (key ``"posenc"``), so every save of the config writes both -- ``posenc.hf.save_pretrained``, the model's own
    ``save_pretrained`` or ``push_to_hub``, a Trainer checkpoint -- and ``posenc.hf.load_causal_lm`` rebuilds the
    same model from that folder: the config's frequencies, and from the record what the config does not carry (a
    remapping method ``posenc.hf.save_pretrained`` could write, the cached-key re-rotation of ``dynamic`` and
    ``longrope``, RoPE in float32 in a half-precision model). A patched bfloat16 or float16 RoPE model keeps its
    cos/sin tables and the q/k rotation in float32, cast once after the rotation (``posenc.hf.keep_rope_float32``;
    transformers casts the tables to the model's dtype). Plain transformers (``from_pretrained``) reads the
    frequencies alone: in float32 it is the same model for every frequency method but ``dynamic``/``longrope``
    decoded with a KV cache (its cached keys keep the frequencies they were written with), and in half precision its
    tables are rounded to the model's dtype. What no config key records is refused by both saves, each naming
    the calls that rebuild the model: remapping methods (``dca_vllm`` on Qwen2/Qwen3 aside, below), DroPE (the model's
    own save; ``posenc.hf.save_pretrained`` records it) and ALiBi's slope interpolation (a forward pre-hook on each
    block).

    ``dynamic`` and ``longrope`` change their frequencies with the length, while transformers' KV cache keeps keys
    rotated with the frequencies of the step that wrote them. The patched model hands the attention the cached keys
    re-rotated to each call's frequencies (a ``DynamicCache``, generate's default; a static or quantized cache is
    refused once the frequencies change), and for ``longrope`` ``generate`` re-encodes the sequence once when it
    passes ``original_max_position_embeddings``, as Phi-3's own generation does, so cached generation equals the
    no-cache forward. For ``dynamic`` that holds only where the first scaled attention layer is the model's last:
    deeper layers cache keys and values computed from hidden states of earlier lengths, which no cache can
    recompute, so cached decoding follows dynamic scaling with a KV cache as YaRN (section 3.3) describes it and
    warns (``posenc.hf.CacheStaleWarning``); ``use_cache=False`` gives the full forward. The same holds under a
    remapping method for ``dynamic`` (and ``longrope`` decoded by hand, without ``generate``'s re-encoding) and for
    DCA's logit factor: the first cached call at a length that changes a cached token's frequencies or factor warns,
    on a model with more than one layer. The warning is once per cache: every ``generate`` (or hand-made cache) that
    goes stale warns once, whatever ran on the model before (Python's warning filters decide what is shown again).

    How far the patched model reaches: a remapping method ``method.reach(original)`` tokens (the ``description``
    says it; DCA, ReRoPE, LM-Infinite and StreamingLLM have no limit), a frequency method the context it extends to
    (the new ``max_position_embeddings``; ``dynamic`` has no limit, it rescales with the length). The last call sets
    it (YaRN x2 then Self-Extend x2: Self-Extend's, over the YaRN model's context). A sequence longer than that
    (largest position + 1; a prefill, or the step of ``generate`` that passes it) warns once per model
    (``posenc.hf.ReachExceededWarning``): the model then attends over distances it never saw, as an unpatched model
    past its ``max_position_embeddings``; ``posenc.hf.load_causal_lm`` gives a folder ``posenc.hf.save_pretrained``
    wrote the same warning. With ``layer_type`` the model reaches as far as its least-reaching layers: each layer type
    carries its own context (the one a call extended it to, else the model's as loaded; ``dynamic``: no limit), a
    sliding-window layer whose window fits in it has no limit, and ``max_position_embeddings`` is set to that reach,
    never more (Gemma 3 ``linear`` x2 on ``"sliding_attention"`` alone keeps it at the full layers' trained length;
    a ``dynamic`` layer type keeps it as its threshold). ALiBi's slope interpolation does not warn.

    Args:
        model: a transformers model (e.g. ``LlamaForCausalLM``) of a type in ``supported_model_types()``.
        method: one of ``METHODS``, or ``FREQUENCY+REMAP`` (``"yarn+string"``: the frequency method at ``factor``,
            then the remapping method within the stretched context at 1, as two calls would, both on ``layer_type``
            if given; no options); ALiBi models take ``"linear"`` only (slope interpolation). A remapping method
            (``REMAP_METHODS``) patches the rotary modules to the identity and the attention to
            ``posenc.remapping.remap_attention`` with the model's own RoPE (scaling included), for the
            architectures in ``posenc.hf._remap_patch.REMAP_MODEL_TYPES``, and on one layer type (``layer_type``,
            required: ``"full_attention"``) for Gemma 3 (``LAYER_TYPE_REMAP_MODEL_TYPES``), whose sliding layers
            keep their RoPE, window and SDPA attention; ``factor`` gives the target length
            ``ceil(original * factor)`` its parameters are derived for (``posenc.remapping.remap_method``). It is
            a run-time patch: ``posenc.hf.save_pretrained`` writes ``dca_vllm`` on Qwen2/Qwen3 as
            ``dual_chunk_attention_config`` (what vLLM reads for Qwen2/Qwen3, SGLang for Qwen2) and refuses the others;
            the model's own ``save_pretrained`` and ``set_attn_implementation`` are refused, on the model and on the
            model inside it (``model.model``, ``get_decoder()``), and a forward after the config's attention
            implementation was changed by hand raises (every attention but posenc's would run without positions). A
            frequency method
            works with every attention implementation. One remapping method per model, after
            any frequency method; its original length is the model's current context (``max_position_embeddings``),
            so the context grows by ``factor`` again. ``"drope"`` (DroPE, Gelberg et al. 2025) drops RoPE from every
            layer as the authors' code does (the rotary modules return ``cos = 1``, ``sin = 0``, so q and k reach
            any attention implementation and the KV cache un-rotated; option ``softmax_scale``, their
            ``config.softmax_scale``); it takes no factor, lengths, ``layer_type`` or ``replace``, keeps
            ``max_position_embeddings`` and leaves no reach to warn about; no method may follow it. It is a
            run-time patch: ``posenc.hf.save_pretrained`` records it for ``posenc.hf.load_causal_lm`` (and warns,
            ``PosencOnlyWarning``: nothing else reads that record), the model's own ``save_pretrained`` and
            ``save_gguf`` refuse it. The model is meant to be recalibrated (fine-tuned at its original context)
            before it is used: RoPE-trained weights run without RoPE are not the authors' DroPE model yet.
        factor: the extension factor, ``>= 1`` (required but for ``drope``). For ``dynamic`` it is the NTK growth
            rate past the original length. ``string`` takes 1 (the training length, where its paper runs it) and
            reaches at most ``2 - W / L``. ``drope`` takes none (None, or 1): see ``DROPE_FACTOR_RULE``.
        original_max_position_embeddings: the pretraining length. Defaults to the config's: the current scaling's
            ``original_max_position_embeddings`` if it has one, else ``max_position_embeddings`` (MPT:
            ``max_seq_len``; BLOOM has none, which only leaves the target length unset).
        max_position_embeddings: the new context length written to the config (MPT: ``max_seq_len``); defaults to
            ``ceil(original * factor)``. ``dynamic`` keeps the original length there, as transformers expects.
        layer_type: for per-layer-type ``rope_parameters`` (Gemma 3, Gemma 4, MiMo-V2-Flash: each type keeps its
            base and partial rotary), the layer type to extend, from the context it carries (its original length and
            ``factor`` apply to that type's context, not to the model's); the other types are left as they are.
            A remapping method takes it on Gemma 3 (required there; ``"full_attention"`` only: a sliding layer sees
            at most ``sliding_window`` tokens back, nothing to remap).
            Granite-SWA has one ``rope_parameters`` for all its RoPE layers, each at its own base
            (``layer_rope_theta``; 0: NoPE): the scaling reaches every RoPE layer (static NTK grows every base), its
            NoPE layers stay without positions, and ``layer_type`` is refused (no transformers config scales one
            layer type alone there).
        replace: drop the model's current scaling and apply ``method`` over its original length, instead of the
            rule above (composing the same method, refusing another).
        **options: the method's own keys, ``METHOD_OPTIONS[method]``: YaRN's ``beta_fast``, ``beta_slow``,
            ``mscale``, ``mscale_all_dim``, ``attention_factor``, ``truncate``; LongRoPE's ``long_factor``
            (required), ``short_factor`` (default all ones) and ``attention_factor``; Llama 3's
            ``low_freq_factor`` (default 1) and ``high_freq_factor`` (default 4); remapping methods their parameters
            (``self_extend``: ``window``, ``group``; ``dca``: ``chunk_size``, ``local_window``, ``mscale``;
            ``dca_vllm``: ``chunk_size``, ``local_window``; ``rerope``:
            ``window``, ``log_scale``; ``leaky_rerope``: also ``leak``; ``lm_infinite``: ``window``,
            ``global_tokens``; ``string``: ``shifted_offset``, ``local_window``, ``mscale``; ``streaming_llm``:
            ``window``, ``sinks``), each overriding the paper's rule; ``drope``: ``softmax_scale`` (every
            attention's logit scale, replacing its own).

    Returns:
        A dict: ``architecture``, ``model_class``, ``method``, ``factor``, ``original_max_position_embeddings``,
        ``max_position_embeddings`` ``{"old", "new"}``, ``modules_patched`` (count) and ``module_names``; for RoPE
        also ``layer_type``, ``scaling`` (the posenc ``RopeScaling`` applied), ``previous_scaling`` (None if there was
        none), ``rule`` (``"new"``, ``"composed"`` or ``"replaced"``), ``description``, and ``rope_parameters`` and
        ``positional_setup`` (``RotaryConfig``, as ``positional_setup`` reads the config) ``{"old", "new"}``, and for
        per-layer-type RoPE ``layer_contexts`` (each layer type's context after the call, None for no limit); for
        ALiBi ``slopes`` ``{"old", "new"}``.

    Raises:
        ValueError: an architecture that is not handled (naming ``model.config.model_type`` and the class), an
            unknown method or option, ``factor < 1``, an original length above the target, a method that would drop
            the model's current scaling (another method, ``longrope`` twice, anything but ``linear`` on p-RoPE), a
            context shorter than the current one, or a scaling the model's config class rejects; for ``drope`` a
            factor other than None or 1, any length, ``layer_type`` or ``replace``, a ``softmax_scale`` that is not
            a positive number, an ALiBi model; any method on a model DroPE patched, DroPE on a remapped one. The
            model is left unchanged.
    """
    if isinstance(method, str) and COMPOSE in method:
        return _compose(model, method, factor, original_max_position_embeddings, max_position_embeddings, layer_type,
                        replace, options)
    description = _extend(
        model, method, factor, original=original_max_position_embeddings, target=max_position_embeddings,
        layer_type=layer_type, replace=replace, options=options,
    )
    arguments = {
        "original_max_position_embeddings": original_max_position_embeddings,
        "max_position_embeddings": max_position_embeddings,
        "layer_type": layer_type,
        "replace": replace,
    }
    recorded = 1.0 if factor is None else factor  # DroPE: no factor, recorded as the 1 that changes nothing
    _record.add(model, _record.entry(method, recorded, arguments, options, description))
    return description


def _compose(
    model: torch.nn.Module, method: str, factor: float | None, original: int | None, target: int | None,
    layer_type: str | None, replace: bool, options: dict[str, Any],
) -> dict[str, Any]:
    """``FREQUENCY+REMAP`` (``"yarn+string"``): the frequency method at ``factor`` (with the lengths and
    ``replace``), then the remapping method at 1 within the stretched context -- two ``extend_context`` calls, each
    recorded. Checked before either runs, so a refused name leaves the model unchanged. Returns the remapping
    call's description with the frequency call's as ``frequency``."""
    from posenc.hf._remap_patch import LAYER_TYPE_REMAP_MODEL_TYPES, REMAP_MODEL_TYPES
    from posenc.remapping import WITHIN_TRAINING

    first, _, second = method.partition(COMPOSE)
    allowed = f"one of {list(METHODS)}, or FREQUENCY+REMAP: one of {list(FREQUENCY_METHODS)}, then one of " \
              f"{list(WITHIN_TRAINING)} (a remapping method that runs within the stretched context)"
    if first not in FREQUENCY_METHODS or second not in WITHIN_TRAINING:
        fail("method", method, allowed)
    for name, value in options.items():
        fail(name, value, f"no option with the composed {method!r} (call extend_context once per part to pass one)")
    if not isinstance(model, torch.nn.Module) or getattr(model, "config", None) is None:
        fail("model", type(model).__name__, "a transformers model (a torch.nn.Module with a .config)")
    kind = model_type(model.config)
    if kind not in REMAP_MODEL_TYPES and kind not in LAYER_TYPE_REMAP_MODEL_TYPES:
        fail("method", method, f"a method of {architecture(model)}: {second} remaps the attention of "
             f"{list(REMAP_MODEL_TYPES)} (and of {list(LAYER_TYPE_REMAP_MODEL_TYPES)} on one layer type) only")
    if kind in LAYER_TYPE_REMAP_MODEL_TYPES:
        from posenc.hf._remap_patch import check_remappable

        check_remappable(model, layer_type)  # before the frequency method changes anything
    elif layer_type is not None:
        fail("layer_type", layer_type, f"None for {method!r} on {architecture(model)} (one RoPE for every layer)")
    frequency = extend_context(model, first, factor, original_max_position_embeddings=original,
                               max_position_embeddings=target, layer_type=layer_type, replace=replace)
    description = dict(extend_context(model, second, 1.0, layer_type=layer_type))
    description["frequency"] = frequency
    return description


def _extend(
    model: torch.nn.Module,
    method: str,
    factor: float | None,
    *,
    original: int | None,
    target: int | None,
    layer_type: str | None,
    replace: bool,
    options: dict[str, Any],
) -> dict[str, Any]:
    """``extend_context`` without the record."""
    max_position_embeddings = target
    if not isinstance(model, torch.nn.Module) or getattr(model, "config", None) is None:
        fail("model", type(model).__name__, "a transformers model (a torch.nn.Module with a .config)")
    kind = check_model_type(model_type(model.config), where=f"model.config.model_type of {type(model).__name__}")
    check_choice("method", method, METHODS)
    scale = 1.0  # the factor, checked
    if method in DROP_METHODS:
        if factor is not None and (isinstance(factor, bool) or factor != 1):
            fail("factor", factor, DROPE_FACTOR_RULE)
    elif factor is None:
        fail("factor", factor, f"{FACTOR_RULE} for {method!r}")
    else:
        scale = check_factor(factor)
    allowed = METHOD_OPTIONS[method]
    for name, value in options.items():
        if name not in allowed:
            fail(name, value, f"one of the options {list(allowed)} of method {method!r} (or no option)")
    if original is not None:
        check_positive_int("original_max_position_embeddings", original)
    if max_position_embeddings is not None:
        check_positive_int("max_position_embeddings", max_position_embeddings)
        if method == "dynamic":
            fail("max_position_embeddings", max_position_embeddings, "None for 'dynamic' (it has no fixed target)")

    if not isinstance(replace, bool):
        fail("replace", replace, "True or False")
    remapped = getattr(model, "_posenc_remap", None)
    if remapped is not None:
        fail(
            "model",
            f"{architecture(model)} patched with {remapped.method.name}",
            "a model without a remapping method: apply frequency methods first (yarn, then self_extend), and one "
            "remapping method per model (DroPE on a model as loaded)",
        )
    if model.__dict__.get("_posenc_drope") is not None:
        fail(
            "model",
            f"{architecture(model)} patched with DroPE",
            "a model that still has RoPE: DroPE removed it from every layer, so no method can scale or remap it "
            "(load the model again)",
        )
    if method in DROP_METHODS:
        for name, value, default in (
            ("original_max_position_embeddings", original, None),
            ("max_position_embeddings", max_position_embeddings, None),
            ("layer_type", layer_type, None),
            ("replace", replace, False),
        ):
            if value is not default:
                fail(name, value, f"{default} for 'drope': it drops RoPE in every layer and sets no context length")
        from posenc.hf._drope_patch import apply_drope

        return apply_drope(model, **options)
    if method in REMAP_METHODS:
        if kind in ALIBI_MODEL_TYPES:
            fail(
                "method", method, f"a frequency method: {architecture(model)} is ALiBi, which has no positions to remap"
            )
        if replace:
            fail("replace", replace, f"False for {method!r} (it keeps the frequencies the model has)")
        from posenc.hf._remap_patch import extend_remap

        return extend_remap(model, method, scale, original=original, target=max_position_embeddings, options=options,
                            layer_type=layer_type)
    if kind in ALIBI_MODEL_TYPES:
        if method != "linear":
            fail("method", method, f"'linear' (slope interpolation) for the ALiBi model {architecture(model)}")
        if layer_type is not None:
            fail("layer_type", layer_type, f"None for the ALiBi model {architecture(model)}")
        from posenc.hf._alibi_patch import extend_alibi

        return extend_alibi(model, factor=scale, original=original, target=max_position_embeddings, replace=replace)

    from posenc.hf._rope_patch import extend_rope

    return extend_rope(
        model,
        method=method,
        factor=scale,
        original=original,
        target=max_position_embeddings,
        layer_type=layer_type,
        options=options,
        replace=replace,
    )
