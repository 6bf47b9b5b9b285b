"""Many pass keys in one document, every answer scored teacher-forced in the one forward of the document.

The passkey of Mohtashami & Jaggi 2023 (``needles.passkey``: its filler, its sentence boundaries, its five-digit keys)
with ``k`` labelled needles, as RULER's multi-key needle in a haystack (Hsieh et al. 2024,
https://arxiv.org/abs/2404.06654, ``niah_multikey``), followed by every question with its answer::

    ...The sun is yellow. The pass key for door maple is 68203. Remember it. 68203 is the pass key for door maple.
    Here we go. ... There and back again.
    What is the pass key for door cedar? The pass key for door cedar is 41977.
    What is the pass key for door maple? The pass key for door maple is 68203.

One forward of the document gives ``k`` paired outcomes instead of the one of a passkey prompt and its ``generate``:
:func:`key_document` builds it to exactly ``length`` tokens, :func:`score_document` scores it.
"""

from __future__ import annotations

import inspect
import math
import random
import time
from bisect import bisect_left, bisect_right
from collections.abc import Callable
from dataclasses import dataclass

import torch

from posenc._checks import check_positive_int, fail
from posenc.lab.extend.needles.passkey import DIGITS, KEY_HIGH, KEY_LOW, filler_sentences, sentence_gap
from posenc.lab.extend.needles.shared_prefix import cache_name

NEEDLE = "The pass key for door {label} is {key}. Remember it. {key} is the pass key for door {label}."
ANSWER = "What is the pass key for door {label}? The pass key for door {label} is {key}."
#: The doors' names: short, distinct, none a word of the filler. ``k`` is at most their number.
LABELS = (
    "amber", "birch", "cedar", "delta", "ember", "fern", "garnet", "harbor", "iris", "jade", "kite", "lotus", "maple",
    "nectar", "onyx", "pearl", "quartz", "raven", "sage", "tulip", "umber", "violet", "willow", "xenon", "yarrow",
    "zinnia", "acorn", "basil", "coral", "dune", "elm", "flint", "grove", "hazel", "ivory", "juniper", "kelp",
    "lilac", "moss", "nutmeg",
)


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class KeyDocument:
    """A document of ``k`` needles and their questions, as token ids of one tokenizer.

    Every per-key tuple is in the needles' order in the haystack (by depth). Compared by identity (it holds a
    tensor).

    Attributes:
        ids: ``(1, length)`` int64 token ids, special tokens included.
        keys: the five-digit keys, distinct.
        labels: the doors' names, distinct.
        depths: where each needle starts, as a fraction of the document (its first token's index over ``length``).
        answers: the token span ``[start, end)`` of each key's digits in its answer, the teacher-forced targets
            (the logits that predict them are at ``start - 1 .. end - 2``): the tokens that hold a digit, which hold
            the space before or the period after too where the tokenizer merges them (SentencePiece's ``4.``).
        order: the keys in the order they are asked: ``order[0]`` is the first question, whose context holds no
            answer.
        seed: the seed everything was drawn from.
        needles: the token span ``[start, end)`` of each needle sentence (() where not located: ``branches``
            needs them).
        questions: the token span of each key's question line, its line break first (() where not located).
    """

    ids: torch.Tensor
    keys: tuple[int, ...]
    labels: tuple[str, ...]
    depths: tuple[float, ...]
    answers: tuple[tuple[int, int], ...]
    order: tuple[int, ...]
    seed: int
    needles: tuple[tuple[int, int], ...] = ()
    questions: tuple[tuple[int, int], ...] = ()

    @property
    def length(self) -> int:
        return self.ids.shape[1]


@dataclass(frozen=True, slots=True, kw_only=True)
class KeyScores:
    """A model's answers to a :class:`KeyDocument`, per key in the document's needle order.

    Attributes:
        keys, depths: the document's.
        asked: each key's place among the questions (0: asked first, no answer before it in its context).
        found: every answer token is the argmax of its teacher-forced logits (exact match, see ``score_document``).
        logprob: the sum of the answer tokens' log-probabilities, nats (float64 sum of float32 log-softmax).
        tokens: the number of answer tokens.
        seconds: the forward's wall time, the logits read back included.
    """

    keys: tuple[int, ...]
    depths: tuple[float, ...]
    asked: tuple[int, ...]
    found: tuple[bool, ...]
    logprob: tuple[float, ...]
    tokens: tuple[int, ...]
    seconds: float

    @property
    def prob(self) -> tuple[float, ...]:
        """``exp(logprob)``: the probability of each whole answer."""
        return tuple(math.exp(lp) for lp in self.logprob)


@dataclass(frozen=True, slots=True)
class _Draw:
    """What the seed decides: the same for every tokenizer and model."""

    keys: tuple[int, ...]
    labels: tuple[str, ...]
    targets: tuple[float, ...]  # share of the filler's sentences before each needle, stratified: (i + u_i) / k
    order: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class _Text:
    text: str
    head: int  # characters of the head, the filler the front cut may remove
    needles: tuple[int, ...]  # each needle's first character
    digits: tuple[int, ...]  # each answer's first digit
    needle_ends: tuple[int, ...] = ()  # each needle's end (the character after its period)
    lines: tuple[int, ...] = ()  # each question's line break (the character before its line)


def _draw(k: int, seed: int) -> _Draw:
    rng = random.Random(seed)
    keys = tuple(rng.sample(range(KEY_LOW, KEY_HIGH), k))
    labels = tuple(rng.sample(LABELS, k))
    targets = tuple((i + rng.random()) / k for i in range(k))
    return _Draw(keys, labels, targets, tuple(rng.sample(range(k), k)))


def _text(draw: _Draw, head: int, body: int) -> _Text:
    """``head`` filler sentences, then ``body`` more with the needles at their sentence boundaries, a line break and
    the answered questions, one a line."""
    sentences = filler_sentences(head + body)
    gaps = [sentence_gap(t, body) for t in draw.targets]  # needle i goes before body sentence gaps[i]
    pieces: list[tuple[str, int | None]] = [(s, None) for s in sentences[:head]]
    for j in range(body + 1):
        pieces += [(NEEDLE.format(label=draw.labels[i], key=draw.keys[i]), i) for i in range(len(gaps)) if gaps[i] == j]
        if j < body:
            pieces.append((sentences[head + j], None))
    needles, ends = [0] * len(gaps), [0] * len(gaps)
    at, parts = 0, []
    for n, (piece, needle) in enumerate(pieces):
        at += n > 0  # the joining space
        if needle is not None:
            needles[needle], ends[needle] = at, at + len(piece)
        parts.append(piece)
        at += len(piece)
    head_chars = len(" ".join(sentences[:head]))
    digits, breaks = [0] * len(gaps), [0] * len(gaps)
    lines = []
    for i in draw.order:
        breaks[i] = at
        at += 1  # the line break
        line = ANSWER.format(label=draw.labels[i], key=draw.keys[i])
        digits[i] = at + line.rindex(str(draw.keys[i]))
        lines.append(line)
        at += len(line)
    text = "\n".join([" ".join(parts), *lines])
    assert len(text) == at, (len(text), at)  # noqa: S101 - construction invariant
    return _Text(text, head_chars, tuple(needles), tuple(digits), tuple(ends), tuple(breaks))


def _count(tokenizer, text: str) -> int:  # noqa: ANN001
    return len(tokenizer(text, verbose=False)["input_ids"])


def _check(k: object, seed: object) -> None:
    if check_positive_int("k", k) > len(LABELS):
        fail("k", k, f"at most {len(LABELS)} keys (one door name each)")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        fail("seed", seed, "a non-negative integer")


def min_length(tokenizer, k: int, seed: int) -> int:  # noqa: ANN001
    """The shortest document of ``k`` keys drawn from ``seed`` in tokens of ``tokenizer``: the needles and the
    questions with no filler."""
    _check(k, seed)
    return _count(tokenizer, _text(_draw(k, seed), 0, 0).text)


def _largest(fits: Callable[[int], bool], guess: int) -> int:
    """The largest ``n >= 0`` with ``fits(n)``, searched from ``guess`` (``fits(0)`` holds, ``fits`` taken as
    monotone: true up to some ``n``, false past it)."""
    step = max(1, guess // 32)
    if fits(guess):
        low, high = guess, guess + step
        while fits(high):
            low, high, step = high, high + 2 * step, 2 * step
    else:
        low, high = max(0, guess - step), guess
        while low > 0 and not fits(low):
            high, low, step = low, max(0, low - 2 * step), 2 * step
    while high - low > 1:  # invariant: fits(low), not fits(high)
        mid = (low + high) // 2
        low, high = (mid, high) if fits(mid) else (low, mid)
    return low


def key_document(tokenizer, length: int, k: int, seed: int) -> KeyDocument:  # noqa: ANN001
    """``k`` keys hidden in the passkey filler and asked back, exactly ``length`` tokens of ``tokenizer``.

    From ``seed`` (Python's ``random.Random``, so the same document for every model of a tokenizer: paired): ``k``
    distinct five-digit keys, ``k`` distinct names from :data:`LABELS`, needle ``i`` at the sentence boundary
    nearest the share ``(i + u_i) / k`` of the filler (``u_i`` uniform in [0, 1): stratified, so the needles spread
    over the whole haystack), and the questions in a random order, each followed by its answer (the answers of the
    questions asked before are context for the later ones). The haystack is the most filler whose document fits,
    ending on a whole sentence as the passkey's; more filler sentences in front make up the length, and the
    surplus tokens of the text tokenized as a whole are cut from its front (after the special tokens): the document
    reads like a window into a longer one and every token after the cut is the tokenizer's own tokenization.

    Args:
        tokenizer: a fast transformers tokenizer (its offsets place the needles and the answers' tokens).
        length: tokens, at least :func:`min_length`.
        k: keys, 1 to ``len(LABELS)``.
        seed: a non-negative integer.

    Raises:
        ValueError: a bad argument, or ``length`` too short for the needles and the questions.
    """
    check_positive_int("length", length)
    _check(k, seed)
    draw = _draw(k, seed)
    least = _count(tokenizer, _text(draw, 0, 0).text)
    if least > length:
        fail("length", length, f"at least {least} tokens for {k} keys and their questions with this tokenizer "
             f"(seed {seed})")
    per_sentence = _count(tokenizer, " ".join(filler_sentences(50))) / 50

    def tokens(head: int, body: int) -> int:
        return _count(tokenizer, _text(draw, head, body).text)

    body = _largest(lambda n: tokens(0, n) <= length, int((length - least) / per_sentence))
    for fill in range(body, -1, -1):
        head = 0
        while tokens(head, fill) < length:
            head += 1
        document = _fitted(tokenizer, draw, _text(draw, head, fill), length, seed)
        if document is not None:
            return document
    raise RuntimeError(f"{type(tokenizer).__name__}: no document of {length} tokens whose front cut is only filler")


def _fitted(tokenizer, draw: _Draw, text: _Text, length: int, seed: int) -> KeyDocument | None:  # noqa: ANN001
    """The document cut to ``length`` tokens at its front, or None where the cut would reach past the head."""
    try:
        encoded = tokenizer(text.text, return_offsets_mapping=True, return_special_tokens_mask=True, verbose=False)
    except NotImplementedError:
        fail("tokenizer", type(tokenizer).__name__, "a fast tokenizer (its offsets locate the answers' tokens)")
    ids, offsets = encoded["input_ids"], encoded["offset_mapping"]
    specials = next((i for i, s in enumerate(encoded["special_tokens_mask"]) if not s), len(ids))
    cut = len(ids) - length
    if cut < 0 or (cut > 0 and (text.head == 0 or offsets[specials + cut - 1][1] > text.head + 1)):
        return None  # the cut may remove the head and the space after it, never a character of the body
    ids, offsets = ids[:specials] + ids[specials + cut :], offsets[:specials] + offsets[specials + cut :]
    starts, ends = [o[0] for o in offsets], [o[1] for o in offsets]
    needles = [bisect_right(ends, c) for c in text.needles]  # the first token ending past the needle's start
    answers = tuple((bisect_right(ends, c), bisect_left(starts, c + DIGITS)) for c in text.digits)
    assert len(ids) == length and all(0 < a < b for a, b in answers), (len(ids), answers)  # noqa: S101
    spans = tuple((n, bisect_left(starts, e)) for n, e in zip(needles, text.needle_ends, strict=True))
    breaks = [bisect_right(ends, c) for c in text.lines]  # the token holding each question's line break
    clean = all(starts[b] == c for b, c in zip(breaks, text.lines, strict=True))  # not merged with what precedes it
    following = sorted(breaks) + [length]
    questions = tuple((b, following[following.index(b) + 1]) for b in breaks) if clean else ()
    return KeyDocument(
        ids=torch.tensor([ids], dtype=torch.long), keys=draw.keys, labels=draw.labels,
        depths=tuple(n / length for n in needles), answers=answers, order=draw.order, seed=seed,
        needles=spans if clean else (), questions=questions,
    )


def score_answers(model, ids: torch.Tensor, answers: tuple[tuple[int, int], ...], tick: Callable[[], None] | None,  # noqa: ANN001
                  *, positions: torch.Tensor | None = None, allowed: torch.Tensor | None = None,
                  cache: object | None = None) -> tuple[tuple[bool, ...], tuple[float, ...], float]:
    """One forward of ``ids`` (with explicit ``positions``, an ``allowed`` (T, C + T) mask and a KV ``cache`` of C
    tokens where given), logits only where they predict an answer token, log-softmax in float32: per answer span
    (indices into ``ids``), (every token the argmax, the sum of the tokens' log-probabilities), and the forward's
    seconds (the logits read back included).

    Shapes:
        ids, positions (1, T); allowed (T, C + T) bool, passed as (1, 1, T, C + T); the kept logits (N, V).
    """
    if "logits_to_keep" not in inspect.signature(model.forward).parameters:
        fail("model", type(model).__name__, "a transformers causal LM whose forward takes logits_to_keep")
    device = next(model.parameters()).device
    ids = ids.to(device)  # (1, T)
    targets = torch.cat([torch.arange(a, b) for a, b in answers]).to(device)  # (N,)
    given: dict[str, object] = {} if positions is None else {"position_ids": positions.to(device)}
    if allowed is not None:
        given["attention_mask"] = allowed[None, None].to(device)  # (1, 1, T, C + T)
    if cache is not None:
        given[cache_name(model)] = cache
    was_training = model.training
    model.eval()
    start = time.perf_counter()
    logits = model(input_ids=ids, use_cache=cache is not None, logits_to_keep=targets - 1,
                   **given).logits[0].float()  # (N, V)
    truth = ids[0, targets]  # (N,)
    logprob = logits.log_softmax(-1).gather(1, truth[:, None])[:, 0].double().cpu()  # (N,)
    hit = (logits.argmax(-1) == truth).cpu()  # (N,): argmax of the float32 logits, as generate's greedy step
    seconds = time.perf_counter() - start
    model.train(was_training)
    if tick is not None:
        tick()
    sizes = [b - a for a, b in answers]
    return (tuple(bool(h.all()) for h in torch.split(hit, sizes)),
            tuple(float(lp.sum()) for lp in torch.split(logprob, sizes)), seconds)


@torch.inference_mode()
def score_document(model, doc: KeyDocument, *, tick: Callable[[], None] | None = None) -> KeyScores:  # noqa: ANN001
    """A transformers causal LM's answers to ``doc``: one forward of the whole document, logits only where they
    predict an answer token (``logits_to_keep`` given those positions), log-softmax in float32.

    ``found`` is teacher-forced exact match: each answer token is the argmax of the logits before it. It equals
    greedy decoding of the answer given the same context: if every teacher-forced argmax is the true token, greedy
    decoding feeds itself exactly the teacher's inputs, so it reproduces the answer; if the first miss is at token
    ``j``, greedy decoding has the same inputs up to ``j`` and emits another token there. Two differences from
    ``passkey.hf_accuracy`` (greedy ``generate``, then the first number of the decoded text): the key must come in
    the tokenizer's own tokens of the answer (the same digits tokenized otherwise count as wrong here, found there),
    and a key followed by more digits counts here, not there. The context is the document's: for a method whose
    attention depends on the total length (dynamic NTK, LongRoPE, DCA) every answer sees the document's length, as
    a generate after the whole document would, and no cache is copied, so every method is scored the same way.

    Shapes:
        doc.ids (1, L); the kept logits (N, V), N the answers' tokens.

    Args:
        model: a transformers causal LM whose ``forward`` takes ``logits_to_keep`` (transformers 5: a 1-D tensor of
            positions), in eval mode for the call.
        doc: a :func:`key_document` of the model's tokenizer.
        tick: called once after the forward, for progress.
    """
    found, logprob, seconds = score_answers(model, doc.ids, doc.answers, tick)
    asked = [0] * len(doc.keys)
    for rank, i in enumerate(doc.order):
        asked[i] = rank
    return KeyScores(keys=doc.keys, depths=doc.depths, asked=tuple(asked), found=found, logprob=logprob,
                     tokens=tuple(e - s for s, e in doc.answers), seconds=seconds)


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class Branches:
    """A :class:`KeyDocument` asked one key at a time in one forward: the haystack, then every question as a branch
    that sees the haystack without the other keys' needles.

    Shapes:
        ids, positions (1, T), T = the haystack's tokens + every question line's; allowed (T, T) bool, True where a
        query (row) may attend to a key (column).

    Attributes:
        ids: the haystack's tokens (every needle in it, as the document's), then each key's question line.
        positions: the haystack's 0..H-1, each question's H..H+n-1: every question sits right after the haystack.
        allowed: the haystack causal; a question's tokens attend to the haystack less the other keys' needles, and
            to their own line causally (never to another question).
        answers: each key's answer digits in ``ids``, by the document's key order.
    """

    ids: torch.Tensor
    positions: torch.Tensor
    allowed: torch.Tensor
    answers: tuple[tuple[int, int], ...]


def branches(doc: KeyDocument, *, filler_sees_needles: bool = True) -> Branches:
    """``doc`` as :class:`Branches`: each key asked in its own branch, blind to the other needles.

    In the document every question's context holds every needle (and the answers asked before it): keys told apart
    by their door's name, RULER's multi-key task, a harder one than the single passkey. Here question ``i`` attends
    to the haystack with needle ``i`` in it and the other needles masked: the same tokens at the same positions
    (those of a question right after the haystack), the haystack's own tokens computed as in the document (they
    see every needle before them: what a needle leaves in the filler after it stays in the context). With one key
    it is the document itself.

    ``filler_sees_needles=False``: no haystack token attends to a needle either (each needle's tokens attend to the
    filler before them and to themselves): question ``i``'s context is then exactly the haystack with needle ``i``
    alone in it, except that the filler after the needle has not read it (what a method that reaches far tokens
    only through nearer ones, as LM-Infinite, needs).

    Raises:
        ValueError: ``doc`` whose needles or questions were not located (a tokenizer merging a line break with the
            character before it, or a document built by hand).
    """
    if not doc.questions or len(doc.questions) != len(doc.keys) or len(doc.needles) != len(doc.keys):
        fail("doc", f"a document of {len(doc.keys)} keys", "a key_document whose needles and questions are located "
             "(its tokenizer keeps a line break a token of its own)")
    head = min(start for start, _ in doc.questions)  # H: the haystack is everything before the first question
    sizes = [end - start for start, end in doc.questions]
    total = head + sum(sizes)
    allowed = torch.ones(total, total, dtype=torch.bool).tril_()  # (T, T)
    allowed[head:, head:] = False  # a question sees no other question ...
    if not filler_sees_needles:
        for a, b in doc.needles:
            allowed[b:head, a:b] = False  # the filler after a needle never reads it ...
            allowed[a:b, :a] &= ~_needle_columns(doc.needles, a)  # ... nor a needle an earlier one
    pieces, positions, answers = [doc.ids[0, :head]], [torch.arange(head)], []
    at = head
    for i, (start, end) in enumerate(doc.questions):
        n = end - start
        allowed[at : at + n, at : at + n] = torch.ones(n, n, dtype=torch.bool).tril_()  # ... but its own line
        for j, (a, b) in enumerate(doc.needles):
            if j != i:
                allowed[at : at + n, a:b] = False  # nor another key's needle
        pieces.append(doc.ids[0, start:end])
        positions.append(torch.arange(head, head + n))
        a, b = doc.answers[i]
        answers.append((at + a - start, at + b - start))
        at += n
    return Branches(ids=torch.cat(pieces)[None], positions=torch.cat(positions)[None], allowed=allowed,
                    answers=tuple(answers))


def _needle_columns(needles: tuple[tuple[int, int], ...], before: int) -> torch.Tensor:
    """``(before,)`` bool: True on the tokens of the needles that end at or before ``before``."""
    columns = torch.zeros(before, dtype=torch.bool)
    for a, b in needles:
        if b <= before:
            columns[a:b] = True
    return columns


@torch.inference_mode()
def score_branches(model, doc: KeyDocument, *, filler_sees_needles: bool = True,  # noqa: ANN001
                   tick: Callable[[], None] | None = None) -> KeyScores:
    """A transformers causal LM's answers to ``doc`` asked one key at a time (:func:`branches`), in one forward:
    the explicit positions and the ``(1, 1, T, T)`` mask go to the model (transformers takes a 4-D mask as given;
    posenc's remapped attention reads its pairs), logits only where they predict an answer token. Scored as
    :func:`score_document`: teacher-forced exact match and the answer's log-probability; ``asked`` is 0 for every
    key (each is asked first).

    Shapes:
        the branches' ids (1, T); the mask (1, 1, T, T) bool; the kept logits (N, V).
    """
    tree = branches(doc, filler_sees_needles=filler_sees_needles)
    found, logprob, seconds = score_answers(model, tree.ids, tree.answers, tick, positions=tree.positions,
                                            allowed=tree.allowed)
    return KeyScores(keys=doc.keys, depths=doc.depths, asked=(0,) * len(doc.keys), found=found, logprob=logprob,
                     tokens=tuple(e - s for s, e in tree.answers), seconds=seconds)
