"""``posenc`` command line: ``build_parser`` and ``main`` here, one module per subcommand (its parser in ``add``, its
work in ``run``), the shared parsing in ``posenc.cli.parsing``.

- ``posenc lab``: the length-extrapolation study (``posenc.lab.length``): train per encoding, evaluate past L.
- ``posenc vision``: the resolution study (``posenc.lab.vision``): a ViT per 2-D encoding, tested at other sizes.
- ``posenc extend``: context extension of a trained model (``posenc.lab.extend``): perplexity and passkey.
- ``posenc export``: one patched model written as a transformers folder or a GGUF file, no study
  (``posenc.deploy``).
- ``posenc check``: what transformers, vLLM, SGLang and llama.cpp run for a model, against what posenc measured
  (``posenc.runtimes.check``); exit status 1 where a runtime differs or cannot run it (``--strict``: unless every
  runtime is the same), 0 otherwise.
- ``posenc bench``: RoPE and bias-attention speed (``posenc.lab.bench``).
- ``posenc figures``: explanatory pictures of the encodings.
- ``posenc demo``: what the RoPE scalings compute, checked live on this machine.

The rules every command follows (checks, exit statuses, imports): ``main``.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import cast

from posenc._version import __version__
from posenc.cli import bench, check, demo, export, extend, figures, lab, vision
from posenc.cli.parsing import Parser, one_line
from posenc.cli.runs import RESUMABLE, remove_if_unused, resume_command


def build_parser() -> Parser:
    parser = Parser(prog="posenc", description="Positional encodings for PyTorch transformers.")
    parser.add_argument("--version", action="version", version=f"posenc {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in (lab, vision, extend, export, check, figures, bench, demo):
        command.add(sub)
    # name -> subparser, for errors in the subcommand's own words
    parser.commands = cast("dict[str, Parser]", sub.choices)
    return parser


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``posenc *argv``; returns the exit status (0; 2 for bad input or a refused --out; 130 interrupted).

    Every expected failure is one line on stderr, ``posenc <command>: <message>``, with no traceback; an unexpected
    exception (a bug) keeps its traceback. SIGTERM is turned into KeyboardInterrupt while a command runs, so ``kill``
    stops a study the way Ctrl-C does: finished work kept, and the command that continues it printed.

    The same rules everywhere: numbers are checked by ``posenc._argtypes`` (0, negatives and NaN refused, never
    replaced by a default), ``--device`` by ``posenc._devices.resolve_device``, ``--out`` by
    ``posenc.lab.common.runfiles.check_out`` (a new or empty folder, or the command's own run) before anything is
    written; every failure is one line on stderr and exit status 2; an interrupted study prints the command that
    continues it and exits 130. Parsing imports neither torch nor transformers (``import posenc`` loads the library on
    first use): each command imports what it runs in its own function, after the checks that need no model, so a bad
    argument is refused at once; what parsing needs from modules that import torch is mirrored as "Parsing facts" in
    the subcommand modules and ``posenc.cli.parsing`` (``posenc extend``'s options come from
    ``posenc.lab.extend.settings.options``, torch-free).
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    for each in (parser, *parser.commands.values()):
        each.typed = argv
    try:
        args, unknown = parser.parse_known_args(argv)
        if unknown:  # argparse would blame the top-level parser: name the subcommand instead
            parser.commands[args.command].error(f"unrecognized arguments: {' '.join(unknown)}")
    except SystemExit as stop:  # --help (0), or a usage error already printed on one line (2)
        return 0 if stop.code is None else cast(int, stop.code)  # argparse exits with 0 or 2
    name = f"posenc {args.command}"
    out = None
    if args.command in RESUMABLE:
        if args.out is None:
            kind = "pick" if getattr(args, "pick", False) else args.command  # a --pick folder is not an extend run
            args.out = str(Path("runs") / time.strftime(f"{kind}-%Y%m%d-%H%M%S"))
        out = Path(args.out)
    existed = out is not None and out.exists()
    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        return args.func(args)
    except ValueError as err:
        if out is not None and not existed:
            remove_if_unused(out, "pick" if getattr(args, "pick", False) else args.command)
        print(f"{name}: {one_line(err)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        if out is not None and out.is_dir():
            print(
                f"{name}: interrupted; finished work is kept in {out}. Continue with:\n"
                f"  {resume_command(argv, args.out)}",
                file=sys.stderr,
            )
        elif args.command == "export":  # posenc.hf.save_pretrained and save_gguf remove what they had created
            print(f"{name}: interrupted; {args.save} was not written and nothing it created is left", file=sys.stderr)
        else:
            print(f"{name}: interrupted before anything was written", file=sys.stderr)
        return 130
    except Exception:
        if out is not None and not existed:
            remove_if_unused(out, args.command)
        raise
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
