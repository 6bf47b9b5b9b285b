"""Length-dependent scalings (dynamic NTK, LongRoPE): the length is per document when documents are packed, can be
passed explicitly (context-parallel ranks, caches), and a cache of rotated keys follows a change of frequencies
with ``rerotate``. Each case below was a silent wrong answer before ``seq_len`` existed (issue 22, findings 1-2)."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

import posenc
from posenc.scalings import DynamicNTKScaling, LongRoPEScaling

D, H, ORIGINAL = 16, 2, 8
SCALINGS = {
    "dynamic": DynamicNTKScaling(factor=2.0, max_position_embeddings=ORIGINAL),
    "longrope": LongRoPEScaling(
        short_factor=[1.0 + 0.05 * i for i in range(D // 2)],
        long_factor=[1.5 + 0.4 * i for i in range(D // 2)],
        original_max_position_embeddings=ORIGINAL,
        factor=4.0,
    ),
}
# float64 inputs: the comparisons below are between two exact computations of the same rotation, rounded once.
TOL = {"atol": 1e-12, "rtol": 1e-12}


@pytest.fixture(params=sorted(SCALINGS))
def rope(request):
    return posenc.RotaryEmbedding(D, scaling=SCALINGS[request.param])


def qkv(t, *, b=1):
    g = torch.Generator().manual_seed(t)
    return [torch.randn(b, H, t, D, dtype=torch.float64, generator=g) for _ in range(3)]


def test_packed_documents_each_use_their_own_length(rope):
    """The issue's case: documents of 12 and 6 tokens packed into one row, original length 8."""
    q, k, v = qkv(18)
    pos, ids = posenc.packed_positions([12, 6])
    packed = posenc.attention(q, k, v, encoding=rope, q_positions=pos, document_ids=ids, backend="eager")
    first = posenc.attention(q[:, :, :12], k[:, :, :12], v[:, :, :12], encoding=rope, backend="eager")
    second = posenc.attention(q[:, :, 12:], k[:, :, 12:], v[:, :, 12:], encoding=rope, backend="eager")
    assert_close(packed, torch.cat([first, second], dim=2), **TOL)
    # The same through the module: document_lengths as seq_len rotates each document as if alone.
    qr, kr = rope(q, k, pos, seq_len=posenc.document_lengths(pos, ids))
    q1, k1 = rope(q[:, :, :12], k[:, :, :12], pos[:12])
    q2, k2 = rope(q[:, :, 12:], k[:, :, 12:], pos[12:])
    assert_close(qr, torch.cat([q1, q2], dim=2), **TOL)
    assert_close(kr, torch.cat([k1, k2], dim=2), **TOL)


def test_document_lengths():
    pos, ids = posenc.packed_positions([3, 5, 1])
    expected = torch.tensor([[3.0] * 3 + [5.0] * 5 + [1.0]], dtype=torch.float64)
    assert_close(posenc.document_lengths(pos, ids), expected, rtol=0, atol=0)
    # Ids need not be 0..N-1 nor rows alike; a batch of rows each with their own documents.
    rows_pos = torch.tensor([[0, 1, 2, 0, 1], [0, 0, 1, 2, 3]])
    rows_ids = torch.tensor([[7, 7, 7, -3, -3], [5, 9, 9, 9, 9]])
    expected = torch.tensor([[3, 3, 3, 2, 2], [1, 4, 4, 4, 4]], dtype=torch.float64)
    assert_close(posenc.document_lengths(rows_pos, rows_ids), expected, rtol=0, atol=0)


def test_context_parallel_shards_with_the_global_length_equal_the_full_forward(rope):
    """Two ranks of 9 tokens each rotate their shard with the global length (18) and equal the full forward."""
    q, k, v = qkv(18)
    full_q, full_k = rope(q, k, torch.arange(18))
    for a, b in ((0, 9), (9, 18)):
        shard_q, shard_k = rope(q[:, :, a:b], k[:, :, a:b], torch.arange(a, b), seq_len=18)
        assert_close(shard_q, full_q[:, :, a:b], **TOL)
        assert_close(shard_k, full_k[:, :, a:b], **TOL)
    # Attention on the second rank: its queries against every key, with the global length.
    full = posenc.attention(q, k, v, encoding=rope, backend="eager")
    kp = torch.arange(18)
    first = posenc.attention(
        q[:, :, :9], k[:, :, :9], v[:, :, :9], encoding=rope, q_positions=kp[:9], seq_len=18, backend="eager"
    )
    assert_close(first, full[:, :, :9], **TOL)


def test_shards_rotated_alone_differ_where_the_length_matters():
    """Without the global length, a short shard uses its own: the rotation differs, which is why seq_len exists."""
    rope = posenc.RotaryEmbedding(D, scaling=SCALINGS["dynamic"])
    q, k, _ = qkv(18)
    alone, _ = rope(q[:, :, :9], k[:, :, :9], torch.arange(9))  # the first rank: its own length is 9, not 18
    full, _ = rope(q, k, torch.arange(18))
    assert (alone - full[:, :, :9]).abs().max() > 1e-3


def test_scores_depend_on_distance_only_across_shards(rope):
    """q.k between a query of one shard and a key of another depends on m - n alone once both use one length."""
    g = torch.Generator().manual_seed(0)
    q1, k1 = torch.randn(1, 1, 1, D, dtype=torch.float64, generator=g), torch.randn(1, 1, 1, D, dtype=torch.float64)
    scores = []
    for m, n in ((12, 3), (15, 6), (17, 8)):
        qm = rope.rotate_one(q1, torch.tensor([m]), seq_len=18)
        kn = rope.rotate_one(k1, torch.tensor([n]), seq_len=18)
        scores.append((qm * kn).sum())
    assert_close(scores[1], scores[0], **TOL)
    assert_close(scores[2], scores[0], **TOL)


def test_rotated_key_cache_follows_the_switch_with_rerotate(rope):
    """Decode past the original length with keys cached already rotated: re-rotating the cache whenever the
    frequencies change (same_frequencies) gives every step's row of the full forward of that length."""
    t_end, prefill = 14, 5
    q, k, v = qkv(t_end)
    cache = rope.rotate_one(k[:, :, :prefill], torch.arange(prefill))
    cache_len = prefill
    for t in range(prefill, t_end):
        length = t + 1
        if not rope.same_frequencies(cache_len, length):
            cache = rope.rerotate(cache, torch.arange(t), from_seq_len=cache_len, to_seq_len=length)
        cache_len = length
        q_new = rope.rotate_one(q[:, :, t : t + 1], torch.tensor([t]), seq_len=length)
        cache = torch.cat([cache, rope.rotate_one(k[:, :, t : t + 1], torch.tensor([t]), seq_len=length)], dim=2)
        step = posenc.attention(q_new, cache, v[:, :, :length], backend="eager")
        full = posenc.attention(q[:, :, :length], k[:, :, :length], v[:, :, :length], encoding=rope, backend="eager")
        assert_close(step, full[:, :, -1:], **TOL)


def test_a_stale_rotated_cache_is_wrong(rope):
    """The failure mode rerotate exists for: keys rotated before the switch, queries after it."""
    _, k, _ = qkv(ORIGINAL)
    stale = rope.rotate_one(k, torch.arange(ORIGINAL))  # written at the original length
    fresh = rope.rotate_one(k, torch.arange(ORIGINAL), seq_len=12)  # what a query at position 11 expects
    assert (stale - fresh).abs().max() > 1e-3
    assert_close(rope.rerotate(stale, torch.arange(ORIGINAL), from_seq_len=ORIGINAL, to_seq_len=12), fresh, **TOL)


def test_rerotate_takes_per_key_lengths():
    """Dynamic NTK keys written one step at a time were each rotated at their own length."""
    rope = posenc.RotaryEmbedding(D, scaling=SCALINGS["dynamic"])
    _, k, _ = qkv(12)
    written = torch.cat([rope.rotate_one(k[:, :, j : j + 1], torch.tensor([j])) for j in range(12)], dim=2)
    lengths = torch.arange(1, 13)
    assert_close(
        rope.rerotate(written, torch.arange(12), from_seq_len=lengths, to_seq_len=12),
        rope.rotate_one(k, torch.arange(12), seq_len=12),
        **TOL,
    )


def test_same_frequencies():
    dynamic = posenc.RotaryEmbedding(D, scaling=SCALINGS["dynamic"])
    longrope = posenc.RotaryEmbedding(D, scaling=SCALINGS["longrope"])
    plain = posenc.RotaryEmbedding(
        D, scaling={"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 8}
    )
    assert dynamic.same_frequencies(3, 8) and not dynamic.same_frequencies(8, 9) and not dynamic.same_frequencies(9, 10)
    assert longrope.same_frequencies(1, 8) and not longrope.same_frequencies(8, 9) and longrope.same_frequencies(9, 99)
    assert plain.same_frequencies(1, 10_000) and not plain.depends_on_length
    assert dynamic.depends_on_length and longrope.depends_on_length


def test_plain_rope_ignores_the_length():
    """seq_len only reaches encodings whose rotation depends on it: any other gives the same answer."""
    rope = posenc.RotaryEmbedding(D, scaling={"rope_type": "linear", "factor": 2.0})
    q, k, v = qkv(10)
    base = posenc.attention(q, k, v, encoding=rope, backend="eager")
    assert_close(posenc.attention(q, k, v, encoding=rope, seq_len=1000, backend="eager"), base, rtol=0, atol=0)
    alibi = posenc.ALiBi(num_heads=H)
    assert_close(
        posenc.attention(q, k, v, encoding=alibi, seq_len=50, backend="eager"),
        posenc.attention(q, k, v, encoding=alibi, backend="eager"),
        rtol=0,
        atol=0,
    )


@pytest.mark.parametrize(
    ("seq_len", "match"),
    [
        (5, r"seq_len=5\.0 is invalid: expected a finite length >= position \+ 1 = 6"),
        (0, r"seq_len=0 is invalid: expected a number >= 1"),
        (float("nan"), r"seq_len=nan is invalid: expected a finite number"),
        (True, r"seq_len=True is invalid"),
        ("10", r"seq_len='10' is invalid"),
        (torch.tensor(True), r"seq_len\.dtype=torch\.bool is invalid"),
        (torch.full((10,), 4), r"seq_len=4\.0 is invalid: expected a finite length >= position \+ 1 = 5"),
        (torch.full((3,), 20), r"seq_len\.shape=\(3,\) is invalid: expected \(\) for one length, or \(10,\)"),
        (torch.full((2, 3, 10), 20), r"seq_len\.shape=\(2, 3, 10\) is invalid"),
        (torch.tensor([20.0] * 9 + [float("nan")]), r"seq_len=nan is invalid: expected a finite length"),
    ],
)
def test_bad_lengths_are_refused(rope, seq_len, match):
    q, k, v = qkv(10)
    with pytest.raises(ValueError, match=match):
        posenc.attention(q, k, v, encoding=rope, seq_len=seq_len)
    with pytest.raises(ValueError, match=match.replace("seq_len", "to_seq_len", 1)):
        rope.rerotate(k, torch.arange(10), from_seq_len=10, to_seq_len=seq_len)


def test_bad_lengths_are_refused_where_they_are_ignored_too():
    q, k, v = qkv(4)
    for bad in (0, float("inf"), "4"):
        with pytest.raises(ValueError, match="seq_len="):
            posenc.attention(q, k, v, encoding=posenc.ALiBi(num_heads=H), seq_len=bad)


def test_query_lengths_are_the_last_of_the_key_lengths(rope):
    """Per-key lengths with fewer queries than keys: queries take the last S lengths, as they take the last S keys."""
    q, k, v = qkv(12)
    lengths = torch.full((12,), 12)
    out = posenc.attention(
        q[:, :, 9:],
        k,
        v,
        encoding=rope,
        q_positions=torch.arange(9, 12),
        k_positions=torch.arange(12),
        seq_len=lengths,
        backend="eager",
    )
    full = posenc.attention(q, k, v, encoding=rope, backend="eager")
    assert_close(out, full[:, :, 9:], **TOL)
