"""Sandwich as NVIDIA NeMo implements it, written out in float64 loops: a second, independent reading of Chi et al.
2023 (Sec. 5).

NeMo (``nemo/collections/nlp/modules/common/megatron/position_embedding/sandwich_relative_position_embedding.py``,
PR #6666, unchanged since its "fix sandwich" commit): with ``d = |i - j|``, ``d'`` the per-head dimension and head
``n = 1..H``,

    b_n(d) = [ sum_{k=1}^{d'/2} cos(d * 10000 ** (-2k / d')) - d'/2 ] / (8n / H)

It differs from posenc's form on two points: its frequencies run over ``k = 1..d'/2`` (posenc ``k = 0..d'/2 - 1``,
the Vaswani embedding's own indices), and the head value ``8n/H`` divides the *bias* (posenc divides the distance,
``p_{m / r_h}``: a compression ratio). Both are exactly related: ``k = 1..d'/2`` is ``k = 0..d'/2 - 1`` with every
frequency times ``10000 ** (-2/d')``, i.e. posenc with ratios ``10000 ** (2/d')``; and NeMo's head ``n`` times
``8n/H`` is then that bias.
"""

from __future__ import annotations

import math

import torch


def nemo_sandwich(s: int, t: int, *, num_heads: int, head_dim: int) -> torch.Tensor:
    """(H, S, T) float64: NeMo's bias for queries at ``t - s .. t - 1`` and keys at ``0 .. t - 1``."""
    out = torch.zeros(num_heads, s, t, dtype=torch.float64)
    half = head_dim // 2
    for n in range(1, num_heads + 1):
        for a in range(s):
            i = t - s + a
            for j in range(t):
                d = abs(i - j)
                total = sum(math.cos(d * 10000.0 ** (-2.0 * k / head_dim)) for k in range(1, half + 1))
                out[n - 1, a, j] = (total - half) / (8.0 * n / num_heads)
    return out
