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

import time
from pathlib import Path

import torch
import torch.nn.functional as F

from posenc._devices import resolve_device
from posenc.lab.common import dist
from posenc.lab.common.progress import progress_bar, skipped
from posenc.lab.common.runfiles import KeyedCSV, check_settings
from posenc.lab.common.train import DONE_FILE, TrainConfig, rank_rows, step_generator, train
from posenc.lab.vision.config import VisionConfig
from posenc.lab.vision.images import ImageData, load_images, normalisation, prepare, random_resized_crop
from posenc.lab.vision.report import findings_for, plot_resolution, print_table, write_report
from posenc.lab.vision.vit import ViT, ViTConfig

RESULT_COLUMNS = ["encoding", "scaling", "train_res", "eval_res", "accuracy", "loss", "images", "patches", "status"]
KEY_COLUMNS = ("encoding", "scaling", "train_res", "eval_res")
#: Encodings that read patch coordinates, so they also run with coordinates interpolated into the trained range.
COORDINATE_ENCODINGS = frozenset({"sinusoidal", "sinusoidal_2d", "rope_axial", "rope_mixed", "alibi_2d"})


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
# The report


def _finish(out: Path, cfg: VisionConfig, rows: list[dict], data: ImageData, seconds: float, progress: bool) -> None:
    plot_resolution(rows, out / "resolution.png", data=data.source.split(" (")[0])
    findings = findings_for(rows, cfg, len(data.classes))
    write_report(out, rows, cfg, findings, data.source, seconds)
    if progress:
        print_table(rows)
        for line in findings:
            print(line)
        print(f"\nWrote {out / 'results.csv'}, {out / 'resolution.png'}, {out / 'report.md'} in {seconds:.0f} s")
