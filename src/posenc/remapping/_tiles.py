"""Which tiles of keys a branch scores wholly, partly or not at all, per block of queries: the unmasked fast path of
``remap_attention``.

The keys are cut into tiles of ``block`` keys aligned so that each query block's own keys (its causal diagonal) form
one square tile; every earlier tile is wholly in the block's causal past. A branch whose region is a ``KeyInterval``
classifies each (query block, key tile) pair from the *actual* positions it holds -- the least and largest query and
key position -- and the region's bounds at them, never from indices: ``INSIDE`` (every pair belongs to the branch:
one kernel call without a mask), ``OUTSIDE`` (no pair does: skipped), ``BOUNDARY`` (masked, as before). On the
diagonal an ``INSIDE`` tile becomes ``CAUSAL`` (the kernel's own causal mask; square, so top-left and bottom-right
causality agree). Anything that may cut a tile unevenly -- a region that is not a ``KeyInterval``, documents, a
key mask, an explicit pair mask -- leaves it ``BOUNDARY`` unless that tile is proven uniform.

A branch whose region is ``j <= i - c`` for every query, over keys in order from position 0 (``causal_lag``: the
far branch of Self-Extend, ReRoPE and STRING in a prefill), needs no tiles at all: it is one square causal call over
the queries from ``c`` on and the first keys, as plain attention is shifted by ``c``. A band ``j > i - c``
(``causal_lead``: their near branch; DCA's first chunk) is plain causal attention for the queries before ``c``: one
causal call for the whole query blocks there, tiles for the rest.

Shapes:
    positions (B|1, N) -> per tile (B|1, n) (``tile_range``); q_lo, q_hi (B|1, nq), k_lo, k_hi (B|1, nk) ->
    states (nq, nk) int8 (``classify``); a row of states (nk,) -> calls [(state, start, stop)] (``calls``);
    q_pos (B|1, S), k_pos (B|1, T) -> int or None (``causal_lag``), int (``causal_lead``).
"""

from __future__ import annotations

import torch

from posenc.remapping._branch import KeyInterval, Region

OUTSIDE, INSIDE, BOUNDARY, CAUSAL = 0, 1, 2, 3


def key_pad(s: int, t: int, block: int) -> int:
    """How many keys a grid of ``block``-key tiles starts before key 0 so that the diagonal of each query block
    (keys ``r0 + T - S`` to ``r1 + T - S``, ``r0`` a multiple of ``block``) is one tile: the first tile is short."""
    return -(t - s) % block


def key_edges(s: int, t: int, block: int) -> list[int]:
    """Tile ``m`` is keys ``edges[m]`` to ``edges[m + 1]``."""
    pad = key_pad(s, t, block)
    return [min(max(m * block - pad, 0), t) for m in range((t + pad + block - 1) // block + 1)]


def diagonal_tile(r0: int, s: int, t: int, block: int) -> int:
    """The tile holding the keys of the query block starting at row ``r0`` (``r0`` a multiple of ``block``)."""
    return (r0 + t - s + key_pad(s, t, block)) // block


def tile_range(x: torch.Tensor, block: int, pad: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Least and largest value of each tile of ``block`` entries along the last dim, the first tile ``pad`` short.

    Shapes:
        x (..., N) -> lo, hi (..., ceil((N + pad) / block)).
    """
    n = x.shape[-1]
    right = -(n + pad) % block
    # Padding repeats the end values, which lie in the first and last tile: neither bound moves.
    x = torch.cat([x[..., :1].expand(*x.shape[:-1], pad), x, x[..., -1:].expand(*x.shape[:-1], right)], dim=-1)
    tiles = x.reshape(*x.shape[:-1], -1, block)  # (..., n, block)
    return tiles.amin(dim=-1), tiles.amax(dim=-1)


def classify(
    region: Region, q_lo: torch.Tensor, q_hi: torch.Tensor, k_lo: torch.Tensor, k_hi: torch.Tensor
) -> torch.Tensor:
    """``INSIDE``/``OUTSIDE``/``BOUNDARY`` for every (query block, key tile) pair: ``INSIDE`` only where every
    (query, key) pair of the tile, in every batch row, lies in the region, ``OUTSIDE`` where none does. Causality is
    not considered here (``apply_causality``). A region that is not a ``KeyInterval`` is ``BOUNDARY`` everywhere.

    With ``first`` and ``end`` nondecreasing, ``first(i) <= first(q_hi) <= k_lo <= j`` and ``j <= k_hi < end(q_lo)
    <= end(i)`` for every query position ``i`` and key position ``j`` of the tile; likewise for ``OUTSIDE``.

    Shapes:
        q_lo, q_hi (B|1, nq) per query block, k_lo, k_hi (B|1, nk) per key tile -> (nq, nk) int8.
    """
    nq, nk = q_lo.shape[-1], k_lo.shape[-1]
    if not isinstance(region, KeyInterval):
        return torch.full((nq, nk), BOUNDARY, dtype=torch.int8, device=q_lo.device)
    q_lo, q_hi = q_lo[:, :, None], q_hi[:, :, None]  # (B|1, nq, 1)
    k_lo, k_hi = k_lo[:, None, :], k_hi[:, None, :]  # (B|1, 1, nk)
    inside = torch.ones(1, nq, nk, dtype=torch.bool, device=q_lo.device)
    outside = torch.zeros(1, nq, nk, dtype=torch.bool, device=q_lo.device)
    if region.first is not None:
        inside = inside & (region.first(q_hi) <= k_lo)
        outside = outside | (k_hi < region.first(q_lo))
    if region.end is not None:
        inside = inside & (k_hi < region.end(q_lo))
        outside = outside | (region.end(q_hi) <= k_lo)
    inside, outside = inside.all(dim=0), outside.all(dim=0)  # every batch row alike: one kernel call serves all
    states = torch.where(outside, OUTSIDE, BOUNDARY)
    return torch.where(inside, INSIDE, states).to(torch.int8)


def apply_causality(states: torch.Tensor, diagonal: torch.Tensor) -> torch.Tensor:
    """Tiles after each block's diagonal ``OUTSIDE`` (the future), an ``INSIDE`` diagonal ``CAUSAL``.

    Shapes:
        states (nq, nk) int8, diagonal (nq,) integer (each block's diagonal tile) -> (nq, nk) int8.
    """
    tiles = torch.arange(states.shape[-1], device=states.device)[None, :]
    diagonal = diagonal[:, None]
    states = torch.where(tiles > diagonal, OUTSIDE, states)
    return torch.where((tiles == diagonal) & (states == INSIDE), CAUSAL, states).to(torch.int8)


def demote(states: torch.Tensor, uniform: torch.Tensor | None) -> torch.Tensor:
    """``INSIDE`` tiles that are not ``uniform`` (documents, key mask or pair mask may cut them) become
    ``BOUNDARY``; ``None``: nothing cuts any tile.

    Shapes:
        states (nq, nk) int8, uniform (nq, nk) bool -> (nq, nk) int8.
    """
    if uniform is None:
        return states
    return torch.where((states == INSIDE) & ~uniform, BOUNDARY, states).to(torch.int8)


def uniform_tiles(
    block: int,
    pad: int,
    offset: int,
    docs: torch.Tensor | None,
    keep: torch.Tensor | None,
    pairs: torch.Tensor | None,
) -> torch.Tensor | None:
    """Where nothing but the region and causality cuts a (query block, key tile) pair: every query and key of the
    tile in one document, every key kept, every pair allowed (``pairs`` holds on the diagonal only where it is
    True above it too, so a mask that includes causality leaves diagonals masked). ``None`` when none is given.

    Shapes:
        docs, keep (B|1, T), pairs (B|1, S, T) -> (nq, nk) bool, ``nq`` blocks of the ``S = T - offset`` queries.
    """
    out = None
    if docs is not None:
        q_lo, q_hi = tile_range(docs[:, offset:], block)  # the queries' documents: keys offset..T
        k_lo, k_hi = tile_range(docs, block, pad)
        one = (q_lo == q_hi)[:, :, None] & (k_lo == k_hi)[:, None, :] & (q_lo[:, :, None] == k_lo[:, None, :])
        out = one.all(dim=0)
    if keep is not None:
        kept = tile_range(keep, block, pad)[0].all(dim=0)  # (nk,)
        out = kept[None, :] if out is None else out & kept[None, :]
    if pairs is not None:
        rows = torch.stack([pairs[:, r0 : r0 + block].all(dim=1) for r0 in range(0, pairs.shape[1], block)], dim=1)
        per_tile = tile_range(rows, block, pad)[0].all(dim=0)  # (B|1, nq, T) -> (nq, nk)
        out = per_tile if out is None else out & per_tile
    return out


def calls(row: list[int], edges: list[int]) -> list[tuple[int, int, int]]:
    """One block's kernel calls for one branch: runs of equal state over its tiles, ``OUTSIDE`` dropped, as
    ``(state, first key, key past the last)``."""
    out: list[tuple[int, int, int]] = []
    for m, state in enumerate(row):
        if state == OUTSIDE:
            continue
        if out and out[-1][0] == state and out[-1][2] == edges[m] and state != CAUSAL:
            out[-1] = (state, out[-1][1], edges[m + 1])
        else:
            out.append((state, edges[m], edges[m + 1]))
    return out


def causal_lag(region: Region, q_pos: torch.Tensor, k_pos: torch.Tensor) -> int | None:
    """The ``c`` of a region that is ``j <= i - c`` (``KeyInterval(end=i - c + 1)``) at every query, where the keys
    sit at positions ``0..T-1`` in order and the ``S`` queries are the last of them, ``c >= T - S``: query row ``r``
    (at ``i = r + T - S``) then sees keys ``0..r - (c - T + S)``, a square causal attention of the rows from
    ``c - T + S`` over the first keys. None for any other region or positions (explicit, packed, per-row, decoding
    past ``c``). Read from the region's own bound at the actual positions, never assumed from the method."""
    if not isinstance(region, KeyInterval) or region.first is not None or region.end is None:
        return None
    s, t = q_pos.shape[-1], k_pos.shape[-1]
    if s == 0:
        return None
    if not _in_order(q_pos, k_pos):
        return None
    lag = q_pos + 1 - region.end(q_pos)  # (B|1, S): i - end(i) + 1, constant for such a region
    c = int(lag.reshape(-1)[0])
    if not bool((lag == c).all()) or c < t - s:
        return None
    return c


def causal_lead(region: Region, q_pos: torch.Tensor, k_pos: torch.Tensor, block: int) -> int:
    """How many leading query rows, in whole blocks, a ``KeyInterval`` leaves plain causal -- ``first(i) <= 0`` and
    ``end(i) > i``: every key up to the query's own -- where queries and keys are the same positions ``0..T-1`` in
    order (a prefill): those rows are one square causal call. 0 for any other region or positions."""
    if not isinstance(region, KeyInterval):
        return 0
    s, t = q_pos.shape[-1], k_pos.shape[-1]
    if s != t or s == 0 or not _in_order(q_pos, k_pos):
        return 0
    full = torch.ones(q_pos.shape, dtype=torch.bool, device=q_pos.device)  # (B|1, S)
    if region.first is not None:
        full &= region.first(q_pos) <= 0
    if region.end is not None:
        full &= region.end(q_pos) > q_pos
    rows = int(full.all(dim=0).to(torch.int64).cumprod(dim=0).sum())  # the leading run of such rows
    return rows // block * block


def _in_order(q_pos: torch.Tensor, k_pos: torch.Tensor) -> bool:
    """Keys at positions ``0..T-1`` in order in every row, the queries the last ``S`` of them."""
    s, t = q_pos.shape[-1], k_pos.shape[-1]
    order = torch.arange(t, device=k_pos.device).to(k_pos.dtype)
    return bool((k_pos == order).all()) and bool((q_pos == order[t - s :]).all())
