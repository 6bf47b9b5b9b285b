"""How the extend study names a model and draws a length axis: ``label`` (``yarn x2 +ft40 pose``) in tables, plots and
files; ``length_axis`` the log2 length axis with the original context marked. Used by ``report`` and ``rates``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def label(method: str, factor: float, finetune_steps: int, positions: str = "plain") -> str:
    """``yarn x2``, ``yarn x2 +ft40`` (fine-tuned 40 steps, plain positions), ``yarn x2 +ft40 pose``; ``drope`` and
    ``drope +ft40`` (DroPE has no factor: measured at 1, recalibrated at the original context)."""
    text = method if method in ("none", "drope") and factor == 1 else f"{method} x{factor:g}"
    if not finetune_steps:
        return text
    return text + f" +ft{finetune_steps}" + ("" if positions == "plain" else f" {positions}")


def length_axis(ax: Any, lengths: Sequence[int], original: int, *, margin: float) -> None:
    """A log2 length axis with a tick at each measured length (plain numbers), ``margin`` room either side, and the
    original length as a dotted vertical line."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(FixedLocator(lengths))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xlim(min(lengths[0], original) / margin, lengths[-1] * margin)
    ax.axvline(original, color="0.35", linestyle=":", linewidth=1.5, zorder=1)
