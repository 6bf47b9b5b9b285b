"""``save_pretrained``: write a (context-extended) transformers model and its tokenizer as a transformers folder.

A frequency method's folder loads back with ``AutoModelForCausalLM.from_pretrained(out_dir)`` and carries the
extension in its ``config.json``; a remapping method is written only where a serving engine has a key for it
(``dca_vllm`` as ``dual_chunk_attention_config``), DroPE only in posenc's record, the rest refused: ``save_pretrained``.
The caller's model is never changed: the copy shares its parameters (same dtype) or holds converted ones
(``_copy_for_saving``).
"""

from __future__ import annotations

import copy
import json
import os
import warnings
from pathlib import Path
from typing import Any, cast

import torch

from posenc._checks import fail
from posenc._files import check_new_path, writing_folder
from posenc._save_check import print_check
from posenc.hf import _record
from posenc.hf._serving import DCA_SERVED_MODEL_TYPES, rebuild_advice, remap_save_problem


def _copy_for_saving(model: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """A copy of ``model`` with its parameters in ``dtype`` (shared when already so), its own config without
    ``quantization_config``, and no ``hf_quantizer``. Buffers are copied as they are (RoPE's float32 ``inv_freq``
    stays float32; it is rebuilt from the config on load anyway).

    Two things the plain ``model.save_pretrained`` gets in the way of: a model transformers loaded from GGUF keeps
    ``config.quantization_config`` and ``model.hf_quantizer``, and refuses to save although its weights are plain
    floats (both are dropped on this copy, the caller's model keeps them); a float32 model saves as float32 (517 MB for
    SmolLM2-135M), ``dtype=torch.bfloat16`` saves half that.
    """
    memo: dict[int, Any] = {}
    for p in model.parameters():  # tied weights are one parameter: converted once, still tied in the copy
        memo[id(p)] = p if p.dtype == dtype else torch.nn.Parameter(p.detach().to(dtype), p.requires_grad)
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is not None:
        memo[id(quantizer)] = None
    clone: Any = copy.deepcopy(model, memo)  # a transformers PreTrainedModel
    if hasattr(clone.config, "quantization_config"):
        del clone.config.quantization_config
    clone.hf_quantizer = None
    return clone


class ServedOnlyWarning(UserWarning):
    """A saved folder runs its extension in serving engines only: transformers loads it as the unextended model."""


class PosencOnlyWarning(UserWarning):
    """A saved folder's extension is in posenc's record alone (DroPE): ``posenc.hf.load_causal_lm`` re-applies it;
    transformers, vLLM, SGLang and llama.cpp load the model without it."""


def remap_config(model: torch.nn.Module) -> dict[str, int] | None:
    """The config block that records a model's remapping method: Dual Chunk Attention in vLLM's form as
    ``dual_chunk_attention_config`` (the keys vLLM reads for Qwen2/Qwen3 and SGLang for Qwen2, as Qwen2.5-1M ships it:
    ``chunk_size``, ``local_size``, ``original_max_position_embeddings``); None for a model without one. Anything
    else raises, naming why (``remap_save_problem``) and the calls that rebuild the model after loading."""
    remap = getattr(model, "_posenc_remap", None)
    if remap is None:
        return None
    method = remap.method
    problem = remap_save_problem(model.config, method, remap.encoding)
    if problem is None:
        return {
            "chunk_size": method.chunk_size,
            "local_size": method.local_window,
            "original_max_position_embeddings": method.original_max_position_embeddings,
        }
    fail(
        "model",
        f"patched with {method.name} ({method!r})",
        f"a model whose extension a saved config runs as posenc measures it (frequency methods; 'dca_vllm' on "
        f"{list(DCA_SERVED_MODEL_TYPES)}): {problem}. {rebuild_advice(model)}",
    )
    raise AssertionError  # unreachable


def _check_alibi(model: torch.nn.Module) -> None:
    """ALiBi's slope interpolation is a forward hook: no config key records it, so a save would reload as the
    unextended model (MPT: claiming the longer ``max_seq_len``)."""
    if getattr(model, "_posenc_alibi_factor", None) is None:
        return
    fail(
        "model",
        f"{type(model).__name__} with interpolated ALiBi slopes",
        f"a model whose extension a saved config runs as posenc measures it: no config key records ALiBi's slope "
        f"interpolation (transformers would load the unextended model). {rebuild_advice(model)}",
    )


def save_pretrained(
    model: torch.nn.Module,
    tokenizer: Any,
    out_dir: str | os.PathLike,
    *,
    dtype: torch.dtype | str | None = None,
    check: bool = True,
) -> Path:
    """Write ``model`` (its weights as safetensors, config, generation config) and ``tokenizer`` into a new folder.

    A frequency method's folder carries the extension in its ``config.json`` (``rope_parameters``,
    ``max_position_embeddings``; ``rope_scaling`` and ``rope_theta`` beside them for transformers 4,
    ``with_v4_rope_keys``), so anything that reads transformers folders runs the extended model. Remapping methods have
    no such key: Dual Chunk Attention in vLLM's form (``dca_vllm``) on Qwen2/Qwen3 is written as
    ``dual_chunk_attention_config``, which vLLM's Qwen2/Qwen3 and SGLang's Qwen2 model files read (SGLang's Qwen3 does
    not; ``posenc check`` prints what each runtime runs) and transformers ignores (a ``ServedOnlyWarning`` says so:
    ``posenc.hf.load_causal_lm(out_dir)`` re-applies it, as does the ``extend_context`` call the warning names after a
    plain transformers load); every other remapping method (ChunkLlama's DCA included, which those engines would run
    with another logit factor) and ALiBi's slope interpolation (a forward hook) are refused, naming every
    ``extend_context`` call made since the model was loaded, in order, so that saving the model as loaded and making
    them again rebuilds it. ``config.json`` records those calls under the key ``"posenc"`` (``posenc.hf._record``).
    Once written, the folder is checked as ``posenc check`` checks it and the table printed (``check=True``;
    ``posenc.runtimes.check``).

    DroPE has no config key anywhere (transformers' Llama-family configs, vLLM and llama.cpp all rotate every layer of
    these architectures): its folder holds the model's weights, reloads with RoPE in plain transformers, and is run as
    DroPE by ``posenc.hf.load_causal_lm`` alone, from the record; a ``PosencOnlyWarning`` says so.

    Args:
        model: a transformers model, e.g. one ``posenc.hf.extend_context`` patched (its extension is in its config).
        tokenizer: its tokenizer (None to save the model alone).
        out_dir: a folder that does not exist yet, or is empty.
        dtype: the saved weights' dtype (``torch.bfloat16`` or ``"bfloat16"``, float16, float32, float64); default
            the model's.
        check: print, once the folder is written, what transformers, vLLM, SGLang and llama.cpp will run from it
            against what posenc measured (``posenc check``'s table; milliseconds, nothing more is read than
            ``config.json``). ``posenc.runtimes.check.check(out_dir)`` returns the same rows.

    Returns:
        ``out_dir`` as a Path.

    ``out_dir`` appears whole or not at all: the files are written into a hidden folder beside it, renamed into
    place once complete (an interrupted save leaves nothing, not even the parent folders it created).

    Raises:
        ValueError: ``out_dir`` is a file, a non-empty folder (posenc never overwrites files) or under a file,
            ``model`` is not a transformers model, an unknown ``dtype``, or a model patched with a remapping method
            no saved config runs as measured (``remap_save_problem``) or with ALiBi slope interpolation.
    """
    from posenc.hf.load import as_dtype

    if not isinstance(model, torch.nn.Module) or not hasattr(model, "save_pretrained"):
        fail("model", type(model).__name__, "a transformers model (with save_pretrained)")
    out = Path(out_dir).expanduser()
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        fail("out_dir", str(out), "a new or empty folder (posenc never overwrites files)")
    check_new_path("out_dir", out)
    target = cast(torch.dtype, model.dtype) if dtype is None else as_dtype(dtype)
    _check_alibi(model)
    remap = remap_config(model)  # refuses a remapping method no config format records, before anything is written
    record = _record.config_record(model)
    clone: Any = _copy_for_saving(model, target)  # a transformers PreTrainedModel
    if getattr(clone, "_posenc_remap", None) is not None:
        from posenc.hf._remap_patch import remove_remap

        remove_remap(clone)  # the copy saves as the model it is; the block below is what serving engines run
    from posenc.hf._drope_patch import dropped, remove_drope

    drope = dropped(clone)
    if drope:
        remove_drope(clone)  # its own save_pretrained again; the record set below keeps DroPE for load_causal_lm
    if record is None:
        clone.config.__dict__.pop(_record.CONFIG_KEY, None)  # a reloaded folder's record no longer holds
    else:
        setattr(clone.config, _record.CONFIG_KEY, record)  # the whole record, what was removed above included
    if drope:
        warnings.warn(
            f"{out}: only posenc.hf.load_causal_lm({str(out)!r}) runs this folder as DroPE (from the 'posenc' record "
            "in its config.json): no config key of transformers, vLLM, SGLang or llama.cpp drops RoPE in every layer "
            f"of {clone.config.model_type}, so they load it with RoPE, a model posenc did not measure (after loading "
            f"it with transformers, call {_record.reapply(model)})",
            PosencOnlyWarning,
            stacklevel=2,
        )
    if remap is not None:
        clone.config.dual_chunk_attention_config = remap
        warnings.warn(
            f"{out}: only serving engines run this folder with Dual Chunk Attention (dual_chunk_attention_config, as "
            "posenc measured it: vLLM's Qwen2/Qwen3 and SGLang's Qwen2 read it; posenc check says what each runs); "
            "transformers ignores that key and loads it as the unextended model with "
            f"max_position_embeddings {clone.config.max_position_embeddings}: load it with "
            f"posenc.hf.load_causal_lm({str(out)!r}), which re-applies it, or after loading it with transformers "
            f"call {_record.reapply(model)}",
            ServedOnlyWarning,
            stacklevel=2,
        )
    with writing_folder(out) as partial:
        clone.save_pretrained(partial)
        config_file = Path(partial) / "config.json"
        config = with_v4_rope_keys(json.loads(config_file.read_text()))
        config_file.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")  # as transformers writes it
        if tokenizer is not None:
            tokenizer.save_pretrained(partial)
    if check:
        print_check(out)
    return out


#: The rope types transformers 4.x (``modeling_rope_utils`` up to 4.57) computes from ``rope_scaling``.
V4_ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "longrope", "llama3")


def with_v4_rope_keys(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` (a ``config.json`` dict transformers 5 wrote) with the keys transformers 4 reads instead of
    ``rope_parameters`` -- ``rope_theta``, ``rope_scaling`` (None for plain RoPE) and ``partial_rotary_factor`` --
    set to what ``rope_parameters`` says, so a stack pinned to transformers 4 (or a converter reading the old keys)
    runs the same RoPE; transformers 5 reads the pair as one (``posenc.runtimes.transformers``). A top-level
    ``original_max_position_embeddings`` of a YaRN, LongRoPE or Llama 3 config is written inside both dicts too
    (where they hold another value or none), so llama.cpp's converter reads it under transformers 4 and 5 alike.
    Left as it is: a config with per-layer-type ``rope_parameters`` (Gemma 3/4: transformers 4 had other keys for
    them), or a rope type transformers 4 did not know."""
    params = config.get("rope_parameters")
    if not isinstance(params, dict) or "rope_type" not in params or params["rope_type"] not in V4_ROPE_TYPES:
        return config
    out = dict(config)
    top = config.get("original_max_position_embeddings")
    if params["rope_type"] in ("yarn", "longrope", "llama3") and top is not None:
        # transformers 5 runs the top-level key (Phi-3's rule) but AutoConfig.to_dict(), which llama.cpp's converter
        # reads, holds max_position_embeddings in the dict where it lacks the key: written inside, both read one value
        params = {**params, "original_max_position_embeddings": top}
        out["rope_parameters"] = params
    if params.get("rope_theta") is not None:
        out["rope_theta"] = params["rope_theta"]
    scaling = {k: v for k, v in params.items() if k not in ("rope_theta", "partial_rotary_factor")}
    out["rope_scaling"] = None if params["rope_type"] == "default" else scaling
    if params.get("partial_rotary_factor") is not None:
        out["partial_rotary_factor"] = params["partial_rotary_factor"]
    return out
