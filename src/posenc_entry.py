"""The ``posenc`` command's entry point, kept outside the ``posenc`` package on purpose.

Importing ``posenc`` imports torch, which takes seconds; a Ctrl-C in those seconds would end in a traceback if the
console script imported ``posenc.cli`` itself. Here the import is inside a ``try``: Ctrl-C while starting is one line
on stderr and exit status 130, as everywhere else in the command line. Output piped into a reader that closes early
(``posenc check DIR --json | head``) ends quietly, as a Unix tool's does (exit status 141: SIGPIPE).
"""

from __future__ import annotations

import os
import sys


def main() -> int:
    try:
        from posenc.cli import main as run
    except KeyboardInterrupt:
        print("posenc: interrupted while starting; nothing was done", file=sys.stderr)
        return 130
    try:
        return run()
    except BrokenPipeError:
        # the reader is gone: nothing more can be shown; stdout is pointed at /dev/null so that flushing it at exit
        # raises nothing more
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141
