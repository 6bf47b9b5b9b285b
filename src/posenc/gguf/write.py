"""Writing a GGUF file from a source GGUF: the source's metadata with new RoPE keys, its tensors copied byte for byte
(Llama, Qwen2, Gemma 3) or new ones quantized with ``gguf.quants`` (Llama), written atomically. What a loaded model
contributes (its RoPE, its weights as numpy arrays) is ``posenc.hf.save_gguf``'s part (``posenc.hf.gguf_export``).

Nothing is overwritten and no partial file remains: the file is written under a temporary name in the same folder
and linked to its name only when complete (refused if the name appeared meanwhile); an error or an interruption
removes the temporary file.

Reference: ``gguf-py`` ``scripts/gguf_new_metadata.py`` (``copy_with_new_metadata``); llama.cpp
``convert_hf_to_gguf.py`` (F32 vectors).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

from posenc._checks import fail
from posenc._files import check_new_path, create_temp, removing_created_folders
from posenc.gguf import llama, rope

#: Tensor types ``tensor_type`` takes (``gguf.quants`` writes each); ``"source"`` keeps each tensor's source type.
TENSOR_TYPES = ("source", "F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1")
#: ``general.file_type`` (llama.cpp's ``LlamaFileType``) of a file written in one type.
_FILE_TYPES = {"F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q8_0": 7, "Q5_0": 8, "Q5_1": 9, "BF16": 32}


def file_type(tensor_type: str) -> int | None:
    """``general.file_type`` of a file written in ``tensor_type`` (one of ``TENSOR_TYPES``); None for ``"source"``
    (the source's is kept)."""
    return None if tensor_type == "source" else _FILE_TYPES[tensor_type]


def _replaced_keys(arch: str) -> tuple[str, ...]:
    return (f"{arch}.context_length", f"{arch}.rope.freq_base", f"{arch}.rope.scale_linear", rope.POSENC_KEY)


def check_header(path: str | os.PathLike) -> Any:
    """The header of the GGUF file ``path``, if posenc writes GGUFs from it: a little-endian Llama GGUF posenc's
    loader reads (byte-level BPE), Qwen2 or Gemma 3 one (``posenc.gguf.rope.WRITES``; their tensors are copied, their
    tokenizer metadata carried over whatever its kind).

    Raises:
        ValueError: naming ``source`` and what is written instead.
    """
    from posenc.gguf.header import read_gguf_header

    header = read_gguf_header(path)
    other = header.architecture in rope.WRITES and header.architecture != "llama" and header.byte_order == "<"
    if not (llama.handles(header) or other):
        fail(
            "source",
            str(path),
            f"a little-endian GGUF of an architecture posenc writes: llama with a byte-level BPE vocabulary, "
            f"{', '.join(a for a in rope.WRITES if a != 'llama')} (this one is {header.architecture!r}, tokenizer "
            f"{header.metadata.get('tokenizer.ggml.model')!r}, {'little' if header.byte_order == '<' else 'big'}-"
            f"endian)",
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
    check_new_path(name, out)  # a file further up, or a folder this user cannot write in
    return out


def tensor_name(hf_name: str, names: Any) -> str | None:
    """The GGUF name of the transformers weight ``hf_name`` (``gguf.get_tensor_name_map``'s ``names``); None for a
    weight GGUF files do not hold."""
    base, _, suffix = hf_name.rpartition(".")
    name = names.get_name(base)
    return None if name is None else f"{name}.{suffix}"


def quantized(weights: dict[str, np.ndarray], header: Any, tensor_type: str) -> list[tuple[str, np.ndarray, Any]]:
    """``[(gguf name, data, GGMLQuantizationType)]``, in the source's order, from float32 ``weights`` by GGUF name
    (emptied): each 2-D weight in the source's type or ``tensor_type``, vectors (norms) in F32."""
    import gguf
    from gguf.quants import quantize

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


def full_header(header: Any) -> Any:
    """``header`` (``check_header``'s) read again with every string array (the vocabulary, the merges), as
    ``metadata`` carries them over."""
    from posenc.gguf.header import GGUFArray, read_gguf_header

    return read_gguf_header(header.path, arrays=[k for k, v in header.metadata.items() if isinstance(v, GGUFArray)])


def _value_type(name: str) -> Any:
    import gguf

    return gguf.GGUFValueType[name.upper()]


def metadata(header: Any, new_rope: Any, record: str, file_type: int | None) -> list[tuple[str, Any, Any, Any]]:
    """``[(key, value, type, sub_type)]``: the source's fields (``full_header``) with the RoPE keys (and
    ``file_type``) replaced."""
    import gguf

    arch = header.architecture
    new = {k: (v, gguf.GGUFValueType[kind]) for k, (v, kind) in new_rope.metadata(arch).items()}
    new[rope.POSENC_KEY] = (record, gguf.GGUFValueType.STRING)
    if file_type is not None:
        new["general.file_type"] = (file_type, gguf.GGUFValueType.UINT32)
    dropped = (*_replaced_keys(arch), f"{arch}.rope.scaling.")
    out = []
    for name, value in header.metadata.items():
        if name == "general.architecture":  # the writer adds it itself
            continue
        if name in new:
            value, kind = new.pop(name)
            out.append((name, value, kind, None))
        elif not any(name == d or (d.endswith(".") and name.startswith(d)) for d in dropped):
            kind = _value_type(header.value_types[name])
            sub = _value_type(header.array_types[name]) if kind == gguf.GGUFValueType.ARRAY else None
            out.append((name, value, kind, sub))
    out.extend((name, value, kind, None) for name, (value, kind) in new.items())
    return out


def tensor_types(header: Any, new_rope: Any, tensors: list | None) -> dict[str, int]:
    """``{"Q4_1": 210, ...}``: the types of the tensors a file holds, written from ``tensors`` or (None) copied."""
    import gguf

    if tensors is None:
        types = [gguf.GGMLQuantizationType(t.ggml_type).name for t in header.tensors if t.name not in rope.ROPE_TENSORS]
    else:
        types = [q.name for _, _, q in tensors]
    types += ["F32"] * len(new_rope.tensors())
    return {t: types.count(t) for t in sorted(set(types))}


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


def write(out: Path, header: Any, fields: list, new_rope: Any, tensors: list | None) -> None:
    """Write the GGUF file ``out`` (its folder created): ``fields`` (``metadata``), then the source's tensors copied
    byte for byte (``tensors`` None: all but its RoPE factors) or ``tensors`` (``quantized``), then ``new_rope``'s
    factor tensors. An interrupted write leaves neither the file nor a folder it created."""
    with removing_created_folders(out):
        out.parent.mkdir(parents=True, exist_ok=True)
        _write(out, header, fields, new_rope, tensors)


def _source_tensors(header: Any) -> list[tuple[str, np.ndarray, Any]]:
    """``[(gguf name, bytes, GGMLQuantizationType)]``: the source's tensors but its RoPE factors, as read-only views
    of the mapped file (``gguf.GGUFReader``'s view of a quantized tensor: the map closes with its last view).

    Shapes:
        each (..., bytes per row) for a tensor of shape (..., columns).
    """
    import gguf
    import numpy as np
    from gguf.quants import quant_shape_to_byte_shape

    file = np.memmap(header.path, dtype=np.uint8, mode="r")
    out = []
    for t in header.tensors:
        if t.name not in rope.ROPE_TENSORS:
            qtype = gguf.GGMLQuantizationType(t.ggml_type)
            raw = file[t.offset : t.offset + t.n_bytes].reshape(quant_shape_to_byte_shape(t.shape, qtype))
            out.append((t.name, raw, qtype))
    return out


def _write(out: Path, header: Any, fields: list, new_rope: Any, tensors: list | None) -> None:
    """The GGUF file, written under a temporary name beside ``out`` and published as ``out`` once complete."""
    import gguf

    fd, tmp_name = create_temp(out)  # the mode a plain open() gives (mkstemp's 0600 would make the model private)
    os.close(fd)
    tmp = Path(tmp_name)
    endian = gguf.GGUFEndian.LITTLE if header.byte_order == "<" else gguf.GGUFEndian.BIG
    data_endian = None  # tensors from the model: in this machine's byte order
    try:
        if tensors is None:
            tensors, data_endian = _source_tensors(header), endian
        writer = gguf.GGUFWriter(tmp, header.architecture, endianess=endian)
        writer.data_alignment = header.alignment
        for name, value, kind, sub in fields:
            writer.add_key_value(name, value, kind, sub_type=sub)
        for name, data, qtype in tensors:
            writer.add_tensor_info(name, data.shape, data.dtype, data.nbytes, qtype)  # uint8: quantized bytes
        extra = new_rope.tensors()
        for name, data in extra.items():
            writer.add_tensor_info(name, data.shape, data.dtype, data.nbytes, gguf.GGMLQuantizationType.F32)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        for _, data, _ in tensors:
            writer.write_tensor_data(data, tensor_endianess=data_endian)
        for data in extra.values():
            writer.write_tensor_data(data)
        writer.close()
        _publish(tmp, out)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
