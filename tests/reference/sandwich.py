"""Formula-level Sandwich reference (Chi et al. 2023, arXiv:2212.10356, Sec. 5): the bias of head ``h`` is the dot
product of the sinusoidal embeddings (Vaswani et al., ``reference.sinusoidal.vaswani``, float64) of the compressed
positions ``i / r_h`` and ``j / r_h``, minus ``d' / 2``, the dot product at distance 0. Built from the embeddings,
not from the distance, so it checks that ``posenc``'s sum over frequencies is that dot product.
"""

from __future__ import annotations

import numpy as np
import torch

from reference.sinusoidal import vaswani


def sandwich(
    q_pos: torch.Tensor, k_pos: torch.Tensor, *, pe_dim: int, ratios: list[float], base: float = 10000.0
) -> torch.Tensor:
    """(B|1, H, S, T) float64."""
    batch = max(p.shape[0] if p.dim() == 2 else 1 for p in (q_pos, k_pos))
    q_rows = [q_pos.tolist()] if q_pos.dim() == 1 else q_pos.tolist()
    k_rows = [k_pos.tolist()] if k_pos.dim() == 1 else k_pos.tolist()
    q_rows, k_rows = (rows * batch if len(rows) == 1 else rows for rows in (q_rows, k_rows))
    out = np.zeros((batch, len(ratios), len(q_rows[0]), len(k_rows[0])))
    for b in range(batch):
        for h, r in enumerate(ratios):
            p_q = vaswani([float(p) / r for p in q_rows[b]], pe_dim, base)  # (S, d')
            p_k = vaswani([float(p) / r for p in k_rows[b]], pe_dim, base)  # (T, d')
            out[b, h] = p_q @ p_k.T - pe_dim / 2
    return torch.from_numpy(out)
