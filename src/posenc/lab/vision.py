"""``posenc vision``: train a small ViT once per 2-D encoding at one resolution, test it at others.

The RoPE-ViT study (Heo et al. 2024, "Rotary Position Embedding for Vision Transformer", ECCV, arXiv:2403.13298,
Table 2 / Fig. 4) in one command on a CPU: ViT-S trained at 224 px and tested up to 384 px kept accuracy best with
RoPE-Mixed (80.9 -> 81.8), then RoPE-Axial (80.9 -> 80.0), then learned absolute positions (80.4 -> 79.4). Here
the same comparison runs on Fashion-MNIST (or scikit-learn's digits, or a user's image folders): same patch size
at every resolution, so a higher resolution means more patches and positions the model never saw.

Every finished piece is kept, as in ``posenc lab``: each encoding trains in ``OUT/runs/<encoding>/`` (checkpointed,
resumable, skipped once done) and each accuracy is upserted into ``OUT/results.csv`` as soon as it is measured.

Files: ``OUT/results.csv`` (``RESULT_COLUMNS``), ``OUT/resolution.png``, ``OUT/report.md``, ``OUT/vision.json``.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from posenc._checks import check_choice, check_positive_int, fail
from posenc.lab import dist
from posenc.lab.devices import resolve_device
from posenc.lab.images import ImageData, load_images, normalisation, prepare, random_resized_crop
from posenc.lab.progress import progress_bar, skipped
from posenc.lab.report import (
    config_and_environment,
    duration,
    environment,
    wide_console,
    wilson_interval,
    write_text_atomic,
)
from posenc.lab.runfiles import KeyedCSV, check_settings
from posenc.lab.train import DONE_FILE, TrainConfig, rank_rows, step_generator, train
from posenc.lab.vit import POOLS, ViT, ViTConfig, registry_name, vision_encodings

DEFAULT_ENCODINGS = ("learned", "sinusoidal", "nope", "rope_axial", "rope_mixed", "alibi_2d")
#: Evaluation resolutions as multiples of the training one (rounded to whole patches): one lower, 1x, 1.5x, 2x.
EVAL_MULTIPLES = (0.75, 1.0, 1.5, 2.0)
RESULT_COLUMNS = ["encoding", "scaling", "train_res", "eval_res", "accuracy", "loss", "images", "patches", "status"]
KEY_COLUMNS = ("encoding", "scaling", "train_res", "eval_res")
#: Encodings that read patch coordinates, so they also run with coordinates interpolated into the trained range.
COORDINATE_ENCODINGS = frozenset({"sinusoidal", "sinusoidal_2d", "rope_axial", "rope_mixed", "alibi_2d"})
#: How each encoding meets a resolution it was not trained at (said in the table and the report).
HOW = {
    "learned": "resized table",
    "learned_2d": "resized table",
    "sinusoidal": "extrapolate",
    "sinusoidal_2d": "extrapolate",
    "nope": "no positions",
    "rope_axial": "extrapolate",
    "rope_mixed": "extrapolate",
    "alibi_2d": "extrapolate",
}
#: RoPE-ViT's ViT-S numbers (Table 2, 224 px -> 384 px), quoted in the report next to ours.
PAPER = {"learned": (80.4, 79.4), "rope_axial": (80.9, 80.0), "rope_mixed": (80.9, 81.8)}


@dataclass(frozen=True, kw_only=True)
class VisionConfig:
    """Everything that defines a vision study; stored as ``OUT/vision.json`` and checked on ``--resume``."""

    encodings: tuple[str, ...] = DEFAULT_ENCODINGS
    train_res: int = 16
    eval_res: tuple[int, ...] | None = None  # None: EVAL_MULTIPLES of train_res
    patch_size: int = 4
    steps: int = 2000
    batch_size: int = 64
    dim: int = 64
    n_layers: int = 4
    n_heads: int = 4
    lr: float = 2e-3
    weight_decay: float = 0.05
    crop_scale: float = 0.35  # random-resized-crop area range (crop_scale, 1); 1 turns the augmentation off
    pool: str = "mean"
    seed: int = 0
    data: str | None = None
    eval_images: int | None = None  # None: the whole test split
    interpolate: bool = True  # also test coordinate encodings with coordinates interpolated into the trained range
    device: str = "cpu"

    def __post_init__(self) -> None:
        object.__setattr__(self, "encodings", tuple(self.encodings))
        if self.eval_res is not None:
            object.__setattr__(self, "eval_res", tuple(self.eval_res))
        for name in ("train_res", "patch_size", "steps", "batch_size", "dim", "n_layers", "n_heads"):
            check_positive_int(name, getattr(self, name))
        if self.train_res % self.patch_size:
            fail("train_res", self.train_res, f"a multiple of patch_size={self.patch_size}")
        if self.dim % self.n_heads or (self.dim // self.n_heads) % 4:
            fail("dim", self.dim, f"a multiple of 4 * n_heads = {4 * self.n_heads} (2-D RoPE needs head width % 4)")
        check_choice("pool", self.pool, POOLS)
        if not self.encodings:
            fail("encodings", self.encodings, f"at least one of {list(DEFAULT_ENCODINGS)}")
        allowed = vision_encodings()
        for name in self.encodings:
            if registry_name(name) not in allowed:
                fail("encodings", name, f"2-D encodings: {sorted({*DEFAULT_ENCODINGS, *allowed})}")
        if len(set(self.encodings)) != len(self.encodings):
            fail("encodings", self.encodings, "each encoding once")
        for res in self.resolutions:
            check_positive_int("eval_res", res)
            if res % self.patch_size:
                fail("eval_res", res, f"multiples of patch_size={self.patch_size} (the patch size stays fixed)")
        if self.eval_images is not None:
            check_positive_int("eval_images", self.eval_images)
        if (
            isinstance(self.crop_scale, bool)
            or not isinstance(self.crop_scale, (int, float))
            or not (0 < self.crop_scale <= 1)
        ):
            fail("crop_scale", self.crop_scale, "a fraction of the image area in (0, 1]; 1 turns cropping off")
        if not isinstance(self.lr, (int, float)) or not self.lr > 0:
            fail("lr", self.lr, "a positive learning rate")

    @property
    def resolutions(self) -> tuple[int, ...]:
        if self.eval_res is not None:
            return self.eval_res
        p = self.patch_size
        return tuple(sorted({max(p, round(m * self.train_res / p) * p) for m in EVAL_MULTIPLES}))

    def to_dict(self) -> dict[str, Any]:
        return json.loads(json.dumps(dataclasses.asdict(self)))


def model_config(cfg: VisionConfig, encoding: str, data: ImageData) -> ViTConfig:
    return ViTConfig(
        image_size=cfg.train_res,
        patch_size=cfg.patch_size,
        channels=data.channels,
        num_classes=len(data.classes),
        dim=cfg.dim,
        n_layers=cfg.n_layers,
        n_heads=cfg.n_heads,
        encoding=encoding,
        pool=cfg.pool,
    )


# ---------------------------------------------------------------------------------------------------------------------
# Results file


#: ``OUT/results.csv``: one row per (encoding, scaling, train_res, eval_res); files without ``scaling`` read "none".
RESULTS = KeyedCSV(
    columns=tuple(RESULT_COLUMNS),
    key=KEY_COLUMNS,
    ints=frozenset({"train_res", "eval_res", "images", "patches"}),
    floats=frozenset({"accuracy", "loss"}),
    required=("encoding", "train_res", "eval_res", "accuracy"),
    defaults={"scaling": "none"},
    command="posenc vision",
)
read_results = RESULTS.read
upsert_results = RESULTS.upsert
result_key = RESULTS.key_of


# ---------------------------------------------------------------------------------------------------------------------
# Training and evaluation


def _batches(images: torch.Tensor, labels: torch.Tensor, stats, cfg: VisionConfig):  # noqa: ANN001, ANN202
    """Step ``s`` draws the same global batch (images and crops) whatever the number of ranks or restarts; each rank
    takes its rows. ``images`` are the stored ``uint8`` ones: every step crops and resizes afresh."""

    def batch_fn(step: int, rank: int, world: int):  # noqa: ANN202
        generator = step_generator(cfg.seed, step)
        index = torch.randint(len(labels), (cfg.batch_size,), generator=generator)
        if cfg.crop_scale < 1:
            x = random_resized_crop(images[index], cfg.train_res, stats, generator=generator, scale=(cfg.crop_scale, 1))
        else:
            x = prepare(images[index], cfg.train_res, stats)
        rows = rank_rows(cfg.batch_size, rank, world)
        return x[rows], labels[index][rows], None

    return batch_fn


@torch.no_grad()
def accuracy(
    model: ViT, images: torch.Tensor, labels: torch.Tensor, *, batch: int = 500, coordinate_scale: float = 1.0
) -> tuple[float, float]:
    """Top-1 accuracy and mean cross-entropy of ``model`` on prepared ``images`` ``(N, C, R, R)``."""
    model.eval()
    device = next(model.parameters()).device
    right, loss = 0, 0.0
    for x, y in zip(images.split(batch), labels.split(batch), strict=True):
        logits = model(x.to(device), coordinate_scale=coordinate_scale).float()
        right += int((logits.argmax(dim=-1) == y.to(device)).sum())
        loss += float(F.cross_entropy(logits, y.to(device), reduction="sum"))
    return right / len(labels), loss / len(labels)


def run_vision(cfg: VisionConfig, out: str | Path, *, resume: bool = False, progress: bool = True) -> list[dict]:
    """Run (or continue) the study; returns the result rows. Files land in ``out``."""
    start = time.perf_counter()
    out = Path(out)
    resolve_device(cfg.device, allow_auto=False)
    dist.init()
    data = load_images(cfg.data)
    # Only now, with the device and data checked, is the folder claimed: a bad input leaves nothing behind.
    if dist.is_main():
        check_settings(out, cfg.to_dict(), resume, command="vision", what="study")
    dist.barrier()
    stats = normalisation(data.train_images)
    test_images, test_labels = data.test_images, data.test_labels
    if cfg.eval_images is not None:
        test_images, test_labels = test_images[: cfg.eval_images], test_labels[: cfg.eval_images]
    results_csv = out / "results.csv"
    done = {result_key(r) for r in read_results(results_csv)} if results_csv.exists() else set()
    scalings = ("none", "interpolate") if cfg.interpolate else ("none",)
    if progress and dist.is_main():
        print(f"data: {data.source}; training at {cfg.train_res} px, testing at {list(cfg.resolutions)} px")
    for encoding in cfg.encodings:
        device = dist.device() if cfg.device.startswith("cuda") and dist.is_distributed() else cfg.device
        model = ViT(model_config(cfg, encoding, data), seed=cfg.seed).to(device)
        tcfg = TrainConfig(
            steps=cfg.steps,
            batch_size=cfg.batch_size,
            length=model.config.tokens,
            lr=cfg.lr,
            weight_decay=cfg.weight_decay,
            seed=cfg.seed,
        )
        batch_fn = _batches(data.train_images, data.train_labels, stats, cfg)
        if not dist.is_main():  # other ranks only train; rank 0 evaluates and writes
            train(model, batch_fn, tcfg, out / "runs" / encoding, progress=False, meta={"data": data.source})
            continue
        if progress and not (out / "runs" / encoding / DONE_FILE).is_file():  # else train() says it is skipped
            print(f"\n[{encoding}] training at {cfg.train_res} px ({model.config.tokens} tokens) for {cfg.steps} steps")
        train(model, batch_fn, tcfg, out / "runs" / encoding, progress=progress, meta={"data": data.source})
        lines = scalings if encoding in COORDINATE_ENCODINGS else ("none",)
        plan = [(scaling, res) for scaling in lines for res in cfg.resolutions]
        todo = [(s, res) for s, res in plan if (encoding, s, cfg.train_res, res) not in done]
        if progress and (message := skipped(encoding, len(plan) - len(todo), len(plan))):
            print(message)
        with progress_bar(progress, len(todo), f"{encoding} evaluation") as advance:
            for scaling, res in todo:
                scale = cfg.train_res / res if scaling == "interpolate" else 1.0
                acc, loss = accuracy(model, prepare(test_images, res, stats), test_labels, coordinate_scale=scale)
                row = {
                    "encoding": encoding,
                    "scaling": scaling,
                    "train_res": cfg.train_res,
                    "eval_res": res,
                    "accuracy": acc,
                    "loss": loss,
                    "images": len(test_labels),
                    "patches": (res // cfg.patch_size) ** 2,
                    "status": "ok",
                }
                upsert_results(results_csv, [row])  # kept as soon as measured: an interrupted study loses no row
                done.add(result_key(row))
                advance()
    if not dist.is_main():
        dist.cleanup()
        return []
    rows = [r for r in read_results(results_csv) if r["encoding"] in cfg.encodings]
    _finish(out, cfg, rows, data, time.perf_counter() - start, progress)
    dist.cleanup()
    return rows


# ---------------------------------------------------------------------------------------------------------------------
# Table, findings, plot, report


def _lines(rows: Sequence[Mapping[str, Any]]) -> dict[tuple[str, str], dict[int, Mapping[str, Any]]]:
    """Rows grouped by (encoding, scaling) in the order run, each as eval_res -> row (as trained first)."""
    groups: dict[tuple[str, str], dict[int, Mapping[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["encoding"], r.get("scaling") or "none"), {})[r["eval_res"]] = r
    order = {e: i for i, e in enumerate(dict.fromkeys(r["encoding"] for r in rows))}
    return dict(sorted(groups.items(), key=lambda item: (order[item[0][0]], item[0][1] != "none")))


def how(encoding: str, scaling: str) -> str:
    """How a line meets resolutions it was not trained at."""
    return "interpolate" if scaling == "interpolate" else HOW.get(encoding, "")


def table(rows: Sequence[Mapping[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """Headers and cells: one line per encoding and scaling, one accuracy column per evaluation resolution."""
    train = sorted({r["train_res"] for r in rows})
    res = sorted({r["eval_res"] for r in rows})
    one = train[0] if len(train) == 1 else None
    headers = ["encoding", "at new res."] + [
        f"{n} px (train)" if n == one else f"{n} px ({n / one:g}x)" if one else f"{n} px" for n in res
    ]
    cells = []
    for (e, scaling), by_res in _lines(rows).items():
        line = [e, how(e, scaling)]
        for n in res:
            row = by_res.get(n)
            line.append("-" if row is None or row["accuracy"] is None else f"{100 * row['accuracy']:.1f}%")
        cells.append(line)
    return headers, cells


def format_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """The accuracy table as markdown, the best of each column in bold."""
    headers, cells = table(rows)
    for j in range(2, len(headers)):
        values = [float(c[j][:-1]) for c in cells if c[j].endswith("%")]
        for c in cells:
            if values and c[j].endswith("%") and float(c[j][:-1]) == max(values) and len(values) > 1:
                c[j] = f"**{c[j]}**"
    rule = "|" + "|".join(":--" if j < 2 else "--:" for j in range(len(headers))) + "|"
    return "\n".join(["| " + " | ".join(headers) + " |", rule, *("| " + " | ".join(c) + " |" for c in cells)]) + "\n"


def print_table(rows: Sequence[Mapping[str, Any]]) -> None:
    from rich.table import Table

    headers, cells = table(rows)
    out = Table(title="Top-1 test accuracy by evaluation resolution (higher is better)")
    for j, h in enumerate(headers):
        out.add_column(h, justify="left" if j < 2 else "right", style="cyan" if j == 0 else None)
    for line in cells:
        out.add_row(*line)
    console = wide_console()
    console.width = max(console.width, 100)  # rows stay one line each in an 80-column pipe
    console.print(out)


def interval(row: Mapping[str, Any]) -> tuple[float, float] | None:
    """The 95% Wilson interval of a row's accuracy over its ``images`` test images; None without a count."""
    n = row.get("images")
    if row.get("accuracy") is None or isinstance(n, bool) or not isinstance(n, int) or n <= 0:
        return None
    return wilson_interval(row["accuracy"], n)


def _accuracy_text(row: Mapping[str, Any]) -> str:
    """``46.2% [43.1, 49.3]``: the accuracy and its 95% interval (without the interval when there is no count)."""
    ci = interval(row)
    text = f"{100 * row['accuracy']:.1f}%"
    return text if ci is None else f"{text} [{100 * ci[0]:.1f}, {100 * ci[1]:.1f}]"


def compare(high: Mapping[str, Any], low: Mapping[str, Any], *, strict: bool) -> str:
    """Whether ``high``'s accuracy is above ``low``'s (``>`` when ``strict``, else ``>=``), given the noise:
    "noise" when their 95% intervals overlap (the gap could be chance), else "held" or "broken"; without image
    counts the raw numbers decide."""
    a, b = high["accuracy"], low["accuracy"]
    ci_a, ci_b = interval(high), interval(low)
    if ci_a is not None and ci_b is not None and ci_a[0] <= ci_b[1] and ci_b[0] <= ci_a[1]:
        return "noise"
    return "held" if (a > b if strict else a >= b) else "broken"


def _paper_check(lines_by: Mapping[tuple[str, str], Mapping[int, Mapping[str, Any]]], far: int) -> list[str]:
    """RoPE-ViT's ordering at 2x: held, broken, or within noise, each gap judged by the 95% intervals."""
    row = {e: lines_by[(e, "none")][far] for e in ("rope_mixed", "rope_axial", "learned")}
    pairs = (("rope_mixed", "rope_axial", False), ("rope_axial", "learned", True))
    states = [compare(row[a], row[b], strict=strict) for a, b, strict in pairs]
    counted = all(interval(r) is not None for r in row.values())
    if "broken" in states:
        verdict = "did NOT hold"
    elif "noise" in states:
        verdict = "could not be told apart from noise"
    else:
        verdict = "HELD"
    outside = "outside the noise (the 95% intervals do not overlap)"
    meaning = {"held": outside, "broken": outside, "noise": "within noise (the 95% intervals overlap)"}
    gaps = []
    for (a, b, _), state in zip(pairs, states, strict=True):
        gap = f"{a} - {b} = {100 * (row[a]['accuracy'] - row[b]['accuracy']):+.1f} points"
        gaps.append(f"{gap}, {meaning[state]}" if counted else gap)
    here = ", ".join(f"{e} {_accuracy_text(r)}" for e, r in row.items())
    images = sorted({r["images"] for r in row.values()}) if counted else []
    noise = (
        f" (95% Wilson intervals over {' / '.join(map(str, images))} test images)"
        if counted
        else " (no image counts in the results: no noise estimate)"
    )
    return [
        f"Paper check at 2x the training resolution ({far} px): RoPE-ViT reports RoPE-Mixed >= RoPE-Axial > "
        f"learned APE. Here {here}{noise}: the ordering {verdict} ({'; '.join(gaps)}).",
        "",
    ]


def findings_for(rows: Sequence[Mapping[str, Any]], cfg: VisionConfig, n_classes: int = 10) -> list[str]:
    """Plain statements about the measured table: the paper's ordering at 2x (judged against the noise of a finite
    test set: 95% Wilson intervals), then each line's change, each accuracy with its interval."""
    lines_by = _lines(rows)
    acc = {
        (e, s, n): r["accuracy"] for (e, s), by in lines_by.items() for n, r in by.items() if r["accuracy"] is not None
    }
    base, far = cfg.train_res, 2 * cfg.train_res
    lines = []
    if all((n, "none", far) in acc for n in ("learned", "rope_axial", "rope_mixed")):
        lines += _paper_check(lines_by, far)
    else:
        lines.append(
            f"Paper check: needs learned, rope_axial and rope_mixed evaluated at {far} px (2x); not in this run."
        )
    gains = []
    for e, scaling in lines_by:
        if scaling == "interpolate" and (e, "none", far) in acc and (e, "interpolate", far) in acc:
            noise = compare(lines_by[(e, scaling)][far], lines_by[(e, "none")][far], strict=False) == "noise"
            gain = 100 * (acc[(e, scaling, far)] - acc[(e, "none", far)])
            gains.append(f"{e} {gain:+.1f}" + (" (within noise)" if noise else ""))
    if gains:
        lines.append(
            f"Interpolating patch coordinates into the trained range (instead of extrapolating them) at {far} px, "
            f"in accuracy points: {', '.join(gains)}."
        )
        lines.append("")
    counts = sorted({r["images"] for by in lines_by.values() for r in by.values() if interval(r) is not None})
    if counts:
        lines += [f"Each accuracy below with its 95% Wilson interval over {' / '.join(map(str, counts))} test images:"]
        lines.append("")
    for e, scaling in lines_by:
        if (e, scaling, base) not in acc:
            continue
        by = lines_by[(e, scaling)]
        a = 100 * acc[(e, scaling, base)]
        others = [n for n in cfg.resolutions if n != base and (e, scaling, n) in acc]
        parts = [f"{_accuracy_text(by[n])} at {n} px ({100 * acc[(e, scaling, n)] - a:+.1f})" for n in others]
        label = e if scaling == "none" else f"{e} + {scaling}d coordinates"
        text = f"- {label}: {_accuracy_text(by[base])} at {base} px (train)"
        if parts:
            text += "; " + ", ".join(parts)
        if e in PAPER and scaling == "none":
            text += f". Paper (ViT-S, ImageNet, 224 -> 384 px): {PAPER[e][0]} -> {PAPER[e][1]}"
        lines.append(text + ".")
        if scaling == "none" and a < 200 / n_classes:
            lines.append(f"  ({e} is under twice chance at the training resolution: raise --steps before reading it.)")
    return lines


def plot_resolution(rows: Sequence[Mapping[str, Any]], out_png: str | Path, *, data: str | None = None) -> Path:
    """Accuracy against evaluation resolution, one line per encoding, the training resolution dotted."""
    from matplotlib.ticker import FixedLocator, PercentFormatter

    from posenc.lab.plots import MARKERS, PALETTE, new_figure, save_png

    fig = new_figure(9.0, 5.2)
    ax = fig.add_subplot()
    groups = _lines(rows)
    colours = {e: i for i, e in enumerate(dict.fromkeys(e for e, _ in groups))}
    for (e, scaling), by_res in groups.items():
        points = sorted((n, r["accuracy"]) for n, r in by_res.items() if r["accuracy"] is not None)
        if not points:
            continue
        xs, ys = zip(*points, strict=True)
        i = colours[e]
        ax.plot(
            xs, ys, marker=MARKERS[i % len(MARKERS)], color=PALETTE[i % len(PALETTE)], label=f"{e} ({how(e, scaling)})",
            linestyle="-" if scaling == "none" else "--", linewidth=1.8 if scaling == "none" else 1.3,
        )  # fmt: skip
    res = sorted({r["eval_res"] for r in rows})
    if res:
        ax.xaxis.set_major_locator(FixedLocator(res))
        ax.set_xlim(res[0] - 2, res[-1] + 2)
    for t in sorted({r["train_res"] for r in rows}):
        ax.axvline(t, color="0.35", linestyle=":", linewidth=1.5, zorder=1)
        ax.text(t + 0.3, 0.02, "train resolution", transform=ax.get_xaxis_transform(), fontsize=9, color="0.25")
    ax.yaxis.set_major_formatter(PercentFormatter(xmax=1.0))
    ax.set_xlabel("evaluation resolution in pixels (same patch size: more patches)")
    ax.set_ylabel("top-1 test accuracy (higher is better)")
    ax.set_title(f"Accuracy vs resolution{f' on {data}' if data else ''}", fontsize=11)
    ax.grid(True, color="0.88", linewidth=0.8)
    ax.set_axisbelow(True)
    if groups:
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8.5, frameon=False, borderaxespad=0.0)
    return save_png(fig, out_png)


def write_report(
    out: Path,
    rows: Sequence[Mapping[str, Any]],
    cfg: VisionConfig,
    findings: Sequence[str],
    source: str,
    seconds: float,
) -> Path:
    env = environment(cfg.device)
    lines = [
        "# posenc vision: resolution extrapolation",
        "",
        f"Small ViTs ({cfg.n_layers} layers, width {cfg.dim}, {cfg.n_heads} heads, {cfg.patch_size} px patches, "
        f"{cfg.pool} pooling), one per encoding, trained for {cfg.steps} steps at {cfg.train_res} px and tested at "
        f"{', '.join(map(str, cfg.resolutions))} px. Data: {source}. Time taken: {duration(seconds)}.",
        "",
        "## Results",
        "",
        "Top-1 test accuracy by evaluation resolution (bold: best in its column). The second column says how each "
        "line meets a resolution it was not trained at: `resized table` (the learned table resized bicubically), "
        "`extrapolate` (patch coordinates past the trained grid), `interpolate` (coordinates multiplied by "
        "train/eval resolution, back into the trained range: Position Interpolation for images). All numbers: "
        "[results.csv](results.csv).",
        "",
        format_table(rows),
        "![accuracy by resolution](resolution.png)",
        "",
        "## Findings",
        "",
        *findings,
        "",
        *config_and_environment(cfg.to_dict(), env, seconds),
    ]
    return write_text_atomic(out / "report.md", "\n".join(lines))


def _finish(out: Path, cfg: VisionConfig, rows: list[dict], data: ImageData, seconds: float, progress: bool) -> None:
    plot_resolution(rows, out / "resolution.png", data=data.source.split(" (")[0])
    findings = findings_for(rows, cfg, len(data.classes))
    write_report(out, rows, cfg, findings, data.source, seconds)
    if progress:
        print_table(rows)
        for line in findings:
            print(line)
        print(f"\nWrote {out / 'results.csv'}, {out / 'resolution.png'}, {out / 'report.md'} in {seconds:.0f} s")
