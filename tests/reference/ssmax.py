"""Scalable-Softmax attention written out in float64, one query at a time, after axolotl's FlexAttention
``score_mod``, with ``n`` counted from the mask.

axolotl-ai-cloud/axolotl ``src/axolotl/monkeypatch/scaled_softmax_attn.py`` (commit
258ce8d4fa04c27ab49e169ba7751d8f4f1a423e, ``ssmax_flex_attention_forward``): each scaled score ``q . k * scale`` is
multiplied by ``s * log(n) + b`` with ``n = clamp(position_ids[q_idx] + 1, min=2)``, the query's position within its
packed sequence; then the mask and the softmax. axolotl has one ``s`` and one ``b`` for the model (``b`` a constant,
0 by default: the paper's recommended form); the paper (Nakanishi 2025, arXiv:2501.19399) learns ``s`` -- and, in
its variant with a bias, ``b`` -- per layer and head, so here each is one per head (a scalar repeats). Unlike axolotl
(``position_ids.view(-1)[q_idx]``, the first row's positions for every row), each batch row reads its own rows.

``n`` is the paper's: the number of keys the query sees, counted from the mask itself (``reference.key_count``:
causal, documents, chunks, window; sinks are not keys). For axolotl's rows -- positions from 0 in each packed
document, every key present, no window -- that is its ``position_ids + 1`` (its clamp to 2 only changes the factor
of a query that sees one key, whose output it cannot change).
"""

from __future__ import annotations

from reference.key_count import key_count_attention, ssmax_factor


def ssmax_attention(q, k, v, s, *, q_positions, k_positions=None, document_ids=None, scale=None, b=0.0, rope=None,
                    chunk_size=None, window=None, sinks=None):
    """q (B, H, S, D), k (B, Hkv, T, D), v (B, Hkv, T, Dv); s and b each (H,) or a number; positions (S,)/(B, S)
    and (T,)/(B, T); sinks (H,) or None; ``rope``: ``{"inv_freq": (F,), "layout": ..., "attention_factor": ...}`` or
    None -> (B, H, S, Dv) float64, differentiable in q, k, v and tensors ``s``, ``b``."""
    return key_count_attention(q, k, v, ssmax_factor(s, b), q_positions=q_positions, k_positions=k_positions,
                               document_ids=document_ids, chunk_size=chunk_size, window=window, sinks=sinks,
                               scale=scale, rope=rope)
