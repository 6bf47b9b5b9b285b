import os
import sys

import pytest
import torch
from hypothesis import settings

import posenc.attention  # noqa: F401 - the module, for _flex_uncompiled

# posenc check keeps its rows by what they are computed from (posenc._check_cache); tests monkeypatch readers, so the
# cache is off for the whole session (subprocesses inherit it) and on only in the tests of the cache itself.
os.environ["POSENC_CHECK_CACHE"] = ""

# Under pytest-xdist (`-n auto`: one worker per core) each worker gets its share of the cores' threads, so the
# workers do not oversubscribe the CPU (tests that pin their own thread count still do).
if (workers := os.environ.get("PYTEST_XDIST_WORKER_COUNT")) is not None:
    torch.set_num_threads(max(1, torch.get_num_threads() // int(workers)))

# Deterministic, CI-sized hypothesis runs: no deadline (2 shared cores), derandomized so CI never flakes.
settings.register_profile("ci", max_examples=40, deadline=None, derandomize=True)
settings.load_profile("ci")


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture(autouse=True)
def _flex_uncompiled(request, monkeypatch):
    """posenc compiles FlexAttention once per shape: on a CPU, inductor's C++ takes seconds per kernel with a cold
    cache (a fresh CI venv), and a decode loop compiles once per step (BENCHMARKS.md, "Time of CI": the 139 flex
    and compile tests took 9:33 before this fixture, 5:40 after). Tests of posenc's masks, positions and score_mods
    run torch's uncompiled FlexAttention -- the same score_mod and block mask, an ``S x T`` matrix -- and the tests
    marked ``flex_compiled`` run the kernels users run: windows, chunks and sinks, narrow head dims, low precision and
    the linear memory of the compiled path. Every score_mod is compiled by its own test
    (``test_score_mod_in_compiled_flex_attention``, ``test_compiled_attention_is_the_bias_without_graph_breaks``)."""
    if "flex_compiled" not in request.keywords:
        monkeypatch.setattr(sys.modules["posenc.attention"], "FLEX_COMPILED", False)


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
