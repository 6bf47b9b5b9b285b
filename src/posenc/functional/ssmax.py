"""Scalable-Softmax (SSMax): each query scaled by ``s * log(n) + b``, n the number of keys it attends to.

Paper: Nakanishi 2025, "Scalable-Softmax Is Superior for Attention" (arXiv:2501.19399), against the "attention
fading" of a softmax over ``n`` scores:

    SSMax(z)_i = n^(s z_i) / sum_j n^(s z_j) = softmax((s log n) z)_i

with ``s`` learned per layer and head (and a learned bias ``b`` in the paper's variant): one multiplication of the
query by ``s log n + b`` before the usual ``q . k / sqrt(D)``. How ``n`` is counted: :func:`ssmax_key_count`;
numerics: :func:`ssmax_scale`; how it differs from Llama 4's temperature tuning: :func:`apply_ssmax`.

Reference implementation checked against: axolotl's merged SSMax (axolotl-ai-cloud/axolotl,
``src/axolotl/monkeypatch/scaled_softmax_attn.py``, commit 258ce8d4fa04c27ab49e169ba7751d8f4f1a423e, PR #3338):
a FlexAttention ``score_mod`` ``score * (s * log(clamp(position_ids + 1, min=2)) + b)`` with one number ``s`` and
one ``b`` (default 0) for the model, here one of each per head; ``tests/reference/ssmax.py`` writes it out in float64
and ``tests/encodings/test_ssmax.py`` compares on full tensors.

Shapes:
    positions (S,) or (B, S), integer or float; key_count (S,) or (B, S) integer; s and b each a number or a tensor
    () or (H,) -> factor (S,) / (B, S) / (H, S) / (B, H, S) float32 or float64 (``ssmax_scale``); q (B, H, S, D) ->
    q's shape and dtype.
"""

from __future__ import annotations

import torch

from posenc._checks import check_key_count, check_number, check_positions, check_positive_int, fail
from posenc.functional.rope import angle_dtype

#: The paper's Figure 1 value of ``s``, axolotl's default (``scaling_softmax_factor``) and posenc's initial ``s``.
S_INIT = 0.43


def ssmax_key_count(
    positions: torch.Tensor, *, window: int | None = None, key_count: torch.Tensor | None = None
) -> torch.Tensor:
    """``n``: the number of keys each query sees, at least 1: ``key_count`` where given (``posenc.attention``
    counts it from its mask), else that of a causal query at each position, ``p + 1``, capped at ``window``.

    ``posenc.attention`` counts the keys from its mask (causal, documents, chunks, window) and passes them as
    ``key_count=``. Without a count, ``n`` is read from the position: in causal attention the query at position ``p``
    (counted from 0 in its document, as packing and a KV cache give it) sees ``n = p + 1`` keys, and a sliding window
    of ``window`` keys caps it, ``n = min(p + 1, window)``. A query seeing one key gets the factor ``b`` (0 without a
    bias) and its single weight 1 either way; axolotl's ``clamp(..., min=2)`` only changes the factor of such a query,
    whose output it cannot change, so this follows the paper's ``log n`` there.

    Shapes:
        positions (S,) or (B, S); key_count (S,) or (B, S) -> (S,) or (B, S) float64 (float32 on MPS)
    """
    check_positions(positions)
    if window is not None:
        check_positive_int("window", window)
    wide = angle_dtype(positions.device, torch.float32)
    if key_count is not None:
        if window is not None:  # the count already holds what is masked; a second cap would contradict it
            fail("window", window, "None with key_count= (the count already holds every window and chunk)")
        return check_key_count(key_count, positions).to(wide).clamp(min=1.0)  # a fully masked query: as one key
    n = (positions.to(wide) + 1.0).clamp(min=1.0)  # a padded query (negative position) sees at least itself
    return n if window is None else n.clamp(max=float(window))


def ssmax_scale(
    positions: torch.Tensor,
    s: float | torch.Tensor,
    *,
    b: float | torch.Tensor = 0.0,
    window: int | None = None,
    dtype: torch.dtype = torch.float32,
    key_count: torch.Tensor | None = None,
) -> torch.Tensor:
    """``s * log(n) + b`` in ``dtype``: the factor of each query, per head when ``s`` or ``b`` is ``(H,)``.

    ``b`` (default 0) is the paper's variant with a learned bias per layer and head, the factor ``s log n + b``; 0 is
    the form it recommends, exactly the factor ``s log n``.

    Numerics: ``log n`` is taken in float64 (float32 on MPS) and rounded once to float32; the factor ``s log n`` (then
    ``+ b``, a second rounding) is float32 (``s`` and ``b`` are cast, so a bfloat16 model keeps its factor in float32
    and both still get a gradient), float64 for float64 queries. ``b=0`` (the number) adds nothing: the factor is bit
    for bit ``s log n``.

    Args:
        positions: query positions (exact: integer, float32 or float64), counted from 0 in each document.
        s: the scaling parameter, a number, a 0-d tensor or one per head ``(H,)`` (differentiable).
        b: the bias of the paper's variant "with bias", the same kinds as ``s``; the number 0 (default) adds nothing.
        window: sliding-window size in keys, or None for full causal attention (read with the positions only).
        dtype: float32 (default) or float64.
        key_count: the number of keys each query sees, as ``posenc.attention`` counts it from its mask (then
            ``window`` must be None); None: ``n`` from the positions and ``window`` (:func:`ssmax_key_count`).

    Shapes:
        positions (S,) or (B, S), key_count (S,) or (B, S): n (S,) or (B, S); s, b () -> n's shape; s or b (H,) ->
        (H, S) or (B, H, S); in ``dtype``
    """
    if dtype not in (torch.float32, torch.float64):
        fail("dtype", dtype, "torch.float32 or torch.float64")
    n = ssmax_key_count(positions, window=window, key_count=key_count)  # (S,) or (B, S)
    log_n = torch.log(n).to(dtype)  # (S,) or (B, S)
    s = _parameter("s", s, positions, dtype, "one scaling parameter per head")
    b = _parameter("b", b, positions, dtype, "one bias per head")
    if _heads(s, b) is not None:
        log_n = log_n.unsqueeze(-2)  # (1, S) or (B, 1, S): one row per head
    factor = log_n * _column(s)  # (S,), (B, S), (H, S) or (B, H, S)
    if isinstance(b, torch.Tensor) or b != 0.0:
        factor = factor + _column(b)
    return factor


def apply_ssmax(
    q: torch.Tensor,
    positions: torch.Tensor,
    s: float | torch.Tensor,
    *,
    b: float | torch.Tensor = 0.0,
    window: int | None = None,
    key_count: torch.Tensor | None = None,
) -> torch.Tensor:
    """Queries multiplied by :func:`ssmax_scale` (``s * log(n) + b``), ``n`` the keys each sees (``key_count``, or
    read from its position), in ``q``'s dtype.

    The factor multiplies ``q`` by torch's type promotion, then the result is cast back to ``q``'s dtype.

    Not Llama 4's temperature tuning (:mod:`posenc.functional.temperature`, which cites SSMax): Llama 4 multiplies the
    queries of its NoPE layers by the fixed ``log(1 + floor((p + 1) / floor_scale)) * attn_scale + 1`` -- 1 for the
    first ``floor_scale - 1`` positions, then growing in steps, and no learned parameter. SSMax's factor is
    ``s log(p + 1)`` at every position (below 1 for short contexts, so the logits are rescaled from the first token),
    with ``s`` learned, and is meant for every layer, with or without RoPE.

    Shapes:
        q (B, H, S, D) (or (H, S, D), (S, D) with positions (S,) and scalar ``s``, ``b``); positions (S,) or (B, S);
        key_count (S,) or (B, S); s, b () or (H,) -> q's shape
    """
    if not isinstance(q, torch.Tensor) or not q.is_floating_point() or q.dim() < 2:
        fail("q", getattr(q, "shape", type(q).__name__), "a floating point tensor (..., S, D)")
    dtype = torch.promote_types(q.dtype, torch.float32)  # float32, or float64 for float64 queries
    # (S,), (B, S), (H, S) or (B, H, S)
    scale = ssmax_scale(positions, s, b=b, window=window, dtype=dtype, key_count=key_count)
    heads = _heads(s, b)
    if heads is not None and (q.dim() < 3 or q.shape[-3] != heads[1]):
        fail(f"{heads[0]}.shape", (heads[1],), f"(H,) with H the heads of q (q.shape={tuple(q.shape)})")
    if heads is None and scale.dim() == 2:
        scale = scale.unsqueeze(-2)  # (B, S) -> (B, 1, S): the same factor for every head
    return (q * scale.unsqueeze(-1)).to(q.dtype)  # one factor per query row


def _parameter(name: str, x: float | torch.Tensor, positions: torch.Tensor, dtype: torch.dtype, what: str):  # noqa: ANN202
    """``x`` checked: a number (returned as a float), or a floating tensor () or (H,) on the positions' device, cast."""
    if not isinstance(x, torch.Tensor):
        return check_number(name, x)
    if not x.is_floating_point() or x.dim() > 1:
        fail(name, tuple(x.shape), f"a number, or a floating point tensor () or (H,): {what}")
    if x.device != positions.device:
        fail(f"{name}.device", x.device, f"the positions' device, {positions.device}")
    return x.to(dtype)


def _heads(s: float | torch.Tensor, b: float | torch.Tensor) -> tuple[str, int] | None:
    """``(name, H)`` of the first of ``s``, ``b`` given per head, or None; both per head must agree on H."""
    per_head = [(n, x.shape[0]) for n, x in (("s", s), ("b", b)) if isinstance(x, torch.Tensor) and x.dim() == 1]
    if len(per_head) == 2 and per_head[0][1] != per_head[1][1]:
        fail("b.shape", (per_head[1][1],), f"(H,) with the H={per_head[0][1]} of s.shape={(per_head[0][1],)}")
    return per_head[0] if per_head else None


def _column(x: float | torch.Tensor) -> float | torch.Tensor:
    """A per-head ``(H,)`` tensor as ``(H, 1)``, to broadcast over the positions; anything else as it is."""
    return x[:, None] if isinstance(x, torch.Tensor) and x.dim() == 1 else x
