"""Remapping methods (Self-Extend, Dual Chunk Attention, ReRoPE, LM-Infinite) on a loaded transformers model.

The rotation moves from the model into the attention: every ``*RotaryEmbedding`` module returns the identity
(``cos = 1``, ``sin = 0``), so the projections' queries and keys reach the attention -- and the KV cache -- un-rotated,
and the attention (registered with transformers as ``"posenc_remap"``) is ``posenc.remapping.remap_attention``: each
branch rotates them at its own positions with posenc's ``RotaryEmbedding`` built from the model's config (its
scaling included: YaRN first, then Self-Extend, is a YaRN-scaled Self-Extend). The reference implementations
patch the same two places (``LongLM``'s ``self_extend_forward`` re-rotates cached un-rotated keys each step).

Query positions are the model's ``position_ids``; keys are contiguous and end at the last query's position (what
transformers' cache holds: the prompt then each generated token); padding comes from the attention mask (its last
query row).
"""

from __future__ import annotations

import math
import types
from collections.abc import Mapping
from typing import Any

import torch

from posenc._checks import fail
from posenc.encodings.rotary import RotaryEmbedding
from posenc.hf._common import architecture, model_type
from posenc.hf._rope_patch import rotary_modules
from posenc.remapping import RemapMethod, remap_attention, remap_method

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
    for name, module in model.named_modules():
        if hasattr(module, "layer_idx") and any(hasattr(module, p) for p in ("q_proj", "query_key_value", "qkv_proj")):
            module.__dict__["_posenc_remap"] = remap
            attention.append(name)
    if not attention:
        fail("model", architecture(model), "a model whose attention modules transformers dispatches by layer_idx")
    for _, module in rotary:
        _identity_rotation(module)
    old = model.config._attn_implementation
    model.__dict__["_posenc_remap"] = remap
    model.set_attn_implementation(IMPLEMENTATION)
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
    s, t = query.shape[2], key.shape[2]
    if position_ids is None:
        position_ids = torch.arange(t - s, t, device=query.device)[None]
    q_pos = position_ids.to(query.device).long()  # (B|1, S)
    k_pos = torch.arange(t, device=query.device) + (q_pos[:, -1:] - (t - 1))  # (B|1, T): ends at the last query
    key_mask = None
    if attention_mask is not None:
        row = attention_mask[:, 0, -1, :t]  # (B, T): the last query sees every key that is not padding
        key_mask = row if row.dtype == torch.bool else row == 0
        if bool(key_mask.all()):
            key_mask = None
        elif key_mask.shape[0] != query.shape[0]:
            key_mask = key_mask.expand(query.shape[0], -1)
    out = remap_attention(
        query,
        key,
        value,
        method=remap.method,
        encoding=remap.encoding,
        q_positions=q_pos,
        k_positions=k_pos,
        key_mask=key_mask,
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
    changes; then the patch, and ``max_position_embeddings`` raised to the target."""
    from posenc.hf._rope_patch import default_original

    check_remappable(model)
    original = default_original(model.config, None) if original is None else original
    target = math.ceil(original * factor) if target is None else target
    if target <= original:
        fail(
            "factor" if factor <= 1 else "max_position_embeddings",
            factor if factor <= 1 else target,
            f"a target beyond the original length {original} (within it a remapping method changes nothing)",
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
