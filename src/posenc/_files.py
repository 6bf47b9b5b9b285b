"""A temporary file next to the file it will become, with the mode a plain ``open`` gives: what every atomic write
in posenc (results, checkpoints, exported models) starts from. Standard library only."""

from __future__ import annotations

import os
import secrets
from pathlib import Path


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
