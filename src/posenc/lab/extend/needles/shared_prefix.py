"""Needle documents that share their haystack: the shared prefix's KV cache computed once, each answer generated on
a copy of it (``share_prefix=True``; off by default: measured no faster on SmolLM2 at 8k on a 2-core CPU, and one of
two answers changed, BENCHMARKS.md "Needles sharing their haystack").

Exact in answers (not bit-equal logits: other matrix blockings and the split attention's summation order) for every
patch whose keys and values at a position do not depend on the rest of the sequence (``why_not_shared`` says which do
not), checked sample by sample in tests/lab/extend/needles/test_needle_prefix.py.
:func:`split_cached_attention` runs the suffix after a cached prefix as two mask-free SDPA calls merged by their
log-sum-exps (PyTorch's CPU flash kernel otherwise computes every tile of the explicit ``(S, P + S)`` mask).
"""

from __future__ import annotations

import contextlib
import copy
import inspect
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch

#: Frequency methods whose frequencies follow the total length: a prefix computed at its own length differs.
LENGTH_DEPENDENT_ROPE = ("dynamic", "longrope")
#: Remapping methods whose attention depends on the total length (DCA's logit factor).
LENGTH_DEPENDENT_REMAP = ("dca", "dca_vllm")
#: Shorter shared prefixes are computed per prompt: they save less than a cache copy costs.
MIN_SHARED = 64


def _rope_types(model: torch.nn.Module) -> set[str]:
    types: set[str] = set()
    for module in model.modules():
        value = getattr(module, "rope_type", None)
        if isinstance(value, str):
            types.add(value)
        elif isinstance(value, Mapping):
            types.update(v for v in value.values() if isinstance(v, str))
    params = getattr(model.config, "rope_parameters", None) or getattr(model.config, "rope_scaling", None) or {}
    if isinstance(params, Mapping):
        nested = [params] + [v for v in params.values() if isinstance(v, Mapping)]
        types.update(p["rope_type"] for p in nested if isinstance(p.get("rope_type"), str))
    return types


def why_not_shared(model: torch.nn.Module) -> str | None:
    """None where a copied prefix cache gives the answers of a fresh ``generate``; else why it may not.

    Shared: the unpatched model, static frequency methods (linear, ntk, yarn, llama3, ...), ALiBi slopes and the
    remapping methods ``self_extend``, ``rerope``, ``leaky_rerope``, ``lm_infinite``, ``string``, ``streaming_llm``
    (posenc keeps their keys un-rotated and records each cached key's position, so a copied, cropped cache continues
    exactly). Not shared: ``dynamic`` and ``longrope`` (frequencies follow the total length), ``dca`` / ``dca_vllm``
    (the logit factor does), a model whose forward takes no cache; the caller also requires one plain, croppable
    ``DynamicCache`` (no sliding-window layers)."""
    remap = model.__dict__.get("_posenc_remap")
    if remap is not None and remap.method.name in LENGTH_DEPENDENT_REMAP:
        return f"{remap.method.name}'s logit factor depends on the total length"
    dependent = sorted(_rope_types(model) & set(LENGTH_DEPENDENT_ROPE))
    if dependent or any("_posenc_rerotate_hooks" in m.__dict__ for m in model.modules()):
        return f"{', '.join(dependent) or 'its'} frequencies depend on the total length"
    if "cache" not in inspect.signature(model.forward).parameters and not _takes_past(model):
        return "its forward takes no KV cache"
    return None


def _takes_past(model: torch.nn.Module) -> bool:
    return "past_key_values" in inspect.signature(model.forward).parameters


def cache_name(model: torch.nn.Module) -> str:
    """The keyword ``forward`` / ``generate`` take a cache under (transformers 5.24: ``cache``; before:
    ``past_key_values``)."""
    return "past_key_values" if _takes_past(model) else "cache"


def _common(a: torch.Tensor, b: torch.Tensor) -> int:
    """Length of the common prefix of two 1-D token tensors."""
    n = min(a.numel(), b.numel())
    differ = (a[:n] != b[:n]).nonzero()
    return int(differ[0, 0]) if differ.numel() else n


class SharedPrefix:
    """The prompts of one group; ``cache_for(ids)`` a copy of their shared prefix's KV cache, or None (unshared).

    Each prompt shares the longest prefix it has in common with another prompt (at most all but its last token:
    ``generate`` needs one new token to start from). Prompts whose shared prefixes are all prefixes of one of them
    (a common haystack: each prompt's own prefix ends at its needle) form a family; a family's reference tokens up
    to the longest of its prefixes are run through the model once, on its first ``cache_for``, and each prompt gets
    a deep copy cropped to its own shared length; the family's cache is dropped once each member was answered. A
    prompt the group does not know (other tokens) gets None.

    Shapes:
        prompts: each ``(1, T_i)`` int64 token ids.
    """

    def __init__(
        self, model: torch.nn.Module, prompts: Sequence[torch.Tensor], *, min_shared: int = MIN_SHARED
    ) -> None:
        self.model = model
        self.reason = why_not_shared(model)
        rows = list({tuple(p.reshape(-1).tolist()): p.reshape(-1).cpu() for p in prompts}.values())  # distinct
        shared = [0] * len(rows)
        for i, row in enumerate(rows):
            for j in range(len(rows)):
                if j != i:
                    shared[i] = max(shared[i], _common(row, rows[j]))
            shared[i] = min(shared[i], row.numel() - 1)
        self.families: list[dict[str, Any]] = []  # each: reference tokens, length, members left, cache
        self.shared: dict[tuple[int, ...], tuple[int, int]] = {}  # prompt -> (its family, its shared length)
        for i in sorted(range(len(rows)), key=lambda i: -shared[i]):  # the longest prefixes found the families
            if shared[i] < min_shared:
                continue
            row = rows[i]
            family = next(
                (f for f, fam in enumerate(self.families) if _common(row, fam["reference"]) >= shared[i]), None
            )
            if family is None:
                family = len(self.families)
                self.families.append({"reference": row, "length": shared[i], "left": 0, "cache": None})
            self.families[family]["left"] += 1
            self.shared[tuple(row.tolist())] = (family, shared[i])
        if self.reason is None and not self.shared:
            self.reason = "no two prompts share a prefix"
        self.length = max((f["length"] for f in self.families), default=0)
        self.used = 0  # prompts answered from a shared prefix, for tests and reports

    def _prefill(self, family: dict[str, Any]) -> Any:
        from transformers import DynamicCache

        device = next(self.model.parameters()).device
        cache = DynamicCache(config=self.model.config)
        ids = family["reference"][None, : family["length"]].to(device)  # (1, P)
        with torch.inference_mode():
            self.model(ids, attention_mask=torch.ones_like(ids), use_cache=True, logits_to_keep=1,
                       **{cache_name(self.model): cache})
        layers = getattr(cache, "layers", ())
        if not getattr(cache, "is_croppable", True) or any(type(layer).__name__ != "DynamicLayer" for layer in layers):
            self.reason = "its cache is not one plain, croppable DynamicCache"
            return None
        return cache

    def cache_for(self, ids: torch.Tensor) -> Any:
        """A fresh copy of the shared prefix's cache for the prompt ``ids`` ``(1, T)``, or None: answer unshared."""
        if self.reason is not None:
            return None
        slot = self.shared.get(tuple(ids.reshape(-1).tolist()))
        if slot is None:
            return None
        family, s = self.families[slot[0]], slot[1]
        if family["cache"] is None:
            family["cache"] = self._prefill(family)
            if family["cache"] is None:
                return None
        cache = copy.deepcopy(family["cache"])
        family["left"] -= 1
        if family["left"] <= 0:
            family["cache"] = None  # every member answered (a prompt asked again gets a new prefill)
            family["left"] = 0
        if s < family["length"]:
            cache.crop(s - family["length"])  # transformers 5.24: a negative count removes that many keys from the end
        self.used += 1
        return cache


# ---------------------------------------------------------------------------------------------------------------------
# The cached suffix's attention: the prefix's keys unmasked, the suffix's own keys causal, merged by log-sum-exp


@contextlib.contextmanager
def split_cached_attention() -> Iterator[None]:
    """Inside: transformers' ``sdpa`` attention runs a prompt's queries after a cached prefix as two kernel calls
    that need no mask, merged exactly by their log-sum-exps: the queries over the ``P`` cached keys (unmasked) and
    over their own ``S`` keys (``is_causal``, whose tiles above the diagonal are skipped). SDPA given the explicit
    ``(S, P + S)`` mask transformers builds instead computes every tile of it, reads the mask in each, and repeats
    the key/value heads for GQA. Every other call (no cache, one query, padding, another mask, a batch, CUDA) is
    transformers' own ``sdpa_attention_forward``. The sum is reordered, so outputs agree to rounding."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    mapping = ALL_ATTENTION_FUNCTIONS._global_mapping
    original = mapping["sdpa"]
    checked: dict[tuple[int, tuple[int, ...]], bool] = {}  # one mask per forward, shared by its layers

    def attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):  # noqa: ANN001, ANN003, ANN202
        b, h, s, d = query.shape  # (B, H, S, D); key, value (B, Hkv, T, D)
        t = key.shape[2]
        plain = not kwargs.get("softcap") and not kwargs.get("sliding_window") and dropout == 0.0
        if b != 1 or s < 2 or t <= s or query.device.type != "cpu" or not plain or attention_mask is None:
            return original(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
        slot = (attention_mask.data_ptr(), tuple(attention_mask.shape))
        if slot not in checked:
            allowed = attention_mask if attention_mask.dtype == torch.bool else attention_mask == 0
            causal = torch.ones(s, t, dtype=torch.bool, device=allowed.device).tril(t - s)  # (S, T)
            checked[slot] = allowed.shape[-2:] == (s, t) and bool((allowed == causal).all())
        if not checked[slot]:
            return original(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
        groups = h // key.shape[1]
        if groups > 1:  # repeat_kv's order: query head i reads key head i // groups
            key, value = key.repeat_interleave(groups, 1), value.repeat_interleave(groups, 1)  # (B, H, T, D)
        p = t - s
        flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
        old, old_lse = flash(query, key[:, :, :p], value[:, :, :p], scale=scaling)  # (B, H, S, D), (B, H, S)
        new, new_lse = flash(query, key[:, :, p:], value[:, :, p:], is_causal=True, scale=scaling)
        top = torch.maximum(old_lse, new_lse)
        w_old, w_new = (old_lse - top).exp().unsqueeze(-1), (new_lse - top).exp().unsqueeze(-1)  # (B, H, S, 1)
        out = (old.float() * w_old + new.float() * w_new) / (w_old + w_new)  # (B, H, S, D)
        return out.to(query.dtype).transpose(1, 2).contiguous(), None  # (B, S, H, D), as sdpa_attention_forward

    mapping["sdpa"] = attention
    try:
        yield
    finally:
        mapping["sdpa"] = original
