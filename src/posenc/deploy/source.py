"""The model a deploy starts from: found, read without its weights (config, tokenizer, a meta-device copy, the layer
types a patch changes), then its weights loaded as the source holds them.

``open_pretrained`` checks everything a refusal needs before any weight is read; ``load_weights`` reads them.
"""

from __future__ import annotations

import contextlib
import copy
import json
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from posenc._checks import fail
from posenc.hf.packaged import NAMES, is_name  # is_name: the names load_target takes too


def model_error(model: str, why: str) -> None:
    """The refusal of a ``model`` that names no model, saying ``why`` and what a model is."""
    fail(
        "model",
        model,
        f"a model ({why}): a .gguf file or a folder holding one, a transformers folder (config.json with a "
        f"'model_type', its weights and tokenizer), a name ({', '.join(NAMES)}), a `posenc lab` run folder "
        "(config.json with a 'model' section and checkpoint.safetensors), or 'new' / 'new:alibi' with --task passkey",
    )


def is_lab_run(folder: Path) -> bool:
    """A ``posenc lab`` run folder: ``config.json`` with a ``"model"`` section and ``checkpoint.safetensors``."""
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and "model" in config and (folder / "checkpoint.safetensors").is_file()


def is_hf_folder(folder: Path) -> bool:
    """A transformers folder: ``config.json`` with a ``"model_type"``."""
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and "model_type" in config


def study_runs(folder: Path) -> list[Path]:
    """The lab runs of a ``posenc lab`` study folder (``study.json`` and ``runs/<encoding>/``); [] for any other."""
    if not (folder / "study.json").is_file() or not (folder / "runs").is_dir():
        return []
    return sorted(run for run in (folder / "runs").iterdir() if is_lab_run(run))


def patch_layer_types(layer_type: str | None, config: Any, label: str) -> tuple[str | None, ...]:
    """The layer types ``extend_context`` is called for: ``(None,)`` for one RoPE (or ALiBi) for all layers; for
    per-layer-type RoPE (Gemma 3) ``full_attention`` by default (as Gemma 3's own long-context configs scale only
    those: the sliding layers see at most a window), the one named, or every type for ``all``."""
    params = getattr(config, "rope_parameters", None)
    nested = sorted(k for k, v in params.items() if isinstance(v, Mapping)) if isinstance(params, Mapping) else []
    if not nested:
        if layer_type is not None:
            fail(
                "layer_type",
                layer_type,
                f"no --layer-type: {label} has one positional encoding for all its layers (no per-layer-type RoPE)",
            )
        return (None,)
    if layer_type is None:
        if "full_attention" in nested:
            return ("full_attention",)
        fail("layer_type", None, f"one of {nested} or 'all' (the layer types of {label}; none is 'full_attention')")
    if layer_type == "all":
        return tuple(nested)
    if layer_type not in nested:
        fail("layer_type", layer_type, f"one of {nested} or 'all', the layer types of {label}")
    return (layer_type,)


def load_tokenizer(source: Any) -> Any:
    """The model's tokenizer alone, offline, as ``posenc.hf.load_causal_lm`` builds it (no weight read)."""
    from transformers import AutoTokenizer

    if source.kind == "transformers":
        return AutoTokenizer.from_pretrained(source.folder, local_files_only=True)
    from posenc.gguf import llama as gguf_llama
    from posenc.gguf.header import read_gguf_header
    from posenc.hf.gguf_tokenizer import gguf_tokenizer

    llama = gguf_llama.handles(read_gguf_header(source.path))
    return gguf_tokenizer(source.path, kind="TokenizersBackend" if llama else "AutoTokenizer")


def meta_model(config: Any) -> torch.nn.Module:
    """The model on the meta device (no memory, no weights), its rotary modules real so that ``extend_context`` can
    patch and verify them: the same patch as on the loaded model, before the load."""
    from transformers import AutoModelForCausalLM

    from posenc.hf._rope_patch import rotary_modules

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(copy.deepcopy(config))
    for name, module in rotary_modules(model):
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, child, type(module)(model.config))
    return model


def layer_count(config: Any) -> int:
    """The decoder's layers (a composite config's text model's)."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    return int(text.num_hidden_layers)


@contextlib.contextmanager
def no_transformers_bars() -> Iterator[None]:
    """transformers' own tqdm bars (loading weights, writing shards) off: the caller prints its own progress."""
    from transformers.utils import logging as hf_logging

    was = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was:
            hf_logging.enable_progress_bar()


@dataclass
class Pretrained:
    """A pretrained model read without its weights: ``source`` (``posenc.hf.ModelSource``), its ``config``,
    ``tokenizer``, the layer types a patch changes (``patch_types``), the original context, the attention
    implementation the weights load with (``attn``), and ``name`` in words (``LlamaForCausalLM (llama) from ...``)."""

    source: Any
    config: Any
    tokenizer: Any
    patch_types: tuple[str | None, ...]
    original_len: int
    attn: str | None
    name: str

    @property
    def model_type(self) -> str:
        return str(self.config.model_type)


def open_pretrained(model: str, *, layer_type: str | None = None, original_len: int | None = None) -> Pretrained:
    """``model`` (a ``.gguf`` file or a folder holding one, a transformers folder, ``smollm2``) read without its
    weights: everything a refusal needs.

    Raises:
        ValueError: no such model, a ``posenc lab`` run or study folder (a lab model has no format to write), a
            folder holding no model, a tokenizer that does not load, a ``layer_type`` the model does not have, no
            original context in its config and none given.
    """
    from posenc.hf import load_config, original_context, resolve_model

    path = Path(model).expanduser()
    if path.is_dir():
        if is_lab_run(path):
            fail("model", model, "a pretrained model (a .gguf file, a transformers folder, smollm2); a lab model has "
                 "no format to export to")
        runs = ", ".join(map(str, study_runs(path)))
        if runs:
            model_error(model, f"this is a posenc lab study folder; pass one of its runs: {runs}")
        if not is_hf_folder(path) and not any(p.suffix.lower() == ".gguf" for p in path.iterdir()):
            model_error(model, "this folder holds none of them")
    elif not path.exists() and not is_name(model):
        model_error(model, "no such file or folder")
    source = resolve_model(model)  # GGUF header checks: format, truncation, architecture
    config = load_config(source)
    label = source.label
    patch_types = patch_layer_types(layer_type, config, label)
    try:
        tokenizer = load_tokenizer(source)
    except (OSError, ValueError) as err:
        model_error(model, f"its tokenizer could not be loaded: {err}")
    meta = meta_model(config)
    attn = "sdpa" if getattr(type(meta), "_supports_sdpa", False) else None
    if original_len is None:
        try:
            original_len = original_context(source, layer_type=patch_types[0])
        except ValueError:
            fail("original_len", None, f"the context {label} was trained for (its config has none): --original-len")
    name = f"{type(meta).__name__} ({config.model_type}) from {label}"
    return Pretrained(source, config, tokenizer, patch_types, original_len, attn, name)


def load_weights(source: Any, *, device: str, dtype: torch.dtype, attn: str | None) -> Any:
    """The weights (a transformers ``PreTrainedModel``), as ``posenc.hf.load_causal_lm`` reads them (transformers'
    bars off), RoPE tables kept in float32; no forward runs on them here, so its note on the dtype's speed is not
    shown."""
    from posenc.hf import keep_rope_float32, load_causal_lm

    with no_transformers_bars(), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"load_causal_lm\(dtype=")  # its speed: no forward runs here
        model, _ = load_causal_lm(source, device=device, dtype=dtype, attn_implementation=attn, tokenizer=False)
    keep_rope_float32(model)
    return model
