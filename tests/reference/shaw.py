"""Formula-level reference for Shaw, Uszkoreit, Vaswani 2018 (arXiv:1803.02155), written out naively.

Eq. (5)-(6): ``a^K_ij = w^K_{clip(j - i, k)}``, ``a^V_ij = w^V_{clip(j - i, k)}``, ``clip(x, k) = max(-k, min(k, x))``
with ``i``, ``j`` the positions of query and key. Eq. (4): ``e_ij = x_i W^Q (x_j W^K + a^K_ij)^T / sqrt(d_z)``
(here ``q_i . (k_j + a^K_ij) * scale``); Eq. (2): ``alpha = softmax_j(e)``; Eq. (3):
``z_i = sum_j alpha_ij (x_j W^V + a^V_ij)``. The relative vectors are built as explicit ``(B, S, T, D)`` tensors,
entry by entry with Python ints, sharing nothing with ``posenc``; everything runs in float64.
"""

from __future__ import annotations

import torch


def clip(x: int, k: int) -> int:
    return max(-k, min(k, x))


def relative_vectors(q_pos: torch.Tensor, k_pos: torch.Tensor, table: torch.Tensor, batch: int) -> torch.Tensor:
    """``a_ij = table[clip(k_pos[j] - q_pos[i], K) + K]`` for every batch row: ``(B, S, T, D)``."""
    k_max = (table.shape[0] - 1) // 2
    q_rows = q_pos.expand(batch, q_pos.shape[-1])  # (S,), (1, S) or (B, S) -> (B, S)
    k_rows = k_pos.expand(batch, k_pos.shape[-1])
    out = torch.empty(batch, q_rows.shape[1], k_rows.shape[1], table.shape[1], dtype=torch.float64)
    for b in range(batch):
        for i, qi in enumerate(q_rows[b].tolist()):
            for j, kj in enumerate(k_rows[b].tolist()):
                out[b, i, j] = table[clip(kj - qi, k_max) + k_max].double()
    return out


def key_bias(q: torch.Tensor, q_pos, k_pos, w_k: torch.Tensor, scale: float) -> torch.Tensor:
    """``scale * q_i . a^K_ij``: ``(B, H, S, T)``."""
    a_k = relative_vectors(q_pos, k_pos, w_k, q.shape[0])  # (B, S, T, D)
    return torch.einsum("bhsd,bstd->bhst", q.double(), a_k) * scale


def value_term(weights: torch.Tensor, q_pos, k_pos, w_v: torch.Tensor) -> torch.Tensor:
    """``sum_j weights_ij a^V_ij``: ``(B, H, S, D)``."""
    a_v = relative_vectors(q_pos, k_pos, w_v, weights.shape[0])  # (B, S, T, D)
    return torch.einsum("bhst,bstd->bhsd", weights.double(), a_v)


def attention(q, k, v, q_pos, k_pos, w_k, w_v=None, *, scale: float, mask=None) -> torch.Tensor:
    """Eqs. (2)-(4) in full: ``(B, H, S, D)``. ``mask`` (S, T) boolean, True where allowed; ``w_v=None``: keys only."""
    a_k = relative_vectors(q_pos, k_pos, w_k, q.shape[0])  # (B, S, T, D)
    q, k, v = q.double(), k.double(), v.double()
    # e_ij = q_i . (k_j + a^K_ij) * scale, with k_j broadcast over the query axis: (B, H, S, T, D) summed over D.
    e = ((k[:, :, None, :, :] + a_k[:, None]) * q[:, :, :, None, :]).sum(-1) * scale
    if mask is not None:
        e = e.masked_fill(~mask, float("-inf"))
    alpha = torch.softmax(e, dim=-1)  # (B, H, S, T)
    values = v[:, :, None, :, :]  # (B, H, 1, T, D)
    if w_v is not None:
        values = values + relative_vectors(q_pos, k_pos, w_v, q.shape[0])[:, None]  # (B, H, S, T, D)
    return (alpha[..., None] * values).sum(-2)  # z_i = sum_j alpha_ij (v_j + a^V_ij)
