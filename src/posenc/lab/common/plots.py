"""The lab's figure helpers: a canvas, colours and markers that stay distinct, log axes people can read values off.

Every study draws its figures from its results CSV alone with these (``posenc.lab.length.plot``,
``posenc.lab.vision.report``, ``posenc.lab.extend.study.report``; the tool ``posenc.lab.figures`` too). Figures are
built on matplotlib's Agg canvas directly (``Figure`` + ``FigureCanvasAgg``), not through ``pyplot``: no window, no
global backend switched under a notebook that imports this, and nothing left open between calls.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from posenc._checks import check_positive_int
from posenc.lab.common.files import atomic_open

#: Colours for lines, most distinct first: Okabe & Ito's colour-blind-safe eight (their yellow, unreadable on white,
#: left out; black moved back), then Paul Tol's muted ones and a few darker ones for more lines. Each pair of the
#: first 13 is >= 22 CIELAB units apart for normal vision; for colour-blind readers the later ones get close, so
#: every line also has its own marker (``MARKERS``), and lines of one kind share a line style.
PALETTE = (
    "#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#332288", "#999933", "#882255", "#117733",
    "#000000", "#777777", "#8C564B", "#AA4499", "#44AA99", "#1F3A93", "#B8A000", "#CC6677",
)
#: Marker shapes, most distinct first (15, coprime with the 18 colours: a (colour, marker) pair repeats after 90).
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "<", ">", "p", "h", "d", "H", "8")
#: Colour map of heatmaps: sequential, even in lightness, readable with any colour vision and printed in grey.
HEATMAP = "cividis"


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
