"""The remapped operator of this checkout against another's, alternating in fresh processes cell by cell.

    git worktree add /tmp/old REV
    python bench/remap_ab.py /tmp/old/src [--lengths 8192 16384] [--rounds 3 1] [--methods self_extend ...]

Each (length, method) cell runs ``bench/remap_attention.py``'s child (``one METHOD L REPEATS cpu DTYPE "" THREADS
wall``) with this checkout's ``src`` and then with the other's, ``--rounds`` times per length, plain attention among
the methods; it prints each time as it comes, then the medians as ratios: new / plain, old / plain (each against
the plain attention timed with its own ``src``) and new / old. Alternating cell by cell keeps a drift of the
machine's speed out of the new / old ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
METHODS = ["self_extend", "dca", "rerope", "leaky_rerope", "lm_infinite", "string"]


def time_one(src: Path, method: str, length: int, repeats: int, dtype: str, threads: int) -> float:
    env = dict(os.environ, PYTHONPATH=str(src))
    argv = [sys.executable, str(HERE / "remap_attention.py"), "one", method, str(length), str(repeats), "cpu", dtype,
            "", str(threads), "wall"]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, check=True)
    return float(json.loads(done.stdout.strip().splitlines()[-1])["seconds"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("old_src", type=Path, help="the other checkout's src folder")
    parser.add_argument("--lengths", type=int, nargs="+", default=[8192, 16384])
    parser.add_argument("--rounds", type=int, nargs="+", default=[3, 1], help="rounds per length, in order")
    parser.add_argument("--methods", nargs="+", default=METHODS, choices=METHODS)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    if not (args.old_src / "posenc" / "__init__.py").is_file():
        print(f"old_src: {args.old_src} holds no posenc package (give a checkout's src folder)", file=sys.stderr)
        raise SystemExit(2)
    if len(args.rounds) != len(args.lengths):
        print(f"--rounds: {args.rounds}: one count per length ({len(args.lengths)})", file=sys.stderr)
        raise SystemExit(2)
    srcs = {"new": HERE.parent / "src", "old": args.old_src}
    cells = ["plain", *args.methods]
    times: dict[tuple[int, str, str], list[float]] = {}
    for length, rounds in zip(args.lengths, args.rounds, strict=True):
        for _ in range(rounds):
            for method in cells:
                for name, src in srcs.items():
                    seconds = time_one(src, method, length, args.repeats, args.dtype, args.threads)
                    times.setdefault((length, method, name), []).append(seconds)
                    print(f"# {length} {method} {name} {seconds:.4f} s", flush=True)
    print("| L | method | new / plain | old / plain | new / old |")
    print("|---:|---|---:|---:|---:|")
    for length in args.lengths:
        med = {key: statistics.median(values) for key, values in times.items() if key[0] == length}
        for method in args.methods:
            new, old = med[(length, method, "new")], med[(length, method, "old")]
            plain_new, plain_old = med[(length, "plain", "new")], med[(length, "plain", "old")]
            print(f"| {length} | {method} | {new / plain_new:.2f} | {old / plain_old:.2f} | {new / old:.2f} |")


if __name__ == "__main__":
    main()
