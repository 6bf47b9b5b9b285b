"""Causal attention on CPU at one SmolLM2 layer's shape: torch's SDPA (the flash kernel a 16k needle spends 80% of its
time in) against the two alternatives a user could reach for without writing a kernel, each as a ratio to SDPA in the
same dtype, measured in one run on one machine.

    python bench/cpu_causal_attention.py --length 8192 --heads 9 --dim 64

- ``sdpa``: ``scaled_dot_product_attention(..., is_causal=True)`` (tiles above the diagonal skipped).
- ``flex``: ``torch.compile(flex_attention)`` with a causal block mask (inductor's CPU template; compiled first, the
  compile time printed apart).
- ``blocked``: query blocks of ``--block`` rows, each a GEMM against the keys up to its end, the diagonal block
  masked, softmax in float32, then a GEMM with the values: the attention torch's own matrix multiply gives (in
  bfloat16 the scores are rounded to bfloat16 as transformers' eager attention rounds them).

Each is called once to warm up, then timed ``--repeat`` times (the median printed); the largest difference from a
float64 SDPA of the same inputs is printed beside it.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import torch
import torch.nn.functional as F


def blocked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block: int) -> torch.Tensor:
    """Causal attention by query blocks, each a GEMM (Shapes: q, k, v (B, H, L, D) -> (B, H, L, D))."""
    length = q.shape[-2]
    out = torch.empty_like(q)
    scale = q.shape[-1] ** -0.5
    for start in range(0, length, block):
        end = min(start + block, length)
        scores = torch.matmul(q[..., start:end, :] * scale, k[..., :end, :].transpose(-1, -2)).float()
        above = torch.ones(end - start, end - start, dtype=torch.bool).triu(1)
        scores[..., start:end].masked_fill_(above, float("-inf"))
        out[..., start:end, :] = torch.matmul(torch.softmax(scores, -1).to(q.dtype), v[..., :end, :])
    return out


def timed(fn, repeat: int) -> float:  # noqa: ANN001
    fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--length", type=int, default=8192)
    parser.add_argument("--heads", type=int, default=9)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--block", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    print(f"{platform.processor() or platform.machine()}, torch {torch.__version__}, {torch.get_num_threads()} threads,"
          f" 1 x {args.heads} heads x {args.length} x {args.dim}")
    mask = create_block_mask(lambda b, h, qi, ki: qi >= ki, None, None, args.length, args.length, device="cpu")
    print("| dtype | method | seconds | / sdpa | max abs diff vs float64 |")
    print("|---|---|---:|---:|---:|")
    for dtype in (torch.bfloat16, torch.float32):
        gen = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(1, args.heads, args.length, args.dim, generator=gen).to(dtype) for _ in range(3))
        exact = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=True)
        compiled = torch.compile(flex_attention)
        start = time.perf_counter()
        compiled(q, k, v, block_mask=mask)
        print(f"(flex compile, {str(dtype)[6:]}: {time.perf_counter() - start:.1f} s)")
        runs = {
            "sdpa": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True),  # noqa: B023
            "flex": lambda: compiled(q, k, v, block_mask=mask),  # noqa: B023
            "blocked": lambda: blocked(q, k, v, args.block),  # noqa: B023
        }
        base = None
        for name, fn in runs.items():
            seconds = timed(fn, args.repeat)
            base = base or seconds
            diff = (fn().double() - exact).abs().max().item()
            print(f"| {str(dtype)[6:]} | {name} | {seconds:.3f} | {seconds / base:.2f} | {diff:.1e} |")


if __name__ == "__main__":
    main()
