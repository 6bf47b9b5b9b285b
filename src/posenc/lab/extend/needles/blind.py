"""Blind branches (``keys.branches(doc, filler_sees_needles=False)``) in two forwards, without a ``T x T`` mask.

In the blind layout no filler token reads a needle, so the filler alone is a plain causal sequence at its own
positions (holes where the needles sit): it is prefilled into a KV cache with the causal attention every kernel has a
fast path for. The needles and the questions then run as one short suffix over that cache, at their own positions,
with a ``(S, F + 1 + S)`` mask: a needle's tokens see the filler before it and themselves, a question's tokens the
whole filler, its own needle and its own line. That is :func:`keys.score_branches` with ``filler_sees_needles=False``
token for token -- the same attention pairs at the same positions -- at the cost of a causal prefill instead of a
``T x T``-masked one (torch's SDPA runs an explicit mask through its math path: about twice the causal prefill's
time at 16k, BENCHMARKS.md).

Methods whose RoPE depends on the length (``dynamic``, ``longrope``): both forwards see the branches' largest
position. The prefill carries one placeholder token there (the last question's last token, at the largest position:
causal, so no filler reads it; masked out of the suffix), so its frequencies are those of the one forward and the
suffix, whose largest position is the same, changes nothing in the cache.
"""

from __future__ import annotations

import inspect
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch

from posenc._checks import fail
from posenc.hf import CacheStaleWarning
from posenc.lab.extend.needles.keys import KeyDocument, KeyScores, branches, score_answers


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class BlindSplit:
    """The blind branches of a document cut into the causal filler prefill and the suffix over its cache.

    Shapes:
        prefill_ids, prefill_positions (1, F + 1): the filler in order, then the placeholder at the largest position;
        suffix_ids, suffix_positions (1, S): every needle's tokens (by depth), then every question line;
        suffix_allowed (S, F + 1 + S) bool, True where a suffix query (row) may attend to a key (column): the cache's
        F + 1 columns first, then the suffix's own.

    Attributes:
        answers: each key's answer digits as indices into the suffix, by the document's key order.
    """

    prefill_ids: torch.Tensor
    prefill_positions: torch.Tensor
    suffix_ids: torch.Tensor
    suffix_positions: torch.Tensor
    suffix_allowed: torch.Tensor
    answers: tuple[tuple[int, int], ...]


def blind_split(doc: KeyDocument) -> BlindSplit:
    """``doc``'s blind branches (``branches(doc, filler_sees_needles=False)``) as a causal filler prefill and a
    masked suffix: the branches' tokens reordered, filler first, the mask's suffix rows read off the branches' own.

    Raises:
        ValueError: as ``branches`` (needles or questions not located); a layout whose filler is not causal among
            itself (it always is in the blind layout: checked, not assumed).
    """
    tree = branches(doc, filler_sees_needles=False)
    total = tree.ids.shape[1]
    head = min(start for start, _ in doc.questions)
    filler = torch.ones(total, dtype=torch.bool)  # (T,)
    filler[head:] = False
    for a, b in doc.needles:
        filler[a:b] = False
    first, rest = filler.nonzero()[:, 0], (~filler).nonzero()[:, 0]  # (F,), (S,)
    among = tree.allowed[first][:, first]  # (F, F)
    if not torch.equal(among, torch.ones_like(among).tril_()):
        fail("doc", f"a document of {len(doc.keys)} keys", "a layout whose filler attends causally to itself")
    if bool(tree.allowed[first][:, rest].any()):
        fail("doc", f"a document of {len(doc.keys)} keys", "a layout whose filler reads no needle")
    top = tree.positions[0].max()
    prefill_ids = torch.cat([tree.ids[0, first], tree.ids[0, -1:]])[None]  # (1, F + 1): the placeholder last
    prefill_positions = torch.cat([tree.positions[0, first], top[None]])[None]
    rows = tree.allowed[rest]  # (S, T)
    # cache columns: the filler's, then the placeholder's (never read); then the suffix's own, in its order
    allowed = torch.cat([rows[:, first], torch.zeros(len(rest), 1, dtype=torch.bool), rows[:, rest]], dim=1)
    where = torch.full((total,), -1, dtype=torch.long)
    where[rest] = torch.arange(len(rest))
    answers = []
    for a, b in tree.answers:
        at = where[a:b]
        if bool((at < 0).any()) or not torch.equal(at, torch.arange(int(at[0]), int(at[0]) + b - a)):
            fail("doc", f"a document of {len(doc.keys)} keys", "answers inside the question lines")
        answers.append((int(at[0]), int(at[0]) + b - a))
    return BlindSplit(prefill_ids=prefill_ids, prefill_positions=prefill_positions,
                      suffix_ids=tree.ids[0, rest][None], suffix_positions=tree.positions[0, rest][None],
                      suffix_allowed=allowed, answers=tuple(answers))


@torch.inference_mode()
def score_blind(model, doc: KeyDocument, *, tick: Callable[[], None] | None = None) -> KeyScores:  # noqa: ANN001
    """A transformers causal LM's answers to ``doc`` asked one key at a time, blind (:func:`keys.score_branches`
    with ``filler_sees_needles=False``), in a causal prefill of the filler and one masked suffix (:func:`blind_split`).

    The prefill gets a 2-D all-ones ``attention_mask``, so transformers neither builds a mask (the causal fast path)
    nor reads the holes in its positions as packed sequences; the suffix gets its ``(1, 1, S, F + 1 + S)`` mask as
    given. Scored as ``score_document``: teacher-forced exact match and each answer's log-probability, log-softmax in
    float32; ``seconds`` is both forwards'.

    Shapes:
        prefill (1, F + 1); suffix (1, S); the kept logits (N, V), N the answers' tokens.
    """
    if "logits_to_keep" not in inspect.signature(model.forward).parameters:
        fail("model", type(model).__name__, "a transformers causal LM whose forward takes logits_to_keep")
    split = blind_split(doc)
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    start = time.perf_counter()
    ids = split.prefill_ids.to(device)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", CacheStaleWarning)  # the suffix would not see what the one forward sees
            out = model(input_ids=ids, position_ids=split.prefill_positions.to(device),
                        attention_mask=torch.ones_like(ids), use_cache=True, logits_to_keep=1)
            prefill = time.perf_counter() - start
            cache = out.get("cache", out.get("past_key_values"))  # transformers 5.24 names it "cache", earlier not
            found, logprob, seconds = score_answers(
                model, split.suffix_ids, split.answers, tick, positions=split.suffix_positions,
                allowed=split.suffix_allowed, cache=cache)
    except CacheStaleWarning as stale:
        fail("model", type(model).__name__, "a model that computes the cached filler as the suffix reads it (posenc.hf "
             "warned CacheStaleWarning, as for DCA, whose logit factor follows the tokens in a forward); "
             f"score_branches(doc, filler_sees_needles=False) runs these branches in one forward [{stale}]")
    finally:
        model.train(was_training)
    return KeyScores(keys=doc.keys, depths=doc.depths, asked=(0,) * len(doc.keys), found=found, logprob=logprob,
                     tokens=tuple(b - a for a, b in split.answers), seconds=prefill + seconds)
