"""mkdocs hook: the command-line reference, rendered from ``posenc.cli.build_parser()`` at build time.

``docs/reference/cli.md`` holds the marker ``<!-- cli-reference -->``; this hook replaces it with ``posenc --help``
and each subcommand's ``--help`` (argparse's own ``format_help()``), so the page cannot drift from the parsers.
"""

from __future__ import annotations

import os

MARKER = "<!-- cli-reference -->"


def _help(parser) -> str:  # noqa: ANN001
    return parser.format_help().rstrip()


def render() -> str:
    """The markdown for every ``posenc`` command: the top-level help, then one section per subcommand."""
    os.environ.setdefault("COLUMNS", "100")  # argparse wraps to the terminal: a fixed width, the same every build
    from posenc.cli import build_parser

    parser = build_parser()
    parts = ["## `posenc`", "", "```text", _help(parser), "```"]
    for name, sub in parser.commands.items():
        parts += ["", f"## `posenc {name}`", "", "```text", _help(sub), "```"]
    return "\n".join(parts) + "\n"


def on_page_markdown(markdown: str, page, config, files) -> str:  # noqa: ANN001, ARG001
    if MARKER not in markdown:
        return markdown
    return markdown.replace(MARKER, render())
