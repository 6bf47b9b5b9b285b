"""Formula-level CoPE reference (Golovneva et al. 2024, arXiv:2405.18719, Sec. 3), written out with loops in float64.

For batch row ``b``, head ``h``, query ``i`` (key index ``i + T - S``) and every key ``j`` the query sees:

    g_it = sigmoid(scale * q_i . k_t)                                       Eq. (3), scale inside as in RAM's code
    p_ij = min(sum over visible t in j..i of g_it, p_max)                   Eq. (4), clipped
    e[p] = (p - floor p) e[ceil p] + (1 - p + floor p) e[floor p]           Eq. (5), the *embeddings* interpolated
    bias_ij = scale * q_i . e[p_ij]                                         Eq. (6)'s position term, scaled

and 0 where the query does not see the key. Interpolating the embeddings (Eq. 5) rather than the logits (Eq. 7,
what ``posenc`` does) keeps this independent of the implementation. Query head ``h`` reads key head
``h // (H / Hkv)``; the table is ``(p_max + 1, D)`` or ``(H, p_max + 1, D)``. Nothing is shared with ``posenc``.
"""

from __future__ import annotations

import math

import torch

from reference.attention import naive_attention


def _visible(visible: torch.Tensor | None, b: int, h: int, i: int, j: int, offset: int) -> bool:
    """Causal (``j <= i + offset``) and, if given, ``visible[b, h, i, j]`` (axes of size 1 broadcast)."""
    if j > i + offset:
        return False
    if visible is None:
        return True
    index = [b, h, i, j]
    return bool(visible[tuple(0 if visible.shape[a] == 1 else index[a] for a in range(4))])


def positions(q, k, *, scale: float, max_position: int, visible=None) -> torch.Tensor:
    """``p_ij`` ``(B, H, S, T)`` float64, 0 where the query does not see the key."""
    b_, h_, s_, _ = q.shape
    hkv, t_ = k.shape[1], k.shape[2]
    group, offset = h_ // hkv, t_ - s_
    q, k = q.double(), k.double()
    out = torch.zeros(b_, h_, s_, t_, dtype=torch.float64)
    for b in range(b_):
        for h in range(h_):
            for i in range(s_):
                for j in range(t_):
                    if not _visible(visible, b, h, i, j, offset):
                        continue
                    count = 0.0
                    for t in range(j, t_):
                        if _visible(visible, b, h, i, t, offset):
                            logit = float(q[b, h, i] @ k[b, h // group, t]) * scale
                            count += 1.0 / (1.0 + math.exp(-logit))
                    out[b, h, i, j] = min(count, max_position)
    return out


def interpolated_embedding(table: torch.Tensor, p: float) -> torch.Tensor:
    """Eq. (5) for one position: ``(D,)`` float64."""
    low, high = math.floor(p), math.ceil(p)
    return (p - low) * table[high].double() + (1 - p + low) * table[low].double()


def bias(q, k, embeddings, *, scale: float, visible=None) -> torch.Tensor:
    """``scale * q_i . e[p_ij]`` ``(B, H, S, T)`` float64, 0 where the query does not see the key."""
    max_position = embeddings.shape[-2] - 1
    p = positions(q, k, scale=scale, max_position=max_position, visible=visible)
    b_, h_, s_, t_ = p.shape
    offset = t_ - s_
    out = torch.zeros_like(p)
    for b in range(b_):
        for h in range(h_):
            table = embeddings[h] if embeddings.dim() == 3 else embeddings
            for i in range(s_):
                for j in range(t_):
                    if _visible(visible, b, h, i, j, offset):
                        e = interpolated_embedding(table, float(p[b, h, i, j]))
                        out[b, h, i, j] = scale * float(q[b, h, i].double() @ e)
    return out


def attention(q, k, v, embeddings, *, scale: float, document_ids=None) -> torch.Tensor:
    """``softmax_j(scale * q_i . (k_j + e[p_ij])) v_j`` over the causal keys of the query's document.

    Shapes: q (B, H, S, D), k (B, Hkv, T, D), v (B, Hkv, T, Dv), document_ids (T,) or (B, T) -> (B, H, S, Dv).
    """
    visible = None
    if document_ids is not None:
        ids = document_ids if document_ids.dim() == 2 else document_ids[None]  # (B|1, T)
        q_ids = ids[:, k.shape[2] - q.shape[2] :]
        visible = (q_ids[:, :, None] == ids[:, None, :])[:, None]  # (B|1, 1, S, T)
    b = bias(q, k, embeddings, scale=scale, visible=visible)
    return naive_attention(q, k, v, bias=b, causal=True, document_ids=document_ids, scale=scale)
