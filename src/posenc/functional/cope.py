"""Contextual Position Encoding (CoPE) as pure functions of queries, keys and a position table.

Paper: Golovneva, Wang, Weston, Sukhbaatar 2024, "Contextual Position Encoding: Learning to Count What's Important"
(arXiv:2405.18719), Sec. 3. A query counts the keys it finds relevant instead of the tokens: for query ``i`` and
key ``j <= i``

    g_ij = sigmoid(q_i . k_j)                                          gates (Eq. 3)
    p_ij = min(sum_{t=j..i} g_it, p_max)                               fractional positions (Eq. 4, clipped)
    e[p] = (p - floor p) e[ceil p] + (1 - p + floor p) e[floor p]      interpolated embedding (Eq. 5)
    z_ij = q_i . (k_j + e[p_ij])                                       attention logit (Eq. 6)

Reference implementation checked against: facebookresearch/RAM ``projects/cope/src/cope/context_position.py``
(``ContextPosSelfAttn``, default options), whose scaling the paper leaves out (``cope_gates``, ``cope_bias``); the
equations are written out with explicit loops in ``tests/reference/cope.py``.

Shapes:
    q (B, H, S, D); k (B, Hkv, T, D) with H a multiple of Hkv (query head h reads key head h // (H / Hkv));
    queries are the last S of the T keys (query i sits at key index i + T - S);
    mask (B|1, 1|H, S, T) bool, True where a query may see a key; the causal mask is always applied on top;
    embeddings (p_max + 1, D) shared by every head, or (H, p_max + 1, D) one table per head;
    gates, positions, bias (B, H, S, T) float32 (float64 for float64 q).
"""

from __future__ import annotations

from typing import cast

import torch

from posenc._checks import broadcasts_to, check_number, fail


def check_cope_inputs(q: object, k: object, mask: object = None) -> None:
    """``q (B, H, S, D)``, ``k (B, Hkv, T, D)`` on one device, ``H % Hkv == 0``, ``S <= T``, and a boolean ``mask``
    broadcasting to ``(B, H, S, T)`` (or None)."""
    for name, x in (("q", q), ("k", k)):
        if not isinstance(x, torch.Tensor) or x.dim() != 4 or not x.is_floating_point():
            shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            fail(f"{name}.shape", shape, "a floating-point tensor (B, heads, length, head_dim): CoPE's gates are "
                 "sigmoid(q . k)")
    q, k = cast(torch.Tensor, q), cast(torch.Tensor, k)  # both checked by the loop
    b, h, s, d = q.shape
    if k.shape[0] != b or k.shape[-1] != d:
        fail("k.shape", tuple(k.shape), f"({b}, Hkv, T, {d}): q's batch size and head_dim")
    if k.shape[1] == 0 or h % k.shape[1] != 0:
        fail("k.shape[1]", k.shape[1], f"a number of key heads that divides the {h} query heads")
    if s > k.shape[2]:
        fail("q.shape[2]", s, f"at most the number of keys, {k.shape[2]} (queries are the last keys)")
    if k.device != q.device:
        fail("k.device", k.device, f"q's device, {q.device}")
    if mask is None:
        return
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
        fail("mask", getattr(mask, "dtype", type(mask).__name__), "a torch.bool tensor, True where a key is visible")
    target = (b, h, s, k.shape[2])
    if mask.dim() != 4 or not broadcasts_to(mask.shape, target):
        fail("mask.shape", tuple(mask.shape), f"4 dimensions broadcasting to (B, H, S, T) = {target}")
    if mask.device != q.device:
        fail("mask.device", mask.device, f"q's device, {q.device}")


def causal_mask(s: int, t: int, *, device: torch.device | str | None = None) -> torch.Tensor:
    """``(1, 1, S, T)`` bool: query ``i`` (key index ``i + T - S``) sees keys ``0 .. i + T - S``."""
    i = torch.arange(s, device=device)[:, None]
    j = torch.arange(t, device=device)[None, :]
    return (j <= i + (t - s))[None, None]


def _visible(q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """The causal mask, and ``mask`` if given: ``(B|1, 1|H, S, T)`` bool."""
    causal = causal_mask(q.shape[2], k.shape[2], device=q.device)
    return causal if mask is None else causal & mask


def _scale(q: torch.Tensor, scale: float | None) -> float:
    return q.shape[-1] ** -0.5 if scale is None else check_number("scale", scale)


def cope_gates(
    q: torch.Tensor, k: torch.Tensor, *, scale: float | None = None, mask: torch.Tensor | None = None
) -> torch.Tensor:
    """``g_ij = sigmoid(scale * q_i . k_j)`` where query ``i`` sees key ``j``, 0 elsewhere.

    ``scale`` defaults to ``1 / sqrt(D)`` (the reference's). Grouped-query keys are read per query group, never
    repeated.

    As the reference (the paper leaves it out), the gate logit is the scaled attention logit, ``sigmoid(q . k /
    sqrt(D))``; here ``scale`` (the attention's) replaces ``1 / sqrt(D)``. Gates of keys a query may not see are zeroed
    before the reverse cumulative sum (``cope_positions``), so a query never counts another document's tokens or the
    future.

    Shapes:
        q (B, H, S, D), k (B, Hkv, T, D), mask (B|1, 1|H, S, T) bool or None -> (B, H, S, T),
        float32 (float64 for float64 q)
    """
    check_cope_inputs(q, k, mask)
    return _gates(q, k, _scale(q, scale), _visible(q, k, mask))


def _gates(q: torch.Tensor, k: torch.Tensor, scale: float, visible: torch.Tensor) -> torch.Tensor:
    dtype = torch.promote_types(q.dtype, torch.float32)
    b, h, s, d = q.shape
    hkv, t = k.shape[1], k.shape[2]
    grouped = q.to(dtype).reshape(b, hkv, h // hkv, s, d)  # (B, Hkv, r, S, D): query head g * r + i -> (g, i)
    logits = (grouped @ k.to(dtype).unsqueeze(2).transpose(-1, -2)).reshape(b, h, s, t)  # (B, H, S, T)
    return torch.sigmoid(logits * scale) * visible  # masked keys count 0


def cope_positions(
    q: torch.Tensor,
    k: torch.Tensor,
    *,
    max_position: int,
    scale: float | None = None,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """``p_ij = min(sum_{t=j..i} g_it, max_position)``: how many keys from ``j`` to the query itself it counts.

    Entries a query does not see hold the clipped count of the visible keys after them (0 for future keys).

    With every gate 1, ``p_ij = i - j + 1``: token-based relative positions.

    Shapes:
        q (B, H, S, D), k (B, Hkv, T, D), mask (B|1, 1|H, S, T) bool or None -> (B, H, S, T) in [0, max_position],
        float32 (float64 for float64 q)
    """
    check_cope_inputs(q, k, mask)
    _check_max_position(max_position)
    return _positions(_gates(q, k, _scale(q, scale), _visible(q, k, mask)), max_position)


def _check_max_position(max_position: object) -> int:
    if isinstance(max_position, bool) or not isinstance(max_position, int) or max_position < 1:
        fail("max_position", max_position, "an integer >= 1, the largest position p_max (the table has p_max + 1 rows)")
    return max_position


def _positions(gates: torch.Tensor, max_position: int) -> torch.Tensor:
    # Reverse cumulative sum over keys, as the reference does (flip, cumsum, flip): a difference of prefix sums
    # would cancel catastrophically for long rows.
    counts = gates.flip(-1).cumsum(-1).flip(-1)  # (B, H, S, T): sum over t >= j of the visible gates
    return counts.clamp(max=max_position)


def interpolate_logits(logits: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """``(p - floor p) logits[ceil p] + (1 - p + floor p) logits[floor p]`` along the last axis (Eq. 7).

    Differentiable in ``logits`` and in ``positions`` (through the weight ``p - floor p``; ``floor``/``ceil`` only
    pick rows), as in the reference.

    Shapes:
        logits (B, H, S, P + 1), positions (B, H, S, T) in [0, P] -> (B, H, S, T)
    """
    floor = positions.detach().floor()
    weight = positions - floor  # (B, H, S, T): the gradient to the gates flows through here
    low = logits.gather(-1, floor.long())
    high = logits.gather(-1, positions.detach().ceil().long())
    return high * weight + low * (1 - weight)


def check_cope_table(embeddings: object, q: torch.Tensor) -> int:
    """``embeddings`` must be ``(p_max + 1, D)`` or ``(H, p_max + 1, D)`` on q's device, ``p_max >= 1``; returns
    ``p_max``."""
    h, d = q.shape[1], q.shape[-1]
    ok = isinstance(embeddings, torch.Tensor) and embeddings.is_floating_point() and embeddings.shape[-1] == d
    table = cast(torch.Tensor, embeddings)  # a tensor wherever ok holds
    ok = ok and (table.dim() == 2 or (table.dim() == 3 and table.shape[0] == h))
    if not ok or table.shape[-2] < 2:
        shape = tuple(embeddings.shape) if isinstance(embeddings, torch.Tensor) else type(embeddings).__name__
        fail("embeddings.shape", shape, f"(p_max + 1, {d}) shared by the heads or ({h}, p_max + 1, {d}) per head, "
             "with p_max >= 1, a floating-point table")
    if table.device != q.device:
        fail("embeddings.device", table.device, f"q's device, {q.device}")
    return table.shape[-2] - 1


def cope_bias(
    q: torch.Tensor,
    k: torch.Tensor,
    embeddings: torch.Tensor,
    *,
    scale: float | None = None,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """CoPE's term ``scale * q_i . e[p_ij]``, to add to ``scale * q . k``; 0 where a query does not see a key.

    ``p_max`` is read from the table (``embeddings.shape[-2] - 1``). ``scale`` (default ``1 / sqrt(D)``) scales
    both the gate logits and this term, as the reference's ``1 / sqrt(D)`` does. Memory: a few ``(B, H, S, T)``
    tensors and ``(B, H, S, min(p_max, T) + 1)``; never ``(S, T, D)``.

    As the reference, the position term is scaled with the logit, ``(q . k + q . e[p]) / sqrt(D)``. ``q_i . e[p]`` is
    computed for the integer positions ``0 .. p_max`` first, ``(B, H, S, p_max + 1)``, and the logits are interpolated
    (Eq. 7 of the paper, ``interpolate_logits``): no ``(S, T, D)`` tensor.

    Shapes:
        q (B, H, S, D), k (B, Hkv, T, D), embeddings (p_max + 1, D) or (H, p_max + 1, D),
        mask (B|1, 1|H, S, T) bool or None -> (B, H, S, T), float32 (float64 for float64 q)
    """
    check_cope_inputs(q, k, mask)
    max_position = check_cope_table(embeddings, q)
    scale = _scale(q, scale)
    visible = _visible(q, k, mask)
    positions = _positions(_gates(q, k, scale, visible), max_position)  # (B, H, S, T)
    dtype = positions.dtype
    # A count never exceeds the number of keys T: rows past it cannot be read, so they are not computed.
    table = embeddings[..., : min(max_position, k.shape[2]) + 1, :].to(dtype)  # (P', D) or (H, P', D)
    logits = q.to(dtype) @ table.transpose(-1, -2)  # (B, H, S, P'): q_i . e[p] at the integer positions
    return (interpolate_logits(logits, positions) * scale).masked_fill(~visible, 0.0)
