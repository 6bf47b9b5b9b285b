"""Where the keys in a transformers KV cache sit: the positions posenc's patches need for keys written by earlier
calls, and the cache object itself (which transformers hands to the attention module but not to the attention
function).

- ``watch_cache(module)``: a pre-hook on an attention module keeps the call's cache in ``current_cache(module)``.
- ``cached_positions`` / ``remember_positions``: the positions of every key in a cache layer, recorded by the patched
  model when it writes them (an attribute of the layer object, so it lives and dies with the cache), and for a
  length-dependent model the sequence length each was computed at (``cached_lengths``). A cache cropped by assisted
  decoding keeps the record's first keys; a cache holding keys the patched model did not write, or of a kind whose
  key index is not the write order (static caches), is refused.
- ``implied_positions(attention_mask, length)``: the positions ``generate`` gives a left-padded batch
  (``cumsum(mask) - 1``, padding at 0), for a forward called with an ``attention_mask`` and no ``position_ids``.

Shapes:
    positions (B|1, T) int64; lengths (B|1, T) float64; attention_mask (B, T_total) -> (B, length).
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

from posenc._checks import fail

_CACHE = "_posenc_cache"
_HOOK = "_posenc_cache_hook"
_RECORD = "_posenc_key_positions"
_LENGTHS = "_posenc_key_lengths"
#: The names transformers' attention modules take their cache under (GPT-NeoX: ``layer_past``).
_CACHE_NAMES = ("cache", "past_key_values", "past_key_value", "layer_past")


def watch_cache(module: torch.nn.Module) -> None:
    """Keep the cache each call of ``module`` receives in ``current_cache(module)`` (idempotent)."""
    if getattr(module, _HOOK, None) is not None:
        return
    signature = inspect.signature(module.forward)

    def before(mod, args, kwargs):  # noqa: ANN001, ANN202 - forward pre-hook
        try:
            bound = signature.bind_partial(*args, **kwargs).arguments
        except TypeError:
            bound = kwargs
        mod.__dict__[_CACHE] = next((bound[n] for n in _CACHE_NAMES if bound.get(n) is not None), None)
        return None

    def after(mod, args, output):  # noqa: ANN001, ANN202 - forward hook
        mod.__dict__[_CACHE] = None
        return None

    module.__dict__[_HOOK] = (
        module.register_forward_pre_hook(before, with_kwargs=True),
        module.register_forward_hook(after),
    )


def unwatch_cache(module: torch.nn.Module) -> None:
    handles = module.__dict__.pop(_HOOK, None)
    for handle in handles or ():
        handle.remove()
    module.__dict__.pop(_CACHE, None)


def current_cache(module: torch.nn.Module) -> Any:
    """The cache of the call in progress (None without one)."""
    return module.__dict__.get(_CACHE)


def cache_layer(cache: Any, layer_idx: int) -> Any:
    """The layer object of ``cache`` holding layer ``layer_idx``'s keys; refuses caches whose key index is not the
    order the keys were written in."""
    from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

    layers = getattr(cache, "layers", None)
    if layers is None or layer_idx >= len(layers):
        fail("cache", type(cache).__name__, "a transformers Cache with one layer object per decoder layer")
    layer = layers[layer_idx]
    if not isinstance(layer, DynamicLayer) or isinstance(layer, DynamicSlidingWindowLayer):
        fail(
            "cache",
            f"{type(cache).__name__} ({type(layer).__name__})",
            "a DynamicCache (the default of generate): posenc's patch tracks the positions of the keys it holds, "
            "which static and sliding-window caches reorder",
        )
    return layer


def cached_positions(layer: Any, cached: int, batch: int, device: torch.device) -> torch.Tensor:
    """The positions ``(B|1, cached)`` of the first ``cached`` keys of ``layer``, as the patched model recorded them."""
    return _recorded(layer, _RECORD, "positions", cached, batch, device, torch.long)


def cached_lengths(layer: Any, cached: int, batch: int, device: torch.device) -> torch.Tensor:
    """The sequence lengths ``(B|1, cached)`` the first ``cached`` keys of ``layer`` were computed at (the length of
    the call that wrote each), as the patched model recorded them with ``remember_positions``."""
    return _recorded(layer, _LENGTHS, "lengths", cached, batch, device, torch.float64)


def _recorded(layer: Any, attr: str, what: str, cached: int, batch: int, device: torch.device, dtype) -> torch.Tensor:  # noqa: ANN001
    if cached == 0:
        return torch.empty(1, 0, dtype=dtype, device=device)
    record = getattr(layer, attr, None)
    if record is None or record.shape[-1] < cached:
        known = 0 if record is None else record.shape[-1]
        fail(
            "cache",
            f"a cache holding {cached} keys ({known} written by this patched model)",
            f"a cache filled by this patched model: the {what} of keys it did not write are unknown (run the "
            "whole prompt through the patched model, or start without a cache)",
        )
    if record.shape[0] not in (1, batch):
        fail(
            "cache",
            f"a cache recorded for a batch of {record.shape[0]}, now used with {batch} rows",
            f"the batch the cache was filled with (posenc records each row's key {what})",
        )
    return record[:, :cached].to(device)


def remember_positions(layer: Any, positions: torch.Tensor, lengths: torch.Tensor | None = None) -> None:
    """Record the positions ``(B|1, T)`` of every key ``layer`` now holds, and where given the sequence length
    ``(B|1, T)`` each was computed at."""
    setattr(layer, _RECORD, positions.detach())
    if lengths is None:
        layer.__dict__.pop(_LENGTHS, None)
    else:
        setattr(layer, _LENGTHS, lengths.detach())


def implied_positions(attention_mask: torch.Tensor, length: int) -> torch.Tensor:
    """The positions ``generate`` gives the last ``length`` tokens of a padded batch: ``cumsum(mask) - 1``, padding
    at 0 (the rule of ``GenerationMixin``'s position ids)."""
    mask = attention_mask.long()
    positions = mask.cumsum(-1) - 1
    positions = positions.masked_fill(mask == 0, 0)
    return positions[:, -length:]
