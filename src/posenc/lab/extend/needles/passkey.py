"""Passkey retrieval: a number hidden at a chosen depth in filler text; the model is asked to repeat it.

The prompt of Mohtashami & Jaggi 2023, "Landmark Attention: Random-Access Infinite Context Length for Transformers"
(https://arxiv.org/abs/2305.16300, appendix), as later used to test RoPE extensions (Chen et al. 2023, PI; Peng et
al. 2023, YaRN). Layout, ``FILLER`` sentences cycled around the ``NEEDLE``::

    ...is blue. The sun is yellow. The pass key is 68203. Remember it. 68203 is the pass key. Here we go. There
    and back again.
    What is the pass key? The pass key is

The filler ends on a whole sentence ("There and back again.") and is cut at its FRONT to hit a length exactly, so a
prompt reads like a window into a long document. ``depth`` is the share of the filler before the needle (0: the
needle opens the prompt, 1: it sits just before the question), rounded to the nearest sentence boundary.

Two consumers:

- byte-level lab models: :func:`passkey_batch` gives ``(x, y, score_mask)`` like ``posenc.lab.length.tasks`` (the
  five digits after ``"The pass key is "`` are the scored targets), and :func:`lab_accuracy` scores exact match by
  teacher-forced argmax, which equals greedy decoding's exact match: if every teacher-forced argmax is the true
  digit, greedy decoding feeds itself exactly the teacher's inputs.
- Hugging Face models: :func:`passkey_prompt` with a tokenizer fits the prompt to a length in tokens, and
  :func:`hf_accuracy` greedily generates the answer and compares its first number with the key.
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Callable, Iterator
from itertools import cycle, islice

import torch

from posenc._checks import check_positive_int, fail
from posenc.lab.common.evaluate import task_accuracy

FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
NEEDLE = "The pass key is {key}. Remember it. {key} is the pass key."
QUESTION = "What is the pass key? The pass key is"
#: Keys are five-digit numbers, so every prompt of a given length has the same layout.
KEY_LOW, KEY_HIGH = 10_000, 100_000
DIGITS = 5

_SENTENCES = tuple(s if s.endswith(".") else s + "." for s in FILLER.split(". "))
#: Characters of the shortest prompt: the needle, the line break, the question (no filler).
MIN_CHARS = len(NEEDLE.format(key=KEY_LOW)) + 1 + len(QUESTION)


def _check_depth(depth: object) -> float:
    if isinstance(depth, bool) or not isinstance(depth, (int, float)) or not 0.0 <= depth <= 1.0:
        fail("depth", depth, "a fraction in [0, 1] (0: needle first, 1: needle just before the question)")
    return float(depth)


def _check_key(key: object) -> int:
    if isinstance(key, bool) or not isinstance(key, int) or not KEY_LOW <= key < KEY_HIGH:
        fail("key", key, f"a five-digit integer in [{KEY_LOW}, {KEY_HIGH - 1}]")
    return key


def filler_sentences(count: int) -> list[str]:
    """The last ``count`` sentences of an endless :data:`FILLER`, in reading order: built backwards, so the filler
    ends on "There and back again." and a longer filler only adds sentences at its front."""
    return list(islice(cycle(reversed(_SENTENCES)), count))[::-1]


def sentence_gap(depth: float, sentences: int) -> int:
    """The sentence boundary nearest ``depth`` of a filler of ``sentences`` sentences: a needle at ``depth`` goes
    before sentence ``sentence_gap(depth, n)`` (0: first, ``n``: after the last)."""
    return round(depth * sentences)


def _body(chars: int, depth: float, key: int) -> str:
    """Filler with the needle inside, exactly ``chars`` characters (``chars >= len(needle)``)."""
    needle = NEEDLE.format(key=key)
    budget = chars - len(needle)  # filler characters, counting the spaces that join units
    count = filled = 0
    for sentence in cycle(reversed(_SENTENCES)):  # the fewest sentences that fill the budget
        if budget <= filled:
            break
        count, filled = count + 1, filled + len(sentence) + 1
    units = filler_sentences(count)
    gap = sentence_gap(depth, len(units))  # the needle goes before units[gap]
    units.insert(gap, needle)
    excess = sum(len(u) for u in units) + len(units) - 1 - chars
    first = 1 if gap == 0 else 0  # trim filler, never the needle
    while excess > 0 and excess >= len(units[first]) + 1:  # drop whole sentences first (with their joining space)
        excess -= len(units.pop(first)) + 1
    if excess > 0:
        units[first] = units[first][excess:]  # the prompt (or the text after the needle) starts mid-sentence
    text = " ".join(units)
    assert len(text) == chars, (len(text), chars)  # noqa: S101 - construction invariant
    return text


def passkey_text(chars: int, depth: float, key: int) -> str:
    """The prompt in exactly ``chars`` characters (ASCII, so also bytes), ending with :data:`QUESTION`.

    Args:
        chars: prompt length, at least :data:`MIN_CHARS`.
        depth: share of the filler placed before the needle, in [0, 1].
        key: the five-digit pass key.
    """
    check_positive_int("chars", chars)
    if chars < MIN_CHARS:
        fail("length", chars, f"at least {MIN_CHARS} bytes (the needle, a line break and the question)")
    return _body(chars - 1 - len(QUESTION), _check_depth(depth), _check_key(key)) + "\n" + QUESTION


def _count(tokenizer, text: str) -> int:  # noqa: ANN001
    return len(tokenizer(text)["input_ids"])


def passkey_prompt(length: int, depth: float, key: int, tokenizer=None) -> str:  # noqa: ANN001
    """The prompt fitted to ``length`` bytes exactly, or to ``length`` tokens of ``tokenizer`` (special tokens
    included) as closely as the tokenizer allows from below: the longest prompt with at most ``length`` tokens.

    Raises:
        ValueError: ``length`` is too short for the needle and the question.
    """
    check_positive_int("length", length)
    if tokenizer is None:
        return passkey_text(length, depth, key)
    low = MIN_CHARS
    if _count(tokenizer, passkey_text(low, depth, key)) > length:
        fail("length", length, f"at least {_count(tokenizer, passkey_text(low, depth, key))} tokens for this prompt")
    high = max(2 * low, 4 * length)
    while _count(tokenizer, passkey_text(high, depth, key)) <= length:
        low, high = high, 2 * high
    while high - low > 1:  # invariant: the prompt of `low` chars fits, the one of `high` chars does not
        mid = (low + high) // 2
        if _count(tokenizer, passkey_text(mid, depth, key)) <= length:
            low = mid
        else:
            high = mid
    return passkey_text(low, depth, key)


def min_length(tokenizer=None) -> int:  # noqa: ANN001
    """The shortest length a prompt fits in: bytes (:data:`MIN_CHARS`), or tokens of ``tokenizer`` (an estimate
    over depth 0 and 1)."""
    if tokenizer is None:
        return MIN_CHARS
    return max(_count(tokenizer, passkey_text(MIN_CHARS, d, KEY_HIGH - 1)) for d in (0.0, 1.0))


def passkey_batch(
    batch: int, length: int, *, generator: torch.Generator, depth: float | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Byte-level passkey rows: the prompt, a space, the five key digits; the digits are the scored targets.

    Each row draws its key uniformly from ``[10000, 99999]`` and, when ``depth`` is None, its depth uniformly from
    [0, 1]. The row's ``length + 1`` bytes are ``passkey_text(length - 5) + " " + key`` (so the model's input ``x``
    holds ``length`` bytes, the last four key digits included, as in ``posenc.lab.length.tasks``), ``y`` is ``x``
    shifted by one and ``score_mask`` is True on the last five targets of ``y``, the digits.

    Shapes:
        x (batch, length) int64, y (batch, length) int64, score_mask (batch, length) bool.
    """
    check_positive_int("batch", batch)
    check_positive_int("length", length)
    if length < MIN_CHARS + DIGITS:
        fail("length", length, f"at least {MIN_CHARS + DIGITS} bytes (the prompt and the key's digits)")
    if not isinstance(generator, torch.Generator):
        fail("generator", generator, "a torch.Generator, e.g. torch.Generator().manual_seed(seed)")
    if depth is not None:
        _check_depth(depth)
    keys = torch.randint(KEY_LOW, KEY_HIGH, (batch,), generator=generator)  # (batch,)
    # (batch,) depths: drawn, else the one given
    depths = torch.rand(batch, generator=generator, dtype=torch.float64).tolist() if depth is None else [depth] * batch
    rows = []
    for i in range(batch):
        text = passkey_text(length - DIGITS, depths[i], int(keys[i])) + " " + str(int(keys[i]))
        rows.append(torch.frombuffer(bytearray(text.encode("ascii")), dtype=torch.uint8))
    seq = torch.stack(rows).long()  # (batch, length + 1)
    mask = torch.zeros(batch, length, dtype=torch.bool)
    mask[:, -DIGITS:] = True  # target t is seq[t + 1]: the last five targets are the digits
    return seq[:, :-1], seq[:, 1:], mask


def batch_maker(
    length: int, depth: float | None
) -> Callable[[int, torch.Generator], tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """``make(n, generator)`` for ``posenc.lab.common.evaluate.task_accuracy``: passkey rows at a length and depth."""
    return lambda n, generator: passkey_batch(n, length, generator=generator, depth=depth)


def lab_accuracy(model, *, length: int, depth: float, trials: int, seed: int) -> float:  # noqa: ANN001
    """Exact-match passkey accuracy of a byte-level lab ``GPT`` at ``length`` and ``depth`` over ``trials`` keys
    (teacher-forced argmax over the five digits, equal to greedy decoding's exact match)."""
    _, accuracy = task_accuracy(
        model, batch_maker(length, depth), length=length, n_sequences=trials, seed=seed, batch_size=16
    )
    return accuracy


def answer_matches(text: str, key: int) -> bool:
    """Whether the first number in a generated answer is ``key`` (``" 68203. Remember"`` matches 68203)."""
    found = re.search(r"\d+", text)
    return found is not None and found.group() == str(key)


def prompt_ids(tokenizer, length: int, depth: float, key: int, cache: dict | None = None) -> torch.Tensor:  # noqa: ANN001
    """The prompt's token ids, ``(1, <= length)``; with ``cache`` (a dict) each prompt is fitted once (1.6 s at 12k
    tokens for SmolLM2's tokenizer) and reused, e.g. by every method of a study, which all get the same keys."""
    slot = (length, float(depth), key)
    if cache is not None and slot in cache:
        return cache[slot]
    ids = tokenizer(passkey_prompt(length, depth, key, tokenizer), return_tensors="pt")["input_ids"]  # (1, ~length)
    if cache is not None:
        cache[slot] = ids
    return ids


@contextlib.contextmanager
def past_max_length_allowed() -> Iterator[None]:
    """Silence transformers' "exceeded the model's predefined maximum length" reminder: running past the trained
    length is what a passkey test past the original context does, on purpose."""
    log = logging.getLogger("transformers.generation.stopping_criteria")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(level)


@torch.inference_mode()
def hf_accuracy(
    model,  # noqa: ANN001
    tokenizer,  # noqa: ANN001
    *,
    length: int,
    depth: float,
    trials: int,
    seed: int,
    prompts: dict | None = None,
    on_trial: Callable[[], None] | None = None,
    share_prefix: bool = False,
    answers: list[list[int]] | None = None,
    outcomes: list[float] | None = None,
) -> float:
    """Exact-match passkey accuracy of a transformers causal LM: the prompt fitted to ``length`` tokens, greedy
    ``generate`` of enough tokens for the key (one prefill, then a few decode steps on the KV cache), and the first
    number of the answer compared with the key.

    Args:
        prompts: a dict caching the prompts' token ids across calls (see ``prompt_ids``).
        on_trial: called after each key, for progress.
        share_prefix: the keys' prompts share everything before the key: compute its KV cache once and generate
            each key's answer on a copy (``posenc.lab.extend.needles.shared_prefix``; never for dynamic, longrope,
            dca, dca_vllm). Off by default: on SmolLM2 in bfloat16 it was not faster on a loaded 2-core CPU and one
            of two 8k answers changed (rounding), see BENCHMARKS.md; False: a fresh ``generate`` per key.
        answers: a list that gets each key's generated token ids.
        outcomes: a list that gets each key's score, 1.0 found or 0.0 not, in the keys' order (a race pairs models
            on them: ``posenc.lab.extend.stats.race``).
    """
    from posenc.lab.extend.needles.shared_prefix import SharedPrefix, cache_name, split_cached_attention

    generator = torch.Generator().manual_seed(seed)
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    keys = [int(torch.randint(KEY_LOW, KEY_HIGH, (), generator=generator)) for _ in range(trials)]
    inputs = [prompt_ids(tokenizer, length, depth, key, prompts).to(device) for key in keys]  # each (1, ~length)
    shared = SharedPrefix(model, inputs) if share_prefix else None
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    right = 0
    for key, ids in zip(keys, inputs, strict=True):
        new = len(tokenizer(" " + str(key), add_special_tokens=False)["input_ids"]) + 2
        cache = None if shared is None else shared.cache_for(ids)
        extra = {} if cache is None else {cache_name(model): cache}
        with past_max_length_allowed(), split_cached_attention() if cache is not None else contextlib.nullcontext():
            out = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=new,
                do_sample=False,
                pad_token_id=pad,
                **extra,
            )  # (1, ~length + new)
        answer = out[0, ids.shape[1] :]
        if answers is not None:
            answers.append(answer.tolist())
        found = answer_matches(tokenizer.decode(answer, skip_special_tokens=True), key)
        right += found
        if outcomes is not None:
            outcomes.append(float(found))
        if on_trial is not None:
            on_trial()
    model.train(was_training)
    return right / trials
