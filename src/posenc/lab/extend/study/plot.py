"""The figures of ``posenc extend``, drawn from ``results.csv`` rows alone: ``extend.png`` (perplexity against
length) and ``passkey.png`` (passkey heatmaps); ``rates.png`` is ``stats.rates.plot_rates``. ``draw`` makes every one
that has something to show."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from posenc.lab.extend.settings.config import drops
from posenc.lab.extend.settings.labels import label, length_axis
from posenc.lab.extend.stats.rates import model_of, plot_rates, row_rate, unit_order


def curves(rows: Sequence[Mapping[str, Any]], metric: str) -> dict[tuple, dict[int, list[float]]]:
    """(method, factor, finetune_steps, finetune_positions) -> length -> measured values (perplexity, or accuracy
    per depth), in run order with the unpatched model first."""
    groups: dict[tuple, dict[int, list[float]]] = {}
    for r in rows:
        if r["metric"] != metric:
            continue
        values = groups.setdefault(model_of(r), {})
        value = r["accuracy"] if metric == "passkey" else r["ppl"]
        values.setdefault(r["length"], [])
        if r["status"] == "ok" and value is not None:
            values[r["length"]].append(value)
    return dict(sorted(groups.items(), key=lambda g: unit_order(g[0])))


def mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


#: Line styles of ``extend.png`` by factor (the unpatched model is solid): dashed, dash-dot, dash-dot-dot, long dash.
FACTOR_STYLES = ("--", "-.", (0, (5, 1.5, 1, 1.5, 1, 1.5)), (0, (8, 2)))


def plot_extend(
    rows: Sequence[Mapping[str, Any]], out_png: str | Path, *, original: int, title: str, unit: str = "token"
) -> Path | None:
    """Perplexity vs length (log y), one line per method, factor and fine-tuning; returns ``out_png``, or None and
    writes nothing when no perplexity was measured (task passkey: accuracy is in ``plot_passkey``'s heatmaps).

    Colour per method (black: the unpatched model), line style per factor, a marker per line (hollow: fine-tuned);
    a line identical to an earlier one is dotted with large hollow markers and its label says "= ...". The original
    length is a dotted vertical line. ``unit`` names what a length counts ("byte" for lab models).
    """
    from posenc.lab.common.plots import MARKERS, PALETTE, log_axis, new_figure, same_points, save_png

    groups = {u: by for u, by in curves(rows, "ppl").items() if any(by.values())}
    if not groups:
        return None
    fig = new_figure(9.0, 5.2)
    ax = fig.add_subplot()
    colours = [c for c in PALETTE if c != "#000000"]  # black is the unpatched model's
    methods = [m for m in dict.fromkeys(u[0] for u in groups) if m != "none"]
    factors = sorted({u[1] for u in groups if u[0] != "none" and not drops(u[0])})  # drope: no factor, solid
    drawn: dict[tuple, list[tuple[int, float]]] = {}
    for i, (unit_, by_length) in enumerate(groups.items()):
        points = sorted((n, sum(v) / len(v)) for n, v in by_length.items() if v)  # the mean of each length
        method, factor, steps, _ = unit_
        twin = next((label(*u) for u, p in drawn.items() if same_points(points, p)), None)
        drawn[unit_] = points
        style = "-" if method == "none" or drops(method) else FACTOR_STYLES[factors.index(factor) % len(FACTOR_STYLES)]
        colour = "black" if method == "none" else colours[methods.index(method) % len(colours)]
        xs, ys = zip(*points, strict=True)
        ax.plot(
            xs, ys, marker=MARKERS[i % len(MARKERS)], color=colour, linestyle=":" if twin else style,
            linewidth=2.2 if method == "none" else 1.5, markersize=9 if twin else 6,
            markerfacecolor="white" if steps and not twin else "none" if twin else colour,
            label=label(*unit_) + (f" (= {twin})" if twin else ""),
        )
    lengths = sorted({n for by in groups.values() for n, v in by.items() if v})
    length_axis(ax, lengths, original, margin=1.3)
    box = {"facecolor": "white", "edgecolor": "none", "alpha": 0.8, "pad": 1.0}
    low_x, high_x = ax.get_xlim()
    room = math.log(high_x / original) / math.log(high_x / low_x)  # the share of the x axis right of the line
    right = room > 0.3  # else the label would run past the axes into the legend: it goes left of the line
    ax.text(original * (1.03 if right else 1 / 1.03), 0.98, f"original length {original}",
            transform=ax.get_xaxis_transform(), fontsize=9, color="0.25", va="top", ha="left" if right else "right",
            bbox=box)
    ax.set_yscale("log")
    values = [y for p in drawn.values() for _, y in p]
    low, high = min(values) / 1.08, max(values) * 1.08
    ax.set_ylim(low, high)
    log_axis(ax.yaxis, low, high)
    ax.set_ylabel(f"held-out perplexity per {unit} (log scale; lower is better)")
    ax.set_xlabel(f"evaluation length in {unit}s (log2 scale)")
    ax.set_title(title, fontsize=11)
    ax.grid(True, color="0.88", linewidth=0.8)
    ax.set_axisbelow(True)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8.5, frameon=False, borderaxespad=0.0)
    return save_png(fig, out_png)


def plot_passkey(
    rows: Sequence[Mapping[str, Any]], out_png: str | Path, *, original: int, unit: str = "token"
) -> Path | None:
    """Passkey heatmaps, depth (rows) x length (columns), one panel per method and factor, each cell coloured by its
    rate and labelled with keys found / keys tried; returns
    ``out_png``, or None and writes nothing when no passkey cell was measured.

    Colours from cividis (sequential, readable with any colour vision and in grey), each cell's number in black or
    white, whichever contrasts more with it (``posenc.lab.common.plots.text_colour_on``); grey cells are n/a.
    """
    from matplotlib import colormaps
    from matplotlib import patheffects as pe

    from posenc.lab.common.plots import HEATMAP, new_figure, save_png, text_colour_on

    groups = [(u, by) for u, by in curves(rows, "passkey").items()]
    if not groups:
        return None
    cells = {(*model_of(r), r["length"], r["depth"]): r for r in rows if r["metric"] == "passkey"}
    lengths = sorted({r["length"] for r in rows if r["metric"] == "passkey"})
    depths = sorted({r["depth"] for r in rows if r["metric"] == "passkey"})
    cols = min(4, max(1, len(groups)))
    nrows = max(1, math.ceil(len(groups) / cols))
    # each panel wide enough for its title and labels (a one-length screen's panels overlapped at 0.55 in each)
    fig = new_figure(1.4 + (1.1 + 0.55 * len(lengths)) * cols, 1.1 + (0.45 * len(depths) + 0.9) * nrows)
    axes = fig.subplots(nrows, cols, squeeze=False)
    cmap = colormaps[HEATMAP].with_extremes(bad="0.85")
    image = None
    for k, ax in enumerate(axes.flat):
        if k >= len(groups):
            ax.axis("off")
            continue
        unit_ = groups[k][0]
        grid = torch.full((len(depths), len(lengths)), float("nan"))
        found: dict[tuple[int, int], str] = {}  # (i, j) -> "k/n"
        for i, d in enumerate(depths):
            for j, n in enumerate(lengths):
                r = cells.get((*unit_, n, d))
                if r is not None and r["status"] == "ok" and r["accuracy"] is not None:
                    grid[i, j] = r["accuracy"]
                    cell = row_rate(r)
                    assert cell is not None  # an ok row with an accuracy has a rate
                    found[i, j] = f"{cell.hits:g}/{cell.n}"
        image = ax.imshow(grid.numpy(), cmap=cmap, vmin=0.0, vmax=1.0, aspect="auto")
        for i in range(len(depths)):
            for j in range(len(lengths)):
                value = float(grid[i, j])
                text = "n/a" if math.isnan(value) else found[i, j]
                colour = text_colour_on(cmap(float("nan") if math.isnan(value) else value))
                ax.text(j, i, text, ha="center", va="center", fontsize=7, color=colour)
        ax.set_xticks(range(len(lengths)), [str(n) for n in lengths], fontsize=7, rotation=45)
        ax.set_yticks(range(len(depths)), [f"{d:g}" for d in depths], fontsize=7)
        past = [j for j, n in enumerate(lengths) if n > original]
        if past and past[0] > 0:  # left of it: up to the original length; white on a black edge shows on any cell
            ax.axvline(past[0] - 0.5, color="white", linewidth=1.6,
                       path_effects=[pe.Stroke(linewidth=3.2, foreground="black"), pe.Normal()])
        ax.set_title(label(*unit_), fontsize=9)
        if k + cols >= len(groups):  # the lowest panel of its column
            ax.set_xlabel(f"length ({unit}s)", fontsize=8)
        if k % cols == 0:
            ax.set_ylabel("depth of the key\n(0: first)", fontsize=8)
    if image is not None:
        colorbar = fig.colorbar(image, ax=axes, shrink=0.8, label="keys found (%)")
        colorbar.set_ticks([0, 0.25, 0.5, 0.75, 1.0], labels=["0", "25", "50", "75", "100"])
    fig.suptitle(
        f"Passkey retrieval, keys found / keys tried per cell\n(edged line: past the original {original} {unit}s; "
        "grey: n/a, shorter than the prompt; intervals: rates.png)",
        fontsize=10,
    )
    return save_png(fig, out_png)


def draw(rows: Sequence[Mapping[str, Any]], out: Path, *, name: str, original: int, unit: str) -> list[str]:
    """``extend.png``, ``passkey.png`` and ``rates.png`` in ``out``, each only when it has something to show; returns
    the names of those drawn. ``name``: the model's, in ``extend.png``'s title; ``unit``: what a length counts."""
    title = f"{name}: original context {original} {unit}s"
    return [
        path.name
        for path in (
            plot_extend(rows, out / "extend.png", original=original, title=title, unit=unit),
            plot_passkey(rows, out / "passkey.png", original=original, unit=unit),
            plot_rates(rows, out / "rates.png", original=original, unit=unit),
        )
        if path is not None
    ]
