"""Fixtures for the Hugging Face interop tests; the tiny models themselves are in ``tiny.py``."""

import pytest
import torch

pytest.importorskip("transformers")

from hf.tiny import ORIGINAL  # noqa: E402 - after the skip
from one_thread import one_thread  # noqa: E402, F401  (autouse: tiny models on one thread)


@pytest.fixture
def ids():
    return torch.randint(0, 64, (2, 3 * ORIGINAL))  # (B, S): three times the original length

