"""DroPE in miniature, part 2: an attention temperature at inference, and SSMax learned in the recalibration.

    python experiments/drope-miniature/temperature.py experiments/drope-miniature     # after run.sh; resumable

A model without positional encoding (NoPE) spreads its attention thinner as the context grows; the usual remedy is a
temperature that sharpens the softmax with the number of keys. Issue 50 asks whether it helps DroPE past the context.
On the models ``run.sh`` trained (per seed: DroPE recalibrated 50 and 200 steps, NoPE trained from scratch), each
measured exactly as the study measured it (``LabTarget.perplexity``: 16,384 held-out bytes per length), with:

- ``plain``: as recalibrated (reproduces the study's numbers: checked, to the last digit printed);
- ``llama4 a=A``: Llama 4's NoPE temperature tuning (``posenc.build("nope_temperature", floor_scale=64,
  attn_scale=A)``): queries times ``1 + A log(1 + floor(n / 64))`` for a query that sees ``n`` keys, so 1 inside the
  64-byte context and rising past it; A in {0.1 (Llama 4's), 0.2, 0.4}, all three reported (no pick on the test
  text);
- ``ssmax fixed``: Scalable-Softmax at inference with ``s = 1 / ln 64`` in every head (queries times
  ``log(n) / log(64)``: 1 at the context's end, below 1 inside it, above past it), on a model not trained with it;
- ``DroPE -> SSMax +N``: the RoPE model dropped to NoPE + SSMax (``s`` per layer and head, learned, from
  ``1 / ln 64``) and recalibrated as ``drope +N`` is (same windows, steps, optimiser: ``LabTarget.finetune``), then
  measured plain: SSMax as its paper uses it, trained with the model.

The authors' code (SakanaAI/DroPE @ 260a8bb9) has no length-dependent temperature: its one inference knob is a
constant ``softmax_scale`` that no released config sets. Writes ``seed*/temperature/results.csv`` (atomic),
``temperature.md`` (means over seeds with 95% Student-t intervals, and each variant minus plain on the same seed)
and ``temperature.png``.
"""

from __future__ import annotations

import csv
import math
import os
import sys
import tempfile
from pathlib import Path

import torch

import posenc
from posenc.lab.common.train import load_model
from posenc.lab.extend.study import plan
from posenc.lab.extend.study.config import ExtendConfig
from posenc.lab.extend.study.run import resolve_lengths
from posenc.lab.extend.targets.lab import LabTarget

sys.path.insert(0, str(Path(__file__).parent))
from summarize import LENGTHS, interval  # noqa: E402

ORIGINAL = 64
STEPS = (50, 200)
SCALES = (0.1, 0.2, 0.4)
S_FIXED = 1.0 / math.log(ORIGINAL)  # log(n) / log(64): 1 at the context's end
FIELDS = ("model", "variant", "length", "ppl")


def study_target(seed_dir: Path, seed: int, steps: int) -> LabTarget:
    """The study's own measuring target for this seed (corpus, held-out bytes, fine-tuning windows)."""
    cfg = ExtendConfig(
        model=str(seed_dir / "lab" / "runs" / "rope"), methods=("drope",), factors=(1.0,), lengths=LENGTHS,
        finetune_steps=steps, eval_tokens=16384, seed=seed, dtype="float32", device="cpu",
    )  # fmt: skip
    out = seed_dir / "temperature"
    target = LabTarget(cfg, out, "cpu", progress=False)
    cfg = resolve_lengths(cfg, target.original_len)
    cfg = plan.resolve(cfg, kind="lab", original=target.original_len, default_methods=target.default_methods,
                       device="cpu")  # fmt: skip
    target.use(cfg)
    return target


def drope_model(seed_dir: Path, steps: int) -> torch.nn.Module:
    """RoPE dropped and recalibrated ``steps`` steps by run.sh (its fine-tuned weights, NoPE in every layer)."""
    model = load_model(seed_dir / f"drope-ft{steps}" / "runs" / f"finetune-drope-ft{steps}")
    model.set_encoding(posenc.build("nope"))
    return model


def ssmax_recalibrated(seed_dir: Path, target: LabTarget, steps: int) -> torch.nn.Module:
    """RoPE dropped to NoPE + SSMax (one module per layer, ``s`` per head from 1/ln 64) and recalibrated like drope."""
    model = load_model(seed_dir / "lab" / "runs" / "rope")
    config = model.config
    for block in model.blocks:
        block.encoding = posenc.build("ssmax", num_heads=config.n_heads, head_dim=config.dim // config.n_heads,
                                      s_init=S_FIXED)  # fmt: skip
    model.encoding = None  # each layer uses its own module (GPT.layer_encodings)
    target.finetune(model, f"drope-ssmax-ft{steps}", ORIGINAL)
    return model.eval()


def variants(model: torch.nn.Module) -> dict[str, posenc.Encoding | None]:
    """Inference-time encodings to swap in (None: the model as it is)."""
    heads, head_dim = model.config.n_heads, model.config.dim // model.config.n_heads
    out: dict[str, posenc.Encoding | None] = {"plain": None}
    for a in SCALES:
        out[f"llama4 a={a}"] = posenc.build("nope_temperature", floor_scale=float(ORIGINAL), attn_scale=a)
    out["ssmax fixed"] = posenc.build("ssmax", num_heads=heads, head_dim=head_dim, s_init=S_FIXED)
    return out


def measure(target: LabTarget, model: torch.nn.Module, name: str, rows: list[dict]) -> None:
    """Every variant of ``model`` at every length, appended to ``rows``."""
    plain = model.encoding
    for variant, encoding in variants(model).items():
        if encoding is not None and plain is None:
            continue  # a per-layer SSMax model is measured as trained only
        model.set_encoding(plain if encoding is None else encoding)
        for length in LENGTHS:
            whole, _ = target.perplexity(model, length)
            rows.append({"model": name, "variant": variant, "length": length, "ppl": math.exp(whole.loss)})
        print(f"  {name:22s} {variant:14s} " + " ".join(f"{r['ppl']:7.2f}" for r in rows[-len(LENGTHS) :]), flush=True)
    model.set_encoding(plain)


def write_atomic(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS)
        writer.writeheader()
        writer.writerows(rows)
    os.replace(tmp, path)


def check_plain(seed_dir: Path, rows: list[dict]) -> None:
    """The plain DroPE rows must be the study's own numbers (same model, text and code): else the loading is wrong."""
    for steps in STEPS:
        with (seed_dir / f"drope-ft{steps}" / "results.csv").open() as f:
            rows_of = [r for r in csv.DictReader(f) if (r["metric"], r["method"]) == ("ppl", "drope")]
            study = {int(r["length"]): float(r["ppl"]) for r in rows_of if r["finetune_steps"] == str(steps)}
        ours = {r["length"]: r["ppl"] for r in rows if r["model"] == f"DroPE +{steps}" and r["variant"] == "plain"}
        for length, value in study.items():
            if not math.isclose(ours[length], value, rel_tol=1e-9):
                sys.exit(f"{seed_dir.name}: DroPE +{steps} at {length}: {ours[length]} here, {value} in the study")


def run_seed(seed_dir: Path) -> list[dict]:
    path = seed_dir / "temperature" / "results.csv"
    if path.is_file():
        with path.open() as f:
            return [{**r, "length": int(r["length"]), "ppl": float(r["ppl"])} for r in csv.DictReader(f)]
    seed = int(seed_dir.name.removeprefix("seed"))
    rows: list[dict] = []
    print(f"{seed_dir.name}:", flush=True)
    target = study_target(seed_dir, seed, max(STEPS))
    for steps in STEPS:
        measure(target, drope_model(seed_dir, steps), f"DroPE +{steps}", rows)
    measure(target, load_model(seed_dir / "lab" / "runs" / "nope"), "NoPE from scratch", rows)
    for steps in STEPS:
        measure(target, ssmax_recalibrated(seed_dir, study_target(seed_dir, seed, steps), steps),
                f"DroPE -> SSMax +{steps}", rows)  # fmt: skip
    check_plain(seed_dir, rows)
    write_atomic(path, rows)
    return rows


def summarize(root: Path, runs: list[list[dict]]) -> str:
    tables = [{(r["model"], r["variant"], r["length"]): r["ppl"] for r in rows} for rows in runs]
    keys = list(dict.fromkeys((r["model"], r["variant"]) for r in runs[0]))
    n = len(tables)
    lines = [f"Perplexity per byte, mean over n = {n} seeds [95% t interval]; trained at 64 bytes", ""]
    lines += ["| model | at inference | " + " | ".join(map(str, LENGTHS)) + " |", "|:--|:--|" + "--:|" * len(LENGTHS)]
    for model, variant in keys:
        cells = []
        for length in LENGTHS:
            mean, low, high = interval([t[model, variant, length] for t in tables])
            cells.append(f"{mean:.2f} [{low:.2f}, {high:.2f}]")
        lines.append(f"| {model} | {variant} | " + " | ".join(cells) + " |")
    lines += ["", "Each variant minus the same model plain (or, for SSMax, minus DroPE +N plain), same seed: mean "
              "[95% t interval], 'lower'/'higher' where the interval excludes 0", ""]  # fmt: skip
    lines += ["| model | at inference | " + " | ".join(map(str, LENGTHS)) + " |", "|:--|:--|" + "--:|" * len(LENGTHS)]
    for model, variant in keys:
        base = (model.replace(" -> SSMax", ""), "plain") if "SSMax" in model else (model, "plain")
        if (model, variant) == base:
            continue
        cells = []
        for length in LENGTHS:
            diffs = [t[model, variant, length] - t[(*base, length)] for t in tables]
            mean, low, high = interval(diffs)
            verdict = "" if low <= 0 <= high else (" lower" if high < 0 else " higher")
            digits = 3 if max(abs(mean), abs(low), abs(high)) < 0.01 else 2  # the last query at 64 sees 64 keys
            cells.append(f"{mean:+.{digits}f} [{low:+.{digits}f}, {high:+.{digits}f}]{verdict}")
        lines.append(f"| {model} | {variant} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot(root: Path, runs: list[list[dict]]) -> None:
    """``temperature.png``: one panel per model (DroPE +200, NoPE from scratch), one line per inference variant,
    DroPE -> SSMax +200 beside DroPE's; bars are 95% t intervals over the seeds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tables = [{(r["model"], r["variant"], r["length"]): r["ppl"] for r in rows} for rows in runs]
    keys = list(dict.fromkeys((r["model"], r["variant"]) for r in runs[0]))
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.2), sharey=True)
    for ax, model in zip(axes, ("DroPE +200", "NoPE from scratch"), strict=True):
        lines = [(m, v) for m, v in keys if m == model or (model == "DroPE +200" and m == "DroPE -> SSMax +200")]
        for m, v in lines:
            stats = [interval([t[m, v, length] for t in tables]) for length in LENGTHS]
            means = [mean for mean, _, _ in stats]
            bars = [[mean - lo for mean, lo, _ in stats], [hi - mean for mean, _, hi in stats]]
            label = "SSMax learned in the recalibration" if m != model else v
            ax.errorbar(LENGTHS, means, yerr=bars, marker="o", capsize=3, label=label)
        ax.set_xscale("log", base=2)
        ax.set_xticks(LENGTHS, [str(n) for n in LENGTHS])
        ax.axvline(ORIGINAL, color="grey", linestyle=":", linewidth=1)
        ax.set_xlabel("evaluation length (bytes; trained at 64)")
        ax.set_title(model, fontsize=10)
        ax.legend(fontsize=7)
    axes[0].set_ylabel("perplexity per byte")
    fig.suptitle(f"A temperature at inference: mean of {len(runs)} seeds, 95% t intervals", fontsize=11)
    fig.tight_layout()
    fig.savefig(root / "temperature.png", dpi=120)
    plt.close(fig)


def main(root: Path) -> None:
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    seeds = sorted(p for p in root.glob("seed*") if (p / "drope-ft200" / "results.csv").is_file())
    if not seeds:
        sys.exit(f"temperature.py: no seed*/drope-ft200/results.csv under {root}: run run.sh first")
    runs = [run_seed(s) for s in seeds]
    text = summarize(root, runs)
    (root / "temperature.md").write_text(text)
    plot(root, runs)
    print(text)


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).parent))
