"""Learned relative position biases as pure functions of tensors: T5's bucketed bias and Shaw et al.'s embeddings.

T5: Raffel et al. 2020, "Exploring the Limits of Transfer Learning with a Unified Text-to-Text Transformer"
(JMLR, arXiv:1910.10683), Sec. 2.1: one learned scalar per (bucket of ``k - q``, head) added to the scores.
Reference implementation checked against: Hugging Face transformers ``T5Attention._relative_position_bucket``
and ``T5Attention.compute_bias`` (from Mesh TensorFlow's ``_relative_position_bucket``), bit for bit.

Shaw: Shaw, Uszkoreit, Vaswani 2018, "Self-Attention with Relative Position Representations" (NAACL,
arXiv:1803.02155): learned vectors ``w^K_r``, ``w^V_r`` for the clipped distance ``r = clip(j - i, -K, K)``, shared
by all heads, enter as ``e_ij = q_i . (k_j + w^K_r) * scale`` and ``z_i = sum_j alpha_ij (v_j + w^V_r)``
(``shaw_bias``, ``shaw_value_term``: neither builds an ``(S, T, D)`` tensor). Checked against the formulas written
out with explicit ``(S, T, D)`` tensors in ``tests/reference/shaw.py``.

Shapes:
    B batch, H heads, S queries, T keys, D head dim, K = max_distance (Shaw).
    q_pos (S,) or (B, S), k_pos (T,) or (B, T)   integer dtype; ``B`` may be 1
    relative position, bucket, index            (S, T) or (B, S, T) int64: ``k_pos - q_pos``
    T5 table                                    (num_buckets, H), the layout of ``nn.Embedding(num_buckets, H)``
    Shaw tables w^K, w^V                        (2K + 1, D), row ``r + K`` for distance ``r``
    bias                                        (B|1, H, S, T), float32 (float64 for float64 inputs)
"""

from __future__ import annotations

import math
from typing import cast

import torch

from posenc._checks import check_number, check_positive_int, fail


def check_integer_positions(positions: object, name: str = "positions") -> torch.Tensor:
    """Positions indexing learned relative tables are integers, ``(S,)`` or ``(B, S)``."""
    if not isinstance(positions, torch.Tensor):
        fail(name, type(positions).__name__, "a torch.Tensor of integer positions, shape (S,) or (B, S)")
    if positions.is_floating_point() or positions.is_complex() or positions.dtype == torch.bool:
        fail(f"{name}.dtype", positions.dtype, "an integer dtype (learned relative tables are indexed by distance)")
    if positions.dim() not in (1, 2):
        fail(f"{name}.shape", tuple(positions.shape), "(S,) or (B, S)")
    return positions


def check_position_pair(q_pos: object, k_pos: object) -> None:
    """Integer ``(S,)``/``(B, S)`` query and ``(T,)``/``(B, T)`` key positions on one device, batch sizes that
    broadcast."""
    q_pos = check_integer_positions(q_pos, "q_pos")
    k_pos = check_integer_positions(k_pos, "k_pos")
    if k_pos.device != q_pos.device:
        fail("k_pos.device", k_pos.device, f"q_pos's device, {q_pos.device}")
    batches = (q_pos.shape[0], k_pos.shape[0])
    if q_pos.dim() == k_pos.dim() == 2 and 1 not in batches and batches[0] != batches[1]:
        fail("k_pos.shape", tuple(k_pos.shape), f"a batch size of 1 or {q_pos.shape[0]} (q_pos's)")


def relative_positions(q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
    """``k_pos - q_pos`` for every (query, key) pair, in int64 (no unsigned wrap-around).

    Shapes:
        q_pos (S,) or (B|1, S), k_pos (T,) or (B|1, T) -> (S, T) when both are 1-D, else (B|1, S, T)
    """
    check_position_pair(q_pos, k_pos)
    return k_pos.long()[..., None, :] - q_pos.long()[..., :, None]  # (..., S, T)


# ---------------------------------------------------------------------------------------------------------------
# T5


def t5_exact_buckets(num_buckets: int, *, bidirectional: bool) -> int:
    """How many buckets per direction hold one distance each (T5: half of a direction's buckets)."""
    return (num_buckets // 2 if bidirectional else num_buckets) // 2


def check_t5_buckets(*, num_buckets: int, max_distance: int, bidirectional: bool) -> None:
    """Settings for which T5's bucketing is well defined (HF silently returns garbage buckets otherwise)."""
    if not isinstance(bidirectional, bool):
        fail("bidirectional", bidirectional, "True (encoder) or False (decoder / causal)")
    check_positive_int("num_buckets", num_buckets)
    exact = t5_exact_buckets(num_buckets, bidirectional=bidirectional)
    if exact < 1:
        least = 4 if bidirectional else 2
        fail("num_buckets", num_buckets, f"an integer >= {least} with bidirectional={bidirectional}")
    check_positive_int("max_distance", max_distance)
    if max_distance <= exact:
        fail("max_distance", max_distance, f"an integer > {exact}, the number of exact-distance buckets")


def t5_relative_position_bucket(
    relative_position: torch.Tensor, *, bidirectional: bool = True, num_buckets: int = 32, max_distance: int = 128
) -> torch.Tensor:
    """T5's bucket of each relative position ``key_pos - query_pos``, in ``[0, num_buckets)``.

    Per direction (both when ``bidirectional``, with ``k > q`` in the upper half of the buckets; only ``k <= q``
    otherwise, later keys sharing distance 0's bucket), half of the buckets hold the distances ``0 .. exact - 1``
    one each and the rest split ``[exact, max_distance)`` logarithmically; farther distances share the last bucket.
    Equal to Hugging Face's ``T5Attention._relative_position_bucket`` on every input.

    Shapes:
        relative_position (...) integer -> (...) int64
    """
    if not isinstance(relative_position, torch.Tensor):
        fail("relative_position", type(relative_position).__name__, "an integer tensor of key_pos - query_pos")
    if relative_position.is_floating_point() or relative_position.is_complex() or relative_position.dtype == torch.bool:
        fail("relative_position.dtype", relative_position.dtype, "an integer dtype (key_pos - query_pos)")
    check_t5_buckets(num_buckets=num_buckets, max_distance=max_distance, bidirectional=bidirectional)
    relative_position = relative_position.long()
    buckets: torch.Tensor | int = 0
    if bidirectional:
        num_buckets //= 2
        buckets = (relative_position > 0).long() * num_buckets
        distance = relative_position.abs()
    else:
        distance = -torch.clamp(relative_position, max=0)
    exact = num_buckets // 2
    # HF's expression in HF's order (bit-equal buckets); the clamp keeps log(0) -> -inf -> int casts out of the
    # branch the `where` discards anyway.
    log_ratio = torch.log(distance.clamp(min=exact).float() / exact) / math.log(max_distance / exact)
    large = exact + (log_ratio * (num_buckets - exact)).long()
    large = torch.clamp(large, max=num_buckets - 1)
    return buckets + torch.where(distance < exact, distance, large)


def t5_bias(
    q_pos: torch.Tensor,
    k_pos: torch.Tensor,
    table: torch.Tensor,
    *,
    bidirectional: bool = True,
    num_buckets: int = 32,
    max_distance: int = 128,
) -> torch.Tensor:
    """T5's relative attention bias ``table[bucket(k_pos - q_pos), h]``.

    With ``q_pos = arange(S) + past``, ``k_pos = arange(T)`` this is HF's ``compute_bias(S, T, past_seen_tokens=
    past)``; ``bidirectional`` is HF's ``not config.is_decoder``.

    Shapes:
        q_pos (S,) or (B, S), k_pos (T,) or (B, T), table (num_buckets, H) -> (B|1, H, S, T),
        float32 (float64 for a float64 table)
    """
    if not isinstance(table, torch.Tensor) or table.dim() != 2 or table.shape[0] != num_buckets:
        shape = tuple(table.shape) if isinstance(table, torch.Tensor) else table
        fail("table.shape", shape, f"({num_buckets}, H): nn.Embedding(num_buckets, num_heads).weight")
    rel = relative_positions(q_pos, k_pos)
    buckets = t5_relative_position_bucket(
        rel, bidirectional=bidirectional, num_buckets=num_buckets, max_distance=max_distance
    )
    buckets = buckets if buckets.dim() == 3 else buckets.unsqueeze(0)  # (B|1, S, T)
    heads = torch.arange(table.shape[1], device=table.device)[:, None, None]  # (H, 1, 1)
    per_head = table.t().to(torch.promote_types(table.dtype, torch.float32))  # (H, num_buckets)
    return per_head[heads, buckets.to(table.device)[:, None]]  # (H,1,1) x (B|1,1,S,T) -> (B|1, H, S, T), contiguous


# ---------------------------------------------------------------------------------------------------------------
# Shaw et al.


def shaw_relative_index(q_pos: torch.Tensor, k_pos: torch.Tensor, *, max_distance: int) -> torch.Tensor:
    """Row of the Shaw tables for each pair: ``clip(k_pos - q_pos, -K, K) + K`` in ``[0, 2K]``.

    Shapes:
        q_pos (S,) or (B, S), k_pos (T,) or (B, T) -> (S, T) or (B|1, S, T) int64
    """
    check_positive_int("max_distance", max_distance)
    return relative_positions(q_pos, k_pos).clamp(-max_distance, max_distance) + max_distance


def _shaw_max_distance(table: object, name: str) -> int:
    """``K`` from a ``(2K + 1, D)`` table."""
    if not isinstance(table, torch.Tensor) or table.dim() != 2 or table.shape[0] % 2 != 1 or table.shape[0] < 3:
        shape = tuple(table.shape) if isinstance(table, torch.Tensor) else table
        fail(f"{name}.shape", shape, "(2K + 1, head_dim) with K >= 1, one row per clipped distance -K..K")
    return (table.shape[0] - 1) // 2


def shaw_query_scores(q: torch.Tensor, table: torch.Tensor, *, scale: float) -> torch.Tensor:
    """``scale * q . w^K_r`` for every query and every distance ``r``: the only q-sized work in Shaw's key term.

    Shapes:
        q (B, H, S, D), table (2K + 1, D) -> (B, H, S, 2K + 1), float32 (float64 for float64 q)
    """
    dtype = torch.promote_types(q.dtype, torch.float32)
    return (q.to(dtype) @ table.to(dtype).t()) * scale  # (B, H, S, 2K + 1)


def check_shaw_query(q: object, q_pos: object, k_pos: object, table: object) -> int:
    """Validate the inputs of Shaw's key term without building anything; returns ``K`` (from the table)."""
    k_max = _shaw_max_distance(table, "table")
    table = cast(torch.Tensor, table)  # checked by _shaw_max_distance
    if not isinstance(q, torch.Tensor):
        fail("q", q, "the queries, a tensor of shape (B, H, S, head_dim): Shaw's bias is q . w^K")
    if q.dim() != 4:
        fail("q.shape", tuple(q.shape), "(B, H, S, head_dim)")
    if q.shape[-1] != table.shape[1]:
        fail("q.shape[-1]", q.shape[-1], f"head_dim = {table.shape[1]}, the width of the relative key table")
    check_position_pair(q_pos, k_pos)
    q_pos, k_pos = cast(torch.Tensor, q_pos), cast(torch.Tensor, k_pos)  # checked by check_position_pair
    batch, length = q.shape[0], q.shape[2]
    if q_pos.shape[-1] != length or (q_pos.dim() == 2 and q_pos.shape[0] not in (1, batch)):
        fail("q_pos.shape", tuple(q_pos.shape), f"({length},) or ({batch}, {length}), one position per query")
    if k_pos.dim() == 2 and k_pos.shape[0] not in (1, batch):
        fail("k_pos.shape", tuple(k_pos.shape), f"(T,) or ({batch}, T), a batch size of 1 or {batch}")
    return k_max


def _batched(index: torch.Tensor) -> torch.Tensor:
    return index if index.dim() == 3 else index.unsqueeze(0)  # (B|1, S, T)


def shaw_bias(
    q: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor, table: torch.Tensor, *, scale: float | None = None
) -> torch.Tensor:
    """Shaw's key term ``scale * q_i . w^K_{clip(k_j - q_i)}``, to add to ``scale * q . k``.

    ``q . w^K_r`` is ``q @ w^K.T`` ``(B, H, S, 2K+1)`` (``shaw_query_scores``) gathered by distance.

    ``K`` is read from the table. ``scale`` defaults to ``1 / sqrt(D)``. Memory: ``(B, H, S, 2K+1)`` plus the
    output; never ``(S, T, D)``.

    Shapes:
        q (B, H, S, D), q_pos (S,) or (B, S), k_pos (T,) or (B, T), table (2K + 1, D) -> (B, H, S, T)
    """
    k_max = check_shaw_query(q, q_pos, k_pos, table)
    scale = q.shape[-1] ** -0.5 if scale is None else check_number("scale", scale)
    index = _batched(shaw_relative_index(q_pos, k_pos, max_distance=k_max))  # (B|1, S, T)
    qr = shaw_query_scores(q, table, scale=scale)  # (B, H, S, 2K + 1)
    b, h, s, _ = q.shape
    index = index.to(q.device)[:, None].expand(b, h, s, index.shape[-1])  # (B, H, S, T), a view
    return torch.gather(qr, -1, index)  # (B, H, S, T)


def shaw_value_term(
    weights: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor, table: torch.Tensor
) -> torch.Tensor:
    """Shaw's value term ``sum_j weights_ij w^V_{clip(k_j - q_i)}``, to add to ``weights @ v``.

    The weights are first summed per clipped distance ``(B, H, S, 2K+1)`` (a scatter-add), then mixed by ``w^V``.

    Shapes:
        weights (B, H, S, T), q_pos (S,) or (B, S), k_pos (T,) or (B, T), table (2K + 1, Dv) -> (B, H, S, Dv),
        float32 (float64 for float64 weights)
    """
    k_max = _shaw_max_distance(table, "table")
    if not isinstance(weights, torch.Tensor) or weights.dim() != 4:
        shape = tuple(weights.shape) if isinstance(weights, torch.Tensor) else weights
        fail("weights.shape", shape, "(B, H, S, T) attention weights")
    b, h, s, t = weights.shape
    check_position_pair(q_pos, k_pos)
    for name, pos, length in (("q_pos", q_pos, s), ("k_pos", k_pos, t)):
        if pos.shape[-1] != length or (pos.dim() == 2 and pos.shape[0] not in (1, b)):
            fail(f"{name}.shape", tuple(pos.shape), f"({length},) or ({b}, {length}) for weights (B, H, S, T)")
    index = _batched(shaw_relative_index(q_pos, k_pos, max_distance=k_max))  # (B|1, S, T)
    dtype = torch.promote_types(weights.dtype, torch.float32)
    index = index.to(weights.device)[:, None].expand(b, h, s, t)  # (B, H, S, T), a view
    mass = weights.new_zeros(b, h, s, table.shape[0], dtype=dtype)
    mass = mass.scatter_add(-1, index, weights.to(dtype))  # (B, H, S, 2K + 1): weight per clipped distance
    return mass @ table.to(dtype)  # (B, H, S, Dv)
