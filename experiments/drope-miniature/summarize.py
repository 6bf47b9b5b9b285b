"""DroPE in miniature: one table over the seeds ``run.sh`` ran (``seed*/lab/results.csv``, ``seed*/drope/...``).

    python experiments/drope-miniature/summarize.py experiments/drope-miniature

Per model and length: perplexity per byte, the mean over seeds with a 95% Student-t interval (n seeds, n - 1 degrees
of freedom; with n = 3 the interval is +-4.30 standard errors: wide by design), and for the comparisons the paper
makes, the paired difference seed by seed (the same seed trained both models) with its own t interval. A difference
whose interval covers 0 is "not shown different", never "equivalent". Writes ``summary.md`` beside the seeds. scipy
(for the t quantile) comes with the lab extra's scikit-learn.
"""

from __future__ import annotations

import csv
import math
import statistics
import sys
from pathlib import Path

from scipy import stats

LENGTHS = (64, 128, 256, 512, 1024)
#: Table rows: label -> (file, key columns); the lab's rows by encoding and scaling, the study's by method and steps.
ROWS = {
    "RoPE": ("lab", ("rope", "none")),
    "RoPE + YaRN (factor = length / 64)": ("lab", ("rope", "yarn")),
    "NoPE (trained from scratch)": ("lab", ("nope", "none")),
    "RoPE +N steps": ("drope", ("none", "N")),
    "RoPE dropped, zero-shot": ("drope", ("drope", "0")),
    "DroPE: dropped +N steps at 64": ("drope", ("drope", "N")),
}
PAIRS = (
    ("DroPE: dropped +N steps at 64", "RoPE +N steps"),
    ("DroPE: dropped +N steps at 64", "RoPE + YaRN (factor = length / 64)"),
    ("DroPE: dropped +N steps at 64", "NoPE (trained from scratch)"),
)


def read(seed_dir: Path) -> dict[tuple[str, int], float]:
    out: dict[tuple[str, int], float] = {}
    with (seed_dir / "lab" / "results.csv").open() as f:
        for r in csv.DictReader(f):
            for name, (where, key) in ROWS.items():
                if where == "lab" and (r["encoding"], r["scaling"]) == key and r["finetune_steps"] == "0":
                    out[name, int(r["eval_len"])] = float(r["ppl"])
    with (seed_dir / "drope" / "results.csv").open() as f:
        for r in csv.DictReader(f):
            for name, (where, key) in ROWS.items():
                steps = "0" if r["finetune_steps"] == "0" else "N"  # N: the run's --finetune-steps
                if where == "drope" and r["metric"] == "ppl" and (r["method"], steps) == key:
                    out[name, int(r["length"])] = float(r["ppl"])
    return out


def _steps(seeds: list[Path]) -> str:
    """The recalibration's steps (one number for every seed)."""
    found = set()
    for seed_dir in seeds:
        with (seed_dir / "drope" / "results.csv").open() as f:
            found |= {r["finetune_steps"] for r in csv.DictReader(f) if r["finetune_steps"] != "0"}
    return "/".join(sorted(found)) or "0"


def interval(values: list[float]) -> tuple[float, float, float]:
    """Mean and its 95% Student-t interval."""
    n = len(values)
    mean = statistics.fmean(values)
    if n < 2:
        return mean, math.nan, math.nan
    half = stats.t.ppf(0.975, n - 1) * statistics.stdev(values) / math.sqrt(n)
    return mean, mean - half, mean + half


def main(root: Path) -> None:
    seeds = sorted(p for p in root.glob("seed*") if (p / "drope" / "results.csv").exists())
    if not seeds:
        sys.exit(f"summarize.py: no seed*/drope/results.csv under {root}: run run.sh first")
    runs = [read(p) for p in seeds]
    n = len(runs)
    lines = [f"Perplexity per byte, mean over n = {n} seeds ({', '.join(p.name for p in seeds)}) [95% t interval]", ""]
    lines += ["| model | " + " | ".join(f"{length}" for length in LENGTHS) + " |"]
    lines += ["|:--|" + "--:|" * len(LENGTHS)]
    for name in ROWS:
        cells = []
        for length in LENGTHS:
            values = [run[name, length] for run in runs if (name, length) in run]
            if len(values) != n:
                cells.append("n/a")
                continue
            mean, low, high = interval(values)
            cells.append(f"{mean:.2f} [{low:.2f}, {high:.2f}]")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += ["", "Paired differences (first minus second, same seed), mean [95% t interval] (each seed's):", ""]
    lines += ["| comparison | " + " | ".join(f"{length}" for length in LENGTHS) + " |"]
    lines += ["|:--|" + "--:|" * len(LENGTHS)]
    for a, b in PAIRS:
        cells = []
        for length in LENGTHS:
            diffs = [run[a, length] - run[b, length] for run in runs if (a, length) in run and (b, length) in run]
            if len(diffs) != n:
                cells.append("n/a")
                continue
            mean, low, high = interval(diffs)
            verdict = "" if math.isnan(low) or low <= 0 <= high else (" lower" if high < 0 else " higher")
            each = ", ".join(f"{d:+.2f}" for d in diffs)
            cells.append(f"{mean:+.2f} [{low:+.2f}, {high:+.2f}]{verdict} ({each})")
        lines.append(f"| {a} vs {b} | " + " | ".join(cells) + " |")
    text = "\n".join(lines).replace("+N steps", f"+{_steps(seeds)} steps") + "\n"
    (root / "summary.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).parent))
