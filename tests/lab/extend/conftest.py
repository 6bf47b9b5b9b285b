"""Fixtures shared by the ``posenc extend`` tests."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from lab.extend.code_corpus import write_code_corpus


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models run fastest on one thread; two threads on a busy 2-core machine are ~50x slower. Modules use it
    with ``pytestmark = pytest.mark.usefixtures("one_thread")``."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(autouse=True)
def _auto_means_float32(monkeypatch):
    """``--dtype auto`` means float32 here whatever this CPU has: studies compare their numbers with float32
    recomputations, and on a CPU with AVX512-BF16 or AMX auto would pick bfloat16. Tests of that choice name the
    units they pretend to have (``_cpu_caps`` in ``test_study_real.py``), which replaces this."""
    caps = {**torch.cpu.get_capabilities(), "avx512_bf16": False, "amx_bf16": False, "amx_fp16": False,
            "avx512_fp16": False}
    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: caps)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """Eight small Python files (~40 kB): held-out and training text for tiny studies."""
    return write_code_corpus(tmp_path_factory.mktemp("corpus"), 8, 120)
