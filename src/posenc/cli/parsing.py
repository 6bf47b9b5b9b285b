"""What the ``posenc`` subcommands share: the parser class (one-line errors, defaults in ``--help``), the
--out/--resume/--quiet options and what the studies do with them, and the parsing facts mirrored from modules that
import torch."""

from __future__ import annotations

import argparse
import re
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

# ---------------------------------------------------------------------------------------------------------------------
# Parsing facts: what the parsers need from modules that import torch, here so that parsing imports neither torch
# nor transformers (tests/test_cli_startup.py checks each against its source; the lab's and vision's are in
# posenc.cli.lab and posenc.cli.vision, the runtimes in posenc.cli.check).

#: ``posenc.gguf.write.TENSOR_TYPES``
TENSOR_TYPES = ("source", "F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1")

#: What argparse's ``add_subparsers()`` returns: subcommand modules add their parser to it.
Subparsers = argparse._SubParsersAction


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows "(default: ...)" for every option with a default of its own, comma-joined for lists."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if action.default in (None, argparse.SUPPRESS) or action.default is False or "default" in text:
            return text
        return f"{text} (default: {_shown(action.default)})".replace("%", "%%").lstrip()


def _shown(value: object) -> str:
    if isinstance(value, (tuple, list)):
        return ",".join(_shown(v) for v in value)
    return f"{value:g}" if isinstance(value, float) else str(value)


class Parser(argparse.ArgumentParser):
    """One line on stderr for a usage error (``posenc lab: argument --steps: ... (see posenc lab --help)``), exit 2,
    options never abbreviated (``--resume`` must mean --resume), and defaults in every ``--help``."""

    def __init__(self, *args, **kwargs) -> None:  # noqa: ANN002, ANN003
        kwargs.setdefault("formatter_class", HelpFormatter)
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    #: The command line being parsed (set by ``main``): an option with two spellings is named as it was typed.
    typed: Sequence[str] = ()
    #: Subcommand name -> its parser (set by ``build_parser`` on the top-level one).
    commands: dict[str, Parser]

    def error(self, message: str) -> NoReturn:
        found = re.match(r"argument ((?:-[\w-]+/)+-[\w-]+): ", message)
        if found:  # "argument --factor/--factors: ..." -> the spelling on the command line
            typed = [o for o in found.group(1).split("/") if any(t == o or t.startswith(o + "=") for t in self.typed)]
            if typed:
                message = message.replace(found.group(1), typed[0], 1)
        self.exit(2, f"{self.prog}: {one_line(message)} (see {self.prog} --help)\n")


def one_line(text: object) -> str:
    return " ".join(str(text).split("\n"))


def add_run_options(p: argparse.ArgumentParser, command: str, what: str) -> None:
    """--out, --resume and --quiet, the same for lab, vision and extend."""
    p.add_argument(
        "--out",
        help=f"output folder: new, empty, or a `posenc {command}` run to --resume (default: runs/{command}-<time>)",
    )
    p.add_argument("--resume", action="store_true", help=f"continue the {what} in --out where it stopped")
    p.add_argument("--quiet", action="store_true", help="no progress bars or tables; only where the results went")


def given(value, default):  # noqa: ANN001, ANN201
    """The user's value, 0 included; the default only for an option not given."""
    return default if value is None else value


def wrote(out: str | Path) -> None:
    """The one line ``--quiet`` still prints: where the results went (rank 0 only under torchrun)."""
    from posenc.lab.common import dist

    if dist.is_main():
        files = sorted(p.name for p in Path(out).iterdir() if not p.name.startswith("."))
        print(f"results in {out}: {', '.join(files)}")
