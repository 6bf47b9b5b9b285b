"""Read a GGUF file's header (metadata and tensor table) without touching the tensor data, and check the file is whole.

Why not ``gguf.GGUFReader``: it builds a numpy view for every string of every metadata array (~2 s for SmolLM2's
49k-token vocabulary, and transformers' GGUF loader reads a file up to three times), and it maps the tensors
lazily, so a truncated download is only noticed in the middle of a load. This reader walks the header with
``struct`` (tens of ms), keeps string arrays only when asked, and compares the file size with the end of the last
tensor the header lists, so a cut or corrupt file is refused before any weight is read. The ``gguf`` package
supplies the block sizes of the quantized types.

Format: https://github.com/ggml-org/ggml/blob/master/docs/gguf.md (versions 2 and 3, either byte order).
"""

from __future__ import annotations

import hashlib
import mmap
import os
import struct
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from posenc._checks import fail

MAGIC = b"GGUF"
VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32  # general.alignment when the file does not set it
MAX_DIMS = 4  # GGML_MAX_DIMS: a tensor entry claiming more is corrupt

# Metadata value types (GGUFValueType): fixed-size ones as struct codes; 8 is a string, 9 an array.
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9
_UINT32 = 4  # general.alignment's one type
_TYPE_NAMES = {0: "uint8", 1: "int8", 2: "uint16", 3: "int16", 4: "uint32", 5: "int32", 6: "float32", 7: "bool",
               8: "string", 9: "array", 10: "uint64", 11: "int64", 12: "float64"}


@dataclass(frozen=True)
class GGUFArray:
    """A metadata array of strings left unread (``read_gguf_header(arrays=...)`` names those to read)."""

    count: int


@dataclass(frozen=True)
class GGUFTensor:
    """One entry of the tensor table.

    Attributes:
        name: the GGUF tensor name, e.g. ``"blk.0.attn_q.weight"``.
        shape: in torch order (GGUF lists the fastest-varying dimension first).
        ggml_type: ``gguf.GGMLQuantizationType`` value (0 F32, 1 F16, 30 BF16, 3 Q4_1, 8 Q8_0, ...).
        offset: absolute byte offset of the data in the file.
        n_bytes: bytes of data (whole quantization blocks).
    """

    name: str
    shape: tuple[int, ...]
    ggml_type: int
    offset: int
    n_bytes: int


@dataclass(frozen=True)
class GGUFHeader:
    """A GGUF file's header: metadata (``key -> value``), tensor table, where the data starts, the file size."""

    path: Path
    version: int
    byte_order: str  # "<" little-endian (nearly every file) or ">"
    metadata: dict[str, Any] = field(repr=False)
    tensors: tuple[GGUFTensor, ...] = field(repr=False)
    data_offset: int
    file_size: int
    #: each metadata key's value type as the file stores it ("float32", "uint32", "string", ...)
    value_types: dict[str, str] = field(default_factory=dict, repr=False, compare=False)
    #: each metadata array's element type ("string", "int32", ...), by key
    array_types: dict[str, str] = field(default_factory=dict, repr=False, compare=False)

    @property
    def architecture(self) -> str:
        return self.metadata["general.architecture"]

    def arch_value(self, key: str, default: Any = None) -> Any:
        """The architecture's own key, e.g. ``arch_value("context_length")`` reads ``"llama.context_length"``."""
        return self.metadata.get(f"{self.architecture}.{key}", default)

    @property
    def alignment(self) -> int:
        """The tensor data's alignment (``general.alignment``, checked when read; 32 when the file does not set it)."""
        return self.metadata.get("general.alignment", DEFAULT_ALIGNMENT)


class _Corrupt(Exception):
    """Raised inside the parser; ``read_gguf_header`` turns it into the standard ValueError naming the file."""


class _Cursor:
    """Bounds-checked reads from the mapped file (slicing an mmap past its end would silently shorten)."""

    def __init__(self, buf: mmap.mmap, order: str) -> None:
        self.buf, self.order, self.pos, self.size = buf, order, 0, len(buf)
        self._structs: dict[str, struct.Struct] = {}

    def short(self, wanted: str) -> _Corrupt:
        return _Corrupt(f"it ends at byte {self.size}, inside its header ({wanted}; a truncated download?)")

    def take(self, fmt: str) -> tuple[Any, ...]:
        s = self._structs.get(fmt)
        if s is None:
            s = self._structs[fmt] = struct.Struct(self.order + fmt)
        end = self.pos + s.size
        if end > self.size:
            raise self.short(f"{s.size} bytes wanted at byte {self.pos}")
        values = s.unpack_from(self.buf, self.pos)
        self.pos = end
        return values

    def string(self) -> str:
        (n,) = self.take("Q")
        end = self.pos + n
        if end > self.size:
            raise self.short(f"a {n}-byte string at byte {self.pos}")
        raw = self.buf[self.pos : end]
        self.pos = end
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise _Corrupt(f"a string at byte {self.pos - n} is not UTF-8") from e

    def skip_strings(self, count: int) -> None:
        for _ in range(count):  # each string's length is only known once its prefix is read
            (n,) = self.take("Q")
            self.pos += n
        if self.pos > self.size:
            raise self.short("an array of strings")

    def value(self, kind: int, keep_strings: bool) -> Any:
        if kind in _SCALARS:
            return self.take(_SCALARS[kind])[0]
        if kind == _STRING:
            return self.string()
        if kind != _ARRAY:
            raise _Corrupt(f"a metadata value has the unknown type {kind}")
        element, count = self.take("IQ")
        if element in _SCALARS:
            width = struct.calcsize(_SCALARS[element])
            if self.pos + count * width > self.size:  # before allocating `count` values for a corrupt count
                raise self.short(f"an array of {count} values at byte {self.pos}")
            return self.take(f"{count}{_SCALARS[element]}")
        if element != _STRING:
            raise _Corrupt(f"a metadata array has elements of type {element}, which GGUF does not define")
        if keep_strings:
            return tuple(self.string() for _ in range(count))
        self.skip_strings(count)
        return GGUFArray(count)


def _quant_sizes() -> dict[int, tuple[int, int]]:
    """``{ggml_type: (elements per block, bytes per block)}`` from the ``gguf`` package."""
    try:
        from gguf.constants import GGML_QUANT_SIZES
    except ImportError as e:
        raise ImportError("reading GGUF files needs the `gguf` package: pip install 'gguf>=0.10'") from e
    return {int(k): v for k, v in GGML_QUANT_SIZES.items()}


def _byte_order(buf: mmap.mmap) -> tuple[str, int]:
    """Detect the byte order from the version field, as llama.cpp does (a small number reads as ``n << 24``)."""
    (version,) = struct.unpack_from("<I", buf, 4)
    if version & 0xFFFF == 0 and version:
        return ">", struct.unpack_from(">I", buf, 4)[0]
    return "<", version


def _read_metadata(
    cur: _Cursor, n_kv: int, arrays: Collection[str]
) -> tuple[dict[str, Any], dict[str, int], dict[str, int]]:
    """The metadata ``key -> value``, each key's value type and each array's element type; a key read twice is
    refused (GGUF keys are unique, and ``gguf.GGUFReader`` and llama.cpp refuse the file: reading on, the second value
    would replace the first)."""
    metadata: dict[str, Any] = {}
    kinds: dict[str, int] = {}
    elements: dict[str, int] = {}
    for _ in range(n_kv):  # each entry takes >= 12 bytes, so a corrupt count ends in a short read, not a hang
        start = cur.pos
        key = cur.string()
        if key in metadata:
            raise _Corrupt(f"its metadata holds the key {key!r} twice (again at byte {start}; GGUF keys are unique)")
        (kinds[key],) = cur.take("I")
        if kinds[key] == _ARRAY and cur.pos + 4 <= cur.size:  # a short read is reported by `value`
            (elements[key],) = struct.unpack_from(cur.order + "I", cur.buf, cur.pos)
        metadata[key] = cur.value(kinds[key], key in arrays)
    return metadata, kinds, elements


def _alignment(metadata: dict[str, Any], kinds: dict[str, int]) -> int:
    """``general.alignment`` as ``gguf.GGUFReader`` and llama.cpp read it: a non-zero power of two stored as a uint32
    (any other type is refused, and llama.cpp asserts); 32 when the file does not set it."""
    if "general.alignment" not in metadata:
        return DEFAULT_ALIGNMENT
    value, kind = metadata["general.alignment"], kinds["general.alignment"]
    if kind != _UINT32 or value <= 0 or value & (value - 1):
        shown = f"{value!r} ({_TYPE_NAMES.get(kind, kind)})"
        raise _Corrupt(
            f"its general.alignment={shown} is invalid: expected a non-zero power of two stored as a uint32 "
            "(as gguf.GGUFReader and llama.cpp require)"
        )
    return value


def _parse(
    buf: mmap.mmap, file_size: int, arrays: Collection[str]
) -> tuple[int, str, dict, dict, dict, list[GGUFTensor], int]:
    if file_size < 8 or buf[:4] != MAGIC:
        raise _Corrupt(f"it does not start with the magic bytes {MAGIC!r} (found {bytes(buf[:4])!r})")
    order, version = _byte_order(buf)
    if version not in VERSIONS:
        raise _Corrupt(f"it is GGUF version {version}; readable versions are {list(VERSIONS)} (re-convert it)")
    cur = _Cursor(buf, order)
    cur.pos = 8
    n_tensors, n_kv = cur.take("QQ")
    metadata, kinds, element_kinds = _read_metadata(cur, n_kv, arrays)
    if not isinstance(metadata.get("general.architecture"), str):
        raise _Corrupt("its metadata has no general.architecture")
    sizes = _quant_sizes()
    entries = []
    names: set[str] = set()
    for _ in range(n_tensors):
        name = cur.string()
        if name in names:  # the Llama loader would keep the second; gguf.GGUFReader and llama.cpp refuse the file
            raise _Corrupt(f"its tensor table lists the tensor {name!r} twice (GGUF tensor names are unique)")
        names.add(name)
        (n_dims,) = cur.take("I")
        if not 1 <= n_dims <= MAX_DIMS:
            raise _Corrupt(f"tensor {name!r} claims {n_dims} dimensions (at most {MAX_DIMS})")
        dims = cur.take(f"{n_dims}Q")
        ggml_type, offset = cur.take("IQ")
        if ggml_type not in sizes:
            raise _Corrupt(f"tensor {name!r} has ggml type {ggml_type}, unknown to the installed gguf package")
        block, block_bytes = sizes[ggml_type]
        if dims[0] % block:
            raise _Corrupt(f"tensor {name!r} has {dims[0]} columns, not whole blocks of {block}")
        elements = 1
        for d in dims:
            elements *= d
        entries.append((name, tuple(reversed(dims)), ggml_type, offset, elements // block * block_bytes))
    alignment = _alignment(metadata, kinds)
    data_offset = -(-cur.pos // alignment) * alignment
    tensors = [GGUFTensor(n, shape, t, data_offset + off, nb) for n, shape, t, off, nb in entries]
    end = max((t.offset + t.n_bytes for t in tensors), default=data_offset)
    if end > file_size:
        raise _Corrupt(
            f"its {len(tensors)} tensors end at byte {end} but the file holds {file_size} bytes (truncated download?)"
        )
    return version, order, metadata, kinds, element_kinds, tensors, data_offset


#: Headers parsed in this process, by file (device, inode, size) and ``arrays``, with a digest of the header's bytes:
#: a load reads the same header several times (resolve, config, tokenizer, weights), each parse walking every string
#: of the vocabulary (0.3 s for Gemma 3's 262k tokens), where hashing its bytes takes milliseconds; a header changed
#: on disk (its digest) is parsed again.
_PARSED: dict[tuple, tuple[tuple, bytes]] = {}
_PARSED_KEPT = 8


def _digest(buf: mmap.mmap, end: int) -> bytes:
    """A digest of the file's first ``end`` bytes (its header)."""
    return hashlib.blake2b(buf[:end], digest_size=16).digest()


def read_gguf_header(path: str | os.PathLike, *, arrays: Collection[str] = ()) -> GGUFHeader:
    """Parse a GGUF file's header and check that the tensor data it describes is all there.

    Args:
        path: the ``.gguf`` file.
        arrays: metadata keys whose string arrays to read (e.g. ``"tokenizer.ggml.tokens"``); other string arrays
            come back as ``GGUFArray(count)``. Numeric arrays are always read (as tuples).

    Raises:
        ValueError: naming the file, when it is not a GGUF file (bad magic), is of an unreadable version, ends
            inside its header, or is shorter than the tensor data its header lists (a truncated download); or
            breaks what ``gguf.GGUFReader`` and llama.cpp require: a metadata key or tensor name listed twice, a
            ``general.alignment`` that is not a non-zero power of two stored as a uint32.
    """
    path = Path(path)
    try:
        with path.open("rb") as f:
            stat = os.fstat(f.fileno())
            file_size = stat.st_size
            if file_size < 8:
                raise _Corrupt(f"it holds {file_size} bytes, fewer than a GGUF header's first 8")
            key = (stat.st_dev, stat.st_ino, file_size, frozenset(arrays))
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
                parsed, digest = _PARSED.get(key, (None, b""))
                if parsed is None or _digest(buf, parsed[-1]) != digest:  # parsed[-1]: where the header ends
                    parsed = _parse(buf, file_size, frozenset(arrays))
                    _PARSED[key] = parsed, _digest(buf, parsed[-1])
                    while len(_PARSED) > _PARSED_KEPT:
                        _PARSED.pop(next(iter(_PARSED)))
    except _Corrupt as e:
        fail("path", str(path), f"a complete GGUF file: {e}")
    except OSError as e:
        fail("path", str(path), f"a readable GGUF file ({e.strerror or e})")
    version, order, metadata, kinds, element_kinds, tensors, data_offset = parsed
    metadata = dict(metadata)  # the caller's own dicts (values are immutable: numbers, strings, tuples)
    return GGUFHeader(
        path=path,
        version=version,
        byte_order=order,
        metadata=metadata,
        tensors=tuple(tensors),
        data_offset=data_offset,
        file_size=file_size,
        value_types={key: _TYPE_NAMES.get(kind, str(kind)) for key, kind in kinds.items()},
        array_types={key: _TYPE_NAMES.get(kind, str(kind)) for key, kind in element_kinds.items()},
    )
