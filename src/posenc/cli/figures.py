"""``posenc figures``: explanatory pictures of the encodings (``posenc.lab.figures``)."""

from __future__ import annotations

import argparse

from posenc.cli.parsing import Subparsers


def run(args: argparse.Namespace) -> int:
    from posenc.lab.common.runfiles import check_out, write_marker
    from posenc.lab.figures import draw_figures

    check_out(args.out, "figures")
    write_marker(args.out, "figures", {})
    for path in draw_figures(args.out):
        print(path)
    return 0


def add(sub: Subparsers) -> None:
    p = sub.add_parser("figures", help="draw the explanatory pictures (sinusoids, ALiBi, RoPE decay, scalings)")
    p.add_argument("--out", default="figures", help="output folder: new, empty, or an earlier `posenc figures` one")
    p.set_defaults(func=run)
