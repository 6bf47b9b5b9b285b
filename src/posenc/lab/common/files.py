"""Files every lab command writes atomically, and JSON read back with an error that names the file.

Every file is written to a temporary name in the same folder and moved into place with ``os.replace``: a crash
leaves the previous file or the new one, never half of either. The temporary file gets the mode a plain ``open``
would give (``tempfile.mkstemp``'s 0600 would make results private).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from posenc._checks import fail
from posenc._files import atomic_open as atomic_open  # part of this module's interface, torch-free in the core
from posenc._files import create_temp  # noqa: F401 - part of this module's interface


def write_text_atomic(path: str | Path, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically; returns ``path``."""
    with atomic_open(path, "w") as f:
        f.write(text)
    return Path(path)


def write_atomic(path: str | Path, write: Callable[[Path], None]) -> None:
    """Call ``write(tmp_path)`` on a temporary file next to ``path``, fsync it, then ``os.replace`` it onto ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = create_temp(path)  # the mode a plain open() gives (mkstemp's 0600 would make checkpoints private)
    mode = os.fstat(fd).st_mode & 0o7777
    os.close(fd)
    try:
        write(Path(tmp))
        os.chmod(tmp, mode)  # safetensors' save_file recreates the file private (0600) whatever was there
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json_atomic(path: str | Path, obj: Any) -> None:
    """``obj`` as indented JSON at ``path``, atomically."""
    text = json.dumps(obj, indent=2, sort_keys=True) + "\n"
    write_atomic(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def read_json(path: str | Path, what: str) -> Any:
    """Parsed JSON at ``path``; a missing or unreadable file is a ``ValueError`` naming it."""
    path = Path(path)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        fail(what, str(path), f"a readable JSON file ({type(e).__name__}: {e}); delete it or pass a fresh --out")
