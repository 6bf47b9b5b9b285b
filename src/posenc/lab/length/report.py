"""Results of ``posenc lab``: the long-form CSV, the tables and findings drawn from it, and ``OUT/report.md``.

The CSV is the one source of truth: one row per measurement, keyed by ``(encoding, scaling, finetune_steps, train_len,
eval_len, stride)``. Evaluations are upserted into it as they finish, and the tables, the findings, the plot
(``posenc.lab.length.plot``) and the report are drawn from it alone, never by rerunning a model. Every file is written
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
import io
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from posenc._checks import check_choice, fail
from posenc.lab.common.files import write_text_atomic
from posenc.lab.common.gpt import split_encoding, split_local
from posenc.lab.common.report import config_and_environment, duration, findings_markdown, wide_console
from posenc.lab.length.evaluate import extension_names

if TYPE_CHECKING:
    from posenc.lab.length.config import StudyConfig

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
# Findings


def findings_for(rows: Sequence[dict], cfg: StudyConfig) -> list[str]:
    """Plain statements about the measured table: the literature's pattern at 8x, then each encoding's ratio."""
    if cfg.task != "lm":
        return _task_findings(rows, cfg)
    far = cfg.train_len * 8
    by = {
        (r["encoding"], r["scaling"], r["eval_len"]): r for r in rows if r["status"] == "ok" and not r["finetune_steps"]
    }
    lines = _literature_check(by, cfg, far)
    for encoding in cfg.encodings:
        for extension in extension_names(encoding):
            base, long = by.get((encoding, "none", cfg.train_len)), by.get((encoding, extension, far))
            if base is None:
                continue
            label = encoding if extension == "none" else f"{encoding} + {extension}"
            if long is None:
                lines.append(f"- {label}: not applicable at 8x ({far} tokens)")
                continue
            ratio = long["ppl"] / base["ppl"]
            lines.append(
                f"- {label}: perplexity {base['ppl']:.2f} at {cfg.train_len} -> {long['ppl']:.2f} at {far} "
                f"({ratio:.2f}x)"
            )
    if "rope" in cfg.encodings and cfg.extensions:
        lines.append(
            "- dynamic NTK equals NTK here by construction: every evaluation window has the same length L', so "
            "dynamic's per-call factor is L'/L, NTK's static one."
        )
    return lines


def _ratio(by: dict, encoding: str, extension: str, train_len: int, far: int) -> float | None:
    base, long = by.get((encoding, "none", train_len)), by.get((encoding, extension, far))
    return None if base is None or long is None else long["ppl"] / base["ppl"]


def _literature_check(by: dict, cfg: StudyConfig, far: int) -> list[str]:
    """Press et al. 2022 (Fig. 1): at several times the training length ALiBi stays near its own perplexity while
    sinusoidal (and learned) positions degrade badly. Say whether this run shows it, with the numbers."""
    if far not in cfg.lengths:
        return []
    lines = [f"Literature check at 8x the training length ({far} tokens):"]
    alibi = _ratio(by, "alibi", "none", cfg.train_len, far)
    if alibi is not None:
        verdict = (
            "within 10% of its own perplexity at 1x, as in the ALiBi paper"
            if alibi <= 1.10
            else "NOT within 10% of its own perplexity at 1x, unlike the ALiBi paper (too few --steps?)"
        )
        lines.append(f"- ALiBi: {alibi:.2f}x, {verdict}.")
    sinus = _ratio(by, "sinusoidal", "none", cfg.train_len, far)
    if sinus is not None:
        verdict = "far worse, as in the paper" if sinus > 1.5 else "not far worse, unlike the paper"
        lines.append(f"- sinusoidal: {sinus:.2f}x, {verdict}.")
    if "learned" in cfg.encodings:
        interp = _ratio(by, "learned", "interpolate", cfg.train_len, far)
        text = "" if interp is None else f"; with its table linearly interpolated to {far} positions: {interp:.2f}x"
        lines.append(f"- learned: cannot run past its {cfg.train_len}-entry table as trained{text}.")
    lines += _newer_claims(by, cfg, far)
    lines.append("")
    return lines


#: The later papers' claims, checked the same way at 8x: (encoding, rivals, paper, its claim). Each line appears
#: when the encoding and at least one rival ran.
NEWER_CLAIMS = (
    ("kerple", ("alibi",), "Chi et al. 2022", "KERPLE extrapolates better than ALiBi"),
    ("sandwich", ("alibi",), "Chi et al. 2023", "Sandwich extrapolates like ALiBi"),
    ("fire", ("t5", "alibi", "kerple"), "Li et al. 2024", "FIRE beats T5, ALiBi and KERPLE at long lengths"),
    ("p_rope", ("rope",), "Barbero et al. 2024", "dropping RoPE's lowest frequencies loses nothing"),
    ("cope", ("rope",), "Golovneva et al. 2024", "CoPE generalises to longer contexts than RoPE"),
)


def _newer_claims(by: dict, cfg: StudyConfig, far: int) -> list[str]:
    """One line per later paper whose encodings ran: its claim, the perplexities at 8x, and whether they agree."""
    at = {e: by[(e, "none", far)]["ppl"] for (e, s, n) in by if s == "none" and n == far}
    claims = list(NEWER_CLAIMS)
    hybrids = [e for e in cfg.encodings if "/" in e and split_encoding(split_local(e)[0], "encodings")[0] == "rope"]
    claims += [
        (e, ("rope",), "Yang et al. 2025", "a RoPE/NoPE hybrid extrapolates better than RoPE alone") for e in hybrids
    ]
    lines = []
    for encoding, rivals, paper, claim in claims:
        ran = [r for r in rivals if r in at]
        if encoding not in at or not ran:
            continue
        mine = at[encoding]
        numbers = ", ".join(f"{r} {at[r]:.2f}" for r in ran)
        if encoding in ("sandwich", "p_rope"):  # claims of parity: within 10%
            held = all(mine <= 1.10 * at[r] for r in ran)
        else:
            held = all(mine < at[r] for r in ran)
        verdict = "agrees" if held else "does NOT agree"
        lines.append(f"- {paper}: {claim}. Here {encoding} {mine:.2f} vs {numbers}: this run {verdict}.")
    return lines


def _task_findings(rows: Sequence[dict], cfg: StudyConfig) -> list[str]:
    """Flag encodings that never learned the task: their extrapolation numbers mean nothing."""
    lines = []
    for r in rows:
        unlearned = r["scaling"] == "none" and r["eval_len"] == cfg.train_len and (r["accuracy"] or 0.0) < 0.5
        if unlearned and r["status"] == "ok":
            lines.append(
                f"- {r['encoding']}: exact match {r['accuracy'] or 0.0:.0%} at the training length: the task was not "
                "learned; raise --steps (or lower --train-len) before reading its extrapolation."
            )
    return lines


# ---------------------------------------------------------------------------------------------------------------------
# The report


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
        lines += [f"(No figure at `{figure_link}`: draw it with `posenc.lab.length.plot.plot_extrapolation`.)", ""]
    lines += ["## Findings", "", *findings_markdown(findings)]
    if not findings:
        lines.append("No findings were computed for this run.")
    lines += ["", *config_and_environment(config, environment, seconds)]
    return write_text_atomic(out_dir / "report.md", "\n".join(lines))
