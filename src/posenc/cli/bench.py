"""``posenc bench``: RoPE and bias-attention speed (``posenc.lab.bench``)."""

from __future__ import annotations

import argparse
from pathlib import Path

from posenc import _argtypes as A
from posenc.cli.parsing import Subparsers, given


def run(args: argparse.Namespace) -> int:
    from posenc._devices import resolve_device
    from posenc.lab import bench as b
    from posenc.lab.common.runfiles import check_out, write_marker

    device = resolve_device(args.device, allow_auto=True)
    if args.quick:
        cases = b.rotary_cases((1024, 4096), (128,), ("float32",), b.LAYOUTS)
    else:
        cases = b.rotary_cases(args.lengths, args.head_dims, args.dtypes, args.layouts)
    attention_lengths = given(args.attention_lengths, (8192,) if device.startswith("cuda") else (2048,))
    for name in args.attention_encodings:
        b.check_choice("attention_encodings", name, b.BIAS_ENCODINGS)
    if args.out is not None:
        check_out(args.out, "bench")  # before minutes of timing, not after
    header = b.header(device)
    print(header)
    b.settle_allocator()
    rotary, attention = [], []
    if not args.no_rotary:
        for case in cases:
            rotary.append(
                b.run_rotary_case(case, device=device, min_run_time=args.min_run_time, compile_hf=args.compile)
            )
        b.print_rows(rotary, b.ROTARY_COLUMNS, "RoPE on q and k (vs X = X's time / posenc's time)")
    if not args.no_attention:
        for name in args.attention_encodings:
            for n in attention_lengths:
                attention.append(
                    b.run_attention_case(name, n, device=device, dtype="bfloat16", min_run_time=args.min_run_time)
                )
        b.print_rows(attention, b.ATTENTION_COLUMNS, "Bias attention, inference (B=1, H=8, D=64)")
    if args.out is not None:
        check_out(args.out, "bench")
        write_marker(args.out, "bench", {"device": device})
        for path in b.write_outputs(Path(args.out), rotary, attention, header):
            print(path)
    return 0


def add(sub: Subparsers) -> None:
    p = sub.add_parser("bench", help="RoPE and bias-attention speed vs a copy, transformers, Liger, flash-attn")
    p.add_argument("--device", default="auto", help="auto (CUDA when present), cpu, cuda, cuda:<index> or mps")
    p.add_argument(
        "--lengths", type=A.positive_ints, default=(1024, 2048, 4096, 8192, 16384), help="sequence lengths timed"
    )
    p.add_argument(
        "--head-dims",
        type=A.positive_ints,
        default=(64, 128, 256),
        help="128 at every length, others at the middle one",
    )
    p.add_argument("--dtypes", type=A.names, default=("float32", "bfloat16"), help="comma-separated dtypes")
    p.add_argument("--layouts", type=A.names, default=("half", "interleaved"), help="comma-separated RoPE layouts")
    p.add_argument(
        "--attention-encodings", type=A.names, default=("alibi", "alibi_2d", "t5"), help="comma-separated encodings"
    )
    p.add_argument("--attention-lengths", type=A.positive_ints, help="default 8192 on CUDA, 2048 on CPU")
    p.add_argument("--min-run-time", type=A.positive_float, default=0.5, help="seconds of timing per measurement")
    p.add_argument("--compile", action="store_true", help="also time torch.compile of transformers' eager RoPE")
    p.add_argument("--quick", action="store_true", help="a small subset: head dim 128, float32, 1k and 4k tokens")
    p.add_argument("--no-rotary", action="store_true", help="skip the RoPE table")
    p.add_argument("--no-attention", action="store_true", help="skip the bias-attention table")
    p.add_argument(
        "--out", help="also write rotary.csv, attention.csv and bench.md into this new, empty or earlier bench folder"
    )
    p.set_defaults(func=run)
