"""RoPE on q and k, CPU: posenc vs copying the same bytes vs Hugging Face transformers' eager path.

Prints the best of ``--repeats`` torch.utils.benchmark runs (a shared machine only ever adds time) and ratios
measured in this one run. "× clone" is the median, over the repeats, of the case's time over a clone of q and k
timed right after it: how many pages the OS must fault in for fresh outputs drifts during a run (glibc's mmap
threshold, free huge pages), and a clone timed next to each case pays the same. ``posenc`` rows run what users
get (``posenc.kernels.cpu``: the C kernel where it built); ``blocked`` rows the blocked torch path used without a
C compiler; ``eager`` rows the plain torch ops. Not a test: numbers depend on the machine.
Usage: python bench/rope_cpu.py [--seq 4096] [--heads 32] [--kv-heads 8] [--head-dim 128] [--threads N] [--repeats 5]
(``--kv-heads`` defaults to ``--heads``: k as big as q, as in the figures before 2026-11-27; Llama-3-8B has 8.)
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
from functools import partial

import torch

import posenc
from posenc import kernels
from posenc.kernels import cpu
from posenc.lab.bench import cpu_kernel_name, paired_ms, settle_allocator, warm_timer

REPEATS = 5


def median_ms(fn, min_run_time: float) -> float:
    """Best over ``REPEATS`` runs of the median of one ``blocked_autorange``, in ms, on all of torch's threads."""
    timer = warm_timer(fn)
    return min(timer.blocked_autorange(min_run_time=min_run_time / REPEATS).median for _ in range(REPEATS)) * 1e3


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=None, help="heads of k (default: --heads)")
    p.add_argument("--seq", type=int, default=4096)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--min-run-time", type=float, default=2.0)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--posenc-only", action="store_true", help="skip the blocked and eager torch-path rows (shorter)")
    args = p.parse_args()
    global REPEATS
    REPEATS = args.repeats
    if args.threads:
        torch.set_num_threads(args.threads)
    shape = (args.batch, args.heads, args.seq, args.head_dim)
    if args.kv_heads is not None and not (0 < args.kv_heads <= args.heads and args.heads % args.kv_heads == 0):
        p.error(f"--kv-heads {args.kv_heads}: expected a divisor of --heads ({args.heads})")
    k_shape = (args.batch, args.heads if args.kv_heads is None else args.kv_heads, args.seq, args.head_dim)
    print(
        f"# RoPE on q {shape} and k {k_shape}, {datetime.date.today()}, {platform.processor() or platform.machine()}, "
        f"{torch.get_num_threads()} threads, torch {torch.__version__}, {cpu_kernel_name()}, "
        f"load average {' '.join(f'{v:.2f}' for v in os.getloadavg())}"
    )
    settle_allocator()
    rows = []
    for dtype in (torch.float32, torch.bfloat16):
        rows += measure(dtype, shape, k_shape, args.min_run_time, torch_paths=not args.posenc_only)
    print("| dtype | method | best median ms | × clone | HF eager ÷ this |")
    print("|---|---|---:|---:|---:|")
    for dtype, name, ms, vs_copy, speedup in rows:
        print(f"| {dtype} | {name} | {ms:.1f} | {vs_copy:.2f} | {speedup:.2f} |")


def measure(
    dtype: torch.dtype,
    shape: tuple[int, ...],
    k_shape: tuple[int, ...],
    min_run_time: float,
    *,
    torch_paths: bool = True,
) -> list[tuple]:
    q, k = torch.randn(shape, dtype=dtype), torch.randn(k_shape, dtype=dtype)
    positions = torch.arange(shape[2])
    head_dim = shape[3]
    clone = lambda: (q.clone(), k.clone())  # noqa: E731
    copy = median_ms(clone, min_run_time)
    cases = {}
    batched = torch.stack([positions, positions.flip(0)])  # (2, S) per-token positions
    q2, k2 = q.view(2 * q.shape[0], -1, *q.shape[2:]), k.view(2 * k.shape[0], -1, *k.shape[2:])  # (2B, H/2, S, D)
    for layout in ("half", "interleaved"):
        rope = posenc.RotaryEmbedding(head_dim, layout=layout)
        cos, sin = rope.cos_sin(positions)
        cases[f"posenc {layout}"] = partial(rope, q, k, positions)
        cases[f"posenc {layout}, cos/sin given"] = partial(_apply_both, q, k, cos, sin, layout)
        if torch_paths:
            cases[f"blocked {layout}, cos/sin given"] = partial(_without, "use_native", q, k, cos, sin, layout)
            cases[f"eager {layout}, cos/sin given"] = partial(_without, "use_cpu", q, k, cos, sin, layout)
        cases[f"posenc {layout}, in place, cos/sin given"] = partial(_inplace_both, q, k, cos, sin, layout)
    half = posenc.RotaryEmbedding(head_dim, partial_rotary_factor=0.5)
    cases["posenc half, partial 0.5"] = partial(half, q, k, positions)
    cases["posenc half, (B, S) positions, q k as (2, H/2, S, D)"] = partial(
        posenc.RotaryEmbedding(head_dim), q2, k2, batched.expand(q2.shape[0] // 2, -1, -1).reshape(q2.shape[0], -1)
    )
    hf = _hf_eager(head_dim, q, k, positions)
    hf_ms = median_ms(hf, min_run_time) if hf else float("nan")
    name = str(dtype).removeprefix("torch.")
    rows = []
    for label, fn in cases.items():
        ms, _, vs_clone = paired_ms(fn, clone, min_run_time, rounds=REPEATS)
        rows.append((name, label, ms, vs_clone, hf_ms / ms))
    rows.append((name, "clone q, k (memory-bound floor)", copy, 1.0, hf_ms / copy))
    rows.append((name, "HF transformers eager (Llama)", hf_ms, hf_ms / copy, 1.0))
    return rows


def _apply_both(q, k, cos, sin, layout):
    return posenc.apply_rotary(q, cos, sin, layout=layout), posenc.apply_rotary(k, cos, sin, layout=layout)


def _without(switch, q, k, cos, sin, layout):
    """``_apply_both`` with ``posenc.kernels.<switch>`` off: ``use_native`` (blocked path), ``use_cpu`` (eager)."""
    setattr(kernels, switch, False)
    try:
        return _apply_both(q, k, cos, sin, layout)
    finally:
        setattr(kernels, switch, True)


def _inplace_both(q, k, cos, sin, layout):
    """Rotates q and k in place (repeatedly: timing only, the values drift)."""
    return cpu.rotary_(q, cos, sin, layout=layout), cpu.rotary_(k, cos, sin, layout=layout)


def _hf_eager(head_dim, q, k, positions):
    """LlamaRotaryEmbedding + apply_rotary_pos_emb, as a Llama layer runs them (cos/sin from positions each call)."""
    try:
        from transformers import LlamaConfig
        from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb
    except ImportError:
        return None
    config = LlamaConfig(
        hidden_size=head_dim * q.shape[1],
        num_attention_heads=q.shape[1],
        num_key_value_heads=k.shape[1],
        head_dim=head_dim,
    )
    rotary, position_ids = LlamaRotaryEmbedding(config), positions[None]

    def run():
        cos, sin = rotary(q, position_ids)
        return apply_rotary_pos_emb(q, k, cos, sin)

    return run


if __name__ == "__main__":
    main()
