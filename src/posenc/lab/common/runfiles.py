"""The files every lab command keeps in its output folder: the settings it was started with, and a keyed CSV.

``check_out`` keeps posenc out of folders that are not its own: a command writes only into a new or empty folder or
one its own settings file marks (``SETTINGS_FILES``), and checks that before writing a byte. ``check_settings``
makes ``--resume`` safe: a folder holds one run, continued only with the settings it started with. ``KeyedCSV`` is
a long-form results file with a typed schema whose rows are identified by key columns: measurements are upserted as
they finish (atomically), so an interrupted run keeps every finished row and a resumed one skips them.
(``posenc lab``'s own CSV, with its statuses and n/a rows, is ``posenc.lab.length.report``.)
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

from posenc._checks import check_choice, fail
from posenc.lab.common.files import read_json, write_text_atomic

#: The settings file that marks a folder as the run of each command: posenc writes only into a new or empty folder
#: or one holding its own command's file (which also names the command, ``"command": "posenc lab"``).
SETTINGS_FILES = {
    "lab": "study.json",
    "vision": "vision.json",
    "extend": "extend.json",
    "pick": "pick.json",
    "figures": "figures.json",
    "bench": "bench.json",
}

#: What a command is called on the command line where that is not ``posenc <command>``; a settings file names it so.
COMMAND_LINES = {"pick": "posenc extend --pick"}
#: Markers older files hold for a command (a pick folder said "posenc pick" until 2026-11-27): still theirs.
OLD_MARKERS = {"pick": ("posenc pick",)}


def command_line(command: str) -> str:
    """``posenc lab``; ``posenc extend --pick`` for ``pick``: the command as a user types it."""
    return COMMAND_LINES.get(command, f"posenc {command}")


def check_out(out: str | Path, command: str) -> dict[str, Any] | None:
    """Refuse an output folder ``posenc <command>`` must not write into; reads only, writes nothing.

    Allowed: a path that does not exist yet, an empty folder, or a folder holding ``SETTINGS_FILES[command]`` written
    by the same command. Returns the settings saved there (without the ``command`` marker), or None for a new or
    empty folder.

    Raises:
        ValueError: naming ``--out``, its value and what is allowed: for a file, a folder of another posenc command,
            or any other folder with something in it (a user's folder is never written into).
    """
    check_choice("command", command, list(SETTINGS_FILES))
    out = Path(out)
    filename = SETTINGS_FILES[command]
    allowed = f"a new or empty folder, or a `{command_line(command)}` output folder (one with {filename})"
    if out.exists() and not out.is_dir():
        fail("--out", str(out), f"{allowed}; this is a file")
    if not out.exists():
        return None
    names = sorted(p.name for p in out.iterdir())
    if filename not in names:
        if not names:
            return None
        others = [f"`{command_line(c)}` ({f})" for c, f in SETTINGS_FILES.items() if f in names]
        holds = f"a {others[0]} run" if others else f"other files: {_listing(names)}"
        fail("--out", str(out), f"{allowed}; it holds {holds}")
    saved = read_json(out / filename, f"--out {filename}")
    marker = saved.pop("command", None) if isinstance(saved, dict) else None
    if not isinstance(saved, dict) or marker not in (None, command_line(command), *OLD_MARKERS.get(command, ())):
        # None: a file from before the marker; its name alone says the command.
        fail("--out", str(out), f"{allowed}; its {filename} was written by {marker or 'something else'}")
    return saved


def _listing(names: list[str], n: int = 5) -> str:
    return ", ".join(names[:n]) + (f" and {len(names) - n} more" if len(names) > n else "")


def holds_only_settings(out: str | Path, command: str) -> bool:
    """True when ``out`` is a folder holding nothing but ``posenc <command>``'s settings file: no work to lose."""
    out = Path(out)
    return out.is_dir() and sorted(p.name for p in out.iterdir()) == [SETTINGS_FILES[command]]


def check_settings(out: str | Path, settings: Mapping[str, Any], resume: bool, *, command: str, what: str) -> None:
    """Create ``out`` and write ``settings`` to its settings file, or, when a run is already there, allow only
    ``resume`` with the same settings (``what`` names the run in the errors: "study", "run").

    Checks everything (``check_out``) before writing a byte. A folder holding only the settings file (a run that
    stopped before doing any work) is taken over with the new settings, with or without ``resume``: nothing there
    can be lost or mixed.
    """
    now = check_resumable(out, settings, resume, command=command, what=what)
    write_marker(out, command, now)


def check_resumable(out: str | Path, settings: Mapping[str, Any], resume: bool, *, command: str, what: str) -> dict:
    """``check_settings`` without writing: raises where ``out`` holds another run, or this one with other settings
    (e.g. before slow preparation that would otherwise come first); returns the settings as JSON would store them."""
    out = Path(out)
    before = check_out(out, command)
    now = json.loads(json.dumps(dict(settings)))
    if before is not None and not holds_only_settings(out, command):
        if not resume:
            fail("--out", str(out), f"a new folder, or --resume to continue the {what} already there")
        if before != now:
            keys = set(before) | set(now)
            changed = sorted(k for k in keys if (k in before, before.get(k)) != (k in now, now.get(k)))
            fail("--resume", str(out), f"the same settings as the {what} there; these differ: {changed}")
    return now


def write_marker(out: str | Path, command: str, settings: Mapping[str, Any]) -> Path:
    """Create ``out`` and write ``{"command": command_line(command), **settings}`` to its settings file, atomically.
    Call ``check_out`` first."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    text = json.dumps({"command": command_line(command), **settings}, indent=2)
    return write_text_atomic(out / SETTINGS_FILES[command], text)


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
                             for c in self.columns])
        write_text_atomic(path, buffer.getvalue())
        return self.read(path)
