"""Blind branches in a causal prefill and a masked suffix (``posenc.lab.extend.needles.blind``): the split's layout
read off the definition of the blind layout, and its scores equal to the one forward of ``keys.score_branches(...,
filler_sees_needles=False)`` on float64 models, plain and patched (frequency scalings, the length-dependent dynamic
NTK, remapping); refused where the cache would not hold what the one forward computes (DCA)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from lab.extend.needles.test_keys import EPS, _double, _tokenizer
from posenc.lab.extend.needles import blind
from posenc.lab.extend.needles import keys as kd

pytestmark = pytest.mark.usefixtures("one_thread")


def _spans(doc: kd.KeyDocument) -> tuple[int, torch.Tensor]:
    """The haystack's length H and ``(H,)`` the needle each haystack token belongs to (-1: filler)."""
    head = min(a for a, _ in doc.questions)
    owner = torch.full((head,), -1)
    for j, (a, b) in enumerate(doc.needles):
        owner[a:b] = j
    return head, owner


@given(k=st.integers(1, 5), seed=st.integers(0, 50), extra=st.integers(0, 300))
def test_the_split_is_the_filler_in_order_then_every_needle_and_question(k, seed, extra):
    tokenizer = _tokenizer()
    doc = kd.key_document(tokenizer, kd.min_length(tokenizer, k, seed) + extra, k, seed)
    split = blind.blind_split(doc)
    head, owner = _spans(doc)
    ids = doc.ids[0]
    filler = (owner < 0).nonzero()[:, 0]  # (F,)
    needle_tokens = (owner >= 0).nonzero()[:, 0]
    lines = [torch.arange(a, b) for a, b in doc.questions]
    top = head + max(b - a for a, b in doc.questions) - 1  # the branches' largest position
    assert torch.equal(split.prefill_ids[0, :-1], ids[filler]) and torch.equal(split.prefill_positions[0, :-1], filler)
    assert int(split.prefill_positions[0, -1]) == top
    want_ids = torch.cat([ids[needle_tokens], *[ids[line] for line in lines]])
    want_pos = torch.cat([needle_tokens, *[torch.arange(head, head + len(line)) for line in lines]])
    assert torch.equal(split.suffix_ids[0], want_ids) and torch.equal(split.suffix_positions[0], want_pos)
    n_fill, n_needle = len(filler), len(needle_tokens)
    allowed = split.suffix_allowed
    assert allowed.shape == (len(want_ids), n_fill + 1 + len(want_ids))
    assert not bool(allowed[:, n_fill].any())  # the placeholder is never read
    cache, own = allowed[:, :n_fill], allowed[:, n_fill + 1 :]
    suffix_owner = torch.cat([owner[needle_tokens], *[torch.full((len(line),), i) for i, line in enumerate(lines)]])
    is_question = torch.arange(len(want_ids)) >= n_needle
    for r in range(len(want_ids)):
        if not is_question[r]:  # a needle token: the filler before it, its own needle's tokens up to itself
            assert torch.equal(cache[r], filler < want_pos[r])
            mates = (suffix_owner == suffix_owner[r]) & ~is_question & (want_pos <= want_pos[r])
        else:  # a question token: the whole filler, its own needle, its own line up to itself
            assert bool(cache[r].all())
            line = is_question & (suffix_owner == suffix_owner[r]) & (torch.arange(len(want_ids)) <= r)
            mates = ((suffix_owner == suffix_owner[r]) & ~is_question) | line
        assert torch.equal(own[r], mates), r
    for i, (a, b) in enumerate(split.answers):  # each answer's digits, inside its own question line
        start, end = doc.answers[i]
        assert torch.equal(split.suffix_ids[0, a:b], ids[start:end]) and bool(is_question[a:b].all())
        assert bool((suffix_owner[a:b] == i).all())


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
@pytest.mark.parametrize("method", ["none", "linear", "yarn", "llama3", "dynamic", "self_extend", "rerope",
                                    "lm_infinite"])
def test_the_split_scores_as_the_one_forward_of_the_blind_branches(kind, method):
    """Float64 models: the two paths' other summation orders are ~1e-15 beside the float32 log-softmax both take,
    so each answer token's log-probability is within 2 EPS of the largest logit's size (the bound of
    test_keys.test_one_key_in_branches_is_the_document_itself). ``dynamic``: its frequencies follow the largest
    position, the same in both forwards (the placeholder)."""
    doc = kd.key_document(_tokenizer(), 420, 3, 5)
    model = _double(kind, method)
    ticks: list[int] = []
    split, whole = blind.score_blind(model, doc, tick=lambda: ticks.append(1)), kd.score_branches(
        model, doc, filler_sees_needles=False)
    tree = kd.branches(doc, filler_sees_needles=False)
    with torch.inference_mode():
        top = float(model(input_ids=tree.ids, position_ids=tree.positions,
                          attention_mask=tree.allowed[None, None]).logits.abs().max())
    bound = 2 * EPS * (max(abs(x) for x in whole.logprob) + 2 * top * max(whole.tokens))
    assert ticks == [1] and split.found == whole.found and split.tokens == whole.tokens
    assert split.logprob == pytest.approx(whole.logprob, abs=bound) and len(set(split.logprob)) == 3
    assert split.keys == doc.keys and split.asked == (0, 0, 0) and split.seconds > 0


def test_a_method_whose_cache_would_go_stale_is_refused():
    """DCA's logit factor follows the tokens a forward holds: the cached filler would not be what the suffix reads
    in the one forward. Refused naming the model, pointing at the one-forward scorer."""
    doc = kd.key_document(_tokenizer(), 400, 2, 1)
    with pytest.raises(ValueError, match=r"^model='LlamaForCausalLM' is invalid: .*CacheStaleWarning.*score_branches"):
        blind.score_blind(_double("llama", "dca"), doc)


def test_a_model_without_logits_to_keep_is_refused():
    class Plain(torch.nn.Module):
        def forward(self, input_ids):  # noqa: ANN001, ANN202
            return input_ids

    with pytest.raises(ValueError, match="^model='Plain' is invalid: expected a transformers causal LM"):
        blind.score_blind(Plain(), kd.key_document(_tokenizer(), 300, 1, 0))


def test_the_prefill_runs_causal_attention_without_a_mask(monkeypatch):
    """What the split is for: the filler (all but the suffix's S tokens) goes through torch's SDPA as ``is_causal``
    with no mask -- the kernels' fast path -- and only the suffix carries one, ``(S, F + 1 + S)``."""
    seen: list[tuple[int, tuple[int, ...] | None, bool]] = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def spy(q, k, v, attn_mask=None, is_causal=False, **kwargs):  # noqa: ANN001, ANN202
        seen.append((q.shape[-2], None if attn_mask is None else tuple(attn_mask.shape), is_causal))
        return sdpa(q, k, v, attn_mask=attn_mask, is_causal=is_causal, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    doc = kd.key_document(_tokenizer(), 600, 2, 3)
    split = blind.blind_split(doc)
    model = _double("llama", "yarn")
    blind.score_blind(model, doc)
    prefill, suffix = split.prefill_ids.shape[1], split.suffix_ids.shape[1]
    layers = model.config.num_hidden_layers
    assert seen == [(prefill, None, True)] * layers + [(suffix, (1, 1, suffix, prefill + suffix), False)] * layers
