"""What every lab report is made of: the environment record, durations, the console tables are printed on, the
findings as markdown, the closing configuration and environment sections, and the Wilson interval of an accuracy.

Each study writes its own ``report.md`` (``posenc.lab.length.report``, ``posenc.lab.vision.report``,
``posenc.lab.extend.study.report``) from its results CSV alone, with these pieces.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import json
import math
import os
import platform
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from posenc._checks import check_positive_int, fail


def wide_console() -> Any:
    """A ``rich.console.Console`` on stdout that never cuts a table at 80 columns when stdout is a file or a pipe.

    rich assumes 80 columns when stdout is not a terminal; logs and ``| tee`` would get wrapped, truncated tables.
    On a terminal the terminal's width holds; elsewhere at least 200 columns (or ``$COLUMNS`` when wider).
    """
    from rich.console import Console

    if sys.stdout.isatty():
        return Console()
    columns = os.environ.get("COLUMNS", "")
    return Console(width=max(200, int(columns) if columns.isdigit() else 0))


def _git(*args: str, cwd: Path) -> str | None:
    try:
        done = subprocess.run(("git", *args), cwd=cwd, capture_output=True, text=True, timeout=5, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def environment(device: str | None = None) -> dict[str, Any]:
    """Versions, hardware and source revision, for the record (JSON-able values).

    ``git_sha`` is the commit of the checkout ``posenc`` is imported from, None for an installed package (the
    package file must be tracked by that repository, so a virtualenv inside some other repository gives None).
    ``git_dirty`` says whether that checkout has uncommitted changes. ``device`` is what the caller ran on; by
    default the first CUDA device if there is one, else "cpu".
    """
    import torch

    import posenc

    here = Path(posenc.__file__).resolve().parent
    sha = None
    dirty = None
    if _git("ls-files", "--error-unmatch", "__init__.py", cwd=here) is not None:
        sha = _git("rev-parse", "HEAD", cwd=here)
        status = _git("status", "--porcelain", "--untracked-files=no", cwd=here)
        dirty = None if status is None else bool(status)
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    device = str(device)
    if device.startswith("cuda") and torch.cuda.is_available():
        index = torch.device(device).index or 0
        device = f"{device} ({torch.cuda.get_device_name(index)})"
    elif device == "cpu":
        device = f"cpu ({platform.processor() or platform.machine()})"
    versions = {}
    for package in ("numpy", "matplotlib", "rich", "safetensors"):
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            versions[package] = None
    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "torch": torch.__version__,
        "posenc": posenc.__version__,
        **versions,
        "git_sha": sha,
        "git_dirty": dirty,
        "device": device,
        "cuda": torch.version.cuda,
        "threads": torch.get_num_threads(),
        "cpus": os.cpu_count(),
        "time_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def duration(seconds: float) -> str:
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes} min {rest} s ({seconds:.1f} s)" if minutes else f"{seconds:.1f} s"


def wilson_interval(accuracy: float, n: int, *, z: float = 1.959963984540054) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion: ``accuracy`` measured on ``n`` trials (95% by default).

    Unlike ``p +- z sqrt(p (1 - p) / n)`` it stays inside [0, 1] and is not empty at 0% or 100% (Wilson 1927;
    Brown, Cai & DasGupta 2001 recommend it for small n): centre ``(p + z^2/2n) / (1 + z^2/n)``, half-width
    ``z sqrt(p (1 - p) / n + z^2 / 4n^2) / (1 + z^2/n)``.
    """
    check_positive_int("n", n)
    if isinstance(accuracy, bool) or not isinstance(accuracy, (int, float)) or not 0 <= accuracy <= 1:
        fail("accuracy", accuracy, "a fraction in [0, 1]")
    z2 = z * z
    centre = (accuracy + z2 / (2 * n)) / (1 + z2 / n)
    half = z * math.sqrt(accuracy * (1 - accuracy) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    low = 0.0 if accuracy == 0 else max(0.0, centre - half)  # exactly 0 and 1 at the ends, not 1e-17 off
    high = 1.0 if accuracy == 1 else min(1.0, centre + half)
    return low, high


def findings_markdown(findings: Sequence[str]) -> list[str]:
    """Markdown lines for findings: each statement a bullet ("- " added where missing); a statement ending in ":"
    is a paragraph introducing the bullets after it, with blank lines around it (a line right after a bullet would
    otherwise continue that bullet); "" separates groups. No empty bullet, no doubled blank line."""
    lines: list[str] = []
    for finding in findings:
        text = str(finding).rstrip()
        if not text.strip() or text.strip() in ("-", "*"):
            if lines and lines[-1]:
                lines.append("")
        elif text.endswith(":") and not text.startswith(("- ", "* ")):
            if lines and lines[-1]:
                lines.append("")
            lines += [text, ""]
        else:
            lines.append(text if text.startswith(("- ", "* ")) else f"- {text}")
    while lines and not lines[-1]:
        lines.pop()
    return lines


def config_and_environment(config: Mapping[str, Any], environment: Mapping[str, Any], seconds: float) -> list[str]:
    """The closing sections of a report: the configuration as JSON and the environment table, with the time."""
    return [
        "## Configuration",
        "",
        "```json",
        json.dumps(dict(config), indent=2, default=str),
        "```",
        "",
        "## Environment",
        "",
        "| | |",
        "|:--|:--|",
        *(f"| {key} | {'' if value is None else value} |" for key, value in environment.items()),
        f"| time taken | {duration(seconds)} |",
        "",
    ]
