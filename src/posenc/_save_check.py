"""The table a save prints once its files are written (``posenc.hf.save_pretrained(check=True)``,
``posenc.hf.save_gguf``): ``posenc check``'s, as a hook the package root sets. The writers sit below
``posenc.runtimes``, which reads what they write, so they call the check without importing it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

#: ``path -> rows``: prints ``posenc check``'s table for a written folder or file; set by the package root
#: (``posenc.__init__``), which every ``import posenc.<module>`` runs first.
PRINT_CHECK: Callable[[Path], list | None] | None = None


def print_check(path: Path) -> list | None:
    """``posenc check``'s table for what a save wrote, printed; the rows (None where nothing could be compared: the
    save stands, the one line printed says why)."""
    return None if PRINT_CHECK is None else PRINT_CHECK(path)
