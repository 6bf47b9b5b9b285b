"""``posenc`` command line.

- ``posenc lab``: the length-extrapolation study (``posenc.lab.study``): train per encoding, evaluate past L.
- ``posenc figures``: explanatory pictures of the encodings.
- ``posenc demo``: what the RoPE scalings compute, checked live on this machine.
"""

from __future__ import annotations

import argparse
import math
import time

import torch

import posenc


def _demo_scalings(head_dim: int, base: float, trained: int, factor: float) -> dict[str, dict]:
    """The lab's ``rope_scaling`` dict per method, plus no scaling and a LongRoPE with a linear ramp of factors."""
    from posenc.lab.evaluate import rope_scaling

    long_factor = [1.0 + (factor - 1.0) * i / (head_dim // 2 - 1) for i in range(head_dim // 2)]
    scalings = {"default": {}}
    for method in ("linear", "ntk", "dynamic", "yarn"):
        scalings[method] = rope_scaling(method, factor=factor, original_len=trained)
    scalings["longrope"] = {
        "rope_type": "longrope",
        "short_factor": [1.0] * (head_dim // 2),
        "long_factor": long_factor,
        "original_max_position_embeddings": trained,
        "factor": factor,
    }
    scalings["llama3"] = rope_scaling("llama3", factor=factor, original_len=trained)
    return scalings


def demo(args: argparse.Namespace) -> int:
    head_dim, base, trained, factor = args.head_dim, args.base, args.trained_length, args.factor
    target = int(trained * factor)
    print(f"posenc {posenc.__version__} on torch {torch.__version__} ({torch.get_num_threads()} threads)\n")
    print(f"RoPE for head_dim={head_dim}, base={base:g}, trained on {trained} tokens, extended {factor:g}x to {target}")
    print("Wavelength = tokens per full turn of a channel pair; extension methods stretch the long ones.\n")
    print(f"{'rope_type':<10} {'attn factor':>11} {'shortest λ':>11} {'longest λ':>13} {'pairs scaled':>13}")
    plain, _ = posenc.rope_frequencies(head_dim, base=base)
    for name, scaling in _demo_scalings(head_dim, base, trained, factor).items():
        inv_freq, attention_factor = posenc.rope_frequencies(head_dim, base=base, scaling=scaling, seq_len=target)
        wavelength = 2 * math.pi / inv_freq
        scaled = int((~torch.isclose(inv_freq, plain, rtol=1e-6)).sum())
        print(
            f"{name:<10} {attention_factor:>11.4f} {wavelength.min():>11.1f} {wavelength.max():>13.4g}"
            f" {scaled:>7}/{head_dim // 2}"
        )

    print("\nChecks (float32, this machine):")
    q, k = torch.randn(1, 8, 256, head_dim), torch.randn(1, 8, 256, head_dim)
    rope = posenc.RotaryEmbedding(head_dim, base=base)
    near = torch.einsum("bhsd,bhtd->bhst", *rope(q, k, torch.arange(256)))
    far = torch.einsum("bhsd,bhtd->bhst", *rope(q, k, torch.arange(256) + 100_000))
    print(f"  q·k depends only on distance: max |Δ| after shifting 100k positions = {(near - far).abs().max():.2e}")
    half = posenc.RotaryEmbedding(head_dim, base=base)(q, k, torch.arange(256))[0]
    print(f"  rotation keeps norms: max |‖Rq‖ - ‖q‖| = {(half.norm(dim=-1) - q.norm(dim=-1)).abs().max():.2e}")
    big_q, big_k = torch.randn(1, 32, 4096, 128), torch.randn(1, 32, 4096, 128)
    big, positions = posenc.RotaryEmbedding(128), torch.arange(4096)
    rope_s = _best_of(5, lambda: big(big_q, big_k, positions))
    copy_s = _best_of(5, lambda: (big_q.clone(), big_k.clone()))
    print(
        f"  RoPE on q, k (1, 32, 4096, 128) float32: {1e3 * rope_s:.1f} ms = {rope_s / copy_s:.2f}x the time of "
        "copying them (best of 5; bench/rope_cpu.py measures carefully)"
    )
    print("\nNext: python -m pytest (the reference tests against Hugging Face transformers).")
    return 0


def _best_of(n: int, fn) -> float:
    fn()
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def _names(text: str) -> tuple[str, ...]:
    return tuple(n for n in text.replace(",", " ").split() if n)


def _lengths(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(n) for n in _names(text))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated integers, e.g. 64,128,256") from None


def lab(args: argparse.Namespace) -> int:
    from pathlib import Path

    from posenc.lab.study import TASK_DEFAULTS, StudyConfig, run_study

    try:
        task_defaults = TASK_DEFAULTS[args.task]
        cfg = StudyConfig(
            task=args.task,
            encodings=args.encodings,
            train_len=args.train_len or task_defaults["train_len"],
            eval_lens=args.eval_lens,
            steps=args.steps or task_defaults["steps"],
            batch_size=args.batch_size or task_defaults.get("batch_size", StudyConfig.batch_size),
            dim=args.dim,
            n_layers=args.layers,
            n_heads=args.heads or task_defaults.get("n_heads", StudyConfig.n_heads),
            lr=args.lr,
            seed=args.seed,
            stride=args.stride,
            finetune_steps=args.finetune_steps,
            eval_tokens=args.eval_tokens,
            corpus=None if args.corpus is None else str(Path(args.corpus).resolve()),
            device=args.device,
        )
        out = Path(args.out) if args.out else Path("runs") / time.strftime("lab-%Y%m%d-%H%M%S")
        run_study(cfg, out, resume=args.resume, progress=not args.quiet)
    except ValueError as err:
        print(f"posenc lab: {err}")
        return 2
    return 0


def vision(args: argparse.Namespace) -> int:
    from pathlib import Path

    from posenc.lab.vision import VisionConfig, run_vision

    try:
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
            device=args.device,
        )
        out = Path(args.out) if args.out else Path("runs") / time.strftime("vision-%Y%m%d-%H%M%S")
        run_vision(cfg, out, resume=args.resume, progress=not args.quiet)
    except ValueError as err:
        print(f"posenc vision: {err}")
        return 2
    return 0


def _add_vision(sub: argparse._SubParsersAction) -> None:
    from posenc.lab.vision import DEFAULT_ENCODINGS, VisionConfig

    d = VisionConfig()
    p = sub.add_parser("vision", help="which 2-D encoding extrapolates? train a ViT at one resolution, test at others")
    p.add_argument("--encodings", type=_names, default=DEFAULT_ENCODINGS, help="comma-separated 2-D encodings")
    p.add_argument("--train-res", type=int, default=d.train_res, help="training resolution in pixels")
    p.add_argument("--eval-res", type=_lengths, default=None, help="comma-separated; default 0.75x, 1x, 1.5x, 2x")
    p.add_argument("--patch-size", type=int, default=d.patch_size)
    p.add_argument("--steps", type=int, default=d.steps)
    p.add_argument("--batch-size", type=int, default=d.batch_size, help="global batch (split across DDP ranks)")
    p.add_argument("--dim", type=int, default=d.dim)
    p.add_argument("--layers", type=int, default=d.n_layers)
    p.add_argument("--heads", type=int, default=d.n_heads)
    p.add_argument("--lr", type=float, default=d.lr)
    p.add_argument("--crop-scale", type=float, default=d.crop_scale, help="random-resized-crop area range (s, 1)")
    p.add_argument("--pool", default=d.pool, choices=["mean", "cls"])
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument(
        "--data",
        default=None,
        help="IDX files or class-named image folders (default: Fashion-MNIST from Debian's dataset-fashion-mnist, "
        "else scikit-learn's digits)",
    )
    p.add_argument("--eval-images", type=int, default=None, help="test images per resolution (default: all)")
    p.add_argument("--device", default=d.device)
    p.add_argument("--out", default=None, help="output folder (default: runs/vision-<time>)")
    p.add_argument("--resume", action="store_true", help="continue the study in --out where it stopped")
    p.add_argument("--quiet", action="store_true", help="no progress bars or tables")
    p.set_defaults(func=vision)


def _factors(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(n) for n in _names(text))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated numbers, e.g. 2,4") from None


def extend(args: argparse.Namespace) -> int:
    from pathlib import Path

    from posenc.lab.extend import ExtendConfig, run_extend

    try:
        new = args.model == "new" or args.model.startswith("new:")
        cfg = ExtendConfig(
            model=args.model if new else str(Path(args.model).resolve()),
            methods=args.methods,
            factors=args.factors,
            lengths=args.lengths,
            depths=args.depths,
            trials=args.trials,
            finetune_steps=args.finetune_steps,
            finetune_lr=args.finetune_lr,
            corpus=None if args.corpus is None else str(Path(args.corpus).resolve()),
            eval_tokens=args.eval_tokens,
            task=args.task,
            original_len=args.original_len,
            train_len=args.train_len,
            train_steps=args.train_steps,
            device=args.device,
            seed=args.seed,
        )
        out = Path(args.out) if args.out else Path("runs") / time.strftime("extend-%Y%m%d-%H%M%S")
        run_extend(cfg, out, resume=args.resume, progress=not args.quiet)
    except ValueError as err:
        print(f"posenc extend: {err}")
        return 2
    return 0


def _add_extend(sub: argparse._SubParsersAction) -> None:
    from posenc.lab.extend import ExtendConfig

    d = ExtendConfig(model="new", task="passkey")
    p = sub.add_parser(
        "extend",
        help="extend a trained model's context (RoPE scalings, ALiBi interpolation): perplexity and passkey vs length",
    )
    p.add_argument(
        "model",
        help="a `posenc lab` run folder, a transformers model folder (offline), or new / new:alibi (--task passkey)",
    )
    p.add_argument("--methods", type=_names, default=None, help="comma-separated; default every method for the model")
    p.add_argument("--factors", type=_factors, default=d.factors, help="comma-separated factors >= 1 (default 2,4)")
    p.add_argument("--lengths", type=_lengths, default=None, help="comma-separated; default 1x, 2x, 4x, 8x original")
    p.add_argument("--depths", type=_factors, default=d.depths, help="passkey depths in [0, 1], comma-separated")
    p.add_argument("--trials", type=int, default=d.trials, help="passkey keys per length and depth")
    p.add_argument("--finetune-steps", type=int, default=0, help="also fine-tune each patch at its target length")
    p.add_argument("--finetune-lr", type=float, default=None, help="default 3e-4 (lab), 2e-5 (transformers)")
    p.add_argument(
        "--task",
        default="lm",
        choices=["lm", "passkey"],
        help="lm: perplexity and passkey zero-shot; passkey: train the task first (lab models), then test",
    )
    p.add_argument("--corpus", default=None, help="a text file or folder (default: the Python standard library)")
    p.add_argument("--eval-tokens", type=int, default=d.eval_tokens, help="tokens scored per perplexity length")
    p.add_argument("--original-len", type=int, default=None, help="override the model's original context length")
    p.add_argument("--train-len", type=int, default=d.train_len, help="training length of a `new` model (bytes)")
    p.add_argument("--train-steps", type=int, default=d.train_steps, help="passkey training steps (--task passkey)")
    p.add_argument("--device", default=d.device, help="auto (CUDA when present), cpu, cuda, cuda:1, ...")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--out", default=None, help="output folder (default: runs/extend-<time>)")
    p.add_argument("--resume", action="store_true", help="continue the run in --out where it stopped")
    p.add_argument("--quiet", action="store_true", help="no progress bars or tables")
    p.set_defaults(func=extend)


def bench(args: argparse.Namespace) -> int:
    from pathlib import Path

    import torch

    from posenc.lab import bench as b

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    try:
        if args.quick:
            cases = b.rotary_cases((1024, 4096), (128,), ("float32",), b.LAYOUTS)
        else:
            cases = b.rotary_cases(args.lengths, args.head_dims, args.dtypes, args.layouts)
        attention_lengths = args.attention_lengths or ((8192,) if device.startswith("cuda") else (2048,))
        for n in attention_lengths:
            b.check_positive_int("attention_lengths", n)
        for name in args.attention_encodings:
            b.check_choice("attention_encodings", name, b.BIAS_ENCODINGS)
    except ValueError as err:
        print(f"posenc bench: {err}")
        return 2
    header = b.header(device)
    print(header)
    b.settle_allocator()
    rotary, attention = [], []
    if not args.no_rotary:
        for case in cases:
            rotary.append(b.run_rotary_case(case, device=device, min_run_time=args.min_run_time,
                                            compile_hf=args.compile))  # fmt: skip
        b.print_rows(rotary, b.ROTARY_COLUMNS, "RoPE on q and k (vs X = X's time / posenc's time)")
    if not args.no_attention:
        for name in args.attention_encodings:
            for n in attention_lengths:
                attention.append(b.run_attention_case(name, n, device=device, dtype="bfloat16",
                                                      min_run_time=args.min_run_time))  # fmt: skip
        b.print_rows(attention, b.ATTENTION_COLUMNS, "Bias attention, inference (B=1, H=8, D=64)")
    if args.out:
        for path in b.write_outputs(Path(args.out), rotary, attention, header):
            print(path)
    return 0


def figures(args: argparse.Namespace) -> int:
    from posenc.lab.figures import draw_figures

    for path in draw_figures(args.out):
        print(path)
    return 0


def main(argv: list[str] | None = None) -> int:
    from posenc.lab.study import DEFAULT_ENCODINGS, StudyConfig

    d = StudyConfig()
    parser = argparse.ArgumentParser(prog="posenc", description="Positional encodings for PyTorch transformers.")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("lab", help="which encoding extrapolates? train at length L, evaluate at L..16L")
    p.add_argument(
        "--task",
        default=d.task,
        choices=["lm", "copy", "recall"],
        help="lm: byte-level language modelling (perplexity); copy/recall: exact-match accuracy",
    )
    p.add_argument(
        "--encodings", type=_names, default=DEFAULT_ENCODINGS, help="comma-separated names (posenc.available())"
    )
    p.add_argument("--train-len", type=int, default=None, help="default 64 (lm), 16 (copy, recall)")
    p.add_argument("--eval-lens", type=_lengths, default=None, help="comma-separated lengths; default L,2L,4L,8L,16L")
    p.add_argument("--steps", type=int, default=None, help="default 1000 (lm), 3000 (copy, recall)")
    p.add_argument(
        "--batch-size",
        type=int,
        default=None,
        help="global batch (split across DDP ranks); default 32 (lm), 64 (copy, recall)",
    )
    p.add_argument("--dim", type=int, default=d.dim)
    p.add_argument("--layers", type=int, default=d.n_layers)
    p.add_argument("--heads", type=int, default=None, help="default 4 (lm), 8 (copy, recall)")
    p.add_argument("--lr", type=float, default=d.lr)
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--stride", type=int, default=None, help="sliding-window evaluation with this stride (ALiBi paper)")
    p.add_argument("--finetune-steps", type=int, default=0, help="also fine-tune RoPE scalings at each length (PI)")
    p.add_argument("--eval-tokens", type=int, default=d.eval_tokens, help="held-out tokens scored per length")
    p.add_argument("--corpus", default=None, help="a text file or folder (default: the Python standard library)")
    p.add_argument("--device", default=d.device)
    p.add_argument("--out", default=None, help="output folder (default: runs/lab-<time>)")
    p.add_argument("--resume", action="store_true", help="continue the study in --out where it stopped")
    p.add_argument("--quiet", action="store_true", help="no progress bars or tables")
    p.set_defaults(func=lab)
    _add_vision(sub)
    _add_extend(sub)
    p = sub.add_parser("figures", help="draw the explanatory pictures (sinusoids, ALiBi, RoPE decay, scalings)")
    p.add_argument("--out", default="figures")
    p.set_defaults(func=figures)
    p = sub.add_parser("bench", help="RoPE and bias-attention speed vs a copy, transformers, Liger, flash-attn")
    p.add_argument("--device", default=None, help="default: cuda if available, else cpu")
    p.add_argument("--lengths", type=_lengths, default=(1024, 2048, 4096, 8192, 16384))
    p.add_argument(
        "--head-dims", type=_lengths, default=(64, 128, 256), help="128 at every length, others at the middle one"
    )
    p.add_argument("--dtypes", type=_names, default=("float32", "bfloat16"))
    p.add_argument("--layouts", type=_names, default=("half", "interleaved"))
    p.add_argument("--attention-encodings", type=_names, default=("alibi", "alibi_2d", "t5"))
    p.add_argument("--attention-lengths", type=_lengths, default=None, help="default 8192 on CUDA, 2048 on CPU")
    p.add_argument("--min-run-time", type=float, default=0.5, help="seconds of timing per measurement")
    p.add_argument("--compile", action="store_true", help="also time torch.compile of transformers' eager RoPE")
    p.add_argument("--quick", action="store_true", help="a small subset: head dim 128, float32, 1k and 4k tokens")
    p.add_argument("--no-rotary", action="store_true")
    p.add_argument("--no-attention", action="store_true")
    p.add_argument("--out", default=None, help="write rotary.csv, attention.csv and bench.md here")
    p.set_defaults(func=bench)
    p = sub.add_parser("demo", help="print what each RoPE scaling does, with live checks")
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--base", type=float, default=500000.0)
    p.add_argument("--trained-length", type=int, default=8192)
    p.add_argument("--factor", type=float, default=4.0)
    p.set_defaults(func=demo)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    raise SystemExit(main())
