"""Fixtures for the runtime readers' tests: transformers is needed, tiny models run on one thread."""

import pytest

pytest.importorskip("transformers")

from one_thread import one_thread  # noqa: E402, F401  (autouse: tiny models on one thread)

