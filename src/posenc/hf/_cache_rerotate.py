"""Cached keys brought to the current frequencies, for a transformers model whose RoPE frequencies change with the
length (``dynamic`` NTK at every length past the original one, ``longrope`` once, from its short to its long
factors).

transformers rotates each key with the frequencies of the call that writes it to the cache; a later call whose
rotary module computed other frequencies attends to those stale keys. The patch hands the attention every cached key
rotated to the call's frequencies instead:

    k_now = T_now T_w^-1 k_cached        (per rotating pair; T = [[c, -s], [s, c]], c = a cos(p θ), s = a sin(p θ))

with ``T_w`` the model's own cos/sin tables (attention factor ``a`` included) of the call that wrote the key and
``T_now`` those of the current call, both at the key's position ``p`` (``rerotate_keys``: why the tables and not the
angle difference). Where that equals the full forward, and where it is dynamic scaling with a KV cache as YaRN (Peng
et al. 2023, section 3.3) defines it: ``exact_with_cache``. How the hooks work, what they refuse and cost:
``install_rerotation``; why a rotated copy and not the cache rotated in place: ``_update``.

Shapes:
    keys (B, Hkv, T, D); positions (B|1, T) int64; inv_freq per key (T, F) float32; attention factor (T,) float32.
"""

from __future__ import annotations

import dataclasses
import functools
import types
from collections.abc import Callable
from typing import Any, cast

import torch

from posenc._checks import fail
from posenc.hf._cache_positions import current_cache, watch_cache

_HOOKS = "_posenc_rerotate_hooks"  # on the attention module: the ids of its hooks
_SOURCE = "_posenc_rerotate_source"  # on the attention module: (rotary module, its layer type, notify)
_CALL = "_posenc_rerotate_call"  # on the attention module between its pre- and post-hook: (cache, layer_idx)
_PENDING = "_posenc_rerotate_pending"  # on the cache: layer_idx -> _Call, from the pre-hook to update
_WRAPPED = "_posenc_rerotate_update"  # on the cache: its update is wrapped
_NOTIFIED = "_posenc_rerotate_notified"  # on the cache: notify was called for it (once per cache)
_WRITTEN = "_posenc_written_keys"  # on a cache layer: _Written (dynamic layers) or _Frequencies (others)
_SWITCH = "_posenc_reencode_at"  # on the model: LongRoPE's switch length, for generate
_ATTENTION_PROJECTIONS = ("q_proj", "query_key_value", "qkv_proj")


@dataclasses.dataclass(frozen=True)
class _Call:
    """What the current call rotates its keys with, for ``update``: positions ``(B|1, S)`` (None: the model's
    default, the ``S`` positions after the cached ones), frequencies ``(F,)`` and attention factor."""

    positions: torch.Tensor | None
    inv_freq: torch.Tensor
    scaling: float
    notify: Callable[[], None] | None = None  # called once per cache, when its cached keys are first re-rotated


@dataclasses.dataclass(frozen=True)
class _Written:
    """The keys a dynamic cache layer holds, in write order from write index ``start``: their positions
    ``(B|1, n)``, the frequencies ``(n, F)`` and attention factors ``(n,)`` they were rotated with."""

    start: int
    positions: torch.Tensor
    inv_freq: torch.Tensor
    scaling: torch.Tensor


@dataclasses.dataclass(frozen=True)
class _Frequencies:
    """A cache layer posenc cannot re-rotate (static, quantized): the frequencies its keys were written with."""

    inv_freq: torch.Tensor
    scaling: float


def attention_modules(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """The attention modules transformers dispatches by ``layer_idx`` (those that call ``cache.update``)."""
    return [
        (name, m)
        for name, m in model.named_modules()
        if isinstance(getattr(m, "layer_idx", None), int) and any(hasattr(m, p) for p in _ATTENTION_PROJECTIONS)
    ]


def remove_rerotation(model: torch.nn.Module) -> None:
    """Remove the hooks ``install_rerotation`` put on ``model`` (caches already wrapped stay wrapped: without the
    hooks their ``update`` passes keys through and forgets what it recorded) and ``reencode_at_switch``'s wrapper."""
    for _, m in attention_modules(model):
        for hook_id in m.__dict__.pop(_HOOKS, ()):
            # by id from the module's own tables: a handle of a deep-copied model points at the original's
            for table in (
                m._forward_pre_hooks,
                m._forward_pre_hooks_with_kwargs,
                m._forward_hooks,
                m._forward_hooks_with_kwargs,
                m._forward_hooks_always_called,
            ):
                table.pop(hook_id, None)
        m.__dict__.pop(_SOURCE, None)
        m.__dict__.pop(_CALL, None)
    if model.__dict__.pop(_SWITCH, None) is not None:
        model.__dict__.pop("prepare_inputs_for_generation", None)


def install_rerotation(
    model: torch.nn.Module,
    rotary: torch.nn.Module,
    layer_types: set[str | None],
    *,
    notify: Callable[[], None] | None = None,
) -> list[str]:
    """Hook every attention module of a layer type in ``layer_types`` (``{None}``: every layer, one RoPE for all) so
    that its cached keys follow the frequencies ``rotary`` computes for each call; ``notify`` is called once per cache
    object, the first time keys it holds are re-rotated (a new cache, e.g. each ``generate``, is told again). Earlier
    hooks must have been removed (``remove_rerotation``). The hooks are plain functions reading the module's
    ``__dict__``, so ``copy.deepcopy`` of the model gives hooks on the copy's rotary
    module. Returns the names of the modules hooked (empty: none found, nothing installed).

    Mechanism: a forward pre-hook on each attention module whose layer's frequencies depend on the length (after
    ``watch_cache``'s, which finds the call's cache) reads the call's frequencies from the model's rotary module
    (which ran earlier in the same forward: transformers' ``dynamic_rope_update`` has set them, for dynamic NTK from
    ``max(position_ids) + 1`` over the batch or the larger length it saw since it last ran below the original one)
    and its ``position_ids``, and leaves them for the cache's ``update``, which the hook wraps (a bound method on the
    cache object, so ``copy.deepcopy`` of a prompt cache keeps it). Each cache layer records, per key it holds, its
    position and the frequencies and attention factor it was rotated with (``_Written``: an attribute of the layer
    object, so it follows ``crop`` and dies with the cache). A forward of a model patched with a remapping method
    (``_posenc_remap`` on the attention module, checked at call time) caches un-rotated keys: the hooks do nothing
    there. What cannot be re-rotated is refused (``_check_layer``).

    Cost: past the switch a re-rotation per layer per step over the keys written with other frequencies (dynamic
    NTK: all of them, each step; LongRoPE: the keys written before the switch), one more key-sized tensor per layer
    while its attention runs, one host sync per layer per step (which keys are stale), and a record of ``F + 1``
    float32 and one int64 position per cached key and layer (about ``1 / Hkv`` of a bfloat16 key cache's size at
    ``B = 1``). Measured on CPU (4 layers, Hkv 8, head 64, 1,000 cached keys, one thread): a decode step took 37%
    longer for dynamic NTK (all keys re-rotated) and 22% longer for LongRoPE (200 keys from before the switch) than
    with the stale cache.
    """
    config: Any = model.config  # a transformers PretrainedConfig
    hooked = []
    for name, m in attention_modules(model):
        layer_type = _layer_type(m, config)
        if (None if None in layer_types else layer_type) not in layer_types:
            continue
        per_type = layer_type is not None and getattr(rotary, f"{layer_type}_inv_freq", None) is not None
        watch_cache(m)  # its pre-hook first: it finds the call's cache
        m.__dict__[_SOURCE] = (rotary, layer_type if per_type else None, notify)  # not a submodule: __dict__
        pre = m.register_forward_pre_hook(_before, with_kwargs=True)
        post = m.register_forward_hook(_after, always_call=True)
        m.__dict__[_HOOKS] = (pre.id, post.id)
        hooked.append(name)
    return hooked


def exact_with_cache(model: torch.nn.Module, layer_types: set[str | None]) -> bool:
    """Whether re-rotating the cached keys makes cached decoding equal the full forward: only when no attention
    layer comes after the first whose frequencies change (that layer's keys and values are computed from hidden
    states that do not depend on the length; every later layer's, from hidden states computed at an earlier one).

    Re-rotation gives the attention the keys a full forward computes from the same hidden states, which no KV cache
    can do more of: a full forward at length L also recomputes every earlier token's hidden states with the
    frequencies of L, while the cache holds keys and values computed from hidden states of earlier steps. Elsewhere
    it is dynamic scaling with a KV cache as YaRN (Peng et al. 2023, section 3.3) defines it -- keys cached before
    RoPE and rotated with the current scale -- which ``posenc.hf._cache_guard.guard_cache`` warns about
    (``CacheStaleWarning``) and, for LongRoPE's one switch, avoids in ``generate`` by re-encoding the sequence once
    (``reencode_at_switch``, Phi-3's rule).
    """
    config: Any = model.config  # a transformers PretrainedConfig
    indices = [cast(int, m.layer_idx) for _, m in attention_modules(model)]
    dependent = [
        cast(int, m.layer_idx)
        for _, m in attention_modules(model)
        if (None if None in layer_types else _layer_type(m, config)) in layer_types
    ]
    return bool(dependent) and min(dependent) == max(indices)


def reencode_at_switch(model: torch.nn.Module, switch: int) -> None:
    """Make ``generate`` drop a non-empty cache of at most ``switch`` keys once its sequence grows past ``switch``
    (LongRoPE's ``original_max_position_embeddings``), so the model re-encodes the whole sequence with the long
    factors once and decodes exactly from there: the rule of Phi-3's ``prepare_inputs_for_generation``, for every
    architecture (a bound method on the model, so ``copy.deepcopy`` keeps it)."""
    model.__dict__[_SWITCH] = switch
    model.prepare_inputs_for_generation = types.MethodType(_prepare_inputs, model)  # type: ignore[assignment]  # nn.Module's __setattr__ types only tensors and modules


def _prepare_inputs(self, input_ids, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
    switch = self.__dict__.get(_SWITCH)
    name = "cache" if "cache" in kwargs else "past_key_values"
    cache = kwargs.get(name)
    if switch is not None and cache is not None and input_ids.shape[-1] > switch:
        past = cache.get_seq_length() if hasattr(cache, "get_seq_length") else 0
        if 0 < past <= switch:
            kwargs[name] = None  # the model starts a new cache, which generate keeps
            kwargs["next_sequence_length"] = None  # the whole sequence
    return type(self).prepare_inputs_for_generation(self, input_ids, *args, **kwargs)


def _layer_type(module: torch.nn.Module, config: Any) -> str | None:
    layer_type = getattr(module, "layer_type", None)
    if layer_type is None and getattr(config, "layer_types", None):
        layer_type = config.layer_types[module.layer_idx]
    return layer_type


def _frequencies(rotary: torch.nn.Module, layer_type: str | None) -> tuple[torch.Tensor, float]:
    """The frequencies and attention factor ``rotary`` used in this forward (for ``layer_type``'s buffers)."""
    prefix = "" if layer_type is None else f"{layer_type}_"
    scaling = getattr(rotary, f"{prefix}attention_scaling")
    return getattr(rotary, f"{prefix}inv_freq"), float(scaling)


def _before(module, args, kwargs):  # noqa: ANN001, ANN202 - forward pre-hook
    """Refuse what cannot be brought to this call's frequencies; leave them, with the call's positions, for the
    cache's ``update``."""
    if module.__dict__.get("_posenc_remap") is not None:
        return None  # a remapping patch caches un-rotated keys and rotates them in its attention
    if module.__dict__.get("_posenc_drope") is not None:
        return None  # DroPE caches un-rotated keys, which no frequency change moves
    cache = current_cache(module)
    source = module.__dict__.get(_SOURCE)
    if cache is None or source is None:
        return None
    rotary, layer_type, notify = source
    layers = getattr(cache, "layers", None)
    if not isinstance(layers, list):
        fail(
            "cache",
            type(cache).__name__,
            "a transformers Cache with one layer object per decoder layer (posenc re-rotates the cached keys of a "
            "model whose RoPE frequencies change with the length)",
        )
    idx = module.layer_idx
    inv_freq, scaling = _frequencies(rotary, layer_type)
    positions = kwargs.get("position_ids")
    if isinstance(positions, torch.Tensor):
        positions = positions.detach().long()
        if positions.dim() == 1:
            positions = positions[None]
    else:
        positions = None
    if idx < len(layers):
        _check_layer(cache, layers[idx], idx, positions, inv_freq, scaling)
    _wrap(cache)
    cache.__dict__.setdefault(_PENDING, {})[idx] = _Call(positions, inv_freq.detach().clone(), scaling, notify)
    module.__dict__[_CALL] = (cache, idx)
    return None


def _after(module, args, output):  # noqa: ANN001, ANN202 - forward hook, also run when the forward raised
    cache, idx = module.__dict__.pop(_CALL, (None, None))
    if cache is not None:
        cache.__dict__.get(_PENDING, {}).pop(idx, None)
    return None


def _supported(layer: Any) -> bool:
    from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

    return type(layer) in (DynamicLayer, DynamicSlidingWindowLayer)


def _held(layer: Any) -> int:
    """Keys the layer holds (a sliding-window layer: its window)."""
    if not getattr(layer, "is_initialized", False) or layer.keys is None or layer.keys.numel() == 0:
        return 0
    return layer.keys.shape[-2]


def _total(layer: Any) -> int:
    """Keys written to the layer so far, less any cropped: a sliding-window layer's write index of its next key."""
    return int(layer.get_seq_length())


def _foreign(cache: Any, idx: int, count: int) -> None:
    fail(
        "cache",
        f"a {type(cache).__name__} whose layer {idx} holds {count} keys this patched model did not write",
        "a cache filled by this patched model (or none): its RoPE frequencies change with the length, so posenc "
        "records the frequencies and position of every key it caches, to rotate them to the current frequencies; "
        "run the whole prompt through the patched model (a prompt processed before extend_context has keys rotated "
        "with other frequencies), or start without a cache",
    )


def _check_layer(cache: Any, layer: Any, idx: int, positions, inv_freq, scaling) -> None:  # noqa: ANN001
    """Refuse what cannot be brought to this call's frequencies, before anything is written.

    Refused (``ValueError``), rather than decoded wrongly: a cache holding keys this patched model did not write (a
    prompt processed before ``extend_context``: their frequencies and positions are unknown); a cache layer recorded
    for another batch size; and a cache whose layers are not ``DynamicLayer`` / ``DynamicSlidingWindowLayer``
    (static, quantized, offloaded-static caches: their key index is not the write order, or their stored keys are
    not what the attention reads) once a call's frequencies differ from those its keys were written with -- until
    then they run as before.
    """
    written = layer.__dict__.get(_WRITTEN)
    if not _supported(layer):
        count = _total(layer)
        if count == 0:
            return
        if not isinstance(written, _Frequencies):
            _foreign(cache, idx, count)
        if written.scaling != scaling or not torch.equal(written.inv_freq, inv_freq.to(written.inv_freq.device)):
            fail(
                "cache",
                f"{type(cache).__name__} ({type(layer).__name__} at layer {idx})",
                "a DynamicCache (generate's default, or cache_implementation='dynamic'): this call's RoPE "
                "frequencies differ from those the cached keys were rotated with, and posenc re-rotates cached keys "
                "only in dynamic layers, whose key index is the write order (or generate with use_cache=False)",
            )
        return
    held = _held(layer)
    if held == 0:
        return
    total = _total(layer)
    if (
        not isinstance(written, _Written)
        or written.start > total - held
        or written.start + written.positions.shape[-1] < total
    ):
        _foreign(cache, idx, held)
    rows, batch = written.positions.shape[0], layer.keys.shape[0]
    new_rows = 1 if positions is None else positions.shape[0]
    if rows not in (1, batch) or new_rows not in (1, batch):
        fail(
            "cache",
            f"a cache recorded for a batch of {rows} rows, now holding {batch} and called with {new_rows}",
            "the batch the cache was filled with (posenc records each row's key positions)",
        )


def _wrap(cache: Any) -> None:
    if cache.__dict__.get(_WRAPPED):
        return
    cache.update = types.MethodType(_update, cache)  # a bound method: deepcopy rebinds it to the copy
    cache.__dict__[_WRAPPED] = True


def _update(self, key_states, value_states, layer_idx, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
    """``Cache.update``, returning the cached keys rotated to the current call's frequencies.

    A rotated copy, not the cache rotated in place: dynamic NTK changes the frequencies at every step, so an in-place
    re-rotation rounds a bfloat16 key once per step, and a step whose rotation is below half an ulp leaves the key
    unchanged, losing that rotation for good. Simulated for a head_dim 64 key cache (base 1e4, original 2048, factor
    2, 2000 prompt keys, 1000 steps): in-place bfloat16 keys ended 44% (mean relative error; 93% max) from the full
    forward's, against 0.16% for the full forward's own bfloat16 rounding and 113% without any re-rotation. The
    cache therefore keeps every key as transformers wrote it, and what ``update`` returns to the attention carries
    the cached ones rotated to the current frequencies: each key is rounded at most twice (when written, when
    re-rotated), whatever the number of steps.
    """
    call = self.__dict__.get(_PENDING, {}).pop(layer_idx, None)
    layer = self.layers[layer_idx] if layer_idx < len(self.layers) else None
    total = 0 if layer is None or not _supported(layer) else _total(layer)
    keys, values = type(self).update(self, key_states, value_states, layer_idx, *args, **kwargs)
    layer = self.layers[layer_idx]
    if call is None:  # a write the hooks did not see (no longer patched, or remapped): its rotation is unknown
        layer.__dict__.pop(_WRITTEN, None)
        return keys, values
    if not _supported(layer):
        layer.__dict__[_WRITTEN] = _Frequencies(call.inv_freq, call.scaling)
        return keys, values
    if call.notify is not None:
        call = dataclasses.replace(call, notify=functools.partial(_notify_once, self, call.notify))
    return _rotated(layer, total, call, key_states.shape[-2], keys), values


def _notify_once(cache: Any, notify: Callable[[], None]) -> None:
    """``notify``, the first time for ``cache``: the warning is the cache's (each stale cache is told once), not the
    model's, so a second ``generate`` that leaves the full forward says so too."""
    if not cache.__dict__.get(_NOTIFIED):
        cache.__dict__[_NOTIFIED] = True
        notify()


def _rotated(layer: Any, total: int, call: _Call, s: int, keys: torch.Tensor) -> torch.Tensor:
    """Record the ``s`` keys just written (after ``total`` earlier ones); return ``keys`` (the last ones written,
    as the layer returns them) with those written at other frequencies rotated to the call's."""
    device = keys.device
    positions = call.positions
    if positions is None:
        positions = torch.arange(total, total + s, device=device)[None]
    positions = positions.to(device)
    inv_now = call.inv_freq.to(device)
    inv = inv_now.expand(s, -1)
    scaling = torch.full((s,), call.scaling, dtype=torch.float32, device=device)
    written = layer.__dict__.get(_WRITTEN)
    start = total
    if isinstance(written, _Written) and total > written.start:
        cut = total - written.start  # a crop (assisted decoding) dropped the keys past it
        old = written.positions[:, :cut].to(device)
        rows = max(old.shape[0], positions.shape[0])
        positions = torch.cat([old.expand(rows, -1), positions.expand(rows, -1)], dim=-1)
        inv = torch.cat([written.inv_freq[:cut].to(device), inv])
        scaling = torch.cat([written.scaling[:cut].to(device), scaling])
        start = written.start
    end = total + s
    keep = end - _held(layer) - start  # the layer now holds the keys from write index end - held
    layer.__dict__[_WRITTEN] = _Written(start + keep, positions[:, keep:], inv[keep:], scaling[keep:])

    first = end - keys.shape[-2] - start  # record index of the first key returned
    earlier = keys.shape[-2] - s
    if earlier <= 0:
        return keys
    inv_w, scaling_w = inv[first : first + earlier], scaling[first : first + earlier]
    stale = ((inv_w != inv_now).any(-1) | (scaling_w != call.scaling)).nonzero()
    if stale.numel() == 0:
        return keys
    n = int(stale[-1]) + 1  # keys past the last stale one were written with these frequencies
    if call.notify is not None:
        call.notify()
    if keys.shape[-2] - n <= n:  # rotate the rest too (an exact identity) rather than copy it behind
        n = keys.shape[-2]
        inv_w, scaling_w = inv[first:], scaling[first:]
    fresh = rerotate_keys(  # a copy: the cache keeps the keys as written
        keys[..., :n, :], positions[:, first : first + n], inv_w[:n], scaling_w[:n], inv_now, call.scaling
    )
    return fresh if n == keys.shape[-2] else torch.cat([fresh, keys[..., n:, :]], dim=-2)


def _tables(positions: torch.Tensor, inv_freq: torch.Tensor, scaling) -> tuple[torch.Tensor, torch.Tensor]:  # noqa: ANN001
    """transformers' cos/sin (``*RotaryEmbedding.forward``), one rotating pair per column: ``p.float() * inv_freq``
    in float32, cos and sin, times the attention factor. ``(B|1, T, F)``."""
    with torch.autocast(positions.device.type, enabled=False):
        angles = positions[..., None].float() * inv_freq.float()
        return angles.cos() * scaling, angles.sin() * scaling


def rerotate_keys(
    keys: torch.Tensor,
    positions: torch.Tensor,
    inv_freq: torch.Tensor,
    scaling: torch.Tensor,
    inv_freq_now: torch.Tensor,
    scaling_now: float,
) -> torch.Tensor:
    """Keys rotated by transformers' tables for (``inv_freq``, ``scaling``), one set per key, as the tables for
    (``inv_freq_now``, ``scaling_now``) would have rotated them: ``T_now T_w^-1`` per rotating pair, computed in
    float64 for float64 keys and float32 otherwise, cast back to the keys' dtype once.

    ``T_now T_w^-1`` is a rotation by ``C = (c_n c_w + s_n s_w) / (c_w² + s_w²)``, ``S = (s_n c_w - c_n s_w) / (c_w² +
    s_w²)``, applied like transformers' ``apply_rotary_pos_emb`` to the rotating channels (the first ``2F``: GPT-NeoX
    and Phi-3 rotate a part of the head). The tables and not the angle difference (``RotaryEmbedding.rerotate``,
    ``R(p (θ_n - θ_w))``): transformers computes its tables from ``p * θ`` rounded in float32, which no rotation by
    the exact angle difference reproduces (an error up to about ``p θ 2^-24`` rad), and posenc's dynamic-NTK
    frequencies differ from transformers' by up to a float32 ulp at some lengths. Undoing the written tables exactly
    gives the key the full forward computes, to the rounding of the cache's dtype (float64 caches: ~1e-16; tested per
    architecture in ``tests/hf/test_cache_rerotate.py``).

    Shapes:
        keys (B, Hkv, T, D); positions (B|1, T); inv_freq (T, F); scaling (T,); inv_freq_now (F,) -> (B, Hkv, T, D).
    """
    work = torch.float64 if keys.dtype == torch.float64 else torch.float32
    c_w, s_w = _tables(positions, inv_freq, scaling[:, None])
    c_n, s_n = _tables(positions, inv_freq_now, scaling_now)
    c_w, s_w, c_n, s_n = (t.to(work)[:, None] for t in (c_w, s_w, c_n, s_n))  # (B|1, 1, T, F)
    norm = c_w * c_w + s_w * s_w
    cos = (c_n * c_w + s_n * s_w) / norm
    sin = (s_n * c_w - c_n * s_w) / norm
    pairs = cos.shape[-1]
    x1, x2 = keys[..., :pairs].to(work), keys[..., pairs : 2 * pairs].to(work)
    out = keys.clone()
    out[..., :pairs] = x1 * cos - x2 * sin  # transformers' x * cos + rotate_half(x) * sin, by halves
    out[..., pairs : 2 * pairs] = x2 * cos + x1 * sin
    return out
