"""Many keys in one document (``posenc.lab.extend.needles.keys``): its layout and exact length, and its answers
scored in one forward against the full logits and greedy decoding, plain and patched."""

from __future__ import annotations

import copy
import dataclasses
import functools
import re
from types import SimpleNamespace

import pytest
import torch

from posenc.lab.extend.needles import keys as kd
from posenc.lab.extend.needles import passkey as pk

pytestmark = pytest.mark.usefixtures("one_thread")

ORIGINAL = 64
EPS = torch.finfo(torch.float32).eps


@functools.cache
def _tokenizer(kind: str = "bpe"):
    """``bpe``: the passkey tests' byte-level BPE (a special token in front, digits merged). ``digits``: SmolLM2's
    layout (one token per digit, no special token, offsets without spaces). ``metaspace``: SentencePiece's ("▁" for
    a space). All trained here on the filler and key sentences (nothing downloaded)."""
    if kind == "bpe":
        from lab.extend.needles.test_passkey import byte_bpe_tokenizer

        return byte_bpe_tokenizer()
    tokenizers = pytest.importorskip("tokenizers")
    transformers = pytest.importorskip("transformers")
    pre, post = tokenizers.pre_tokenizers, tokenizers.processors
    if kind == "digits":
        tok = tokenizers.Tokenizer(tokenizers.models.BPE(unk_token=None))
        tok.pre_tokenizer = pre.Sequence([pre.Digits(individual_digits=True), pre.ByteLevel(add_prefix_space=False)])
        tok.decoder = tokenizers.decoders.ByteLevel()
        specials, alphabet = ["<|endoftext|>"], pre.ByteLevel.alphabet()
    else:
        tok = tokenizers.Tokenizer(tokenizers.models.BPE(unk_token="<unk>"))
        tok.pre_tokenizer = pre.Metaspace()
        tok.decoder = tokenizers.decoders.Metaspace()
        specials, alphabet = ["<unk>", "<s>", "</s>"], []
    text = [kd.NEEDLE.format(label=label, key=12345 + 6789 * i) for i, label in enumerate(kd.LABELS)]
    tok.train_from_iterator([pk.FILLER, *text, kd.ANSWER.format(label="cedar", key=41977)] * 4,
                            tokenizers.trainers.BpeTrainer(vocab_size=400, special_tokens=specials,
                                                           initial_alphabet=alphabet))
    if kind == "digits":
        tok.post_processor = post.ByteLevel(trim_offsets=True)
        return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>")
    tok.post_processor = post.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                                unk_token="<unk>")


def _lengths(tokenizer, k: int) -> list[int]:  # noqa: ANN001
    least = kd.min_length(tokenizer, k, 0)
    return [least, least + 1, least + 7, 2 * least + 3, 1000, 2049]


# ---------------------------------------------------------------------------------------------------------------------
# The document


@pytest.mark.parametrize("kind", ["bpe", "digits", "metaspace"])
@pytest.mark.parametrize("k", [1, 2, 5])
def test_the_document_has_the_length_its_keys_and_their_answers(kind, k):
    tokenizer = _tokenizer(kind)
    for length in _lengths(tokenizer, k):
        doc = kd.key_document(tokenizer, length, k, 0)
        assert doc.ids.shape == (1, length) and doc.ids.dtype == torch.int64 and doc.length == length
        if tokenizer.bos_token_id is not None:
            assert int(doc.ids[0, 0]) == tokenizer.bos_token_id  # the front cut keeps the special tokens
        assert len(set(doc.keys)) == len(set(doc.labels)) == k and all(10_000 <= key < 100_000 for key in doc.keys)
        assert sorted(doc.order) == list(range(k)) and doc.seed == 0
        assert list(doc.depths) == sorted(doc.depths) and doc.depths[0] >= 0 and doc.depths[-1] < 1
        ids = doc.ids[0].tolist()
        for key, label, depth, (start, end) in zip(doc.keys, doc.labels, doc.depths, doc.answers, strict=True):
            answer = tokenizer.decode(ids[start:end])
            assert re.sub(r"\D", "", answer) == str(key) and not re.search(r"[a-z]", answer)  # the digits alone
            question = f"? The pass key for door {label} is {key}".replace(" ", "")
            told = re.sub(r"\s", "", tokenizer.decode(ids[:start]) + answer)
            assert told.removesuffix(".").endswith(question)  # the period where a token holds it with a digit
            needle = tokenizer.decode(ids[round(depth * length) :]).lstrip()
            assert needle.startswith(kd.NEEDLE.format(label=label, key=key)), needle[:80]
            assert round(depth * length) < min(a for a, _ in doc.answers)  # every needle before every question
        asked = sorted(range(k), key=lambda i: doc.answers[i][0])
        assert asked == list(doc.order)  # the questions come in the drawn order
        last = doc.answers[doc.order[-1]]  # the last answer closes the document
        assert last[1] >= length - 1 and tokenizer.decode(ids[-1]).endswith(".")


def test_the_needles_spread_over_the_filler_one_per_stratum():
    tokenizer, k, length = _tokenizer(), 4, 3000
    doc = kd.key_document(tokenizer, length, k, 5)
    needle = [len(tokenizer(kd.NEEDLE.format(label=a, key=b), add_special_tokens=False)["input_ids"])
              for a, b in zip(doc.labels, doc.keys, strict=True)]
    haystack = tokenizer.decode(doc.ids[0]).index("\nWhat")
    filler = len(tokenizer(tokenizer.decode(doc.ids[0])[:haystack])["input_ids"]) - sum(needle)
    for i, depth in enumerate(doc.depths):
        share = (round(depth * length) - sum(needle[:i])) / filler  # filler tokens before needle i
        assert i / k - 0.01 <= share <= (i + 1) / k + 0.01, (i, share)  # a sentence is ~0.3% of this filler


def test_the_same_seed_gives_the_same_document_and_the_same_draw_at_every_length():
    tokenizer = _tokenizer()
    a, b = kd.key_document(tokenizer, 700, 4, 11), kd.key_document(tokenizer, 700, 4, 11)
    assert torch.equal(a.ids, b.ids)
    fields = ("keys", "labels", "depths", "answers", "order", "seed")
    assert [getattr(a, f) for f in fields] == [getattr(b, f) for f in fields] and a.seed == 11
    longer = kd.key_document(tokenizer, 1500, 4, 11)
    assert (longer.keys, longer.labels, longer.order) == (a.keys, a.labels, a.order)  # paired across lengths too
    others = [kd.key_document(tokenizer, 700, 4, seed) for seed in range(1, 6)]
    assert len({d.keys for d in others + [a]}) == 6 and len({d.order for d in others + [a]}) > 1


def test_bad_input_is_refused_naming_the_parameter():
    tokenizer = _tokenizer()
    least = kd.min_length(tokenizer, 3, 2)
    refusal = f"^length={least - 1} is invalid: expected at least {least} tokens for 3 keys"
    with pytest.raises(ValueError, match=refusal):
        kd.key_document(tokenizer, least - 1, 3, 2)
    assert kd.key_document(tokenizer, least, 3, 2).length == least
    for args, name in [((0, 1, 0), "length=0"), ((500, 0, 0), "k=0"), ((500, len(kd.LABELS) + 1, 0), "k=41"),
                       ((500, 2, -1), "seed=-1"), ((500, 2, 1.5), "seed=1.5"), ((500, True, 0), "k=True")]:
        with pytest.raises(ValueError, match=f"^{name} is invalid"):
            kd.key_document(tokenizer, *args)


# ---------------------------------------------------------------------------------------------------------------------
# The scores: one forward against the full logits, and greedy decoding


@functools.cache
def _tiny(kind: str):
    """A tiny random model (64-token context, float32) whose large initial weights make its answers depend on the
    prompt (as in test_needle_prefix)."""
    transformers = pytest.importorskip("transformers")
    config_class, model_class = {
        "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
        "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
    }[kind]
    config = config_class(
        vocab_size=len(_tokenizer()), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=ORIGINAL, bos_token_id=0, eos_token_id=1,
        initializer_range=0.5,
    )
    torch.manual_seed(0)
    return model_class(config).eval()


def _patched(kind: str, method: str):  # noqa: ANN202
    model = _tiny(kind)
    if method == "none":
        return model
    from posenc.hf import extend_context

    patched = copy.deepcopy(model)
    extend_context(patched, method, 8.0, original_max_position_embeddings=ORIGINAL)  # reaching the documents
    return patched


def _reference(model, doc: kd.KeyDocument) -> tuple[list[float], list[bool], list[float]]:  # noqa: ANN001
    """Per key: the answer's log-probability and exact match from the full logits of a plain forward, and the
    bound on how far the kept logits' log-probability may be from it (below)."""
    with torch.inference_mode():
        logits = model(input_ids=doc.ids).logits[0].float()  # (L, V)
        hidden = model.model(input_ids=doc.ids).last_hidden_state[0].float()  # (L, Dm)
    logprob = logits.log_softmax(-1)  # (L, V)
    # The kept rows' hidden states are the same forward's; only the output head's product may be summed in another
    # order: each logit moves by at most Dm * eps * sum_i |h_i w_i|, a log-softmax by twice the largest such move.
    weight = model.get_output_embeddings().weight.detach().float()  # (V, Dm)
    moves = hidden.shape[-1] * EPS * (hidden.abs() @ weight.abs().T).amax(-1)  # (L,)
    sums, found, bounds = [], [], []
    for start, end in doc.answers:
        at = torch.arange(start, end)
        truth = doc.ids[0, at]
        picked = logprob[at - 1, truth].double()
        sums.append(float(picked.sum()))
        found.append(bool((logits[at - 1].argmax(-1) == truth).all()))
        bounds.append(float(2 * moves[at - 1].sum() + 4 * EPS * picked.abs().sum()))
    return sums, found, bounds


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
@pytest.mark.parametrize("method", ["none", "yarn", "dynamic", "self_extend", "dca"])
def test_one_forward_scores_as_the_full_logits_of_the_same_model(kind, method):
    doc = kd.key_document(_tokenizer(), 320, 3, 4)
    model = _patched(kind, method)
    ticks = []
    scores = kd.score_document(model, doc, tick=lambda: ticks.append(1))
    sums, found, bounds = _reference(model, doc)
    assert ticks == [1] and scores.keys == doc.keys and scores.depths == doc.depths
    assert scores.tokens == tuple(b - a for a, b in doc.answers) and sum(scores.tokens) >= 5 * 3
    got, want = torch.tensor(scores.logprob, dtype=torch.float64), torch.tensor(sums, dtype=torch.float64)
    torch.testing.assert_close(got, want, rtol=0, atol=max(bounds))
    assert all(lp < 0 for lp in scores.logprob) and len(set(scores.logprob)) == 3
    assert scores.found == tuple(found)
    assert scores.prob == pytest.approx([torch.tensor(lp).exp().item() for lp in scores.logprob], rel=1e-12)
    assert [scores.asked[i] for i in doc.order] == [0, 1, 2]


def test_found_is_greedy_decoding_of_the_first_question():
    """Greedy ``generate`` from the prefix before the first asked answer: its tokens are the teacher-forced argmax up
    to and including the first miss (the inputs are the same until then), and it reproduces the key exactly when
    ``found`` says so."""
    tokenizer, model = _tokenizer(), _tiny("llama")
    for seed in range(4):
        doc = kd.key_document(tokenizer, 300, 2, seed)
        first = doc.order[0]
        start, end = doc.answers[first]
        scores = kd.score_document(model, doc)
        with torch.inference_mode():
            out = model.generate(doc.ids[:, :start], attention_mask=torch.ones_like(doc.ids[:, :start]),
                                 max_new_tokens=end - start, do_sample=False, pad_token_id=1)
            argmax = model(input_ids=doc.ids).logits[0, start - 1 : end - 1].argmax(-1)  # (n,)
        greedy, truth = out[0, start:], doc.ids[0, start:end]
        miss = next((j for j in range(end - start) if argmax[j] != truth[j]), end - start - 1)
        assert torch.equal(greedy[: miss + 1], argmax[: miss + 1])
        assert scores.found[first] == torch.equal(greedy, truth)


class _Oracle(torch.nn.Module):
    """A hand-made causal LM that has read ``doc``: on the document's own prefix it predicts the document's next
    token, except the last token of an odd key's answer (a wrong token); off the document it predicts token 0."""

    def __init__(self, doc: kd.KeyDocument, vocab: int) -> None:
        super().__init__()
        self.doc, self.vocab = doc, vocab
        self.unused = torch.nn.Parameter(torch.zeros(()))  # where the model lives
        self.wrong = {end - 1 for key, (_, end) in zip(doc.keys, doc.answers, strict=True) if key % 2}

    def forward(self, input_ids, use_cache=False, logits_to_keep=0):  # noqa: ANN001, ANN201, ARG002
        ref = self.doc.ids[0]
        logits = torch.zeros(*input_ids.shape, self.vocab)
        for t in range(input_ids.shape[1]):
            if t + 1 < ref.numel() and torch.equal(input_ids[0, : t + 1], ref[: t + 1]):
                logits[0, t, (int(ref[t + 1]) + (t + 1 in self.wrong)) % self.vocab] = 1.0
            else:
                logits[0, t, 0] = 1.0
        keep = logits_to_keep if isinstance(logits_to_keep, torch.Tensor) else slice(-logits_to_keep, None)
        return SimpleNamespace(logits=logits[:, keep])


def test_found_is_greedy_decoding_of_each_answer_both_ways():
    doc = kd.key_document(_tokenizer(), 800, 6, 3)
    assert 0 < sum(key % 2 for key in doc.keys) < 6  # some keys found, some not: the comparison means something
    oracle = _Oracle(doc, len(_tokenizer()))
    scores = kd.score_document(oracle, doc)
    for i, (start, end) in enumerate(doc.answers):
        tokens = doc.ids[:, :start]
        for _ in range(end - start):  # greedy decoding
            tokens = torch.cat([tokens, oracle(tokens).logits[:, -1].argmax(-1, keepdim=True)], dim=1)
        assert scores.found[i] == torch.equal(tokens[0, start:], doc.ids[0, start:end]) == (doc.keys[i] % 2 == 0)


def test_a_model_without_logits_to_keep_is_refused():
    class Plain(torch.nn.Module):
        def forward(self, input_ids):  # noqa: ANN001, ANN201
            return input_ids

    with pytest.raises(ValueError, match="^model='Plain' is invalid: expected a transformers causal LM"):
        kd.score_document(Plain(), kd.key_document(_tokenizer(), 200, 1, 0))


# ---------------------------------------------------------------------------------------------------------------------
# HFTarget.keys


def test_the_target_scores_its_patched_model_on_a_document_built_once(corpus, tmp_path, monkeypatch):
    from lab.extend.study.test_study import _hf_folder, _needs_extend_context

    _needs_extend_context()
    transformers = pytest.importorskip("transformers")
    from posenc.lab.extend.settings.config import ExtendConfig
    from posenc.lab.extend.targets.hf import HFTarget

    folder = _hf_folder(tmp_path / "llama")
    target = HFTarget(ExtendConfig(model=str(folder), corpus=str(corpus)), tmp_path / "out", "cpu", False)
    target.model = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    built = []
    build = kd.key_document
    monkeypatch.setattr(kd, "key_document", lambda *a: built.append(a) or build(*a))
    ticks: list[tuple] = []
    for method in ("yarn", "self_extend"):
        model, _ = target.patched(method, 8.0)
        scores = target.keys(model, 300, 3, 7, tick=lambda *a: ticks.append(a))
        expected = kd.score_document(model, build(target.tokenizer, 300, 3, 7))
        assert scores == dataclasses.replace(expected, seconds=scores.seconds)  # all but the wall time
    assert len(built) == 1 and ticks == [(target.forward_cost(300), 1)] * 2



# ---------------------------------------------------------------------------------------------------------------------
# Branches: each key asked in its own branch, blind to the other needles


@pytest.mark.parametrize("kind", ["bpe", "digits", "metaspace"])
@pytest.mark.parametrize("k", [1, 3, 5])
def test_the_branches_hold_the_haystack_then_each_question_blind_to_the_other_needles(kind, k):
    tokenizer = _tokenizer(kind)
    doc = kd.key_document(tokenizer, 900, k, 2)
    if not doc.questions:  # a tokenizer that merges a line break with what precedes it: refused, never guessed
        with pytest.raises(ValueError, match="^doc="):
            kd.branches(doc)
        return
    tree = kd.branches(doc)
    ids, allowed = doc.ids[0].tolist(), tree.allowed
    head = min(a for a, _ in doc.questions)
    sizes = [b - a for a, b in doc.questions]
    total = head + sum(sizes)
    assert tree.ids.shape == tree.positions.shape == (1, total) and allowed.shape == (total, total)
    assert tree.ids[0, :head].tolist() == ids[:head] and sorted(doc.questions)[-1][1] == doc.length
    assert torch.equal(allowed[:head, :head], torch.ones(head, head, dtype=torch.bool).tril())
    assert not allowed[:head, head:].any()  # the haystack is computed as in the document
    for i, (start, end) in enumerate(doc.needles):
        assert tokenizer.decode(ids[start:end]).strip() == kd.NEEDLE.format(label=doc.labels[i], key=doc.keys[i])
        assert start == round(doc.depths[i] * doc.length)
    at = head
    for i, (start, end) in enumerate(doc.questions):
        n = end - start
        line = tokenizer.decode(tree.ids[0, at + 1 : at + n].tolist())  # after its line break's token
        assert line.strip() == kd.ANSWER.format(label=doc.labels[i], key=doc.keys[i]), line
        assert tree.positions[0, at : at + n].tolist() == list(range(head, head + n))  # right after the haystack
        rows = allowed[at : at + n]
        own = torch.ones(n, n, dtype=torch.bool).tril()
        assert torch.equal(rows[:, at : at + n], own) and rows[:, head:at].sum() == rows[:, at + n :].sum() == 0
        hidden = torch.zeros(head, dtype=torch.bool)
        for j, (a, b) in enumerate(doc.needles):
            hidden[a:b] = j != i
        assert torch.equal(rows[:, :head], ~hidden.expand(n, -1))  # the haystack less the other needles
        a, b = tree.answers[i]
        assert tree.ids[0, a:b].tolist() == ids[doc.answers[i][0] : doc.answers[i][1]] and at < a < b <= at + n
        at += n


def _double(kind: str, method: str):  # noqa: ANN202
    model = copy.deepcopy(_tiny(kind)).double()
    if method != "none":
        from posenc.hf import extend_context

        extend_context(model, method, 8.0, original_max_position_embeddings=ORIGINAL)
    return model


@pytest.mark.parametrize("method", ["none", "yarn", "self_extend", "rerope"])
def test_each_branch_equals_its_question_asked_after_the_cached_haystack(method):
    """An independent construction of a branch: the haystack prefilled into a KV cache, then the question alone
    with a padding mask hiding the other needles, at positions right after the haystack. Float64 models, so the two
    paths' other summation orders do not count beside the float32 log-softmax the score takes."""
    doc = kd.key_document(_tokenizer(), 400, 3, 6)
    model = _double("llama", method)
    scores = kd.score_branches(model, doc)
    head = min(a for a, _ in doc.questions)
    with torch.inference_mode():
        prefix = model(input_ids=doc.ids[:, :head], use_cache=True).past_key_values
        for i, (start, end) in enumerate(doc.questions):
            keep = torch.ones(1, head + end - start, dtype=torch.long)
            for j, (a, b) in enumerate(doc.needles):
                keep[0, a:b] = int(j == i)
            logits = model(input_ids=doc.ids[:, start:end], past_key_values=copy.deepcopy(prefix), attention_mask=keep,
                           position_ids=torch.arange(head, head + end - start)[None]).logits[0]  # (n, V)
            a, b = doc.answers[i]
            truth = doc.ids[0, a:b]
            rows = torch.arange(a, b) - 1 - start
            picked = logits.log_softmax(-1)[rows, truth]
            # score_branches takes float32 logits (log-softmax in float32): each logit within half an ulp, so each
            # log-probability within 2 EPS of the largest logit's size, plus the float32 rounding of the result
            bound = float((EPS * (2 * logits[rows].abs().amax(-1) + picked.abs())).sum())
            assert scores.logprob[i] == pytest.approx(float(picked.sum()), abs=bound)
            assert scores.found[i] == bool((logits[torch.arange(a, b) - 1 - start].argmax(-1) == truth).all())
    assert scores.asked == (0, 0, 0) and scores.tokens == tuple(b - a for a, b in doc.answers)
    assert len(set(scores.logprob)) == 3


@pytest.mark.parametrize("method", ["none", "yarn", "dynamic", "self_extend", "dca"])
def test_one_key_in_branches_is_the_document_itself(method):
    doc = kd.key_document(_tokenizer(), 300, 1, 9)
    model = _double("qwen2", method)
    branch, whole = kd.score_branches(model, doc), kd.score_document(model, doc)
    with torch.inference_mode():
        top = float(model(input_ids=doc.ids).logits.abs().max())
    # both the float32 log-softmax of float64 logits ~1e-12 apart: each token within 2 EPS of the largest logit
    bound = 2 * EPS * (abs(whole.logprob[0]) + 2 * top * whole.tokens[0])
    assert branch.found == whole.found and branch.logprob == pytest.approx(whole.logprob, abs=bound)


def test_branches_need_a_document_whose_needles_and_questions_are_located():
    doc = dataclasses.replace(kd.key_document(_tokenizer(), 300, 2, 0), needles=(), questions=())
    with pytest.raises(ValueError, match="^doc='a document of 2 keys' is invalid: expected a key_document whose"):
        kd.branches(doc)


def test_branches_whose_filler_never_reads_a_needle():
    doc = kd.key_document(_tokenizer(), 900, 4, 3)
    seen, blind = kd.branches(doc), kd.branches(doc, filler_sees_needles=False)
    head = min(a for a, _ in doc.questions)
    needle = torch.zeros(head, dtype=torch.bool)
    for a, b in doc.needles:
        needle[a:b] = True
    causal = torch.ones(head, head, dtype=torch.bool).tril()
    rows = blind.allowed[:head, :head]
    assert torch.equal(rows[~needle], causal[~needle] & ~needle)  # filler: the filler before it, no needle
    for a, b in doc.needles:  # a needle: the filler before it and itself
        own = torch.zeros(head, dtype=torch.bool)
        own[a:b] = True
        assert torch.equal(rows[a:b], causal[a:b] & (~needle | own))
    assert torch.equal(blind.allowed[head:], seen.allowed[head:])  # the questions see what they saw
    assert torch.equal(seen.allowed[:head, :head], causal)
    assert torch.equal(blind.ids, seen.ids) and torch.equal(blind.positions, seen.positions)
