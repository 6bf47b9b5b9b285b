"""Run ``python -m posenc ...`` in one process and under ``torchrun`` with two, for the DDP equivalence tests."""

import os
import subprocess
import sys


def one_and_two_processes(args: list[str], one_out, two_out) -> None:
    """``posenc *args --out one_out`` alone, then with ``torchrun --nproc_per_node=2 --out two_out``; both must pass."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    one = subprocess.run([sys.executable, "-m", "posenc", *args, "--out", str(one_out)], env=env,
                         capture_output=True, text=True, timeout=300)
    assert one.returncode == 0, one.stdout + one.stderr
    two = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                          "-m", "posenc", *args, "--out", str(two_out)], env=env, capture_output=True, text=True,
                         timeout=300)
    assert two.returncode == 0, two.stdout + two.stderr
