"""``--budget``: a deadline read as people write durations. Imports no torch: the command line reads it before the
library loads."""

from __future__ import annotations

import re

from posenc._fail import fail


def parse_budget(text: str | float | None) -> float | None:
    """``--budget``: seconds (``5400``), or as people write durations: ``90m``, ``1.5h``, ``2h30m``, ``1h30`` (a bare
    number after hours is minutes, after minutes seconds), ``45s``; None: no budget."""
    if text is None:
        return None
    value = str(text).strip().lower().replace(" ", "")
    tokens = re.findall(r"([0-9]+(?:\.[0-9]+)?)([hms]?)", value, re.ASCII)
    spelled = "".join(n + u for n, u in tokens)
    units = [u for _, u in tokens]
    order = "hms"
    if not tokens or spelled != value or "" in units[:-1]:
        fail("budget", text, "a time: seconds (5400) or 90m, 1.5h, 2h30m, 1h30")
    if units[-1] == "":  # a bare number: seconds alone, else the unit after the previous one
        units[-1] = "s" if len(units) == 1 else order[min(2, order.index(units[-2]) + 1)]
    if any(order.index(a) >= order.index(b) for a, b in zip(units, units[1:], strict=False)):
        fail("budget", text, "a time with hours, minutes and seconds in that order, each once (2h30m, 1h30)")
    amount = {u: float(n) for (n, _), u in zip(tokens, units, strict=True)}
    hours, minutes, seconds = (amount.get(u, 0.0) for u in order)
    total = 3600 * hours + 60 * minutes + seconds
    if total <= 0:
        fail("budget", text, "a time above zero")
    return total
