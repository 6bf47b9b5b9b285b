"""Bias attention without an L x L matrix: peak memory and speed of ``flex`` vs ``sdpa`` with a materialised bias.

    python bench/flex_attention.py memory [--lengths 1024 2048 ... 32768] [--sdpa-max 8192]
    python bench/flex_attention.py speed [--length 2048]

``memory`` runs every (encoding, backend, length) in a fresh process: one warm-up call (compilation included),
then the peak resident memory of a second call, measured from the kernel's high-water mark (``VmHWM``, reset via
``/proc/self/clear_refs``) and reported above the memory held just before the call (q, k, v, positions). The
materialised bias alone needs ``H * L^2 * 4`` bytes; SDPA also materialises the weights. Inference, B=1, H=8,
D=64, float32; ALiBi and T5 causal, 2-D ALiBi over a patch grid, bidirectional.

``speed`` times both backends in one process (median of repeated calls after warm-up) and prints the ratio.
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
from posenc.functional.axial_rope import grid_positions

B, H, D = 1, 8, 64
ENCODINGS = {"alibi": True, "t5": True, "alibi_2d": False}  # name -> causal


def setup(name: str, length: int):
    enc = (
        posenc.build(name, num_heads=H, head_dim=D, bidirectional=False)
        if name == "t5"
        else posenc.build(name, num_heads=H, head_dim=D)
    )
    if enc.position_kind == "grid":
        width = 1 << ((length.bit_length() - 1 + 1) // 2)  # a near-square power-of-two grid of `length` patches
        pos = grid_positions(width, length // width)
    else:
        pos = torch.arange(length)
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, H, length, D, generator=gen) for _ in range(3))
    return enc, pos, (q, k, v)


def _rss_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field):
            return int(line.split()[1])
    raise RuntimeError(field)


def measure_one(name: str, length: int, backend: str) -> dict:
    """Runs in a child process: warm-up, reset the high-water mark, measure one call."""
    enc, pos, (q, k, v) = setup(name, length)
    kw = {"encoding": enc, "q_positions": pos, "causal": ENCODINGS[name], "backend": backend}
    with torch.no_grad():
        posenc.attention(q, k, v, **kw)  # warm-up: compiles flex for this shape
        before = _rss_kb("VmRSS")
        Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current RSS
        start = time.perf_counter()
        out = posenc.attention(q, k, v, **kw)  # kept alive until the peak is read: the output counts
        seconds = time.perf_counter() - start
        peak = _rss_kb("VmHWM")
        del out
    return {
        "encoding": name,
        "backend": backend,
        "length": length,
        "extra_mib": (peak - before) / 1024,
        "seconds": seconds,
    }


def memory(lengths: list[int], sdpa_max: int) -> None:
    print(f"# peak memory above the inputs, inference, B={B} H={H} D={D} float32 ({platform.processor() or 'cpu'})")
    print("| encoding | L | flex MiB | flex s | sdpa MiB | sdpa s | bias H·L²·4 MiB |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name in ENCODINGS:
        for length in lengths:
            row = {}
            for backend in ("flex", "sdpa"):
                if backend == "sdpa" and length > sdpa_max:
                    continue
                cmd = [sys.executable, __file__, "one", name, str(length), backend]
                row[backend] = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
            bias_mib = H * length**2 * 4 / 2**20
            sd = row.get("sdpa")
            sdpa_cols = f"{sd['extra_mib']:.0f} | {sd['seconds']:.2f}" if sd else "— | —"
            fl = row["flex"]
            print(
                f"| {name} | {length} | {fl['extra_mib']:.0f} | {fl['seconds']:.2f} | {sdpa_cols} | {bias_mib:.0f} |",
                flush=True,
            )


def speed(length: int, repeats: int) -> None:
    print(f"# inference time, L={length}, B={B} H={H} D={D} float32, median of {repeats}; torch {torch.__version__}")
    print("| encoding | flex ms | sdpa (materialised bias) ms | sdpa / flex |")
    print("|---|---:|---:|---:|")
    for name in ENCODINGS:
        enc, pos, (q, k, v) = setup(name, length)
        times = {}
        for backend in ("flex", "sdpa"):
            kw = {"encoding": enc, "q_positions": pos, "causal": ENCODINGS[name], "backend": backend}
            with torch.no_grad():
                posenc.attention(q, k, v, **kw)  # warm-up (compiles flex)
                samples = []
                for _ in range(repeats):
                    start = time.perf_counter()
                    posenc.attention(q, k, v, **kw)
                    samples.append(time.perf_counter() - start)
            times[backend] = statistics.median(samples)
        ratio = times["sdpa"] / times["flex"]
        print(f"| {name} | {times['flex'] * 1e3:.1f} | {times['sdpa'] * 1e3:.1f} | {ratio:.2f} |", flush=True)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "one":
        print(json.dumps(measure_one(sys.argv[2], int(sys.argv[3]), sys.argv[4])))
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="mode", required=True)
    m = sub.add_parser("memory")
    m.add_argument("--lengths", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384, 32768])
    m.add_argument("--sdpa-max", type=int, default=8192)
    s = sub.add_parser("speed")
    s.add_argument("--length", type=int, default=2048)
    s.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    if args.mode == "memory":
        memory(args.lengths, args.sdpa_max)
    else:
        speed(args.length, args.repeats)


if __name__ == "__main__":
    main()
