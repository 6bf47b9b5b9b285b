"""The extrapolation plot of ``posenc lab``, drawn from ``OUT/results.csv`` alone (never by rerunning a model).

Figures are built on matplotlib's Agg canvas directly (``Figure`` + ``FigureCanvasAgg``), not through ``pyplot``:
no window, no global backend switched under a notebook that imports this, and nothing left open between calls.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from posenc._checks import check_choice, check_positive_int
from posenc.lab.report import METRICS, atomic_open, read_results, result_key

#: Colours for lines, most distinct first: Okabe & Ito's colour-blind-safe eight (their yellow, unreadable on white,
#: left out; black moved back), then Paul Tol's muted ones and a few darker ones for more lines. Each pair of the
#: first 13 is >= 22 CIELAB units apart for normal vision; for colour-blind readers the later ones get close, so
#: every line also has its own marker (``MARKERS``), and lines of one kind share a line style.
PALETTE = (
    "#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#332288", "#999933", "#882255", "#117733",
    "#000000", "#777777", "#8C564B", "#AA4499", "#44AA99", "#1F3A93", "#B8A000", "#CC6677",
)  # fmt: skip
#: Marker shapes, most distinct first (15, coprime with the 18 colours: a (colour, marker) pair repeats after 90).
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "<", ">", "p", "h", "d", "H", "8")
#: Colour map of heatmaps: sequential, even in lightness, readable with any colour vision and printed in grey.
HEATMAP = "cividis"

_AXIS_LABEL = {
    "ppl": "validation perplexity per byte (log scale; lower is better)",
    "loss": "validation loss, nats per byte (lower is better)",
    "accuracy": "exact-match accuracy (higher is better)",
}
_LINE_KEY = ("encoding", "scaling", "finetune_steps", "train_len", "stride")
_TITLE = {"ppl": "Perplexity", "loss": "Loss", "accuracy": "Exact-match accuracy"}


def new_figure(width: float, height: float):  # noqa: ANN201 - matplotlib.figure.Figure, imported lazily
    """A matplotlib ``Figure`` on an Agg canvas, with no pyplot state."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def save_png(fig: Any, path: str | Path, *, dpi: int = 150) -> Path:
    """Save ``fig`` as a PNG at ``path``, atomically (temp file in the same folder, then ``os.replace``)."""
    check_positive_int("dpi", dpi)
    with atomic_open(path, "wb") as f:
        fig.savefig(f, format="png", dpi=dpi, bbox_inches="tight", facecolor="white")
    return Path(path)


def log_ticks(low: float, high: float, *, at_least: int = 4, at_most: int = 13) -> list[float]:
    """Round tick values for a log axis spanning ``[low, high]`` (``0 < low < high``), so values can be read off.

    The densest of the 1-2-5 style sets per decade giving at most ``at_most`` ticks; where a narrow range leaves
    fewer than ``at_least`` (11.5 to 15 holds only 15), evenly spaced round values instead: the widest step of
    1, 2 or 5 times a power of ten giving ``at_least`` (12, 13, 14, 15).
    """
    first, last = math.floor(math.log10(low)), math.ceil(math.log10(high))
    best: list[float] = []
    for subs in ((1,), (1, 2, 5), (1, 1.5, 2, 3, 5, 7), (1, 1.5, 2, 2.5, 3, 4, 5, 6, 7, 8, 9)):
        values = (float(f"{m}e{e}") for e in range(first, last + 1) for m in subs)  # 0.6, not 6 * 0.1
        ticks = [v for v in values if low <= v <= high]
        if len(ticks) > at_most:
            break
        best = ticks
    if len(best) >= at_least:
        return best
    top = math.floor(math.log10(high - low))
    for exponent in range(top, top - 6, -1):
        for mantissa in (5, 2, 1):
            step = mantissa * 10.0**exponent
            ticks = [round(k * step, 12) for k in range(math.ceil(low / step), math.floor(high / step) + 1)]
            if len(ticks) >= at_least:
                return ticks
    return best or [low, high]


def log_axis(axis: Any, low: float, high: float) -> None:
    """Label a log-scale matplotlib ``axis`` spanning ``[low, high]`` at ``log_ticks`` in plain numbers (12.5, not
    1.25e1); minor ticks stay unlabelled."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter

    axis.set_major_locator(FixedLocator(log_ticks(low, high)))
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    axis.set_minor_formatter(NullFormatter())


def relative_luminance(rgba: Sequence[float]) -> float:
    """WCAG 2 relative luminance of an sRGB colour with channels in [0, 1] (alpha ignored): 0 black, 1 white."""
    linear = [c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in rgba[:3]]
    return 0.2126 * linear[0] + 0.7152 * linear[1] + 0.0722 * linear[2]


def text_colour_on(rgba: Sequence[float]) -> str:
    """The text colour, ``"black"`` or ``"white"``, with the higher WCAG contrast ratio against ``rgba``."""
    luminance = relative_luminance(rgba)
    return "black" if (luminance + 0.05) / 0.05 >= 1.05 / (luminance + 0.05) else "white"


def same_points(a: Sequence[tuple[float, float]], b: Sequence[tuple[float, float]]) -> bool:
    """Whether two lines' ``(x, y)`` points coincide (to 1e-9 relative): drawn one over the other, one would hide."""
    return len(a) == len(b) and all(
        xa == xb and math.isclose(ya, yb, rel_tol=1e-9) for (xa, ya), (xb, yb) in zip(a, b, strict=True)
    )


def _line_label(group: tuple, *, vary_train: bool, vary_stride: bool, na_from: int | None) -> str:
    encoding, scaling, finetune, train_len, stride = group
    label = encoding if scaling == "none" else f"{encoding} + {scaling}"
    if finetune:
        label += f", fine-tuned {finetune} steps"
    if vary_train:
        label += f", L={train_len}"
    if vary_stride:
        label += f", stride {stride}" if stride else ", no stride"
    if na_from is not None:
        label += f" (n/a from {na_from})"
    return label


def plot_extrapolation(
    results_csv: str | Path,
    out_png: str | Path,
    *,
    metric: str = "ppl",
    corpus: str | None = None,
    dpi: int = 150,
) -> Path:
    """Plot ``metric`` against evaluation length, one line per (encoding, scaling, fine-tuning); returns ``out_png``.

    x: evaluation length on a log2 axis labelled with the measured lengths; y: perplexity on a log axis up to 100x
    the best perplexity (lines that go higher leave the plot and say so in the legend), loss and accuracy linear,
    accuracy from 0 to 1, log axes labelled at several plain numbers (``log_ticks``). The training length is a
    dotted vertical line. Every line has its own colour and marker (``PALETTE``, ``MARKERS``); solid lines are
    encodings as trained, dashed lines the ways of running them past the training length (RoPE scalings, slope or
    table interpolation), dash-dot lines fine-tuned models. A line identical to an earlier one (dynamic NTK and NTK
    when every window has one length) is dotted with large hollow markers over it, and the legend says "= ...".
    ``n/a`` points (a learned table past its end) are left out and the legend says from which length. Reads
    ``results_csv`` only; the PNG is written atomically.

    Args:
        results_csv: the long-form results (``posenc.lab.report.read_results``).
        out_png: where the PNG goes.
        metric: "ppl", "loss" or "accuracy".
        corpus: the evaluation corpus, named in the title when given.
        dpi: resolution of the PNG.
    """
    check_choice("metric", metric, METRICS)
    rows = read_results(results_csv)
    title = f"{_TITLE[metric]} vs evaluation length"
    if corpus:
        title += f" on {corpus}"
    train_lens = sorted({r["train_len"] for r in rows if r["train_len"] is not None})
    if train_lens:
        title += f"\nmodels trained at {', '.join(map(str, train_lens))} bytes (dotted line)"
    panels = _panels(rows)
    fig = new_figure(10.0, 5.6 * len(panels))
    for n, (caption, members) in enumerate(panels, start=1):
        ax = fig.add_subplot(len(panels), 1, n)
        _draw(ax, members, metric)
        ax.set_title(title if caption is None else f"{title}\n{caption}" if n == 1 else caption, fontsize=11)
    return save_png(fig, out_png, dpi=dpi)


#: More lines than this (the palette's well-separated colours) are split into two panels.
MAX_LINES = 13


def _panels(rows: Sequence[Mapping[str, Any]]) -> list[tuple[str | None, list[Mapping[str, Any]]]]:
    """One panel, or, past ``MAX_LINES`` lines, two: every encoding as trained, then the encodings that have ways of
    running past the training length (scalings, interpolation, fine-tuning) with those lines."""
    lines = {result_key(r, _LINE_KEY) for r in rows}
    if len(lines) <= MAX_LINES:
        return [(None, list(rows))]
    extended = {r["encoding"] for r in rows if r["scaling"] != "none" or r["finetune_steps"]}
    trained = [r for r in rows if r["scaling"] == "none" and not r["finetune_steps"]]
    return [
        ("every encoding as trained", trained),
        ("and the ways of running them past the training length", [r for r in rows if r["encoding"] in extended]),
    ]


def _draw(ax: Any, rows: Sequence[Mapping[str, Any]], metric: str) -> None:
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator, PercentFormatter

    unordered: dict[tuple, list[Mapping[str, Any]]] = {}
    order: dict[Any, int] = {}
    for row in rows:
        group = result_key(row, _LINE_KEY)
        order.setdefault(group[0], len(order))  # encodings in the order they were run, as in the table
        order.setdefault(group[:2], len(order))
        unordered.setdefault(group, []).append(row)
    ranked = sorted(unordered, key=lambda g: (order[g[0]], g[1] != "none", order[g[:2]], g[2], g[3], g[4]))
    groups = {g: unordered[g] for g in ranked}
    lines = {}
    vary_train = len({g[3] for g in groups}) > 1
    vary_stride = len({g[4] for g in groups}) > 1
    log_y = metric == "ppl"
    lengths: set[int] = set()
    values: list[float] = []
    for i, (group, members) in enumerate(groups.items()):
        points = sorted(
            (r["eval_len"], float(r[metric]))
            for r in members
            if r["status"] == "ok" and isinstance(r[metric], (int, float)) and math.isfinite(r[metric])
            and r["eval_len"] and (r[metric] > 0 or not log_y)
        )  # fmt: skip
        na = [r["eval_len"] for r in members if r["status"] == "n/a" and r["eval_len"]]
        lengths.update(r["eval_len"] for r in members if r["eval_len"])
        if not points:
            continue
        values += [v for _, v in points]
        lines[group] = (i, points, min(na) if na else None)
    # Perplexity can explode by orders of magnitude for an encoding that breaks; a log axis over all of it would
    # squash the lines worth comparing into a sliver, so the axis stops at 100x the best value and lines leave it.
    top = min(max(values), 100 * min(values)) if values and log_y else None
    drawn: dict[tuple, str] = {}
    for i, (group, (_, points, na_from)) in enumerate(lines.items()):
        style = "-." if group[2] else "-" if group[1] == "none" else "--"
        label = _line_label(group, vary_train=vary_train, vary_stride=vary_stride, na_from=na_from)
        twin = next((name for other, name in drawn.items() if same_points(points, lines[other][1])), None)
        drawn[group] = _line_label(group, vary_train=vary_train, vary_stride=vary_stride, na_from=None)
        off = [n for n, v in points if top is not None and v > top * 1.15]
        if off:
            label += f" (off the top from {min(off)})"
        if twin is not None:  # e.g. dynamic NTK = NTK when every window has one length: keep both visible
            label += f" (= {twin})"
        xs, ys = zip(*points, strict=True)
        ax.plot(
            xs, ys, linestyle=":" if twin else style, marker=MARKERS[i % len(MARKERS)], color=PALETTE[i % len(PALETTE)],
            linewidth=1.8 if style == "-" else 1.4, markersize=9 if twin else 5, label=label, alpha=0.95,
            markerfacecolor="none" if twin else None, markeredgewidth=1.5 if twin else None,
        )  # fmt: skip
    if not lengths:
        lengths = {1}
    ax.set_xscale("log", base=2)
    ticks = sorted(lengths)
    ax.xaxis.set_major_locator(FixedLocator(ticks))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xlim(ticks[0] / 1.3, ticks[-1] * 1.3)
    ax.set_xlabel("evaluation length in tokens (= bytes; log2 scale)")
    ax.set_ylabel(_AXIS_LABEL[metric])
    if metric == "accuracy":
        ax.set_ylim(-0.03, 1.03)
        ax.yaxis.set_major_formatter(PercentFormatter(xmax=1.0))
    elif log_y and values:
        ax.set_yscale("log")
        low, high = min(values), top
        ax.set_ylim(low / 1.15, high * 1.15)
        log_axis(ax.yaxis, low / 1.15, high * 1.15)
    ax.grid(True, which="major", color="0.88", linewidth=0.8)
    ax.set_axisbelow(True)
    for train_len in sorted({g[3] for g in groups if g[3]}):
        ax.axvline(train_len, color="0.35", linestyle=":", linewidth=1.5, zorder=1)
        text = "train length" if not vary_train else f"train length {train_len}"
        # Away from the points at the training length: those sit low for perplexity and loss, high for accuracy.
        y, va = (0.02, "bottom") if metric == "accuracy" else (0.98, "top")
        ax.text(train_len * 1.03, y, text, transform=ax.get_xaxis_transform(), ha="left", va=va, fontsize=9,
                color="0.25", bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.8, "pad": 1.0})  # fmt: skip
    if values:
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8.5, frameon=False, borderaxespad=0.0)
    else:
        ax.text(0.5, 0.5, "nothing to plot: no measured point (every row is n/a)", transform=ax.transAxes,
                ha="center", va="center", color="0.4")  # fmt: skip
