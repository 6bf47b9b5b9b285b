"""DroPE on SmolLM2-135M: the recalibration's loss curve and the recalibrated model at 16k beside the CPU 16k pick.

    python experiments/drope-smollm2/summarize.py experiments/drope-smollm2 STEPS

Reads ``recal-ft<STEPS>/`` (the fine-tune's ``metrics.jsonl``: one line per step), ``measured-ft<STEPS>/`` (the
recalibrated model at 16,384 tokens, labelled ``none`` there: it is the loaded model) and the pick's
``../picking-a-method/cpu-16k-2026-11-27/pick/final/`` (the unpatched model and YaRN, the same needles). Needles are
compared pairwise on the needles both models saw (the same key or document at the same index): the counts of needles
only one of the two found, and the exact two-sided McNemar p-value (a binomial test on those discordant needles). A
difference with p >= 0.05 is "not shown different", never "equivalent". Each cell's rate carries the 95% interval
its study recorded (anytime-valid: valid wherever the sampling stopped). Writes ``summary-ft<STEPS>.md``.
"""

from __future__ import annotations

import csv
import json
import math
import sys
from pathlib import Path

PICK = Path("picking-a-method/cpu-16k-2026-11-27/pick/final")
LENGTH = 16384
CELLS = (("passkey", "passkey at depth 0.5"), ("ruler:niah_single_1", "RULER niah_single_1"))
#: The pick's models compared with DroPE: label -> (method, factor).
OTHERS = {"unpatched": ("none", 1.0), "YaRN x2": ("yarn", 2.0), "YaRN x4": ("yarn", 4.0)}


def losses(run: Path) -> list[tuple[int, float, float]]:
    """(step, loss, elapsed seconds) per logged step of the fine-tune."""
    (metrics,) = run.glob("runs/finetune-*/metrics.jsonl")
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    return [(int(r["step"]), float(r["loss"]), float(r["elapsed"])) for r in rows if "loss" in r]


def scores(folder: Path, method: str, factor: float) -> dict[str, dict[int, float]]:
    """metric -> needle index -> score (1 found, 0 not) of one model at 16k in ``samples.csv``."""
    out: dict[str, dict[int, float]] = {}
    with (folder / "samples.csv").open() as f:
        for r in csv.DictReader(f):
            if (r["method"], float(r["factor"]), int(r["finetune_steps"]), int(r["length"])) == (method, factor, 0,
                                                                                                  LENGTH):  # fmt: skip
                out.setdefault(r["metric"], {})[int(r["index"])] = float(r["score"])
    return out


def row(folder: Path, metric: str, method: str, factor: float) -> dict[str, str] | None:
    """The row of ``results.csv`` for one zero-shot model's metric at 16k, or None."""
    with (folder / "results.csv").open() as f:
        for r in csv.DictReader(f):
            if (r["metric"], r["method"], float(r["factor"]), r["finetune_steps"], int(r["length"])) == (
                metric, method, factor, "0", LENGTH
            ):  # fmt: skip
                return r
    return None


def rate(r: dict[str, str] | None) -> str:
    """``hits/n [low-high]`` in percent, the 95% interval the study recorded (its ``interval`` column says which)."""
    if r is None:
        return "n/a"
    return f"{int(float(r['hits']))}/{r['n']} [{100 * float(r['ci_low']):.0f}-{100 * float(r['ci_high']):.0f}%]"


def mcnemar(a: dict[int, float], b: dict[int, float]) -> tuple[int, int, int, float]:
    """On the needles both saw: (n, only a found, only b found, exact two-sided p)."""
    shared = sorted(set(a) & set(b))
    only_a = sum(1 for i in shared if a[i] > b[i])
    only_b = sum(1 for i in shared if b[i] > a[i])
    d = only_a + only_b
    tail = sum(math.comb(d, k) for k in range(min(only_a, only_b) + 1)) / 2**d if d else 1.0
    return len(shared), only_a, only_b, min(1.0, 2 * tail)


def main(here: Path, steps: str) -> Path:
    curve = losses(here / f"recal-ft{steps}")
    measured = here / f"measured-ft{steps}"
    pick = here.parent / PICK
    drope = scores(measured, "none", 1.0)
    lines = [f"# DroPE on SmolLM2-135M, recalibrated {steps} steps on this CPU", ""]
    last_step, _, seconds = curve[-1]
    lines += [f"Recalibration: {last_step} steps x 2,048 tokens = {last_step * 2048:,} tokens in {seconds / 60:.1f} "
              f"min ({seconds / last_step:.2f} s a step).", "",
              "| steps | mean loss (nats/token) |", "|---|---:|"]  # fmt: skip
    width = max(1, len(curve) // 10)
    for start in range(0, len(curve), width):
        part = curve[start : start + width]
        lines.append(f"| {part[0][0]}-{part[-1][0]} | {sum(x[1] for x in part) / len(part):.3f} |")
    lines += ["", f"## At {LENGTH:,} tokens (bfloat16), the pick's needles", "",
              "| model | ppl past 8k | " + " | ".join(label for _, label in CELLS) + " |",
              "|---|---:|" + "---:|" * len(CELLS)]  # fmt: skip
    models = {f"DroPE +{steps}": (measured, "none", 1.0, drope)}
    models |= {k: (pick, m, f, scores(pick, m, f)) for k, (m, f) in OTHERS.items()}
    for name, (folder, method, factor, _) in models.items():
        past = row(folder, "ppl_past", method, factor)
        cells = [rate(row(folder, m, method, factor)) for m, _ in CELLS]
        ppl = "n/a" if past is None else f"{float(past['ppl']):.2f}"
        lines.append(f"| {name} | {ppl} | " + " | ".join(cells) + " |")
    lines += ["", "Paired on the same needles (only DroPE found / only the other found; exact McNemar p):", ""]
    for name in OTHERS:
        other = models[name][3]
        for metric, label in CELLS:
            n, a, b, p = mcnemar(drope.get(metric, {}), other.get(metric, {}))
            verdict = "not shown different" if p >= 0.05 else ("DroPE better" if a > b else "DroPE worse")
            lines.append(f"- vs {name}, {label}: n = {n}, {a} / {b}, p = {p:.3f}: {verdict}")
    path = here / f"summary-ft{steps}.md"
    path.write_text("\n".join(lines) + "\n")
    return path


if __name__ == "__main__":
    print(main(Path(sys.argv[1]).resolve(), sys.argv[2]).read_text())
