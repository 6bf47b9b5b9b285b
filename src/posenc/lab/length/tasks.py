"""Synthetic length-generalisation tasks for the byte-level lab model: copy and associative recall.

Each task returns ``(x, y, score_mask)`` for a sequence of ``length`` input tokens: ``seq`` holds ``length + 1``
tokens, ``x = seq[:, :-1]`` and ``y = seq[:, 1:]``, and ``score_mask`` marks the targets in ``y`` that are answers
(loss and exact match are measured there only). The content grows with ``length``, so a model trained at length
``L`` and evaluated at ``2L``... must copy longer strings / look further back.

All token ids are below 256 (the byte vocabulary) and printable, so ``bytes(seq.tolist()).decode()`` reads well:
copy ``".hello=hello"``, recall ``"AbCdEb=CdEb"``.

Tasks as in Kazemnejad et al. 2023, "The Impact of Positional Encoding on Length Generalization in Transformers"
(https://arxiv.org/abs/2305.19466) and Arora et al. 2023, Zoology's multi-query associative recall
(https://arxiv.org/abs/2312.04927).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from posenc._checks import check_positive_int, fail

#: Separates the question part from the answer part in both tasks (``"="``).
SEP = ord("=")
#: Left padding when the content does not fill ``length + 1`` tokens exactly (``"."``).
PAD = ord(".")
#: Copy symbols and recall values are ``FIRST_SYMBOL + i`` (``"a"``, ``"b"``, ...).
FIRST_SYMBOL = ord("a")
#: Recall keys are ``FIRST_KEY + i`` (``"A"``, ``"B"``, ...).
FIRST_KEY = ord("A")
MAX_SYMBOLS = 128  # ids 97..224
MAX_KEYS = 32  # ids 65..96, below the values


def copy_batch(
    batch: int,
    length: int,
    *,
    generator: torch.Generator,
    vocab: int = 16,
    min_symbols: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Copy: a random string, :data:`SEP`, then the same string again; the answers are the copy.

    Layout of each row's ``length + 1`` tokens ``seq``, with ``n`` symbols ``s_i`` drawn uniformly from
    ``FIRST_SYMBOL + [0, vocab)``::

        PAD * (length - 2n)   s_1 ... s_n   SEP   s_1 ... s_n

    ``n = length // 2`` (the string fills the sequence; at most one ``PAD``), or, when ``min_symbols`` is given,
    ``n`` is drawn per row uniformly from ``[min_symbols, length // 2]`` (more left padding), which mixes copy
    distances during training. ``score_mask`` is True on the last ``n`` targets of ``y``: the target after
    ``SEP`` is ``s_1`` and so on.

    Example: ``length=6``, ``n=3`` -> ``seq = "abc=abc"``, ``x = "abc=ab"``, ``y = "bc=abc"``,
    ``score_mask = [F, F, F, T, T, T]``.

    Args:
        batch: rows.
        length: input tokens per row (>= 2).
        generator: source of randomness (same generator state -> same batch).
        vocab: alphabet size, in ``[2, 128]``.
        min_symbols: if given, the smallest string length, in ``[1, length // 2]``.

    Shapes:
        x (batch, length) int64, y (batch, length) int64, score_mask (batch, length) bool.
    """
    _check_common(batch, length, generator, minimum=2)
    _check_alphabet("vocab", vocab, 2, MAX_SYMBOLS)
    half = length // 2
    if min_symbols is None:
        n = torch.full((batch,), half, dtype=torch.long)
    else:
        if isinstance(min_symbols, bool) or not isinstance(min_symbols, int) or not 1 <= min_symbols <= half:
            fail("min_symbols", min_symbols, f"an integer in [1, length // 2 = {half}] or None for full strings")
        n = torch.randint(min_symbols, half + 1, (batch,), generator=generator)  # (batch,)
    symbols = FIRST_SYMBOL + torch.randint(0, vocab, (batch, half), generator=generator)  # (batch, half)
    # Right-align: position p of seq (0 <= p <= length) relative to the SEP at index length - n.
    pos = torch.arange(length + 1)[None, :]  # (1, length + 1)
    sep_at = (length - n)[:, None]  # (batch, 1)
    first = sep_at - n[:, None]  # (batch, 1) index of s_1
    # Symbol index of each position in the first copy (p - first) and the second (p - sep_at - 1), clamped for gather.
    in_first = (pos >= first) & (pos < sep_at)
    in_second = pos > sep_at
    which = torch.where(in_first, pos - first, pos - sep_at - 1).clamp(0, half - 1)  # (batch, length + 1)
    seq = torch.where(in_first | in_second, symbols.gather(1, which), PAD)
    seq = torch.where(pos == sep_at, SEP, seq)  # (batch, length + 1)
    score_mask = in_second[:, 1:]  # target t is seq[t + 1]
    return seq[:, :-1], seq[:, 1:], score_mask


def recall_layout(length: int) -> tuple[int, int, int]:
    """``(pad, pairs, queries)`` of :func:`recall_batch` at ``length``: ``pad + 2 * pairs + 1 + 2 * queries ==
    length + 1`` with ``queries = max(1, length // 4)`` (about half the tokens are queries and answers, so
    each sequence gives many answer targets to learn from)."""
    check_positive_int("length", length)
    if length < 4:
        fail("length", length, "an integer >= 4 (one key-value pair, SEP, one query and its answer)")
    queries = max(1, length // 4)
    pairs = (length - 2 * queries) // 2
    return length - 2 * pairs - 2 * queries, pairs, queries


def recall_batch(
    batch: int,
    length: int,
    *,
    generator: torch.Generator,
    keys: int = 8,
    values: int = 8,
    min_pairs: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Multi-query associative recall: key-value pairs, :data:`SEP`, then queried keys each followed by its value.

    Each row draws its own dictionary: every key ``FIRST_KEY + [0, keys)`` gets a value ``FIRST_SYMBOL + [0,
    values)`` (uniform, independent). Layout of each row's ``length + 1`` tokens ``seq``
    (``pad, p, m = recall_layout(length)``: ``m = max(1, length // 4)`` queries, ``p = (length - 2m) // 2``
    pairs, ``pad`` in {0, 1})::

        PAD * pad   k_1 v_1 ... k_p v_p   SEP   q_1 a_1 ... q_m a_m

    Pair keys ``k_i`` are uniform with replacement (a key may repeat; its value is the same each time, so
    answers are unambiguous at any length); ``v_i`` is ``k_i``'s value. Queries ``q_j`` are the keys of ``m``
    distinct pairs chosen uniformly; ``a_j`` is ``q_j``'s value. ``score_mask`` is True on the ``m`` targets that
    are answers (the target of the input token ``q_j``); the targets ``q_{j+1}`` are random and not scored.

    When ``min_pairs`` is given, each row draws its own number of pairs ``n`` uniformly from ``[min_pairs, p]``
    and asks ``min(m, n)`` queries; the content is right-aligned after more left padding (``PAD * (length - 2n -
    2 min(m, n))``), which mixes dictionary sizes and look-back distances during training. ``n = p`` gives the
    full layout above.

    Example: ``length=10`` -> ``pad=0, p=3, m=2``: ``seq = "AbCdEb=EbAb"`` (``x = "AbCdEb=EbA"``), answers
    ``b, b`` are ``y[7]`` and ``y[9]``: ``score_mask = [F] * 7 + [T, F, T]``. With ``min_pairs=1``, a row that
    draws ``n = 1`` is ``seq = "......Cd=Cd"`` (one pair, one query): ``score_mask = [F] * 9 + [T]``.

    Args:
        batch: rows.
        length: input tokens per row (>= 4).
        generator: source of randomness (same generator state -> same batch).
        keys: key alphabet size, in ``[1, 32]``.
        values: value alphabet size, in ``[2, 128]``.
        min_pairs: if given, the smallest number of pairs, in ``[1, p]``.

    Shapes:
        x (batch, length) int64, y (batch, length) int64, score_mask (batch, length) bool.
    """
    _check_common(batch, length, generator, minimum=4)
    _check_alphabet("keys", keys, 1, MAX_KEYS)
    _check_alphabet("values", values, 2, MAX_SYMBOLS)
    _, p, m = recall_layout(length)
    if min_pairs is None:
        n = torch.full((batch,), p, dtype=torch.long)
    else:
        if isinstance(min_pairs, bool) or not isinstance(min_pairs, int) or not 1 <= min_pairs <= p:
            fail("min_pairs", min_pairs, f"an integer in [1, {p}] (the pairs at length {length}) or None for full rows")
        n = torch.randint(min_pairs, p + 1, (batch,), generator=generator)  # (batch,) pairs per row
    table = torch.randint(0, values, (batch, keys), generator=generator)  # (batch, keys) each row's dictionary
    pair_keys = torch.randint(0, keys, (batch, p), generator=generator)  # (batch, p)
    order = torch.rand(batch, p, generator=generator).masked_fill(torch.arange(p) >= n[:, None], 2.0)  # (batch, p)
    chosen = order.argsort(dim=1)[:, :m]  # (batch, m) distinct pair indices below n first
    query_keys = pair_keys.gather(1, chosen)  # (batch, m)
    # Right-align: position t of seq (0 <= t <= length) relative to the SEP at index length - 2 * queries.
    t = torch.arange(length + 1)[None, :]  # (1, length + 1)
    sep_at = (length - 2 * n.clamp(max=m))[:, None]  # (batch, 1)
    first = sep_at - 2 * n[:, None]  # (batch, 1) index of k_1
    in_pairs, in_queries = (t >= first) & (t < sep_at), t > sep_at
    offset = torch.where(in_pairs, t - first, t - sep_at - 1)  # (batch, length + 1) within the pair / query part
    slot = (offset // 2).clamp(0, p - 1)  # (batch, length + 1) pair or query index
    key = torch.where(in_pairs, pair_keys.gather(1, slot), query_keys.gather(1, slot.clamp(max=m - 1)))
    token = torch.where(offset % 2 == 0, FIRST_KEY + key, FIRST_SYMBOL + table.gather(1, key))
    seq = torch.where(in_pairs | in_queries, token, PAD)
    seq = torch.where(t == sep_at, SEP, seq)  # (batch, length + 1)
    score_mask = (in_queries & (offset % 2 == 1))[:, 1:]  # target i is seq[i + 1]
    return seq[:, :-1], seq[:, 1:], score_mask


#: The tasks by their ``--task`` name: ``TASKS[name](batch, length, generator=g)``.
TASKS: dict[str, Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor]]] = {
    "copy": copy_batch,
    "recall": recall_batch,
}


def _check_common(batch: int, length: int, generator: object, *, minimum: int) -> None:
    check_positive_int("batch", batch)
    check_positive_int("length", length)
    if length < minimum:
        fail("length", length, f"an integer >= {minimum} for this task")
    if not isinstance(generator, torch.Generator):
        fail("generator", generator, "a torch.Generator, e.g. torch.Generator().manual_seed(seed)")


def _check_alphabet(name: str, value: object, low: int, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        fail(name, value, f"an integer in [{low}, {high}] (token ids must stay below 256)")
