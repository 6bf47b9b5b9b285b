"""Fixtures for the GGUF format's tests: tiny files are written from transformers' tiny models (``hf/tiny_gguf.py``),
which run on one thread."""

import pytest

pytest.importorskip("transformers")

from one_thread import one_thread  # noqa: E402, F401  (autouse: tiny models on one thread)

