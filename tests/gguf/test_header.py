"""``posenc.gguf.header``: the header of tiny GGUF files, checked against the ``gguf`` package's own
``GGUFReader``, and cut or corrupt copies refused with the file named, before any tensor data is read."""

from __future__ import annotations

import re
import struct

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

from hf.tiny import tiny_model  # noqa: E402 - after the skip
from hf.tiny_gguf import TOKENS, broken_copy, write_llama  # noqa: E402
from posenc.gguf.header import GGUFArray, read_gguf_header  # noqa: E402


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny Llama GGUF (float16 projections, float32 norms) with a long chat template: its header is > 1000 bytes."""
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    return write_llama(path, tiny_model("llama"), **{"tokenizer.chat_template": "{{ messages }}" * 100})


def test_header_matches_gguf_reader(tiny):
    header = read_gguf_header(tiny, arrays=("tokenizer.ggml.tokens",))
    reader = gguf.GGUFReader(tiny)
    assert header.version == 3 and header.byte_order == "<" and header.architecture == "llama"
    assert header.data_offset == reader.data_offset and header.file_size == tiny.stat().st_size
    assert [t.name for t in header.tensors] == [t.name for t in reader.tensors]
    for ours, theirs in zip(header.tensors, reader.tensors, strict=True):
        assert ours.shape == tuple(int(d) for d in reversed(theirs.shape))  # torch order
        assert (ours.ggml_type, ours.offset, ours.n_bytes) == (
            int(theirs.tensor_type),
            theirs.data_offset,
            theirs.n_bytes,
        )
    assert {t.ggml_type for t in header.tensors} == {0, 1}  # F32 norms, F16 projections
    for key, field in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        value = header.metadata[key]
        if key == "tokenizer.ggml.merges":  # string arrays not asked for are only counted
            assert value == GGUFArray(count=len(field.data))
        elif field.types[0] == gguf.GGUFValueType.ARRAY:
            assert list(value) == field.contents()
        else:
            assert value == pytest.approx(field.contents())
    assert header.metadata["tokenizer.ggml.tokens"] == tuple(TOKENS)


def test_value_and_element_types_match_gguf_reader(tiny):
    header = read_gguf_header(tiny)
    reader = gguf.GGUFReader(tiny)
    fields = {k: f for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    assert {k: header.value_types[k] for k in fields} == {k: f.types[0].name.lower() for k, f in fields.items()}
    arrays = {k: f.types[-1].name.lower() for k, f in fields.items() if f.types[0] == gguf.GGUFValueType.ARRAY}
    assert header.array_types == arrays and arrays["tokenizer.ggml.tokens"] == "string"
    assert header.alignment == reader.alignment
    assert header.arch_value("context_length") == 32 and header.arch_value("missing", 7) == 7


def test_big_endian(tmp_path):
    path = write_llama(tmp_path / "be.gguf", tiny_model("llama"))
    big = tmp_path / "big.gguf"
    from hf.tiny_gguf import llama_kv, llama_tensors, write_gguf

    model = tiny_model("llama")
    write_gguf(big, "llama", llama_tensors(model), kv=llama_kv(model.config), endian=gguf.GGUFEndian.BIG)
    little, other = read_gguf_header(path), read_gguf_header(big)
    assert other.byte_order == ">" and little.byte_order == "<"
    assert other.metadata == little.metadata
    assert [(t.name, t.shape, t.ggml_type, t.n_bytes) for t in other.tensors] == [
        (t.name, t.shape, t.ggml_type, t.n_bytes) for t in little.tensors
    ]


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (dict(keep=1000), "ends at byte 1000, inside its header"),
        (dict(patch=b"FUGG"), "magic bytes b'GGUF' \\(found b'FUGG'\\)"),
        (dict(keep=0), "holds 0 bytes"),
        (dict(at=4, patch=struct.pack("<I", 1)), "GGUF version 1"),
        (dict(at=16, patch=struct.pack("<Q", 2**60)), "inside its header"),  # a corrupt metadata count
    ],
)
def test_damaged_header(tiny, tmp_path, damage, message):
    bad = broken_copy(tiny, tmp_path / "bad.gguf", **damage)
    prefix = re.escape(f"path='{bad}' is invalid: expected a complete GGUF file: ")
    with pytest.raises(ValueError, match=f"{prefix}.*{message}"):
        read_gguf_header(bad)


def test_truncated_tensor_data(tiny, tmp_path):
    """Cut in half: the header is whole, the tensor data it lists is not."""
    size = tiny.stat().st_size
    end = max(t.offset + t.n_bytes for t in read_gguf_header(tiny).tensors)
    assert end == size  # the last tensor ends the file: the check compares exactly these
    bad = broken_copy(tiny, tmp_path / "half.gguf", keep=size // 2)
    with pytest.raises(ValueError, match=f"tensors end at byte {end} but the file holds {size // 2} bytes"):
        read_gguf_header(bad)
    one_short = broken_copy(tiny, tmp_path / "short.gguf", keep=size - 1)
    with pytest.raises(ValueError, match="truncated download"):
        read_gguf_header(one_short)


def test_not_a_gguf(tmp_path):
    text = tmp_path / "notes.gguf"
    text.write_text("these are notes, not a model\n")
    with pytest.raises(ValueError, match="magic bytes"):
        read_gguf_header(text)
    with pytest.raises(ValueError, match="a readable GGUF file"):
        read_gguf_header(tmp_path / "missing.gguf")


# ---------------------------------------------------------------------------------------------------------------------
# What the GGUF format forbids and gguf.GGUFReader (and llama.cpp) refuse: duplicate keys or tensors, a bad alignment


def _renamed(src, dst, old: str, new: str):
    """A copy of ``src`` with the one occurrence of the key or tensor name ``old`` overwritten by ``new``."""
    data = src.read_bytes()
    assert len(old) == len(new) and data.count(old.encode()) == 1
    dst.write_bytes(data.replace(old.encode(), new.encode()))
    return dst


def test_duplicate_metadata_key(tmp_path):
    """A second ``general.architecture`` was read over the first: a Llama file read as ``bloom``."""
    src = write_llama(tmp_path / "src.gguf", tiny_model("llama"), **{"general.architecturX": "bloom"})
    bad = _renamed(src, tmp_path / "twice.gguf", "general.architecturX", "general.architecture")
    with pytest.raises(KeyError, match="Duplicate general.architecture"):
        gguf.GGUFReader(bad)
    with pytest.raises(ValueError, match=r"the key 'general\.architecture' twice"):
        read_gguf_header(bad)


def test_duplicate_tensor_name(tiny, tmp_path):
    """Two ``blk.0.attn_q.weight`` entries: the Llama loader would keep the second."""
    bad = _renamed(tiny, tmp_path / "twice.gguf", "blk.0.attn_k.weight", "blk.0.attn_q.weight")
    with pytest.raises(ValueError, match="duplicated tensor with name blk.0.attn_q.weight"):
        gguf.GGUFReader(bad)
    with pytest.raises(ValueError, match=r"the tensor 'blk\.0\.attn_q\.weight' twice"):
        read_gguf_header(bad)


def _write_aligned(path, alignment=None, vtype=None):
    """A one-tensor GGUF whose ``general.alignment`` is ``alignment`` stored as ``vtype``; with no ``vtype`` it is
    set the way llama.cpp's converter sets it (a uint32, and the data padded to it)."""
    w = gguf.GGUFWriter(path, "llama")
    if vtype is None:
        w.add_custom_alignment(alignment)
    else:
        w.add_key_value("general.alignment", alignment, vtype)
    w.add_tensor("token_embd.weight", np.ones((4, 8), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.mark.parametrize("alignment", [1, 8, 64, 4096])
def test_custom_alignment(tmp_path, alignment):
    path = _write_aligned(tmp_path / "aligned.gguf", alignment)
    header, reader = read_gguf_header(path), gguf.GGUFReader(path)
    assert header.metadata["general.alignment"] == alignment
    assert header.data_offset == reader.data_offset and header.data_offset % alignment == 0
    assert header.tensors[0].offset == reader.tensors[0].data_offset


U = gguf.GGUFValueType


@pytest.mark.parametrize(
    ("alignment", "vtype", "shown"),
    [
        (3, U.UINT32, "3 (uint32)"),
        (0, U.UINT32, "0 (uint32)"),
        (48, U.UINT32, "48 (uint32)"),  # a multiple of 8 (gguf.md), not a power of two
        (True, U.BOOL, "True (bool)"),  # a Python int, once
        (32.0, U.FLOAT32, "32.0 (float32)"),
        (32, U.UINT64, "32 (uint64)"),  # the right value stored as the wrong type: llama.cpp asserts
        (32, U.INT32, "32 (int32)"),
        (-32, U.INT32, "-32 (int32)"),
        ("32", U.STRING, "'32' (string)"),
    ],
)
def test_bad_alignment(tmp_path, alignment, vtype, shown):
    bad = _write_aligned(tmp_path / "bad.gguf", alignment, vtype)
    with pytest.raises(ValueError, match="general.alignment|alignment"):
        gguf.GGUFReader(bad)
    allowed = "a non-zero power of two stored as a uint32"
    with pytest.raises(ValueError, match=re.escape(f"its general.alignment={shown} is invalid: expected {allowed}")):
        read_gguf_header(bad)


def test_a_header_read_again_is_the_same_and_an_edit_in_place_is_seen(tiny, tmp_path):
    """Headers are kept per process (a load reads one several times): a second read equals the first, mutating what
    a read returned changes no later read, and a header edited in place -- same file, same size, within the file
    system's timestamp granularity -- is parsed again (the cache compares a digest of the header's bytes)."""
    import shutil

    path = shutil.copy(tiny, tmp_path / "edited.gguf")
    first = read_gguf_header(path)
    first.metadata["general.architecture"] = "changed by the caller"
    again = read_gguf_header(path)
    assert again.architecture == "llama" and again.tensors == first.tensors
    assert again.metadata == read_gguf_header(tiny).metadata
    data = bytearray(path.read_bytes())
    at = data.index(b"{{ messages }}")
    data[at : at + 2] = b"[["  # the chat template's first bytes, the file's size unchanged
    with open(path, "r+b") as f:  # in place: the same inode
        f.write(data)
    edited = read_gguf_header(path)
    assert edited.metadata["tokenizer.chat_template"].startswith("[[ messages }}")
    assert edited.data_offset == again.data_offset and edited.file_size == again.file_size
