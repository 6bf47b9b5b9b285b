"""Formula-level FIRE references (Li et al. 2024, arXiv:2310.04418, Sec. 3 and the appendix's PyTorch listing).

``fire``: ``b_h(i, j) = f_theta(psi(i - j) / psi(max(L, i)))`` per (batch, head, query, key) with float64 scalar
tensors (autograd gives reference gradients), ``psi(x) = log(|c x| + 1)``, the normaliser plus ``eps``,
``L = |L_multiplier * init_L|``, ``f_theta(x)_h = b2_h + sum_u w2_hu max(0, w1_u x + b1_u)``.

``fire_listing``: the appendix listing's matrix form for positions ``0..L-1``, rewritten from its description:
distances ``i - j`` for all pairs, the normaliser ``max(i, threshold)`` per row, ``log(|c x| + 1)`` on both
(plus ``eps`` on the normaliser), then the MLP (an ``nn.Sequential``) on the trailing axis, heads moved to dim 1.
"""

from __future__ import annotations

import torch
from torch import nn


def _rows(positions: torch.Tensor, batch: int) -> list[list[float]]:
    rows = [positions.tolist()] if positions.dim() == 1 else positions.tolist()
    return rows * batch if len(rows) == 1 else rows


def fire(
    q_pos: torch.Tensor,
    k_pos: torch.Tensor,
    *,
    c: torch.Tensor,
    L_multiplier: torch.Tensor,
    init_L: float,
    w1: torch.Tensor,
    b1: torch.Tensor,
    w2: torch.Tensor,
    b2: torch.Tensor,
    eps: float,
) -> torch.Tensor:
    """(B|1, H, S, T) float64; parameters are float64 tensors (``w1``, ``b1`` ``(W,)``; ``w2`` ``(H, W)``)."""
    batch = max(p.shape[0] if p.dim() == 2 else 1 for p in (q_pos, k_pos))
    qs, ks = _rows(q_pos, batch), _rows(k_pos, batch)
    heads, width = w2.shape
    threshold = torch.abs(L_multiplier * init_L)
    values = {}  # (b, h, query index, key index) -> 0-d tensor
    for b in range(batch):
        for i, qi in enumerate(qs[b]):
            q_max = torch.maximum(torch.tensor(float(qi), dtype=torch.float64), threshold)
            normaliser = torch.log(torch.abs(c * q_max) + 1) + eps
            for j, kj in enumerate(ks[b]):
                x = torch.log(torch.abs(c * (float(qi) - float(kj))) + 1) / normaliser
                hidden = [torch.relu(w1[u] * x + b1[u]) for u in range(width)]
                for h in range(heads):
                    values[b, h, i, j] = b2[h] + sum(w2[h, u] * hidden[u] for u in range(width))
    out = [values[key] for key in sorted(values)]  # row-major (b, h, i, j)
    return torch.stack(out).view(batch, heads, len(qs[0]), len(ks[0]))


def fire_listing(
    length: int, mlp: nn.Sequential, c: torch.Tensor, L_multiplier: torch.Tensor, init_L: float, eps: float
) -> torch.Tensor:
    """The listing's bias for positions ``0..length-1``: ``(1, H, L, L)`` in the MLP's dtype."""
    positions = torch.arange(length, dtype=torch.float32)
    rel_distance = positions[:, None] - positions[None, :]  # (L, L)
    threshold = torch.abs(L_multiplier * init_L)
    pos_normalizer = torch.max(positions, threshold)[:, None]  # (L, 1)
    rel_distance = torch.log(torch.abs(c * rel_distance) + 1)
    pos_normalizer = torch.log(torch.abs(c * pos_normalizer) + 1) + eps
    normalized = rel_distance / pos_normalizer  # (L, L)
    return mlp(normalized.unsqueeze(-1)).unsqueeze(0).permute(0, 3, 1, 2)  # (L, L, H) -> (1, H, L, L)
