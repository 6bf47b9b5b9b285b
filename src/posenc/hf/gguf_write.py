"""``save_gguf``: write a (context-extended, possibly fine-tuned) Llama model as a GGUF file llama.cpp runs as measured.

The model must come from a Llama GGUF (``source``): its metadata -- tokenizer, chat template, ``general.*`` -- is
carried over, and its RoPE keys are replaced by the model's (``posenc.hf.gguf_rope.to_gguf``: context length, base,
``rope.scaling.*``, ``rope_freqs`` / LongRoPE factor tensors, checked against transformers' frequencies), plus
posenc's exact record of the config (``posenc.rope``). Weights:

- unchanged from the source (every tensor equal to the source's, dequantized): the source's tensors are copied byte
  for byte, whatever their type (K-quants included), as ``gguf``'s ``gguf_new_metadata`` script copies a file;
- changed (fine-tuned), or a ``tensor_type`` asked for: written from the model, each 2-D weight in the source's type
  (re-quantized with ``gguf.quants``) or in ``tensor_type`` (``F32``, ``F16``, ``BF16``, ``Q8_0``, ``Q4_0``,
  ``Q4_1``, ``Q5_0``, ``Q5_1``); vectors (norms) in F32, as llama.cpp's converter writes them; query and key rows
  permuted back to llama.cpp's interleaved pairs.

Nothing is overwritten and no partial file remains: the file is written under a temporary name in the same folder
and linked to its name only when complete (refused if the name appeared meanwhile); an error or an interruption
removes the temporary file.

transformers' own GGUF loader does not read ``rope.scaling.*`` for Llama (only for gpt-oss, transformers 5): it loads
the exported file's weights and tokenizer with the unscaled RoPE. ``posenc.hf.load_causal_lm`` reads it whole.

Reference: ``gguf-py`` ``scripts/gguf_new_metadata.py`` (``copy_with_new_metadata``); llama.cpp
``convert_hf_to_gguf.py`` (``LlamaModel.permute``, F32 vectors).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch

if TYPE_CHECKING:
    import numpy as np

from posenc._checks import check_choice, fail
from posenc._files import create_temp
from posenc.hf import gguf_llama, gguf_rope

#: Tensor types ``tensor_type`` takes (``gguf.quants`` writes each); ``"source"`` keeps each tensor's source type.
TENSOR_TYPES = ("source", "F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1")
#: ``general.file_type`` (llama.cpp's ``LlamaFileType``) of a file written in one type.
_FILE_TYPES = {"F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q8_0": 7, "Q5_0": 8, "Q5_1": 9, "BF16": 32}
#: Config fields the model must share with its source (the rest of the architecture is in the tensor shapes).
_SAME = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "intermediate_size",
         "vocab_size", "rms_norm_eps", "tie_word_embeddings")  # fmt: skip


def _replaced_keys(arch: str) -> tuple[str, ...]:
    return (f"{arch}.context_length", f"{arch}.rope.freq_base", f"{arch}.rope.scale_linear", gguf_rope.POSENC_KEY)


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
    from posenc.hf.gguf_header import read_gguf_header

    header = read_gguf_header(resolved.path)
    if not gguf_llama.handles(header):
        fail(
            "source",
            str(resolved.path),
            f"a little-endian Llama GGUF with a byte-level BPE vocabulary, the architecture posenc writes (this one "
            f"is {header.architecture!r}, tokenizer {header.metadata.get('tokenizer.ggml.model')!r})",
        )
    return header


def check_out(path: str | os.PathLike, name: str = "path") -> Path:
    """``path`` as the file to write: a ``.gguf`` name that does not exist yet (its folder is created), not ending in
    a path separator (``Path`` drops it: ``x/sub.gguf/`` would write the file ``x/sub.gguf``). Refusals name the
    parameter ``name`` (the CLI's ``save``)."""
    text = os.fspath(path)
    separators = tuple(s for s in (os.sep, os.altsep) if s)
    if isinstance(text, str) and text.endswith(separators):
        fail(name, text, f"a file path (it ends with {text[-1]!r}, which names a folder)")
    out = Path(path).expanduser()
    if out.suffix.lower() != ".gguf":
        fail(name, str(path), "a file name ending in .gguf")
    if out.exists() or out.is_symlink():
        fail(name, str(path), "a file that does not exist yet (posenc never overwrites files)")
    if out.parent.exists() and not out.parent.is_dir():
        fail(name, str(path), f"a file in a folder ({out.parent} is a file)")
    from posenc.hf.save import check_new_path

    check_new_path(name, out)  # a file further up, or a folder this user cannot write in
    return out


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
    return gguf_rope.to_gguf(config)


def _check_same_architecture(model: torch.nn.Module, source_config: Any, path: Path) -> None:
    for name in _SAME:
        ours, theirs = getattr(model.config, name, None), getattr(source_config, name, None)
        if ours != theirs:
            fail("source", str(path), f"the GGUF the model was loaded from ({name}: model {ours}, file {theirs})")


def _unchanged(model: torch.nn.Module, source: dict[str, torch.Tensor]) -> bool:
    """Whether every weight equals the source's, dequantized (in the model's dtype)."""
    ours = model.state_dict()
    return all(k in ours and torch.equal(ours[k].cpu(), w.to(ours[k].dtype)) for k, w in source.items())


def _tensor_name(hf_name: str, names: Any) -> str | None:
    base, _, suffix = hf_name.rpartition(".")
    name = names.get_name(base)
    return None if name is None else f"{name}.{suffix}"


def _model_tensors(model: torch.nn.Module, header: Any, tensor_type: str) -> list[tuple[str, np.ndarray, Any]]:
    """``[(gguf name, data, GGMLQuantizationType)]`` from the model's weights, in the source's order."""
    import gguf
    from gguf.quants import quantize

    config: Any = model.config  # a transformers PretrainedConfig
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, config.num_hidden_layers)
    weights = {}
    for key, value in model.state_dict().items():
        name = _tensor_name(key, names)
        if name is None or (name == "output.weight" and config.tie_word_embeddings):
            continue
        w = value.detach().to("cpu", torch.float32)
        if ".attn_q." in name:
            w = gguf_llama.permute(w, config.num_attention_heads)
        elif ".attn_k." in name:
            w = gguf_llama.permute(w, config.num_key_value_heads)
        weights[name] = w.numpy()
    source_types = {t.name: gguf.GGMLQuantizationType(t.ggml_type) for t in header.tensors}
    out = []
    for name in [t.name for t in header.tensors if t.name in weights]:
        w = weights.pop(name)
        qtype = source_types[name] if tensor_type == "source" else gguf.GGMLQuantizationType[tensor_type]
        if w.ndim == 1:
            qtype = gguf.GGMLQuantizationType.F32
        block = gguf.GGML_QUANT_SIZES[qtype][0]
        if w.shape[-1] % block:
            fail("tensor_type", tensor_type, f"a type whose {block}-value blocks divide {name}'s rows of {w.shape[-1]}")
        try:
            data = w if qtype == gguf.GGMLQuantizationType.F32 else quantize(w, qtype)
        except NotImplementedError:
            fail(
                "tensor_type",
                tensor_type,
                f"a type the gguf package writes ({', '.join(TENSOR_TYPES[1:])}); {name} is {qtype.name} in the "
                f"source, which gguf cannot quantize: pass one of those",
            )
        out.append((name, data, qtype))
    if weights:  # the source lacked a weight the model has (the loader refuses such files; kept as a guard)
        fail("source", str(header.path), f"a GGUF holding every weight of the model (no {sorted(weights)[:3]})")
    return out


def _metadata(reader: Any, rope: Any, record: str, file_type: int | None) -> list[tuple[str, Any, Any, Any]]:
    """``[(key, value, type, sub_type)]``: the source's fields with the RoPE keys (and ``file_type``) replaced."""
    import gguf

    arch = reader.fields["general.architecture"].contents()
    new = {k: (v, gguf.GGUFValueType[kind]) for k, (v, kind) in rope.metadata(arch).items()}
    new[gguf_rope.POSENC_KEY] = (record, gguf.GGUFValueType.STRING)
    if file_type is not None:
        new["general.file_type"] = (file_type, gguf.GGUFValueType.UINT32)
    dropped = (*_replaced_keys(arch), f"{arch}.rope.scaling.")
    out = []
    for field in reader.fields.values():
        name = field.name
        if name == "general.architecture" or name.startswith("GGUF."):  # the writer adds these itself
            continue
        if name in new:
            value, kind = new.pop(name)
            out.append((name, value, kind, None))
        elif not any(name == d or (d.endswith(".") and name.startswith(d)) for d in dropped):
            kind = field.types[0]
            sub = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
            out.append((name, field.contents(), kind, sub))
    out.extend((name, value, kind, None) for name, (value, kind) in new.items())
    return out


def _publish(tmp: Path, out: Path) -> None:
    """Give the finished file its name without replacing a file that appeared meanwhile."""
    try:
        os.link(tmp, out)
    except FileExistsError:
        fail("path", str(out), "a file that does not exist yet (one appeared while writing; posenc never overwrites)")
    except OSError:  # a file system without hard links: check, then rename (a race window of one call)
        if out.exists():
            fail("path", str(out), "a file that does not exist yet (one appeared while writing)")
        os.rename(tmp, out)


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
    import gguf

    check_choice("tensor_type", tensor_type, TENSOR_TYPES)
    out = check_out(path)
    header = check_source(source)
    rope = check_model(model)
    source_config = gguf_llama.llama_config(header)
    _check_same_architecture(model, source_config, header.path)
    weights = gguf_llama.state_dict(header, source_config)
    copy = tensor_type == "source" and _unchanged(model, weights)
    del weights
    reader = gguf.GGUFReader(header.path)
    tensors = None if copy else _model_tensors(model, header, tensor_type)
    file_type = None if tensor_type == "source" else _FILE_TYPES[tensor_type]
    metadata = _metadata(reader, rope, gguf_rope.record(model.config), file_type)
    from posenc.hf.save import removing_created_folders

    with removing_created_folders(out):  # an interrupted write leaves no folder it created
        out.parent.mkdir(parents=True, exist_ok=True)
        _write(out, reader, metadata, rope, tensors, copy)
    types = [t.tensor_type.name for t in reader.tensors if t.name not in gguf_rope.ROPE_TENSORS] if copy else [
        q.name for _, _, q in cast(list, tensors)  # built where not copy
    ]
    types += ["F32"] * len(rope.tensors())
    counts = {t: types.count(t) for t in sorted(set(types))}
    rows = None
    if check:
        from posenc.hf.save import print_check

        rows = print_check(out)
    return {"path": out, "weights": "copied" if copy else "written", "tensor_types": counts, "rope": rope,
            "bytes": out.stat().st_size, "check": rows}  # fmt: skip


def _write(out: Path, reader: Any, metadata: list, rope: Any, tensors: list | None, copy: bool) -> None:
    """The GGUF file, written under a temporary name beside ``out`` and published as ``out`` once complete."""
    import gguf

    fd, tmp_name = create_temp(out)  # the mode a plain open() gives (mkstemp's 0600 would make the model private)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        writer = gguf.GGUFWriter(tmp, reader.fields["general.architecture"].contents(), endianess=reader.endianess)
        writer.data_alignment = reader.alignment
        for name, value, kind, sub in metadata:
            writer.add_key_value(name, value, kind, sub_type=sub)
        if copy:
            kept = [t for t in reader.tensors if t.name not in gguf_rope.ROPE_TENSORS]
            for t in kept:
                writer.add_tensor_info(t.name, t.data.shape, t.data.dtype, t.data.nbytes, t.tensor_type)
        else:
            for name, data, qtype in cast(list, tensors):  # given where not copy
                writer.add_tensor_info(name, data.shape, data.dtype, data.nbytes, qtype)  # uint8: quantized bytes
        extra = rope.tensors()
        for name, data in extra.items():
            writer.add_tensor_info(name, data.shape, data.dtype, data.nbytes, gguf.GGMLQuantizationType.F32)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        if copy:
            for t in kept:
                writer.write_tensor_data(t.data, tensor_endianess=reader.endianess)
        else:
            for _, data, _ in cast(list, tensors):
                writer.write_tensor_data(data)
        for data in extra.values():
            writer.write_tensor_data(data)
        writer.close()
        _publish(tmp, out)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
