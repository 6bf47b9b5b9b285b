"""``posenc lab``: the length-extrapolation study (``posenc.lab.length``): train per encoding, evaluate past L."""

from __future__ import annotations

import argparse
from pathlib import Path

from posenc import _argtypes as A
from posenc.cli.parsing import Subparsers, add_run_options, given, wrote

#: Parsing facts (tests/test_cli_startup.py): ``posenc.lab.length.config``'s ``DEFAULT_ENCODINGS`` and the
#: ``StudyConfig`` defaults the options show.
LAB_ENCODINGS = ("nope", "sinusoidal", "learned", "rope", "alibi", "t5", "sandwich", "fope")
LAB_DEFAULTS = {"task": "lm", "dim": 64, "n_layers": 2, "lr": 3e-3, "seed": 0, "eval_tokens": 16384, "device": "cpu"}


def run(args: argparse.Namespace) -> int:
    from posenc._devices import resolve_device
    from posenc.lab.common.runfiles import check_out
    from posenc.lab.length.config import TASK_DEFAULTS, StudyConfig
    from posenc.lab.length.study import default_jobs, run_study

    task_defaults = TASK_DEFAULTS[args.task]
    cfg = StudyConfig(
        task=args.task,
        encodings=args.encodings,
        train_len=given(args.train_len, task_defaults["train_len"]),
        eval_lens=args.eval_lens,
        steps=given(args.steps, task_defaults["steps"]),
        batch_size=given(args.batch_size, task_defaults.get("batch_size", StudyConfig.batch_size)),
        dim=args.dim,
        n_layers=args.layers,
        n_heads=given(args.heads, task_defaults.get("n_heads", StudyConfig.n_heads)),
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
        wrote(args.out)
    return 0


def add(sub: Subparsers) -> None:
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
    add_run_options(p, "lab", "study")
    p.set_defaults(func=run)
