"""Attention temperature tuning (Llama 4's NoPE layers): queries scaled up with the log of their position.

Softmax over more keys spreads its weight thinner, so a layer without positional information (NoPE) attends ever
more uniformly as the context grows. Llama 4 counters this in its NoPE layers by multiplying each query by

    scale(p) = log(1 + floor((p + 1) / floor_scale)) * attn_scale + 1

at the query's position ``p``: 1 for the first ``floor_scale - 1`` positions, then rising in steps of
``floor_scale`` tokens, like the log-length factor of Scalable-Softmax (Nakanishi 2025, "Scalable-Softmax Is
Superior for Attention", arXiv:2501.19399, which Llama 4's code cites). Keys are unchanged.

Reference implementation checked against: transformers ``Llama4TextAttention.forward``
(``models/llama4/modeling_llama4.py``: ``attn_temperature_tuning``, ``floor_scale`` default 8192, ``attn_scale``
default 0.1), on full tensors in ``tests/encodings/test_nope_temperature.py``.

Shapes:
    positions (S,) or (B, S), integer or float; key_count (S,) or (B, S) integer -> scale (S,) or (B, S) float32;
    q (B, H, S, D) -> (B, H, S, D) in q's dtype.
"""

from __future__ import annotations

import torch

from posenc._checks import check_key_count, check_number, check_positions, fail
from posenc.functional.rope import angle_dtype


def attention_temperature(
    positions: torch.Tensor,
    *,
    floor_scale: float = 8192.0,
    attn_scale: float = 0.1,
    key_count: torch.Tensor | None = None,
) -> torch.Tensor:
    """``log1p(floor(n / floor_scale)) * attn_scale + 1`` in float32, one factor per query: ``n = positions + 1``
    (Llama 4), or ``key_count``, the keys each query sees, where given (``posenc.attention`` passes it).

    ``p + 1`` is the number of keys such a query sees in Llama 4's NoPE layers, which attend globally and causally
    over positions from 0. ``posenc.attention`` passes the number its mask leaves each query instead (``key_count=``:
    with documents, chunks or a window, which Llama 4 never puts on these layers, the temperature follows the keys the
    query sees, like SSMax's ``n``): ``log(1 + floor(n / floor_scale)) * attn_scale + 1``, the same in Llama 4's
    setting. The floor is taken in float64 (float32 on MPS), which gives transformers' float32 values bit for bit below
    2**24 and stays exact beyond.

    Args:
        positions: query positions, exact (integer, float32 or float64) and finite.
        floor_scale: tokens per step of the temperature (> 0); Llama 4 uses 8192.
        attn_scale: strength (>= 0; 0 turns the tuning off); Llama 4 uses 0.1.
        key_count: the number of keys each query sees, counted from attention's mask; None: ``positions + 1``.

    Shapes:
        positions (S,) or (B, S); key_count (S,) or (B, S) -> n's shape, float32
    """
    check_positions(positions)
    check_number("floor_scale", floor_scale, above=0.0)
    check_number("attn_scale", attn_scale, minimum=0.0)
    wide = angle_dtype(positions.device, torch.float32)
    n = positions.to(wide) + 1.0 if key_count is None else check_key_count(key_count, positions).to(wide)
    steps = torch.floor(n / float(floor_scale)).to(torch.float32)  # whole steps: exact
    return torch.log1p(steps) * float(attn_scale) + 1.0


def apply_temperature(
    q: torch.Tensor,
    positions: torch.Tensor,
    *,
    floor_scale: float = 8192.0,
    attn_scale: float = 0.1,
    key_count: torch.Tensor | None = None,
) -> torch.Tensor:
    """Queries multiplied by :func:`attention_temperature` (at their positions, or for ``key_count`` keys), in
    ``q``'s dtype.

    As transformers, the float32 scale multiplies ``q`` by torch's type promotion (so a bfloat16 ``q`` is scaled in
    float32 and rounded once), then the result is cast back to ``q``'s dtype.

    Shapes:
        q (B, H, S, D) (or (H, S, D), (S, D) with positions (S,)); positions (S,) or (B, S); key_count (S,) or
        (B, S) -> q's shape
    """
    if not isinstance(q, torch.Tensor) or not q.is_floating_point() or q.dim() < 2:
        fail("q", getattr(q, "shape", type(q).__name__), "a floating point tensor (..., S, D)")
    # (S,) or (B, S)
    scale = attention_temperature(positions, floor_scale=floor_scale, attn_scale=attn_scale, key_count=key_count)
    batched = scale.dim() == 2
    scale = scale.unsqueeze(-1)  # (S, 1) or (B, S, 1): one factor per query row
    if batched:
        scale = scale.unsqueeze(-3)  # (B, 1, S, 1): the same factor for every head
    return (q * scale).to(q.dtype)
