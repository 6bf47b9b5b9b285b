"""Sliding-window attention on CPU or CUDA: what ``posenc.attention(window=W)`` costs on each backend, as a ratio to
full causal attention (torch's flash kernel, ``is_causal=True``) on the same inputs, measured in one run on one
machine.

    python bench/window_attention.py --lengths 8192 16384 --windows 128 4096 --dtypes float32 bfloat16
    python bench/window_attention.py --device cuda --lengths 16384 65536 --sdpa-max 16384

- ``full causal``: ``scaled_dot_product_attention(..., is_causal=True)``, no window: what a model without one computes.
- ``flex``: ``posenc.attention(window=W, backend="flex")``: compiled FlexAttention with a block mask built from
  128-token tiles, so only tiles that meet the window run (compiled first; the compile time printed apart).
- ``sdpa``: ``posenc.attention(window=W, backend="sdpa")``: a dense ``(L, L)`` boolean window mask handed to SDPA,
  as transformers' Mistral does with its sdpa attention (memory and time of the whole square).

A window keeps ``kept = sum_i min(i + 1, W)`` query-key pairs of the causal ``L (L + 1) / 2``; ``kept / causal`` is
the share of the work a kernel that skips everything outside the window could do. Each call is made once to warm up,
then timed ``--repeat`` times (the median printed). Accuracy: the last ``--check`` queries of each output against
``posenc.attention``'s eager backend in float64 on the same inputs (the largest absolute difference).
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import torch
import torch.nn.functional as F

import posenc


def timed(fn, repeat: int) -> tuple[float, float]:  # noqa: ANN001
    """(seconds of the first call, median seconds of ``repeat`` more), waiting for CUDA's queue around each."""

    def once() -> float:
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        return time.perf_counter() - start

    first = once()
    return first, statistics.median(once() for _ in range(repeat))


def kept_share(length: int, window: int) -> float:
    """Pairs a causal window of ``window`` keys keeps, over the causal pairs ``L (L + 1) / 2``."""
    kept = sum(min(i + 1, window) for i in range(length))
    return kept / (length * (length + 1) / 2)


def max_error(out: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int, rows: int) -> float:
    """Largest difference of ``out``'s last ``rows`` queries from the float64 eager window attention."""
    length = q.shape[-2]
    with torch.no_grad():
        ref = posenc.attention(
            q[..., -rows:, :].double(),
            k.double(),
            v.double(),
            q_positions=torch.arange(length - rows, length, device=q.device),
            k_positions=torch.arange(length, device=q.device),
            window=window,
            backend="eager",
        )
    return (out[..., -rows:, :].double() - ref).abs().max().item()


def row(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int, full: float, args: argparse.Namespace) -> str:
    """One table row: flex and sdpa with ``window`` on ``q, k, v``, their times over ``full`` and their errors."""
    length = q.shape[-2]
    pos = torch.arange(length, device=q.device)
    out = {}

    def run(backend: str) -> None:
        out[backend] = posenc.attention(q, k, v, q_positions=pos, window=window, backend=backend)

    compile_s, flex = timed(lambda: run("flex"), args.repeat)
    flex_err = max_error(out["flex"], q, k, v, window, args.check)
    sdpa_cells = "- | - | -"
    if length <= args.sdpa_max:
        _, sdpa = timed(lambda: run("sdpa"), args.repeat)
        sdpa_cells = f"{sdpa:.3f} | {sdpa / full:.2f} | {max_error(out['sdpa'], q, k, v, window, args.check):.1e}"
    dtype = str(q.dtype).removeprefix("torch.")
    return (
        f"| {dtype} | {length} | {window} | {kept_share(length, window):.3f} | {full:.3f} | "
        f"{flex:.3f} ({compile_s:.1f}) | {flex / full:.2f} | {flex_err:.1e} | {sdpa_cells} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[8192, 16384])
    parser.add_argument("--windows", type=int, nargs="+", default=[128, 4096])
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"], choices=["float32", "bfloat16"])
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--check", type=int, default=256, help="queries checked against float64 eager")
    parser.add_argument("--sdpa-max", type=int, default=16384, help="longest length for the dense-mask sdpa")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch sees no CUDA device")

    machine = torch.cuda.get_device_name() if args.device == "cuda" else platform.processor() or platform.machine()
    print(f"# {machine}, torch {torch.__version__}, {torch.get_num_threads()} threads")
    print("| dtype | L | W | kept / causal | full causal s | flex s (compile s) | flex / full | flex err | sdpa s |"
          " sdpa / full | sdpa err |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for dtype_name in args.dtypes:
        for length in args.lengths:
            gen = torch.Generator().manual_seed(0)
            shape = (1, args.heads, length, args.dim)
            q, k, v = (torch.randn(shape, generator=gen).to(args.device, getattr(torch, dtype_name)) for _ in range(3))
            with torch.no_grad():
                _, full = timed(lambda q=q, k=k, v=v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
                                args.repeat)
                for window in args.windows:
                    print(row(q, k, v, window, full, args), flush=True)


if __name__ == "__main__":
    main()
