"""Paired perplexity per window inside the context: each method's ratio to the unpatched model with a 95% interval.

    python experiments/qwen2.5-yarn/paired_windows.py --lengths 2048,8192 --out experiments/qwen2.5-yarn/paired.json

The study (``study/``) reports one perplexity per model and length, over the same 40,960 held-out tokens for every
model. This script scores those same windows (``posenc.lab.common.corpus.eval_windows``, in the study's settings:
bfloat16 where the CPU has units for it, RoPE in float32) one at a time, so that the models can be compared window by
window: per window the mean next-token loss of a method minus the unpatched model's (the same tokens), then Student's
t over the windows (``posenc.lab.extend.stats.paired.t_quantile``, df = windows - 1) for the mean difference, reported
as a perplexity ratio ``exp(mean)`` with ``exp(mean -+ t se)``. Windows are the unit (tokens of one window are not
independent); at 32,768 tokens there is one window and no interval. The whole-text ratio (the study's) is printed
beside it. Writes ``--out`` atomically.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import tempfile
from pathlib import Path

import torch

from posenc.lab.common.corpus import eval_windows
from posenc.lab.extend.settings.config import ExtendConfig
from posenc.lab.extend.stats.paired import t_quantile
from posenc.lab.extend.study import plan
from posenc.lab.extend.targets.base import as_pretrained
from posenc.lab.extend.targets.load import load_target


def _window_losses(target, model, length: int, max_tokens: int) -> list[tuple[float, int]]:  # noqa: ANN001
    """``(mean loss, scored targets)`` of each window, in eval_windows' order."""
    out = []
    with torch.inference_mode():
        for x, y, mask in eval_windows(target._heldout(), length=length, max_tokens=max_tokens, batch=1):
            losses = target._losses(model, x, y)  # (1, length)
            out.append((float(losses[mask].double().mean()), int(mask.sum())))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen2.5-coder-0.5b")
    parser.add_argument("--methods", default="yarn:4,dynamic:4", help="method:factor, comma-separated")
    parser.add_argument("--lengths", default="2048,8192")
    parser.add_argument("--eval-tokens", type=int, default=40960)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    lengths = [int(n) for n in args.lengths.split(",")]
    units = [(m, float(f)) for m, f in (u.split(":") for u in args.methods.split(","))]
    cfg = ExtendConfig(model=args.model, methods=tuple(dict.fromkeys(m for m, _ in units)),
                       factors=tuple(dict.fromkeys(f for _, f in units)), lengths=tuple(lengths),
                       eval_tokens=args.eval_tokens)
    with tempfile.TemporaryDirectory() as scratch:
        target = as_pretrained(load_target(cfg, Path(scratch), device="cpu", progress=False))
        resolved = plan.resolve(cfg, kind=target.kind, original=target.original_len,
                                default_methods=target.default_methods, device="cpu")
        target.use(resolved)
        target.load()
        per: dict[str, dict[int, list[tuple[float, int]]]] = {"none": {}}
        for length in lengths:
            per["none"][length] = _window_losses(target, target.model, length, args.eval_tokens)
            print(f"none at {length}: {len(per['none'][length])} windows", flush=True)
        for method, factor in units:
            name = f"{method} x{factor:g}"
            model, _ = target.patched(method, factor)
            per[name] = {n: _window_losses(target, model, n, args.eval_tokens) for n in lengths}
            print(f"{name}: done", flush=True)
            del model
    result: dict = {"model": args.model, "dtype": str(target.dtype).removeprefix("torch."), "lengths": {}}
    for length in lengths:
        base = per["none"][length]
        rows = {}
        for name, by_length in per.items():
            if name == "none":
                continue
            windows = by_length[length]
            diffs = [w[0] - b[0] for w, b in zip(windows, base, strict=True)]
            weights = [b[1] for b in base]
            whole = math.exp(sum(w[0] * n for w, n in zip(windows, weights, strict=True)) / sum(weights)
                             - sum(b[0] * n for b, n in zip(base, weights, strict=True)) / sum(weights))
            row = {"windows": len(diffs), "ratio_whole_text": whole,
                   "ratio_mean_window": math.exp(statistics.fmean(diffs))}
            if len(diffs) > 1:
                se = statistics.stdev(diffs) / math.sqrt(len(diffs))
                t = t_quantile(0.975, len(diffs) - 1)
                mean = statistics.fmean(diffs)
                row |= {"low": math.exp(mean - t * se), "high": math.exp(mean + t * se),
                        "windows_worse": sum(d > 0 for d in diffs)}
            rows[name] = row
            print(f"{length}: {name} / none = {row}", flush=True)
        result["lengths"][str(length)] = rows
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=args.out.parent, delete=False, suffix=".tmp") as f:
        json.dump(result, f, indent=2)
    os.replace(f.name, args.out)


if __name__ == "__main__":
    main()
