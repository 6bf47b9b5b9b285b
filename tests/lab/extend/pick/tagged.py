"""Scripted picks' shared piece: which method each patched model carries, so a test can answer for it."""

from __future__ import annotations

import weakref

from posenc.lab.extend.targets.hf import HFTarget


def tag_patched(monkeypatch) -> weakref.WeakKeyDictionary:  # noqa: ANN001
    """``HFTarget.patched`` made to record ``model -> (method, factor)`` in the returned mapping (the unpatched model
    is absent: callers read it as ``("none", 1.0)``). Keyed by the model object, held weakly, not by ``id()``: a
    patched model freed during the pick (the perplexity screen's) can hand its id to a model loaded later (the
    unpatched one the race loads), which is then answered for as that method: the likely cause of the one failure of
    ``test_a_race_cut_resumes_to_the_same_answer`` seen in a full run under transformers 5.25 (the unpatched model
    scored as NTK: "not shown above the unpatched model")."""
    which: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
    patched = HFTarget.patched

    def tagged(self, method, factor):  # noqa: ANN001, ANN202
        model, described = patched(self, method, factor)
        which[model] = (method, factor)
        return model, described

    monkeypatch.setattr(HFTarget, "patched", tagged)
    return which
