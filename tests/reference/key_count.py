"""Attention whose queries are scaled by a factor of ``n``, the number of keys each query sees, in float64, one query
at a time: SSMax (``s log n + b``, Nakanishi 2025, arXiv:2501.19399: ``n`` is the size of the softmax's input) and
Llama 4's temperature (``log(1 + floor(n / floor_scale)) * attn_scale + 1``, ``n = p + 1`` in its global NoPE
layers).

``n`` is counted from the mask itself: the keys a query is allowed, written out from first principles (and not
from posenc's code): the last S of T keys are the queries (causal: key j visible to query i iff j <= i + T - S); a
query sees only keys of its own document; with ``chunk_size`` C only keys in its chunk of positions,
``floor(q_pos / C) == floor(k_pos / C)``; with ``window`` W only keys with ``q_pos - W < k_pos`` (GPT-OSS's and
Mistral's sliding window). GPT-OSS's ``sinks`` (one logit per head) join each softmax's denominator and are not
counted in ``n``. Query head h reads key head h // (H / Hkv). RoPE, when given, rotates q and k before the scores
(``tests/reference/rope_float64.py``).
"""

from __future__ import annotations

import math

import torch

from reference.rope_float64 import rotate_float64


def visible_keys(i, *, b, s, t, causal=True, q_positions, k_positions, document_ids=None, chunk_size=None,
                 window=None):
    """The indices of the keys query ``i`` (of ``s``) of batch row ``b`` sees among ``t`` keys."""
    qp = float(_row(q_positions, b, i))
    keys = []
    for j in range(t):
        kp = float(_row(k_positions, b, j))
        if causal and j > i + t - s:
            continue
        if document_ids is not None and _row(document_ids, b, t - s + i) != _row(document_ids, b, j):
            continue
        if chunk_size is not None and math.floor(qp / chunk_size) != math.floor(kp / chunk_size):
            continue
        if window is not None and not qp - window < kp:
            continue
        keys.append(j)
    return keys


def key_count_attention(q, k, v, factor, *, q_positions, k_positions=None, causal=True, document_ids=None,
                        chunk_size=None, window=None, sinks=None, scale=None, rope=None):
    """q (B, H, S, D), k (B, Hkv, T, D), v (B, Hkv, T, Dv); ``factor(n, h)`` -> the query factor of head h for n
    keys (a float, or a 0-d float64 tensor to differentiate); positions (S,)/(B, S) and (T,)/(B, T); sinks (H,) or
    None; ``rope``: ``{"inv_freq": (F,), "layout": ..., "attention_factor": ...}`` or None
    -> (B, H, S, Dv) float64, differentiable in q, k, v and whatever ``factor`` reads."""
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
    rows = []
    for bi in range(b_):
        for i in range(s_):
            keys = visible_keys(i, b=bi, s=s_, t=t_, causal=causal, q_positions=q_positions, k_positions=k_positions,
                                document_ids=document_ids, chunk_size=chunk_size, window=window)
            idx = torch.tensor(keys)
            for h in range(h_):
                g = h // group
                logits = (k[bi, g, idx] @ q[bi, h, i]) * scale * factor(len(keys), h)
                if sinks is not None:
                    logits = torch.cat([logits, sinks[h].double().view(1)])
                weights = torch.softmax(logits, dim=0)[: len(keys)]
                rows.append(weights @ v[bi, g, idx])
    out = torch.stack(rows).view(b_, s_, h_, v.shape[-1])
    return out.transpose(1, 2)


def ssmax_factor(s, b=0.0):
    """SSMax's ``s[h] log n + b[h]``; ``s``, ``b`` numbers or (H,) tensors (differentiable)."""

    def per_head(x, h):
        return x[h].double() if isinstance(x, torch.Tensor) and x.dim() == 1 else x

    return lambda n, h: per_head(s, h) * math.log(n) + per_head(b, h)


def temperature_factor(floor_scale, attn_scale):
    """Llama 4's ``log(1 + floor(n / floor_scale)) * attn_scale + 1``."""
    return lambda n, h: math.log1p(math.floor(n / floor_scale)) * attn_scale + 1.0


def _row(x, b, j):
    return x[j] if x.dim() == 1 else x[b if x.shape[0] > 1 else 0, j]
