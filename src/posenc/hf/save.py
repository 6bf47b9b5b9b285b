"""``save_pretrained``: write a (context-extended) transformers model and its tokenizer as a transformers folder.

The folder loads back with ``AutoModelForCausalLM.from_pretrained(out_dir)`` and carries the extension in its
``config.json`` (``rope_parameters``, ``max_position_embeddings``), so anything that reads transformers folders runs
the extended model. Two things the plain ``model.save_pretrained`` gets in the way of:

- a model transformers loaded from GGUF keeps ``config.quantization_config`` and ``model.hf_quantizer``, and refuses
  to save although its weights are plain floats; both are dropped on a copy, the caller's model keeps them;
- a float32 model saves as float32 (517 MB for SmolLM2-135M); ``dtype=torch.bfloat16`` saves half that.

The caller's model is never changed: the copy shares its parameters (same dtype) or holds converted ones.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

import torch

from posenc._checks import fail


def _copy_for_saving(model: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """A copy of ``model`` with its parameters in ``dtype`` (shared when already so), its own config without
    ``quantization_config``, and no ``hf_quantizer``. Buffers are copied as they are (RoPE's float32 ``inv_freq``
    stays float32; it is rebuilt from the config on load anyway)."""
    memo: dict[int, Any] = {}
    for p in model.parameters():  # tied weights are one parameter: converted once, still tied in the copy
        memo[id(p)] = p if p.dtype == dtype else torch.nn.Parameter(p.detach().to(dtype), p.requires_grad)
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is not None:
        memo[id(quantizer)] = None
    clone = copy.deepcopy(model, memo)
    if hasattr(clone.config, "quantization_config"):
        del clone.config.quantization_config
    clone.hf_quantizer = None
    return clone


def remap_config(model: torch.nn.Module) -> dict[str, int] | None:
    """The config block that records a model's remapping method: Dual Chunk Attention's
    ``dual_chunk_attention_config`` (the keys vLLM and SGLang read for Qwen2.5-1M: ``chunk_size``, ``local_size``,
    ``original_max_position_embeddings``); None for a model without one. Any other remapping method raises: no
    format people serve from records it, so the error names the call that re-applies it."""
    remap = getattr(model, "_posenc_remap", None)
    if remap is None:
        return None
    method, original = remap.method, remap.original
    if method.name == "dca":
        return {
            "chunk_size": method.chunk_size,
            "local_size": method.local_window,
            "original_max_position_embeddings": original,
        }
    options = ", ".join(f"{k}={v!r}" for k, v in remap.options.items())
    fail(
        "model",
        f"patched with {method.name} ({method!r})",
        "a model whose extension a config records (frequency methods, or 'dca'); no serving format records "
        f"{method.name}: save the model without it and re-apply it after loading with "
        f"posenc.hf.extend_context(model, {method.name!r}, {remap.factor:g}"
        f"{', ' + options if options else ''})",
    )
    raise AssertionError  # unreachable


def save_pretrained(
    model: torch.nn.Module,
    tokenizer: Any,
    out_dir: str | os.PathLike,
    *,
    dtype: torch.dtype | str | None = None,
) -> Path:
    """Write ``model`` (its weights as safetensors, config, generation config) and ``tokenizer`` into a new folder.

    Args:
        model: a transformers model, e.g. one ``posenc.hf.extend_context`` patched (its extension is in its config).
        tokenizer: its tokenizer (None to save the model alone).
        out_dir: a folder that does not exist yet, or is empty.
        dtype: the saved weights' dtype (``torch.bfloat16`` or ``"bfloat16"``, float16, float32, float64); default
            the model's.

    Returns:
        ``out_dir`` as a Path.

    Raises:
        ValueError: ``out_dir`` is a file or a non-empty folder (posenc never overwrites files), ``model`` is not a
            transformers model, an unknown ``dtype``, or a model patched with a remapping method other than Dual
            Chunk Attention (written as ``dual_chunk_attention_config``; the others have no config format).
    """
    from posenc.hf.load import as_dtype

    if not isinstance(model, torch.nn.Module) or not hasattr(model, "save_pretrained"):
        fail("model", type(model).__name__, "a transformers model (with save_pretrained)")
    out = Path(out_dir).expanduser()
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        fail("out_dir", str(out), "a new or empty folder (posenc never overwrites files)")
    target = model.dtype if dtype is None else as_dtype(dtype)
    remap = remap_config(model)  # refuses a remapping method no config format records, before anything is written
    clone = _copy_for_saving(model, target)
    if remap is not None:
        clone.config.dual_chunk_attention_config = remap
        clone.set_attn_implementation("sdpa")  # the loader's own attention reads the block (vLLM, SGLang)
    out.mkdir(parents=True, exist_ok=True)
    clone.save_pretrained(out)
    if tokenizer is not None:
        tokenizer.save_pretrained(out)
    return out
