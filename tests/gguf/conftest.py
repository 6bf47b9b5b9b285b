"""Fixtures for the GGUF format's tests: tiny files are written from transformers' tiny models (``hf/tiny_gguf.py``),
which run on one thread."""

import pytest
import torch

pytest.importorskip("transformers")


@pytest.fixture(autouse=True)
def _one_thread():
    """The tiny models' ops are far too small to split: extra intra-op threads only spin on a shared machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
