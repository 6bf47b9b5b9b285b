"""``runs.jsonl``: the time each invocation of a pick took, so a pick resumed over sittings has a measured total.

A long pick runs across sittings (``--budget``, Ctrl-C, SIGTERM, then ``--resume``), and "how long does the whole pick
take on this machine?" is the question its plan answers in advance. Each invocation that measures appends one line to
``PICK/runs.jsonl`` when it ends, however it ends: when it started (UTC), its wall-clock seconds, how it ended
(``picked: decided`` / ``picked: cap`` / ``picked: deadline`` -- the race settled, reached its cap, or was cut by
``--budget`` and the pick made from what was measured --, ``deadline`` -- the budget passed before a pick could be made
--, ``interrupted``, or ``failed: <error>``), the plan's estimates of the whole pick at its start
(``plan_about_seconds``, its expectation, and ``plan_seconds``, its "at most"; None where no plan was timed) and the
one-minute load average at its start and end, since a pick timed on a busy machine is not an idle one's time.
``--plan`` writes nothing. One short line is appended and flushed per invocation, so a line is never half written by a
later run; a line that cannot be parsed (a machine that died mid-write) is skipped by ``read``.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from posenc.lab.extend.study.plan import duration_text

LEDGER = "runs.jsonl"


def _load() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):  # not on this platform
        return None


@contextlib.contextmanager
def timed(out: Path, *, plan_seconds: float | None, plan_about_seconds: float | None = None,
          start: float | None = None) -> Iterator[dict[str, Any]]:
    """Append this invocation's line to ``out/runs.jsonl`` when the block ends. The block sets ``entry["ended"]``
    (default ``picked``); an exception marks it ``interrupted`` (Ctrl-C, SIGTERM) or ``failed: <type>``, and is
    re-raised. ``start``: the invocation's ``time.perf_counter()`` at its beginning (default: now), so the time to
    load and time the model counts too."""
    start = time.perf_counter() if start is None else start
    entry: dict[str, Any] = {
        "started": (dt.datetime.now(dt.timezone.utc) - dt.timedelta(seconds=time.perf_counter() - start)).isoformat(
            timespec="seconds"
        ),
        "seconds": 0.0,
        "ended": "picked",
        "plan_seconds": None if plan_seconds is None else round(float(plan_seconds), 1),
        "plan_about_seconds": None if plan_about_seconds is None else round(float(plan_about_seconds), 1),
        "load_start": _load(),
    }
    try:
        yield entry
    except KeyboardInterrupt:
        entry["ended"] = "interrupted"
        raise
    except BaseException as e:
        entry["ended"] = f"failed: {type(e).__name__}"
        raise
    finally:
        entry["seconds"] = round(time.perf_counter() - start, 1)
        entry["load_end"] = _load()
        out.mkdir(parents=True, exist_ok=True)
        with (out / LEDGER).open("a") as f:
            f.write(json.dumps(entry) + "\n")
            f.flush()
            os.fsync(f.fileno())


def read(out: Path) -> list[dict[str, Any]]:
    """The lines of ``out/runs.jsonl``, oldest first ([] without one); unparsable lines are skipped."""
    path = out / LEDGER
    if not path.is_file():
        return []
    entries = []
    for line in path.read_text().splitlines():
        with contextlib.suppress(ValueError):
            row = json.loads(line)
            if isinstance(row, dict) and isinstance(row.get("seconds"), int | float):
                entries.append(row)
    return entries


def total_text(entries: list[dict[str, Any]], this_run: float) -> str:
    """ "Took X this run; Y in all over N runs (the first run's plan: about Z, at most W; load averages ...)" for the
    report, where ``entries`` are the earlier runs' lines and ``this_run`` the current one's seconds so far."""
    text = f"Took {duration_text(this_run)} this run"
    if not entries:
        return text + "."
    total = this_run + sum(float(e["seconds"]) for e in entries)
    loads = [x for e in entries for x in (e.get("load_start"), e.get("load_end")) if isinstance(x, int | float)]
    text += f"; {duration_text(total)} in all, over {len(entries) + 1} runs ({LEDGER}"
    if plan := _first_plan(entries):
        text += f"; the first run's plan: {plan}"
    if loads:
        text += f"; 1-minute load averages {min(loads):.1f}-{max(loads):.1f} in earlier runs, {os.cpu_count()} cores"
    return text + ")."


def _first_plan(entries: list[dict[str, Any]]) -> str:
    """The first timed plan's estimates, as it gave them ("about Z, at most W"; a line from before the plan's
    expectation was logged has "at most W" only)."""
    for e in entries:
        most, about = e.get("plan_seconds"), e.get("plan_about_seconds")
        if isinstance(most, int | float):
            text = f"at most {duration_text(most)}"
            return f"about {duration_text(about)}, {text}" if isinstance(about, int | float) else text
    return ""
