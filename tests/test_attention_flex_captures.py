"""What posenc hands FlexAttention: the ``score_mod`` and ``mask_mod`` of every registered encoding under every mask
capture tensors, ints, bools and strings only -- never a Python float (issue 68, item 17). torch traces a captured
float as a ``SymFloat`` once its value changes between compilations (automatic dynamic shapes), and FlexAttention
refuses those among a score_mod's captured values (torch 2.15; torch 2.13's CPU inductor fails to lower them); the
compiled tests below are that failure, on the path a user's ``torch.compile`` takes."""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Iterator

import pytest
import torch
from torch.testing import assert_close

import posenc
from encoding_cases import attention_tol, build, positions
from posenc.encodings.fire import FIRE

#: What a closure may hold: values dynamo guards on (ints, bools, strings, None) or passes as inputs (tensors).
CAPTURABLE = (torch.Tensor, bool, int, str, type(None))

B, H, HKV, S, D = 2, 4, 2, 24, 16


def _captured(fn: Callable, path: str) -> Iterator[tuple[str, object]]:
    """``(path, value)`` for every value ``fn``'s closure holds, following captured functions (the position readers,
    an encoding's score_mod inside the sink's) and tuples into what they capture."""
    for name, cell in zip(fn.__code__.co_freevars, fn.__closure__ or (), strict=True):
        yield from _values(cell.cell_contents, f"{path}.{name}")


def _values(value: object, path: str) -> Iterator[tuple[str, object]]:
    if inspect.isfunction(value):
        yield from _captured(value, path)
    elif isinstance(value, (tuple, list)):
        for i, item in enumerate(value):
            yield from _values(item, f"{path}[{i}]")
    else:
        yield path, value


def _flex_arguments(monkeypatch, encoding, **kwargs) -> dict:
    """The keyword arguments ``posenc.attention(..., backend="flex")`` hands FlexAttention (which is not run)."""
    seen = {}

    def spy(q, k, v, **kw):
        seen.update(kw)
        return q.new_zeros(*q.shape[:-1], v.shape[-1])

    monkeypatch.setattr(importlib.import_module("torch.nn.attention.flex_attention"), "flex_attention", spy)
    q, k, v = torch.randn(B, H, S, D), torch.randn(B, HKV, S, D), torch.randn(B, HKV, S, D)
    pos = positions(encoding, S, start=3, batch=B) if encoding is not None else None
    with torch.no_grad():
        posenc.attention(q, k, v, encoding=encoding, backend="flex", q_positions=pos, k_positions=pos, **kwargs)
    return seen


#: Every mask posenc builds for FlexAttention: causal or not, documents, a window, chunks, sinks.
MASKS = {
    "causal": {},
    "bidirectional": {"causal": False},
    "documents+window+sinks": {"document_ids": torch.arange(S) // 7, "window": 5, "sinks": torch.randn(H)},
    "chunks+sinks": {"chunk_size": 6, "sinks": torch.randn(H)},
}


def _flex_encodings() -> list[str]:
    names = []
    for name in posenc.available():
        enc = build(name)
        if not enc.has_value_term and not enc.needs_keys:  # Shaw's values and CoPE have no flex backend
            names.append(name)
    return names


@pytest.mark.parametrize("mask", list(MASKS))
@pytest.mark.parametrize("name", [None, *_flex_encodings()])
def test_score_mod_and_mask_mod_capture_no_python_float(monkeypatch, name, mask):
    enc = None if name is None else build(name)
    kwargs = MASKS[mask]
    if enc is not None and enc.causal_only and kwargs.get("causal") is False:
        pytest.skip(f"{type(enc).__name__} is defined over the causal past only")
    if enc is not None and enc.position_kind != "sequence" and ("window" in kwargs or "chunk_size" in kwargs):
        pytest.skip("windows and chunks read sequence positions")
    seen = _flex_arguments(monkeypatch, enc, **kwargs)
    closures = {"score_mod": seen["score_mod"], "mask_mod": seen["block_mask"].mask_mod}
    if enc is not None and enc.has_bias:
        assert closures["score_mod"] is not None, f"{name} adds a bias but handed FlexAttention no score_mod"
    captured = [(p, v) for key, fn in closures.items() if fn is not None for p, v in _captured(fn, key)]
    if kwargs.get("causal", True):  # the walk reads the closures: a causal mask_mod holds its offset, an int
        assert any(p.endswith(".offset") and type(v) is int for p, v in captured), captured
    wrong = [f"{p} = {v!r} ({type(v).__name__})" for p, v in captured if not isinstance(v, CAPTURABLE)]
    assert not wrong, f"{name} / {mask}: captured values that are not tensors, ints, bools or strings: {wrong}"


def test_the_walk_finds_a_float_in_a_nested_closure():
    """The check above can fail: a float two closures deep is found, with its path."""
    eps = 1e-6
    inner = lambda score: score + eps  # noqa: E731
    outer = lambda score, b, h, q_idx, kv_idx: inner(score)  # noqa: E731
    assert [(p, v) for p, v in _captured(outer, "score_mod") if not isinstance(v, CAPTURABLE)] == [
        ("score_mod.inner.eps", eps)
    ]


def _two_configs(make: Callable[[float], posenc.Encoding], values: tuple[float, float]) -> None:
    """One compiled model, as a user compiles it (``torch.compile``'s default automatic dynamic shapes), run with
    two encodings that differ in a float of their config: the second compilation sees that float change."""
    torch.manual_seed(0)
    q, k, v = torch.randn(B, H, S, 32), torch.randn(B, HKV, S, 32), torch.randn(B, HKV, S, 8)
    pos = torch.arange(S)
    torch._dynamo.reset()  # a fresh compilation cache: what ran before does not decide what is dynamic
    for value in values:
        enc = make(value)

        def step(q, k, v, enc=enc):
            return posenc.attention(q, k, v, encoding=enc, backend="flex", q_positions=pos)

        with torch.no_grad():
            want = posenc.attention(q, k, v, encoding=enc, backend="eager", q_positions=pos)
            got = torch.compile(step)(q, k, v)
        assert_close(got, want, **attention_tol(q, k, v, encoding=enc, q_positions=pos))


@pytest.mark.flex_compiled
def test_compiled_model_with_two_fire_thresholds():
    """FIRE's ``init_L`` and ``eps`` were Python floats in its score_mod: the second FIRE failed to compile
    (torch 2.13: "unbacked_bindings" in CPU lowering; torch 2.15: "can only be of (Tensor, int, SymInt)")."""
    _two_configs(lambda init_l: FIRE(H, mlp_width=4, init_L=init_l, eps=init_l * 1e-7), (512.0, 16.0))
