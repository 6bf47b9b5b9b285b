"""``posenc extend``: context extension of a trained model (``posenc.lab.extend``): perplexity and passkey.

The options that set ``ExtendConfig`` fields come from ``posenc.lab.extend.settings.options.OPTIONS`` (one list: the
parser is built from it and the config back from the parsed arguments); the run's own (--save, --pick, --plan, ...)
are added here, where ``--help`` has always listed them.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from posenc import _argtypes as A
from posenc._fail import fail
from posenc.cli.parsing import TENSOR_TYPES, Subparsers, add_run_options, wrote
from posenc.lab.extend.pick.budget import parse_budget
from posenc.lab.extend.settings.lengths import length_form
from posenc.lab.extend.settings.options import OPTIONS, config_settings


def _check(args: argparse.Namespace) -> None:
    """The settings that need no model, checked before anything is imported: --pick's own, and those it refuses."""
    if not args.pick:
        for flag, value in (("--target", args.target), ("--budget", args.budget), ("--keys", args.keys),
                            ("--delta", args.delta), ("--keep-short", args.keep_short or None), ("--ask", args.ask)):
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
        if getattr(args, "task", None) == "ruler" and not args.resume:
            fail("--task", "ruler", "lm or passkey with a new --pick: its race measures documents of --keys passkeys "
                 "at the target (RULER: posenc extend MODEL --task ruler --methods M; a pick folder made before "
                 "resumes with its own task)")
        if args.delta is not None and args.delta >= 1:
            fail("--delta", args.delta, "a margin in rate below 1 (0.05: within 5 points of the best)")
        length_form("target", args.target)  # its form now; beyond the model's context once its config is read
        parse_budget(args.budget)


def run(args: argparse.Namespace) -> int:
    _check(args)
    from posenc._devices import resolve_device
    from posenc.lab.common.runfiles import check_out
    from posenc.lab.extend.settings.config import ExtendConfig
    from posenc.lab.extend.study.run import run_extend

    cfg = ExtendConfig(**config_settings(args))
    resolve_device(args.device, allow_auto=True)  # checked here; kept as given in the config
    if args.pick:
        from posenc.lab.extend.pick.run import run_pick

        check_out(args.out, "pick")
        run_pick(
            cfg, args.target, Path(args.out), budget=args.budget, resume=args.resume, progress=not args.quiet,
            save=args.save, save_type=args.save_type, plan_only=args.plan, keys=args.keys, delta=args.delta,
            keep_short=args.keep_short, ask=args.ask,
        )
        if args.quiet and not args.plan:
            wrote(args.out)
        return 0
    check_out(args.out, "extend")
    run_extend(
        cfg, Path(args.out), resume=args.resume, progress=not args.quiet, save=args.save, save_type=args.save_type,
        plan_only=args.plan,
    )
    if args.quiet and not args.plan:
        wrote(args.out)
    return 0


DESCRIPTION = (
    "Patch a model's positions for a longer context with each method and factor, and measure "
    "perplexity (whole windows and past the original context) and passkey retrieval. Left-out settings follow "
    "the model: a pretrained model gets a study sized for the device (CPU: none, yarn x2, dynamic x2 at 0.5x and "
    "1.5x its context; CUDA: factors 2, 4, 8 up to 8x), a lab model the lab's (every method, x2 and x4, 1x-8x). "
    "Before any weight loads, every setting is checked and a plan is printed (the models, lengths and forwards) "
    "with a time estimate from the model's size and this machine's speed; the estimate is refined after "
    "timed forwards. --plan prints that plan and estimate and stops, writing nothing (with --pick it loads the "
    "weights to time forwards first; see --plan). To write a patched model "
    "without measuring it: posenc export."
)


def _add_save(p: argparse.ArgumentParser) -> None:
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


def _add_pick(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--pick",
        action="store_true",
        help="answer 'which method makes this model work at --target, and how sure?': every training-free method's "
        "perplexity at the target (a broken one is out), its cost inside the original context (perplexity at L/4 "
        "and L, keys at L), then a race at the target on documents of --keys passkeys each (one forward per "
        "document, every key scored), paired on the same documents, until one is shown better, the cheapest "
        "to serve is shown within --delta of every model, or no candidate is shown to retrieve; --trials is the "
        "documents per model at most; a plan with a time estimate is printed before any weight is loaded; --save "
        "writes the pick",
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
        "--keys", type=A.positive_int, help="--pick: passkeys per document at the target and inside the context "
        "(default 16, asked blind: see --ask; a resumed pick keeps its own)"
    )
    p.add_argument(
        "--ask", choices=("blind", "document"), help="--pick: how a document's keys are asked: blind (the default "
        "for more than one key) asks each in its own branch that sees the haystack with its own needle alone, so "
        "every key is a single passkey (LM-Infinite, which reaches far tokens only through nearer ones, gets "
        "one-key documents); document asks every question after the document, keys told apart by their door "
        "(RULER's multi-key task, which can rank methods differently; the default for --keys 1: the single "
        "passkey); a resumed pick keeps its own"
    )
    p.add_argument(
        "--delta", type=A.fraction, help="--pick: the margin in the rate of keys found within which the cheapest to "
        "serve counts as as good as the best (default 0.05)"
    )
    p.add_argument(
        "--keep-short", action="store_true", help="--pick: a candidate that costs short prompts (perplexity inside "
        "the original context more than 2%% above the unpatched model's, or keys there shown below it) is not raced"
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


#: The run's own options, each group after the config option ``--help`` has always listed it after.
_AFTER = {"layer_type": _add_save, "seed": _add_pick}


def add(sub: Subparsers) -> None:
    p = sub.add_parser(
        "extend",
        help="extend a pretrained or lab model's context (RoPE scalings, ALiBi interpolation): perplexity and "
        "passkey vs length",
        description=DESCRIPTION,
    )
    for option in OPTIONS:
        option.add_to(p)
        if option.field in _AFTER:
            _AFTER[option.field](p)
    add_run_options(p, "extend", "run")
    p.set_defaults(func=run)
