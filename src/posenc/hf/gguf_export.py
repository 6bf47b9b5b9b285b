"""``save_gguf``: write a (context-extended, possibly fine-tuned) model as a GGUF file llama.cpp runs as measured.

The model must come from a GGUF (``source``) of an architecture posenc writes (``posenc.gguf.rope.WRITES``: Llama,
Qwen2, Gemma 3): its metadata -- tokenizer, chat template, ``general.*`` -- is carried over, and its RoPE keys are
replaced by the model's (``posenc.gguf.rope.to_gguf``: context length, base, ``rope.scaling.*``, Llama's
``rope_freqs`` / LongRoPE factor tensors, checked against transformers' frequencies; Gemma 3: the full-attention
layers', its sliding layers left as llama.cpp runs them, unscaled), plus posenc's exact record of the config
(``posenc.rope``). Weights:

- unchanged from the source (every tensor equal to the source's, dequantized -- as transformers' GGUF loader does
  for Qwen2 and Gemma 3, whose norms it shifts by -1): the source's tensors are copied byte for byte, whatever their
  type (K-quants included), as ``gguf``'s ``gguf_new_metadata`` script copies a file;
- changed (fine-tuned), or a ``tensor_type`` asked for (Llama only): written from the model, each 2-D weight in the
  source's type (re-quantized with ``gguf.quants``) or in ``tensor_type`` (``F32``, ``F16``, ``BF16``, ``Q8_0``,
  ``Q4_0``, ``Q4_1``, ``Q5_0``, ``Q5_1``); vectors (norms) in F32, as llama.cpp's converter writes them; query and
  key rows permuted back to llama.cpp's interleaved pairs. For Qwen2 and Gemma 3 this is refused: their sources are
  K-quants, which ``gguf`` cannot quantize, and their converters' tensor transforms are not rebuilt here.

The file itself is written by ``posenc.gguf.write`` (atomically: no partial file remains, nothing is overwritten).
transformers' own GGUF loader does not read ``rope.scaling.*`` for these architectures (only for gpt-oss,
transformers 5): it loads the exported file's weights and tokenizer with the unscaled RoPE. ``posenc.hf.load_causal_lm``
reads it whole (Llama: its keys; Qwen2, Gemma 3: its ``posenc.rope`` record, where the keys still say the same).

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
#: The same fields for the other architectures, as the header's keys (``{arch}.<key>``) that hold them.
_SAME_KEYS = (("hidden_size", "embedding_length"), ("num_hidden_layers", "block_count"),
              ("num_attention_heads", "attention.head_count"), ("num_key_value_heads", "attention.head_count_kv"),
              ("intermediate_size", "feed_forward_length"))
#: GGUF architecture -> the transformers ``model_type`` of a model loaded from it (``posenc.hf.load``).
_MODEL_TYPES = {"llama": "llama", "qwen2": "qwen2", "gemma3": "gemma3_text"}

def check_source(source: str | os.PathLike) -> Any:
    """The source's header, if posenc writes GGUFs from it: a Llama GGUF posenc's loader reads (byte-level BPE), a
    Qwen2 or Gemma 3 GGUF.

    Raises:
        ValueError: naming ``source`` and what is written instead.
    """
    from posenc.hf.load import resolve_model

    resolved = resolve_model(source)
    if resolved.kind != "gguf":
        fail(
            "source",
            str(source),
            "a GGUF file (its tokenizer and metadata are carried over); a transformers folder converts with "
            "llama.cpp's convert_hf_to_gguf.py, which writes the RoPE scaling of its config.json (posenc's --save "
            "DIR writes that folder)",
        )
    return write.check_header(resolved.path)


def check_model(model: torch.nn.Module, header: Any = None) -> Any:
    """Refuse what llama.cpp cannot run from a GGUF (a remapping method, dynamic NTK, YaRN's other betas, Gemma 3's
    sliding layers extended, ...), naming what it would need instead; returns the ``GGUFRope`` otherwise.

    ``header``: the source's (``check_source``), whose architecture the model must have and, for Gemma 3, whose
    sliding-layer base (``rope.freq_base_swa``) and pattern llama.cpp runs; None: a Llama source."""
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
    arch = "llama" if header is None else header.architecture
    want = _MODEL_TYPES.get(arch)
    if getattr(config, "model_type", None) != want:
        fail("model", getattr(config, "model_type", type(model).__name__),
             f"a model of the source's architecture {arch!r} (model_type {want!r}: the model loaded from it)")
    meta = {} if header is None else header.metadata
    base_swa = float(meta.get(f"{arch}.rope.freq_base_swa", rope.GEMMA3_BASE_SWA))
    if arch in rope.LAYER_TYPES:
        _check_pattern(config, meta, arch)
    return rope.to_gguf(config, arch=arch, sliding_base=base_swa)


def _check_pattern(config: Any, meta: Any, arch: str) -> None:
    """Refuse a per-layer-type model whose layer types are not the sliding pattern llama.cpp reads from the file."""
    types = list(getattr(config, "layer_types", None) or [])
    n = int(meta.get(f"{arch}.block_count", len(types)))
    swa = rope.sliding_layers(meta, arch, n)
    sliding = rope.LAYER_TYPES[arch][1]
    differ = [il for il, (t, s) in enumerate(zip(types, swa, strict=False)) if (t == sliding) != s]
    if len(types) != n or differ:
        fail("model", f"layer_types of {len(types)} layers",
             f"the sliding pattern llama.cpp runs from the source's keys ({n} layers, full ones at "
             f"{[il for il, s in enumerate(swa) if not s]}; differing at layers {differ}): the file would run other "
             "layers as sliding than the model")


def _check_same_architecture(model: torch.nn.Module, source_config: Any, path: Any) -> None:
    for name in _SAME:
        ours, theirs = getattr(model.config, name, None), getattr(source_config, name, None)
        if ours != theirs:
            fail("source", str(path), f"the GGUF the model was loaded from ({name}: model {ours}, file {theirs})")


def _check_same_keys(model: torch.nn.Module, header: Any) -> None:
    """The model's shape fields against the source header's keys (a Qwen2 or Gemma 3 file)."""
    config: Any = model.config
    for name, key in _SAME_KEYS:
        ours, theirs = getattr(config, name, None), header.arch_value(key)
        if theirs is not None and ours != theirs:
            fail("source", str(header.path), f"the GGUF the model was loaded from ({name}: model {ours}, file "
                 f"{header.architecture}.{key} {theirs})")


def _unchanged_as_loaded(model: torch.nn.Module, header: Any) -> bool:
    """Whether every weight of the model equals the source's tensor as transformers' GGUF loader reads it
    (``load_gguf_checkpoint``: ``gguf`` dequantization, the architecture's ``TENSOR_PROCESSORS`` entry -- Gemma's
    norms minus 1 --, its name map): one tensor at a time, stopping at the first that differs; a model weight the file
    does not hold (but a tied head) is a change too."""
    import mmap

    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor, get_gguf_hf_weights_map

    processor = TENSOR_PROCESSORS.get(header.architecture, TensorProcessor)(config={})
    names = get_gguf_hf_weights_map(model, processor)
    ours = model.state_dict()
    seen = set()
    with header.path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        for tensor in header.tensors:
            values = llama.dequantize(buf, tensor).numpy()
            result = processor.process(weights=values, name=tensor.name, tensor_key_mapping=names,
                                       parsed_parameters={"config": {}, "tensors": {}})
            name = names.get(result.name)
            if name is None:
                continue
            if name not in ours or not torch.equal(ours[name].cpu(), torch.from_numpy(result.weights).to(
                    ours[name].dtype)):
                return False
            seen.add(name)
    tied = bool(getattr(model.config, "tie_word_embeddings", False))
    return all(k in seen or (tied and k == "lm_head.weight") for k in ours)


def refuse_written(header: Any, name: str, value: Any) -> None:
    """Refuse writing tensors into a Qwen2 / Gemma 3 GGUF (``name``: the parameter that asks for it)."""
    fail(name, value,
         f"unchanged weights of the {header.architecture} source, copied as they are (tensor_type 'source'; only "
         f"the RoPE extended): posenc writes new tensors into Llama GGUFs only -- the source's K-quants are types the "
         f"gguf package cannot quantize, and {header.architecture}'s converter transforms (e.g. Gemma's norm + 1) are "
         "not rebuilt here. Save a transformers folder (posenc.hf.save_pretrained, --save DIR) and convert it with "
         "llama.cpp's convert_hf_to_gguf.py (then llama-quantize), which writes its RoPE scaling")


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
        model: a ``LlamaForCausalLM`` (possibly fine-tuned), ``Qwen2ForCausalLM`` or ``Gemma3ForCausalLM`` (weights
            unchanged) loaded from ``source`` (``posenc.hf.load_causal_lm``), extended with a method llama.cpp can
            express (``linear``, ``ntk``, ``yarn``, for Llama also ``llama3``, ``longrope``; or none; Gemma 3: on its
            ``full_attention`` layers only).
        path: the new ``.gguf`` file; it must not exist (its folder is created) and names a file, not a folder (no
            trailing ``/``).
        source: the GGUF the model was loaded from (file, folder holding one, or a name: ``"smollm2"``,
            ``"gemma3-270m"``, ...).
        tensor_type: ``"source"`` (unchanged weights copied as they are, changed ones re-quantized to each tensor's
            source type) or one of ``TENSOR_TYPES`` to write every 2-D weight in (Llama only).
        check: once the file is written, compare what transformers, vLLM, SGLang and llama.cpp run from its header
            with what posenc measured, and print the table (``posenc check``; milliseconds, the header alone).

    Returns:
        ``path``, ``weights`` (``"copied"`` or ``"written"``), ``tensor_types`` (``{"Q4_1": 210, ...}``),
        ``rope`` (the ``GGUFRope`` written), ``bytes``, and ``check``: the rows (``posenc.runtimes.check.Row``; None
        with ``check=False``).

    Raises:
        ValueError: before anything is written: an existing ``path`` or one ending in ``/``, a ``source`` that is
            not a GGUF posenc writes (or not the model's: another architecture), a model patched with a method
            llama.cpp cannot run (naming what it would need instead: e.g. llama-cli's ``--grp-attn-n/--grp-attn-w``
            for Self-Extend; a Gemma 3 extended on its sliding layers, which llama.cpp leaves unscaled), an unknown
            ``tensor_type`` or one ``gguf`` cannot produce for a tensor; a Qwen2 or Gemma 3 model whose weights
            changed, or with a ``tensor_type`` other than ``"source"``.
    """
    check_choice("tensor_type", tensor_type, TENSOR_TYPES)
    out = check_out(path)
    header = check_source(source)
    new_rope = check_model(model, header)
    if header.architecture == "llama":
        source_config = llama.llama_config(header)
        _check_same_architecture(model, source_config, header.path)
        llama.tensor_names(header, source_config)  # a file the loader refuses is refused here too, whatever is written
        copy = tensor_type == "source" and _unchanged(model, header, source_config)
        tensors = None if copy else write.quantized(_gguf_weights(model), header, tensor_type)
    else:
        _check_same_keys(model, header)
        if tensor_type != "source":
            refuse_written(header, "tensor_type", tensor_type)
        if not _unchanged_as_loaded(model, header):
            refuse_written(header, "model", "with weights that differ from its source's (fine-tuned)")
        copy, tensors = True, None
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
