"""DroPE in miniature: one table over the seeds ``run.sh`` ran (``seed*/lab/``, ``seed*/drope-ft<N>/``).

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
#: The lab's rows: label -> (encoding, scaling) in ``seed*/lab/results.csv``.
LAB_ROWS = {
    "RoPE": ("rope", "none"),
    "RoPE + YaRN (factor = length / 64)": ("rope", "yarn"),
    "NoPE (trained from scratch)": ("nope", "none"),
}
ZERO_SHOT = "RoPE dropped, zero-shot"


def study_rows(steps: str) -> dict[str, tuple[str, str]]:
    """The rows of ``seed*/drope-ft<steps>/results.csv``: label -> (method, finetune_steps)."""
    return {f"RoPE +{steps} steps": ("none", steps), f"DroPE: dropped +{steps} steps at 64": ("drope", steps)}


def pairs(steps: list[str]) -> list[tuple[str, str]]:
    """The comparisons: each DroPE against RoPE trained as long, RoPE + YaRN, and NoPE from scratch."""
    out = []
    for n in steps:
        drope = f"DroPE: dropped +{n} steps at 64"
        out += [(drope, f"RoPE +{n} steps"), (drope, "RoPE + YaRN (factor = length / 64)"),
                (drope, "NoPE (trained from scratch)")]  # fmt: skip
    return out


def read(seed_dir: Path) -> dict[tuple[str, int], float]:
    """One seed's perplexities: (label, length) -> ppl."""
    out: dict[tuple[str, int], float] = {}
    with (seed_dir / "lab" / "results.csv").open() as f:
        for r in csv.DictReader(f):
            for name, key in LAB_ROWS.items():
                if (r["encoding"], r["scaling"]) == key and r["finetune_steps"] == "0":
                    out[name, int(r["eval_len"])] = float(r["ppl"])
    for folder in seed_dir.glob("drope-ft*"):
        if not (folder / "results.csv").exists():
            continue
        rows = {**study_rows(folder.name.removeprefix("drope-ft")), ZERO_SHOT: ("drope", "0")}
        with (folder / "results.csv").open() as f:
            for r in csv.DictReader(f):
                for name, key in rows.items():
                    if r["metric"] == "ppl" and (r["method"], r["finetune_steps"]) == key:
                        out[name, int(r["length"])] = float(r["ppl"])
    return out


def found_steps(seeds: list[Path]) -> list[str]:
    """The recalibration lengths run (``drope-ft<N>`` folders with results), in order."""
    names = {p.parent.name.removeprefix("drope-ft") for s in seeds for p in s.glob("drope-ft*/results.csv")}
    return sorted(names, key=int)


def interval(values: list[float]) -> tuple[float, float, float]:
    """Mean and its 95% Student-t interval."""
    n = len(values)
    mean = statistics.fmean(values)
    if n < 2:
        return mean, math.nan, math.nan
    half = stats.t.ppf(0.975, n - 1) * statistics.stdev(values) / math.sqrt(n)
    return mean, mean - half, mean + half


def main(root: Path) -> None:
    seeds = sorted(p for p in root.glob("seed*") if any(p.glob("drope-ft*/results.csv")))
    if not seeds:
        sys.exit(f"summarize.py: no seed*/drope-ft*/results.csv under {root}: run run.sh first")
    steps = found_steps(seeds)
    names = [*LAB_ROWS, ZERO_SHOT, *(name for n in steps for name in study_rows(n))]
    runs = [read(p) for p in seeds]
    n = len(runs)
    lines = [f"Perplexity per byte, mean over n = {n} seeds ({', '.join(p.name for p in seeds)}) [95% t interval]", ""]
    lines += ["| model | " + " | ".join(f"{length}" for length in LENGTHS) + " |"]
    lines += ["|:--|" + "--:|" * len(LENGTHS)]
    for name in names:
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
    for a, b in pairs(steps):
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
    text = "\n".join(lines) + "\n"
    (root / "summary.md").write_text(text)
    plot(root, names, runs)
    print(text)


def plot(root: Path, names: list[str], runs: list[dict[tuple[str, int], float]]) -> None:
    """``drope.png``: each model's mean perplexity by length, bars the 95% t intervals over the seeds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for name in names:
        points = [(length, interval([run[name, length] for run in runs])) for length in LENGTHS
                  if all((name, length) in run for run in runs)]  # fmt: skip
        if not points:
            continue
        xs = [x for x, _ in points]
        mean = [m for _, (m, _, _) in points]
        low = [m - lo if not math.isnan(lo) else 0.0 for _, (m, lo, _) in points]
        high = [hi - m if not math.isnan(hi) else 0.0 for _, (m, _, hi) in points]
        ax.errorbar(xs, mean, yerr=[low, high], marker="o", capsize=3, label=name)
    ax.set_xscale("log", base=2)
    ax.set_xticks(LENGTHS, [str(n) for n in LENGTHS])
    ax.axvline(64, color="grey", linestyle=":", linewidth=1)
    ax.set_xlabel("evaluation length (bytes; trained at 64)")
    ax.set_ylabel("perplexity per byte")
    ax.set_title(f"DroPE in miniature: mean of {len(runs)} seeds, 95% t intervals")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(root / "drope.png", dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).parent))
