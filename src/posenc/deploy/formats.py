"""Where a patched model is written and what each format carries: ``check_save`` (the rules, before any weight is
read) and ``save`` (a transformers folder through ``posenc.hf.save_pretrained``, or a GGUF file through
``posenc.hf.save_gguf``), both written whole or not at all.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from posenc._checks import check_choice, fail
from posenc.deploy.methods import drops, parse

#: Methods a ``.gguf`` output carries (``posenc.gguf.rope``: what llama.cpp runs from GGUF metadata).
GGUF_METHODS = ("none", "linear", "ntk", "yarn", "llama3", "longrope")


def saved_as(path: Path) -> str:
    """What ``path`` is written as, in words."""
    return "a GGUF file llama.cpp runs" if path.suffix.lower() == ".gguf" else "a transformers folder"


def check_save(
    save: str | Path | None,
    *,
    methods: Sequence[str],
    factors: Sequence[float],
    model_type: str | None,
    source: Any,
    original_len: int | None = None,
    rebuild: str | Callable[[], str] = "",
    pretrained: bool = True,
    finetune_steps: int = 0,
    finetune_positions: Sequence[str] = ("plain",),
    out: Path | None = None,
    save_type: str = "source",
) -> Path | None:
    """``save`` checked for one patched pretrained RoPE model: exactly one of ``methods`` and one of ``factors``
    (``drope`` takes no factor and is saved recalibrated only, ``finetune_steps`` > 0, through
    ``posenc.hf.save_pretrained`` with its record), into a new or empty folder other than ``out``, or a new GGUF file
    llama.cpp runs (a GGUF ``source``, a method of ``GGUF_METHODS``; tensors in ``save_type``).

    ``model_type``, ``source`` (``posenc.hf.ModelSource``) and ``original_len``: the model's; ``rebuild``: the Python
    that rebuilds the patched model (or a function giving it), named where no format carries it; ``pretrained``
    False: a lab model (refused).
    Returns the path to write (None when ``save`` is None).

    Raises:
        ValueError: naming ``save`` (or ``save_type``) and what it must be.
    """
    from posenc.gguf.write import TENSOR_TYPES

    check_choice("save_type", save_type, TENSOR_TYPES)
    if save_type != "source" and (save is None or Path(save).suffix.lower() != ".gguf"):
        fail("save_type", save_type, "'source' unless --save names a .gguf file (the tensor type of a GGUF)")
    if save is None:
        return None
    folder = Path(save).expanduser()
    if not pretrained:
        fail("save", str(save), "a pretrained model to save (it writes a transformers folder; a lab model has none)")
    from posenc.hf import ALIBI_MODEL_TYPES

    if model_type in ALIBI_MODEL_TYPES:
        fail("save", str(save), "a RoPE model: ALiBi's slope interpolation is a forward hook no config.json records")
    dropping = drops(methods[0]) and len(methods) == 1
    if dropping and not finetune_steps:
        fail("save", str(save), "--finetune-steps N with --methods drope: RoPE dropped without recalibration is not "
             "a DroPE model (its authors recalibrate every parameter at the original context before using it), so "
             "there is nothing to save; --finetune-steps N recalibrates it here, then --save writes that model")
    if len(methods) != 1 or (len(factors) != 1 and not dropping):
        fail(
            "save",
            str(save),
            f"exactly one method and one factor, the model to write (the study has methods {list(methods)} and "
            f"factors {list(factors)}): e.g. --methods {methods[0]} --factors {factors[0]:g}",
        )
    if finetune_steps and len(finetune_positions) != 1:
        fail(
            "save",
            str(save),
            f"one fine-tuned model to write: exactly one of --finetune-positions (the study has "
            f"{list(finetune_positions)})",
        )
    if folder.suffix.lower() == ".gguf":
        return _check_gguf(save, methods[0], factors, source, original_len, save_type)
    from posenc.hf.save import remap_save_problem

    remap = parse(methods[0]).remapping
    problem = remap_save_problem(model_type, remap) if remap is not None else None
    if problem is not None:
        fail(
            "save",
            str(save),
            f"a method a saved config runs as posenc measures it (frequency methods; dca_vllm on Qwen2/Qwen3): "
            f"{problem}. No folder is needed to run it in Python: "
            f"{rebuild() if callable(rebuild) else rebuild}",
        )
    if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
        fail("save", str(save), "a new or empty folder (posenc never overwrites files)")
    from posenc.hf.save import check_new_path

    check_new_path("save", folder)  # a file above it: refused now, not after the weights load
    if out is not None and folder.resolve() == out.resolve():
        fail("save", str(save), "a folder other than --out (the study's results go there)")
    return folder


def _check_gguf(save: str | Path, method: str, factors: Sequence[float], source: Any, original_len: int | None,
                save_type: str = "source") -> Path:
    """``save`` ending in ``.gguf``: a GGUF source posenc writes (Llama, Qwen2, Gemma 3), a method llama.cpp runs
    for its architecture, a new file."""
    from posenc.hf import gguf_export

    if method not in GGUF_METHODS:
        grouped = "--grp-attn-n G --grp-attn-w W"
        if method == "self_extend" and original_len:
            from posenc.remapping import remap_method

            rule: Any = remap_method(method, original=original_len, target=round(original_len * factors[0]))
            grouped = f"--grp-attn-n {rule.group} --grp-attn-w {rule.window}"
        instead = {
            "dynamic": "dynamic NTK changes its frequencies with the sequence length, which no GGUF key records "
            "(write ntk or yarn instead)",
            "self_extend": f"llama.cpp runs its own Self-Extend from the unpatched file: llama-cli {grouped}",
            "drope": "no GGUF key turns RoPE off in every layer; save a transformers folder (--save DIR), which "
            "posenc.hf.load_causal_lm reloads as DroPE",
        }.get(method, f"llama.cpp has no {method}; save a transformers folder (--save DIR) instead")
        fail("save", str(save), f"a method llama.cpp runs from a GGUF ({', '.join(GGUF_METHODS)}): {instead}")
    if source.kind != "gguf":
        fail("save", str(save), "a GGUF model to start from (a transformers folder: --save DIR writes a folder that "
             "llama.cpp's convert_hf_to_gguf.py converts with its RoPE scaling)")
    header = gguf_export.check_source(source.path)
    factor_tensors = ("llama3", "longrope")  # rope_freqs / rope_factors_*: read by llama.cpp's llama graph only
    if method in factor_tensors and header.architecture != "llama":
        fail("save", str(save), f"a method llama.cpp's {header.architecture} runs from a GGUF "
             f"({', '.join(m for m in GGUF_METHODS if m not in factor_tensors)}): {method} needs per-frequency "
             "factor tensors, which only its llama graph reads; save a transformers folder (--save DIR) instead")
    if save_type != "source" and header.architecture != "llama":
        gguf_export.refuse_written(header, "save_type", save_type)
    return gguf_export.check_out(save, name="save")


def check_gguf_model(model: torch.nn.Module, source: Any) -> None:
    """Refuse, on a patched weight-free copy of the model (before its weights load), what ``save`` would refuse for
    a GGUF: the RoPE llama.cpp cannot run from the source's architecture (Gemma 3's sliding layers extended, ...)."""
    from posenc.hf import gguf_export

    gguf_export.check_model(model, gguf_export.check_source(source.path))


def save(
    model: torch.nn.Module,
    path: Path,
    *,
    source: Any,
    tokenizer: Any = None,
    config: Any = None,
    tensor_type: str = "source",
    dtype: torch.dtype | None = None,
    check: bool = True,
) -> Path:
    """Write the patched ``model``: a transformers folder (weights in ``dtype``; default the checkpoint's own, from
    ``config``, for a transformers ``source``; a GGUF's: the loaded one) with ``tokenizer``, or a GGUF file when
    ``path`` ends in ``.gguf`` (``posenc.hf.save_gguf`` from the ``source`` file, tensors in ``tensor_type``).
    ``check``: print ``posenc check``'s table of what was written. Returns the path written."""
    from posenc.deploy.source import no_transformers_bars
    from posenc.hf import save_gguf, save_pretrained

    if path.suffix.lower() == ".gguf":
        return save_gguf(model, path, source=source.path, tensor_type=tensor_type, check=check)["path"]
    if dtype is None:
        own = getattr(config, "dtype", None) if source.kind == "transformers" else None
        own = getattr(torch, own, None) if isinstance(own, str) else own
        dtype = own if own in (torch.float16, torch.bfloat16, torch.float32) else None
    with no_transformers_bars():
        return save_pretrained(model, tokenizer, path, dtype=dtype, check=check)
