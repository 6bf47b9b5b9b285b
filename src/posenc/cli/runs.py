"""The run folders of ``posenc lab``, ``vision`` and ``extend``: the command that continues an interrupted one, and
what a failure leaves behind (nothing this invocation created, unless it holds work)."""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from pathlib import Path

#: The subcommands whose --out is a run that --resume continues.
RESUMABLE = ("lab", "vision", "extend")


def resume_command(argv: Sequence[str], out: str) -> str:
    """The command that continues ``posenc *argv`` in ``out``: its ``--out`` replaced, ``--resume`` once, and
    ``--save``/``--save-type`` left out once what ``--save`` names was written (the model is saved before the
    measurements, and a rerun would refuse to overwrite it)."""
    drop = {"--out", "--save", "--save-type"} if _saved(argv) else {"--out"}
    kept, skip = [], False
    for token in argv:
        name = token.split("=", 1)[0]
        if skip:
            skip = False
        elif name in drop:
            skip = "=" not in token
        elif token != "--resume":
            kept.append(token)
    return shlex.join(["posenc", *kept, "--out", out, "--resume"])


def _saved(argv: Sequence[str]) -> bool:
    """Whether ``--save`` in ``argv`` names a file, or a folder with something in it."""
    for i, token in enumerate(argv):
        value = token.split("=", 1)[1] if token.startswith("--save=") else None
        if token == "--save" and i + 1 < len(argv):
            value = argv[i + 1]
        if value is not None:
            path = Path(value).expanduser()
            return path.is_file() or (path.is_dir() and any(path.iterdir()))
    return False


def remove_if_unused(out: Path, command: str) -> None:
    """After a failure: remove ``out`` when this invocation created it and it holds no work, at most the settings
    file (so nothing blocks a rerun with other settings). Rank 0 only under torchrun."""
    if not out.is_dir():  # a refusal before anything was created imports nothing
        return
    from posenc.lab.common import dist
    from posenc.lab.common.runfiles import SETTINGS_FILES, holds_only_settings

    if not dist.is_main():
        return
    if holds_only_settings(out, command):
        (out / SETTINGS_FILES[command]).unlink()
    if not any(out.iterdir()):
        out.rmdir()
