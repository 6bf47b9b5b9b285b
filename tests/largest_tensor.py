"""A dispatch mode that records the largest tensor any operation produces: memory claims checked without timing."""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode


class LargestTensor(TorchDispatchMode):
    """``with LargestTensor() as seen: ...`` then ``seen.numel``: the most elements of any operation's output."""

    def __init__(self) -> None:
        super().__init__()
        self.numel = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.numel = max(self.numel, t.numel())
        return out


def flex_prepared(monkeypatch, n: int, **options):  # noqa: ANN001, ANN003, ANN201
    """``posenc.attention`` on ``flex`` at length ``n`` (2 query heads, 1 key head, sinks, explicit key positions,
    ``options`` such as ``chunk_size=`` / ``window=``) with the compiled kernel stubbed (a dispatch mode cannot enter
    it): returns the largest tensor posenc built on the way (elements) and the block mask it handed the kernel."""
    import sys

    import posenc

    given = {}

    def kernel(q, k, v, **kwargs):  # noqa: ANN001, ANN003, ANN202
        given.update(kwargs)
        return q.new_zeros(*q.shape[:-1], v.shape[-1])

    monkeypatch.setattr(sys.modules["posenc.attention"], "_COMPILED_FLEX", kernel)
    q, k, v = torch.randn(1, 2, n, 32), torch.randn(1, 1, n, 32), torch.randn(1, 1, n, 32)
    with torch.no_grad(), LargestTensor() as seen:
        posenc.attention(q, k, v, sinks=torch.randn(2), k_positions=torch.arange(n), backend="flex", **options)
    return seen.numel, given["block_mask"]
