"""posenc's compiled FlexAttention stays compiled however many shapes one process meets (``FLEX_KERNELS_KEPT``).

Past torch's recompile limit torch would run FlexAttention uncompiled (an S x T score matrix, other roundings), and a
result then depended on how many shapes had run before it in the process: a full test session once failed that way.
The probe tells the two paths apart exactly: with q = 0 every score is 0 and with v = 1 the output is
T / (T + exp(sink)), 0.53515625 in bfloat16 from the compiled kernel (a float32 sink); posenc's flex path run
uncompiled gives 0.5390625, the value of the sink rounded to bfloat16 (64 / (64 + e^4)).
"""

from __future__ import annotations

import sys
import warnings

import pytest
import torch

import posenc

pytestmark = pytest.mark.flex_compiled  # the compiled kernels are what this file is about

H, D, T = 2, 32, 64
SINK = 4.0155  # 4.0 in bfloat16; its float32 value is what the compiled kernel uses


def _probe(batch: int) -> torch.Tensor:
    q = torch.zeros(batch, H, 1, D, dtype=torch.bfloat16)
    k = torch.randn(batch, H, T, D).bfloat16()
    v = torch.ones(batch, H, T, D, dtype=torch.bfloat16)
    with torch.no_grad():
        return posenc.attention(q, k, v, sinks=torch.full((H,), SINK), backend="flex")


def test_the_probe_tells_compiled_from_uncompiled(monkeypatch):
    """posenc's flex path run as torch runs it past its recompile limit (FlexAttention uncompiled) gives another value
    than the compiled kernel's: the test below can fail."""
    from torch.nn.attention.flex_attention import flex_attention

    def uncompiled(_, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        return flex_attention(*args, **kwargs)

    monkeypatch.setattr(sys.modules["posenc.attention"], "_compiled_flex", uncompiled)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "flex_attention called without torch.compile()": that is the point here
        out = _probe(1)
    assert not torch.equal(out, torch.full_like(out, _compiled_value()))


def _compiled_value() -> torch.Tensor:
    return (T / (T + torch.tensor(SINK, dtype=torch.float64).exp())).bfloat16()


def test_kernels_are_dropped_not_run_uncompiled(monkeypatch):
    """With room for one kernel, three shapes in a row: each call compiles anew (the kernels before it dropped, a
    warning once per process), each gives the compiled value exactly, and at most one kernel is kept."""
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list
    from torch.nn.attention.flex_attention import flex_attention

    module = sys.modules["posenc.attention"]
    monkeypatch.setattr(module, "FLEX_KERNELS_KEPT", 1)
    monkeypatch.setattr(module, "_FLEX_DROPS", 0)
    want = _compiled_value()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for batch in (1, 2, 3, 1):
            out = _probe(batch)
            assert torch.equal(out, torch.full_like(out, want)), f"batch {batch}: {out.flatten()[0]} vs {want}"
            assert len(_debug_get_cache_entry_list(flex_attention.__code__)) == 1
    ours = [w for w in seen if "compiled FlexAttention kernels" in str(w.message)]
    assert len(ours) == 1 and ours[0].filename == __file__, [str(w.message) for w in seen]
    assert module._FLEX_DROPS >= 3


@pytest.mark.parametrize("kept", [0, -1])
def test_kept_must_be_positive(monkeypatch, kept):
    """A module constant, but a user may set it: 0 would drop every kernel before each call (compile every call)."""
    monkeypatch.setattr(sys.modules["posenc.attention"], "FLEX_KERNELS_KEPT", kept)
    with pytest.raises(ValueError, match="FLEX_KERNELS_KEPT"):
        _probe(1)


def test_flex_compiled_false_runs_the_uncompiled_path(monkeypatch):
    """``FLEX_COMPILED = False`` (debugging; the suite's tests of masks and score_mods) runs torch's uncompiled
    FlexAttention: the probe gives the uncompiled value, not the compiled kernel's."""
    monkeypatch.setattr(sys.modules["posenc.attention"], "FLEX_COMPILED", False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "flex_attention called without torch.compile()"
        out = _probe(1)
    assert not torch.equal(out, torch.full_like(out, _compiled_value()))


@pytest.mark.parametrize("value", ["no", 0, None])
def test_flex_compiled_must_be_a_bool(monkeypatch, value):
    monkeypatch.setattr(sys.modules["posenc.attention"], "FLEX_COMPILED", value)
    with pytest.raises(ValueError, match=r"^posenc.attention.FLEX_COMPILED=.* is invalid: expected True or False"):
        _probe(1)
