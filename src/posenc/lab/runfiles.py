"""The files every lab command keeps in its output folder: the settings it was started with, and a keyed CSV.

``check_settings`` makes ``--resume`` safe: a folder holds one run, continued only with the settings it started
with. ``KeyedCSV`` is a long-form results file with a typed schema whose rows are identified by key columns:
measurements are upserted as they finish (atomically), so an interrupted run keeps every finished row and a resumed
one skips them. (``posenc lab``'s own CSV, with its statuses and n/a rows, is ``posenc.lab.report``.)
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from posenc._checks import fail
from posenc.lab.report import write_text_atomic


def check_settings(out: Path, settings: Mapping[str, Any], resume: bool, *, filename: str, what: str) -> None:
    """Create ``out`` and write ``settings`` to ``out/filename``, or, when a run is already there, allow only
    ``resume`` with the same settings (``what`` names the run in the errors: "study", "run")."""
    saved = out / filename
    now = json.loads(json.dumps(dict(settings)))
    if saved.exists():
        if not resume:
            fail("--out", str(out), f"a new folder, or --resume to continue the {what} already there")
        before = json.loads(saved.read_text())
        if before != now:
            changed = sorted(k for k in set(before) | set(now) if before.get(k) != now.get(k))
            fail("--resume", str(out), f"the same settings as the {what} there; these differ: {changed}")
    out.mkdir(parents=True, exist_ok=True)
    write_text_atomic(saved, json.dumps(now, indent=2))


@dataclass(frozen=True)
class KeyedCSV:
    """A results CSV: ``columns`` in order, rows identified by ``key``; ints and floats typed, empty cells None.

    Args:
        columns: every column, in file order.
        key: the columns that identify a row (a later row with the same key replaces it).
        ints, floats: columns parsed as int / float; the others stay strings.
        required: columns a file must have to be read (default ``key``).
        defaults: values for missing or empty cells (e.g. ``{"scaling": "none"}`` for older files).
        command: the command that writes the file, named in the error for a missing file.
    """

    columns: tuple[str, ...]
    key: tuple[str, ...]
    ints: frozenset[str] = frozenset()
    floats: frozenset[str] = frozenset()
    required: tuple[str, ...] | None = None
    defaults: Mapping[str, Any] = field(default_factory=dict)
    command: str = "posenc"

    def cell(self, column: str, value: object) -> str:
        """The CSV text of a value: empty for None and NaN, ``repr`` for floats (an exact round trip)."""
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return ""
        if column in self.floats:
            return repr(float(value))
        return str(value)

    def parse(self, column: str, text: str, where: str = "results.csv") -> object:
        if text == "":
            return self.defaults.get(column)
        try:
            return int(text) if column in self.ints else float(text) if column in self.floats else text
        except ValueError:
            fail(f"{where} {column}", text, "a number (fix that line, or delete the file and rerun)")
            raise AssertionError from None  # unreachable: fail raises

    def key_of(self, row: Mapping[str, Any]) -> tuple:
        """The row's key, typed as reading it back from the file would give."""
        return tuple(self.parse(c, self.cell(c, row.get(c))) for c in self.key)

    def read(self, path: str | Path) -> list[dict[str, Any]]:
        """Typed rows of the file at ``path``."""
        path = Path(path)
        if not path.is_file():
            fail("results_csv", str(path), f"an existing results CSV (run `{self.command}` first, or check --out)")
        with path.open(newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f)
            missing = [c for c in (self.required or self.key) if c not in (reader.fieldnames or [])]
            if missing:
                fail(f"{path} columns", reader.fieldnames, f"a header with {list(self.columns)} (missing {missing})")
            return [
                {c: self.parse(c, raw.get(c) or "", f"{path.name} line {n}") for c in self.columns}
                for n, raw in enumerate(reader, start=2)
            ]

    def upsert(self, path: str | Path, rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """Add ``rows`` to the file (atomically), replacing rows with the same key; returns the file's rows."""
        path = Path(path)
        merged = {self.key_of(r): r for r in (self.read(path) if path.exists() else [])}
        merged.update({self.key_of(r): r for r in rows})
        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator="\n")
        writer.writerow(self.columns)
        for row in merged.values():
            writer.writerow([self.cell(c, row.get(c) if row.get(c) is not None else self.defaults.get(c))
                             for c in self.columns])  # fmt: skip
        write_text_atomic(path, buffer.getvalue())
        return self.read(path)
