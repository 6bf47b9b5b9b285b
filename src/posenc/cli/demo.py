"""``posenc demo``: what the RoPE scalings compute, checked live on this machine."""

from __future__ import annotations

import argparse
import math
import time

from posenc import _argtypes as A
from posenc.cli.parsing import Subparsers


def _demo_scalings(head_dim: int, base: float, trained: int, factor: float) -> dict[str, dict]:
    """The lab's ``rope_scaling`` dict per method, plus no scaling and a LongRoPE with a linear ramp of factors."""
    from posenc.lab.common.scaling import rope_scaling

    long_factor = [1.0 + (factor - 1.0) * i / (head_dim // 2 - 1) for i in range(head_dim // 2)]
    scalings: dict[str, dict] = {"default": {}}
    for method in ("linear", "ntk", "dynamic", "yarn"):
        scalings[method] = rope_scaling(method, factor=factor, original_len=trained)
    scalings["longrope"] = {
        "rope_type": "longrope",
        "short_factor": [1.0] * (head_dim // 2),
        "long_factor": long_factor,
        "original_max_position_embeddings": trained,
        "factor": factor,
    }
    scalings["llama3"] = rope_scaling("llama3", factor=factor, original_len=trained)
    return scalings


def run(args: argparse.Namespace) -> int:
    import torch

    import posenc

    head_dim, base, trained, factor = args.head_dim, args.base, args.trained_length, args.factor
    target = int(trained * factor)
    print(f"posenc {posenc.__version__} on torch {torch.__version__} ({torch.get_num_threads()} threads)\n")
    print(f"RoPE for head_dim={head_dim}, base={base:g}, trained on {trained} tokens, extended {factor:g}x to {target}")
    print("Wavelength = tokens per full turn of a channel pair; extension methods stretch the long ones.\n")
    print(f"{'rope_type':<10} {'attn factor':>11} {'shortest λ':>11} {'longest λ':>13} {'pairs scaled':>13}")
    plain, _ = posenc.rope_frequencies(head_dim, base=base)
    for name, scaling in _demo_scalings(head_dim, base, trained, factor).items():
        inv_freq, attention_factor = posenc.rope_frequencies(head_dim, base=base, scaling=scaling, seq_len=target)
        wavelength = 2 * math.pi / inv_freq
        scaled = int((~torch.isclose(inv_freq, plain, rtol=1e-6)).sum())
        print(
            f"{name:<10} {attention_factor:>11.4f} {wavelength.min():>11.1f} {wavelength.max():>13.4g}"
            f" {scaled:>7}/{head_dim // 2}"
        )

    print("\nChecks (float32, this machine):")
    q, k = torch.randn(1, 8, 256, head_dim), torch.randn(1, 8, 256, head_dim)
    rope = posenc.RotaryEmbedding(head_dim, base=base)
    near = torch.einsum("bhsd,bhtd->bhst", *rope(q, k, torch.arange(256)))
    far = torch.einsum("bhsd,bhtd->bhst", *rope(q, k, torch.arange(256) + 100_000))
    print(f"  q·k depends only on distance: max |Δ| after shifting 100k positions = {(near - far).abs().max():.2e}")
    half = posenc.RotaryEmbedding(head_dim, base=base)(q, k, torch.arange(256))[0]
    print(f"  rotation keeps norms: max |‖Rq‖ - ‖q‖| = {(half.norm(dim=-1) - q.norm(dim=-1)).abs().max():.2e}")
    big_q, big_k = torch.randn(1, 32, 4096, 128), torch.randn(1, 32, 4096, 128)
    big, positions = posenc.RotaryEmbedding(128), torch.arange(4096)
    rope_s = _best_of(5, lambda: big(big_q, big_k, positions))
    copy_s = _best_of(5, lambda: (big_q.clone(), big_k.clone()))
    print(
        f"  RoPE on q, k (1, 32, 4096, 128) float32: {1e3 * rope_s:.1f} ms = {rope_s / copy_s:.2f}x the time of "
        "copying them (best of 5; bench/rope_cpu.py measures carefully)"
    )
    print("\nNext: python -m pytest (the reference tests against Hugging Face transformers).")
    return 0


def _best_of(n: int, fn) -> float:
    fn()
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def add(sub: Subparsers) -> None:
    p = sub.add_parser("demo", help="print what each RoPE scaling does, with live checks")
    p.add_argument("--head-dim", type=A.even_head_dim, default=128, help="rotary head dimension (even)")
    p.add_argument("--base", type=A.above_one, default=500000.0, help="RoPE base (Llama 3: 500000)")
    p.add_argument("--trained-length", type=A.context_length, default=8192, help="original context length in tokens")
    p.add_argument("--factor", type=A.at_least_one, default=4.0, help="context extension factor")
    p.set_defaults(func=run)
