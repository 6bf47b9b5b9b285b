"""``save_gguf``: write a (context-extended, possibly fine-tuned) Llama model as a GGUF file llama.cpp runs as measured.

The model must come from a Llama GGUF (``source``): its metadata -- tokenizer, chat template, ``general.*`` -- is
carried over, and its RoPE keys are replaced by the model's (``posenc.gguf.rope.to_gguf``: context length, base,
``rope.scaling.*``, ``rope_freqs`` / LongRoPE factor tensors, checked against transformers' frequencies), plus
posenc's exact record of the config (``posenc.rope``). Weights:

- unchanged from the source (every tensor equal to the source's, dequantized): the source's tensors are copied byte
  for byte, whatever their type (K-quants included), as ``gguf``'s ``gguf_new_metadata`` script copies a file;
- changed (fine-tuned), or a ``tensor_type`` asked for: written from the model, each 2-D weight in the source's type
  (re-quantized with ``gguf.quants``) or in ``tensor_type`` (``F32``, ``F16``, ``BF16``, ``Q8_0``, ``Q4_0``,
  ``Q4_1``, ``Q5_0``, ``Q5_1``); vectors (norms) in F32, as llama.cpp's converter writes them; query and key rows
  permuted back to llama.cpp's interleaved pairs.

The file itself is written by ``posenc.gguf.write`` (atomically: no partial file remains, nothing is overwritten).
transformers' own GGUF loader does not read ``rope.scaling.*`` for Llama (only for gpt-oss, transformers 5): it loads
the exported file's weights and tokenizer with the unscaled RoPE. ``posenc.hf.load_causal_lm`` reads it whole.

Reference: llama.cpp ``convert_hf_to_gguf.py`` (``LlamaModel.permute``).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    import numpy as np

from posenc._checks import check_choice, fail
from posenc._save_check import print_check
from posenc.gguf import llama, rope, write
from posenc.gguf.write import TENSOR_TYPES, check_out

#: Config fields the model must share with its source (the rest of the architecture is in the tensor shapes).
_SAME = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "intermediate_size",
         "vocab_size", "rms_norm_eps", "tie_word_embeddings")

def check_source(source: str | os.PathLike) -> Any:
    """The source's header, if posenc writes GGUFs from it: a Llama GGUF posenc's loader reads (byte-level BPE).

    Raises:
        ValueError: naming ``source`` and what is written instead.
    """
    from posenc.hf.load import resolve_model

    resolved = resolve_model(source)
    if resolved.kind != "gguf":
        fail(
            "source",
            str(source),
            "a Llama GGUF file (its tokenizer and metadata are carried over); a transformers folder converts with "
            "llama.cpp's convert_hf_to_gguf.py, which writes the RoPE scaling of its config.json (posenc's --save "
            "DIR writes that folder)",
        )
    return write.check_header(resolved.path)


def check_model(model: torch.nn.Module) -> Any:
    """Refuse what llama.cpp cannot run from a GGUF (a remapping method, dynamic NTK, YaRN's other betas, ...),
    naming what it would need instead; returns the ``GGUFRope`` otherwise."""
    remap = getattr(model, "_posenc_remap", None)
    if remap is not None:
        method = remap.method
        if method.name == "self_extend":
            instead = (
                f"save the model without it and run llama.cpp's own Self-Extend: llama-cli --grp-attn-n "
                f"{method.group} --grp-attn-w {method.window}"
            )
        else:
            from posenc.hf._serving import rebuild_advice

            instead = f"llama.cpp has no {method.name}. {rebuild_advice(model)}"
            if method.name.startswith("dca"):
                instead += (
                    " (vLLM runs DCA in its form, dca_vllm, from a Qwen2/Qwen3 transformers folder's "
                    "dual_chunk_attention_config)"
                )
        fail("model", f"patched with {method.name}", f"a model whose RoPE a GGUF records: {instead}")
    if model.__dict__.get("_posenc_drope") is not None:
        from posenc.hf._serving import rebuild_advice

        fail(
            "model",
            "patched with drope",
            "a model whose RoPE a GGUF records: llama.cpp has no key that turns RoPE off in every layer (a Llama "
            "file's rope.dimension_count must equal the head dim, 'invalid n_rot' otherwise; its per-layer NoPE step "
            "n_no_rope_layer_step is fixed per architecture, read from no key), so the file would run with RoPE. "
            f"{rebuild_advice(model)}",
        )
    config = getattr(model, "config", None)
    if getattr(config, "model_type", None) != "llama":
        fail("model", getattr(config, "model_type", type(model).__name__), "a Llama model (model_type 'llama')")
    return rope.to_gguf(config)


def _check_same_architecture(model: torch.nn.Module, source_config: Any, path: Any) -> None:
    for name in _SAME:
        ours, theirs = getattr(model.config, name, None), getattr(source_config, name, None)
        if ours != theirs:
            fail("source", str(path), f"the GGUF the model was loaded from ({name}: model {ours}, file {theirs})")


def _unchanged(model: torch.nn.Module, header: Any, source_config: Any) -> bool:
    """Whether every weight equals the source's, dequantized (in the model's dtype): one source tensor at a time,
    stopping at the first that differs."""
    ours = model.state_dict()
    source = llama.weights(header, source_config)
    return all(k in ours and torch.equal(ours[k].cpu(), w.to(ours[k].dtype)) for k, w in source)


def _gguf_weights(model: torch.nn.Module) -> dict[str, np.ndarray]:
    """The model's weights as float32 arrays by GGUF name, query and key rows permuted to llama.cpp's pairs (a tied
    head left out)."""
    import gguf

    config: Any = model.config  # a transformers PretrainedConfig
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, config.num_hidden_layers)
    weights = {}
    for key, value in model.state_dict().items():
        name = write.tensor_name(key, names)
        if name is None or (name == "output.weight" and config.tie_word_embeddings):
            continue
        w = value.detach().to("cpu", torch.float32)
        if ".attn_q." in name:
            w = llama.permute(w, config.num_attention_heads)
        elif ".attn_k." in name:
            w = llama.permute(w, config.num_key_value_heads)
        weights[name] = w.numpy()
    return weights


def save_gguf(
    model: torch.nn.Module,
    path: str | os.PathLike,
    *,
    source: str | os.PathLike,
    tensor_type: str = "source",
    check: bool = True,
) -> dict[str, Any]:
    """Write ``model`` as a GGUF file that llama.cpp runs with the model's RoPE (scaling included).

    Args:
        model: a ``LlamaForCausalLM`` loaded from ``source`` (``posenc.hf.load_causal_lm``), extended with a method
            llama.cpp can express (``linear``, ``ntk``, ``yarn``, ``llama3``, ``longrope``, or none) and possibly
            fine-tuned.
        path: the new ``.gguf`` file; it must not exist (its folder is created) and names a file, not a folder (no
            trailing ``/``).
        source: the Llama GGUF the model was loaded from (file, folder holding one, or ``"smollm2"``).
        tensor_type: ``"source"`` (unchanged weights copied as they are, changed ones re-quantized to each tensor's
            source type) or one of ``TENSOR_TYPES`` to write every 2-D weight in.
        check: once the file is written, compare what transformers, vLLM, SGLang and llama.cpp run from its header
            with what posenc measured, and print the table (``posenc check``; milliseconds, the header alone).

    Returns:
        ``path``, ``weights`` (``"copied"`` or ``"written"``), ``tensor_types`` (``{"Q4_1": 210, ...}``),
        ``rope`` (the ``GGUFRope`` written), ``bytes``, and ``check``: the rows (``posenc.runtimes.check.Row``; None
        with ``check=False``).

    Raises:
        ValueError: before anything is written: an existing ``path`` or one ending in ``/``, a ``source`` that is
            not a Llama GGUF posenc writes (or not the model's: another architecture), a model patched with a method
            llama.cpp cannot run (naming what it would need instead: e.g. llama-cli's ``--grp-attn-n/--grp-attn-w``
            for Self-Extend), an unknown ``tensor_type`` or one ``gguf`` cannot produce for a tensor.
    """
    check_choice("tensor_type", tensor_type, TENSOR_TYPES)
    out = check_out(path)
    header = check_source(source)
    new_rope = check_model(model)
    source_config = llama.llama_config(header)
    _check_same_architecture(model, source_config, header.path)
    llama.tensor_names(header, source_config)  # a file the loader refuses is refused here too, whatever is written
    copy = tensor_type == "source" and _unchanged(model, header, source_config)
    tensors = None if copy else write.quantized(_gguf_weights(model), header, tensor_type)
    record = rope.record(model.config)
    fields = write.metadata(write.full_header(header), new_rope, record, write.file_type(tensor_type))
    write.write(out, header, fields, new_rope, tensors)  # an interrupted write leaves no folder it created
    counts = write.tensor_types(header, new_rope, tensors)
    rows = print_check(out) if check else None
    return {
        "path": out,
        "weights": "copied" if copy else "written",
        "tensor_types": counts,
        "rope": new_rope,
        "bytes": out.stat().st_size,
        "check": rows,
    }
