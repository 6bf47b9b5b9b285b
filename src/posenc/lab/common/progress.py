"""What the lab's loops tell the user as they go: a rich progress bar per unit of work, and what a resumed run skips.

The messages are printed with plain ``print`` before a bar starts (never while one is live), so rich's redrawing
does not garble them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def progress_bar(enabled: bool, total: int, description: str) -> Iterator[Any]:
    """A rich progress bar yielding ``advance()``; does nothing when disabled or when there is nothing to do."""
    if not enabled or total == 0:
        yield lambda: None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns) as bar:
        task = bar.add_task(description, total=total)
        yield lambda: bar.advance(task)


def skipped(name: str, done: int, total: int, what: str = "evaluations") -> str | None:
    """What a resumed run says about ``name``'s ``total`` measurements, ``done`` of them already in its results file:
    "alibi: 10 of 10 evaluations done, skipped", "rope: 3 of 10 evaluations done, skipped; measuring the other 7";
    None when none were done (a fresh run says nothing)."""
    if done == 0:
        return None
    text = f"{name}: {done} of {total} {what} done, skipped"
    return text if done >= total else f"{text}; measuring the other {total - done}"
