"""``remap_attention``: one attention for every remapping method, in query blocks, without an L x L matrix.

Each branch of the method rotates the queries and keys at its own positions (``encoding.rotate``, so every RoPE
variant and scaling posenc has applies: a YaRN-scaled Self-Extend is ``encoding=build("rope", scaling=yarn)``).
Queries are processed ``block`` rows at a time; for each block and branch only the span of keys that the branch's
region touches is scored (a window for the neighbour branches, the far past for the grouped ones), and the
branches are merged exactly: each keeps its row maximum ``m``, its sum of ``exp(s - m)`` and its weighted values,
and the merge rescales them to one common maximum -- the same numbers as one softmax over every scored key
(Milakov & Gimelshein 2018, "Online normalizer calculation for softmax"; FlashAttention's merge). Memory is
``O(block * T)`` per branch, linear in the length.

Only the tiles of keys a branch's region cuts are masked: keys come in tiles of ``block``, each query block's diagonal
one square tile, and a branch whose region is a ``KeyInterval`` (every built-in method's) sorts each (query block, key
tile) pair from the least and largest positions in it (``posenc.remapping._tiles``): wholly inside the region and
uncut by documents, key mask or pair mask -> one kernel call without a mask (the kernel's own causal mask on the
diagonal), wholly outside -> skipped, anything else -> masked as a whole run. The calls of a branch are merged like
branches, so the result is the same softmax. On the fused CPU path, where positions are the indices and nothing
else cuts the pairs, a branch that is causal attention shifted by a lag (``j <= i - c``: the far keys of
Self-Extend, ReRoPE, STRING) is one causal call for all its queries, and a branch's first query blocks that see
every earlier key (a window's queries nearer the start than its width; DCA's first chunk) one causal call
(``_tiles.causal_lag``, ``_tiles.causal_lead``): the long calls plain attention makes, where most of the pairs are.

Masks are built from indices as in ``posenc.attention``: queries are the last ``S`` of the ``T`` keys, query index
``a`` sees key index ``b <= a + T - S``; the method's regions are functions of *positions* (which default to the
indices), so KV-cache decoding, chunked prefill and packed rows are "pass the right positions".

Shapes:
    q (B, H, S, D), k (B, Hkv, T, D), v (B, Hkv, T, Dv), Hkv dividing H; positions (S,)/(B, S) and (T,)/(B, T);
    document_ids (T,)/(B, T); key_mask (B, T) bool; mask (S, T)/(B, S, T) bool; seq_len () or (T,)/(B, T)
    -> output (B, H, S, Dv) in q's dtype.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from posenc._checks import check_choice, check_positions, check_positive_int, check_same_device, fail
from posenc.documents import document_lengths
from posenc.encodings.rotary import RotaryEmbedding, check_seq_len
from posenc.remapping._branch import Branch, RemapMethod
from posenc.remapping._tiles import (
    BOUNDARY,
    CAUSAL,
    apply_causality,
    calls,
    causal_lag,
    causal_lead,
    classify,
    demote,
    diagonal_tile,
    key_edges,
    key_pad,
    tile_range,
    uniform_tiles,
)

#: Query rows per block, and keys per tile. Per block and branch: a ``block x span`` float32 mask over the tiles the
#: region cuts (at most 16 MiB at 16k keys; a tile or two for the built-in methods), and on the ``eager`` path the
#: ``B * H * block * span`` scores (151 MiB for SmolLM2's 9 heads at 16k keys); the ``sdpa`` path's fused kernel
#: keeps its scores in tiles.
DEFAULT_BLOCK = 256

BACKENDS = ("auto", "sdpa", "eager")

#: What ``span_dtype`` may be.
SPAN_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)

# PyTorch's CPU flash-attention kernel returns the log-sum-exp the exact merge needs (public SDPA does not).
_CPU_FLASH: Any = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


def remap_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    method: RemapMethod,
    encoding: RotaryEmbedding,
    q_positions: torch.Tensor | None = None,
    k_positions: torch.Tensor | None = None,
    document_ids: torch.Tensor | None = None,
    key_mask: torch.Tensor | None = None,
    mask: torch.Tensor | None = None,
    seq_len: int | float | torch.Tensor | None = None,
    scale: float | None = None,
    block: int = DEFAULT_BLOCK,
    backend: str = "auto",
    span_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """Causal attention in which each (query, key) pair is scored by the method's branch for it.

    Args:
        q, k, v: queries, keys and values, *not rotated*; see Shapes. Same dtype and device.
        method: a remapping method (``SelfExtend``, ``DualChunk``, ``ReRoPE``, ``LMInfinite``, or your own
            ``RemapMethod``).
        encoding: the ``RotaryEmbedding`` (any layout, partial rotary, scaling) every branch rotates with.
        q_positions, k_positions: positions, integer (the methods' regions compare them exactly). Defaults: keys
            ``arange(T)``, queries the last ``S`` of them.
        document_ids: packed rows: a document id per key; a query sees only keys of its own document.
        key_mask: ``(B, T)`` bool, False for keys no query may see (padding).
        mask: ``(S, T)`` or ``(B|1, S, T)`` bool, False for (query, key) pairs no branch may score (e.g. the mask a
            transformers model built: padding, packed documents); applied on top of causality.
        seq_len: the length ``S`` of the sequence a query belongs to: the frequencies of a length-dependent scaling
            (``dynamic``, ``longrope``) and a method's length factor (Dual Chunk Attention's ``m(S)**2``) follow it,
            one length for every branch of a query. A number, a 0-d tensor, or one per key (``(T,)`` or
            ``(B|1, T)``, queries taking the last ``S``). It must cover the sequence positions (``>= position + 1``;
            the positions a branch maps to may exceed it). Default: each document's length with ``document_ids``
            (``posenc.document_lengths``), else the largest key position + 1.
        scale: score scale, default ``1 / sqrt(D)``.
        block: query rows per block (memory ``O(block * T)``).
        backend: ``"sdpa"`` (PyTorch's fused CPU flash kernel per branch and block, CPU only), ``"eager"``
            (scores written out; any device) or ``"auto"`` (``sdpa`` on CPU, ``eager`` elsewhere).

    Returns:
        ``(B, H, S, Dv)`` in q's dtype. Scores and the softmax run in float32 (float64 for float64 inputs). A query
        that no branch lets see any key (possible only with ``key_mask``/``document_ids`` removing its own key)
        gets zeros.

    Shapes:
        q (B, H, S, D), k (B, Hkv, T, D), v (B, Hkv, T, Dv) -> (B, H, S, Dv).
    """
    if not isinstance(method, RemapMethod):
        fail("method", type(method).__name__, "a posenc remapping method (SelfExtend, DualChunk, ReRoPE, LMInfinite)")
    if not isinstance(encoding, RotaryEmbedding):
        fail(
            "encoding",
            type(encoding).__name__,
            f"a RotaryEmbedding: {method.name} remaps the positions RoPE rotates by, which a bias or absolute "
            "encoding does not have",
        )
    _check_qkv(q, k, v)
    block = check_positive_int("block", block)
    if scale is not None and not (isinstance(scale, (int, float)) and math.isfinite(scale) and scale > 0):
        fail("scale", scale, "a positive finite number")
    b, h, s, _ = q.shape
    t = k.shape[2]
    if s > t:
        fail("q.shape[2]", s, f"at most the number of keys, {t} (queries are the last keys)")
    q_pos, k_pos = _positions(q_positions, k_positions, s, t, b, q.device)
    docs = _batch_rows(document_ids, "document_ids", t, b, q.device, integer=True)
    keep = _batch_rows(key_mask, "key_mask", t, b, q.device, boolean=True)
    pairs = _pair_mask(mask, s, t, b, q.device)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    lengths = None
    if encoding.depends_on_length or method.depends_on_length:
        lengths = _lengths(seq_len, q_pos, k_pos, docs)

    backend = _backend(backend, q, v)
    work = torch.float64 if q.dtype == torch.float64 else torch.float32
    span = work if span_dtype is None else span_dtype
    if span not in SPAN_DTYPES:
        fail("span_dtype", span_dtype, f"None or one of {[str(d) for d in SPAN_DTYPES]}")
    branches = method.branches()
    rotate = _Rotations(encoding, method, q, k, q_pos, k_pos, lengths, work, span)
    rotated = [(rotate.queries(branch), rotate.keys(branch)) for branch in branches]
    v = _repeat_kv(v.to(span), h)
    offset = t - s
    # The regions compare positions block by block over (Sb, T) pairs: in int32 where they fit, half the bytes.
    q_near, k_near = _narrow(q_pos), _narrow(k_pos)
    plans = _plans(branches, q_near, k_near, docs, keep, pairs, block)  # per branch, block and key tile: a state
    edges = key_edges(s, t, block)
    keys = torch.arange(t, device=q.device, dtype=torch.int32)
    out = torch.empty(b, h, s, v.shape[-1], dtype=work, device=q.device)
    # Where a branch is plain causal attention, shifted by a lag (far keys in a prefill) or over its first query
    # blocks (a band's queries closer to the start than its width), those rows come from one call, not per block.
    whole: dict[int, tuple[torch.Tensor, torch.Tensor, int]] = {}  # branch -> (values, lse, rows they cover)
    if backend == "sdpa" and docs is None and keep is None and pairs is None:
        for index, (branch, (qb, kb)) in enumerate(zip(branches, rotated, strict=True)):
            lag = causal_lag(branch.region, q_near, k_near)
            lead = 0 if lag is not None else causal_lead(branch.region, q_near, k_near, block)
            if lag is not None:
                whole[index] = (*_lagged(qb, kb, v, lag - offset, scale, work), s)
            elif lead:
                whole[index] = (*_lagged(qb[:, :, :lead], kb, v, 0, scale, work), lead)
    for n, r0 in enumerate(range(0, s, block)):
        r1 = min(s, r0 + block)
        i = q_near[:, r0:r1, None]  # (B|1, Sb, 1)
        parts = []
        for index, (branch, (qb, kb), plan) in enumerate(zip(branches, rotated, plans, strict=True)):
            if index in whole and r1 <= whole[index][2]:
                values, lse, _ = whole[index]
                parts.append((values[:, :, r0:r1], lse[:, :, r0:r1]))
                continue
            qs = qb[:, :, r0:r1]
            for state, a, e in calls(plan[n], edges):  # keys a..e: wholly inside (no mask), diagonal, or masked
                if state != BOUNDARY:
                    diagonal = state == CAUSAL
                    values, lse = _span(backend, qs, kb[:, :, a:e], v[:, :, a:e], None, scale, work, causal=diagonal)
                    parts.append((values, lse.to(work)))
                    continue
                region = branch.region(i, k_near[:, None, a:e])  # (B|1, Sb, e - a)
                allowed = _allowed(keys, r0 + offset, r1 + offset, a, e, docs, keep, pairs, offset)
                region = region if allowed is None else region & allowed
                cols = region.any(dim=(0, 1)).nonzero()
                if cols.numel() == 0:
                    continue
                c0, c1 = int(cols[0]), int(cols[-1]) + 1  # the keys this branch scores in the run
                region = region[:, None, :, c0:c1]  # (B|1, 1, Sb, n)
                lo, up = a + c0, a + c1
                values, lse = _span(backend, qs, kb[:, :, lo:up], v[:, :, lo:up], region, scale, work)
                lse = lse.to(work).masked_fill(~region.any(dim=-1), -math.inf)  # rows with no key: weight 0
                parts.append((values, lse))
        out[:, :, r0:r1] = _merge(parts, out[:, :, r0:r1])
    return out.to(q.dtype)


def _plans(
    branches: tuple[Branch, ...],
    q_pos: torch.Tensor,
    k_pos: torch.Tensor,
    docs: torch.Tensor | None,
    keep: torch.Tensor | None,
    pairs: torch.Tensor | None,
    block: int,
) -> list[list[list[int]]]:
    """For each branch, query block and key tile: ``OUTSIDE``, ``INSIDE``, ``CAUSAL`` or ``BOUNDARY``
    (``posenc.remapping._tiles``), from the positions each block and tile holds.

    Shapes:
        q_pos (B|1, S), k_pos (B|1, T), docs, keep (B|1, T), pairs (B|1, S, T) -> [branch][block][tile].
    """
    s, t = q_pos.shape[-1], k_pos.shape[-1]
    if s == 0:
        return [[] for _ in branches]
    pad = key_pad(s, t, block)
    q_lo, q_hi = tile_range(q_pos, block)  # (B|1, nq)
    k_lo, k_hi = tile_range(k_pos, block, pad)  # (B|1, nk)
    uniform = uniform_tiles(block, pad, t - s, docs, keep, pairs)
    diagonal = torch.tensor([diagonal_tile(r0, s, t, block) for r0 in range(0, s, block)], device=q_pos.device)
    return [
        apply_causality(demote(classify(branch.region, q_lo, q_hi, k_lo, k_hi), uniform), diagonal).tolist()
        for branch in branches
    ]


def _allowed(
    keys: torch.Tensor,
    first_query: int,
    query_end: int,
    lo: int,
    up: int,
    docs: torch.Tensor | None,
    keep: torch.Tensor | None,
    pairs: torch.Tensor | None,
    offset: int,
) -> torch.Tensor | None:
    """Which pairs of the queries at key indices ``first_query..query_end`` and the keys ``lo..up`` causality,
    documents, the key mask and the pair mask allow; None where nothing cuts them (keys all in the past).

    Shapes:
        -> (B|1, Sb, up - lo) bool.
    """
    allowed = None
    if up > first_query + 1:  # some key after some query
        allowed = keys[first_query:query_end, None] >= keys[None, lo:up]
    if docs is not None:
        same = docs[:, first_query:query_end, None] == docs[:, None, lo:up]  # (B|1, Sb, n)
        allowed = same if allowed is None else allowed & same
    if keep is not None:
        allowed = keep[:, None, lo:up] if allowed is None else allowed & keep[:, None, lo:up]
    if pairs is not None:
        rows = pairs[:, first_query - offset : query_end - offset, lo:up]
        allowed = rows if allowed is None else allowed & rows
    return allowed


def _span(
    backend: str,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    region: torch.Tensor | None,
    scale: float,
    work: torch.dtype,
    *,
    causal: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of a block of queries over a span of keys where ``region`` is True (None: every key; ``causal``:
    a square diagonal tile, query ``a`` sees keys ``<= a``): ``(values, log-sum-exp)``, the values in q's dtype, the
    log-sum-exp in ``work`` (float32 for half inputs).

    ``sdpa``: PyTorch's fused CPU flash-attention kernel, which also returns the log-sum-exp; ``eager``: written
    out, the scores and softmax in ``work``, the weights cast to q's dtype before they weigh the values (as the
    fused kernel does). A row with no True gets values 0 (the caller gives it weight 0).
    """
    if backend == "sdpa":
        mask = None if region is None else _additive(region, q.dtype)
        return _CPU_FLASH(q, k, v, is_causal=causal, attn_mask=mask, scale=scale)
    if causal:
        region = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).tril()
    scores = (q @ k.transpose(-1, -2)).to(work) * scale  # (B, H, Sb, n)
    if region is not None:
        scores = scores + _additive(region, work)
    lse = torch.logsumexp(scores, dim=-1)  # (B, H, Sb)
    weights = torch.exp(scores - lse.clamp_min(torch.finfo(work).min)[..., None])
    return weights.to(v.dtype) @ v, lse


def _lagged(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, first: int, scale: float, work: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """A branch where query row ``r`` sees keys ``0..r - first`` (``causal_lag``) as one fused causal call over the
    rows from ``first`` and the first ``S - first`` keys: ``(values, log-sum-exp)`` for every row, the rows before
    ``first`` (no key) with values 0 and log-sum-exp ``-inf`` (weight 0 in the merge).

    Shapes:
        q (B, H, S, D), k (B, H, T, D), v (B, H, T, Dv) -> values (B, H, S, Dv), lse (B, H, S).
    """
    b, h, s, _ = q.shape
    values = torch.zeros(b, h, s, v.shape[-1], dtype=v.dtype, device=q.device)
    lse = torch.full((b, h, s), -math.inf, dtype=work, device=q.device)
    n = s - first
    if n > 0:
        rows, part = _span("sdpa", q[:, :, first:], k[:, :, :n], v[:, :, :n], None, scale, work, causal=True)
        values[:, :, first:] = rows
        lse[:, :, first:] = part.to(work)
    return values, lse


def _additive(region: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """0 where ``region`` is True, -inf elsewhere, in ``dtype`` (one pass)."""
    zero = torch.zeros((), dtype=dtype, device=region.device)
    return torch.where(region, zero, torch.full((), -math.inf, dtype=dtype, device=region.device))


def _narrow(positions: torch.Tensor) -> torch.Tensor:
    """Integer positions as int32 where every value fits (exact), else as they are."""
    if positions.dtype == torch.int32 or positions.numel() == 0:
        return positions
    info = torch.iinfo(torch.int32)
    if int(positions.min()) >= info.min and int(positions.max()) <= info.max:
        return positions.to(torch.int32)
    return positions


def _merge(parts: list[tuple[torch.Tensor, torch.Tensor]], like: torch.Tensor) -> torch.Tensor:
    """One softmax from per-call (values in the spans' dtype, log-sum-exp in ``like``'s): weight each by
    ``exp(lse_p - lse)`` and add them up in ``like``'s dtype.

    Shapes:
        parts [(values (B, H, Sb, Dv), lse (B, H, Sb))], like (B, H, Sb, Dv) -> (B, H, Sb, Dv).
    """
    if not parts:
        return torch.zeros_like(like)
    lse = torch.stack([lse for _, lse in parts])  # (P, B, H, Sb)
    total = torch.logsumexp(lse, dim=0)  # (B, H, Sb)
    finite = torch.isfinite(total)
    weights = torch.exp(lse - torch.where(finite, total, 0.0))  # (P, B, H, Sb)
    out = torch.zeros_like(like)
    for weight, (values, _) in zip(weights, parts, strict=True):
        out.addcmul_(weight[..., None], values)  # in like's dtype
    return torch.where(finite[..., None], out, 0.0)


def _backend(backend: str, q: torch.Tensor, v: torch.Tensor) -> str:
    check_choice("backend", backend, BACKENDS)
    why = None
    if q.device.type != "cpu" or _CPU_FLASH is None:
        why = f"'sdpa' is PyTorch's CPU flash kernel, and q is on {q.device.type}"
    elif v.shape[-1] != q.shape[-1]:
        why = f"PyTorch's CPU flash kernel needs v's head_dim ({v.shape[-1]}) equal to q's ({q.shape[-1]})"
    if backend == "auto":
        return "eager" if why else "sdpa"
    if backend == "sdpa" and why:
        fail("backend", backend, f"'eager' or 'auto' here: {why}")
    return backend


def _repeat_kv(x: torch.Tensor, heads: int) -> torch.Tensor:
    """Key/value head ``g`` serves query heads ``g * r ... g * r + r - 1`` (Hugging Face's ``repeat_kv`` order)."""
    return x if x.shape[1] == heads else x.repeat_interleave(heads // x.shape[1], dim=1)  # (B, Hkv, T, D) -> H


class _Rotations:
    """Each branch's queries and keys rotated in the working dtype, then cast to the spans' dtype; branches sharing a
    position map (DCA's three key maps) share one rotation and one cast. The frequencies of a length-dependent
    scaling and the method's length factor follow the length of the sequence a token belongs to, the same for every
    branch, so q.k stays a function of the two mapped positions (``dynamic``/``longrope``)."""

    def __init__(self, encoding, method, q, k, q_pos, k_pos, lengths, work, span) -> None:  # noqa: ANN001
        self.encoding, self.q, self.k, self.q_pos, self.k_pos, self.work = encoding, q, k, q_pos, k_pos, work
        self.span = span
        s = q.shape[2]
        per_key = isinstance(lengths, torch.Tensor) and lengths.dim() > 0
        self.q_len = lengths[..., lengths.shape[-1] - s :] if per_key else lengths
        self.k_len = lengths
        self.factor = None
        if lengths is not None:
            factor = method.logit_factor(torch.as_tensor(self.q_len, dtype=torch.float64, device=q.device))
            if factor is not None:  # (B|1, S) or 0-d -> broadcast over heads and channels
                self.factor = factor.reshape(-1, 1, s, 1) if factor.dim() > 0 else factor
        self.done: dict[tuple, torch.Tensor] = {}

    def _rotate(self, x: torch.Tensor, positions: torch.Tensor, length) -> torch.Tensor:  # noqa: ANN001
        return self.encoding.rotate_mapped(x, positions, seq_len=length)

    def queries(self, branch: Branch) -> torch.Tensor:
        """``(B, H, S, D)`` in the spans' dtype, times the branch's per-query logit factor and the method's length
        factor (in the working dtype, before the cast)."""
        key = ("q", branch.query, branch.query_scale)
        if key not in self.done:
            rotated = self._rotate(self.q, branch.query(self.q_pos), self.q_len).to(self.work)
            if branch.query_scale is not None:
                rotated = rotated * branch.query_scale(self.q_pos).to(rotated.dtype)[:, None, :, None]
            if self.factor is not None:
                rotated = rotated * self.factor.to(rotated.dtype)
            self.done[key] = rotated.to(self.span)
        return self.done[key]

    def keys(self, branch: Branch) -> torch.Tensor:
        """``(B, H, T, D)`` in the spans' dtype: key heads repeated for the query heads they serve."""
        key = ("k", branch.key)
        if key not in self.done:
            rotated = self._rotate(self.k, branch.key(self.k_pos), self.k_len)
            self.done[key] = _repeat_kv(rotated.to(self.span), self.q.shape[1])
        return self.done[key]


def _lengths(
    seq_len: int | float | torch.Tensor | None, q_pos: torch.Tensor, k_pos: torch.Tensor, docs: torch.Tensor | None
) -> torch.Tensor:
    """The length of the sequence each key belongs to (queries: the last ``S``), checked against the sequence
    positions: float64, 0-d or ``(B|1, T)``."""
    if seq_len is None:
        if docs is not None:
            return document_lengths(k_pos, docs)
        return k_pos.max().double() + 1
    length = check_seq_len(seq_len, k_pos, "seq_len", queries=q_pos)
    length = torch.as_tensor(length, dtype=torch.float64, device=k_pos.device)
    return length if length.dim() != 1 else length.unsqueeze(0)


def _pair_mask(mask: torch.Tensor | None, s: int, t: int, b: int, device: torch.device) -> torch.Tensor | None:
    if mask is None:
        return None
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
        fail("mask", getattr(mask, "dtype", type(mask).__name__), "a torch.bool tensor (True where a pair may attend)")
    pairs = mask if mask.dim() == 3 else mask.unsqueeze(0)
    if pairs.dim() != 3 or pairs.shape[1:] != (s, t) or pairs.shape[0] not in (1, b):
        fail("mask.shape", tuple(mask.shape), f"({s}, {t}) or ({b}, {s}, {t})")
    check_same_device("mask", pairs, device, "q's device")
    return pairs


def _check_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, torch.Tensor) or x.dim() != 4 or not x.is_floating_point():
            shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            fail(name, shape, "a floating-point tensor of 4 dimensions (B, heads, length, head_dim)")
    for name, x in (("k", k), ("v", v)):
        if x.dtype != q.dtype or x.device != q.device or x.shape[0] != q.shape[0]:
            fail(name, f"{x.dtype} {x.device} {tuple(x.shape)}", f"q's dtype, device and batch, {q.dtype} {q.device}")
    if k.shape[-1] != q.shape[-1]:
        fail("k.shape[-1]", k.shape[-1], f"q's head_dim, {q.shape[-1]}")
    if v.shape[1:3] != k.shape[1:3]:
        fail("v.shape", tuple(v.shape), f"k's heads and length, (B, {k.shape[1]}, {k.shape[2]}, Dv)")
    if k.shape[1] == 0 or q.shape[1] % k.shape[1] != 0:
        fail("k.shape[1]", k.shape[1], f"a number of key/value heads that divides the {q.shape[1]} query heads")


def _positions(
    q_pos: torch.Tensor | None, k_pos: torch.Tensor | None, s: int, t: int, b: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Both as ``(B|1, N)`` integer tensors on ``device``."""
    if k_pos is None:
        if q_pos is not None and s != t:
            fail("k_positions", None, f"the positions of all {t} keys, since S={s} != T={t}")
        k_pos = torch.arange(t, device=device) if q_pos is None else q_pos
    if q_pos is None:
        q_pos = k_pos[..., t - s :]
    out = []
    for name, pos, n in (("q_positions", q_pos, s), ("k_positions", k_pos, t)):
        check_positions(pos, name)
        check_same_device(name, pos, device, "q's device")
        if pos.is_floating_point():
            fail(f"{name}.dtype", pos.dtype, "an integer dtype: remapping regions compare positions exactly")
        pos = pos if pos.dim() == 2 else pos.unsqueeze(0)
        if pos.dim() != 2 or pos.shape[1] != n or pos.shape[0] not in (1, b):
            fail(f"{name}.shape", tuple(pos.shape), f"({n},) or ({b}, {n})")
        out.append(pos)
    return out[0], out[1]


def _batch_rows(
    x: torch.Tensor | None,
    name: str,
    t: int,
    b: int,
    device: torch.device,
    *,
    integer: bool = False,
    boolean: bool = False,
) -> torch.Tensor | None:
    if x is None:
        return None
    if not isinstance(x, torch.Tensor):
        fail(name, type(x).__name__, f"a tensor of shape ({t},) or ({b}, {t})")
    if boolean and x.dtype != torch.bool:
        fail(f"{name}.dtype", x.dtype, "torch.bool (True where a key may be seen)")
    if integer and (x.is_floating_point() or x.is_complex() or x.dtype == torch.bool):
        fail(f"{name}.dtype", x.dtype, "an integer dtype")
    x = x if x.dim() == 2 else x.unsqueeze(0)
    if x.dim() != 2 or x.shape[1] != t or x.shape[0] not in (1, b):
        fail(f"{name}.shape", tuple(x.shape), f"({t},) or ({b}, {t})")
    check_same_device(name, x, device, "q's device")
    return x
