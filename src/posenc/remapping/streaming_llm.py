"""StreamingLLM: attention sinks with a rolling window (Xiao et al. 2024, "Efficient Streaming Language Models with
Attention Sinks", ICLR 2024, arXiv:2309.17453).

The KV cache keeps the first ``sinks`` tokens (the attention sinks) and the ``window`` most recent ones; everything
between is evicted. Positions are assigned *within the cache* (the reference's "pos-shift"). The branches, the rule
for ``window`` and how it differs from LM-Infinite: ``StreamingLLM``.

Reference implementation: ``mit-han-lab/streaming-llm`` (``streaming_llm/kv_cache.py``: ``StartRecentKVCache``,
``start_size`` = ``sinks``, ``recent_size`` = ``window``, keeping ``k[:start_size]`` and ``k[seq_len -
recent_size:]``; ``streaming_llm/pos_shift/modify_llama.py``: ``llama_pos_shift_attention_forward``, keys rotated
at ``arange(kv_seq_len)`` after the cache concatenation, the query at its ``position_ids``, which transformers sets
to the cache length; ``examples/run_streaming_llama.py``: ``--start_size 4 --recent_size 2000``), checked in
``tests/reference/remapping.py`` (``streaming_llm``) by simulating that cache token by token.

Shapes:
    position maps (..., N) -> (..., N) integer; regions i (..., S, 1), j (..., 1, T) -> bool (..., S, T).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from posenc._checks import check_positive_int, fail
from posenc.remapping._branch import Branch, KeyInterval, RemapMethod, identity

#: The reference's ``--start_size`` (``run_streaming_llama.py``; the paper's 4 attention sinks).
SINKS = 4


@dataclass(frozen=True, kw_only=True, slots=True)
class StreamingLLM(RemapMethod):
    """StreamingLLM with ``sinks`` initial tokens (``start_size``; 0: a rolling window alone) and a ``window`` of
    recent tokens (``recent_size``).

    A key is rotated at its index in the cache and the query at the cache's last index, ``min(i, sinks + window)``.
    Inside the window that shifts queries and keys alike, so distances stay ``i - j``; a sink ``j`` sits right before
    the window, at distance ``min(i, sinks + window) - j``. As branches: *window* (``i - j <= window``: the cached
    recent keys and the query's own, plain positions) and *sinks* (``j < sinks``, farther: the query at
    ``min(i, sinks + window)``, the key at ``j``); every other pair is masked. Reach unlimited: no distance exceeds
    ``sinks + window``, and the rule ``window = L - 1 - sinks`` (:meth:`for_target`) keeps the attention span
    (``sinks + window`` cached keys and the new token) within the training length ``L``, every position below ``L``.

    How it differs from LM-Infinite (``lm_infinite.py``): both mask the middle of a Λ shape. LM-Infinite keeps positions
    un-shifted and caps the distance: its ``global_tokens`` (10) first tokens are all scored at the one distance
    ``window`` (query at ``window``, key at 0) once farther than its window (``i - j < window``, ``window = L``);
    StreamingLLM re-indexes the cache, so its ``sinks`` (4) keep distinct, ordered distances (``window + 1`` up to
    ``sinks + window`` once the cache is full, their true distances before), its window holds ``window + 1`` keys
    (``i - j <= window``), and the query's own position stops growing at ``sinks + window``.

    posenc computes the attention StreamingLLM computes, not its memory bound: the patched model's cache keeps every
    key (un-rotated), and the evicted ones are masked (skipped per query block in ``remap_attention``). Every query is
    scored as the reference's token-by-token loop scores it (``examples/eval_long_ppl.py``: one token per forward, the
    cache evicted after each), so a prefill equals decoding; the reference's ``run_streaming_llama.py`` instead
    prefills each prompt in one forward with no eviction inside it (``evict_for_space`` makes room before), which
    for a prompt longer than the cache is plain attention at positions past ``L``.
    """

    window: int
    sinks: int = SINKS
    name = "streaming_llm"

    def __post_init__(self) -> None:
        check_positive_int("window", self.window)
        if isinstance(self.sinks, bool) or not isinstance(self.sinks, int) or self.sinks < 0:
            fail("sinks", self.sinks, "a non-negative integer")

    @classmethod
    def for_target(
        cls, original: int, target: int, *, window: int | None = None, sinks: int | None = None
    ) -> StreamingLLM:
        """The reference's 4 sinks, and the largest window keeping the cache's positions below ``L``:
        ``window = L - 1 - sinks`` (``sinks + window`` cached keys plus the token being decoded)."""
        sinks = SINKS if sinks is None else sinks
        if isinstance(sinks, bool) or not isinstance(sinks, int) or sinks < 0:
            fail("sinks", sinks, "a non-negative integer")
        if sinks >= original - 1:
            fail("sinks", sinks, f"less than {original - 1} (the pretraining length {original} minus 1)")
        window = original - 1 - sinks if window is None else window
        method = cls(window=window, sinks=sinks)
        method.check_target(original, target)
        return method

    def reach(self, original: int) -> float:
        return math.inf if self.sinks + self.window <= original - 1 else 0

    def limiting_parameter(self) -> tuple[str, object]:
        return "window", self.window

    def branches(self) -> tuple[Branch, ...]:
        w, n = self.window, self.sinks
        return (
            # window j >= i - w; sinks j < i - w and j < n
            Branch(name="window", query=identity, key=identity, region=KeyInterval(first=lambda i: i - w)),
            Branch(
                name="sinks",
                query=lambda i: torch.clamp(i, max=n + w),
                key=identity,
                region=KeyInterval(end=lambda i: torch.clamp(i - w, max=n)),
            ),
        )
