"""``posenc.attention(sinks=...)`` against vLLM's paged attention with sinks, the attention GPT-OSS runs in vLLM
(``tests/reference/vllm_sinks.py``: a float64 write-up of vLLM's Triton unified-attention kernel; it names the vLLM
files and commits).

Compared on full tensors, on every backend that takes sinks (eager, sdpa, flex): a batch as vLLM schedules it -- a
prefill, a chunked prefill onto a cache, a decode, a prefill across FlexAttention's 128-key tiles -- read from a paged
cache, for MHA, GQA and MQA; one-token decodes through vLLM's 3D split-KV path (the sink in segment 0 only); RoPE at
explicit positions (a KV cache's); and GPT-OSS's sliding-window layers (W = 128, with sinks) as
``posenc.attention(..., window=128)``, given the whole cache or only the last W keys (a ring buffer). The window's
definition (W keys, the query's own included, as vLLM and transformers' GPT-OSS mask) is pinned against ``window=W +
1`` and against no window, and the one rounding where posenc's sdpa and vLLM's kernel part (float32 sinks with
bfloat16 inputs) is pinned too.

Tolerances: posenc's float32 result against the float64 reference is bounded by ``tolerances.attention_atol`` from
the inputs themselves -- the D-term dot products, the scale, the max subtraction with the sink among the logits
(``bias_max = max |sinks|``), the weighted sum over T keys -- plus, with RoPE, the rotation's error on each score
(angles rounded to ``u * max_position``, cos/sin and products a few roundings, as ``rotated_softmax_atol``). Flex runs
GQA only in the batch test: each new shape costs a CPU compilation (~6 s).
"""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

import posenc
from reference.rope_float64 import rotate_float64
from reference.vllm_sinks import paged_attention_with_sinks
from tolerances import attention_atol, dot_magnitude, unit_roundoff

H, D = 8, 64  # GPT-OSS: 64 query heads of 64 channels over 8 kv heads; here 8 query heads over 8, 2 or 1
WINDOW = 128  # GPT-OSS's sliding_window (even layers)
ROPE_BASE = 150000.0  # GPT-OSS's rope_theta
BLOCK_SIZE = 16  # vLLM's Triton backend takes multiples of 16
BACKENDS = ["eager", "sdpa", "flex"]
#: (query_len, kv_len): a prefill, a chunked prefill onto 65 cached tokens, a decode, a prefill across 128-key tiles.
BATCH = [(40, 40), (5, 70), (1, 300), (129, 200)]


def _sequences(lens, hkv, dtype=torch.float32):
    """Per sequence q (1, H, S, D), k and v (1, Hkv, T, D); sinks (H,) spread like learned ones (a few units)."""
    qs = [torch.randn(1, H, s, D, dtype=dtype) for s, _ in lens]
    ks = [torch.randn(1, hkv, t, D, dtype=dtype) for _, t in lens]
    vs = [torch.randn(1, hkv, t, D, dtype=dtype) for _, t in lens]
    return qs, ks, vs, torch.randn(H) * 2


def _vllm(qs, ks, vs, sinks, **kwargs):
    """The reference on vLLM's layout: the new tokens packed ``(N, H, D)``; keys and values in a paged cache of
    shuffled blocks whose unused slots hold NaN (the reference reads only each sequence's ``kv_len`` keys, or the
    comparison fails). Returns one ``(1, H, S, D)`` float64 output per sequence."""
    hkv, dtype = ks[0].shape[1], ks[0].dtype
    n_blocks = [-(-k.shape[2] // BLOCK_SIZE) for k in ks]
    order = torch.randperm(sum(n_blocks) + 3)  # three blocks no sequence owns
    key_cache = torch.full((len(order), BLOCK_SIZE, hkv, D), float("nan"), dtype=dtype)
    value_cache = torch.full_like(key_cache, float("nan"))
    tables = torch.zeros(len(ks), max(n_blocks), dtype=torch.int32)
    used = 0
    for i, (k, v, n) in enumerate(zip(ks, vs, n_blocks, strict=True)):
        tables[i, :n] = order[used : used + n]
        used += n
        for b in range(n):
            rows = slice(b * BLOCK_SIZE, min((b + 1) * BLOCK_SIZE, k.shape[2]))
            width = rows.stop - rows.start
            key_cache[tables[i, b], :width] = k[0, :, rows].transpose(0, 1)  # (width, Hkv, D)
            value_cache[tables[i, b], :width] = v[0, :, rows].transpose(0, 1)
    query_lens = [q.shape[2] for q in qs]
    out = paged_attention_with_sinks(
        torch.cat([q[0].transpose(0, 1) for q in qs]),  # (N, H, D)
        key_cache,
        value_cache,
        query_lens=query_lens,
        kv_lens=[k.shape[2] for k in ks],
        block_tables=tables,
        scale=D**-0.5,
        sinks=sinks,
        **kwargs,
    )
    return [o.transpose(0, 1)[None] for o in out.split(query_lens)]  # (S, H, D) -> (1, H, S, D)


def _tol(q, k, v, sinks, *, max_position=None):
    """``attention_atol`` with the sinks among the logits; with RoPE (``max_position``), the rotation's score error."""
    extra = 0.0
    if max_position is not None:
        u = unit_roundoff()
        extra = D**-0.5 * 2 * dot_magnitude(q, k) * (max_position * u + 8 * u)
    q, k, v = (x.float() for x in (q, k, v))
    return {"rtol": 0.0, "atol": attention_atol(q, k, v, bias_max=float(sinks.abs().max()), extra_score_error=extra)}


def _rope():
    inv_freq = 1.0 / ROPE_BASE ** (torch.arange(0, D, 2, dtype=torch.float64) / D)  # vLLM's NeoX RoPE, float64
    return posenc.build("rope", head_dim=D, base=ROPE_BASE), inv_freq


@pytest.mark.parametrize(("backend", "hkv"), [(b, g) for b in ("eager", "sdpa") for g in (8, 2, 1)] + [("flex", 2)])
def test_batch_matches_vllm(backend, hkv):
    """A mixed batch from a paged cache (prefill, chunked prefill onto a cache, decode, 129 queries across 128-key
    tiles): each sequence through posenc.attention with its queries the last S of its T keys."""
    qs, ks, vs, sinks = _sequences(BATCH, hkv)
    refs = _vllm(qs, ks, vs, sinks)
    with torch.no_grad():
        for (s, t), q, k, v, ref in zip(BATCH, qs, ks, vs, refs, strict=True):
            out = posenc.attention(q, k, v, sinks=sinks, backend=backend)
            assert_close(out, ref.float(), **_tol(q, k, v, sinks), msg=lambda m, s=s, t=t: f"S={s}, T={t}: {m}")


@pytest.mark.parametrize("backend", BACKENDS)
def test_decodes_match_vllm_split_kv(backend):
    """One-token decodes (caches of 300, 37 and 1 keys), as vLLM runs them when every sequence decodes: the 3D path,
    16 segments of 16-key tiles, the sink in segment 0 only; the 2D path gives the same."""
    lens = [(1, 300), (1, 37), (1, 1)]
    qs, ks, vs, sinks = _sequences(lens, 2)
    split = _vllm(qs, ks, vs, sinks, tile_size=16, num_segments=16)
    whole = _vllm(qs, ks, vs, sinks)
    with torch.no_grad():
        for (_, t), q, k, v, ref, ref2 in zip(lens, qs, ks, vs, split, whole, strict=True):
            out = posenc.attention(q, k, v, sinks=sinks, backend=backend)
            assert_close(out, ref.float(), **_tol(q, k, v, sinks), msg=lambda m, t=t: f"T={t}: {m}")
            assert_close(ref, ref2, rtol=0.0, atol=1e-12)


@pytest.mark.parametrize("backend", BACKENDS)
def test_rope_at_explicit_positions_matches_vllm(backend):
    """vLLM rotates q and k at the tokens' positions (GPT-OSS: NeoX layout) and then attends by cache index; posenc
    rotates them itself from explicit ``q_positions``/``k_positions``: a chunked prefill and a decode onto a cache."""
    enc, inv_freq = _rope()
    lens = [(5, 70), (1, 300)]
    qs, ks, vs, sinks = _sequences(lens, 2)
    pos = [(torch.arange(t - s, t), torch.arange(t)) for s, t in lens]
    rq = [rotate_float64(q, qp, inv_freq) for q, (qp, _) in zip(qs, pos, strict=True)]
    rk = [rotate_float64(k, kp, inv_freq) for k, (_, kp) in zip(ks, pos, strict=True)]
    refs = _vllm(rq, rk, [v.double() for v in vs], sinks)
    with torch.no_grad():
        for (s, t), (qp, kp), q, v, a, b, ref in zip(lens, pos, qs, vs, ks, rk, refs, strict=True):
            out = posenc.attention(q, a, v, encoding=enc, q_positions=qp, k_positions=kp, sinks=sinks, backend=backend)
            tol = _tol(rotate_float64(q, qp, inv_freq), b, v, sinks, max_position=t - 1)
            assert_close(out, ref.float(), **tol, msg=lambda m, s=s, t=t: f"S={s}, T={t}: {m}")


@pytest.mark.parametrize("backend", BACKENDS)
def test_sliding_window_prefill_matches_vllm(backend):
    """A GPT-OSS sliding layer (W = 128, sinks, GQA, RoPE): a 300-token prefill. vLLM masks by ``window_size =
    (W - 1, 0)``; posenc by ``window=W``."""
    enc, inv_freq = _rope()
    (q,), (k,), (v,), sinks = _sequences([(300, 300)], 2)
    pos = torch.arange(300)
    rq, rk = rotate_float64(q, pos, inv_freq), rotate_float64(k, pos, inv_freq)
    (ref,) = _vllm([rq], [rk], [v.double()], sinks, sliding_window=WINDOW)
    with torch.no_grad():
        out = posenc.attention(q, k, v, encoding=enc, q_positions=pos, window=WINDOW, sinks=sinks, backend=backend)
    assert_close(out, ref.float(), **_tol(rq, rk, v, sinks, max_position=299))


@pytest.mark.parametrize("backend", BACKENDS)
def test_sliding_window_decode_matches_vllm(backend):
    """Decoding on a GPT-OSS sliding layer with caches of 300, 129, 128 and 50 tokens (past, at and inside the window),
    vLLM's 2D and 3D paths (with W = 128 most of the 3D segments see no key in the window): ``posenc.attention(...,
    window=W)`` given the whole cache, and given only its last ``min(W, T)`` keys (a ring buffer), with their
    positions."""
    enc, inv_freq = _rope()
    lens = [(1, 300), (1, 129), (1, 128), (1, 50)]
    qs, ks, vs, sinks = _sequences(lens, 2)
    pos = [torch.arange(t) for _, t in lens]
    rq = [rotate_float64(q, p[-1:], inv_freq) for q, p in zip(qs, pos, strict=True)]
    rk = [rotate_float64(k, p, inv_freq) for k, p in zip(ks, pos, strict=True)]
    v64 = [v.double() for v in vs]
    refs = _vllm(rq, rk, v64, sinks, sliding_window=WINDOW)
    splits = _vllm(rq, rk, v64, sinks, sliding_window=WINDOW, tile_size=16, num_segments=16)
    with torch.no_grad():
        for (_, t), p, q, k, v, a, b, ref, split in zip(lens, pos, qs, ks, vs, rq, rk, refs, splits, strict=True):
            kw = {"encoding": enc, "q_positions": p[-1:], "window": WINDOW, "sinks": sinks, "backend": backend}
            out = posenc.attention(q, k, v, k_positions=p, **kw)
            ring = posenc.attention(q, k[:, :, -WINDOW:], v[:, :, -WINDOW:], k_positions=p[-WINDOW:], **kw)
            tol = _tol(a, b, v, sinks, max_position=t - 1)
            assert_close(out, ref.float(), **tol, msg=lambda m, t=t: f"T={t}: {m}")
            assert_close(out, split.float(), **tol, msg=lambda m, t=t: f"T={t}, 3D: {m}")
            assert_close(ring, ref.float(), **tol, msg=lambda m, t=t: f"T={t}, last W keys: {m}")


def test_window_is_w_keys_not_w_plus_one_nor_all():
    """vLLM's window W: the query at cache index p sees keys ``p - W + 1 .. p``, W keys counting its own (transformers'
    GPT-OSS mask, ``kv_idx > q_idx - sliding_window``, agrees). ``posenc.attention(window=W)`` reproduces it;
    ``window=W + 1``, or no window, do not."""
    w = 7
    for s, t in [(40, 40), (1, 40), (3, 12)]:
        (q,), (k,), (v,), sinks = _sequences([(s, t)], 2)
        (ref,) = _vllm([q], [k], [v], sinks, sliding_window=w)
        tol = _tol(q, k, v, sinks)
        exact = posenc.attention(q, k, v, sinks=sinks, window=w, backend="eager")
        assert_close(exact, ref.float(), **tol)
        one_more = posenc.attention(q, k, v, sinks=sinks, window=w + 1, backend="eager")
        everything = posenc.attention(q, k, v, sinks=sinks, backend="eager")
        for name, other in [("W + 1 keys", one_more), ("no window", everything)]:
            gap = float((other.double() - ref).abs().max())
            assert gap > 100 * tol["atol"], f"S={s}, T={t}: {name} is within {gap:.2g} of vLLM's window"


@pytest.mark.flex_compiled  # the compiled kernel's float32 sink; uncompiled flex rounds it to bfloat16
def test_half_precision_sink_rounding():
    """Where posenc and vLLM's kernel round differently: float32 sinks with bfloat16 inputs. vLLM's kernel converts the
    sinks it is given to float32, and so do posenc's eager and flex; posenc's sdpa rounds them to bfloat16 (its float
    mask). With q = 0 every score is exactly 0 and with v = 1 the output is exactly T / (T + exp(sink)), rounded once
    to bfloat16: sink 4.0155 (4.0 in bfloat16) gives 0.53515625 unrounded and 0.5390625 rounded, each about 1.3e-3
    from a bfloat16 rounding boundary, far beyond float32 rounding, so the comparison is exact."""
    t = 64
    q = torch.zeros(1, H, 1, D, dtype=torch.bfloat16)
    k = torch.randn(1, 2, t, D).bfloat16()
    v = torch.ones(1, 2, t, D, dtype=torch.bfloat16)
    sinks = torch.full((H,), 4.0155)
    (unrounded,) = _vllm([q.double()], [k.double()], [v.double()], sinks)
    (rounded,) = _vllm([q.double()], [k.double()], [v.double()], sinks.bfloat16().float())
    assert_close(unrounded, torch.full_like(unrounded, t / (t + torch.tensor(4.0155).double().exp())))
    want = {"eager": unrounded, "flex": unrounded, "sdpa": rounded}
    assert not torch.equal(unrounded.bfloat16(), rounded.bfloat16())
    with torch.no_grad():
        for backend, ref in want.items():
            out = posenc.attention(q, k, v, sinks=sinks, backend=backend)
            assert torch.equal(out, ref.bfloat16()), f"{backend}: {out.flatten()[0]} vs {ref.flatten()[0]}"


@pytest.mark.parametrize(("tile_size", "num_segments"), [(32, None), (16, None), (16, 16), (7, 4)])
@pytest.mark.parametrize("window", [None, 20])
def test_reference_recurrence_is_a_softmax_with_a_sink_logit(tile_size, num_segments, window):
    """The reference's transcription of the kernel -- M from the sink and L = 1, tile after tile; 3D segments with the
    sink in segment 0 only; tiles and whole segments outside the window -- equals ``softmax([scores, sink])[..., :T] v``
    written out in float64, and without sinks the plain softmax; the sinks move the output."""
    lens = [(1, 300), (1, 33), (1, 1)] if num_segments else [(30, 300), (5, 33), (1, 1)]
    qs, ks, vs, sinks = _sequences(lens, 2, dtype=torch.float64)
    kwargs = {"sliding_window": window, "tile_size": tile_size, "num_segments": num_segments}
    for with_sinks in (sinks, None):
        refs = _vllm(qs, ks, vs, with_sinks, **kwargs)
        for q, k, v, ref in zip(qs, ks, vs, refs, strict=True):
            assert_close(ref, _softmax_with_sink(q, k, v, with_sinks, window), rtol=0.0, atol=1e-12)
    q, k, v = qs[0], ks[0], vs[0]
    assert (_softmax_with_sink(q, k, v, sinks, window) - _softmax_with_sink(q, k, v, None, window)).abs().max() > 1e-2


def _softmax_with_sink(q, k, v, sinks, window):
    """GPT-OSS's sink softmax in float64, queries the last S of T keys, a window of W keys: (1, H, S, D)."""
    s, t = q.shape[2], k.shape[2]
    group = H // k.shape[1]
    kf, vf = (x.double().repeat_interleave(group, dim=1) for x in (k, v))
    scores = (q.double() @ kf.transpose(-1, -2)) * D**-0.5  # (1, H, S, T)
    p, j = torch.arange(t - s, t)[:, None], torch.arange(t)[None, :]
    visible = (j <= p) & (p - j < (window or t + 1))
    scores = scores.masked_fill(~visible, float("-inf"))
    if sinks is None:
        return torch.softmax(scores, dim=-1) @ vf
    sink = sinks.double().view(1, -1, 1, 1).expand(*scores.shape[:-1], 1)
    return torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1] @ vf
