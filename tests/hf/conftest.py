"""Fixtures for the Hugging Face interop tests; the tiny models themselves are in ``tiny.py``."""

import pytest
import torch

pytest.importorskip("transformers")

from hf.tiny import ORIGINAL  # noqa: E402 - after the skip


@pytest.fixture
def ids():
    return torch.randint(0, 64, (2, 3 * ORIGINAL))  # (B, S): three times the original length


@pytest.fixture(autouse=True)
def _one_thread():
    """The tiny models' ops are far too small to split: extra intra-op threads only spin on a shared machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
