"""Slope interpolation for a loaded transformers ALiBi model (BLOOM, MPT), in place.

Paper: Al-Khateeb et al. 2023, "Position Interpolation Improves ALiBi Extrapolation" (arXiv:2310.13017): to run a
model trained at length ``L`` at ``factor * L``, every slope is multiplied by ``1 / factor`` (posenc's
``interpolated_slopes`` with ``train_len / eval_len``), so the largest distance gets the bias it got in training.

transformers builds the bias in the model's ``forward`` (BLOOM: ``slopes * k`` from its module-level
``_get_alibi_slopes``; MPT: ``build_mpt_alibi_tensor``) and passes it to every block as a keyword argument
(``alibi`` / ``position_bias``). The bias is linear in the slopes and every head is scaled alike, so a forward
pre-hook on each block multiplies that tensor by ``1 / factor`` (in float32, cast back to its dtype). A block
called without the keyword raises instead of running unpatched.
Reference: transformers ``modeling_bloom`` / ``modeling_mpt``; checked in ``tests/hf/test_extend_alibi.py`` against
BLOOM with its slope function replaced by interpolated slopes, and against the full bias tensor.
"""

from __future__ import annotations

import functools
import types
from typing import Any, cast

import torch

from posenc._checks import check_positive_int, fail
from posenc.functional.alibi import alibi_slopes
from posenc.hf._common import architecture
from posenc.hf._rope_patch import lengthen
from posenc.hf._serving import mark_owner, rebuild_advice

# model_type -> (module, block class, the block's keyword argument carrying the bias)
_BLOCKS = {
    "bloom": ("transformers.models.bloom.modeling_bloom", "BloomBlock", "alibi"),
    "mpt": ("transformers.models.mpt.modeling_mpt", "MptBlock", "position_bias"),
}
_HOOKS_ATTR = "_posenc_alibi_hooks"
_FACTOR_ATTR = "_posenc_alibi_factor"


def _scale_bias(module: torch.nn.Module, args: tuple, kwargs: dict, *, key: str, scale: float) -> tuple[tuple, dict]:
    bias = kwargs.get(key)
    if bias is None:
        raise RuntimeError(
            f"posenc.hf.extend_context: {type(module).__name__} was called without its {key!r} keyword argument, "
            "so its ALiBi slopes cannot be interpolated; refusing to run it unpatched"
        )
    kwargs[key] = (bias.float() * scale).to(bias.dtype)  # (B*H, 1|S, T): every head's slope times scale
    return args, kwargs


def _refuse_save(self: torch.nn.Module, *args: Any, **kwargs: Any) -> None:
    """The model's own ``save_pretrained``: refused, as ``posenc.hf.save_pretrained`` refuses it."""
    fail(
        "model",
        f"{architecture(self)} with interpolated ALiBi slopes",
        "a model whose save reloads as what it runs: transformers has no config key for ALiBi's slope interpolation "
        f"(a forward hook), so the folder would reload as the unextended model. {rebuild_advice(self)}",
    )


def extend_alibi(
    model: torch.nn.Module, *, factor: float, original: int | None, target: int | None, replace: bool = False
) -> dict[str, Any]:
    """Interpolate the slopes of a BLOOM or MPT model by ``1 / factor``; see ``posenc.hf.extend_context``.

    A second call composes (slopes times ``1 / (earlier_factor * factor)``), as every RoPE method does with itself;
    ``replace=True`` drops the earlier interpolation instead."""
    import importlib

    config: Any = model.config  # a transformers PretrainedConfig
    kind = config.model_type
    module_name, class_name, key = _BLOCKS[kind]
    block_class = getattr(importlib.import_module(module_name), class_name)
    blocks = [(name, m) for name, m in model.named_modules() if isinstance(m, block_class)]
    if not blocks:
        fail("model", architecture(model), f"a model with {class_name} blocks (found none)")
    if original is None and kind == "mpt":
        original = int(config.max_seq_len)
    if original is not None:
        check_positive_int("original_max_position_embeddings", original)
    if target is None:
        target = None if original is None else lengthen(original, factor)
    elif original is not None and original > target:
        fail("original_max_position_embeddings", original, f"<= the target max_position_embeddings={target}")

    previous = getattr(model, _FACTOR_ATTR, None)
    rule = "new" if previous is None else ("replaced" if replace else "composed")
    earlier = 1.0 if previous is None or replace else previous
    for handle in getattr(model, _HOOKS_ATTR, ()):  # one hook per block, carrying the total factor
        handle.remove()
    total = earlier * factor
    scale = 1.0 / total
    hook = functools.partial(_scale_bias, key=key, scale=scale)
    handles = [m.register_forward_pre_hook(hook, with_kwargs=True) for _, m in blocks]
    setattr(model, _HOOKS_ATTR, handles)
    setattr(model, _FACTOR_ATTR, total)
    from transformers import PreTrainedModel

    for module in model.modules():  # the model and the one inside it (model.transformer) share the config
        if isinstance(module, PreTrainedModel):
            mark_owner(model, module)
            module.__dict__["save_pretrained"] = types.MethodType(_refuse_save, module)  # deepcopy rebinds it
    hooked = sum(1 for _, m in blocks if any(h is hook for h in m._forward_pre_hooks.values()))
    if hooked != len(blocks):
        raise RuntimeError(f"posenc.hf.extend_context hooked {hooked} of {len(blocks)} blocks of {architecture(model)}")

    old_len = None
    if kind == "mpt":  # MPT's bias table covers max_seq_len keys: a longer input would not fit
        old_len = int(config.max_seq_len)
        config.max_seq_len = max(old_len, cast(int, target))  # MPT: original, hence target, is set
    slopes = alibi_slopes(int(config.num_attention_heads))
    return {
        "architecture": kind,
        "model_class": type(model).__name__,
        "method": "linear",
        "factor": factor,
        "rule": rule,
        "description": f"slopes x 1/{total:g}" + (f" (x{earlier:g} earlier, then x{factor:g})" if earlier != 1 else ""),
        "original_max_position_embeddings": original,
        "max_position_embeddings": {"old": old_len, "new": config.max_seq_len if kind == "mpt" else target},
        "slopes": {"old": slopes, "new": (slopes.double() * scale).float()},
        "modules_patched": len(blocks),
        "module_names": [name for name, _ in blocks],
    }
