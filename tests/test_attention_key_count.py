"""Encodings whose factor depends on how many keys a query sees (``Encoding.reads_key_count``: SSMax's ``s log n +
b``, Llama 4's temperature) get that number from attention's mask: causal, documents, chunks and window, never the
sinks. Compared on full tensors with a float64 reference that counts ``n`` from the mask itself
(``tests/reference/key_count.py``), on every backend, in a KV-cache decode, and with ``SSMax(window=)``."""

from __future__ import annotations

import importlib
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.testing import assert_close

import posenc
from encoding_cases import MODEL, attention_tol, build
from posenc.attention import KEY_COUNT_TILE
from reference.key_count import key_count_attention, ssmax_factor, temperature_factor, visible_keys
from tolerances import dot_magnitude, softmax_atol, unit_roundoff

B, H, HKV, D, DV = 2, 4, 2, 16, 6
FLOOR, STRENGTH = 3, 0.5  # a temperature that steps every 3 keys, so a window or chunk changes it in a short test

#: Every registered encoding that reads the key count: a new one joins these tests through the registry.
KEY_COUNT = [name for name in posenc.available() if posenc.build(name, **MODEL).reads_key_count]


def _encoding(name: str, dtype=torch.float64) -> posenc.Encoding:
    extra = {"floor_scale": FLOOR, "attn_scale": STRENGTH} if name == "nope_temperature" else {}
    return build(name, **extra).to(dtype)  # SSMax's s (and b) made to differ per head


def _factor(enc: posenc.Encoding):
    """The reference's factor of ``n`` for this encoding, from its parameters."""
    if isinstance(enc, posenc.SSMax):
        return ssmax_factor(enc.s.detach(), 0.0 if enc.b is None else enc.b.detach())
    return temperature_factor(enc.config.floor_scale, enc.config.attn_scale)


def _rope(enc: posenc.Encoding):
    rope = getattr(enc, "rope", None)
    if rope is None:
        return None
    return {"inv_freq": rope.inv_freq, "layout": rope.config.layout, "attention_factor": rope.attention_factor}


def _qkv(s, t, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed * 1000 + s * 100 + t)
    shapes = [(B, H, s, D), (B, HKV, t, D), (B, HKV, t, DV)]
    return [(torch.randn(*x, generator=g) * 2).to(dtype) for x in shapes]


#: (S, T, window, chunk_size, documents, sinks): each mask alone, every pair, all together; a cache offset (S < T).
MASKS = {
    "window": (20, 20, 5, None, False, False),
    "chunks": (20, 20, None, 6, False, False),
    "documents": (20, 20, None, None, True, False),
    "sinks": (20, 20, None, None, False, True),
    "window+chunks": (20, 20, 4, 7, False, False),
    "window+documents+sinks": (20, 20, 6, None, True, True),
    "chunks+documents": (20, 20, None, 5, True, False),
    "everything, cached": (9, 22, 5, 8, True, True),
}


def _case(mask: str, dtype=torch.float64):
    s, t, window, chunk, docs, with_sinks = MASKS[mask]
    q, k, v = _qkv(s, t, dtype)
    kw = {"window": window, "chunk_size": chunk}
    if docs:
        k_pos, kw["document_ids"] = posenc.packed_positions([7, t - 7])
    else:
        k_pos = torch.stack([torch.arange(t), torch.arange(t) + 3])  # rows differ: a cache starting later
    kw |= {"q_positions": k_pos[..., t - s :], "k_positions": k_pos}
    if with_sinks:
        kw["sinks"] = torch.linspace(-1.0, 2.0, H, dtype=dtype)
    return (q, k, v), kw


def _reference(enc, q, k, v, kw):
    return key_count_attention(q, k, v, _factor(enc), rope=_rope(enc), **kw)


def _atol64(enc, q, k, v) -> float:
    """float64 inputs: SSMax's factor is float64 too (1e-12: a few roundings of the float64 sums); Llama 4's
    temperature is float32 whatever q's dtype (transformers' numerics), so a score moves by up to 4 float32 roundings
    (floor, log1p, the product, the sum) of its factor, and the output as ``softmax_atol`` says."""
    if not isinstance(enc, posenc.NoPETemperature):
        return 1e-12
    t = k.shape[2]
    largest = math.log1p(t // FLOOR) * STRENGTH + 1.0  # the factor of the query that sees every key
    score = dot_magnitude(q, k) * D**-0.5 * largest
    return 1e-12 + softmax_atol(4 * unit_roundoff(torch.float32) * score, t, float(v.abs().max()), torch.float64)


def test_the_key_count_encodings_are_ssmax_and_llama4s_temperature():
    assert sorted(KEY_COUNT) == ["nope_temperature", "rope_ssmax", "rope_ssmax_bias", "ssmax", "ssmax_bias"]


@pytest.mark.parametrize("mask", list(MASKS))
@pytest.mark.parametrize("name", KEY_COUNT)
@pytest.mark.parametrize("backend", ["eager", "sdpa"])
def test_equals_reference_counting_n_from_the_mask(backend, name, mask):
    """float64 on eager and sdpa: ``n`` is what the mask leaves, e.g. ``min(p + 1, W)`` and ``(p mod C) + 1``."""
    enc = _encoding(name)
    (q, k, v), kw = _case(mask)
    with torch.no_grad():
        got = posenc.attention(q, k, v, encoding=enc, backend=backend, **kw)
    assert_close(got, _reference(enc, q, k, v, kw), rtol=0, atol=_atol64(enc, q, k, v))


@pytest.mark.parametrize("mask", ["window+chunks", "everything, cached"])
@pytest.mark.parametrize("name", KEY_COUNT)
def test_flex_equals_reference_counting_n_from_the_mask(name, mask):
    """FlexAttention (CPU: float32, no gradients) gets the same ``n``."""
    enc = _encoding(name, torch.float32)
    (q, k, v), kw = _case(mask, torch.float32)
    with torch.no_grad():
        got = posenc.attention(q, k, v, encoding=enc, backend="flex", **kw)
        eager = posenc.attention(q, k, v, encoding=enc, backend="eager", **kw)
    tol = attention_tol(q, k, v, encoding=enc, q_positions=kw["q_positions"], k_positions=kw["k_positions"],
                        sinks=kw.get("sinks"))
    assert_close(got, eager, **tol)
    assert_close(got.double(), _reference(enc, q, k, v, kw), **tol)


@pytest.mark.parametrize("name", ["ssmax_bias", "rope_ssmax"])
def test_gradients_equal_the_reference(name):
    """sdpa's gradients in q, k, v, the sinks and SSMax's s (and b), under a window, chunks and documents."""
    enc = _encoding(name)
    (q, k, v), kw = _case("everything, cached")
    q, k, v, sinks = (x.clone().requires_grad_() for x in (q, k, v, kw.pop("sinks")))
    weight = torch.linspace(-1, 1, B * H * q.shape[2] * DV, dtype=torch.float64).view(B, H, -1, DV)
    params = list(enc.parameters())
    out = posenc.attention(q, k, v, encoding=enc, sinks=sinks, backend="sdpa", **kw)
    got = torch.autograd.grad((out * weight).sum(), [q, k, v, sinks, *params])
    copies = [p.detach().clone().requires_grad_() for p in params]
    factor = ssmax_factor(*copies)
    want_out = key_count_attention(q, k, v, factor, sinks=sinks, rope=_rope(enc), **kw)
    want = torch.autograd.grad((want_out * weight).sum(), [q, k, v, sinks, *copies])
    for g, w in zip(got, want, strict=True):
        assert_close(g, w, rtol=0, atol=1e-11)


@settings(max_examples=20, deadline=None)
@given(
    name=st.sampled_from(KEY_COUNT),
    window=st.one_of(st.none(), st.integers(1, 9)),
    chunk=st.one_of(st.none(), st.integers(1, 9)),
    ring=st.booleans(),
    with_sinks=st.booleans(),
    backend=st.sampled_from(["eager", "sdpa"]),
)
def test_decode_equals_the_full_forward(name, window, chunk, ring, with_sinks, backend):
    """One query at a time against its cache -- every key so far, or (``ring``, with a window) only the last
    ``W - 1`` before it, as transformers' and vLLM's sliding layers keep them -- equals its row of the full forward."""
    enc = _encoding(name)
    t = 14
    q, k, v = _qkv(t, t)
    pos = torch.arange(t)
    sinks = torch.linspace(-1.0, 2.0, H, dtype=torch.float64) if with_sinks else None
    kw = {"encoding": enc, "window": window, "chunk_size": chunk, "sinks": sinks, "backend": backend}
    with torch.no_grad():
        full = posenc.attention(q, k, v, q_positions=pos, **kw)
        for i in range(t):
            lo = max(0, i - window + 1) if ring and window is not None else 0
            step = posenc.attention(q[:, :, i : i + 1], k[:, :, lo : i + 1], v[:, :, lo : i + 1],
                                    q_positions=pos[i : i + 1], k_positions=pos[lo : i + 1], **kw)
            assert_close(step, full[:, :, i : i + 1], rtol=0, atol=1e-12)


@pytest.mark.parametrize("name", KEY_COUNT)
def test_sinks_are_not_keys(name):
    """A sink at -inf takes no mass: the layer is then exactly the one without sinks, ``n`` unchanged."""
    enc = _encoding(name)
    (q, k, v), kw = _case("window+documents+sinks")
    with torch.no_grad():
        gone = posenc.attention(q, k, v, encoding=enc, backend="eager", **{**kw, "sinks": torch.full((H,), -math.inf,
                                dtype=torch.float64)})
        plain = posenc.attention(q, k, v, encoding=enc, backend="eager", **{**kw, "sinks": None})
    assert_close(gone, plain, rtol=0, atol=1e-15)


def test_the_count_is_the_masks_in_slices(monkeypatch):
    """Counted ``KEY_COUNT_TILE`` (query, key) pairs at a time (linear memory): a tile smaller than one row of keys
    counts the same as one slice, and the same as the reference's visible keys."""
    from posenc.attention import _Mask

    s = t = 30
    pos = torch.stack([torch.arange(t), torch.arange(t) + 4])  # (B, T)
    docs = posenc.packed_positions([11, 19])[1]
    mask = _Mask(causal=True, offset=0, docs=docs[None], s=s, t=t, chunks=(pos // 6, pos // 6), window=(pos, pos, 5))
    want = torch.tensor([[len(visible_keys(i, b=b, s=s, t=t, q_positions=pos, k_positions=pos,
                                           document_ids=docs, chunk_size=6, window=5)) for i in range(s)]
                         for b in range(B)])
    assert B * s * t <= KEY_COUNT_TILE  # one slice
    assert torch.equal(mask.key_counts(torch.device("cpu")), want)
    monkeypatch.setattr(importlib.import_module("posenc.attention"), "KEY_COUNT_TILE", 7)  # a slice per query row
    assert torch.equal(mask.key_counts(torch.device("cpu")), want)


@pytest.mark.parametrize("name", ["ssmax", "rope_ssmax_bias"])
def test_ssmax_built_with_a_window_takes_only_that_window(name):
    """``SSMax(window=W)`` (before attention counted keys, the way to cap ``n``) computes what it did with
    ``window=W`` in attention, and the same as an SSMax built without it; any other window is refused by name."""
    enc, free = _encoding(name), _encoding(name)
    enc = type(enc).from_config({**enc.config.to_dict(), "window": 5}).double()
    enc.load_state_dict(free.state_dict())
    (q, k, v), kw = _case("window")
    assert kw["window"] == 5
    with torch.no_grad():
        got = posenc.attention(q, k, v, encoding=enc, backend="eager", **kw)
        assert_close(got, posenc.attention(q, k, v, encoding=free, backend="eager", **kw), rtol=0, atol=0)
        for other in (None, 4, 6):
            with pytest.raises(ValueError, match=rf"^window={other} is invalid: expected 5, the window this SSMax "
                                                 r"was built with \(SSMax\(window=5\)\)"):
                posenc.attention(q, k, v, encoding=enc, backend="eager", **{**kw, "window": other})
    q1 = q[:, :, :1]
    assert torch.equal(enc.rotate(q1, k, torch.tensor([9]), kw["k_positions"][0])[0],
                       free.rotate(q1, k, torch.tensor([9]), kw["k_positions"][0],
                                   key_count=torch.tensor([5]))[0])  # alone: n = min(p + 1, W)


def test_called_alone_n_is_read_from_the_position():
    """``rotate`` without a count (a custom attention): ``n = p + 1`` (Llama 4's temperature, SSMax); with one, it."""
    q, k, _ = _qkv(6, 6)
    pos = torch.arange(6)
    for name in KEY_COUNT:
        enc = _encoding(name)
        alone = enc.rotate(q, k, pos, pos)[0]
        assert torch.equal(alone, enc.rotate(q, k, pos, pos, key_count=pos + 1)[0])
        assert not torch.equal(alone, enc.rotate(q, k, pos, pos, key_count=torch.ones(6, dtype=torch.long) * 3)[0])


def test_bad_counts_are_refused():
    enc = _encoding("ssmax")
    q, k, _ = _qkv(6, 6)
    pos = torch.arange(6).expand(B, 6)
    for bad, match in [
        (torch.ones(6), r"key_count.dtype=torch.float32 is invalid: expected an integer dtype"),
        (
            torch.ones(5, dtype=torch.long),
            r"key_count.shape=\(5,\) is invalid: expected \(6,\) or \(1, 6\) or "
            r"\(2, 6\), one count per query",
        ),
        (torch.ones(3, 6, dtype=torch.long), r"key_count.shape=\(3, 6\) is invalid"),
        ([1, 2], r"key_count='list' is invalid: expected an integer tensor"),
    ]:
        with pytest.raises(ValueError, match=match):
            enc.rotate(q, k, pos, pos, key_count=bad)
    with pytest.raises(ValueError, match=r"window=4 is invalid: expected None with key_count="):
        posenc.functional.ssmax_scale(pos, 0.43, window=4, key_count=pos + 1)
    with pytest.raises(ValueError, match=r"key_count.dtype=torch.bool"):
        posenc.functional.attention_temperature(pos, key_count=pos > 2)
