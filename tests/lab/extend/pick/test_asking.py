"""How the deciding race asks each model for its keys (``posenc.lab.extend.pick.asking``): every candidate method is
asked the way its attention allows, read off the method itself on float64 models -- a windowed method (one-key
documents) is one whose blind branch cannot see a far needle; a one-forward method (the T x T mask) is one the split
refuses; every other candidate's split equals the one forward -- and the settings' forms, errors and key counts."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch

from lab.extend.needles.test_keys import EPS, ORIGINAL, _tiny, _tokenizer
from posenc.lab.extend.needles import blind
from posenc.lab.extend.needles import keys as kd
from posenc.lab.extend.pick import asking, rules
from posenc.lab.extend.pick.asking import Asking

pytestmark = pytest.mark.usefixtures("one_thread")
CANDIDATES = (*rules.FREQUENCY_CANDIDATES, *rules.REMAP_CANDIDATES)
LENGTH = 800
#: STRING alone reaches at most 2L - W; its factor here keeps it inside that (the others take the tests' 8).
FACTORS = {"string": 1.5}


def _model(method: str):  # noqa: ANN202
    from posenc.hf import extend_context

    model = copy.deepcopy(_tiny("llama")).double()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the reach warnings of a document past a method's reach
        extend_context(model, method, FACTORS.get(method, 8.0), original_max_position_embeddings=ORIGINAL)
    return model


def _far_needle(doc: kd.KeyDocument) -> int:
    """A needle past LM-Infinite's 10 global tokens whose end lies more than the window (L) before every question."""
    head = min(a for a, _ in doc.questions)
    far = [j for j, (a, b) in enumerate(doc.needles) if a >= 16 and head - b > ORIGINAL + 8]
    assert far, doc.needles
    return far[0]


def _answer_logprob(model, tree: kd.Branches, ids: torch.Tensor, key: int) -> torch.Tensor:  # noqa: ANN001
    """Key ``key``'s answer tokens' log-probabilities in the branches' one forward over ``ids`` (float64)."""
    a, b = tree.answers[key]
    with torch.inference_mode(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        logits = model(input_ids=ids, position_ids=tree.positions, attention_mask=tree.allowed[None, None]).logits
    logp = logits[0, a - 1 : b - 1].log_softmax(-1)  # (n, V): the logits that predict the answer
    return logp.gather(-1, ids[0, a:b, None])[:, 0]


@pytest.mark.parametrize("method", CANDIDATES)
def test_each_candidate_is_asked_the_way_its_attention_allows(method):
    """Windowed: changing a far needle's key leaves its own blind question's answer unchanged (the branch cannot
    read it, so the method gets one-key documents, where the filler after the needle carries it). Every other
    candidate reads it. One forward: the split refuses the method (its cache would go stale); every other candidate's
    split scores as the one forward (float64: within the float32 log-softmax's rounding)."""
    doc = kd.key_document(_tokenizer(), LENGTH, 3, 2)
    model = _model(method)
    tree = kd.branches(doc, filler_sees_needles=False)
    j = _far_needle(doc)
    a, b = doc.needles[j]
    other = tree.ids.clone()
    other[0, a:b] = tree.ids[0, a:b].roll(1)  # needle j's tokens, each moved one place: another needle
    assert not torch.equal(other, tree.ids)
    base, changed = _answer_logprob(model, tree, tree.ids, j), _answer_logprob(model, tree, other, j)
    sees = not torch.allclose(base, changed, rtol=0, atol=1e-9)
    assert sees == (method not in asking.WINDOWED), (method, base, changed)
    how = Asking(3, "blind").how(method)
    if method in asking.ONE_FORWARD:
        assert how == "branches"
        with pytest.raises(ValueError, match="CacheStaleWarning"):
            blind.score_blind(model, doc)
        return
    assert how == ("document" if method in asking.WINDOWED else "split")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        split, whole = blind.score_blind(model, doc), kd.score_branches(model, doc, filler_sees_needles=False)
    with torch.inference_mode():
        top = float(model(input_ids=tree.ids, position_ids=tree.positions,
                          attention_mask=tree.allowed[None, None]).logits.abs().max())
    bound = 2 * EPS * (max(abs(x) for x in whole.logprob) + 2 * top * max(whole.tokens))  # as test_blind's
    assert split.found == whole.found and split.logprob == pytest.approx(whole.logprob, abs=bound)


def test_a_composed_method_is_asked_as_its_parts_say():
    blind_ = Asking(16, "blind")
    assert blind_.how("yarn+string") == "split" and blind_.how("yarn+lm_infinite") == "document"
    assert blind_.how("yarn+dca") == "branches" and blind_.keys_of(("yarn+lm_infinite", 2.0, 0, "plain")) == 1


def test_the_key_counts_follow_the_models():
    units = [("none", 1.0, 0, "plain"), ("lm_infinite", 2.0, 0, "plain"), ("dca", 2.0, 0, "plain")]
    assert Asking(16, "blind").counts(units, 3).tolist() == [[16] * 3, [1] * 3, [16] * 3]
    assert Asking(4, "document").counts(units, 2).tolist() == [[4, 4]] * 3  # asked in the document: every model K
    assert Asking(4, "document").how("lm_infinite") == "document" and Asking(4, "document").how("dca") == "document"


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"keys": 0}, r"^keys=0 is invalid: expected a positive integer"),
    ({"keys": 4, "ask": "apart"}, r"^ask='apart' is invalid: expected one of \['blind', 'document'\]"),
])
def test_bad_asking_is_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Asking(**kwargs)


def test_the_text_says_how_keys_are_asked():
    assert Asking(1, "document").text() == "1 key" and Asking(8, "document").text() == "8 keys"
    assert Asking(16, "blind").text() == ("16 keys asked blind (each in its own branch; lm_infinite: one key per "
                                          "document)")
