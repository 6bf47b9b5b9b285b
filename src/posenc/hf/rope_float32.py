"""RoPE in float32 inside a bfloat16 / float16 transformers model: tables and rotation, one cast at the end.

transformers computes a RoPE model's angles in float32, then casts cos/sin to the hidden states' dtype, and its
``apply_rotary_pos_emb`` rotates q and k in their own dtype: in a bfloat16 model every rotated element carries the
tables' rounding (2^-8 relative) plus three more (two products and their sum). posenc's rule is angles and tables
in float32, cast at the end. Measured on SmolLM2-135M (BENCHMARKS.md, "Where bfloat16's error comes from"): with the
rotation in float32 the whole-window perplexity shift of a bfloat16 forward fell from +0.17% to -0.04% at 4,096
tokens and from +0.15% to +0.02% at 12,288. How: :func:`keep_rope_float32`.

Reference: transformers' ``*RotaryEmbedding.forward`` and ``apply_rotary_pos_emb`` (e.g.
``models/llama/modeling_llama.py``).
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

import torch

from posenc.hf._common import rotary_modules

_HOOK_ATTR = "_posenc_float32_tables"
_WRAPPED_ATTR = "_posenc_casts_back"
_LOW = (torch.bfloat16, torch.float16)


def _float32_tables(module: torch.nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """Forward pre-hook: the rotary module's ``x`` (hidden states, read for device and dtype) as float32."""
    if args and isinstance(args[0], torch.Tensor) and args[0].dtype in _LOW:
        args = (args[0].float(), *args[1:])
    elif isinstance(kwargs.get("x"), torch.Tensor) and kwargs["x"].dtype in _LOW:
        kwargs = {**kwargs, "x": kwargs["x"].float()}
    return args, kwargs


def _casting_back(apply: Callable[..., Any]) -> Callable[..., Any]:
    """``apply_rotary_pos_emb`` whose rotated tensors come back in the dtype of its first tensor argument (q, or x
    where it rotates one tensor a call) when that is bfloat16/float16; signatures differ between architectures
    (``(q, k, cos, sin)``, ``(x, cos, sin)``, ...), so any is passed through as it is. From transformers 5.25 with
    ``kernels`` installed ``apply`` is a kernels ``Func`` module: it is called as before (inside an attention forward
    it dispatches to that model's kernel), and its module state is not copied onto the wrapper (``updated=()``)."""

    @functools.wraps(apply, updated=())
    def apply_rotary_pos_emb(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202 - transformers' signatures
        out = apply(*args, **kwargs)
        first = next((a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)), None)
        if first is None or first.dtype not in _LOW or torch.is_autocast_enabled(first.device.type):
            return out
        if isinstance(out, torch.Tensor):
            return out.to(first.dtype) if out.is_floating_point() else out
        return type(out)(x.to(first.dtype) if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in out)

    setattr(apply_rotary_pos_emb, _WRAPPED_ATTR, True)
    return apply_rotary_pos_emb


def keep_rope_float32(model: torch.nn.Module) -> int:
    """Make a loaded transformers RoPE model compute its cos/sin tables and the q/k rotation in float32, whatever
    its weights' dtype; q and k are cast to that dtype once, after the rotation. Idempotent; a float32 model is
    unchanged (its tables are float32 already).

    Two things are done to the model:

    - a forward pre-hook on each rotary embedding module hands it float32 hidden states (it reads only their device and
      dtype), so its cos/sin stay float32;
    - the modeling module's ``apply_rotary_pos_emb`` is wrapped to cast its result back to q's (and k's) dtype. Given
      float32 tables, torch's type promotion already computes ``q * cos + rotate_half(q) * sin`` in float32 (q's
      bfloat16 values are exact there); the cast is the one rounding at the end, and the KV cache and attention see the
      model's dtype as before. For every other model the wrapper changes nothing: its tables already have q's dtype,
      so the cast is a no-op; under autocast the result is left as transformers returns it.

    ``posenc.hf.extend_context`` applies it to every RoPE model it patches, so a patched bfloat16 model rotates in
    float32; call it directly to get the same on an unpatched model.

    Returns:
        The number of rotary embedding modules hooked (0: no rotary module, nothing done).
    """
    modules = rotary_modules(model)
    for _, m in modules:
        if getattr(m, _HOOK_ATTR, None) is None:
            setattr(m, _HOOK_ATTR, m.register_forward_pre_hook(_float32_tables, with_kwargs=True))
    if modules:
        for name in {type(m).__module__ for m in model.modules()}:
            source = sys.modules.get(name)
            apply = getattr(source, "apply_rotary_pos_emb", None)
            if callable(apply) and not getattr(apply, _WRAPPED_ATTR, False):
                setattr(source, "apply_rotary_pos_emb", _casting_back(apply))  # noqa: B010 - a module found above
    return len(modules)
