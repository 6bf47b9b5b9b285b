"""``posenc check``: what transformers, vLLM, SGLang and llama.cpp run for a model, against what posenc measured
(``posenc.runtimes.check``). Starts in a moment: nothing heavy is imported before the runtimes are read, and not at
all where the same check of the same files with the same code was kept (``posenc._check_cache``)."""

from __future__ import annotations

import argparse

from posenc import _argtypes as A
from posenc._fail import fail
from posenc.cli.parsing import Subparsers

#: Parsing fact (tests/test_cli_startup.py): ``posenc.runtimes.RUNTIMES``.
RUNTIMES = ("transformers", "vllm", "sglang", "llamacpp")


def run(args: argparse.Namespace) -> int:
    for name in args.runtimes:  # before the runtimes' readers (and torch) are imported
        if name not in RUNTIMES:
            fail("runtimes", name, f"one of {list(RUNTIMES)}")
        if args.runtimes.count(name) > 1:
            fail("runtimes", ",".join(args.runtimes), f"each of {list(RUNTIMES)} at most once")
    import json
    import sys

    from posenc import _check_cache
    from posenc._check_rows import exit_status, print_rows

    digest = None if args.no_cache else _check_cache.key(args.path, args.runtimes, args.length)
    cached = _check_cache.load(digest)
    if cached is not None:  # the same files, arguments and code: nothing heavy is imported
        rows, computed = cached
        print(f"posenc check: rows computed {computed} from these same files, arguments and installed code, kept in "
              f"{_check_cache.folder()} (--no-cache reads the model again)", file=sys.stderr)
    else:
        from posenc.runtimes.check import check as run_check
        from posenc.runtimes.check import check_runtimes

        rows = run_check(args.path, check_runtimes(args.runtimes), args.length)
        _check_cache.store(digest, rows)
    if args.json:
        print(json.dumps([row.to_dict() for row in rows], indent=2))
    else:
        print_rows(rows, title=f"What each runtime runs for {args.path}, against what posenc measured")
    return exit_status(rows, strict=args.strict)


def add(sub: Subparsers) -> None:
    p = sub.add_parser(
        "check",
        help="before you deploy: does each runtime (transformers, vLLM, SGLang, llama.cpp) run what posenc measured?",
        description="Read a model the way each runtime reads it (config.json, or a GGUF header; no weights) and "
        "compare its RoPE per layer with what posenc measured: the folder's own posenc record where posenc wrote it, "
        "else the config as transformers reads it. One row per runtime: same, differs (with the number and the "
        "fix), cannot run this, or not verified; each row names the runtime release it reads (vLLM 0.33.0, SGLang "
        "0.5.23, llama.cpp as llama-cpp-python 0.3.36 vendors it, the transformers installed). Exit status: 0 when "
        "no runtime named 'differs' or 'cannot run this' (rows 'not verified' included; with --strict only when "
        "every row is 'same'), 1 when one does (or, with --strict, one is 'not verified'), 2 for bad input. "
        "Seconds the first time (transformers' code is imported); the same check again, of the same files with the "
        "same code, prints the rows kept from the first in a fraction of a second ($POSENC_CHECK_CACHE, else "
        "~/.cache/posenc/check; --no-cache reads again).",
    )
    p.add_argument("path", help="a transformers folder, a config.json, a .gguf file, or a packaged model: smollm2, "
                   "gemma3-270m, qwen2.5-coder-0.5b")
    p.add_argument("--runtimes", type=A.names, default=RUNTIMES, help=f"comma-separated, from {','.join(RUNTIMES)}")
    p.add_argument("--length", type=A.positive_int, help="the sequence length you will run (tokens)")
    p.add_argument("--json", action="store_true", help="print the rows as JSON instead of a table")
    p.add_argument("--no-cache", action="store_true",
                   help="read the model again even where the same check, of the same files with the same code, was "
                   "kept (posenc keeps each check's rows by what they are computed from: the model's files, the "
                   "arguments, posenc, transformers and the packages installed)")
    p.add_argument(
        "--strict", action="store_true", help="exit 1 unless every runtime named is 'same' ('not verified' fails too)"
    )
    p.set_defaults(func=run)
