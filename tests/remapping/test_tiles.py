"""The unmasked fast path of ``remap_attention`` (``posenc.remapping._tiles``): the tile grid, the classification of
(query block, key tile) pairs from their positions (sound for arbitrary positions, found where the geometry gives
it), the kernel calls it leads to, and the fast path equal to the masked one -- every method, with explicit and
packed positions, documents, a key mask, a pair mask, decoding with a cache and chunked prefill."""

from __future__ import annotations

import collections

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.testing import assert_close

import posenc
from posenc.remapping import (
    METHODS,
    WITHIN_TRAINING,
    DualChunk,
    KeyInterval,
    ReRoPE,
    SelfExtend,
    StreamingLLM,
    remap_method,
)
from posenc.remapping import operator as remap_operator
from posenc.remapping._tiles import (
    BOUNDARY,
    CAUSAL,
    INSIDE,
    OUTSIDE,
    apply_causality,
    calls,
    causal_lag,
    causal_lead,
    classify,
    diagonal_tile,
    key_edges,
    key_pad,
    tile_range,
    uniform_tiles,
)
from tolerances import rotated_softmax_atol, unit_roundoff


def method_for(name, original, target):
    return remap_method(name, original=target if name in WITHIN_TRAINING else original, target=target)


@pytest.mark.parametrize("s, t, block", [(16, 16, 4), (10, 23, 4), (1, 9, 4), (7, 7, 16), (33, 50, 8), (5, 5, 1)])
def test_each_query_block_diagonal_is_one_square_tile(s, t, block):
    edges = key_edges(s, t, block)
    assert edges[0] == 0 and edges[-1] == t and all(a < b for a, b in zip(edges, edges[1:], strict=False))
    assert all(b - a <= block for a, b in zip(edges, edges[1:], strict=False))
    for r0 in range(0, s, block):
        m = diagonal_tile(r0, s, t, block)
        assert (edges[m], edges[m + 1]) == (r0 + t - s, min(s, r0 + block) + t - s)


def test_tile_range_is_the_least_and_largest_value_of_each_tile():
    x = torch.tensor([[5, 1, 9, 3, 7, 2, 8]])  # tiles of 3, the first 2 short: [5] [1 9 3] [7 2 8]
    lo, hi = tile_range(x, 3, pad=2)
    assert lo.tolist() == [[5, 1, 2]] and hi.tolist() == [[5, 9, 8]]


def test_calls_are_runs_of_one_state_and_the_diagonal_alone():
    edges = [0, 2, 6, 10, 14, 18, 22]
    row = [INSIDE, INSIDE, BOUNDARY, OUTSIDE, BOUNDARY, CAUSAL]
    assert calls(row, edges) == [(INSIDE, 0, 6), (BOUNDARY, 6, 10), (BOUNDARY, 14, 18), (CAUSAL, 18, 22)]


@pytest.mark.parametrize("name", sorted(METHODS))
def test_every_built_in_region_is_a_key_interval_with_nondecreasing_bounds(name):
    i = torch.arange(-40, 400)
    for branch in method_for(name, 64, 256).branches():
        assert isinstance(branch.region, KeyInterval), branch.name
        for bound in (branch.region.first, branch.region.end):
            if bound is not None:
                assert bool((torch.diff(bound(i)) >= 0).all()), branch.name


def test_a_region_that_is_not_a_key_interval_is_masked_everywhere():
    lo = torch.zeros(1, 3, dtype=torch.long)
    states = classify(lambda i, j: j <= i, lo, lo + 5, torch.zeros(1, 4, dtype=torch.long), lo[:, :1] + 9)
    assert bool((states == BOUNDARY).all()) and states.shape == (3, 4)


@settings(max_examples=80, deadline=None)
@given(
    name=st.sampled_from(sorted(METHODS)),
    rows=st.integers(1, 2),
    t=st.integers(1, 70),
    block=st.integers(1, 9),
    seed=st.integers(0, 2**16),
    spread=st.integers(1, 60),
)
def test_classification_is_sound_for_arbitrary_positions(name, rows, t, block, seed, spread):
    """Positions in any order, with gaps and repeats, per batch row: an ``INSIDE`` pair of (query block, key tile)
    holds only pairs of the region in every row, an ``OUTSIDE`` one none."""
    g = torch.Generator().manual_seed(seed)
    s = int(torch.randint(1, t + 1, (), generator=g))
    k_pos = torch.randint(-spread, 3 * spread, (rows, t), generator=g)
    q_pos = torch.randint(-spread, 3 * spread, (rows, s), generator=g)
    edges = key_edges(s, t, block)
    q_lo, q_hi = tile_range(q_pos, block)
    k_lo, k_hi = tile_range(k_pos, block, key_pad(s, t, block))
    for branch in method_for(name, 16, 48).branches():
        states = classify(branch.region, q_lo, q_hi, k_lo, k_hi)
        for n, r0 in enumerate(range(0, s, block)):
            for m in range(len(edges) - 1):
                pairs = branch.region(q_pos[:, r0 : r0 + block, None], k_pos[:, None, edges[m] : edges[m + 1]])
                if states[n, m] == INSIDE:
                    assert bool(pairs.all()), (branch.name, n, m)
                if states[n, m] == OUTSIDE:
                    assert not bool(pairs.any()), (branch.name, n, m)


def test_self_extend_plan_masks_one_tile_per_branch_and_block():
    """Self-Extend with W = 4 blocks of 16: block ``n`` (queries 16n..16n+15) scores keys ``j > i - 64`` as
    neighbours -- tiles n-3..n-1 wholly, tile n-4 in part, its diagonal causally -- and the rest grouped: tiles up to
    n-5 wholly, tile n-4 in part."""
    block, s = 16, 160
    q_lo, q_hi = tile_range(torch.arange(s)[None], block)
    neighbor, grouped = SelfExtend(window=64, group=2).branches()
    diagonal = torch.arange(s // block)

    def neighbors(n, m):
        return CAUSAL if m == n else INSIDE if n - 3 <= m < n else BOUNDARY if m == n - 4 else OUTSIDE

    def far(n, m):
        return INSIDE if m <= n - 5 else BOUNDARY if m == n - 4 else OUTSIDE

    for branch, expected in ((neighbor, neighbors), (grouped, far)):
        states = apply_causality(classify(branch.region, q_lo, q_hi, q_lo, q_hi), diagonal)
        want = [[expected(n, m) for m in range(s // block)] for n in range(s // block)]
        assert states.tolist() == want, branch.name


def test_documents_key_mask_and_pair_mask_leave_only_uniform_tiles():
    """Two documents of 6 and 10 keys, tiles of 4: a tile holding both, or a masked key, or a False pair, is not
    uniform; a pair mask that includes causality leaves the diagonals masked."""
    block, s = 4, 16
    docs = torch.tensor([[0] * 6 + [1] * 10])
    keep = torch.ones(1, s, dtype=torch.bool)
    keep[0, 13] = False
    uniform = uniform_tiles(block, 0, 0, docs, keep, None)
    assert uniform.tolist() == [
        [True, False, False, False],  # queries 0..3, document 0
        [False, False, False, False],  # queries 4..7 span both documents
        [False, False, True, False],  # queries 8..11, document 1; keys 12..15 hold the masked key 13
        [False, False, True, False],
    ]
    causal = torch.ones(s, s, dtype=torch.bool).tril()[None]
    pairs = uniform_tiles(block, 0, 0, None, None, causal)
    assert pairs.tolist() == [[m < n for m in range(4)] for n in range(4)]


def count_kernel_calls(monkeypatch, *, one_call_branches):
    """Self-Extend (W = 4 blocks) over 16 blocks of 32 queries, the kernel calls counted by kind."""
    block, s = 32, 512
    seen = collections.Counter()
    kernel = remap_operator._CPU_FLASH

    def counting(q, k, v, *, is_causal=False, attn_mask=None, scale=None):
        seen["causal" if is_causal else "masked" if attn_mask is not None else "unmasked"] += 1
        return kernel(q, k, v, is_causal=is_causal, attn_mask=attn_mask, scale=scale)

    monkeypatch.setattr(remap_operator, "_CPU_FLASH", counting)
    if not one_call_branches:
        monkeypatch.setattr(remap_operator, "causal_lag", no_lag)
        monkeypatch.setattr(remap_operator, "causal_lead", no_lead)
    q, k, v = qkv(1, 2, 1, s, 8, dtype=torch.float32)
    remap_operator.remap_attention(
        q, k, v, method=SelfExtend(window=4 * block, group=3), encoding=rope(8), block=block, backend="sdpa"
    )
    return seen


def test_the_operator_runs_interior_tiles_without_a_mask(monkeypatch):
    """In query blocks: 2 masked calls per block from block 4 on (tile n-4, one per branch), 16 causal diagonals,
    and one unmasked run per branch and block where one exists (neighbours from block 1: 15; grouped from block 5:
    11)."""
    assert count_kernel_calls(monkeypatch, one_call_branches=False) == {"masked": 24, "causal": 16, "unmasked": 26}


def test_the_grouped_branch_and_the_first_neighbour_blocks_of_a_prefill_are_one_causal_call_each(monkeypatch):
    """The grouped keys ``j <= i - W`` are causal attention shifted by W: one causal call replaces the grouped
    branch's 12 masked tiles and 11 unmasked runs. The neighbours ``j > i - W`` of the first W queries are every
    earlier key: one causal call replaces blocks 0-3's 4 diagonals and 3 runs; blocks 4-15 keep theirs (12 masked,
    12 unmasked, 12 diagonals)."""
    assert count_kernel_calls(monkeypatch, one_call_branches=True) == {"masked": 12, "causal": 14, "unmasked": 12}


@pytest.mark.parametrize("name", sorted(METHODS))
def test_causal_lead_is_whole_blocks_of_rows_that_see_every_earlier_key(name):
    """For every built-in branch at the actual positions of a prefill: the rows ``causal_lead`` gives see exactly
    the keys ``j <= i`` (checked over every pair), they are whole blocks, and the next block does not (else the lead
    would be longer); 0 for positions that are not 0..T-1 in order, and for a chunk after a cache."""
    t, block = 120, 8
    keys = torch.arange(t)[None]
    for branch in method_for(name, 40, 120).branches():
        lead = causal_lead(branch.region, keys, keys, block)
        assert lead % block == 0 and 0 <= lead <= t
        region = branch.region(keys[..., None], keys[:, None, :]) & (keys[:, None, :] <= keys[..., None])
        causal = keys[:, None, :] <= keys[..., None]
        assert torch.equal(region[:, :lead], causal[:, :lead]), branch.name
        if lead + block <= t:  # the lead is the longest run of such whole blocks
            assert not torch.equal(region[:, lead : lead + block], causal[:, lead : lead + block]), branch.name
        assert causal_lead(branch.region, keys * 2, keys * 2, block) == 0
        assert causal_lead(branch.region, keys[:, 60:], keys, block) == 0


@pytest.mark.parametrize("name", sorted(METHODS))
def test_causal_lag_is_found_only_where_a_branch_is_shifted_causal_attention(name):
    """Read off each built-in branch at the actual positions: the region ``j <= i - c`` holds for exactly the pairs
    the lag says (checked over every pair), and None wherever positions are not 0..T-1 in order."""
    method = method_for(name, 40, 120)
    t = 120
    keys = torch.arange(t)[None]
    for s in (t, 37, 1):
        queries = keys[:, t - s :]
        for branch in method.branches():
            lag = causal_lag(branch.region, queries, keys)
            if lag is None:
                continue
            region = branch.region(queries[..., None], keys[:, None, :])  # (1, S, T)
            shifted = keys[:, None, :] <= queries[..., None] - lag
            assert torch.equal(region, shifted), (name, branch.name, s)
            assert lag >= t - s
    far = [b for b in method.branches() if b.name in ("grouped", "clamped", "leaky", "shifted")]
    for branch in far:  # the far branch of Self-Extend, ReRoPE, leaky ReRoPE and STRING in a prefill
        assert causal_lag(branch.region, keys, keys) is not None, branch.name
        assert causal_lag(branch.region, keys * 2, keys * 2) is None  # positions with gaps
        assert causal_lag(branch.region, keys[:, 1:], keys[:, 1:] + 7) is None  # not from 0
    for branch in method.branches():
        if branch.name not in ("grouped", "clamped", "leaky", "shifted"):
            assert causal_lag(branch.region, keys, keys) is None, branch.name


# -- the fast path equals the masked one -------------------------------------------------------------------------


def qkv(b, h, hkv, s, d, *, t=None, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    t = s if t is None else t
    return (
        torch.randn(b, h, s, d, generator=g, dtype=dtype),
        torch.randn(b, hkv, t, d, generator=g, dtype=dtype),
        torch.randn(b, hkv, t, d, generator=g, dtype=dtype),
    )


def rope(d=8):
    return posenc.build("rope", head_dim=d, base=100.0)


def masked_everywhere(region, q_lo, q_hi, k_lo, k_hi):
    """The operator before the fast path: every tile masked (one masked run over the block's causal past)."""
    return torch.full((q_lo.shape[-1], k_lo.shape[-1]), BOUNDARY, dtype=torch.int8, device=q_lo.device)


def no_lag(region, q_pos, k_pos):
    """The operator before the one-call branches: every branch in query blocks."""
    return None


def no_lead(region, q_pos, k_pos, block):
    return 0


def both_paths(monkeypatch, q, k, v, method, **kw):
    fast = remap_operator.remap_attention(q, k, v, method=method, encoding=rope(q.shape[-1]), **kw)
    with monkeypatch.context() as patch:
        patch.setattr(remap_operator, "classify", masked_everywhere)
        patch.setattr(remap_operator, "causal_lag", no_lag)
        patch.setattr(remap_operator, "causal_lead", no_lead)
        masked = remap_operator.remap_attention(q, k, v, method=method, encoding=rope(q.shape[-1]), **kw)
    return fast, masked


def bound(q, k, v, dtype, max_position):
    """Both paths compute one softmax, split into different kernel calls: each is within the operator's bound of
    the exact one (``rotated_softmax_atol``, with the largest logit factor of the methods here, DCA's m(S)^2 and
    ReRoPE's log scaling, under 2), so the two within twice it."""
    return 2 * rotated_softmax_atol(q, k, v, dtype, max_position=max_position, logit_factor=2.0)


CASES = [method_for(name, 40, 120) for name in sorted(METHODS)] + [
    DualChunk(chunk_size=20, local_window=4, mscale=0),  # chunks of 16: every block boundary a chunk boundary
    ReRoPE(window=24, leak=2.0, log_scale_length=40),
    StreamingLLM(window=30, sinks=3),
]


@pytest.mark.parametrize("method", CASES, ids=repr)
@pytest.mark.parametrize("backend", ["sdpa", "eager"])
def test_fast_path_equals_the_masked_path(monkeypatch, method, backend):
    q, k, v = qkv(2, 4, 2, 120, 8)
    fast, masked = both_paths(monkeypatch, q, k, v, method, block=8, backend=backend)
    assert_close(fast, masked, atol=bound(q, k, v, torch.float64, 120), rtol=0)


@pytest.mark.parametrize("method", CASES, ids=repr)
def test_fast_path_equals_the_masked_path_with_positions_documents_and_masks(monkeypatch, method):
    """Per-row positions with gaps (B=2), packed documents (positions restarting), a key mask and a pair mask."""
    q, k, v = qkv(2, 4, 2, 96, 8, seed=1)
    gaps = torch.stack([torch.arange(96) * 2, torch.arange(96) + 7])  # (2, 96)
    for kw in (
        dict(q_positions=gaps, k_positions=gaps),
        dict(q_positions=posenc.packed_positions([40, 56])[0], document_ids=posenc.packed_positions([40, 56])[1]),
        dict(key_mask=torch.arange(96)[None].expand(2, 96) % 17 != 5),
        dict(mask=(torch.rand(96, 96, generator=torch.Generator().manual_seed(2)) > 0.1)),
    ):
        fast, masked = both_paths(monkeypatch, q, k, v, method, block=8, **kw)
        assert_close(fast, masked, atol=bound(q, k, v, torch.float64, 192), rtol=0, msg=lambda m, kw=kw: f"{kw}: {m}")


@pytest.mark.parametrize("method", CASES, ids=repr)
def test_fast_path_equals_the_masked_path_decoding_and_in_chunks(monkeypatch, method):
    """A cache offset: one query after 100 keys (decoding) and 37 queries after 63 (a chunk of a prefill)."""
    q, k, v = qkv(1, 4, 2, 100, 8, seed=3)
    for s in (1, 37):
        fast, masked = both_paths(monkeypatch, q[:, :, -s:], k, v, method, block=8)
        assert_close(fast, masked, atol=bound(q, k, v, torch.float64, 100), rtol=0)


@pytest.mark.parametrize("name", ["self_extend", "dca", "rerope", "string"])
@pytest.mark.parametrize("span_dtype", [None, torch.bfloat16])
def test_fast_path_equals_the_masked_path_in_float32_and_bfloat16_spans(monkeypatch, name, span_dtype):
    """float32 inputs: twice the float32 bound; bf16 spans add each call's output rounded to bf16 (``u max|v|`` on
    each side, the weights summing to 1)."""
    q, k, v = qkv(1, 4, 2, 128, 16, dtype=torch.float32, seed=4)
    fast, masked = both_paths(monkeypatch, q, k, v, method_for(name, 40, 128), block=16, span_dtype=span_dtype)
    tol = bound(q, k, v, torch.float32, 128)
    if span_dtype is not None:
        tol += 2 * unit_roundoff(span_dtype) * float(v.abs().max())
    assert_close(fast, masked, atol=tol, rtol=0)
