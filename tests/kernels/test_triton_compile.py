"""The Triton RoPE kernel compiles to machine code for A100 (sm_80) and H100 (sm_90), on machines without a GPU.

The interpreter tests (``test_triton.py``) check what the kernel computes; this checks that every launch
configuration ``rotary_qk`` makes (layouts, dtypes, partial rotary, per-token and packed tables, in place, strided
q/k, head dims 64-256) lowers through Triton's GPU pipeline to a cubin. ``triton_aot.py`` does the work in a fresh
process, since ``TRITON_INTERPRET=1`` (set by the interpreter tests) changes what ``@triton.jit`` builds.
"""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")
pytest.importorskip("triton.backends.nvidia", reason="this Triton build has no NVIDIA backend")

SCRIPT = Path(__file__).with_name("triton_aot.py")
ARCHS = (80, 90)


def _cases() -> list[str]:
    spec = importlib.util.spec_from_file_location("triton_aot", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return list(module.CASES)


@pytest.fixture(scope="module")
def compiled() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # Triton's own default, set to silence its warning
    done = subprocess.run(
        [sys.executable, str(SCRIPT), *map(str, ARCHS)], capture_output=True, text=True, env=env, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("case", _cases())
@pytest.mark.parametrize("arch", ARCHS)
def test_kernel_compiles_for_gpu(compiled, case, arch):
    assert compiled[f"{case}/sm_{arch}"] == "ok"
