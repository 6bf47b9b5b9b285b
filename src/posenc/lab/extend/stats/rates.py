"""Retrieval scores as rates: hits of n with a Wilson 95% interval, pooled over depths; ``rates.png``.

Passkey cells (one per length and depth) and RULER tasks (one per length) are rates: ``hits`` keys found (RULER: the
sum of per-document scores in [0, 1]) of ``n``. A length's rate pools its depths (hits and n summed) and carries
Wilson's interval (``posenc.lab.common.report.wilson_interval``). Two rates differ *beyond noise* when their intervals
do not overlap; otherwise the difference is *within noise* and findings say so.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from posenc.lab.common.report import wilson_interval

RULER_PREFIX = "ruler:"


@dataclass(frozen=True)
class Rate:
    """``hits`` of ``n`` (hits may be fractional: RULER's partial-credit scores) with its 95% interval: Wilson's for a
    fixed ``n``; with ``anytime``, the anytime-valid one (``posenc.lab.extend.stats.confidence.rate_interval``) that
    stays valid when ``n`` was where a sequential rule stopped."""

    hits: float
    n: int
    anytime: bool = False
    cells: int = 1  # pooled cells of equal n: the anytime interval averages each needle index over them

    @property
    def value(self) -> float:
        return self.hits / self.n

    @property
    def interval(self) -> tuple[float, float]:
        if self.anytime:
            from posenc.lab.extend.stats.confidence import rate_interval

            low, high = rate_interval(self.hits / self.cells, self.n / self.cells)
            return float(low), float(high)
        return wilson_interval(self.value, self.n)

    def text(self) -> str:
        """``3/4 75% [30-95]``: hits of n, the rate, its 95% interval in percent."""
        hits = f"{self.hits:g}" if self.hits == int(self.hits) else f"{self.hits:.1f}"
        low, high = self.interval
        return f"{hits}/{self.n} {100 * self.value:.0f}% [{100 * low:.0f}-{100 * high:.0f}]"

    def beyond_noise(self, other: Rate) -> bool:
        """Whether the two 95% intervals are disjoint."""
        (a, b), (c, d) = self.interval, other.interval
        return b < c or d < a


def is_rate_metric(metric: str) -> bool:
    return metric == "passkey" or metric.startswith(RULER_PREFIX)


def ruler_task(metric: str) -> str:
    return metric.removeprefix(RULER_PREFIX)


def row_rate(row: Mapping[str, Any], anytime: bool = False) -> Rate | None:
    """One ``results.csv`` row's rate (None: n/a); files written before the ``hits`` column give ``accuracy * n``
    (whole keys for passkey). Its interval is anytime-valid (wherever sequential sampling stopped) where the row
    says ``interval`` anytime (a cell sampled in rounds), or with ``anytime``."""
    if row["status"] != "ok" or row["accuracy"] is None or not row["n"]:
        return None
    anytime = anytime or row.get("interval") == "anytime"  # a cell sampled in rounds says so
    if row.get("hits") is not None:
        return Rate(float(row["hits"]), int(row["n"]), anytime)
    value = float(row["accuracy"]) * int(row["n"])
    return Rate(float(round(value)) if row["metric"] == "passkey" else value, int(row["n"]), anytime)


#: The unit of the model as trained: (method, factor, finetune_steps, finetune_positions).
UNPATCHED = ("none", 1.0, 0, "plain")


def model_of(row: Mapping[str, Any]) -> tuple[str, float, int, str]:
    """The model a results row measured: ``(method, factor, finetune_steps, finetune_positions)`` (rows of files
    written before fine-tuning positions existed read as ``plain``)."""
    return (row["method"], row["factor"], row["finetune_steps"] or 0, row.get("finetune_positions") or "plain")


def unit_order(unit: tuple) -> tuple:
    """Zero-shot models first (the unpatched one leading), then fine-tuned ones; run order otherwise."""
    return (unit[2], unit[0] != "none")


def rates(rows: Sequence[Mapping[str, Any]], metric: str) -> dict[tuple, dict[int, Rate | None]]:
    """(method, factor, finetune_steps, finetune_positions) -> length -> the rate pooled over depths (None: n/a,
    nothing measured), the unpatched model first, then in run order."""
    pooled: dict[tuple, dict[int, list[Rate | None]]] = {}
    for r in rows:
        if r["metric"] == metric:
            pooled.setdefault(model_of(r), {}).setdefault(r["length"], []).append(row_rate(r))
    ordered = sorted(pooled.items(), key=lambda g: unit_order(g[0]))
    return {unit: {n: pool(cell) for n, cell in by.items()} for unit, by in ordered}


def pool(values: Sequence[Rate | None]) -> Rate | None:
    """Several rates (cells: depths, lengths) as one, each weighing the same; None when none was measured.

    Cells with the same ``n``: hits and n summed. Cells with different ``n`` (``stop_width`` stops each cell on its own
    round) would weigh by ``n`` if summed, so a model whose good depths took more keys would look better than one
    whose bad depths did; instead the rate is the mean of the cells' rates and ``n`` is Kish's effective count for
    equal weights, ``k^2 / sum(1 / n_i)`` rounded down (equal to the sum when the ``n_i`` are equal), so the Wilson
    interval is no narrower than the evidence allows. Anytime rates of equal ``n`` pool exactly (needle ``i`` of every
    cell averaged is one [0, 1] score: ``cells``); of unequal ``n``, by Kish's count, an approximation."""
    kept = [r for r in values if r is not None]
    if not kept:
        return None
    anytime = any(r.anytime for r in kept)
    if len({r.n / r.cells for r in kept}) == 1:
        cells = sum(r.cells for r in kept) if anytime else 1  # only the anytime interval reads them
        return Rate(sum(r.hits for r in kept), sum(r.n for r in kept), anytime, cells)
    n = max(1, int(len(kept) ** 2 / sum(1 / r.n for r in kept)))
    return Rate(round(n * sum(r.value for r in kept) / len(kept), 9), n, anytime)


def plot_rates(
    rows: Sequence[Mapping[str, Any]], out_png: str | Path, *, original: int, unit: str = "token"
) -> Path | None:
    """Retrieval rate vs length, one panel per measure (passkey pooled over depths, each RULER task), one line per
    method and factor, 95% intervals as error bars (Wilson's; anytime-valid for cells sampled in rounds), lines nudged
    apart so bars do not hide each other; returns ``out_png``, or None and writes nothing without any rate measured."""
    from posenc.lab.common.plots import MARKERS, PALETTE, new_figure, save_png
    from posenc.lab.extend.settings.labels import label, length_axis

    metrics = [m for m in dict.fromkeys(r["metric"] for r in rows) if is_rate_metric(m)]
    panels = [(m, rates(rows, m)) for m in metrics]
    panels = [(m, g) for m, g in panels if any(v is not None for by in g.values() for v in by.values())]
    if not panels:
        return None
    fig = new_figure(4.6 * len(panels) + 2.4, 4.4)
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    colours = [c for c in PALETTE if c != "#000000"]
    units = list(dict.fromkeys(u for _, g in panels for u in g))
    methods = [m for m in dict.fromkeys(u[0] for u in units) if m != "none"]
    for ax, (metric, groups) in zip(axes, panels, strict=True):
        lengths = sorted({n for by in groups.values() for n, v in by.items() if v is not None})
        for unit_, by in groups.items():
            i = units.index(unit_)
            points = sorted((n, r) for n, r in by.items() if r is not None)
            if not points:
                continue
            nudge = 2 ** (0.06 * (i - (len(units) - 1) / 2))  # multiplicative: the x axis is log2
            xs = [n * nudge for n, _ in points]
            ys = [100 * r.value for _, r in points]
            low = [max(0.0, 100 * (r.value - r.interval[0])) for _, r in points]  # >= 0 despite rounding at 0%
            high = [max(0.0, 100 * (r.interval[1] - r.value)) for _, r in points]
            method = unit_[0]
            colour = "black" if method == "none" else colours[methods.index(method) % len(colours)]
            ax.errorbar(
                xs, ys, yerr=[low, high], marker=MARKERS[i % len(MARKERS)], color=colour, capsize=3,
                linestyle="-" if method == "none" else "--", linewidth=1.4, markersize=6,
                markerfacecolor="white" if unit_[2] else colour, label=label(*unit_),
            )
        length_axis(ax, lengths, original, margin=1.4)
        ax.text(original * 1.03, 0.02, f"original {original}", transform=ax.get_xaxis_transform(), fontsize=8,
                color="0.25", va="bottom")
        ax.set_ylim(-4, 104)
        ax.set_yticks([0, 25, 50, 75, 100])
        name = "passkey (pooled over depths)" if metric == "passkey" else f"RULER {ruler_task(metric)} (lm-eval)"
        n = max((r.n for by in groups.values() for r in by.values() if r is not None), default=0)
        ax.set_title(f"{name}, n up to {n} per point", fontsize=10)
        ax.set_xlabel(f"evaluation length in {unit}s (log2 scale)")
        ax.set_ylabel("score (%), 95% interval")
        ax.grid(True, color="0.88", linewidth=0.8)
        ax.set_axisbelow(True)
    axes[-1].legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize=8.5, frameon=False, borderaxespad=0.0)
    return save_png(fig, out_png)
