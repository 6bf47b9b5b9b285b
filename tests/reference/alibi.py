"""Formula-level ALiBi references (Press et al. 2022, arXiv:2108.12409; CROMA, Fuller et al. 2023, arXiv:2311.00566).

``get_slopes`` is the paper's function from ofirpress/attention_with_linear_biases (``fairseq/models/transformer.py``)
written out in plain Python floats. The biases are naive loops over (batch, head, query, key) in Python float64;
``alibi_2d`` follows antofuller/CROMA ``get_2dalibi``: ``-slope * sqrt(dx**2 + dy**2)`` between patch positions.
Slopes are passed in (float32 slopes by the project's convention), so float64 results are the exact products.
"""

from __future__ import annotations

import math

import torch


def get_slopes(n: int) -> list[float]:
    """The paper's slopes: a geometric sequence from ``2 ** (-8 / n)`` for powers of 2, else the closest power of 2's
    slopes followed by every other slope of twice that many heads."""

    def get_slopes_power_of_2(n: int) -> list[float]:
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        ratio = start
        return [start * ratio**i for i in range(n)]

    if math.log2(n).is_integer():
        return get_slopes_power_of_2(n)
    closest = 2 ** math.floor(math.log2(n))
    return get_slopes_power_of_2(closest) + get_slopes(2 * closest)[0::2][: n - closest]


def _batch_rows(positions: torch.Tensor, batch: int, grid: bool) -> list[list]:
    """``(L,)``/``(1, L)``/``(B, L)`` (grids: with a trailing ``2``) as ``batch`` Python lists of positions."""
    unbatched = positions.dim() == (2 if grid else 1)
    rows = [positions.tolist()] if unbatched else positions.tolist()
    return rows * batch if len(rows) == 1 else rows


def _loop_bias(q_pos, k_pos, slopes, distance, grid: bool) -> torch.Tensor:
    batch = max(p.shape[0] if p.dim() == (3 if grid else 2) else 1 for p in (q_pos, k_pos))
    qs, ks = _batch_rows(q_pos, batch, grid), _batch_rows(k_pos, batch, grid)
    m = slopes.tolist()
    out = torch.empty(batch, len(m), len(qs[0]), len(ks[0]), dtype=torch.float64)
    for b in range(batch):
        for h in range(len(m)):
            for i, qi in enumerate(qs[b]):
                for j, kj in enumerate(ks[b]):
                    out[b, h, i, j] = -m[h] * distance(qi, kj)
    return out


def alibi_causal(q_pos: torch.Tensor, k_pos: torch.Tensor, slopes: torch.Tensor) -> torch.Tensor:
    """``-m_h * (q - k)`` for every (batch, head, query, key), float64. Shape (B|1, H, S, T)."""
    return _loop_bias(q_pos, k_pos, slopes, lambda q, k: float(q) - float(k), grid=False)


def alibi_symmetric(q_pos: torch.Tensor, k_pos: torch.Tensor, slopes: torch.Tensor) -> torch.Tensor:
    """``-m_h * |q - k|`` for every (batch, head, query, key), float64. Shape (B|1, H, S, T)."""
    return _loop_bias(q_pos, k_pos, slopes, lambda q, k: abs(float(q) - float(k)), grid=False)


def alibi_2d(q_pos: torch.Tensor, k_pos: torch.Tensor, slopes: torch.Tensor) -> torch.Tensor:
    """CROMA: ``-m_h * sqrt((x_q - x_k)**2 + (y_q - y_k)**2)``, float64. Shape (B|1, H, S, T)."""
    return _loop_bias(q_pos, k_pos, slopes, lambda q, k: math.sqrt((q[0] - k[0]) ** 2 + (q[1] - k[1]) ** 2), grid=True)


def croma_2dalibi(num_heads: int, num_patches: int) -> torch.Tensor:
    """antofuller/CROMA ``get_2dalibi``: float32 slopes times Python-float distances over a square patch grid,
    points ``itertools.product(range(side), range(side))`` (row-major). Shape (1, H, N, N), float32."""
    side = int(math.sqrt(num_patches))
    points = [(i, j) for i in range(side) for j in range(side)]
    slopes = torch.tensor(get_slopes(num_heads), dtype=torch.float32).unsqueeze(1)  # (H, 1)
    idxs = []
    for p1 in points:
        for p2 in points:
            dist = math.sqrt((p1[0] - p2[0]) ** 2 + (p1[1] - p2[1]) ** 2)
            idxs.append(dist * slopes * -1)  # (H, 1)
    return torch.cat(idxs, dim=1).view(1, num_heads, num_patches, num_patches)  # (H, N*N) -> (1, H, N, N)
