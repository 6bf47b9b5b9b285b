"""posenc.lab.length.tasks: exact layouts of the copy and recall tasks, determinism, exact match
(``posenc.lab.common.evaluate.exact_match``, the score of every task)."""

from __future__ import annotations

import pytest
import torch

from posenc.lab.common.evaluate import exact_match
from posenc.lab.length.tasks import (
    FIRST_KEY,
    FIRST_SYMBOL,
    PAD,
    SEP,
    TASKS,
    copy_batch,
    recall_batch,
    recall_layout,
)


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _seq(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    assert torch.equal(x[:, 1:], y[:, :-1]), "y must be x shifted by one"
    return torch.cat([x[:, :1], y], dim=1)  # (B, length + 1)


def test_token_ids_are_bytes_and_do_not_collide():
    keys = set(range(FIRST_KEY, FIRST_KEY + 32))
    symbols = set(range(FIRST_SYMBOL, FIRST_SYMBOL + 128))
    assert max(symbols) < 256 and not keys & symbols
    assert SEP not in keys | symbols and PAD not in keys | symbols and SEP != PAD


def test_copy_small_fixed_example():
    x, y, mask = copy_batch(1, 6, generator=_gen(), vocab=4)
    seq = bytes(_seq(x, y)[0].tolist()).decode()
    assert seq[3] == "=" and seq[:3] == seq[4:] and set(seq[:3]) <= set("abcd")
    assert mask.tolist() == [[False, False, False, True, True, True]]
    assert bytes(y[0][mask[0]].tolist()).decode() == seq[:3]


@pytest.mark.parametrize("length", [2, 3, 6, 7, 32, 65])
def test_copy_layout(length):
    x, y, mask = copy_batch(16, length, generator=_gen(length), vocab=16)
    assert x.shape == y.shape == mask.shape == (16, length)
    assert x.dtype == y.dtype == torch.int64 and mask.dtype == torch.bool
    n = length // 2
    seq = _seq(x, y)
    pad = length - 2 * n
    assert (seq[:, :pad] == PAD).all()
    first, sep, second = seq[:, pad : pad + n], seq[:, pad + n], seq[:, pad + n + 1 :]
    assert (sep == SEP).all() and torch.equal(first, second)
    assert ((first >= FIRST_SYMBOL) & (first < FIRST_SYMBOL + 16)).all()
    assert torch.equal(mask, (torch.arange(length) >= length - n).expand(16, length))
    assert torch.equal(y[mask].view(16, n), first)


def test_copy_min_symbols_varies_the_string_length_with_left_padding():
    length = 12
    x, y, mask = copy_batch(200, length, generator=_gen(), vocab=8, min_symbols=2)
    seq = _seq(x, y)
    n = mask.sum(dim=1)
    assert set(n.tolist()) == {2, 3, 4, 5, 6}
    for row, k in zip(seq, n.tolist(), strict=True):
        pad = length + 1 - (2 * k + 1)
        assert (row[:pad] == PAD).all() and row[pad + k] == SEP
        assert torch.equal(row[pad : pad + k], row[pad + k + 1 :])
        assert not (row[pad:] == PAD).any()


def test_recall_small_fixed_example():
    x, y, mask = recall_batch(1, 10, generator=_gen(), keys=4, values=4)
    seq = bytes(_seq(x, y)[0].tolist()).decode()  # e.g. "AbCdEb=EbAb"
    assert len(seq) == 11 and seq[6] == "="
    pairs = {seq[i]: seq[i + 1] for i in range(0, 6, 2)}  # consistent dictionary: a repeated key keeps its value
    assert all(k in "ABCD" and v in "abcd" for k, v in pairs.items())
    assert seq[7] in pairs and seq[8] == pairs[seq[7]] and seq[9] in pairs and seq[10] == pairs[seq[9]]
    assert mask.tolist() == [[False] * 7 + [True, False, True]]


@pytest.mark.parametrize("length", range(4, 40))
def test_recall_layout_arithmetic(length):
    pad, pairs, queries = recall_layout(length)
    assert pad in (0, 1) and pairs >= 1 and 1 <= queries <= pairs
    assert queries == max(1, length // 4)
    assert pad + 2 * pairs + 1 + 2 * queries == length + 1


@pytest.mark.parametrize("length", [4, 5, 8, 17, 64, 129])
def test_recall_layout(length):
    batch, keys, values = 32, 6, 5
    x, y, mask = recall_batch(batch, length, generator=_gen(length), keys=keys, values=values)
    assert x.shape == y.shape == mask.shape == (batch, length)
    assert x.dtype == y.dtype == torch.int64 and mask.dtype == torch.bool
    pad, p, m = recall_layout(length)
    seq = _seq(x, y)
    for row, row_mask in zip(seq.tolist(), mask, strict=True):
        assert row[:pad] == [PAD] * pad and row[pad + 2 * p] == SEP
        table = {}
        for k, v in zip(row[pad : pad + 2 * p : 2], row[pad + 1 : pad + 2 * p : 2], strict=True):
            assert FIRST_KEY <= k < FIRST_KEY + keys and FIRST_SYMBOL <= v < FIRST_SYMBOL + values
            assert table.setdefault(k, v) == v
        queries, answers = row[pad + 2 * p + 1 :: 2], row[pad + 2 * p + 2 :: 2]
        assert len(queries) == len(answers) == m
        assert all(table[q] == a for q, a in zip(queries, answers, strict=True))
        scored = row_mask.nonzero().flatten() + 1  # seq index of each scored target
        assert scored.tolist() == list(range(pad + 2 * p + 2, length + 1, 2))


def test_recall_min_pairs_varies_the_dictionary_with_left_padding():
    length = 17  # recall_layout: pad 1, p = 4 pairs, m = 4 queries
    x, y, mask = recall_batch(300, length, generator=_gen(), keys=6, values=5, min_pairs=1)
    _, p, m = recall_layout(length)
    seq = _seq(x, y).tolist()
    seen = set()
    for row, row_mask in zip(seq, mask, strict=True):
        sep = row.index(SEP)
        queries = length - sep  # tokens after SEP: 2 per query
        pad = next(i for i, t in enumerate(row) if t != PAD)
        n = (sep - pad) // 2
        seen.add(n)
        assert queries == 2 * min(m, n) and (sep - pad) % 2 == 0 and row[:pad] == [PAD] * pad
        assert PAD not in row[pad:] and row.count(SEP) == 1
        pair_keys = row[pad:sep:2]
        table = {}
        for k, v in zip(pair_keys, row[pad + 1 : sep : 2], strict=True):
            assert FIRST_KEY <= k < FIRST_KEY + 6 and FIRST_SYMBOL <= v < FIRST_SYMBOL + 5
            assert table.setdefault(k, v) == v
        q, a = row[sep + 1 :: 2], row[sep + 2 :: 2]
        assert all(table[k] == v for k, v in zip(q, a, strict=True))
        assert all(q.count(k) <= pair_keys.count(k) for k in set(q))  # distinct pairs among this row's n
        assert (row_mask.nonzero().flatten() + 1).tolist() == list(range(sep + 2, length + 1, 2))
    assert seen == set(range(1, p + 1))


def test_recall_min_pairs_equal_to_all_pairs_is_the_full_layout():
    full = recall_batch(8, 20, generator=_gen(3))
    _, p, _ = recall_layout(20)
    x, y, mask = recall_batch(8, 20, generator=_gen(3), min_pairs=p)
    pad, _, m = recall_layout(20)
    seq = _seq(x, y)
    assert (seq[:, pad + 2 * p] == SEP).all() and (mask.sum(dim=1) == m).all()
    assert torch.equal(mask, full[2])


def test_recall_queries_are_distinct_pairs():
    # queries pick distinct pairs, so a key is never queried more often than it occurs (with replacement it would be)
    x, y, _ = recall_batch(500, 80, generator=_gen(), keys=32, values=8)
    pad, p, m = recall_layout(80)
    seq = _seq(x, y)
    pair_keys = seq[:, pad : pad + 2 * p : 2]
    query_keys = seq[:, pad + 2 * p + 1 :: 2]
    for pk, qk in zip(pair_keys.tolist(), query_keys.tolist(), strict=True):
        for key in set(qk):  # a key is queried at most as often as it occurs among the pairs
            assert qk.count(key) <= pk.count(key)


@pytest.mark.parametrize("make", [copy_batch, recall_batch])
def test_tasks_are_deterministic_in_the_generator(make):
    a = make(4, 16, generator=_gen(7))
    b = make(4, 16, generator=_gen(7))
    c = make(4, 16, generator=_gen(8))
    assert all(torch.equal(u, v) for u, v in zip(a, b, strict=True))
    assert not torch.equal(a[0], c[0])
    assert TASKS["copy"] is copy_batch and TASKS["recall"] is recall_batch


def test_exact_match_counts_rows_whose_answers_are_all_right():
    y = torch.tensor([[1, 2, 3], [1, 2, 3]])
    mask = torch.tensor([[False, True, True], [False, True, True]])
    logits = torch.nn.functional.one_hot(y, 5).float()  # perfect
    assert exact_match(logits, y, mask) == 1.0
    logits[0, 0] = torch.tensor([0.0, 0.0, 0.0, 0.0, 9.0])  # wrong on an unscored target: still right
    assert exact_match(logits, y, mask) == 1.0
    logits[1, 2] = torch.tensor([9.0, 0.0, 0.0, 0.0, 0.0])  # one wrong answer fails its row
    assert exact_match(logits, y, mask) == 0.5
    logits[0, 1] = torch.tensor([9.0, 0.0, 0.0, 0.0, 0.0])
    assert exact_match(logits, y, mask) == 0.0


def test_errors_say_what_is_allowed():
    g = _gen()
    with pytest.raises(ValueError, match=r"length=1 is invalid: expected an integer >= 2"):
        copy_batch(2, 1, generator=g)
    with pytest.raises(ValueError, match=r"vocab=200 is invalid: expected an integer in \[2, 128\]"):
        copy_batch(2, 8, generator=g, vocab=200)
    with pytest.raises(ValueError, match=r"min_symbols=5 is invalid: expected an integer in \[1, length // 2 = 4\]"):
        copy_batch(2, 8, generator=g, min_symbols=5)
    with pytest.raises(ValueError, match=r"generator=None is invalid: expected a torch.Generator"):
        copy_batch(2, 8, generator=None)
    with pytest.raises(ValueError, match=r"length=3 is invalid: expected an integer >= 4"):
        recall_batch(2, 3, generator=g)
    with pytest.raises(ValueError, match=r"min_pairs=0 is invalid: expected an integer in \[1, 3\] \(the pairs at"):
        recall_batch(2, 12, generator=g, min_pairs=0)
    with pytest.raises(ValueError, match=r"keys=33 is invalid: expected an integer in \[1, 32\]"):
        recall_batch(2, 8, generator=g, keys=33)
    with pytest.raises(ValueError, match=r"batch=0 is invalid: expected a positive integer"):
        recall_batch(0, 8, generator=g)
    y = torch.zeros(2, 3, dtype=torch.long)
    with pytest.raises(ValueError, match=r"logits=\(2, 4, 5\) is invalid: expected \(B, S, V\) logits matching y"):
        exact_match(torch.zeros(2, 4, 5), y, torch.ones(2, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"score_mask=torch.int64 is invalid: expected a bool tensor"):
        exact_match(torch.zeros(2, 3, 5), y, torch.ones(2, 3, dtype=torch.long))
