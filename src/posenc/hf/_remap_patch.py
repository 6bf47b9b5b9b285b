"""Remapping methods (Self-Extend, Dual Chunk Attention, ReRoPE, LM-Infinite, STRING, StreamingLLM) on a loaded
transformers model.

The rotation moves from the model into the attention: every ``*RotaryEmbedding`` module returns the identity
(``cos = 1``, ``sin = 0``), so the projections' queries and keys reach the attention -- and the KV cache -- un-rotated,
and the attention (registered with transformers as ``"posenc_remap"``) is ``posenc.remapping.remap_attention``: each
branch rotates them at its own positions with posenc's ``RotaryEmbedding`` built from the model's config (its
scaling included: YaRN first, then Self-Extend, is a YaRN-scaled Self-Extend). The reference implementations
patch the same two places (``LongLM``'s ``self_extend_forward`` re-rotates cached un-rotated keys each step).

Positions are the ones the caller gives: the model's ``position_ids`` (explicit, packed, or -- for a call with an
``attention_mask`` and none -- derived from the mask as ``generate`` derives them, so a left-padded row equals the
prompt alone), and for keys written by earlier calls the positions the patched model recorded in the cache
(``posenc.hf._cache_positions``). Which (query, key) pairs may attend is transformers' own mask (padding, packed
documents). The length ``S`` of a sequence (for ``dynamic``/``longrope`` frequencies and DCA's factor) is its
largest position + 1, sequences told apart as transformers tells packed ones apart (a position that does not follow
its predecessor starts one), so a packed or padded row equals each sequence alone.

What the patch cannot carry is refused: ``model.set_attn_implementation(...)`` (another attention would run the
identity rotary modules: a model without positions) and ``model.save_pretrained(...)`` (it would reload as the
unextended model claiming the longer context); ``posenc.hf.save_pretrained`` writes what a serving engine runs as
measured (``dca_vllm`` on Qwen2/Qwen3 as ``dual_chunk_attention_config``) and refuses the rest.
"""

from __future__ import annotations

import inspect
import math
import types
from collections.abc import Mapping
from typing import Any

import torch

from posenc._checks import fail
from posenc.attention import document_lengths
from posenc.encodings.rotary import RotaryEmbedding
from posenc.hf import _cache_positions as cache_positions
from posenc.hf._common import architecture, model_type
from posenc.hf._rope_patch import rotary_modules
from posenc.remapping import WITHIN_TRAINING, RemapMethod, remap_attention, remap_method

IMPLEMENTATION = "posenc_remap"

#: Architectures whose attention is the plain pattern the patch relies on: ``apply_rotary_pos_emb(q, k, cos, sin)``
#: from the model's rotary module, then ``ALL_ATTENTION_FUNCTIONS`` with no logit soft-capping and one RoPE for every
#: layer (each checked in ``tests/hf/test_extend_remap.py``). Gemma 2/3/4 (soft-capping, sliding layers with their
#: own RoPE) are refused.
REMAP_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3", "phi3", "gpt_neox", "gemma")


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
    ) -> None:
        self.method, self.encoding, self.original, self.factor = method, encoding, original, factor
        self.options = dict(options or {})

    def call(self) -> str:
        """The ``extend_context`` call that applies this method again."""
        options = "".join(f", {k}={v!r}" for k, v in self.options.items())
        return f"posenc.hf.extend_context(model, {self.method.name!r}, {self.factor:g}{options})"


def check_remappable(model: torch.nn.Module) -> None:
    """Refuse, naming the architecture, a model the remapping patch cannot serve."""
    kind = model_type(model.config)
    if kind not in REMAP_MODEL_TYPES:
        fail(
            "model",
            architecture(model),
            f"a RoPE model of a type in {list(REMAP_MODEL_TYPES)}: remapping methods change the positions RoPE "
            "rotates by (ALiBi and NoPE models have none; Gemma 2/3/4 attention is not handled)",
        )
    if getattr(model.config, "sliding_window", None) and getattr(model.config, "use_sliding_window", True):
        fail("model", architecture(model), "a model without sliding-window attention (its config sets sliding_window)")
    params = getattr(model.config, "rope_parameters", None) or {}
    if any(isinstance(v, Mapping) for v in params.values()):
        fail("model", architecture(model), "a model with one RoPE for every layer (not per-layer-type rope_parameters)")
    if getattr(model, "_posenc_remap", None) is not None:
        fail("method", model._posenc_remap.method.name, "one remapping method per model (load it again for another)")


def apply_remap(model: torch.nn.Module, method: RemapMethod, **record: Any) -> dict[str, Any]:
    """Patch ``model`` in place to run ``method``; return what changed. ``record``: how it was asked for
    (``original``, ``factor``, ``options``), for the error that names the call re-applying it."""
    check_remappable(model)
    encoding = RotaryEmbedding.from_hf(model.config)
    rotary = rotary_modules(model)
    if not rotary:
        fail("model", architecture(model), "a model with a rotary embedding module (inv_freq buffer)")
    _register()
    remap = _Remap(method, encoding, **record)
    attention = []
    modules = []
    for name, module in model.named_modules():
        if hasattr(module, "layer_idx") and any(hasattr(module, p) for p in ("q_proj", "query_key_value", "qkv_proj")):
            modules.append(module)
            attention.append(name)
    if not attention:
        fail("model", architecture(model), "a model whose attention modules transformers dispatches by layer_idx")
    for module in modules:
        module.__dict__["_posenc_remap"] = remap
        cache_positions.watch_cache(module)
    for _, module in rotary:
        _identity_rotation(module)
    _derive_positions(model)
    old = model.config._attn_implementation
    model.__dict__["_posenc_remap"] = remap
    model.set_attn_implementation(IMPLEMENTATION)
    for name in ("set_attn_implementation", "save_pretrained"):  # refuse what would drop the patch silently
        model.__dict__[name] = types.MethodType(_REFUSALS[name], model)
    return {
        "architecture": architecture(model),
        "model_class": type(model).__name__,
        "method": method.name,
        "parameters": method.to_dict(),
        "rotary": encoding.config.to_dict(),
        "attn_implementation": {"old": old, "new": IMPLEMENTATION},
        "modules_patched": len(attention) + len(rotary),
        "module_names": [*attention, *(n for n, _ in rotary)],
    }


def remove_remap(model: torch.nn.Module, attn_implementation: str = "sdpa") -> None:
    """Undo ``apply_remap`` on ``model`` (posenc.hf.save_pretrained does it on its copy): the rotary modules rotate
    again, the attention is ``attn_implementation``, the hooks and refusals are gone."""
    for module in model.modules():
        if module.__dict__.pop("_posenc_remap", None) is not None:
            cache_positions.unwatch_cache(module)
        if (
            module.__dict__.get("forward") is not None
            and getattr(module.forward, "__func__", None) is _identity_forward
        ):
            del module.__dict__["forward"]
        handle = module.__dict__.pop(_POSITIONS_HOOK, None)
        if handle is not None:
            handle.remove()
    for name in ("set_attn_implementation", "save_pretrained", "_posenc_remap"):
        model.__dict__.pop(name, None)
    model.set_attn_implementation(attn_implementation)


def _refuse_attn_implementation(self: torch.nn.Module, *args: Any, **kwargs: Any) -> None:
    remap = self.__dict__["_posenc_remap"]
    wanted = args[0] if args else kwargs.get("attn_implementation")
    fail(
        "attn_implementation",
        wanted,
        f"{IMPLEMENTATION!r} while the model runs {remap.method.name}: that attention rotates its queries and keys "
        "(the rotary modules are the identity), so another one would run a model without positions. Load the model "
        "again for another attention implementation",
    )


def _refuse_save(self: torch.nn.Module, *args: Any, **kwargs: Any) -> None:
    from posenc.hf.save import rebuild_advice, remap_save_problem

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
        f"a model whose save reloads as what it runs: model.save_pretrained writes no record of {remap.method.name} "
        f"(it would reload as the unextended model with max_position_embeddings "
        f"{self.config.max_position_embeddings}); {instead}",
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
    cos, sin = type(self).forward(self, x, position_ids, *args, **kwargs)
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
    """transformers' attention-function signature: (B, H, S, D) in, (B, S, H, Dv) out."""
    remap: _Remap | None = module.__dict__.get("_posenc_remap")
    if remap is None:
        fail("model", type(module).__name__, "a model patched by posenc (its attention modules lost the patch)")
    if dropout:
        fail("dropout", dropout, "0 (remapped attention is for inference; call model.eval())")
    b, s, t = query.shape[0], query.shape[2], key.shape[2]
    cache = cache_positions.current_cache(module)
    layer = None if cache is None else cache_positions.cache_layer(cache, module.layer_idx)
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
        cache_positions.remember_positions(layer, k_pos)
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
    )
    return out.transpose(1, 2).contiguous(), None  # (B, H, S, Dv) -> (B, S, H, Dv)


def extend_remap(
    model: torch.nn.Module,
    name: str,
    factor: float,
    *,
    original: int | None,
    target: int | None,
    options: Mapping[str, Any],
) -> dict[str, Any]:
    """``extend_context`` for a remapping method: its parameters from the paper's rule for ``original`` ->
    ``target`` (``ceil(original * factor)`` unless given), overridden by ``options``; checked before anything
    changes; then the patch, and ``max_position_embeddings`` raised to the target.

    ``original`` defaults to the context the model has now (``max_position_embeddings``), so the rule of every
    second call holds: the context grows by ``factor`` (YaRN x2 then Self-Extend x2 reaches 4x the pretraining
    length, Self-Extend's groups counted over the YaRN model's context). ``dynamic`` keeps the pretraining length
    there (it has no fixed reach), so dynamic x2 then a remapping method x2 reaches 2x."""
    check_remappable(model)
    original = int(model.config.max_position_embeddings) if original is None else original
    target = math.ceil(original * factor) if target is None else target
    if target <= original and name not in WITHIN_TRAINING:  # STRING is meant to run at the training length too
        fail(
            "factor" if factor <= 1 else "max_position_embeddings",
            factor if factor <= 1 else target,
            f"a target beyond the original length {original} (within it {name} changes nothing)",
        )
    method = remap_method(name, original=original, target=target, **options)
    old = int(model.config.max_position_embeddings)
    description = apply_remap(model, method, original=original, factor=factor, options=options)
    model.config.max_position_embeddings = max(old, target)
    description.update(
        factor=factor,
        original_max_position_embeddings=original,
        max_position_embeddings={"old": old, "new": int(model.config.max_position_embeddings)},
        rule="new",
        description=f"{method!r}: reaches {method.reach(original):g} tokens from {original}",
    )
    return description
