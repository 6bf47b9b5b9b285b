"""Remapping methods (Self-Extend, Dual Chunk Attention, ReRoPE, LM-Infinite, STRING, StreamingLLM) on a loaded
transformers model.

The rotation moves from the model into the attention: every ``*RotaryEmbedding`` module returns the identity, so
queries and keys reach the attention -- and the KV cache -- un-rotated, and the attention (registered with
transformers as ``"posenc_remap"``) is ``posenc.remapping.remap_attention``, each branch rotating them at its own
positions (``apply_remap``). The reference implementations patch the same two places (``LongLM``'s
``self_extend_forward`` re-rotates cached un-rotated keys each step). Positions and sequence lengths: ``_attention``;
a cache whose tokens were computed at other lengths: ``_lengths_written``; what the patch refuses:
``_refuse_switches``.

Gemma 3 (per-layer-type RoPE: sliding-window layers at base 1e4, global layers at 1e6) takes a remapping method on
one layer type, ``layer_type="full_attention"``: only that type's rotary output becomes the identity and only its
attention remaps, with that type's RoPE (its scaling included); every other layer runs transformers' SDPA attention
with its own RoPE, window and mask, as the model as loaded does (``posenc.hf.load_causal_lm`` loads it with SDPA).
The sliding layers are left alone, not remapped: a layer that sees at most ``sliding_window`` tokens back never
meets a distance its RoPE was not trained on.
"""

from __future__ import annotations

import inspect
import math
import types
import warnings
from collections.abc import Mapping
from typing import Any, cast

import torch

from posenc._checks import fail
from posenc.documents import document_lengths
from posenc.encodings.rotary import RotaryEmbedding
from posenc.hf import _cache_positions as cache_positions
from posenc.hf._cache_guard import CacheStaleWarning
from posenc.hf._common import architecture, model_type, rotary_modules
from posenc.hf._reach import frequency_reach, layer_contexts, type_context, watch_reach
from posenc.remapping import WITHIN_TRAINING, RemapMethod, remap_attention, remap_method

IMPLEMENTATION = "posenc_remap"

#: A model computing in these runs each span of the remapped attention in its own dtype, as its own attention would
#: (``remap_attention(span_dtype=...)``: products accumulated in float32, branches merged in float32); a float32 model
#: in float32.
HALF_DTYPES = (torch.bfloat16, torch.float16)
_STALE_WARNED = "_posenc_stale_warned"  # on the cache layer of the first remapped layer: CacheStaleWarning given

#: Architectures whose attention is the plain pattern the patch relies on: ``apply_rotary_pos_emb(q, k, cos, sin)``
#: from the model's rotary module, then ``ALL_ATTENTION_FUNCTIONS`` with no logit soft-capping and one RoPE for every
#: layer (each checked in ``tests/hf/test_extend_remap.py``). Gemma 2 and 4 (soft-capping; p-RoPE and shared KV) are
#: refused.
REMAP_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3", "phi3", "gpt_neox", "gemma")
#: Architectures with per-layer-type ``rope_parameters`` that take a remapping method on one layer type (its
#: ``layer_type``), the plain pattern above in every layer and no soft-capping; the other layer types keep
#: transformers' SDPA attention (``tests/hf/test_extend_remap_layer_type.py``, ``tests/hf/test_gemma3_extend.py``).
LAYER_TYPE_REMAP_MODEL_TYPES = ("gemma3_text",)
_KEPT = "_posenc_remap_kept"  # on an attention module a layer-type patch leaves alone: the model's _Remap


class _Remap:
    """What the attention of a patched model reads (a plain attribute: not a module, not in the state dict)."""

    def __init__(
        self,
        method: RemapMethod,
        encoding: RotaryEmbedding,
        *,
        original: int | None = None,
        factor: float = 1.0,
        options: Mapping[str, Any] | None = None,
        layers: tuple[int, ...] = (),
        layer_type: str | None = None,
    ) -> None:
        self.method, self.encoding, self.original, self.factor = method, encoding, original, factor
        self.options = dict(options or {})
        self.layers = layers  # the remapped attention modules' layer_idx
        self.layer_type = layer_type  # the layer type remapped (None: every layer)

    @property
    def depends_on_length(self) -> bool:
        """Whether a token's computation depends on its sequence's length (``dynamic``/``longrope`` frequencies, DCA's
        logit factor), so its hidden states do."""
        return self.encoding.depends_on_length or self.method.depends_on_length

    def same_at(self, written: torch.Tensor, now: torch.Tensor) -> bool:
        """Whether tokens computed at sequence lengths ``written`` are computed alike at ``now`` (same shape, or
        broadcastable): the same RoPE frequencies and attention factor, the same logit factor."""
        written, now = (x.reshape(-1) for x in torch.broadcast_tensors(written, now))
        moved = written != now
        if not bool(moved.any()):
            return True
        n = int(moved.sum())
        lengths, index = torch.unique(torch.cat([written[moved], now[moved]]), return_inverse=True)  # (U,), (2n,)
        parts: list[torch.Tensor] = []  # (U, ·) per distinct length
        if self.encoding.depends_on_length:
            inv_freq, factor = self.encoding._frequencies(lengths, device=lengths.device)  # (U, F), float or (U,)
            parts += [inv_freq.double(), torch.as_tensor(factor, dtype=torch.float64).expand(len(lengths))[:, None]]
        if self.method.depends_on_length:
            parts.append(cast(torch.Tensor, self.method.logit_factor(lengths))[:, None])  # depends_on_length: set
        state = torch.cat(parts, dim=1)
        return torch.equal(state[index[:n]], state[index[n:]])

    def call(self) -> str:
        """The ``extend_context`` call that applies this method again."""
        options = "".join(f", {k}={v!r}" for k, v in self.options.items())
        if self.layer_type is not None:
            options = f", layer_type={self.layer_type!r}{options}"
        return f"posenc.hf.extend_context(model, {self.method.name!r}, {self.factor:g}{options})"


def check_remappable(model: torch.nn.Module, layer_type: str | None = None) -> None:
    """Refuse, naming the architecture, a model the remapping patch cannot serve, and a ``layer_type`` it cannot
    remap alone (required, and only a type without a sliding window, for ``LAYER_TYPE_REMAP_MODEL_TYPES``; None
    elsewhere)."""
    kind = model_type(model.config)
    config: Any = model.config
    params = getattr(config, "rope_parameters", None) or {}
    nested = sorted(k for k, v in params.items() if isinstance(v, Mapping))
    if kind in LAYER_TYPE_REMAP_MODEL_TYPES:
        if getattr(config, "attn_logit_softcapping", None) is not None:
            fail("model", architecture(model), "a model without attention logit soft-capping (attn_logit_softcapping "
                 "is set; remapped attention does not cap)")
        windowed = sorted({t for t in config.layer_types if t == "sliding_attention"})
        allowed = [t for t in nested if t not in windowed]
        if layer_type not in allowed:
            why = (
                f"its {layer_type} layers see at most sliding_window={config.sliding_window} tokens back, distances "
                "their RoPE was trained on, so there is nothing to remap there; they keep their window and RoPE"
                if layer_type in windowed
                else "a remapping method on this per-layer-type model runs on one layer type (the global layers), "
                "the others keep their own RoPE and attention"
            )
            fail("layer_type", layer_type, f"one of {allowed} for {architecture(model)}: {why}")
    elif kind not in REMAP_MODEL_TYPES:
        fail(
            "model",
            architecture(model),
            f"a RoPE model of a type in {list(REMAP_MODEL_TYPES)}, or {list(LAYER_TYPE_REMAP_MODEL_TYPES)} with "
            "layer_type: remapping methods change the positions RoPE rotates by (ALiBi and NoPE models have none; "
            "Gemma 2 and 4 attention is not handled)",
        )
    else:
        if layer_type is not None:
            fail("layer_type", layer_type, f"None for {architecture(model)}: it has one RoPE for every layer, and a "
                 "remapping method applies to every layer")
        if getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True):
            fail("model", architecture(model), "a model without sliding-window attention (its config sets "
                 "sliding_window)")
        if nested:
            fail("model", architecture(model), "a model with one RoPE for every layer (not per-layer-type "
                 "rope_parameters)")
    remap = getattr(model, "_posenc_remap", None)
    if remap is not None:
        fail("method", remap.method.name, "one remapping method per model (load it again for another)")


def apply_remap(
    model: torch.nn.Module, method: RemapMethod, *, layer_type: str | None = None, **record: Any
) -> dict[str, Any]:
    """Patch ``model`` in place to run ``method``; return what changed. ``record``: how it was asked for
    (``original``, ``factor``, ``options``), for the error that names the call re-applying it.

    Every ``*RotaryEmbedding`` module returns ``cos = 1``, ``sin = 0``, so the projections' queries and keys reach the
    attention un-rotated; the ``"posenc_remap"`` attention rotates them per branch with posenc's ``RotaryEmbedding``
    built from the model's config (its scaling included: YaRN first, then Self-Extend, is a YaRN-scaled Self-Extend).
    With ``layer_type`` (Gemma 3) only that type's rotary output is the identity and only its layers remap, with that
    type's RoPE; the other layers' attention calls go to transformers' SDPA with their own cos/sin and mask.
    """
    check_remappable(model, layer_type)
    encoding = RotaryEmbedding.from_hf(model.config, layer_type=layer_type)
    rotary = rotary_modules(model)
    if not rotary:
        fail("model", architecture(model), "a model with a rotary embedding module (inv_freq buffer)")
    for name, module in rotary:  # its forward checks model.config's attention implementation at every call
        if getattr(module, "config", None) is not model.config:
            fail(
                "model",
                architecture(model),
                f"a model whose rotary modules are transformers' *RotaryEmbedding built from model.config ({name!r}, "
                f"a {type(module).__name__}, is not)",
            )
    _register()
    attention = []
    modules = []
    kept = []
    types = list(getattr(model.config, "layer_types", None) or ())
    for name, module in model.named_modules():
        if hasattr(module, "layer_idx") and any(hasattr(module, p) for p in ("q_proj", "query_key_value", "qkv_proj")):
            if layer_type is not None and types[module.layer_idx] != layer_type:
                kept.append(module)
                continue
            modules.append(module)
            attention.append(name)
    if not attention:
        fail("model", architecture(model), "a model whose attention modules transformers dispatches by layer_idx")
    remap = _Remap(method, encoding, **record, layers=tuple(sorted(m.layer_idx for m in modules)),
                   layer_type=layer_type)
    for module in modules:
        module.__dict__["_posenc_remap"] = remap
        cache_positions.watch_cache(module)
    for module in kept:
        module.__dict__[_KEPT] = remap
    for _, module in rotary:
        module.__dict__["_posenc_remap"] = remap
        _identity_rotation(module)
    _derive_positions(model)
    old = cast(Any, model.config)._attn_implementation
    cast(Any, model).set_attn_implementation(IMPLEMENTATION)  # a transformers PreTrainedModel
    _refuse_switches(model, remap)
    return {
        "architecture": architecture(model),
        "model_class": type(model).__name__,
        "method": method.name,
        "parameters": method.to_dict(),
        "rotary": encoding.config.to_dict(),
        "attn_implementation": {"old": old, "new": IMPLEMENTATION},
        "modules_patched": len(attention) + len(rotary),
        "module_names": [*attention, *(n for n, _ in rotary)],
        "layer_type": layer_type,
        "layers": list(remap.layers),
    }


def remove_remap(model: torch.nn.Module, attn_implementation: str = "sdpa") -> None:
    """Undo ``apply_remap`` on ``model`` (posenc.hf.save_pretrained does it on its copy): the rotary modules rotate
    again, the attention is ``attn_implementation``, the hooks and refusals are gone."""
    for module in model.modules():
        if module.__dict__.pop("_posenc_remap", None) is not None:
            cache_positions.unwatch_cache(module)
        module.__dict__.pop(_KEPT, None)
        if (
            module.__dict__.get("forward") is not None
            and getattr(module.forward, "__func__", None) is _identity_forward
        ):
            del module.__dict__["forward"]
        handle = module.__dict__.pop(_POSITIONS_HOOK, None)
        if handle is not None:
            handle.remove()
        for name in _REFUSALS:
            module.__dict__.pop(name, None)
        module.__dict__.pop("_posenc_owner", None)  # posenc.hf._serving.mark_owner
    cast(Any, model).set_attn_implementation(attn_implementation)  # a transformers PreTrainedModel


def _refuse_switches(model: torch.nn.Module, remap: _Remap) -> None:
    """Refuse what would drop the patch silently -- another attention implementation, a save without the method --
    on the model and on every transformers model inside it (``model.model``, what ``get_decoder()`` returns: it shares
    the config, so its ``set_attn_implementation`` would switch every layer too).

    Refused: ``set_attn_implementation(...)`` on the model or on any transformers model inside it (another attention
    would run the identity rotary modules, a model without positions), a forward after the config's attention was
    changed by other means (``config._attn_implementation = ...``, ``PreTrainedModel.set_attn_implementation(model,
    ...)``: the rotary modules check it at every call, ``_check_implementation``), and ``save_pretrained(...)`` (it
    would reload as the unextended model claiming the longer context); ``posenc.hf.save_pretrained`` writes what a
    serving engine runs as measured (``dca_vllm`` on Qwen2/Qwen3 as ``dual_chunk_attention_config``) and refuses the
    rest.
    """
    from transformers import PreTrainedModel

    from posenc.hf._serving import mark_owner

    for module in model.modules():
        if isinstance(module, PreTrainedModel):
            module.__dict__["_posenc_remap"] = remap
            mark_owner(model, module)
            for name, refusal in _REFUSALS.items():
                module.__dict__[name] = types.MethodType(refusal, module)  # deepcopy rebinds it to the copy


#: Why a patched model runs only posenc's attention (the rotation moved into it).
_WHY_OURS = (
    "that attention rotates the queries and keys (the rotary modules are the identity), so another one would run the "
    "model without positions"
)


def _refuse_attn_implementation(self: torch.nn.Module, *args: Any, **kwargs: Any) -> None:
    remap = self.__dict__["_posenc_remap"]
    wanted = args[0] if args else kwargs.get("attn_implementation")
    fail(
        "attn_implementation",
        wanted,
        f"{IMPLEMENTATION!r} while the model runs {remap.method.name}: {_WHY_OURS}. Load the model again for another "
        "attention implementation",
    )


def _check_implementation(rotary: torch.nn.Module) -> None:
    """Refuse a forward of a model whose config names another attention than posenc's: a change no method call
    made (``config._attn_implementation = ...``, ``PreTrainedModel.set_attn_implementation(model, ...)``), which
    transformers would dispatch to without the rotation. The rotary module runs once per forward, before any layer."""
    implementation = cast(Any, rotary.config)._attn_implementation
    if implementation != IMPLEMENTATION:
        remap = rotary.__dict__["_posenc_remap"]
        fail(
            "model.config._attn_implementation",
            implementation,
            f"{IMPLEMENTATION!r}, as posenc.hf.extend_context set it for {remap.method.name}: {_WHY_OURS}. Set it "
            f"back (model.config._attn_implementation = {IMPLEMENTATION!r}), or load the model again for another "
            "attention implementation",
        )


def _refuse_save(self: torch.nn.Module, *args: Any, **kwargs: Any) -> None:
    from posenc.hf._serving import rebuild_advice, remap_save_problem

    remap = self.__dict__["_posenc_remap"]
    problem = remap_save_problem(self.config, remap.method, remap.encoding)
    instead = (
        "use posenc.hf.save_pretrained(model, tokenizer, out_dir), which writes it as dual_chunk_attention_config "
        "for vLLM and SGLang"
        if problem is None
        else f"no saved config runs it as measured ({problem}). {rebuild_advice(self)}"
    )
    fail(
        "model",
        f"{architecture(self)} patched with {remap.method.name}",
        f"a model whose save reloads as what it runs: transformers has no config key for {remap.method.name}, so "
        f"model.save_pretrained writes a folder it would reload as the unextended model with max_position_embeddings "
        f"{cast(Any, self.config).max_position_embeddings}; {instead}",
    )


_REFUSALS = {"set_attn_implementation": _refuse_attn_implementation, "save_pretrained": _refuse_save}
_POSITIONS_HOOK = "_posenc_positions_hook"


def _derive_positions(model: torch.nn.Module) -> None:
    """A call with an ``attention_mask`` holding padding and no ``position_ids`` gets the positions ``generate``
    would give it (transformers would number the padding too: harmless for RoPE, which is relative, but remapping
    methods read absolute positions)."""
    base = getattr(model, "base_model", model)
    if base.__dict__.get(_POSITIONS_HOOK) is not None:
        return
    signature = inspect.signature(base.forward)

    def before(module, args, kwargs):  # noqa: ANN001, ANN202 - forward pre-hook
        try:
            given = signature.bind_partial(*args, **kwargs).arguments
        except TypeError:
            return None
        mask = given.get("attention_mask")
        if "position_ids" not in signature.parameters or given.get("position_ids") is not None:
            return None
        if not isinstance(mask, torch.Tensor) or mask.dim() != 2 or bool(mask.bool().all()):
            return None  # no padding: transformers' arange (after the cache) is what generate gives
        tokens = given.get("input_ids")
        tokens = tokens if tokens is not None else given.get("inputs_embeds")
        if tokens is None or "position_ids" in dict(zip(signature.parameters, args, strict=False)):
            return None
        return args, {**kwargs, "position_ids": cache_positions.implied_positions(mask, tokens.shape[1])}

    base.__dict__[_POSITIONS_HOOK] = base.register_forward_pre_hook(before, with_kwargs=True)


def _identity_rotation(module: torch.nn.Module) -> None:
    """The rotary module returns ``cos = 1``, ``sin = 0`` (shapes and dtype as before): q and k pass un-rotated."""
    module.forward = types.MethodType(_identity_forward, module)  # a bound method: deepcopy rebinds it to the copy


def _identity_forward(self: torch.nn.Module, x: torch.Tensor, position_ids: torch.Tensor, *args: Any, **kwargs: Any):  # noqa: ANN202
    _check_implementation(self)
    cos, sin = type(self).forward(self, x, position_ids, *args, **kwargs)
    remapped = self.__dict__["_posenc_remap"].layer_type
    if remapped is not None and kwargs.get("layer_type", args[0] if args else None) != remapped:
        return cos, sin  # a layer type the method leaves alone (Gemma 3's sliding layers): its own RoPE
    return torch.ones_like(cos), torch.zeros_like(sin)


def _register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(IMPLEMENTATION, _attention)
    AttentionMaskInterface.register(IMPLEMENTATION, sdpa_mask)


def _attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    position_ids: torch.Tensor | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature: (B, H, S, D) in, (B, S, H, Dv) out.

    Positions are the ones the caller gives: the model's ``position_ids`` (explicit, packed, or -- for a call with an
    ``attention_mask`` and none -- derived from the mask as ``generate`` derives them, so a left-padded row equals the
    prompt alone), and for keys written by earlier calls the positions the patched model recorded in the cache
    (``posenc.hf._cache_positions``). Which (query, key) pairs may attend is transformers' own mask (padding, packed
    documents). The length ``S`` of a sequence (for ``dynamic``/``longrope`` frequencies and DCA's factor) is its
    largest position + 1, sequences told apart as transformers tells packed ones apart (a position that does not follow
    its predecessor starts one), so a packed or padded row equals each sequence alone.
    """
    remap: _Remap | None = module.__dict__.get("_posenc_remap")
    if remap is None and module.__dict__.get(_KEPT) is not None:  # a layer type the method leaves alone
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      position_ids=position_ids, **kwargs)
    if remap is None:
        fail("model", type(module).__name__, "a model patched by posenc (its attention modules lost the patch)")
    if dropout:
        fail("dropout", dropout, "0 (remapped attention is for inference; call model.eval())")
    b, s, t = query.shape[0], query.shape[2], key.shape[2]
    cache = cache_positions.current_cache(module)
    layer = None if cache is None else cache_positions.cache_layer(cache, cast(int, module.layer_idx))
    if position_ids is None:  # transformers' default: the tokens after the cache
        position_ids = torch.arange(t - s, t, device=query.device)[None]
    q_pos = position_ids.to(query.device).long()  # (B|1, S)
    if t > s and layer is None:
        fail("cache", None, f"the cache holding the {t - s} earlier keys (their positions are recorded there)")
    k_pos = q_pos
    if layer is not None:
        earlier = cache_positions.cached_positions(layer, t - s, b, query.device)  # (B|1, T - S)
        rows = max(earlier.shape[0], q_pos.shape[0])
        k_pos = torch.cat([earlier.expand(rows, -1), q_pos.expand(rows, -1)], dim=-1)  # (B|1, T)
    given = k_pos  # what the cache records (padding as given)
    pairs = None
    if attention_mask is not None:
        pairs = attention_mask[:, 0, :, :t]  # (B|1, S, T): transformers' mask, causality and padding included
        pairs = pairs if pairs.dtype == torch.bool else pairs == 0
        if bool(pairs.all()):
            pairs = None
    if pairs is not None:  # tokens no pair involves (padding) sit at 0: their positions are never read
        k_pos = torch.where(pairs.any(dim=1), k_pos, 0)
        q_pos = torch.where(pairs.any(dim=2), q_pos, 0)
    # Each token's sequence length, as transformers tells packed sequences apart (a position that does not follow its
    # predecessor starts a new one): its sequence's largest position + 1.
    documents = (torch.diff(k_pos, dim=-1, prepend=k_pos[:, :1] - 1) != 1).cumsum(-1)  # (B|1, T)
    lengths = document_lengths(k_pos, documents)  # (B|1, T)
    if layer is not None:
        written = _lengths_written(module, remap, layer, lengths, t - s) if remap.depends_on_length else None
        cache_positions.remember_positions(layer, given, written)
    out = remap_attention(
        query,
        key,
        value,
        method=remap.method,
        encoding=remap.encoding,
        q_positions=q_pos,
        k_positions=k_pos,
        mask=pairs,
        seq_len=lengths,
        scale=scaling,
        span_dtype=query.dtype if query.dtype in HALF_DTYPES else None,
    )
    return out.transpose(1, 2).contiguous(), None  # (B, H, S, Dv) -> (B, S, H, Dv)


def _lengths_written(
    module: torch.nn.Module, remap: _Remap, layer: Any, lengths: torch.Tensor, cached: int
) -> torch.Tensor:
    """The sequence length each key of ``layer`` was computed at, ``(B|1, T)``: the cached keys' as recorded, this
    call's its own. Warns once per cache (``CacheStaleWarning``) at the first call where a cached token was computed
    at a length that moves its frequencies or logit factor: its hidden states, so every deeper layer's cached keys
    and values, differ from the full forward's (the first layer's, computed from the embeddings, do not).

    Where the length changes what a token computes (``dynamic``/``longrope`` frequencies under the method, DCA's logit
    factor), a KV cache keeps, in every layer past the first, keys and values computed from hidden states of the length
    of the step that wrote them, while the full forward recomputes them at the current one. Each ``generate`` that goes
    stale says so; a one-layer model, or a cache whose tokens were all computed alike, equals the full forward and does
    not warn.
    """
    earlier = cache_positions.cached_lengths(layer, cached, lengths.shape[0], lengths.device)  # (B|1, T - S)
    rows = max(earlier.shape[0], lengths.shape[0])
    if (
        not layer.__dict__.get(_STALE_WARNED)
        and module.layer_idx == remap.layers[0]
        and len(remap.layers) > 1
        and cached
        and not remap.same_at(earlier, lengths[:, :cached])
    ):
        layer.__dict__[_STALE_WARNED] = True  # once per cache: a new one (each generate) warns again
        scaling = remap.encoding.config.scaling
        what = [f"the model's {scaling.rope_type} RoPE frequencies"] if remap.encoding.depends_on_length else []
        what += [f"{remap.method.name}'s logit factor"] if remap.method.depends_on_length else []
        warnings.warn(
            f"posenc.hf.extend_context: under {remap.method.name}, the sequence's length sets {' and '.join(what)}, "
            f"and this call's length ({int(lengths.max())} tokens) changes them for tokens the KV cache holds: their "
            "keys and values in every layer past the first come from hidden states computed at the length of the "
            "step that wrote them, so cached decoding differs from the full forward from here on. Run without the "
            "cache (use_cache=False) for the full forward.",
            CacheStaleWarning,
            stacklevel=2,
        )
    return torch.cat([earlier.expand(rows, -1), lengths[:, cached:].expand(rows, -1)], dim=-1)


def extend_remap(
    model: torch.nn.Module,
    name: str,
    factor: float,
    *,
    original: int | None,
    target: int | None,
    options: Mapping[str, Any],
    layer_type: str | None = None,
) -> dict[str, Any]:
    """``extend_context`` for a remapping method: its parameters from the paper's rule for ``original`` ->
    ``target`` (``ceil(original * factor)`` unless given), overridden by ``options``; checked before anything
    changes; then the patch, and ``max_position_embeddings`` raised to the target.

    ``original`` defaults to the context the model has now (``max_position_embeddings``; with ``layer_type``, the
    context that type carries, ``posenc.hf._reach.type_context``), so the rule of every second call holds: the
    context grows by ``factor`` (YaRN x2 then Self-Extend x2 reaches 4x the pretraining length, Self-Extend's groups
    counted over the YaRN model's context). ``dynamic`` keeps the pretraining length there (it has no fixed reach), so
    dynamic x2 then a remapping method x2 reaches 2x. With ``layer_type`` the model reaches as far as the method and
    its other layer types do (a sliding-window layer has no limit, ``posenc.hf._reach.frequency_reach``)."""
    check_remappable(model, layer_type)
    config: Any = model.config  # a transformers PretrainedConfig
    if original is None:
        original = int(config.max_position_embeddings) if layer_type is None else type_context(model, layer_type)
    target = math.ceil(original * factor) if target is None else target
    if target <= original and name not in WITHIN_TRAINING:  # STRING is meant to run at the training length too
        fail(
            "factor" if factor <= 1 else "max_position_embeddings",
            factor if factor <= 1 else target,
            f"a target beyond the original length {original} (within it {name} changes nothing)",
        )
    method = remap_method(name, original=original, target=target, **options)
    old = int(config.max_position_embeddings)
    reach = float(method.reach(original))
    what = f"{name} x{factor:g} ({method!r} over {original} tokens)"
    if layer_type is not None:  # the other layer types reach as far as their RoPE carries them
        contexts = layer_contexts(model) or {}
        others, limiting = frequency_reach(config, {**contexts, layer_type: math.inf})
        what = f"{what} on the {layer_type} layers"
        if others < reach:
            reach = others
            what = f"{what} (the model reaches as far as its {limiting} layers: {int(others)} tokens)"
    description = apply_remap(model, method, layer_type=layer_type, original=original, factor=factor,
                              options=options)
    config.max_position_embeddings = max(old, target)
    watch_reach(rotary_modules(model), reach, what)  # replaces a frequency method's
    description.update(
        factor=factor,
        original_max_position_embeddings=original,
        max_position_embeddings={"old": old, "new": int(config.max_position_embeddings)},
        rule="new",
        description=f"{method!r}: reaches {method.reach(original):g} tokens from {original}"
        + ("" if layer_type is None else f", on the {layer_type} layers"),
    )
    return description
