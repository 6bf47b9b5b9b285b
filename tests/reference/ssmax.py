"""Scalable-Softmax attention written out in float64, one query at a time, as axolotl's FlexAttention ``score_mod``.

axolotl-ai-cloud/axolotl ``src/axolotl/monkeypatch/scaled_softmax_attn.py`` (commit
258ce8d4fa04c27ab49e169ba7751d8f4f1a423e, ``ssmax_flex_attention_forward``): each scaled score ``q . k * scale`` is
multiplied by ``s * log(n) + b`` with ``n = clamp(position_ids[q_idx] + 1, min=2)``, the query's position within its
packed sequence; then the mask and the softmax. axolotl has one ``s`` and one ``b`` for the model (``b`` a constant,
0 by default: the paper's recommended form); the paper (Nakanishi 2025, arXiv:2501.19399) learns ``s`` -- and, in
its variant with a bias, ``b`` -- per layer and head, so here each is one per head (a scalar repeats). Unlike axolotl
(``position_ids.view(-1)[q_idx]``, the first row's positions for every row), each batch row reads its own positions.

Keys: the last S of T are the queries (causal: key j visible to query i iff j <= i + T - S); query head h reads key
head h // (H / Hkv); a query sees only keys of its own document; RoPE, when given, rotates q and k before the scores
(``tests/reference/rope_float64.py``).
"""

from __future__ import annotations

import math

import torch

from reference.rope_float64 import rotate_float64


def ssmax_attention(q, k, v, s, *, q_positions, k_positions=None, document_ids=None, scale=None, b=0.0, rope=None):
    """q (B, H, S, D), k (B, Hkv, T, D), v (B, Hkv, T, Dv); s and b each (H,) or a number; positions (S,)/(B, S)
    and (T,)/(B, T); ``rope``: ``{"inv_freq": (F,), "layout": ..., "attention_factor": ...}`` or None
    -> (B, H, S, Dv) float64, differentiable in q, k, v and tensors ``s``, ``b``."""
    b_, h_, s_, d_ = q.shape
    hkv, t_ = k.shape[1], k.shape[2]
    group = h_ // hkv
    scale = d_**-0.5 if scale is None else scale
    k_positions = q_positions if k_positions is None else k_positions
    q, k, v = q.double(), k.double(), v.double()
    if rope is not None:
        kw = {"layout": rope["layout"], "attention_factor": rope.get("attention_factor", 1.0)}
        q = rotate_float64(q, q_positions, rope["inv_freq"], **kw)
        k = rotate_float64(k, k_positions, rope["inv_freq"], **kw)
    s = list(s.double().unbind()) if isinstance(s, torch.Tensor) and s.dim() == 1 else [s] * h_
    b = list(b.double().unbind()) if isinstance(b, torch.Tensor) and b.dim() == 1 else [b] * h_
    rows = []
    for bi in range(b_):
        for h in range(h_):
            g = h // group
            for i in range(s_):
                keys = [
                    j
                    for j in range(t_)
                    if j <= i + t_ - s_
                    and (document_ids is None or _row(document_ids, bi, t_ - s_ + i) == _row(document_ids, bi, j))
                ]
                idx = torch.tensor(keys)
                n = max(float(_row(q_positions, bi, i)) + 1.0, 2.0)  # axolotl: clamp(position + 1, min=2)
                factor = s[h] * math.log(n) + b[h]
                logits = (k[bi, g, idx] @ q[bi, h, i]) * scale * factor
                rows.append(torch.softmax(logits, dim=0) @ v[bi, g, idx])
    return torch.stack(rows).view(b_, h_, s_, v.shape[-1])


def _row(x, b, j):
    return x[j] if x.dim() == 1 else x[b if x.shape[0] > 1 else 0, j]
