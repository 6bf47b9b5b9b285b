"""``posenc check``'s rows kept by what they are computed from, so the same check again prints without importing torch
or transformers (seconds on a 2-core machine: the transformers row imports the model's own modeling file).

A row depends on the model's files, the arguments (runtimes, length) and the code that reads them: posenc,
transformers (which the transformers, vLLM and SGLang rows read the config with) and everything else installed.
``key`` digests all of it, the way Python's own bytecode cache trusts a source file's size and modification time:

- the model: a folder's entries by name and size, the content of its ``.json`` files (``config.json``, the
  ``posenc`` record in it, ``tokenizer_config.json``, which vLLM's context reads); a ``config.json`` by content; a
  GGUF file by size, modification time, inode and the sha256 of its first 16 MiB (the header; its tensors are never
  read), with a ``config.json`` beside it (SGLang reads that one instead);
- the code: every file of the ``posenc`` and ``transformers`` packages by path, size and modification time, and the
  name and version of every installed distribution, the Python version and ``sys.path``.

Any change gives another key, so a cached row is what the check computes from the same inputs. A model given by its
name (``smollm2``: resolved through ``posenc.hf``) or a path that does not exist has no key and is read afresh. Each
entry is a small JSON file in ``folder()`` (``$POSENC_CHECK_CACHE``, else ``<cache>/check``: ``posenc._files.
cache_dir``; ``POSENC_CHECK_CACHE=""`` turns the cache off, as ``posenc check --no-cache`` does for one check)
written atomically; a file that cannot be read back is ignored and replaced, and a cache that cannot be written
costs only the time.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from posenc._check_rows import Row
from posenc._files import atomic_open, cache_dir

#: Bumped when a row's meaning or the key's recipe changes: older entries are then never read.
SCHEMA = 1
#: The leading bytes of a GGUF file digested into its key (its metadata; the tensors after it are not).
GGUF_HEAD = 16 << 20
#: Entries kept: past ``KEEP`` the oldest are removed down to ``KEEP // 2`` (each is a few kilobytes).
KEEP = 512


def _sha256_file(path: Path, limit: int | None = None) -> str:
    digest = hashlib.sha256()
    left = limit
    with path.open("rb") as f:
        while left is None or left > 0:
            chunk = f.read(1 << 20 if left is None else min(1 << 20, left))
            if not chunk:
                break
            digest.update(chunk)
            if left is not None:
                left -= len(chunk)
    return digest.hexdigest()


def _model(path: Path) -> list[Any] | None:
    """What the readers read of the model at ``path`` (see the module's docstring); None for anything else."""
    if path.is_dir():
        entries: list[Any] = []
        for entry in sorted(os.scandir(path), key=lambda e: e.name):
            if entry.is_file():
                size = entry.stat().st_size
                content = _sha256_file(Path(entry.path)) if entry.name.lower().endswith(".json") else None
                entries.append([entry.name, size, content])
            else:
                entries.append([entry.name, "not a file"])
        return ["folder", entries]
    if path.is_file() and path.suffix.lower() == ".json":
        return ["config", _sha256_file(path)]
    if path.is_file() and path.suffix.lower() == ".gguf":
        st = path.stat()
        beside = path.parent / "config.json"
        return ["gguf", st.st_size, st.st_mtime_ns, st.st_ino, _sha256_file(path, GGUF_HEAD),
                _sha256_file(beside) if beside.is_file() else None]
    return None


def _package_files(name: str) -> list[Any]:
    """Every file of the installed package ``name`` (located, not imported) by path, size and modification time."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return [name, None]
    roots = [str(root) for root in spec.submodule_search_locations]
    files = []
    for root in roots:
        for folder, subfolders, names in os.walk(root):
            subfolders[:] = sorted(d for d in subfolders if d != "__pycache__")
            for file in sorted(names):
                st = os.stat(os.path.join(folder, file))
                files.append([os.path.relpath(os.path.join(folder, file), root), st.st_size, st.st_mtime_ns])
    return [name, roots, files]


def _distributions() -> list[list[str]]:
    return sorted([str(d.metadata["Name"] or ""), d.version] for d in importlib.metadata.distributions())


def key(path: str | os.PathLike, runtimes: Sequence[str], length: int | None) -> str | None:
    """The cache key of ``posenc check path --runtimes ... --length ...``: a sha256 over the model's files, the
    arguments and the code that reads them; None where the check is not cached (a name, a path that does not exist,
    a file that is neither JSON nor GGUF: the check itself says what is wrong)."""
    p = Path(path).expanduser()
    try:
        if not p.exists() or (model := _model(p := p.resolve())) is None:
            return None
        parts = [SCHEMA, str(p), list(runtimes), length, model, sys.version, sys.platform,
                 [str(entry) for entry in sys.path], _package_files("posenc"), _package_files("transformers"),
                 _distributions()]
    except OSError:  # a file that cannot be read: the check itself says so
        return None
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def folder() -> Path | None:
    """Where the rows are kept: ``$POSENC_CHECK_CACHE``, else ``<cache>/check``; None when that variable is set
    empty (no cache)."""
    chosen = os.environ.get("POSENC_CHECK_CACHE")
    if chosen is not None:
        return Path(chosen).expanduser() if chosen else None
    return cache_dir() / "check"


def _entry(digest: str) -> Path | None:
    where = folder()
    return None if where is None else where / f"{digest}.json"


def load(digest: str | None) -> tuple[list[Row], str] | None:
    """The rows kept under ``digest`` and when they were computed (ISO 8601, UTC); None when there are none or the
    file cannot be read back as rows."""
    entry = None if digest is None else _entry(digest)
    if entry is None:
        return None
    try:
        data = json.loads(entry.read_text())
        if data.get("schema") != SCHEMA or data.get("key") != digest:
            return None
        rows = [Row.from_dict(row) for row in data["rows"]]
        return (rows, str(data["computed"])) if rows else None
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None


def store(digest: str | None, rows: Iterable[Row]) -> None:
    """Keep ``rows`` under ``digest`` (written whole or not at all); nothing when ``digest`` is None. A cache that
    cannot be written is skipped: it only saves time."""
    path = None if digest is None else _entry(digest)
    if path is None:
        return
    data = {"schema": SCHEMA, "key": digest, "computed": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "rows": [row.to_dict() for row in rows]}
    try:
        with atomic_open(path) as f:
            json.dump(data, f, indent=1)
        _prune(path.parent)
    except OSError:
        pass


def _prune(folder: Path) -> None:
    entries = sorted(folder.glob("*.json"), key=lambda p: p.stat().st_mtime_ns)
    if len(entries) > KEEP:
        for old in entries[: len(entries) - KEEP // 2]:
            with contextlib.suppress(OSError):
                old.unlink()
