"""One forward of a real pretrained model over a long text, CPU: which settings make the lab's long runs affordable.

The lab's default extension study runs SmolLM2-135M (8192-token context) at ~12k tokens on 2 cores within minutes,
so one forward's cost decides what it can afford. Each setting computes what the study needs, the next-token loss at
every position (perplexity by position), over the same tokens (Python standard library source, tokenized by the
model's tokenizer), and runs in a fresh process so its peak RSS is its own:

- ``attn``: transformers' ``eager`` attention (materialises the (S, S) scores per head) or ``sdpa``;
- ``dtype``: ``float32`` or ``bfloat16`` weights and activations, or ``autocast``: float32 weights and residual
  stream, matrix products in bfloat16 (``torch.autocast("cpu", torch.bfloat16)``);
- ``mode``: ``logits`` (one forward, the full (S, vocab) float logits, then the loss: 2.4 GB at 12288 tokens);
  ``hidden`` (one forward to the last hidden states, then the head and the loss in 1024-row chunks); ``prefill``
  (2048-token chunks through a KV cache, head and loss per chunk: attention memory linear in S);
- ``grad``: ``inference`` (``torch.inference_mode``) or ``no_grad``.

Each process loads the model (``posenc.hf.load_causal_lm``), runs an untimed 256-token forward (the first forward
pays kernel set-up and first-touch page faults: 2x the steady time at 4096 tokens), then ``--repeats`` timed ones.
Correctness: every setting's per-position loss is compared with the first setting's (max |Δ loss|, agreement of
the top-1 predictions); ``prefill`` must match one forward within float tolerance.
Not a test: numbers depend on the machine and its load (printed with ``os.getloadavg``).

Usage:
  python bench/real_model_forward.py                    # the default settings at 4096 tokens
  python bench/real_model_forward.py --length 12288 --repeats 1 \
      --settings sdpa,float32,hidden sdpa,float32,prefill sdpa,autocast,hidden sdpa,bfloat16,hidden
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import math
import os
import platform
import resource
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

DEFAULT_SETTINGS = (
    "sdpa,float32,hidden",
    "sdpa,float32,logits",
    "sdpa,float32,hidden,no_grad",
    "eager,float32,hidden",
    "sdpa,float32,prefill",
    "sdpa,autocast,hidden",
    "sdpa,bfloat16,hidden",
    "sdpa,bfloat16,prefill",
)
CHUNK = 2048  # tokens per prefill step
HEAD_CHUNK = 1024  # rows of hidden states through the output head at a time: (1024, 49152) float32 logits = 192 MiB
WARMUP = 256  # tokens of an untimed first forward: kernel set-up and first-touch costs, not the model's


def text_ids(tokenizer, length: int) -> torch.Tensor:
    """``length`` tokens of the Python standard library's source, files in sorted order: ``(1, length)``."""
    parts, count = [], 0
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
        text = path.read_text(encoding="utf-8", errors="replace")
        parts.append(text)
        count += len(text) // 3  # a cheap lower bound on tokens: code runs ~3 characters a token or more
        if count > 2 * length:
            break
    ids = tokenizer("\n".join(parts), return_tensors="pt")["input_ids"][:, :length]
    if ids.shape[1] < length:
        raise SystemExit(f"only {ids.shape[1]} tokens of stdlib text, fewer than --length {length}")
    return ids


def _chunked_loss(model, hidden: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-position loss and top-1 prediction from hidden states, the head applied ``HEAD_CHUNK`` rows at a time.

    Shapes:
        hidden (S, Dm), targets (S,) -> loss (S,) float32, top1 (S,) int64.
    """
    losses, top1 = [], []
    for i in range(0, hidden.shape[0], HEAD_CHUNK):
        logits = model.lm_head(hidden[i : i + HEAD_CHUNK]).float()  # (chunk, vocab)
        losses.append(F.cross_entropy(logits, targets[i : i + HEAD_CHUNK], reduction="none"))
        top1.append(logits.argmax(-1))
    return torch.cat(losses), torch.cat(top1)


def forward_loss(model, ids: torch.Tensor, mode: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Next-token loss and top-1 prediction at positions 0..S-2 (the last token has no target).

    Shapes:
        ids (1, S) -> loss (S - 1,) float32, top1 (S - 1,) int64.
    """
    targets = ids[0, 1:]
    if mode == "logits":
        logits = model(ids, use_cache=False).logits[0, :-1].float()  # (S - 1, vocab)
        return F.cross_entropy(logits, targets, reduction="none"), logits.argmax(-1)
    if mode == "hidden":
        hidden = model.model(ids, use_cache=False).last_hidden_state[0, :-1]  # (S - 1, Dm)
        return _chunked_loss(model, hidden, targets)
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    losses, top1 = [], []
    for i in range(0, ids.shape[1], CHUNK):
        chunk = ids[:, i : i + CHUNK]
        positions = torch.arange(i, i + chunk.shape[1])[None]  # (1, chunk)
        hidden = model.model(chunk, past_key_values=cache, use_cache=True, position_ids=positions).last_hidden_state
        hidden = hidden[0, : targets.shape[0] - i]  # the last chunk's last token has no target
        loss, top = _chunked_loss(model, hidden, targets[i : i + hidden.shape[0]])
        losses.append(loss)
        top1.append(top)
    return torch.cat(losses), torch.cat(top1)


def run_one(setting: str, length: int, repeats: int, out: Path) -> dict:
    """Load the model, warm up, run ``repeats`` forwards of one setting, save its loss, return timings and memory."""
    from posenc.hf import load_causal_lm

    attn, dtype, mode, *grad = setting.split(",")
    grad = grad[0] if grad else "inference"
    start = time.perf_counter()
    weights = "float32" if dtype == "autocast" else dtype
    model, tokenizer = load_causal_lm("smollm2", dtype=weights, attn_implementation=attn)
    load_s = time.perf_counter() - start
    ids = text_ids(tokenizer, length)
    rss_before = _rss_mb()
    grad_mode = torch.inference_mode if grad == "inference" else torch.no_grad

    def context() -> contextlib.ExitStack:
        stack = contextlib.ExitStack()
        stack.enter_context(grad_mode())
        if dtype == "autocast":
            stack.enter_context(torch.autocast("cpu", dtype=torch.bfloat16))
        return stack

    with context():
        forward_loss(model, ids[:, :WARMUP], mode)
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        with context():
            loss, top1 = forward_loss(model, ids, mode)
        seconds.append(time.perf_counter() - start)
    torch.save({"loss": loss.float(), "top1": top1}, out)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    return {"setting": setting, "load_s": load_s, "seconds": seconds, "rss_before_mb": rss_before, "peak_mb": peak}


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--length", type=int, default=4096)
    p.add_argument("--settings", nargs="+", default=list(DEFAULT_SETTINGS), help="attn,dtype,mode[,no_grad] each")
    p.add_argument("--repeats", type=int, default=2, help="timed forwards per setting (first and best reported)")
    p.add_argument("--one", help=argparse.SUPPRESS)  # internal: run one setting in this process
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one:
        print(json.dumps(run_one(args.one, args.length, args.repeats, Path(args.out))))
        return

    print(
        f"# SmolLM2-135M, one forward of {args.length} tokens, {datetime.date.today()}, "
        f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads, torch {torch.__version__}"
    )
    print("| setting | ppl | load s | forward s (first, best) | peak RSS MiB | RSS before | load | max Δloss | top-1 |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    reference = None
    with tempfile.TemporaryDirectory() as tmp:
        for i, setting in enumerate(args.settings):
            out = Path(tmp) / f"{i}.pt"
            load = os.getloadavg()[0]
            cmd = [sys.executable, __file__, "--one", setting, "--length", str(args.length)]
            cmd += ["--repeats", str(args.repeats), "--out", str(out)]
            done = subprocess.run(cmd, capture_output=True, text=True)
            if done.returncode != 0:
                print(f"| {setting} | failed: {done.stderr.strip().splitlines()[-1] if done.stderr else '?'} |")
                continue
            row = json.loads(done.stdout.strip().splitlines()[-1])
            result = torch.load(out)
            if reference is None:
                reference = result
            delta = float((result["loss"] - reference["loss"]).abs().max())
            agree = float((result["top1"] == reference["top1"]).float().mean())
            ppl = math.exp(float(result["loss"].mean()))
            first, best = row["seconds"][0], min(row["seconds"])
            print(
                f"| {setting} | {ppl:.3f} | {row['load_s']:.1f} | {first:.1f}, {best:.1f} | {row['peak_mb']:.0f} "
                f"| {row['rss_before_mb']:.0f} | {load:.1f} | {delta:.2e} | {agree:.4f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
