"""Attention written out one query at a time, in float64: the reference for ``posenc.attention``'s eager backend.

Conventions it pins down: queries are the last S of the T keys (causal: key j visible to query i iff
j <= i + T - S); query head h reads key head h // (H / Hkv); a query sees only keys of its own document.
"""

from __future__ import annotations

import torch


def naive_attention(q, k, v, *, bias=None, causal=True, document_ids=None, scale=None):
    """q (B, H, S, D), k (B, Hkv, T, D), v (B, Hkv, T, Dv), bias (B|1, H, S, T) -> (B, H, S, Dv) float64."""
    b_, h_, s_, d_ = q.shape
    hkv, t_ = k.shape[1], k.shape[2]
    group = h_ // hkv
    scale = d_**-0.5 if scale is None else scale
    q, k, v = q.double(), k.double(), v.double()
    out = torch.zeros(b_, h_, s_, v.shape[-1], dtype=torch.float64)
    for b in range(b_):
        for h in range(h_):
            g = h // group
            for i in range(s_):
                keys = [
                    j
                    for j in range(t_)
                    if (not causal or j <= i + t_ - s_)
                    and (document_ids is None or _doc(document_ids, b, t_ - s_ + i) == _doc(document_ids, b, j))
                ]
                idx = torch.tensor(keys)
                logits = (k[b, g, idx] @ q[b, h, i]) * scale
                if bias is not None:
                    logits = logits + bias[b if bias.shape[0] > 1 else 0, h, i, idx].double()
                w = torch.softmax(logits, dim=0)
                out[b, h, i] = w @ v[b, g, idx]
    return out


def _doc(ids, b, j):
    return int(ids[j] if ids.dim() == 1 else ids[b if ids.shape[0] > 1 else 0, j])
