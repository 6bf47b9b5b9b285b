"""An autouse fixture for test folders of tiny transformers models (tests/hf, tests/gguf, tests/runtimes): their ops
are far too small to split, so extra intra-op threads only spin on a shared machine. A folder's conftest imports it."""

import pytest
import torch


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
