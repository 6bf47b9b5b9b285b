"""mkdocs hook: the command-line reference, rendered from ``posenc.cli.build_parser()`` at build time.

``docs/reference/cli.md`` holds the marker ``<!-- cli-reference -->``; this hook replaces it with ``posenc --help``
and each subcommand's ``--help`` (argparse's own ``format_help()``), so the page cannot drift from the parsers.
"""

from __future__ import annotations

import contextlib
import os

MARKER = "<!-- cli-reference -->"


def _help(parser) -> str:  # noqa: ANN001
    return parser.format_help().rstrip()


#: The terminal width argparse wraps the help to: the same every build, and narrow enough for the lines (78
#: characters) to fit the site's code column on a desktop screen (about 80), where docs/stylesheets/extra.css
#: wraps what is wider.
COLUMNS = 80


@contextlib.contextmanager
def _columns(width: int):  # noqa: ANN202
    """``$COLUMNS`` set to ``width`` for argparse (``shutil.get_terminal_size``), then restored."""
    before = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = str(width)
    try:
        yield
    finally:
        if before is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = before


def render() -> str:
    """The markdown for every ``posenc`` command: the top-level help, then one section per subcommand."""
    from posenc.cli import build_parser

    with _columns(COLUMNS):
        parser = build_parser()
        parts = ["## `posenc`", "", "```text", _help(parser), "```"]
        for name, sub in parser.commands.items():
            parts += ["", f"## `posenc {name}`", "", "```text", _help(sub), "```"]
    return "\n".join(parts) + "\n"


def on_page_markdown(markdown: str, page, config, files) -> str:  # noqa: ANN001, ARG001
    if MARKER not in markdown:
        return markdown
    return markdown.replace(MARKER, render())
