"""``posenc vision``: the resolution study (``posenc.lab.vision``): a ViT per 2-D encoding, tested at other sizes."""

from __future__ import annotations

import argparse
from pathlib import Path

from posenc import _argtypes as A
from posenc.cli.parsing import Subparsers, add_run_options, wrote

#: Parsing facts (tests/test_cli_startup.py): ``posenc.lab.vision.config``'s ``DEFAULT_ENCODINGS`` and the
#: ``VisionConfig`` defaults the options show.
VISION_ENCODINGS = ("learned", "sinusoidal", "nope", "rope_axial", "rope_mixed", "alibi_2d")
VISION_DEFAULTS = {
    "train_res": 16, "patch_size": 4, "steps": 2000, "batch_size": 64, "dim": 64, "n_layers": 4, "n_heads": 4,
    "lr": 2e-3, "crop_scale": 0.35, "pool": "mean", "seed": 0, "device": "cpu",
}


def run(args: argparse.Namespace) -> int:
    from posenc._devices import resolve_device
    from posenc.lab.common.runfiles import check_out
    from posenc.lab.vision.config import VisionConfig
    from posenc.lab.vision.study import run_vision

    cfg = VisionConfig(
        encodings=args.encodings,
        train_res=args.train_res,
        eval_res=args.eval_res,
        patch_size=args.patch_size,
        steps=args.steps,
        batch_size=args.batch_size,
        dim=args.dim,
        n_layers=args.layers,
        n_heads=args.heads,
        lr=args.lr,
        crop_scale=args.crop_scale,
        pool=args.pool,
        seed=args.seed,
        data=None if args.data is None else str(Path(args.data).resolve()),
        eval_images=args.eval_images,
        device=resolve_device(args.device, allow_auto=False),
    )
    check_out(args.out, "vision")
    run_vision(cfg, Path(args.out), resume=args.resume, progress=not args.quiet)
    if args.quiet:
        wrote(args.out)
    return 0


def add(sub: Subparsers) -> None:
    d = argparse.Namespace(**VISION_DEFAULTS)
    p = sub.add_parser("vision", help="which 2-D encoding extrapolates? train a ViT at one resolution, test at others")
    p.add_argument("--encodings", type=A.names, default=VISION_ENCODINGS, help="comma-separated 2-D encodings")
    p.add_argument("--train-res", type=A.positive_int, default=d.train_res, help="training resolution in pixels")
    p.add_argument("--eval-res", type=A.positive_ints, help="comma-separated pixels; default 0.75x, 1x, 1.5x, 2x")
    p.add_argument("--patch-size", type=A.positive_int, default=d.patch_size, help="patch side in pixels")
    p.add_argument("--steps", type=A.positive_int, default=d.steps, help="training steps")
    p.add_argument(
        "--batch-size", type=A.positive_int, default=d.batch_size, help="global batch (split across DDP ranks)"
    )
    p.add_argument("--dim", type=A.positive_int, default=d.dim, help="model width (a multiple of 4 x heads)")
    p.add_argument("--layers", type=A.positive_int, default=d.n_layers, help="transformer layers")
    p.add_argument("--heads", type=A.positive_int, default=d.n_heads, help="attention heads")
    p.add_argument("--lr", type=A.positive_float, default=d.lr, help="peak AdamW learning rate")
    p.add_argument(
        "--crop-scale", type=A.fraction, default=d.crop_scale, help="random-resized-crop area range (s, 1); 1: off"
    )
    p.add_argument("--pool", default=d.pool, choices=["mean", "cls"], help="how the classifier reads the tokens")
    p.add_argument("--seed", type=A.nonnegative_int, default=d.seed, help="seed of the weights and batches")
    p.add_argument(
        "--data",
        help="IDX files or class-named image folders (default: Fashion-MNIST from Debian's dataset-fashion-mnist, "
        "else scikit-learn's digits)",
    )
    p.add_argument("--eval-images", type=A.positive_int, help="test images per resolution (default: all)")
    p.add_argument("--device", default=d.device, help="cpu, cuda, cuda:<index> or mps")
    add_run_options(p, "vision", "study")
    p.set_defaults(func=run)
