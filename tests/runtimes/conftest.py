"""Fixtures for the runtime readers' tests: transformers is needed, tiny models run on one thread."""

import pytest
import torch

pytest.importorskip("transformers")


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny models' ops are far too small to split: extra intra-op threads only spin on a shared machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
