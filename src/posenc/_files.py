"""Writing files and folders that appear whole or not at all: a temporary file next to the file it will become, with
the mode a plain ``open`` gives (what every atomic write in posenc starts from: results, checkpoints, exported
models; ``atomic_open``), a folder written beside its name and renamed into place, and the checks before either.
Standard library only."""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from posenc._fail import fail


def create_temp(path: str | Path) -> tuple[int, str]:
    """A new temporary file next to ``path`` for an atomic replace: ``(fd open for writing, its name)``.

    Its mode is what ``open(path, "w")`` would give: the mode of the file it replaces, else ``0o666`` less the umask
    (``tempfile.mkstemp`` makes every file private, 0600, unlike the other outputs).
    """
    path = Path(path)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)
    for _ in range(100):
        tmp = path.parent / f".{path.name}.{secrets.token_hex(4)}.tmp"
        try:
            fd = os.open(tmp, flags, 0o666)  # the kernel applies the umask, as for any new file
        except FileExistsError:
            continue
        try:
            if path.exists():
                os.chmod(tmp, path.stat().st_mode & 0o7777)
        except BaseException:
            os.close(fd)
            tmp.unlink(missing_ok=True)
            raise
        return fd, str(tmp)
    raise FileExistsError(f"no free temporary name next to {path}")


@contextlib.contextmanager
def atomic_open(path: str | Path, mode: str = "w", **kwargs: Any) -> Iterator[IO]:
    """Open a temporary file next to ``path`` for writing; on success it replaces ``path`` in one ``os.replace``.

    On an exception the temporary file is removed and ``path`` is left as it was. ``mode`` is ``"w"`` or ``"wb"``;
    ``kwargs`` go to ``open`` (text mode defaults to UTF-8 and ``newline=""``-free line endings of the platform).
    """
    if mode not in ("w", "wb"):
        fail("mode", mode, "'w' or 'wb' (atomic_open only writes)")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if mode == "w":
        kwargs.setdefault("encoding", "utf-8")
    fd, tmp = create_temp(path)
    try:
        with os.fdopen(fd, mode, **kwargs) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def check_new_path(name: str, path: str | os.PathLike) -> None:
    """Refuse, before anything is read or written, a path that cannot be created: one with a file where a folder
    above it should be, or whose nearest existing folder this user cannot write in. Refusals name ``name``."""
    path = Path(path).expanduser()
    for parent in path.absolute().parents:
        if parent.exists():
            if not parent.is_dir():
                fail(name, str(path), f"a path under folders ({parent} is a file)")
            if not os.access(parent, os.W_OK | os.X_OK):
                fail(name, str(path), f"a path in a folder this user can write in ({parent} is not writable)")
            return


@contextlib.contextmanager
def removing_created_folders(path: Path) -> Iterator[None]:
    """Around writing ``path``: on any failure (Ctrl-C included), remove the folders above it that did not exist
    before, deepest first, where they are (still) empty."""
    created = [p for p in path.absolute().parents if not p.exists()]  # deepest first
    try:
        yield
    except BaseException:
        for folder in created:
            with contextlib.suppress(OSError):
                folder.rmdir()
        raise


@contextlib.contextmanager
def writing_folder(out: Path) -> Iterator[Path]:
    """A hidden folder beside ``out`` to write into, renamed to ``out`` once the block finishes: ``out`` appears
    whole or not at all. On a failure the partial folder and every folder created above ``out`` are removed. The
    files get the modes a plain ``open`` gives (transformers writes ``model.safetensors`` as 0600), the folder
    ``0777`` less the umask (not ``mkdtemp``'s 0700)."""
    out = out.absolute()
    with removing_created_folders(out):
        out.parent.mkdir(parents=True, exist_ok=True)
        partial = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".partial", dir=out.parent))
        try:
            yield partial
            mask = _umask()
            for path in partial.rglob("*"):
                os.chmod(path, (0o777 if path.is_dir() else 0o666) & ~mask)
            os.chmod(partial, 0o777 & ~mask)
            if out.is_dir():
                out.rmdir()  # empty (checked first): nothing of the user's is lost
            os.rename(partial, out)
        except BaseException:
            shutil.rmtree(partial, ignore_errors=True)
            raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def cache_dir() -> Path:
    """posenc's one cache folder: ``$POSENC_CACHE``, else ``$XDG_CACHE_HOME/posenc``, else ``~/.cache/posenc`` (not
    created here): joined models (``posenc.hf.packaged``), ``posenc check``'s rows (``posenc._check_cache``), built
    CPU kernels (``posenc.kernels.native``). ``$POSENC_CACHE_DIR``, the name the kernels read until 2026-12-08, is
    still read where ``$POSENC_CACHE`` is unset, with a ``FutureWarning``."""
    if os.environ.get("POSENC_CACHE"):
        return Path(os.environ["POSENC_CACHE"]).expanduser()
    if os.environ.get("POSENC_CACHE_DIR"):
        warnings.warn(
            "POSENC_CACHE_DIR is the old name of POSENC_CACHE (one cache folder for kernels, joined models and "
            "posenc check); set POSENC_CACHE instead",
            FutureWarning,
            stacklevel=2,
        )
        return Path(os.environ["POSENC_CACHE_DIR"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "posenc"
