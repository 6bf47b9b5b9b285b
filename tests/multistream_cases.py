"""Inputs shared by the multi-stream RoPE tests (``tests/encodings/test_rope_3d.py``, ``test_rope_3d_bailing.py``,
``test_xdrope.py``): a GQA pair of queries and keys, and the largest magnitude the rotation bounds scale with."""

from __future__ import annotations

import torch


def qk(head_dim: int, s: int = 9, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Queries ``(2, 4, s, head_dim)`` and keys ``(2, 2, s, head_dim)``, standard normal, seeded."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(2, 4, s, head_dim, generator=gen), torch.randn(2, 2, s, head_dim, generator=gen)


def x_max(*tensors: torch.Tensor) -> float:
    """The largest ``|x|`` over ``tensors``."""
    return max(float(t.abs().max()) for t in tensors)
