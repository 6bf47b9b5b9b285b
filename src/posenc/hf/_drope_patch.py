"""DroPE on a loaded transformers model: RoPE dropped from every layer, as the authors drop it.

Gelberg, Eguchi, Akiba, Cetin 2025, "Extending the Context of Pretrained LLMs by Dropping Their Positional
Embeddings" (arXiv:2512.12167): after pretraining with RoPE, remove it and recalibrate briefly at the original
context; the NoPE model then runs zero-shot past that context. Reference implementation: ``github.com/SakanaAI/DroPE``
at commit ``260a8bb9f4fda0673266ddfee7668915aade8b33`` (``custom_models/attention.py`` ``nope(...)``,
``custom_models/drope.py`` ``_patch_attention_layers``; what is followed, and the authors' recalibration recipe:
``apply_drope``).

Here the rotary modules return ``cos = 1``, ``sin = 0`` (their shapes and dtype as before), so every attention layer
receives what the authors' ``NoPEAttention`` passes, whatever the attention implementation, and q and k reach it
un-rotated. ``remove_drope`` undoes it. A saved folder records it (``posenc.hf._record``; ``posenc.hf.load_causal_lm``
re-applies it), since no config key of transformers, vLLM or llama.cpp turns RoPE off in every layer of these
architectures; the model's own ``save_pretrained`` is refused, as it would reload with RoPE.

Shapes:
    The rotary module's ``(cos, sin)``: ``(B, S, rotary_dim)`` each, as transformers builds them, filled with 1
    and 0; q ``(B, H, S, D)`` and k ``(B, Hkv, T, D)`` reach the attention as the projections made them.
"""

from __future__ import annotations

import types
from typing import Any, cast

import torch

from posenc._checks import check_number, fail
from posenc.hf import _reach
from posenc.hf._cache_rerotate import attention_modules
from posenc.hf._common import architecture, model_type, rotary_modules
from posenc.hf.setup import ROPE_MODEL_TYPES

METHOD = "drope"
#: Architectures DroPE is applied to: each RoPE architecture posenc handles (every layer's attention takes the
#: rotary module's cos/sin), each checked in ``tests/hf/test_extend_drope.py``; not yet those with a RoPE per layer
#: built from copies of the config (Granite-SWA, whose NoPE layers already have none; MiMo-V2-Flash), refused.
_NOT_YET = ("granite_swa", "granitemoe_swa", "mimo_v2_flash")
DROPE_MODEL_TYPES = tuple(kind for kind in ROPE_MODEL_TYPES if kind not in _NOT_YET)
_STATE = "_posenc_drope"  # on the model(s), attention and rotary modules: the shared _Dropped
_OLD_SCALING = "_posenc_drope_scaling"  # on each attention module: its softmax scale before the patch
_OLD_REACH = "_posenc_drope_reach"  # on each rotary module: the reach an earlier extension set


class _Dropped:
    """What the patch changed (a plain attribute: not a module, not in the state dict)."""

    def __init__(self, softmax_scale: float | None, layers: tuple[int, ...]) -> None:
        self.softmax_scale = softmax_scale
        self.layers = layers  # the attention modules' layer_idx


def dropped(model: torch.nn.Module) -> bool:
    """Whether ``model`` runs DroPE (``apply_drope``)."""
    return model.__dict__.get(_STATE) is not None


def check_droppable(model: torch.nn.Module) -> None:
    """Refuse, naming the architecture, a model DroPE cannot be applied to as the authors apply it."""
    kind = model_type(model.config)
    if kind not in DROPE_MODEL_TYPES:
        fail(
            "model",
            architecture(model),
            f"a RoPE model of a type in {list(DROPE_MODEL_TYPES)}: DroPE drops rotary embeddings (ALiBi's bias is "
            "not one)",
        )
    if dropped(model):
        fail("method", METHOD, "a model without DroPE: it already runs without RoPE (load it again to re-apply)")
    rotary = rotary_modules(model)
    if not rotary:
        fail("model", architecture(model), "a model with a rotary embedding module (none holds an inv_freq buffer)")
    for name, module in rotary:
        if getattr(module, "config", None) is not model.config:
            fail(
                "model",
                architecture(model),
                f"a model whose rotary modules are transformers' *RotaryEmbedding built from model.config ({name!r}, "
                f"a {type(module).__name__}, is not)",
            )
    if not attention_modules(model):
        fail("model", architecture(model), "a model whose attention modules transformers dispatches by layer_idx")


def apply_drope(model: torch.nn.Module, *, softmax_scale: float | None = None) -> dict[str, Any]:
    """Drop RoPE from every layer of ``model`` in place; return what changed.

    As the reference implementation (SakanaAI/DroPE at 260a8bb9) drops it: ``custom_models/attention.py``
    ``nope(...)`` replaces the attention's ``position_embeddings`` ``(cos, sin)`` by ``(ones_like(cos),
    zeros_like(sin))``, so ``apply_rotary_pos_emb`` leaves both q and k un-rotated (and the KV cache holds un-rotated
    keys); a factor the rotary module multiplies into cos/sin (``attention_scaling``: YaRN's mscale, LongRoPE's) goes
    with it. ``custom_models/drope.py`` (``_patch_attention_layers``) does this in every layer (``LlamaAttention`` /
    ``Qwen2Attention``): no layer keeps RoPE and no option chooses layers, so there is no ``layers=`` here. Nothing
    else changes by default: ``from_source`` replaces the softmax scale 1/sqrt(head_dim) by ``config.softmax_scale``
    when the config has that field (a constant, not length-dependent), but no run config in ``cfgs/`` sets it; here
    it is ``softmax_scale``. There is no length-dependent temperature at inference. The QK-norm variants
    (``attention_type="qk_norm_nope"`` etc.: new RMSNorm weights over q_proj/k_proj outputs) add parameters and are
    not implemented.

    It is exact: ``q * 1 + rotate_half(q) * 0 == q`` in every dtype, so the patched model equals the same weights run
    with no rotation (``tests/hf/test_extend_drope.py``: a float64 model written out, transformers' SmolLM3 with
    ``no_rope_layers`` all 0, and each architecture with ``apply_rotary_pos_emb`` the identity).

    The authors' recalibration, which is the caller's to run (``cfgs/run_cfg/*_drope.yaml``,
    ``hydra_utils.load_model``, ``custom_data/pretraining_data.py``): plain causal-LM loss (``transformers.Trainer``,
    ``labels = input_ids``, EOS-separated documents packed into blocks) on fineweb-edu, every parameter trained
    (nothing frozen, no PEFT), at the pretraining context length (SmolLM 2048, Llama-2-7B 4096, SmolLM2 8192).
    Llama-2-7B: 5,000 steps x 512 x 4096 tokens (10.5B), lr 1e-4, cosine, 100 warmup steps; SmolLM-360M / 1.7B:
    120,000 steps x 512 x 2048 (126B), lr 3e-4; SmolLM2-1.7B: 120,000 steps x 512 x 8192, lr 3e-4. AdamW (0.9,
    0.999), no weight decay, gradients clipped at 1.

    Args:
        model: a transformers model of a type in ``DROPE_MODEL_TYPES``.
        softmax_scale: the authors' optional ``config.softmax_scale``: every attention's logit scale (replacing
            1/sqrt(head_dim), or Gemma 2/3's ``query_pre_attn_scalar**-0.5``); None keeps each model's own, as every
            released DroPE recipe does.
    """
    if softmax_scale is not None:
        softmax_scale = check_number("softmax_scale", softmax_scale, above=0.0)
    check_droppable(model)
    from transformers import PreTrainedModel

    rotary = rotary_modules(model)
    attention: list[tuple[str, Any]] = attention_modules(model)  # transformers' attention modules: .scaling
    missing = [name for name, m in attention if not isinstance(getattr(m, "scaling", None), (int, float))]
    if softmax_scale is not None and missing:
        fail("softmax_scale", softmax_scale, f"None: {missing[0]!r} has no float 'scaling' to replace")
    old_scales = sorted({float(m.scaling) for _, m in attention if isinstance(getattr(m, "scaling", None), float)})
    state = _Dropped(softmax_scale, tuple(sorted(cast(int, m.layer_idx) for _, m in attention)))
    for _, module in attention:
        module.__dict__[_STATE] = state  # posenc.hf._cache_rerotate leaves the (un-rotated) cached keys alone
        if softmax_scale is not None:
            module.__dict__[_OLD_SCALING] = module.scaling
            module.scaling = softmax_scale
    for _, module in rotary:
        module.__dict__[_STATE] = state
        module.__dict__[_OLD_REACH] = module.__dict__.get(_reach._STATE)
        module.forward = types.MethodType(_nope_forward, module)  # a bound method: deepcopy rebinds it to the copy
    _reach.watch_reach(rotary, None, METHOD)  # no positions, so no reach: an earlier extension's no longer holds
    for module in model.modules():
        if isinstance(module, PreTrainedModel):
            module.__dict__[_STATE] = state
            module.__dict__["save_pretrained"] = types.MethodType(_refuse_save, module)
    context = int(cast(Any, model.config).max_position_embeddings)
    scale = "softmax scale kept" if softmax_scale is None else f"softmax scale {softmax_scale:g}"
    return {
        "architecture": model_type(model.config),
        "model_class": type(model).__name__,
        "method": METHOD,
        "factor": None,
        "original_max_position_embeddings": None,
        "max_position_embeddings": {"old": context, "new": context},
        "softmax_scale": {"old": old_scales, "new": softmax_scale},
        "layers": list(state.layers),
        "rule": "new",
        "description": f"DroPE: RoPE dropped from all {len(state.layers)} layers (cos = 1, sin = 0); {scale}",
        "modules_patched": len(rotary) + (len(attention) if softmax_scale is not None else 0),
        "module_names": [n for n, _ in rotary] + ([n for n, _ in attention] if softmax_scale is not None else []),
    }


def remove_drope(model: torch.nn.Module) -> None:
    """Undo ``apply_drope`` on ``model``: the rotary modules rotate again, each attention has its own softmax scale,
    an earlier extension's reach is watched again, ``save_pretrained`` is transformers' own, and the model's record
    (``posenc.hf._record``) no longer lists DroPE."""
    from posenc.hf import _record

    if not dropped(model):
        fail("model", architecture(model), "a model patched with DroPE (posenc.hf.extend_context(model, 'drope'))")
    for module in model.modules():
        if module.__dict__.pop(_STATE, None) is None:
            continue
        if _OLD_SCALING in module.__dict__:
            cast(Any, module).scaling = module.__dict__.pop(_OLD_SCALING)
        if getattr(module.__dict__.get("forward"), "__func__", None) is _nope_forward:
            del module.__dict__["forward"]
            module.__dict__[_reach._STATE] = module.__dict__.pop(_OLD_REACH, None)
        save = module.__dict__.get("save_pretrained")
        if getattr(save, "__func__", None) is _refuse_save:
            del module.__dict__["save_pretrained"]
    kept = [e for e in _record.extensions(model) if e.get("method") != METHOD]
    _record.extensions(model)[:] = kept
    _record.keep_in_config(model)


def _nope_forward(self: torch.nn.Module, x: torch.Tensor, position_ids: torch.Tensor, *args: Any, **kwargs: Any):  # noqa: ANN202
    """The rotary module's forward with ``cos = 1``, ``sin = 0`` (its shapes and dtype): the authors'
    ``(ones_like(cos), zeros_like(sin))``."""
    cos, sin = type(self).forward(self, x, position_ids, *args, **kwargs)
    return torch.ones_like(cos), torch.zeros_like(sin)


def _refuse_save(self: torch.nn.Module, *args: Any, **kwargs: Any) -> None:
    fail(
        "model",
        f"{architecture(self)} patched with DroPE",
        "a model whose save reloads as what it runs: transformers has no config key that drops RoPE in every layer "
        "of this architecture, so the folder model.save_pretrained writes would reload with "
        "RoPE; use posenc.hf.save_pretrained(model, tokenizer, out_dir), which records it for "
        "posenc.hf.load_causal_lm",
    )
