"""``posenc.attention``: the eager reference vs the written-out formula, and every backend vs eager for every
registered encoding -- forward, backward, KV-cache decoding, chunking, packing and grouped-query attention."""

from __future__ import annotations

import copy
import importlib

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch.testing import assert_close

import posenc
from encoding_cases import SCALED, build, positions, shard
from encoding_cases import attention_tol as tol
from largest_tensor import flex_prepared
from posenc.attention import FLEX_BLOCK, FLEX_MIN_BIAS_BYTES, _resolve_backend
from reference.attention import naive_attention
from tolerances import like_reference_atol

B, H, HKV, D, DV = 2, 4, 2, 16, 8
#: Every registered encoding, and RoPE under every scaling (the length-dependent ones included).
CASES = [*posenc.available(), *SCALED]


def qkv(s, t, *, h=H, hkv=HKV, b=B, dv=DV, requires_grad=False, dtype=torch.float32):
    q = torch.randn(b, h, s, D, dtype=dtype)
    k = torch.randn(b, hkv, t, D, dtype=dtype)
    v = torch.randn(b, hkv, t, dv, dtype=dtype)
    return [x.requires_grad_(requires_grad) for x in (q, k, v)]


class _Bias(posenc.Encoding):
    """A toy bias that depends on everything it is given: head, absolute query and key positions."""

    has_bias = True

    def bias(self, q_pos, k_pos, *, q=None, scale=None):
        h = torch.arange(H, dtype=torch.float32)[:, None, None]
        return (torch.sin(q_pos[:, None] * 0.3 + h) * torch.cos(k_pos[None, :] * 0.7 - h)).unsqueeze(0)


# ---------------------------------------------------------------------------------------------------------------
# The eager backend is the formula


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize(("s", "t"), [(6, 6), (1, 9), (4, 9)])
@pytest.mark.parametrize("docs", [False, True])
@pytest.mark.parametrize("hkv", [1, 2, 4])
def test_eager_is_the_formula(causal, s, t, docs, hkv):
    if not causal and docs and s != t:
        pytest.skip("covered by the causal case")
    q, k, v = qkv(s, t, hkv=hkv)
    document_ids = torch.tensor([0, 0, 0, 1, 1, 2, 2, 2, 2])[:t] if docs else None
    enc = _Bias()
    q_pos, k_pos = torch.arange(t - s, t) + 3, torch.arange(t) + 3
    out = posenc.attention(
        q,
        k,
        v,
        encoding=enc,
        q_positions=q_pos,
        k_positions=k_pos,
        causal=causal,
        document_ids=document_ids,
        backend="eager",
        scale=0.37,
    )
    ref = naive_attention(q, k, v, bias=enc.bias(q_pos, k_pos), causal=causal, document_ids=document_ids, scale=0.37)
    assert_close(out, ref.float(), **tol(q, k, v, scale=0.37, bias=enc.bias(q_pos, k_pos)))


@pytest.mark.parametrize("backend", ["sdpa", "flex"])
@pytest.mark.parametrize(
    ("causal", "docs", "s", "t"),
    [(True, False, 6, 6), (True, True, 200, 200), (False, True, 150, 150), (True, False, 3, 260)],
)
def test_backends_follow_the_masks(backend, causal, docs, s, t):
    """Masks straddling FlexAttention's 128-token tiles: partial and full tiles, documents across tiles."""
    q, k, v = qkv(s, t)
    document_ids = (torch.arange(t) * 7 // t) if docs else None
    kw = {"encoding": _Bias(), "causal": causal, "document_ids": document_ids}
    if backend == "flex":
        kw["encoding"] = posenc.build("alibi", num_heads=H)
    with torch.no_grad():
        ref = posenc.attention(q, k, v, backend="eager", **kw)
        out = posenc.attention(q, k, v, backend=backend, **kw)
    assert_close(out, ref, **tol(q, k, v, encoding=kw["encoding"]))


# ---------------------------------------------------------------------------------------------------------------
# Every registered encoding, every backend


def _inputs(name, s=24, t=24, *, batched=False, requires_grad=False):
    enc = build(name)
    hkv = H if enc.per_head_keys else HKV
    dv = D if enc.has_value_term else DV  # Shaw's value embeddings are head_dim wide
    q, k, v = qkv(s, t, hkv=hkv, dv=dv, requires_grad=requires_grad)
    k_pos = positions(enc, t, start=2, batch=B if batched else None)
    q_pos = shard(enc, k_pos, t - s, t)
    return enc, (q, k, v), {"q_positions": q_pos, "k_positions": k_pos}


def _backends(enc):
    if enc.has_value_term:
        return []
    return ["sdpa"] if enc.needs_keys else ["sdpa", "flex"]  # a bias reading every key has no score_mod (CoPE)


def _skip_if_causal_only(enc, causal):
    if enc.causal_only and not causal:
        pytest.skip(f"{type(enc).__name__} is defined over the causal past only (causal=False is refused)")


@pytest.mark.parametrize("name", posenc.available())
@pytest.mark.parametrize("causal", [True, False])
def test_every_backend_matches_eager_forward(name, causal):
    enc, (q, k, v), pos = _inputs(name, batched=True)
    _skip_if_causal_only(enc, causal)
    with torch.no_grad():
        ref = posenc.attention(q, k, v, encoding=enc, causal=causal, backend="eager", **pos)
        for backend in _backends(enc):
            out = posenc.attention(q, k, v, encoding=enc, causal=causal, backend=backend, **pos)
            assert_close(out, ref, **tol(q, k, v, encoding=enc, **pos), msg=lambda m, b=backend: f"{name} / {b}: {m}")


@pytest.mark.parametrize("name", posenc.available())
def test_sdpa_matches_eager_backward(name):
    enc, (q, k, v), pos = _inputs(name, requires_grad=True)
    if enc.has_value_term:
        pytest.skip("only eager runs a value term")
    enc64 = copy.deepcopy(enc).double()
    grads = []
    for backend, e, dtype in (
        ("eager", enc64, torch.float64),
        ("eager", enc, torch.float32),
        ("sdpa", enc, torch.float32),
    ):
        leaves = [x.detach().to(dtype).requires_grad_() for x in (q, k, v)]
        params = [p for p in e.parameters() if p.requires_grad]
        out = posenc.attention(*leaves, encoding=e, backend=backend, **pos)
        weight = torch.linspace(-1, 1, out.numel(), dtype=dtype).view_as(out)
        grads.append(torch.autograd.grad((out * weight).sum(), [*leaves, *params], materialize_grads=True))
    # FlashAttention's test criterion: SDPA's float32 gradients are within a few times float32 eager's own distance
    # from float64 (this machine's rounding, measured on the same computation) plus a few roundings of the gradient.
    for exact, eager, sdpa in zip(*grads, strict=True):
        assert_close(sdpa.double(), exact, rtol=0.0, atol=like_reference_atol(eager, exact))


@pytest.mark.flex_compiled
@pytest.mark.gpu
@pytest.mark.parametrize("name", posenc.available())
def test_flex_matches_eager_on_cuda_forward_and_backward(name):
    enc, (q, k, v), pos = _inputs(name, s=200, t=200, requires_grad=True)
    if enc.has_value_term:
        pytest.skip("only eager runs a value term")
    if enc.needs_keys:
        pytest.skip("a bias reading every key has no score_mod: flex is refused")
    enc = enc.cuda()
    q, k, v = (x.detach().cuda().requires_grad_() for x in (q, k, v))
    pos = {key: p.cuda() for key, p in pos.items()}
    params = [p for p in enc.parameters() if p.requires_grad]
    results = []
    for backend in ("eager", "flex"):
        out = posenc.attention(q, k, v, encoding=enc, backend=backend, **pos)
        results.append((out, torch.autograd.grad(out.square().sum(), [q, k, v, *params], materialize_grads=True)))
    assert_close(results[1][0], results[0][0], atol=1e-4, rtol=1e-4)
    for g_ref, g in zip(results[0][1], results[1][1], strict=True):
        assert_close(g, g_ref, atol=1e-3, rtol=1e-3)


@pytest.mark.flex_compiled
def test_flex_pads_narrow_values_and_slices_the_output_back(monkeypatch):
    """CUDA's FlexAttention refuses v (and q, k) narrower than 16: posenc pads them with zeros and slices the output
    back. Run here by giving the CPU CUDA's minimums: the padded call equals eager, and flex saw 16-wide values."""
    attention_module = importlib.import_module("posenc.attention")  # the module (posenc.attention is the function)
    seen = []
    compiled = attention_module._compiled_flex
    monkeypatch.setattr(attention_module, "_flex_min_head_dims", lambda device_type: (32, 16))
    monkeypatch.setattr(attention_module, "_compiled_flex",
                        lambda fn, q, k, v, **kw: seen.append(v.shape[-1]) or compiled(fn, q, k, v, **kw))
    enc, (q, k, v), pos = _inputs("alibi")
    assert v.shape[-1] < 16
    with torch.no_grad():
        ref = posenc.attention(q, k, v, encoding=enc, backend="eager", **pos)
        out = posenc.attention(q, k, v, encoding=enc, backend="flex", **pos)
    assert seen == [16] and out.shape == ref.shape
    assert_close(out, ref, **tol(q, k, v, encoding=enc, **pos))


# ---------------------------------------------------------------------------------------------------------------
# KV cache, chunking, packing, GQA: each equals the plain full forward


@pytest.mark.parametrize("name", CASES)
@pytest.mark.parametrize("backend", ["eager", "sdpa"])
def test_decode_equals_full_forward(name, backend):
    """Prefill 10 tokens, then decode one token at a time and a chunk of 3: each query against the cached keys.

    Every call passes the full length as ``seq_len`` (what a cache of known final length, or a serving engine with
    a fixed context, knows); encodings whose rotation does not depend on the length ignore it.
    """
    enc, (q, k, v), pos = _inputs(name, s=16, t=16, batched=True)
    if backend == "sdpa" and enc.has_value_term:
        backend = "eager"
    kp = pos["k_positions"]
    length = int(kp.max()) + 1
    with torch.no_grad():
        full = posenc.attention(q, k, v, encoding=enc, backend=backend, **pos)
        steps = []
        for a, b in [(0, 10), (10, 11), (11, 12), (12, 15), (15, 16)]:
            steps.append(
                posenc.attention(
                    q[:, :, a:b],
                    k[:, :, :b],
                    v[:, :, :b],
                    encoding=enc,
                    backend=backend,
                    q_positions=shard(enc, kp, a, b),
                    k_positions=shard(enc, kp, 0, b),
                    seq_len=length,
                )
            )
    assert_close(torch.cat(steps, dim=2), full, **tol(q, k, v, encoding=enc, **pos))


@pytest.mark.parametrize("name", SCALED)
def test_decode_without_a_length_equals_each_prefix(name):
    """Without ``seq_len`` a decoding step uses the length so far: the last row of the full forward of that prefix
    (dynamic NTK and LongRoPE as a model generating token by token sees them)."""
    enc, (q, k, v), pos = _inputs(name, s=16, t=16, batched=True)
    kp = pos["k_positions"]
    with torch.no_grad():
        for b in range(1, 17):
            step = posenc.attention(
                q[:, :, b - 1 : b],
                k[:, :, :b],
                v[:, :, :b],
                encoding=enc,
                q_positions=kp[:, b - 1 : b],
                k_positions=kp[:, :b],
                backend="eager",
            )
            prefix = posenc.attention(
                q[:, :, :b], k[:, :, :b], v[:, :, :b], encoding=enc, q_positions=kp[:, :b], backend="eager"
            )
            assert_close(
                step,
                prefix[:, :, -1:],
                **tol(q[:, :, :b], k[:, :, :b], v[:, :, :b], encoding=enc, k_positions=kp[:, :b]),
            )


@pytest.mark.parametrize("name", [n for n in posenc.available() if build(n).has_bias and not build(n).needs_keys])
def test_flex_decode_equals_full_forward(name):
    enc, (q, k, v), pos = _inputs(name, s=150, t=150)
    if enc.has_value_term:
        pytest.skip("only eager runs a value term")
    kp = pos["k_positions"]
    with torch.no_grad():
        full = posenc.attention(q, k, v, encoding=enc, backend="eager", **pos)
        step = posenc.attention(
            q[:, :, 140:], k, v, encoding=enc, backend="flex", q_positions=shard(enc, kp, 140, 150), k_positions=kp
        )
    assert_close(step, full[:, :, 140:], **tol(q, k, v, encoding=enc, **pos))


@given(
    cuts=st.lists(st.integers(1, 19), max_size=4, unique=True),
    causal=st.booleans(),
    name=st.sampled_from(CASES),
    window=st.one_of(st.none(), st.integers(1, 20)),
)
def test_query_chunks_equal_full(cuts, causal, name, window):
    """Context parallelism: shards of queries, each against all keys with its own positions and the global length
    (``seq_len``, read by length-dependent scalings only), equal the whole; with a sliding window too (causal
    calls with sequence positions: chunked prefill)."""
    enc, (q, k, v), pos = _inputs(name, s=20, t=20)
    causal = causal or enc.causal_only  # CoPE counts over the causal past only
    window = window if causal and enc.position_kind == "sequence" else None
    kp = pos["k_positions"]
    length = int(kp.max()) + 1
    bounds = [0, *sorted(cuts), 20]
    with torch.no_grad():
        full = posenc.attention(q, k, v, encoding=enc, causal=causal, backend="eager", window=window, **pos)
        parts = [
            posenc.attention(
                q[:, :, a:b],
                k[:, :, : (b if causal else 20)],
                v[:, :, : (b if causal else 20)],
                encoding=enc,
                causal=causal,
                backend="eager",
                q_positions=shard(enc, kp, a, b),
                k_positions=shard(enc, kp, 0, b if causal else 20),
                seq_len=length,
                window=window,
            )
            for a, b in zip(bounds, bounds[1:], strict=False)
        ]
    assert_close(torch.cat(parts, dim=2), full, **tol(q, k, v, encoding=enc, **pos))


@pytest.mark.parametrize("name", CASES)
@pytest.mark.parametrize("causal", [True, False])
def test_packed_documents_equal_separate_sequences(name, causal):
    """Two documents packed into one row with per-document positions == each document on its own."""
    enc = build(name)
    _skip_if_causal_only(enc, causal)
    hkv = H if enc.per_head_keys else HKV
    lengths = (12, 6)  # one document past the scaled ropes' original length (8), one within it
    q, k, v = qkv(sum(lengths), sum(lengths), hkv=hkv, b=1, dv=D if enc.has_value_term else DV)
    pos = torch.cat([positions(enc, n) for n in lengths], dim=0 if enc.position_kind != "mrope" else -1)
    docs = torch.repeat_interleave(torch.arange(2), torch.tensor(lengths))
    backend = "eager" if enc.has_value_term else "sdpa"
    with torch.no_grad():
        packed = posenc.attention(
            q, k, v, encoding=enc, q_positions=pos, causal=causal, document_ids=docs, backend=backend
        )
        a = lengths[0]
        first = posenc.attention(
            q[:, :, :a],
            k[:, :, :a],
            v[:, :, :a],
            encoding=enc,
            causal=causal,
            q_positions=positions(enc, a),
            backend=backend,
        )
        second = posenc.attention(
            q[:, :, a:],
            k[:, :, a:],
            v[:, :, a:],
            encoding=enc,
            causal=causal,
            q_positions=positions(enc, lengths[1]),
            backend=backend,
        )
    assert_close(
        packed, torch.cat([first, second], dim=2), **tol(q, k, v, encoding=enc, q_positions=pos, k_positions=pos)
    )


@pytest.mark.parametrize("name", CASES)
@pytest.mark.parametrize("backend", ["eager", "sdpa"])
def test_gqa_equals_repeated_heads(name, backend):
    enc, (q, k, v), pos = _inputs(name)
    if k.shape[1] == H:
        pytest.skip("this encoding needs one key head per query head")
    backend = "eager" if enc.has_value_term else backend
    with torch.no_grad():
        grouped = posenc.attention(q, k, v, encoding=enc, backend=backend, **pos)
        r = H // k.shape[1]
        full = posenc.attention(
            q, k.repeat_interleave(r, 1), v.repeat_interleave(r, 1), encoding=enc, backend=backend, **pos
        )
    assert_close(grouped, full, **tol(q, k, v, encoding=enc, **pos))


def test_default_positions_are_the_last_keys():
    enc = posenc.build("rope", head_dim=D)
    q, k, v = qkv(3, 11)
    with torch.no_grad():
        implicit = posenc.attention(q, k, v, encoding=enc)
        explicit = posenc.attention(
            q, k, v, encoding=enc, q_positions=torch.arange(8, 11), k_positions=torch.arange(11)
        )
    assert_close(implicit, explicit, rtol=0, atol=0)


@pytest.mark.flex_compiled
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_flex_and_sdpa_near_float32(dtype):
    enc = posenc.build("alibi", num_heads=H)
    q, k, v = qkv(64, 64)
    with torch.no_grad():
        ref = posenc.attention(q, k, v, encoding=enc, backend="eager")
        for backend in ("sdpa", "flex", "eager"):
            out = posenc.attention(*(x.to(dtype) for x in (q, k, v)), encoding=enc, backend=backend)
            assert out.dtype == dtype
            assert_close(out.float(), ref, atol=3e-2, rtol=3e-2)


# ---------------------------------------------------------------------------------------------------------------
# backend="auto"


def test_auto_backend_choice():
    alibi, rope = posenc.build("alibi", num_heads=H), posenc.build("rope", head_dim=D)
    shaw = posenc.build("shaw", head_dim=D)
    small = qkv(8, 8)
    big_len = int((FLEX_MIN_BIAS_BYTES / (B * H * 4)) ** 0.5) + 1

    def big(grad=False):  # CPU tensors of a large shape with no storage behind them
        return [torch.zeros((), requires_grad=grad).expand(B, h, big_len, D) for h in (H, HKV, HKV)]

    assert _resolve_backend("auto", rope, *small) == "sdpa"
    assert _resolve_backend("auto", alibi, *small) == "sdpa"
    assert _resolve_backend("auto", shaw, *small) == "eager"
    assert _resolve_backend("auto", alibi, *big()) == "flex"
    assert _resolve_backend("auto", alibi, *big(grad=True)) == "sdpa"  # FlexAttention has no CPU backward
    with torch.no_grad():
        assert _resolve_backend("auto", alibi, *big(grad=True)) == "flex"
    assert _resolve_backend("auto", posenc.build("t5", num_heads=H), *big()) == "sdpa"  # its table needs grads
    with torch.no_grad():
        assert _resolve_backend("auto", alibi, *(x.double() for x in big())) == "sdpa"  # no CPU float64


# ---------------------------------------------------------------------------------------------------------------
# Bad input: a ValueError naming the parameter


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (lambda q, k, v: (q, k[:, :1].expand(-1, 3, -1, -1), v[:, :1].expand(-1, 3, -1, -1)), r"k\.shape\[1\]=3"),
        (lambda q, k, v: (q, k.double(), v), r"k\.dtype"),
        (lambda q, k, v: (q, k, v.half()), r"v\.dtype"),
        (lambda q, k, v: (q, k[..., :8], v), r"k\.shape\[-1\]=8"),
        (lambda q, k, v: (q, k, v[:, :, :5]), r"v\.shape"),
        (lambda q, k, v: (q, k[:1], v[:1]), r"k\.shape\[0\]=1"),
        (lambda q, k, v: (q[0], k, v), r"q\.shape"),
        (lambda q, k, v: (q.long(), k, v), r"q\.dtype"),
    ],
)
def test_bad_tensors(change, match):
    q, k, v = change(*qkv(6, 6))
    with pytest.raises(ValueError, match=match):
        posenc.attention(q, k, v)


def test_bad_arguments():
    q, k, v = qkv(6, 6)
    alibi = posenc.build("alibi", num_heads=H)
    with pytest.raises(ValueError, match=r"backend='fast'.*'auto', 'eager', 'sdpa', 'flex'"):
        posenc.attention(q, k, v, backend="fast")
    with pytest.raises(ValueError, match=r"q_positions\.shape=\(5,\)"):
        posenc.attention(q, k, v, encoding=alibi, q_positions=torch.arange(5), k_positions=torch.arange(6))
    with pytest.raises(ValueError, match=r"k_positions\.shape=\(3, 6\)"):
        posenc.attention(q, k, v, encoding=alibi, k_positions=torch.zeros(3, 6), q_positions=torch.arange(6))
    with pytest.raises(ValueError, match=r"k_positions=None.*S=2 != T=6"):
        posenc.attention(q[:, :, :2], k, v, encoding=alibi, q_positions=torch.arange(4, 6))
    with pytest.raises(ValueError, match=r"q\.shape\[2\]=6.*causal=True"):
        posenc.attention(q, k[:, :, :4], v[:, :, :4])
    with pytest.raises(ValueError, match=r"document_ids\.dtype"):
        posenc.attention(q, k, v, document_ids=torch.zeros(6))
    with pytest.raises(ValueError, match=r"document_ids\.shape"):
        posenc.attention(q, k, v, document_ids=torch.zeros(5, dtype=torch.long))
    with pytest.raises(ValueError, match=r"encoding='str'"):
        posenc.attention(q, k, v, encoding="alibi")
    with pytest.raises(ValueError, match=r"backend='sdpa'.*value term"):
        posenc.attention(q, k, v, encoding=posenc.build("shaw", head_dim=D), backend="sdpa")
    with pytest.raises(ValueError, match=r"backend='flex'.*no backward on CPU"):
        posenc.attention(*[x.requires_grad_() for x in (q, k, v)], encoding=alibi, backend="flex")
    with pytest.raises(ValueError, match=r"v\.shape\[-1\]=8.*value term"):
        posenc.attention(q, k, v[..., :8], encoding=posenc.build("shaw", head_dim=D))
    with pytest.raises(ValueError, match=r"backend='flex'.*float64"):
        posenc.attention(*[x.detach().double() for x in (q, k, v)], encoding=alibi, backend="flex")


@pytest.mark.parametrize(("name", "backend"), [("alibi", "sdpa"), ("t5", "sdpa"), ("rope", "sdpa"), ("alibi", "flex")])
def test_compiles_without_graph_breaks(name, backend):
    enc, (q, k, v), pos = _inputs(name, s=32, t=32)

    def step(q, k, v):
        return posenc.attention(q, k, v, encoding=enc, backend=backend, **pos)

    with torch.no_grad():
        compiled = torch.compile(step, fullgraph=True, dynamic=False)
        assert_close(compiled(q, k, v), step(q, k, v), **tol(q, k, v, encoding=enc, **pos))


def test_packed_positions():
    pos, ids = posenc.packed_positions([3, 1, 2])
    assert pos.tolist() == [0, 1, 2, 0, 0, 1] and ids.tolist() == [0, 0, 0, 1, 2, 2]
    for bad in ([], [3, 0], [[2]], [1.5]):
        with pytest.raises(ValueError, match=r"lengths="):
            posenc.packed_positions(bad)


# ---------------------------------------------------------------------------------------------------------------
# Attention sinks (GPT-OSS) and chunked local attention (Llama 4): issue 40, items 2(b) and 4


def _sink_formula(q, k, v, sinks, allowed, scale):
    """``softmax([q k^T * scale, sink])[..., :T] v`` in float64, masked by ``allowed`` (B|1, 1, S, T)."""
    r = q.shape[1] // k.shape[1]
    kf, vf = (x.double().repeat_interleave(r, dim=1) for x in (k, v))
    scores = (q.double() @ kf.transpose(-1, -2)) * scale
    scores = scores.masked_fill(~allowed, float("-inf"))
    sink = sinks.double().view(1, -1, 1, 1).expand(*scores.shape[:-1], 1)
    return torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1] @ vf


def _chunk_allowed(q_pos, k_pos, c, *, docs=None, s=None, t=None):
    """Causal (bottom-right), same document, same chunk of positions: the mask written out, (B|1, 1, S, T)."""
    s, t = q_pos.shape[-1], k_pos.shape[-1]
    i, j = torch.arange(s)[:, None] + t - s, torch.arange(t)[None, :]
    qp, kp = q_pos.reshape(-1, s), k_pos.reshape(-1, t)
    allowed = (j <= i) & (qp[:, :, None] // c == kp[:, None, :] // c)
    if docs is not None:
        allowed = allowed & (docs[:, t - s :, None] == docs[:, None, :])
    return allowed[:, None]


@pytest.mark.flex_compiled
@pytest.mark.parametrize("backend", ["eager", "sdpa", "flex"])
@pytest.mark.parametrize(("s", "t", "chunk", "docs"), [(9, 9, None, False), (3, 11, 4, False), (200, 200, 48, True)])
def test_sinks_and_chunks_are_the_formula(backend, s, t, chunk, docs):
    """Every backend against the written-out formula, GQA, a KV-cache shape, documents and chunks across 128-tiles."""
    q, k, v = qkv(s, t)
    sinks = torch.randn(H) * 2
    k_pos = torch.arange(t) + 5
    document_ids = (torch.arange(t) * 3 // t)[None].expand(B, -1) if docs else None
    with torch.no_grad():
        out = posenc.attention(
            q,
            k,
            v,
            q_positions=k_pos[t - s :],
            k_positions=k_pos,
            document_ids=document_ids,
            sinks=sinks,
            chunk_size=chunk,
            backend=backend,
        )
    allowed = _chunk_allowed(k_pos[t - s :], k_pos, chunk or 10**9, docs=document_ids)
    ref = _sink_formula(q, k, v, sinks, allowed, D**-0.5)
    assert_close(out, ref.float(), atol=2e-6, rtol=2e-6)


@pytest.mark.parametrize("name", ["alibi", "t5", "fire", "rope", "xpos", "shaw"])
def test_sinks_and_chunks_with_encodings_match_eager(name):
    """An encoding's bias/score_mod and rotation combine with sinks and chunks the same way on every backend."""
    enc, (q, k, v), pos = _inputs(name, s=20, t=24, batched=True)
    sinks = torch.randn(H)
    with torch.no_grad():
        ref = posenc.attention(q, k, v, encoding=enc, backend="eager", sinks=sinks, chunk_size=7, **pos)
        plain = posenc.attention(q, k, v, encoding=enc, backend="eager", **pos)
        assert not torch.allclose(ref, plain)
        for backend in _backends(enc):
            out = posenc.attention(q, k, v, encoding=enc, backend=backend, sinks=sinks, chunk_size=7, **pos)
            assert_close(out, ref, **tol(q, k, v, encoding=enc, **pos), msg=lambda m, b=backend: f"{name}/{b}: {m}")


def test_sink_gradients_match_eager():
    """Sinks are trainable: sdpa's gradients (through its float mask column) equal eager's, for q, k, v and sinks."""
    q, k, v = qkv(10, 10, requires_grad=True)
    sinks = torch.randn(H, requires_grad=True)
    grads = {}
    for backend in ("eager", "sdpa"):
        out = posenc.attention(q, k, v, sinks=sinks, chunk_size=4, backend=backend)
        grads[backend] = torch.autograd.grad((out * torch.linspace(-1, 1, DV)).sum(), (q, k, v, sinks))
    for g, g_ref in zip(grads["sdpa"], grads["eager"], strict=True):
        assert_close(g, g_ref, atol=1e-5, rtol=1e-5)
    assert grads["eager"][3].abs().min() > 0


def _gpt_oss(hkv):
    transformers = pytest.importorskip("transformers")
    from transformers.models.gpt_oss import modeling_gpt_oss

    cfg = transformers.GptOssConfig(
        hidden_size=32,
        num_attention_heads=H,
        num_key_value_heads=hkv,
        head_dim=D,
        num_hidden_layers=1,
        layer_types=["full_attention"],
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        vocab_size=10,
        intermediate_size=8,
        num_local_experts=2,
        num_experts_per_tok=1,
    )
    cfg._attn_implementation = "eager"
    torch.manual_seed(1)
    layer = modeling_gpt_oss.GptOssAttention(cfg, 0).double()
    torch.nn.init.normal_(layer.sinks, std=2.0)
    return modeling_gpt_oss, cfg, layer


@pytest.mark.parametrize("hkv", [1, 2, 4])
@pytest.mark.parametrize("backend", ["eager", "sdpa", "flex"])
def test_sinks_match_transformers_gpt_oss(hkv, backend):
    """transformers' GptOssAttention (eager, its sink implementation) against posenc.attention(sinks=layer.sinks):
    the whole layer on full tensors, a prefill of 6 tokens and a decode of 3 through transformers' DynamicCache.
    q and k are rotated by transformers' own RoPE tables (float32, as GPT-OSS builds them) on both sides, so what is
    compared is the attention. float64 on eager and sdpa; float32 on flex (no float64 on CPU)."""
    from transformers import DynamicCache

    mod, cfg, layer = _gpt_oss(hkv)
    x = torch.randn(B, 9, 32, dtype=torch.float64)
    cos, sin = mod.GptOssRotaryEmbedding(cfg)(x, torch.arange(9)[None].expand(B, -1))

    def causal(a, b):  # transformers' additive mask for queries a..b-1 over keys 0..b-1
        return torch.full((b, b), float("-inf"), dtype=torch.float64).triu(1)[a:][None, None]

    with torch.no_grad():
        cache = DynamicCache(config=cfg)
        ref = [layer(x[:, a:b], (cos[:, a:b], sin[:, a:b]), causal(a, b), cache=cache)[0] for a, b in [(0, 6), (6, 9)]]
        q, k, v = (p(x).view(B, 9, -1, D).transpose(1, 2) for p in (layer.q_proj, layer.k_proj, layer.v_proj))
        q, k = mod.apply_rotary_pos_emb(q, k, cos, sin)
        dtype = torch.float32 if backend == "flex" else torch.float64
        q, k, v, sinks = (y.to(dtype) for y in (q, k, v, layer.sinks))
        ours = []
        for a, b in [(0, 6), (6, 9)]:
            o = posenc.attention(q[:, :, a:b], k[:, :, :b], v[:, :, :b], sinks=sinks, backend=backend)
            ours.append(layer.o_proj(o.double().transpose(1, 2).reshape(B, b - a, -1)))
    atol = 1e-5 if backend == "flex" else 1e-12
    for got, want in zip(ours, ref, strict=True):
        assert_close(got, want, atol=atol, rtol=atol)


def test_sink_gradient_matches_transformers_gpt_oss():
    """The sinks' gradient through posenc (eager and sdpa) equals transformers' through GptOssAttention."""
    mod, cfg, layer = _gpt_oss(2)
    x = torch.randn(B, 7, 32, dtype=torch.float64)
    cos, sin = mod.GptOssRotaryEmbedding(cfg)(x, torch.arange(7)[None].expand(B, -1))
    mask = torch.full((7, 7), float("-inf"), dtype=torch.float64).triu(1)[None, None]
    weights = torch.randn(B, 7, 32, dtype=torch.float64)
    (want,) = torch.autograd.grad((layer(x, (cos, sin), mask)[0] * weights).sum(), layer.sinks)
    q, k, v = (p(x).view(B, 7, -1, D).transpose(1, 2) for p in (layer.q_proj, layer.k_proj, layer.v_proj))
    q, k = mod.apply_rotary_pos_emb(q, k, cos, sin)
    for backend in ("eager", "sdpa"):
        o = posenc.attention(q, k, v, sinks=layer.sinks, backend=backend)
        out = layer.o_proj(o.transpose(1, 2).reshape(B, 7, -1))
        (got,) = torch.autograd.grad((out * weights).sum(), layer.sinks, retain_graph=True)
        assert_close(got, want, atol=1e-12, rtol=1e-10)


def _llama4(chunk):
    transformers = pytest.importorskip("transformers")
    from transformers.models.llama4 import modeling_llama4

    cfg = transformers.Llama4TextConfig(
        hidden_size=32,
        num_attention_heads=H,
        num_key_value_heads=HKV,
        head_dim=D,
        num_hidden_layers=1,
        attention_chunk_size=chunk,
        vocab_size=10,
        intermediate_size=8,
        intermediate_size_mlp=8,
        num_local_experts=2,
    )
    cfg._attn_implementation = "eager"
    assert cfg.layer_types == ["chunked_attention"] and cfg.no_rope_layers == [1]  # a RoPE layer: chunked
    return modeling_llama4, cfg, modeling_llama4.Llama4TextAttention(cfg, 0).double()


@pytest.mark.parametrize("backend", ["eager", "sdpa", "flex"])
@pytest.mark.parametrize("case", ["full", "kv_cache", "packed"])
def test_chunks_match_transformers_llama4(backend, case):
    """Llama 4's chunked RoPE-layer mask, as transformers builds it (``create_chunked_causal_mask`` for the full
    and the packed row -- packing detected from position_ids that restart --; its ``eager_mask`` with
    ``chunked_causal_mask_function`` at a cache's query offset for 3 queries after 17 cached keys), fed to Llama 4's
    ``eager_attention_forward``, against ``posenc.attention(chunk_size=)`` on the same q, k, v."""
    from transformers import masking_utils

    chunk, t = 6, 20
    mod, cfg, layer = _llama4(chunk)
    s = 3 if case == "kv_cache" else t
    q, k, v = (x.double() for x in qkv(s, t, dv=D))
    x = torch.zeros(B, s, 32, dtype=torch.float64)
    document_ids = None
    if case == "full":
        k_pos = torch.arange(t)
        mask = masking_utils.create_chunked_causal_mask(cfg, x, None, None, position_ids=k_pos[None])
    elif case == "packed":
        k_pos, document_ids = posenc.packed_positions([9, 11])
        mask = masking_utils.create_chunked_causal_mask(cfg, x, None, None, position_ids=k_pos[None])
    else:
        k_pos = torch.arange(t)
        function = masking_utils.chunked_causal_mask_function(chunk, torch.zeros(B, dtype=torch.long))
        mask = masking_utils.eager_mask(
            batch_size=B, q_length=s, kv_length=t, q_offset=t - s, mask_function=function, dtype=torch.float64
        )
    want = (mask == 0)[:1]
    docs = None if document_ids is None else document_ids[None]
    assert_close(want, _chunk_allowed(k_pos[t - s :], k_pos, chunk, docs=docs))
    ref = mod.eager_attention_forward(layer, q, k, v, mask, scaling=layer.scaling)[0].transpose(1, 2)
    dtype = torch.float32 if backend == "flex" else torch.float64
    with torch.no_grad():
        out = posenc.attention(
            *(y.to(dtype) for y in (q, k, v)),
            q_positions=k_pos[t - s :],
            k_positions=k_pos,
            document_ids=document_ids,
            chunk_size=chunk,
            backend=backend,
        )
    atol = 1e-5 if backend == "flex" else 1e-12
    assert_close(out.double(), ref, atol=atol, rtol=atol)


@pytest.mark.parametrize("backend", ["sdpa", "flex"])
def test_chunked_decode_and_packing_equal_alone(backend):
    """Decoding one token at a time against a cache equals the full forward's rows; a packed row with per-document
    positions equals each document alone (its chunks restart with its positions), with sinks too."""
    t, chunk = 150, 32
    q, k, v = qkv(t, t)
    sinks = torch.randn(H)
    with torch.no_grad():
        full = posenc.attention(q, k, v, chunk_size=chunk, sinks=sinks, backend=backend)
        for a in (0, 31, 32, 100, 149):
            step = posenc.attention(
                q[:, :, a : a + 1], k[:, :, : a + 1], v[:, :, : a + 1], chunk_size=chunk, sinks=sinks, backend=backend
            )
            assert_close(step, full[:, :, a : a + 1], atol=2e-6, rtol=2e-6)
        pos, ids = posenc.packed_positions([70, 80])
        packed = posenc.attention(
            q, k, v, q_positions=pos, document_ids=ids, chunk_size=chunk, sinks=sinks, backend=backend
        )
        for a, b in [(0, 70), (70, 150)]:
            alone = posenc.attention(
                q[:, :, a:b], k[:, :, a:b], v[:, :, a:b], chunk_size=chunk, sinks=sinks, backend=backend
            )
            assert_close(packed[:, :, a:b], alone, atol=2e-6, rtol=2e-6)


@pytest.mark.flex_compiled
def test_flex_chunks_and_sinks_build_nothing_quadratic(monkeypatch):
    """Everything posenc prepares for FlexAttention with chunks and sinks (chunk ids, block mask, the sink's extra
    key) stays linear in length; the kernel itself (stubbed here: a dispatch mode cannot enter it) is FlexAttention's
    block-sparse one, whose block mask must skip the tiles outside every chunk."""
    n, chunk = 4096, 256
    largest, block_mask = flex_prepared(monkeypatch, n, chunk_size=chunk)
    assert largest < n * n // 16
    assert block_mask.shape[-2:] == (n, n + 1)
    tiles = int(block_mask.kv_num_blocks.sum() + block_mask.full_kv_num_blocks.sum())
    m = chunk // FLEX_BLOCK  # tiles per chunk: each chunk's causal triangle of tiles, and the sink's column
    assert tiles == (n // chunk) * m * (m + 1) // 2 + n // FLEX_BLOCK


@pytest.mark.parametrize("backend", ["sdpa", "flex"])
def test_sinks_and_chunks_compile_without_graph_breaks(backend):
    q, k, v = qkv(32, 32)
    sinks = torch.randn(H)

    def step(q, k, v):
        return posenc.attention(q, k, v, sinks=sinks, chunk_size=8, backend=backend)

    with torch.no_grad():
        compiled = torch.compile(step, fullgraph=True, dynamic=False)
        assert_close(compiled(q, k, v), step(q, k, v), atol=2e-6, rtol=2e-6)


def test_sinks_and_chunks_auto_backend_and_bad_arguments():
    rope = posenc.build("rope", head_dim=D)
    small = qkv(8, 8)
    big_len = int((FLEX_MIN_BIAS_BYTES / (B * H * 4)) ** 0.5) + 1
    big = [torch.zeros(()).expand(B, h, big_len, D) for h in (H, HKV, HKV)]
    assert _resolve_backend("auto", rope, *small, sinks=torch.zeros(H)) == "sdpa"
    assert _resolve_backend("auto", rope, *big) == "sdpa"
    assert _resolve_backend("auto", rope, *big, sinks=torch.zeros(H)) == "flex"
    assert _resolve_backend("auto", rope, *big, chunked=True) == "flex"
    assert _resolve_backend("auto", rope, *big, sinks=torch.zeros(H, requires_grad=True)) == "sdpa"  # CPU backward

    q, k, v = small
    for bad, match in [
        (torch.zeros(H + 1), r"sinks\.shape=\(5,\)"),
        (torch.zeros(H, dtype=torch.long), r"sinks\.dtype"),
        ([0.0] * H, r"sinks='list'"),
    ]:
        with pytest.raises(ValueError, match=match):
            posenc.attention(q, k, v, sinks=bad)
    for bad in (0, -3, 2.0, True):
        with pytest.raises(ValueError, match=r"chunk_size="):
            posenc.attention(q, k, v, chunk_size=bad)
    grid = posenc.build("rope_axial", head_dim=D)
    from posenc.functional.axial_rope import grid_positions

    with pytest.raises(ValueError, match=r"q_positions\.shape=\(8, 2\).*chunk_size"):
        posenc.attention(q, k, v, encoding=grid, q_positions=grid_positions(4, 2), chunk_size=4)
    method = posenc.remapping.remap_method("self_extend", original=8, target=16)
    for kwargs, name in [({"sinks": torch.zeros(H)}, "sinks"), ({"chunk_size": 4}, "chunk_size")]:
        with pytest.raises(ValueError, match=rf"{name}=.*remap="):
            posenc.attention(q, k, v, encoding=rope, remap=method, **kwargs)
