"""Formula-level KERPLE references (Chi et al. 2022, arXiv:2205.09921, Sec. 4).

``kerple``: the paper's kernels written out per (batch, head, query, key) with float64 scalar tensors (so autograd
gives reference gradients): ``-r1 * log(1 + r2 * |i - j|)`` (log) and ``-r1 * |i - j| ** r2`` (power), parameters
used as given.

``kerple_repo_causal``: the causal square form of chijames/KERPLE's ``ParallelKerpleLog`` / ``ParallelKerplePower``
(bias part), rewritten from its description: the distance matrix is ``tril(i - j)`` for ``i, j < L`` (0 above the
diagonal), the parameters ``bias_p``, ``bias_a`` are clamped to ``>= 0.01`` (``bias_p <= 2`` for power) before use;
log: ``-bias_p * log(1 + bias_a * diff)``, power: ``-bias_a * diff ** bias_p``.
"""

from __future__ import annotations

import torch


def _rows(positions: torch.Tensor, batch: int) -> list[list[float]]:
    rows = [positions.tolist()] if positions.dim() == 1 else positions.tolist()
    return rows * batch if len(rows) == 1 else rows


def kerple(q_pos: torch.Tensor, k_pos: torch.Tensor, r1: torch.Tensor, r2: torch.Tensor, kernel: str) -> torch.Tensor:
    """(B|1, H, S, T) float64, differentiable in ``r1``, ``r2`` (``(H,)`` float64 tensors)."""
    batch = max(p.shape[0] if p.dim() == 2 else 1 for p in (q_pos, k_pos))
    qs, ks = _rows(q_pos, batch), _rows(k_pos, batch)
    out = []
    for b in range(batch):
        for h in range(r1.shape[0]):
            for qi in qs[b]:
                for kj in ks[b]:
                    d = abs(float(qi) - float(kj))
                    if kernel == "log":
                        out.append(-r1[h] * torch.log(1 + r2[h] * d))
                    else:
                        out.append(-r1[h] * torch.tensor(d, dtype=torch.float64) ** r2[h])
    return torch.stack(out).view(batch, r1.shape[0], len(qs[0]), len(ks[0]))


def kerple_repo_causal(length: int, bias_p: torch.Tensor, bias_a: torch.Tensor, kernel: str) -> torch.Tensor:
    """The reference code's causal bias for positions ``0..length-1``: ``(H, L, L)`` float64, 0 above the diagonal
    distance-wise (``diff = 0`` there, as ``torch.tril`` leaves it)."""
    i = torch.arange(length, dtype=torch.float64)
    diff = torch.tril(i[:, None] - i[None, :])  # (L, L): i - j below the diagonal, 0 above
    p = bias_p.double().clamp(min=0.01, max=2.0 if kernel == "power" else None)[:, None, None]  # (H, 1, 1)
    a = bias_a.double().clamp(min=0.01)[:, None, None]
    if kernel == "log":
        return -p * torch.log(1 + a * diff)
    return -a * diff**p
