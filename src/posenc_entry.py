"""The ``posenc`` command's entry point, kept outside the ``posenc`` package on purpose.

Importing ``posenc`` imports torch, which takes seconds; a Ctrl-C in those seconds would end in a traceback if the
console script imported ``posenc.cli`` itself. Here the import is inside a ``try``: Ctrl-C while starting is one line
on stderr and exit status 130, as everywhere else in the command line.
"""

from __future__ import annotations

import sys


def main() -> int:
    try:
        from posenc.cli import main as run
    except KeyboardInterrupt:
        print("posenc: interrupted while starting; nothing was done", file=sys.stderr)
        return 130
    return run()
