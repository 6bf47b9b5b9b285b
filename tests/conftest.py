import os

import pytest
import torch
from hypothesis import settings

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


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
