"""``posenc check``'s rows: one runtime's verdict (``Row``), the exit status they give, and the table they print.
Standard library only (rich where it is installed), so rows read back from ``posenc._check_cache`` are printed without
torch or transformers being imported; ``posenc.runtimes.check`` computes them and re-exports these names."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from typing import Any


@dataclasses.dataclass(frozen=True)
class Row:
    """One runtime's verdict.

    Attributes:
        runtime: one of ``posenc.runtimes.RUNTIMES``.
        status: ``"same"``, ``"differs"``, ``"cannot run this"`` or ``"not verified"``.
        verdict: the status, why, the numbers and the fix, in one line.
        layers: decoder layers the runtime reads (0 when it cannot run the model).
        max_inv_freq_delta: ``max |Δ inv_freq|`` over layers and frequencies, float64 (None: nothing compared).
        max_inv_freq_ratio: the same as a multiple of the tolerance (``inv_freq_tolerance``; <= 1 is "same").
        attention_factor_delta: ``max |Δ attention factor|`` (None: nothing compared).
        rotary: rotary dims and layout as the runtime reads them, e.g. ``"64 half"`` (``"0/64 half"`` with NoPE
            layers).
        context: the longest sequence the runtime allows (None: no limit it states).
        reference: what the runtime was compared with.
        follows: the code the runtime's reading follows.
        notes: the runtime's own notes.
        version: the release of the runtime that reading follows ("vLLM 0.33.0"; transformers: the one installed).
    """

    runtime: str
    status: str
    verdict: str
    layers: int
    max_inv_freq_delta: float | None
    max_inv_freq_ratio: float | None
    attention_factor_delta: float | None
    rotary: str
    context: int | None
    reference: str
    follows: str
    notes: tuple[str, ...] = ()
    version: str = ""

    def to_dict(self) -> dict[str, Any]:
        """JSON-able (``posenc check --json``)."""
        return {**dataclasses.asdict(self), "notes": list(self.notes)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Row:
        """``to_dict``'s inverse (rows read back from ``posenc._check_cache``); a key missing or unknown raises
        ``TypeError``, a field of the wrong type ``ValueError``."""
        fields = {f.name for f in dataclasses.fields(cls)}
        if set(data) != fields:
            raise TypeError(f"a check row has the fields {sorted(fields)}, not {sorted(data)}")
        row = cls(**{**data, "notes": tuple(data["notes"])})
        if not all(isinstance(getattr(row, name), str) for name in ("runtime", "status", "verdict", "rotary")):
            raise ValueError(f"a check row's runtime, status, verdict and rotary are text: {data}")
        return row


def _number(value: float) -> str:
    return f"{value:.3g}" if value else "0"


def all_same(rows: Sequence[Row]) -> bool:
    """Whether every runtime runs what posenc measured."""
    return bool(rows) and all(row.status == "same" for row in rows)


#: The statuses that make ``posenc check`` exit 1: a runtime shown to run something else, or not at all.
FAILING = ("differs", "cannot run this")


def exit_status(rows: Sequence[Row], *, strict: bool = False) -> int:
    """``posenc check``'s exit status: 1 where a row ``differs`` or ``cannot run this`` (``strict``: where a row is
    anything but ``same``, ``not verified`` included), else 0."""
    if not rows:
        return 1
    failing = [row for row in rows if row.status != "same"] if strict else [r for r in rows if r.status in FAILING]
    return 1 if failing else 0


# ---------------------------------------------------------------------------------------------------------------
# The table


_STYLES = {"same": "green", "differs": "bold red", "cannot run this": "bold red", "not verified": "yellow"}
HEADERS = ["runtime", "release read", "verdict", "max |Δ inv_freq|", "Δ attention", "rotary", "context"]
_NUMERIC = (3, 4, 6)  # right-aligned columns


def _cells(row: Row) -> list[str]:
    delta = "-" if row.max_inv_freq_delta is None else _number(row.max_inv_freq_delta)
    factor = "-" if row.attention_factor_delta is None else _number(row.attention_factor_delta)
    context = "no limit" if row.context is None and row.layers else "-" if row.context is None else str(row.context)
    return [row.runtime, row.version or "-", row.status, delta, factor, row.rotary, context]


def _footer(rows: Sequence[Row]) -> list[tuple[str, str]]:
    """``(text, style)`` lines under the table: the reference, each verdict that is not ``same`` in full (why, the
    numbers, the fix), then the runtimes' notes."""
    lines = [(f"reference: {rows[0].reference}", "")] if rows else []
    lines += [(f"{row.runtime}: {row.verdict}", _STYLES[row.status]) for row in rows if row.status != "same"]
    lines += [(f"{row.runtime}: {note}", "dim") for row in rows for note in row.notes
              if not note.startswith("not verified")]  # those are in the verdict
    return lines


def format_rows(rows: Sequence[Row]) -> str:
    """The table as plain text: one line per runtime, then the reference, the verdicts and the notes."""
    cells = [_cells(row) for row in rows]
    widths = [max(len(h), *(len(c[j]) for c in cells)) for j, h in enumerate(HEADERS)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(HEADERS, widths, strict=True))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)) for line in cells]
    return "\n".join([*lines, *(text for text, _ in _footer(rows))])


def print_rows(rows: Sequence[Row], *, title: str | None = None, file: Any = None) -> None:
    """Print the table (one row per runtime), then each verdict that is not ``same`` in full and the notes: with rich
    where it is installed (``posenc[lab]``), as plain text otherwise. In a pipe or a file the lines are at least 200
    columns wide (``$COLUMNS`` when wider), as every posenc table."""
    import sys

    out = sys.stdout if file is None else file
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        if title:
            print(title, file=out)
        print(format_rows(rows), file=out)
        return
    table = Table()  # the title is printed above it, unwrapped: a path longer than the table stays on one line
    for j, header in enumerate(HEADERS):
        table.add_column(header, justify="right" if j in _NUMERIC else "left", style="cyan" if j == 0 else None)
    for row in rows:
        cells = [_escape(c) for c in _cells(row)]
        cells[2] = f"[{_STYLES[row.status]}]{cells[2]}[/]"
        table.add_row(*cells)
    tty = getattr(out, "isatty", lambda: False)()
    columns = os.environ.get("COLUMNS", "")
    width = None if tty else max(200, int(columns) if columns.isdigit() else 0)  # never cut at 80 in a pipe
    console = Console(file=out, width=width)
    if title:
        console.print(_escape(title), style="bold", soft_wrap=True)
    console.print(table)
    for text, style in _footer(rows):
        console.print(_escape(text), style=style or None)


def _escape(text: str) -> str:
    from rich.markup import escape

    return escape(text)
