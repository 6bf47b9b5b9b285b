"""Wall time of the newcomer's first commands (issue 39): a study's plan before any weight loads, and an export
without a study, each run as a user runs it (a fresh ``posenc`` process: interpreter start, imports, checks, work).

    python bench/newcomer_commands.py [--model smollm2] [--repeats 1]

Runs, in a temporary folder that is removed afterwards:

    posenc extend MODEL --plan
    posenc export MODEL --method yarn --factor 2 --save TMP/f
    posenc export MODEL --method yarn --factor 2 --save TMP/f.gguf

and prints each command's wall time (the best of ``--repeats``; each repeat writes a fresh path) in a markdown table
with the machine, the torch version, the load average and the date. Timings only; nothing is asserted.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _posenc() -> list[str]:
    """The ``posenc`` of this interpreter's environment (the console script, else ``python -m posenc.cli``)."""
    script = Path(sys.executable).with_name("posenc")
    return [str(script)] if script.exists() else [sys.executable, "-m", "posenc.cli"]


def run(argv: list[str], cwd: Path) -> float:
    start = time.perf_counter()
    done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({done.returncode}):\n{done.stdout}{done.stderr}")
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error(f"--repeats={args.repeats}: expected a positive integer")
    posenc = _posenc()
    load_before = os.getloadavg()[0]
    work = Path(tempfile.mkdtemp(prefix="posenc-newcomer-"))
    rows = []
    try:
        export = [*posenc, "export", args.model, "--method", "yarn", "--factor", "2", "--save"]
        commands = [
            ("posenc extend {m} --plan", lambda i: [*posenc, "extend", args.model, "--plan"]),
            ("posenc export {m} --method yarn --factor 2 --save TMP/f", lambda i: [*export, str(work / f"f{i}")]),
            ("posenc export {m} --method yarn --factor 2 --save TMP/f.gguf",
             lambda i: [*export, str(work / f"f{i}.gguf")]),
        ]
        for shown, argv in commands:
            times = [run(argv(i), work) for i in range(args.repeats)]
            rows.append((shown.format(m=args.model), min(times), times))
        left = sorted(p.name for p in work.iterdir())
    finally:
        shutil.rmtree(work, ignore_errors=True)
    load_after = os.getloadavg()[0]
    print(f"Machine: {_cpu_name()}, {os.cpu_count()} CPUs; torch {torch.__version__}; Python "
          f"{platform.python_version()}; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; load average "
          f"{load_before:.2f} before, {load_after:.2f} after")
    plan_wrote = "runs" in left  # --plan's default --out, runs/extend-<time>, would be under the work folder
    print(f"Written in the work folder: {', '.join(left)}; by --plan: {'runs/ (a bug)' if plan_wrote else 'nothing'}")
    print()
    print(f"| command | wall (s){', best of ' + str(args.repeats) if args.repeats > 1 else ''} |")
    print("|---|---:|")
    for shown, best, _ in rows:
        print(f"| `{shown}` | {best:.1f} |")


if __name__ == "__main__":
    main()
