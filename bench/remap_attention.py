"""Remapped attention against plain causal SDPA: time ratio and peak memory, per method and length.

    python bench/remap_attention.py [--lengths 4096 8192 16384] [--repeats 3] [--methods self_extend dca ...]
                                    [--dtype float32|bfloat16] [--threads N] [--clock wall|cpu]

Shapes are SmolLM2-135M's attention (B=1, 9 query heads, 3 key/value heads, head_dim 64, inference) in ``--dtype``;
with bfloat16, ``plain`` is SDPA in bfloat16 (what a bf16 model's frequency methods run), ``remap`` runs its spans in
bfloat16 (``span_dtype``, what a patched bf16 model runs) and the last columns the same call with float32 spans. Each
method takes its paper's parameters for a 2x extension (``original = length / 2``; STRING, which reaches less than
2x, for the training length itself, where its paper runs it: ``original = length``). Both sides include the RoPE
rotation: ``plain`` is ``posenc.attention`` with RoPE (rotation + ``torch.nn.functional.scaled_dot_product_attention``
causal, the fused kernel), ``remap`` is ``posenc.remapping.remap_attention`` (rotation per branch, branches merged).
Every (method, length) runs in a fresh process: a warm-up call, then the median of ``--repeats`` calls, and the
peak resident memory of one call above what the process held just before it (``VmHWM`` reset through
``/proc/self/clear_refs``). On CUDA (when there is a GPU) the same, with ``torch.cuda.max_memory_allocated``.
``--clock cpu`` times the process's CPU time (``time.process_time``) instead of the wall clock: on a machine shared
with other jobs, and with ``--threads 1``, it counts the work of a call and not the time it waited for a core (with
more threads it would also count their spinning at each parallel region).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

import posenc
from posenc.remapping import METHODS, WITHIN_TRAINING, remap_attention, remap_method

B, H, HKV, D, BASE = 1, 9, 3, 64, 1e5


def _rss_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field):
            return int(line.split()[1])
    raise RuntimeError(field)


def spec_for(method: str, length: int):  # noqa: ANN201
    """The method's paper parameters for ``length`` tokens: a 2x extension, or the training length (STRING)."""
    original = length if method in WITHIN_TRAINING else length // 2
    return remap_method(method, original=original, target=length)


def measure_one(
    method: str,
    length: int,
    repeats: int,
    device: str,
    dtype: str = "float32",
    spans: str = "",
    threads: int = 0,
    clock: str = "wall",
) -> dict:
    """In a child process: warm-up, median time, and peak memory of one call above the inputs. ``spans``: the
    remapped spans' dtype (default: the inputs' for half inputs, as a patched model runs them); ``threads``: torch's
    intra-op threads (0: its default); ``clock``: ``wall`` or ``cpu`` (the process's CPU time)."""
    if threads:
        torch.set_num_threads(threads)
    timer = time.process_time if clock == "cpu" else time.perf_counter
    gen = torch.Generator().manual_seed(0)
    dt = getattr(torch, dtype)
    span_dtype = getattr(torch, spans) if spans else (dt if dt in (torch.bfloat16, torch.float16) else None)
    q = torch.randn(B, H, length, D, generator=gen).to(device, dt)
    k, v = (torch.randn(B, HKV, length, D, generator=gen).to(device, dt) for _ in range(2))
    enc = posenc.build("rope", head_dim=D, base=BASE).to(device)
    if method == "plain":

        def call():  # noqa: ANN202
            return posenc.attention(q, k, v, encoding=enc)
    else:
        spec = spec_for(method, length)

        def call():  # noqa: ANN202
            return remap_attention(q, k, v, method=spec, encoding=enc, span_dtype=span_dtype)

    cuda = device.startswith("cuda")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    with torch.inference_mode():
        call()
        sync()
        samples = []
        for _ in range(repeats):
            start = timer()
            call()
            sync()
            samples.append(timer() - start)
        if cuda:
            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated()
            out = call()
            sync()
            extra = (torch.cuda.max_memory_allocated() - before) / 2**20
        else:
            before = _rss_kb("VmRSS")
            Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current RSS
            out = call()  # kept alive until the peak is read: the output counts
            extra = (_rss_kb("VmHWM") - before) / 1024
        del out
    return {"method": method, "length": length, "seconds": statistics.median(samples), "extra_mib": extra}


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "one":
        method, length, repeats, device, dtype, spans, threads, clock = sys.argv[2:10]
        print(json.dumps(measure_one(method, int(length), int(repeats), device, dtype, spans, int(threads), clock)))
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", default=[4096, 8192, 16384])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--threads", type=int, default=0, help="torch threads in each child (0: torch's default)")
    parser.add_argument("--clock", default="wall", choices=["wall", "cpu"])
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)  # the header reports the children's count
    half = args.dtype != "float32"
    where = torch.cuda.get_device_name() if args.device.startswith("cuda") else platform.processor() or "cpu"
    print(
        f"# remapped vs plain causal attention, B={B} H={H} Hkv={HKV} D={D} {args.dtype}, inference, median of"
        f" {args.repeats} ({args.clock} clock); torch {torch.__version__}, {torch.get_num_threads()} threads, {where}"
    )
    extra = " float32 spans s | / plain |" if half else ""
    print(f"| method | branches | L | time s | plain s | time / plain | peak MiB | plain MiB |{extra}")
    print("|---|---:|---:|---:|---:|---:|---:|---:|" + ("---:|---:|" if half else ""))
    run = (args.repeats, args.device, args.dtype)
    timing = (args.threads, args.clock)
    for length in args.lengths:
        plain = _child("plain", length, *run, "", *timing)
        for method in args.methods:
            row = _child(method, length, *run, "", *timing)
            n = len(spec_for(method, length).branches())
            line = (
                f"| {method} | {n} | {length} | {row['seconds']:.3f} | {plain['seconds']:.3f} |"
                f" {row['seconds'] / plain['seconds']:.2f} | {row['extra_mib']:.0f} | {plain['extra_mib']:.0f} |"
            )
            if half:
                f32 = _child(method, length, *run, "float32", *timing)
                line += f" {f32['seconds']:.3f} | {f32['seconds'] / plain['seconds']:.2f} |"
            print(line, flush=True)


def _child(
    method: str, length: int, repeats: int, device: str, dtype: str, spans: str, threads: int, clock: str
) -> dict:
    cmd = [sys.executable, __file__, "one", method, str(length), str(repeats), device, dtype, spans]
    cmd += [str(threads), clock]
    return json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)


if __name__ == "__main__":
    main()
