"""The extrapolation plot of ``posenc lab``, drawn from ``OUT/results.csv`` alone (never by rerunning a model).

The figure helpers (canvas, colours, markers, log axes) are the lab's shared ones, ``posenc.lab.common.plots``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from posenc._checks import check_choice
from posenc.lab.common.plots import MARKERS, PALETTE, log_axis, same_points
from posenc.lab.length.report import METRICS, read_results, result_key

_AXIS_LABEL = {
    "ppl": "validation perplexity per byte (log scale; lower is better)",
    "loss": "validation loss, nats per byte (lower is better)",
    "accuracy": "exact-match accuracy (higher is better)",
}

_LINE_KEY = ("encoding", "scaling", "finetune_steps", "train_len", "stride")

_TITLE = {"ppl": "Perplexity", "loss": "Loss", "accuracy": "Exact-match accuracy"}


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
        results_csv: the long-form results (``posenc.lab.length.report.read_results``).
        out_png: where the PNG goes.
        metric: "ppl", "loss" or "accuracy".
        corpus: the evaluation corpus, named in the title when given.
        dpi: resolution of the PNG.
    """
    from posenc.lab.common.plots import new_figure, save_png  # looked up when called: tests capture the figure

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
        )
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
        )
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
                color="0.25", bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.8, "pad": 1.0})
    if values:
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8.5, frameon=False, borderaxespad=0.0)
    else:
        ax.text(0.5, 0.5, "nothing to plot: no measured point (every row is n/a)", transform=ax.transAxes,
                ha="center", va="center", color="0.4")
