"""One forward of a real pretrained model over a long text, CPU: which settings make the lab's long runs affordable.

The lab's default extension study runs SmolLM2-135M (8192-token context) at ~12k tokens on 2 cores within minutes,
so one forward's cost decides what it can afford. Each setting computes what the study needs, the next-token loss at
every position (perplexity by position), over the same tokens (Python standard library source, tokenized by the
model's tokenizer), and runs in a fresh process so its peak RSS is its own:

- ``attn``: transformers' ``eager`` attention (materialises the (S, S) scores per head) or ``sdpa``;
- ``dtype`` (the precision split; the first setting is the reference the others are compared with):
  ``float32``; ``bf16weights`` (a float32 model whose weights are rounded to bfloat16: the weights' share of the
  error alone); ``bfloat16`` (weights and every activation; transformers casts its cos/sin tables to bfloat16 and
  rotates in bfloat16); ``bfloat16+rope32`` (bfloat16 weights, RoPE tables and the rotation in float32, q and k
  cast to bfloat16 after it); ``bfloat16+attn32`` (attention scores, softmax and the value sum in float32, from
  bfloat16 q, k, v); ``bfloat16+rope32+attn32`` (both); ``autocast`` (float32 weights, residual stream, norms and
  RoPE; linear layers and attention in bfloat16: ``torch.autocast("cpu", torch.bfloat16)``); ``autocast+attn32``
  (autocast with attention left in float32: only the linear layers in bfloat16); ``int8`` (dynamic int8 ``Linear``
  layers, ``torch.ao.quantization.quantize_dynamic``, the output head kept float32);
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
  python bench/real_model_forward.py --length 4096 --settings precision     # every precision split, sdpa, hidden
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
PRECISIONS = (
    "float32",
    "bf16weights",
    "bfloat16",
    "bfloat16+rope32",
    "bfloat16+attn32",
    "bfloat16+rope32+attn32",
    "autocast",
    "autocast+attn32",
    "int8",
)
ORIGINAL = 8192  # SmolLM2's context: the study's ppl_past scores query positions from here on
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


def _rope_in_float32(model) -> None:
    """RoPE tables and the rotation in float32 whatever the weights' dtype; q and k cast back after the rotation.

    transformers' Llama rotary module casts its float32 cos/sin to the hidden states' dtype, and the attention
    rotates in q's dtype: both replaced here for the process (this script runs one setting per process)."""
    from transformers.models.llama import modeling_llama

    rotary, apply = model.model.rotary_emb, modeling_llama.apply_rotary_pos_emb
    table = rotary.forward
    rotary.forward = lambda x, position_ids: table(x[..., :0].float(), position_ids)  # x gives device and dtype

    def rotate(q, k, cos, sin, unsqueeze_dim=1):  # noqa: ANN001, ANN202
        q32, k32 = apply(q.float(), k.float(), cos.float(), sin.float(), unsqueeze_dim)
        return q32.to(q.dtype), k32.to(k.dtype)

    modeling_llama.apply_rotary_pos_emb = rotate


def _attention_in_float32(attn: str) -> None:
    """Attention scores, softmax and value sum in float32 (autocast off inside), output cast back to v's dtype."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    base = ALL_ATTENTION_FUNCTIONS[attn] if attn != "eager" else None
    if base is None:
        raise SystemExit("attn32 splits need a registered attention function (sdpa), not eager")

    def attention(module, q, k, v, mask, **kwargs):  # noqa: ANN001, ANN202
        mask = mask.float() if mask is not None and mask.is_floating_point() else mask
        with torch.autocast("cpu", enabled=False):
            out, weights = base(module, q.float(), k.float(), v.float(), mask, **kwargs)
        return out.to(v.dtype), weights

    ALL_ATTENTION_FUNCTIONS[attn] = attention


def _int8_linears(model) -> torch.nn.Module:
    """Every ``Linear`` of the transformer body as a dynamic int8 one (weights int8 per tensor, activations
    quantized per call); the output head stays float32."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao.quantization's deprecation notices
        from torch.ao.quantization import quantize_dynamic

        model.model = quantize_dynamic(model.model, {torch.nn.Linear}, dtype=torch.qint8)
    return model


def run_one(setting: str, length: int, repeats: int, out: Path) -> dict:
    """Load the model, warm up, run ``repeats`` forwards of one setting, save its loss, return timings and memory."""
    from posenc.hf import load_causal_lm

    attn, dtype, mode, *grad = setting.split(",")
    grad = grad[0] if grad else "inference"
    base, *parts = dtype.split("+")
    if base not in ("float32", "bf16weights", "bfloat16", "autocast", "int8") or not set(parts) <= {"rope32", "attn32"}:
        raise SystemExit(f"unknown dtype {dtype!r}: one of {', '.join(PRECISIONS)}")
    start = time.perf_counter()
    weights = "bfloat16" if base in ("bfloat16", "bf16weights") else "float32"
    model, tokenizer = load_causal_lm("smollm2", dtype=weights, attn_implementation=attn)
    if base == "bf16weights":
        model = model.float()  # every weight rounded to bfloat16, then computed with in float32
    if base == "int8":
        model = _int8_linears(model)
    if "rope32" in parts:
        _rope_in_float32(model)
    if "attn32" in parts:
        _attention_in_float32(attn)
    load_s = time.perf_counter() - start
    ids = text_ids(tokenizer, length)
    rss_before = _rss_mb()
    grad_mode = torch.inference_mode if grad == "inference" else torch.no_grad

    def context() -> contextlib.ExitStack:
        stack = contextlib.ExitStack()
        stack.enter_context(grad_mode())
        if base == "autocast":
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
    p.add_argument(
        "--settings", nargs="+", default=list(DEFAULT_SETTINGS), help="attn,dtype,mode[,no_grad] each, or 'precision'"
    )
    p.add_argument("--repeats", type=int, default=2, help="timed forwards per setting (first and best reported)")
    p.add_argument("--one", help=argparse.SUPPRESS)  # internal: run one setting in this process
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one:
        print(json.dumps(run_one(args.one, args.length, args.repeats, Path(args.out))))
        return

    settings = [f"sdpa,{d},hidden" for d in PRECISIONS] if args.settings == ["precision"] else args.settings
    caps = torch.cpu.get_capabilities() if hasattr(torch.cpu, "get_capabilities") else {}
    flags = ", ".join(k for k in ("avx512_f", "avx512_bf16", "amx_bf16") if caps.get(k)) or "no AVX-512, no bf16 units"
    print(
        f"# SmolLM2-135M, one forward of {args.length} tokens, {datetime.date.today()}, "
        f"{caps.get('cpu_name') or platform.processor() or platform.machine()} ({flags}), "
        f"{torch.get_num_threads()} threads, torch {torch.__version__}"
    )
    print(
        "| setting | ppl | Δppl % | Δppl % past 8192 | forward s (first, best) | × first row | |Δloss| mean | p99 "
        "| max | mean, last quarter | top-1 same | peak RSS MiB | load |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    reference = None
    with tempfile.TemporaryDirectory() as tmp:
        for i, setting in enumerate(settings):
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
                reference = {**result, "best": min(row["seconds"])}
            delta = (result["loss"] - reference["loss"]).abs().double()  # (S - 1,) per-position |Δ loss|
            tail = delta[-(delta.numel() // 4) :]
            agree = float((result["top1"] == reference["top1"]).float().mean())
            ppl, ppl_ref = (
                math.exp(float(result["loss"].double().mean())),
                math.exp(float(reference["loss"].double().mean())),
            )
            past = "n/a"  # the study's ppl_past: targets predicted at query positions >= SmolLM2's 8192
            if result["loss"].numel() > ORIGINAL:
                shift = float(result["loss"][ORIGINAL:].double().mean() - reference["loss"][ORIGINAL:].double().mean())
                past = f"{100 * math.expm1(shift):+.3f}"
            first, best = row["seconds"][0], min(row["seconds"])
            print(
                f"| {setting} | {ppl:.3f} | {100 * (ppl / ppl_ref - 1):+.3f} | {past} | {first:.1f}, {best:.1f} "
                f"| {best / reference['best']:.2f} | {float(delta.mean()):.4f} | {float(delta.quantile(0.99)):.3f} "
                f"| {float(delta.max()):.3f} | {float(tail.mean()):.4f} | {agree:.4f} | {row['peak_mb']:.0f} "
                f"| {load:.1f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
