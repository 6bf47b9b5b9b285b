"""Wall time of ``posenc check`` (issue 48): a fresh process, as a user runs it before deploying, for a transformers
folder and for a GGUF file, reading the model (``--no-cache``: the first check of these files) and printing the rows
kept from a first check (``posenc._check_cache``: the same check again, or a check after ``posenc export``); and
the check alone inside a process that has imported everything (what ``posenc.hf.save_pretrained``, ``save_gguf``
and ``posenc export`` add to a save).

    python bench/check_timing.py --folder DIR --gguf FILE.gguf [--runtimes transformers] [--repeats 5]

Without ``--folder``/``--gguf`` it first writes SmolLM2-135M extended by YaRN x2 both ways with ``posenc export`` into
a temporary folder (removed afterwards; tens of seconds, not timed). Each fresh-process command is
``python -m posenc check PATH --runtimes R --json`` (``--no-cache`` for the reading; the kept rows in a temporary
``$POSENC_CHECK_CACHE``; exit status 0 or 1 both count: 1 only says a runtime differs or is not verified); the
table gives the best and the median of ``--repeats``, the load average and the machine.
Timings only; nothing is asserted.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from newcomer_commands import _cpu_name  # the CPU's name as /proc/cpuinfo gives it (bench/ is on the path)


def fresh(path: Path, runtimes: str, cache: Path, *, read: bool) -> float:
    """One ``posenc check`` as a new process: interpreter start, imports, the reading (``read``; else the rows kept
    in ``cache``), the table as JSON."""
    argv = [sys.executable, "-m", "posenc", "check", str(path), "--runtimes", runtimes, "--json"]
    argv += ["--no-cache"] if read else []
    start = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, "POSENC_CHECK_CACHE": str(cache)})
    seconds = time.perf_counter() - start
    if done.returncode not in (0, 1):
        raise SystemExit(f"{' '.join(argv)} failed ({done.returncode}):\n{done.stdout}{done.stderr}")
    return seconds


def in_process(path: Path, runtimes: str, repeats: int) -> tuple[float, float]:
    """``(first call, best later call)`` of ``posenc.runtimes.check.check`` in this process."""
    from posenc.runtimes.check import check

    start = time.perf_counter()
    check(path, runtimes)
    first = time.perf_counter() - start
    later = []
    for _ in range(repeats):
        start = time.perf_counter()
        check(path, runtimes)
        later.append(time.perf_counter() - start)
    return first, min(later)


def _export(tmp: Path) -> tuple[Path, Path]:
    for save in (tmp / "smollm2-yarn2", tmp / "smollm2-yarn2.gguf"):
        cmd = [sys.executable, "-m", "posenc", "export", "smollm2", "--method", "yarn", "--factor", "2",
               "--save", str(save), "--quiet"]
        subprocess.run(cmd, check=True)
    return tmp / "smollm2-yarn2", tmp / "smollm2-yarn2.gguf"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--folder", type=Path, help="a transformers folder (default: SmolLM2 YaRN x2, exported here)")
    parser.add_argument("--gguf", type=Path, help="a GGUF file (default: SmolLM2 YaRN x2, exported here)")
    parser.add_argument("--runtimes", default="transformers,vllm,sglang,llamacpp")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder, gguf = args.folder, args.gguf
        if folder is None or gguf is None:
            made = _export(Path(tmp))
            folder, gguf = folder or made[0], gguf or made[1]
        import torch

        print(f"{_cpu_name()}, {os.cpu_count()} cores, torch {torch.__version__}, Python {platform.python_version()}, "
              f"{time.strftime('%Y-%m-%d')}, load average {os.getloadavg()[0]:.1f} at the start")
        print(f"posenc check --runtimes {args.runtimes}, {args.repeats} runs each\n")
        print("| what | fresh process, reading: best (s) | median (s) | fresh process, rows kept: best (s) "
              "| median (s) | in-process, first call (s) | later calls, best (ms) |")
        print("|---|---:|---:|---:|---:|---:|---:|")
        cache = Path(tmp) / "kept"
        for name, path in (("folder (config.json)", folder), ("GGUF (header)", gguf)):
            times = [fresh(path, args.runtimes, cache, read=True) for _ in range(args.repeats)]
            fresh(path, args.runtimes, cache, read=False)  # the first check keeps its rows
            kept = [fresh(path, args.runtimes, cache, read=False) for _ in range(args.repeats)]
            first, later = in_process(path, args.runtimes, args.repeats)
            print(f"| {name}: {path.name} | {min(times):.2f} | {statistics.median(times):.2f} | {min(kept):.2f} | "
                  f"{statistics.median(kept):.2f} | {first:.2f} | {1e3 * later:.1f} |")
        floors = {"python -c 'import torch'": "import torch",
                  "... and transformers' LlamaConfig": "import torch; from transformers import LlamaConfig"}
        for name, code in floors.items():  # what any check in a fresh process pays before reading anything
            times = []
            for _ in range(args.repeats):
                start = time.perf_counter()
                subprocess.run([sys.executable, "-c", code], check=True)
                times.append(time.perf_counter() - start)
            print(f"| floor: {name} | {min(times):.2f} | {statistics.median(times):.2f} | | | | |")
        print(f"\nload average {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    main()
