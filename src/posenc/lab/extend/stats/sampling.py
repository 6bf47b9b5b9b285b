"""Sample until the answer is clear: passkey keys and RULER documents measured in rounds, each cell stopped once its
rate is decided.

A *cell* is one rate measured for one model: passkey at a (length, depth), a RULER task at a length; the models
(method, factor, fine-tuning) measured there form its *group*. ``trials`` and ``ruler_samples`` are caps. Every cell
gets a first round of ``min(ROUND, cap)`` samples; after that a cell gets further rounds of the same size until it is
*decided* or reaches its cap. Decided (``decided``): its anytime-valid 95% interval (``confidence.rate_interval``:
valid however often the rule looks, so the interval reported where a cell stopped keeps its coverage; Wilson's
fixed-n one did not) is disjoint from the interval of its
group's best cell (the highest rate; the first model in the study's order on a tie), or it is at most
``stop_width`` wide. The best cell itself is decided only by its width (or its cap).

The samples of a cell are the first ``n`` of a fixed sequence (passkey: round ``r``'s keys drawn in order from
``round_seed(cell, r * ROUND)``, one call per round so that its keys share their prompt's prefix; RULER: lm-eval's
documents of that length in order), so stopping early never changes which samples were drawn, and a
resumed study continues each cell's sequence from the ``n`` stored in ``results.csv``. Decisions depend only on the
stored rows, so the same settings and seeds give the same samples and the same counts.

``stop_width`` 0 or None: every cell gets exactly its cap, with the keys studies drew before rounds existed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from posenc._checks import fail
from posenc.lab.extend.settings.config import ExtendConfig, filled
from posenc.lab.extend.stats.rates import RULER_PREFIX, Rate, model_of, row_rate, unit_order

#: Samples per round (a cell's first round is ``min(ROUND, cap)``).
ROUND = 4


def cap(cfg: ExtendConfig, metric: str) -> int:
    """The most samples a cell of ``metric`` gets: ``ruler_samples`` (RULER) or ``trials`` (passkey)."""
    if metric.startswith(RULER_PREFIX):
        return filled(cfg.ruler_samples, "ruler_samples")
    return filled(cfg.trials, "trials")


def round_size(cfg: ExtendConfig, metric: str) -> int:
    return min(ROUND, cap(cfg, metric))


def round_seed(cell_seed: int, start: int) -> int:
    """The seed of a passkey cell's round that starts at key ``start`` (a multiple of ``ROUND``): the round's keys are
    the first ones a generator with this seed draws, so a shorter last round (the cap) takes a prefix of them."""
    if start % ROUND:
        fail("start", start, f"a multiple of the round of {ROUND} keys (a cell's keys come in rounds)")
    return (cell_seed * 1_000_033 + start // ROUND) % 2**63


def group_of(row: Mapping[str, Any]) -> tuple:
    """The cells a cell is compared with: the same metric, length and depth, every model."""
    return row["metric"], row["length"], row["depth"]


def best_of(rows: Sequence[Mapping[str, Any]]) -> dict[tuple, Mapping[str, Any]]:
    """group -> its best cell: the highest rate, the first model in the study's order on a tie."""
    best: dict[tuple, tuple] = {}
    for row in sorted(rows, key=lambda r: unit_order(model_of(r))):
        rate = row_rate(row)
        if rate is None:
            continue
        group = group_of(row)
        if group not in best or rate.value > best[group][0].value:
            best[group] = (rate, row)
    return {g: row for g, (_, row) in best.items()}


def decided(rate: Rate, best: Rate, stop_width: float) -> bool:
    """Whether a cell's rate is clear: its 95% interval disjoint from the best's, or at most ``stop_width`` wide."""
    low, high = rate.interval
    return high - low <= stop_width or rate.beyond_noise(best)


def pending(rows: Sequence[Mapping[str, Any]], cfg: ExtendConfig) -> list[Mapping[str, Any]]:
    """The rate cells that need another round: measured, under their cap, not decided against their group's best."""
    stop_width = cfg.stop_width
    if not stop_width:  # not cfg.adaptive: fixed counts
        return []
    rated = [r for r in rows if r["metric"] == "passkey" or r["metric"].startswith(RULER_PREFIX)]
    best = best_of(rated)
    out = []
    for row in rated:
        rate = row_rate(row)
        if rate is not None and rate.n < cap(cfg, row["metric"]):
            top = row_rate(best[group_of(row)])  # a cell is never beyond noise of itself: the best stops on its width
            assert top is not None  # best_of keeps the rows with a rate only
            if not decided(rate, top, stop_width):
                out.append(row)
    return out


def rule_text(cfg: ExtendConfig, what: str, cap_value: int) -> str:
    """The sampling rule as the report states it."""
    if not cfg.adaptive:
        return f"{cap_value} {what} per cell (a fixed count)"
    if cap_value <= ROUND:
        return f"{cap_value} {what} per cell (one round of at most {ROUND}: no cell stops early)"
    first = min(ROUND, cap_value)
    return (
        f"up to {cap_value} {what} per cell, in rounds of {first}: after each round a cell stops once its "
        "anytime-valid 95% "
        f"interval is disjoint from that of the best model at the same place (the highest rate) or at most "
        f"{cfg.stop_width:g} wide (the best one stops on its width or the cap only); each cell's samples are the "
        "first n of a fixed sequence, so n differs between cells but never which samples were drawn"
    )
