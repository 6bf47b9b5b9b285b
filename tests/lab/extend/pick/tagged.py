"""Scripted picks' shared piece: which method each patched model carries, so a test can answer for it."""

from __future__ import annotations

from posenc.lab.extend.targets.hf import HFTarget


def tag_patched(monkeypatch) -> dict[int, tuple[str, float]]:  # noqa: ANN001
    """``HFTarget.patched`` made to record ``id(model) -> (method, factor)`` in the returned dict (the unpatched
    model is absent: callers read it as ``("none", 1.0)``)."""
    which: dict[int, tuple[str, float]] = {}
    patched = HFTarget.patched

    def tagged(self, method, factor):  # noqa: ANN001, ANN202
        model, described = patched(self, method, factor)
        which[id(model)] = (method, factor)
        return model, described

    monkeypatch.setattr(HFTarget, "patched", tagged)
    return which
