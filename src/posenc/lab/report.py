"""Results of ``posenc lab``: the long-form CSV, the tables printed and written from it, and ``OUT/report.md``.

The CSV is the one source of truth: one row per measurement, keyed by ``(encoding, scaling, finetune_steps,
train_len, eval_len, stride)``. Evaluations are upserted into it as they finish, and the tables, the plot
(``posenc.lab.plots``) and the report are drawn from it alone, never by rerunning a model. Every file is written
atomically (a temporary file in the same folder, then ``os.replace``), so an interrupted run never leaves half a file.

Columns (``RESULT_COLUMNS``; extra columns are kept after them):
    encoding        str    the position encoding trained, a ``posenc.available()`` name
    scaling         str    how it is run past the training length: ``none`` (as trained), a RoPE scaling, ...
    finetune_steps  int    steps of fine-tuning at the evaluation length; 0 or empty: zero-shot
    train_len       int    training length L in tokens
    eval_len        int    evaluation length in tokens
    stride          int    sliding-window stride; 0 or empty: non-overlapping windows
    loss            float  mean cross-entropy in nats per token = per byte (byte-level models; empty when n/a)
    ppl             float  ``exp(loss)`` (empty when n/a)
    accuracy        float  exact-match accuracy of the synthetic tasks, 0..1 (empty for language modelling)
    tokens          int    targets scored
    status          str    ``ok``, or ``n/a`` where the encoding cannot run at that length (a learned table)
"""

from __future__ import annotations

import contextlib
import csv
import datetime
import importlib.metadata
import io
import json
import math
import os
import platform
import secrets
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from posenc._checks import check_choice, check_positive_int, fail

RESULT_COLUMNS = [
    "encoding",
    "scaling",
    "finetune_steps",
    "train_len",
    "eval_len",
    "stride",
    "loss",
    "ppl",
    "accuracy",
    "tokens",
    "status",
]
#: Columns that identify a measurement; ``upsert_results`` replaces rows that agree on all of them.
KEY_COLUMNS = ("encoding", "scaling", "finetune_steps", "train_len", "eval_len", "stride")
#: Columns a results file must have (the rest default to empty).
REQUIRED_COLUMNS = ("encoding", "scaling", "train_len", "eval_len")
STATUSES = ("ok", "n/a")
METRICS = ("ppl", "loss", "accuracy")

_INT_COLUMNS = frozenset({"finetune_steps", "train_len", "eval_len", "stride", "tokens"})
_FLOAT_COLUMNS = frozenset({"loss", "ppl", "accuracy"})
_STR_COLUMNS = frozenset({"encoding", "scaling", "status"})
# Empty and 0 mean the same in these columns (no fine-tuning; non-overlapping windows).
_ZERO_DEFAULT = frozenset({"finetune_steps", "stride"})

_METRIC_TEXT = {
    "ppl": ("validation perplexity per byte", "lower is better"),  # the lab's models read bytes: a token is a byte
    "loss": ("validation loss (nats per byte)", "lower is better"),
    "accuracy": ("exact-match accuracy", "higher is better"),
}


# ---------------------------------------------------------------------------------------------------------------------
# Atomic files


def create_temp(path: str | Path) -> tuple[int, str]:
    """A new temporary file next to ``path`` for an atomic replace: ``(fd open for writing, its name)``.

    Its mode is what ``open(path, "w")`` would give: the mode of the file it replaces, else ``0o666`` less the umask
    (``tempfile.mkstemp`` makes every file private, 0600, unlike the other outputs).
    """
    path = Path(path)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)
    for _ in range(100):
        tmp = path.parent / f".{path.name}.{secrets.token_hex(4)}.tmp"
        try:
            fd = os.open(tmp, flags, 0o666)  # the kernel applies the umask, as for any new file
        except FileExistsError:
            continue
        try:
            if path.exists():
                os.chmod(tmp, path.stat().st_mode & 0o7777)
        except BaseException:
            os.close(fd)
            tmp.unlink(missing_ok=True)
            raise
        return fd, str(tmp)
    raise FileExistsError(f"no free temporary name next to {path}")


@contextlib.contextmanager
def atomic_open(path: str | Path, mode: str = "w", **kwargs: Any) -> Iterator[IO]:
    """Open a temporary file next to ``path`` for writing; on success it replaces ``path`` in one ``os.replace``.

    On an exception the temporary file is removed and ``path`` is left as it was. ``mode`` is ``"w"`` or ``"wb"``;
    ``kwargs`` go to ``open`` (text mode defaults to UTF-8 and ``newline=""``-free line endings of the platform).
    """
    if mode not in ("w", "wb"):
        fail("mode", mode, "'w' or 'wb' (atomic_open only writes)")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if mode == "w":
        kwargs.setdefault("encoding", "utf-8")
    fd, tmp = create_temp(path)
    try:
        with os.fdopen(fd, mode, **kwargs) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_text_atomic(path: str | Path, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically; returns ``path``."""
    with atomic_open(path, "w") as f:
        f.write(text)
    return Path(path)


# ---------------------------------------------------------------------------------------------------------------------
# The results CSV


def _status(row: Mapping[str, Any], where: str) -> str:
    status = row.get("status")
    if status is None or status == "":
        # Hand-made rows may leave it out: a row with a measurement is "ok", one without is "n/a".
        return "ok" if any(_is_number(row.get(c)) for c in _FLOAT_COLUMNS) else "n/a"
    if status not in STATUSES:
        fail(f"{where} status", status, "'ok', or 'n/a' where the encoding cannot run at that length")
    return status


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(value)


def _cell(column: str, value: object, where: str) -> str:
    """The CSV text of one value: empty for None and NaN, ``repr`` for floats (exact round trip)."""
    if hasattr(value, "item") and callable(value.item):  # a 0-d tensor or a numpy scalar
        value = value.item()
    if value is None:
        return ""
    if isinstance(value, bool):
        fail(f"{where} {column}", value, "a number or a string, not a bool")
    if column in _INT_COLUMNS:
        if not isinstance(value, int):
            fail(f"{where} {column}", value, "an integer")
        return str(value)
    if column in _FLOAT_COLUMNS and not isinstance(value, (int, float)):
        fail(f"{where} {column}", value, "a number, or None where there is no measurement")
    if isinstance(value, float) or column in _FLOAT_COLUMNS:
        value = float(value)
        return "" if math.isnan(value) else repr(value)
    return str(value)


def _parse(column: str, text: str, where: str) -> object:
    """The typed value of one CSV cell: int / float / str by column, None when empty."""
    if text == "":
        return None
    if column in _STR_COLUMNS:
        return text
    if column in _INT_COLUMNS:
        try:
            return int(text)
        except ValueError:
            fail(f"{where} {column}", text, "an integer (fix that line, or delete the file and rerun)")
    if column in _FLOAT_COLUMNS:
        try:
            return float(text)
        except ValueError:
            fail(f"{where} {column}", text, "a number (fix that line, or delete the file and rerun)")
    for kind in (int, float):  # a column this module does not know: the narrowest type that reads it
        with contextlib.suppress(ValueError):
            return kind(text)
    return text


def _columns(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    extra = {}
    for row in rows:
        extra.update(dict.fromkeys(k for k in row if k not in RESULT_COLUMNS))
    return RESULT_COLUMNS + list(extra)


def write_csv_atomic(rows: Sequence[Mapping[str, Any]], path: str | Path) -> Path:
    """Write result rows to ``path`` as CSV, atomically; returns ``path``.

    Columns are ``RESULT_COLUMNS`` then any extra keys in order of first appearance. Missing values, None and NaN
    are written empty; floats exactly (``repr``), so ``read_results`` gives back the same numbers.
    """
    rows = list(rows)
    for i, row in enumerate(rows):
        if not isinstance(row, Mapping):
            fail(f"rows[{i}]", row, "a dict with the keys of RESULT_COLUMNS")
    columns = _columns(rows)
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(columns)
    for i, row in enumerate(rows):
        where = f"rows[{i}]"
        cells = {c: _cell(c, row.get(c), where) for c in columns}
        cells["status"] = _status(row, where)
        writer.writerow([cells[c] for c in columns])
    return write_text_atomic(path, buffer.getvalue())


def read_results(path: str | Path) -> list[dict[str, Any]]:
    """Read a results CSV into typed rows: ints, floats, strings, None for empty cells.

    Every row has every column of ``RESULT_COLUMNS`` (missing optional columns read as None; ``status`` defaults to
    "ok" where a measurement is present, "n/a" otherwise), plus the file's extra columns.
    """
    path = Path(path)
    if not path.is_file():
        fail("results_csv", str(path), "an existing results CSV (run `posenc lab` first, or check --out)")
    with path.open(newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        header = reader.fieldnames or []
        missing = [c for c in REQUIRED_COLUMNS if c not in header]
        if missing:
            fail(f"{path} columns", header, f"a header with at least {list(REQUIRED_COLUMNS)} (missing {missing})")
        rows = []
        for line, raw in enumerate(reader, start=2):
            where = f"{path.name} line {line}"
            if None in raw:  # DictReader puts the cells beyond the header under the key None
                fail(where, raw[None], f"at most {len(header)} cells, as many as the header has")
            row = {c: None for c in RESULT_COLUMNS}
            row.update({c: _parse(c, raw[c] or "", where) for c in header})
            row["status"] = _status(row, where)
            rows.append(row)
    return rows


def result_key(row: Mapping[str, Any], key: Sequence[str] = KEY_COLUMNS) -> tuple:
    """The identity of a row: its ``key`` columns as ``read_results`` would type them (empty == 0 for
    ``finetune_steps`` and ``stride``)."""
    out = []
    for column in key:
        value = _parse(column, _cell(column, row.get(column), "row"), "row")
        out.append(0 if value is None and column in _ZERO_DEFAULT else value)
    return tuple(out)


def upsert_results(
    path: str | Path, rows: Sequence[Mapping[str, Any]], key: Sequence[str] = KEY_COLUMNS
) -> list[dict[str, Any]]:
    """Add ``rows`` to the results CSV at ``path``, replacing any row with the same ``key``; atomic.

    Existing rows keep their order (a replaced row keeps its place); new rows are appended in the order given (the
    last of several with one key wins). The file is created when missing. Returns the rows now in the file.
    """
    path = Path(path)
    if isinstance(key, str) or not key:
        fail("key", key, f"a non-empty sequence of column names, e.g. {KEY_COLUMNS}")
    merged: dict[tuple, Mapping[str, Any]] = {}
    for row in read_results(path) if path.exists() else []:
        merged[result_key(row, key)] = row
    for row in rows:
        merged[result_key(row, key)] = row  # an existing key keeps its position in the dict
    write_csv_atomic(list(merged.values()), path)
    return read_results(path)


# ---------------------------------------------------------------------------------------------------------------------
# Tables


def _group_key(row: Mapping[str, Any]) -> tuple:
    return result_key(row, ("encoding", "scaling", "finetune_steps", "train_len", "stride"))


def _format_value(value: float, metric: str) -> str:
    if not math.isfinite(value):
        return str(value)
    if metric == "accuracy":
        return f"{100 * value:.1f}%"
    if metric == "loss":
        return f"{value:.3f}"
    return f"{value:.2f}" if abs(value) < 1e6 else f"{value:.3g}"


def _table(rows: Sequence[Mapping[str, Any]], metric: str) -> tuple[list[str], int, list[list[str]], list[list[bool]]]:
    """Headers, the number of label columns, cells, and which cells hold the best value of their column."""
    check_choice("metric", metric, METRICS)
    rows = list(rows)
    groups: dict[tuple, dict[int, Mapping[str, Any]]] = {}
    order: dict[Any, int] = {}
    for row in rows:
        group = _group_key(row)
        order.setdefault(group[0], len(order))  # encodings in order of first appearance
        order.setdefault(group[:2], len(order))  # then their scalings
        groups.setdefault(group, {})[row.get("eval_len")] = row
    # As trained ("none") first in each encoding, then the others in the order they were run.
    ranked = sorted(groups, key=lambda g: (order[g[0]], g[1] != "none", order[g[:2]], g[2], g[3], g[4]))
    lengths = sorted({r.get("eval_len") for r in rows if isinstance(r.get("eval_len"), int)})
    train_lens = sorted({g[3] for g in groups if g[3] is not None})
    labels = ["encoding", "scaling"]
    show_finetune = any(g[2] for g in groups)
    show_train = len(train_lens) > 1
    show_stride = len({g[4] for g in groups}) > 1
    labels += ["finetune steps"] * show_finetune + ["train len"] * show_train + ["stride"] * show_stride
    if len(train_lens) == 1:
        lengths_header = [f"{n} (train)" if n == train_lens[0] else f"{n} ({n / train_lens[0]:g}x)" for n in lengths]
    else:
        lengths_header = [str(n) for n in lengths]
    values: list[list[float | None]] = []
    cells: list[list[str]] = []
    for group in ranked:
        label = [str(group[0]), str(group[1])]
        label += [str(group[2])] * show_finetune + [str(group[3])] * show_train + [str(group[4])] * show_stride
        line_values, line_cells = [], []
        for n in lengths:
            row = groups[group].get(n)
            value = None if row is None else row.get(metric)
            if row is None:
                text = "-"  # not measured
            elif row.get("status") == "n/a" or not _is_number(value):
                text, value = "n/a", None
            else:
                text = _format_value(float(value), metric)
            line_values.append(value)
            line_cells.append(text)
        values.append(line_values)
        cells.append(label + line_cells)
    best = [[False] * len(labels) + [False] * len(lengths) for _ in ranked]
    pick = max if metric == "accuracy" else min
    for j in range(len(lengths)):
        column = [(i, v[j]) for i, v in enumerate(values) if v[j] is not None and math.isfinite(v[j])]
        if len(column) > 1:
            top = pick(v for _, v in column)
            for i, v in column:
                best[i][len(labels) + j] = v == top
    return labels + lengths_header, len(labels), cells, best


def format_table(rows: Sequence[Mapping[str, Any]], metric: str = "ppl") -> str:
    """A markdown table of ``metric``: one row per encoding and scaling, one column per evaluation length.

    Cells read "n/a" where the encoding cannot run at that length and "-" where nothing was measured; the best
    value of each column (lowest perplexity or loss, highest accuracy) is bold. Finetune, train-length and stride
    columns appear only when they vary. Headers give the evaluation length and its multiple of the training length.
    """
    headers, n_labels, cells, best = _table(rows, metric)
    cells = [
        [f"**{c}**" if b else c for c, b in zip(line, flags, strict=True)]
        for line, flags in zip(cells, best, strict=True)
    ]
    widths = [max(len(h), 3, *(len(line[j]) for line in cells)) for j, h in enumerate(headers)]

    def line(parts: Sequence[str]) -> str:
        pairs = enumerate(zip(parts, widths, strict=True))
        padded = [p.ljust(w) if j < n_labels else p.rjust(w) for j, (p, w) in pairs]
        return "| " + " | ".join(padded) + " |"

    rule = "|" + "|".join(":" + "-" * (w + 1) if j < n_labels else "-" * (w + 1) + ":" for j, w in enumerate(widths))
    return "\n".join([line(headers), rule + "|", *(line(c) for c in cells)]) + "\n"


def wide_console() -> Any:
    """A ``rich.console.Console`` on stdout that never cuts a table at 80 columns when stdout is a file or a pipe.

    rich assumes 80 columns when stdout is not a terminal; logs and ``| tee`` would get wrapped, truncated tables.
    On a terminal the terminal's width holds; elsewhere at least 200 columns (or ``$COLUMNS`` when wider).
    """
    from rich.console import Console

    if sys.stdout.isatty():
        return Console()
    columns = os.environ.get("COLUMNS", "")
    return Console(width=max(200, int(columns) if columns.isdigit() else 0))


def print_table(
    rows: Sequence[Mapping[str, Any]], metric: str = "ppl", *, console: Any = None, title: str | None = None
) -> None:
    """Print the ``format_table`` table to the console with rich: best values bold green, "n/a" dimmed.

    Args:
        rows: result rows (``read_results``).
        metric: "ppl", "loss" or "accuracy".
        console: a ``rich.console.Console``; a new one on stdout by default.
        title: the table's title; by default the metric and which way is better.
    """
    from rich.markup import escape
    from rich.table import Table

    headers, n_labels, cells, best = _table(rows, metric)
    name, better = _METRIC_TEXT[metric]
    table = Table(title=title or f"{name.capitalize()} by evaluation length ({better})")
    for j, header in enumerate(headers):
        table.add_column(header, justify="left" if j < n_labels else "right", style="cyan" if j == 0 else None)
    for line, flags in zip(cells, best, strict=True):
        table.add_row(
            *(
                f"[bold green]{escape(c)}[/]" if b else f"[dim]{c}[/]" if c in ("n/a", "-") else escape(c)
                for c, b in zip(line, flags, strict=True)
            )
        )
    (console or wide_console()).print(table)


# ---------------------------------------------------------------------------------------------------------------------
# Environment and report


def _git(*args: str, cwd: Path) -> str | None:
    try:
        done = subprocess.run(("git", *args), cwd=cwd, capture_output=True, text=True, timeout=5, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def environment(device: str | None = None) -> dict[str, Any]:
    """Versions, hardware and source revision, for the record (JSON-able values).

    ``git_sha`` is the commit of the checkout ``posenc`` is imported from, None for an installed package (the
    package file must be tracked by that repository, so a virtualenv inside some other repository gives None).
    ``git_dirty`` says whether that checkout has uncommitted changes. ``device`` is what the caller ran on; by
    default the first CUDA device if there is one, else "cpu".
    """
    import torch

    import posenc

    here = Path(posenc.__file__).resolve().parent
    sha = None
    dirty = None
    if _git("ls-files", "--error-unmatch", "__init__.py", cwd=here) is not None:
        sha = _git("rev-parse", "HEAD", cwd=here)
        status = _git("status", "--porcelain", "--untracked-files=no", cwd=here)
        dirty = None if status is None else bool(status)
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    device = str(device)
    if device.startswith("cuda") and torch.cuda.is_available():
        index = torch.device(device).index or 0
        device = f"{device} ({torch.cuda.get_device_name(index)})"
    elif device == "cpu":
        device = f"cpu ({platform.processor() or platform.machine()})"
    versions = {}
    for package in ("numpy", "matplotlib", "rich", "safetensors"):
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            versions[package] = None
    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "torch": torch.__version__,
        "posenc": posenc.__version__,
        **versions,
        "git_sha": sha,
        "git_dirty": dirty,
        "device": device,
        "cuda": torch.version.cuda,
        "threads": torch.get_num_threads(),
        "cpus": os.cpu_count(),
        "time_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def duration(seconds: float) -> str:
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes} min {rest} s ({seconds:.1f} s)" if minutes else f"{seconds:.1f} s"


def _metric_of(rows: Sequence[Mapping[str, Any]]) -> str:
    if any(_is_number(r.get("ppl")) for r in rows) or not any(_is_number(r.get("accuracy")) for r in rows):
        return "ppl"
    return "accuracy"


def write_report(
    out_dir: str | Path,
    *,
    results_csv: str | Path,
    config: Mapping[str, Any],
    environment: Mapping[str, Any],
    seconds: float,
    findings: Sequence[str],
    metric: str | None = None,
    figure: str | Path = "extrapolation.png",
) -> Path:
    """Write ``out_dir/report.md`` (atomically) and return its path.

    Sections: the results table (from ``results_csv``), the figure, the findings, the configuration, the
    environment and the time taken. Nothing is measured here.

    Args:
        out_dir: the study folder; the report links files relative to it.
        results_csv: the long-form results (``read_results``).
        config: the study configuration (JSON-able; written as a JSON block).
        environment: ``environment()``.
        seconds: wall time of the whole study.
        findings: one statement per line, computed by the caller from the table (``findings_markdown``: a leading
            "- " is optional, a line ending in ":" introduces the bullets after it, "" ends a group).
        metric: the table's metric; by default "ppl" when the CSV has perplexities, else "accuracy".
        figure: the plot, a path relative to ``out_dir`` (or absolute).
    """
    out_dir = Path(out_dir)
    rows = read_results(results_csv)
    metric = check_choice("metric", metric, METRICS) if metric is not None else _metric_of(rows)
    name, better = _METRIC_TEXT[metric]
    figure_path = Path(figure) if Path(figure).is_absolute() else out_dir / figure
    figure_link = Path(os.path.relpath(figure_path, out_dir)).as_posix()
    csv_link = Path(os.path.relpath(Path(results_csv), out_dir)).as_posix()
    train_lens = sorted({r["train_len"] for r in rows if r["train_len"] is not None})
    lengths = sorted({r["eval_len"] for r in rows if r["eval_len"] is not None})
    encodings = list(dict.fromkeys(r["encoding"] for r in rows))
    task = config.get("task", "lm")
    what = "byte-level language models" if task == "lm" else f"models on the `{task}` task"
    lines = [
        "# posenc lab: length extrapolation",
        "",
        f"Tiny {what}, one per encoding ({', '.join(f'`{e}`' for e in encodings) or 'none'}), trained at "
        f"{' / '.join(map(str, train_lens)) or '?'} tokens and evaluated at {', '.join(map(str, lengths)) or '?'} "
        f"tokens. Time taken: {duration(seconds)}.",
        "",
        "## Results",
        "",
        f"{name.capitalize()} ({better}) by evaluation length in tokens (one token per byte). Rows: each encoding "
        "as trained "
        "(`none`) and with each way of running it past the training length. `n/a`: the encoding cannot run at that "
        "length (a learned table ends at the training length); `-`: not measured. Bold: the best in its column. "
        f"All numbers: [{csv_link}]({csv_link}).",
        "",
        format_table(rows, metric),
    ]
    if figure_path.exists():
        lines += [f"![{name} by evaluation length]({figure_link})", ""]
    else:
        lines += [f"(No figure at `{figure_link}`: draw it with `posenc.lab.plots.plot_extrapolation`.)", ""]
    lines += ["## Findings", "", *findings_markdown(findings)]
    if not findings:
        lines.append("No findings were computed for this run.")
    lines += ["", *config_and_environment(config, environment, seconds)]
    return write_text_atomic(out_dir / "report.md", "\n".join(lines))


def wilson_interval(accuracy: float, n: int, *, z: float = 1.959963984540054) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion: ``accuracy`` measured on ``n`` trials (95% by default).

    Unlike ``p +- z sqrt(p (1 - p) / n)`` it stays inside [0, 1] and is not empty at 0% or 100% (Wilson 1927;
    Brown, Cai & DasGupta 2001 recommend it for small n): centre ``(p + z^2/2n) / (1 + z^2/n)``, half-width
    ``z sqrt(p (1 - p) / n + z^2 / 4n^2) / (1 + z^2/n)``.
    """
    check_positive_int("n", n)
    if isinstance(accuracy, bool) or not isinstance(accuracy, (int, float)) or not 0 <= accuracy <= 1:
        fail("accuracy", accuracy, "a fraction in [0, 1]")
    z2 = z * z
    centre = (accuracy + z2 / (2 * n)) / (1 + z2 / n)
    half = z * math.sqrt(accuracy * (1 - accuracy) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def findings_markdown(findings: Sequence[str]) -> list[str]:
    """Markdown lines for findings: each statement a bullet ("- " added where missing); a statement ending in ":"
    is a paragraph introducing the bullets after it, with blank lines around it (a line right after a bullet would
    otherwise continue that bullet); "" separates groups. No empty bullet, no doubled blank line."""
    lines: list[str] = []
    for finding in findings:
        text = str(finding).rstrip()
        if not text.strip() or text.strip() in ("-", "*"):
            if lines and lines[-1]:
                lines.append("")
        elif text.endswith(":") and not text.startswith(("- ", "* ")):
            if lines and lines[-1]:
                lines.append("")
            lines += [text, ""]
        else:
            lines.append(text if text.startswith(("- ", "* ")) else f"- {text}")
    while lines and not lines[-1]:
        lines.pop()
    return lines


def config_and_environment(config: Mapping[str, Any], environment: Mapping[str, Any], seconds: float) -> list[str]:
    """The closing sections of a report: the configuration as JSON and the environment table, with the time."""
    return [
        "## Configuration",
        "",
        "```json",
        json.dumps(dict(config), indent=2, default=str),
        "```",
        "",
        "## Environment",
        "",
        "| | |",
        "|:--|:--|",
        *(f"| {key} | {'' if value is None else value} |" for key, value in environment.items()),
        f"| time taken | {duration(seconds)} |",
        "",
    ]
