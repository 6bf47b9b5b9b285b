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

#: Twenty distinct colours: matplotlib's tab10, then the dark half of Set1 / Dark2 for more lines than that.
PALETTE = (
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf",
    "#000000", "#e6ab02", "#1b9e77", "#a6761d", "#7570b3", "#e7298a", "#666666", "#66a61e", "#377eb8", "#984ea3",
)  # fmt: skip
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "<", ">", "h", "p")

_AXIS_LABEL = {
    "ppl": "validation perplexity per token (log scale; lower is better)",
    "loss": "validation loss, nats per token (lower is better)",
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


def _log_ticks(low: float, high: float) -> list[float]:
    """Round tick values for a log axis spanning ``[low, high]``: the densest of 1-2-5 style sets giving <= 13."""
    first, last = math.floor(math.log10(low)), math.ceil(math.log10(high))
    best: list[float] = []
    for subs in ((1,), (1, 2, 5), (1, 1.5, 2, 3, 5, 7), (1, 1.5, 2, 2.5, 3, 4, 5, 6, 7, 8, 9)):
        ticks = [m * 10.0**e for e in range(first, last + 1) for m in subs if low <= m * 10.0**e <= high]
        if len(ticks) > 13:
            break
        best = ticks
    return best or [low, high]


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
    accuracy from 0 to 1. The training length is a dotted vertical line. Solid lines are
    encodings as trained, dashed lines the ways of running them past the training length (RoPE scalings, slope or
    table interpolation), dash-dot lines fine-tuned models. ``n/a`` points (a learned table past its end) are left
    out and the legend says from which length. Reads ``results_csv`` only; the PNG is written atomically.

    Args:
        results_csv: the long-form results (``posenc.lab.report.read_results``).
        out_png: where the PNG goes.
        metric: "ppl", "loss" or "accuracy".
        corpus: the evaluation corpus, named in the title when given.
        dpi: resolution of the PNG.
    """
    check_choice("metric", metric, METRICS)
    rows = read_results(results_csv)
    fig = new_figure(10.0, 5.6)
    ax = fig.add_subplot()
    _draw(ax, rows, metric)
    title = f"{_TITLE[metric]} vs evaluation length"
    if corpus:
        title += f" on {corpus}"
    train_lens = sorted({r["train_len"] for r in rows if r["train_len"] is not None})
    if train_lens:
        title += f"\nmodels trained at {', '.join(map(str, train_lens))} tokens (dotted line)"
    ax.set_title(title, fontsize=11)
    return save_png(fig, out_png, dpi=dpi)


def _draw(ax: Any, rows: Sequence[Mapping[str, Any]], metric: str) -> None:
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter, NullLocator, PercentFormatter

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
    for group, (i, points, na_from) in lines.items():
        style = "-." if group[2] else "-" if group[1] == "none" else "--"
        label = _line_label(group, vary_train=vary_train, vary_stride=vary_stride, na_from=na_from)
        off = [n for n, v in points if top is not None and v > top * 1.15]
        if off:
            label += f" (off the top from {min(off)})"
        xs, ys = zip(*points, strict=True)
        ax.plot(
            xs, ys, linestyle=style, marker=MARKERS[i % len(MARKERS)], color=PALETTE[i % len(PALETTE)],
            linewidth=1.8 if style == "-" else 1.4, markersize=5, label=label, alpha=0.95,
        )  # fmt: skip
    if not lengths:
        lengths = {1}
    ax.set_xscale("log", base=2)
    ticks = sorted(lengths)
    ax.xaxis.set_major_locator(FixedLocator(ticks))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xlim(ticks[0] / 1.3, ticks[-1] * 1.3)
    ax.set_xlabel("evaluation length in tokens (log2 scale)")
    ax.set_ylabel(_AXIS_LABEL[metric])
    if metric == "accuracy":
        ax.set_ylim(-0.03, 1.03)
        ax.yaxis.set_major_formatter(PercentFormatter(xmax=1.0))
    elif log_y and values:
        ax.set_yscale("log")
        low, high = min(values), top
        ax.set_ylim(low / 1.15, high * 1.15)
        ax.yaxis.set_major_locator(FixedLocator(_log_ticks(low / 1.15, high * 1.15)))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.yaxis.set_minor_formatter(NullFormatter())
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
