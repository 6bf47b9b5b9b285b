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
            transformers model, or an unknown ``dtype``.
    """
    from posenc.hf.load import as_dtype

    if not isinstance(model, torch.nn.Module) or not hasattr(model, "save_pretrained"):
        fail("model", type(model).__name__, "a transformers model (with save_pretrained)")
    out = Path(out_dir).expanduser()
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        fail("out_dir", str(out), "a new or empty folder (posenc never overwrites files)")
    target = model.dtype if dtype is None else as_dtype(dtype)
    clone = _copy_for_saving(model, target)
    out.mkdir(parents=True, exist_ok=True)
    clone.save_pretrained(out)
    if tokenizer is not None:
        tokenizer.save_pretrained(out)
    return out
