"""``posenc.attention(window=W)``: sliding-window attention (Mistral, Gemma 2/3's local layers, GPT-OSS's even
layers). A causal query at position ``p`` sees the keys at positions ``p - W < k <= p``.

Checked against transformers 5.24: the mask element by element against ``sliding_window_causal_mask_function`` /
``create_sliding_window_causal_mask`` (a prefill, a decode at a cache offset, a packed row whose per-document
positions transformers detects), read off posenc's output on every backend; the layer outputs of ``MistralAttention``
(eager, GQA) and of a GPT-OSS sliding layer (window + sinks) through transformers' sliding-window cache. Then every
backend against eager with encodings, chunks, sinks and documents across FlexAttention's 128-token tiles; flex's
block mask built without an ``S x T`` tensor and skipping the tiles outside every window; decoding and chunked
prefill (with a ring-buffer cache of the last ``W - 1`` keys) equal to the full forward; bad arguments.
(``tests/test_attention_sinks_vllm.py`` compares window + sinks with the float64 vLLM reference.)

Tolerances: ``tolerances.attention_atol`` from the inputs (``encoding_cases.attention_tol`` for the encodings); against
a float64 reference, posenc's float32 run also carries the rounding of its inputs to float32 (``_atol_vs_float64``).
"""

from __future__ import annotations

import sys

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch.testing import assert_close

import posenc
from encoding_cases import attention_tol, build, positions
from largest_tensor import flex_prepared
from posenc.attention import FLEX_BLOCK, FLEX_MIN_BIAS_BYTES, _resolve_backend
from tolerances import attention_atol, dot_magnitude, sum_atol, unit_roundoff

B, H, HKV, D, DV = 2, 4, 2, 16, 8
BACKENDS = ["eager", "sdpa", "flex"]


def qkv(s, t, *, h=H, hkv=HKV, b=B, dv=DV, requires_grad=False):
    q = torch.randn(b, h, s, D)
    k = torch.randn(b, hkv, t, D)
    v = torch.randn(b, hkv, t, dv)
    return [x.requires_grad_(requires_grad) for x in (q, k, v)]


def _window_allowed(q_pos, k_pos, w, *, docs=None):
    """Causal (bottom-right), same document, ``q_pos - W < k_pos``: the mask written out, (B|1, 1, S, T)."""
    s, t = q_pos.shape[-1], k_pos.shape[-1]
    i, j = torch.arange(s)[:, None] + t - s, torch.arange(t)[None, :]
    qp, kp = q_pos.reshape(-1, s), k_pos.reshape(-1, t)
    allowed = (j <= i) & (qp[:, :, None] - kp[:, None, :] < w)
    if docs is not None:
        allowed = allowed & (docs[:, t - s :, None] == docs[:, None, :])
    return allowed[:, None]


def _seen(backend, s, t, **kwargs):
    """posenc's mask as its output shows it: q = 0 scores every key alike, so each visible key gets weight 1/n > 0
    and every other exactly 0; values ``eye(T)`` read the weights back. (1, 1, S, T) boolean."""
    q, k = torch.zeros(1, H, s, D), torch.randn(1, HKV, t, D)
    v = torch.eye(t).expand(1, HKV, t, t)
    with torch.no_grad():
        out = posenc.attention(q, k, v, backend=backend, **kwargs)  # (1, H, S, T)
    assert torch.equal(out, out[:, :1].expand_as(out))  # no head differs
    return out[:, :1] > 0


def _atol_vs_float64(q, k, v, *, sinks=None, softmax_float32=False):
    """posenc in float32 on q, k, v rounded from float64, against an exact (float64) reference: the inputs' rounding
    (each q.k product 2 u relative, each value u) on top of ``attention_atol``; twice that when the reference's
    softmax runs in float32 itself (Mistral's ``eager_attention_forward``), each side then within it of the exact."""
    u = unit_roundoff()
    extra = 2 * u * D**-0.5 * dot_magnitude(q, k)
    logit_max = 0.0 if sinks is None else float(sinks.abs().max())
    atol = attention_atol(q, k, v, bias_max=logit_max, extra_score_error=extra) + u * float(v.abs().max())
    return 2 * atol if softmax_float32 else atol


def _through(linear, atol, v):
    """A bound on ``linear(a) - linear(b)`` from ``atol`` on ``a - b``, ``a`` and ``b`` attention outputs (at most
    ``max |v|``): each output sums ``|w| |a - b|`` over a row of the weight, plus the float64 rounding of both."""
    row = float(linear.weight.detach().abs().sum(-1).max())
    return atol * row + sum_atol(linear.weight.shape[-1], row * (float(v.abs().max()) + atol), torch.float64)


# ---------------------------------------------------------------------------------------------------------------
# The mask is transformers' sliding-window mask


def _mistral_config(w, hkv=HKV):
    transformers = pytest.importorskip("transformers")
    cfg = transformers.MistralConfig(
        hidden_size=32,
        num_attention_heads=H,
        num_key_value_heads=hkv,
        head_dim=D,
        num_hidden_layers=1,
        sliding_window=w,
        vocab_size=10,
        intermediate_size=8,
    )
    cfg._attn_implementation = "eager"
    return cfg


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", ["prefill", "kv_cache", "packed"])
@pytest.mark.parametrize("w", [1, 4])
def test_mask_is_transformers_sliding_window(backend, case, w):
    """transformers' sliding-window mask (``create_sliding_window_causal_mask`` for a 20-token prefill and for a
    packed row of documents of 9 and 11 tokens, detected from position_ids that restart; ``sdpa_mask`` with
    ``sliding_window_causal_mask_function`` at a cache's query offset for 3 queries after 17 cached keys) equals
    the written-out formula and posenc's mask on every backend, element by element."""
    from transformers import masking_utils

    cfg = _mistral_config(w)
    t = 20
    s = 3 if case == "kv_cache" else t
    x = torch.zeros(1, s, 32)
    k_pos, document_ids = torch.arange(t), None
    if case == "kv_cache":
        function = masking_utils.sliding_window_causal_mask_function(w)
        mask = masking_utils.sdpa_mask(
            batch_size=1, q_length=s, kv_length=t, q_offset=t - s, mask_function=function, allow_is_causal_skip=False
        )
    else:
        if case == "packed":
            k_pos, document_ids = posenc.packed_positions([9, 11])
        mask = masking_utils.create_sliding_window_causal_mask(cfg, x, None, None, position_ids=k_pos[None])
        mask = mask == 0  # eager: an additive float mask
    docs = None if document_ids is None else document_ids[None]
    assert_close(mask, _window_allowed(k_pos[t - s :], k_pos, w, docs=docs))
    seen = _seen(backend, s, t, q_positions=k_pos[t - s :], k_positions=k_pos, document_ids=document_ids, window=w)
    assert_close(seen, mask)


# ---------------------------------------------------------------------------------------------------------------
# The attention is transformers' Mistral / GPT-OSS attention with sliding_window


def _steps(cfg, layer, rotary, x, steps):
    """transformers' own decoding: each step's mask from ``create_sliding_window_causal_mask`` and the cache (a
    ``DynamicSlidingWindowLayer``, keeping the last ``W - 1`` keys), then the layer. Returns the layer outputs and
    the rotated q, k and v of every token."""
    from transformers import DynamicCache, masking_utils

    pos = torch.arange(x.shape[1])
    cos, sin = rotary(x, pos[None].expand(x.shape[0], -1))
    cache = DynamicCache(config=cfg)
    assert type(cache.layers[0]).__name__ == "DynamicSlidingWindowLayer"
    outs = []
    with torch.no_grad():
        for a, b in steps:
            mask = masking_utils.create_sliding_window_causal_mask(
                cfg, x[:, a:b], None, cache, position_ids=pos[None, a:b]
            )
            outs.append(layer(x[:, a:b], (cos[:, a:b], sin[:, a:b]), mask, cache=cache)[0])
        q, k, v = (p(x).view(*x.shape[:2], -1, D).transpose(1, 2) for p in (layer.q_proj, layer.k_proj, layer.v_proj))
        q, k = sys.modules[type(layer).__module__].apply_rotary_pos_emb(q, k, cos, sin)
    return outs, (q, k, v), pos


STEPS = [(0, 7), (7, 10), (10, 11), (11, 12)]  # a prefill, a chunk of 3 and two one-token decodes


@pytest.mark.parametrize(("hkv", "backend"), [(g, b) for g in (1, 2, 4) for b in ("eager", "sdpa")] + [(2, "flex")])
def test_matches_transformers_mistral(hkv, backend):
    """transformers' ``MistralAttention`` (eager) with ``sliding_window=5`` through its sliding-window cache, against
    ``posenc.attention(window=5)`` given every key with its position; q and k rotated by Mistral's own tables on both
    sides, so what is compared is the attention (and its window)."""
    from transformers.models.mistral import modeling_mistral

    w = 5
    cfg = _mistral_config(w, hkv)
    torch.manual_seed(1)
    layer = modeling_mistral.MistralAttention(cfg, 0).double()
    x = torch.randn(B, 12, 32, dtype=torch.float64)
    refs, (q, k, v), pos = _steps(cfg, layer, modeling_mistral.MistralRotaryEmbedding(cfg), x, STEPS)
    atols = _check_steps(layer, q, k, v, pos, refs, backend, window=w, softmax_float32=True)
    q32, k32, v32 = (y.float() for y in (q, k, v))
    with torch.no_grad():
        for (a, b), ref, atol in zip(STEPS, refs, atols, strict=True):
            unwindowed = posenc.attention(q32[:, :, a:b], k32[:, :, :b], v32[:, :, :b], backend=backend)
            if b > w:  # some query has keys outside its window
                gap = (layer.o_proj(unwindowed.double().transpose(1, 2).reshape(B, b - a, -1)) - ref).abs().max()
                assert gap > 100 * atol


def _check_steps(layer, q, k, v, pos, refs, backend, *, window, sinks=None, softmax_float32=False):  # noqa: ANN001
    """``posenc.attention(window=, sinks=)`` in float32 on each of ``STEPS``' queries (keys up to the step's end, at
    their positions) equals the transformers ``layer``'s float64 outputs ``refs`` through its ``o_proj``, within the
    float32 bound; returns each step's bound."""
    q32, k32, v32 = (y.float() for y in (q, k, v))
    atols = []
    with torch.no_grad():
        for (a, b), ref in zip(STEPS, refs, strict=True):
            o = posenc.attention(q32[:, :, a:b], k32[:, :, :b], v32[:, :, :b], q_positions=pos[a:b],
                                 k_positions=pos[:b], window=window, sinks=sinks, backend=backend)
            got = layer.o_proj(o.double().transpose(1, 2).reshape(B, b - a, -1))
            qa, kb, vb = q[:, :, a:b], k[:, :, :b], v[:, :, :b]
            bound = _atol_vs_float64(qa, kb, vb, sinks=sinks, softmax_float32=softmax_float32)
            atol = _through(layer.o_proj, bound, vb)
            assert_close(got, ref, atol=atol, rtol=0.0, msg=lambda m, a=a, b=b: f"queries {a}..{b - 1}: {m}")
            atols.append(atol)
    return atols


@pytest.mark.parametrize("backend", BACKENDS)
def test_window_and_sinks_match_transformers_gpt_oss(backend):
    """A GPT-OSS sliding layer (``layer_types=["sliding_attention"]``, window 5, learned sinks, GQA) through its
    sliding-window cache, against ``posenc.attention(window=5, sinks=layer.sinks)``; GPT-OSS's eager attention runs
    in float64 throughout."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.gpt_oss import modeling_gpt_oss

    w = 5
    cfg = transformers.GptOssConfig(
        hidden_size=32,
        num_attention_heads=H,
        num_key_value_heads=HKV,
        head_dim=D,
        num_hidden_layers=1,
        layer_types=["sliding_attention"],
        sliding_window=w,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        vocab_size=10,
        intermediate_size=8,
        num_local_experts=2,
        num_experts_per_tok=1,
    )
    cfg._attn_implementation = "eager"
    torch.manual_seed(1)
    layer = modeling_gpt_oss.GptOssAttention(cfg, 0).double()
    assert layer.sliding_window == w
    torch.nn.init.normal_(layer.sinks, std=2.0)
    x = torch.randn(B, 12, 32, dtype=torch.float64)
    refs, (q, k, v), pos = _steps(cfg, layer, modeling_gpt_oss.GptOssRotaryEmbedding(cfg), x, STEPS)
    _check_steps(layer, q, k, v, pos, refs, backend, window=w, sinks=layer.sinks.detach().float())


# ---------------------------------------------------------------------------------------------------------------
# Every backend equals eager; flex builds nothing quadratic


#: (encoding, S, T, window, chunk_size, documents, sinks): windows across 128-token tiles, a cache offset, windows
#: wider than a tile, with chunks (both masks at once) and documents (positions restarting per document).
CASES = [
    ("alibi", 200, 200, 48, None, True, False),
    ("rope", 3, 260, 130, None, False, True),
    ("t5", 200, 200, 40, 64, True, True),
    ("nope", 150, 150, 1, None, False, True),
]


@pytest.mark.flex_compiled
@pytest.mark.parametrize("backend", ["sdpa", "flex"])
@pytest.mark.parametrize(("name", "s", "t", "w", "chunk", "docs", "with_sinks"), CASES)
def test_backends_equal_eager(backend, name, s, t, w, chunk, docs, with_sinks):
    enc = build(name)
    q, k, v = qkv(s, t)
    sinks = torch.randn(H) * 2 if with_sinks else None
    kw = {"encoding": enc, "window": w, "chunk_size": chunk, "sinks": sinks}
    if docs:
        k_pos, kw["document_ids"] = posenc.packed_positions([t // 3, t - t // 3])
    else:
        k_pos = torch.arange(t) + 5
    kw |= {"q_positions": k_pos[t - s :], "k_positions": k_pos}
    with torch.no_grad():
        ref = posenc.attention(q, k, v, backend="eager", **kw)
        out = posenc.attention(q, k, v, backend=backend, **kw)
        plain = posenc.attention(q, k, v, backend="eager", **{**kw, "window": None})
    tol = attention_tol(q, k, v, encoding=enc, q_positions=k_pos[t - s :], k_positions=k_pos, sinks=sinks)
    assert_close(out, ref, **tol)
    assert (plain - ref).abs().max() > 100 * tol["atol"]  # the window matters here


def test_sdpa_gradients_equal_eager():
    """Window + sinks + chunks train: sdpa's gradients (through its boolean-masked float mask) equal eager's."""
    q, k, v = qkv(24, 24, requires_grad=True)
    sinks = torch.randn(H, requires_grad=True)
    grads = {}
    for backend in ("eager", "sdpa"):
        out = posenc.attention(q, k, v, sinks=sinks, window=5, chunk_size=16, backend=backend)
        grads[backend] = torch.autograd.grad((out * torch.linspace(-1, 1, DV)).sum(), (q, k, v, sinks))
    for g, g_ref in zip(grads["sdpa"], grads["eager"], strict=True):
        assert_close(g, g_ref, atol=1e-5, rtol=1e-5)


@pytest.mark.flex_compiled
def test_flex_window_and_sinks_build_nothing_quadratic(monkeypatch):
    """Everything posenc prepares for FlexAttention with a window and sinks (positions, block mask, the sink's extra
    key) stays linear in length; the kernel itself (stubbed: a dispatch mode cannot enter it) is FlexAttention's
    block-sparse one, whose block mask must skip the tiles outside every window. With W = m 128-token tiles, query
    tile i reaches key tiles i - m .. i (partial at both ends), and i - m + 1 .. i - 1 entirely."""
    n, w = 4096, 256
    largest, block_mask = flex_prepared(monkeypatch, n, window=w)
    assert largest < n * n // 16
    assert block_mask.shape[-2:] == (n, n + 1)
    n_q, m = n // FLEX_BLOCK, w // FLEX_BLOCK
    full = int(block_mask.full_kv_num_blocks.sum())
    partial = int(block_mask.kv_num_blocks.sum())
    assert full == n_q * (m - 1) - (m - 1) * m // 2
    assert full + partial == n_q * (m + 1) - m * (m + 1) // 2 + n_q  # and the sink's column


@pytest.mark.parametrize("backend", ["sdpa", "flex"])
def test_window_compiles_without_graph_breaks(backend):
    q, k, v = qkv(32, 32)
    sinks = torch.randn(H)

    def step(q, k, v):
        return posenc.attention(q, k, v, sinks=sinks, window=6, chunk_size=16, backend=backend)

    with torch.no_grad():
        compiled = torch.compile(step, fullgraph=True, dynamic=False)
        assert_close(compiled(q, k, v), step(q, k, v), **attention_tol(q, k, v, sinks=sinks))


# ---------------------------------------------------------------------------------------------------------------
# Decoding and chunked prefill equal the full forward


@given(
    w=st.integers(1, 24),
    cuts=st.lists(st.integers(1, 16), max_size=3, unique=True),
    name=st.sampled_from(["nope", "rope", "alibi", "t5", "rope+yarn"]),
    with_sinks=st.booleans(),
    ring=st.booleans(),
    backend=st.sampled_from(["eager", "sdpa"]),
)
def test_decode_and_chunked_prefill_equal_full(w, cuts, name, with_sinks, ring, backend):
    """A prefill in chunks, then one-token decodes (queries 17, 18, 19), each against the cache with its positions:
    all keys so far, or (``ring``) only the last ``W - 1`` keys before the chunk, a ring buffer as transformers' and
    vLLM's sliding layers keep it; the rows equal the full forward's."""
    enc = build(name)
    t = 20
    q, k, v = qkv(t, t)
    k_pos = positions(enc, t, start=3, batch=B)
    sinks = torch.randn(H) * 2 if with_sinks else None
    bounds = [0, *sorted(cuts), 17, 18, 19, 20]
    with torch.no_grad():
        full = posenc.attention(q, k, v, encoding=enc, k_positions=k_pos, window=w, sinks=sinks, backend=backend)
        parts = []
        for a, b in zip(bounds, bounds[1:], strict=False):
            lo = max(0, a - w + 1) if ring else 0
            parts.append(
                posenc.attention(
                    q[:, :, a:b],
                    k[:, :, lo:b],
                    v[:, :, lo:b],
                    encoding=enc,
                    q_positions=k_pos[:, a:b],
                    k_positions=k_pos[:, lo:b],
                    window=w,
                    sinks=sinks,
                    backend=backend,
                )
            )
    assert_close(torch.cat(parts, dim=2), full, **attention_tol(q, k, v, encoding=enc, k_positions=k_pos, sinks=sinks))


# ---------------------------------------------------------------------------------------------------------------
# auto, and bad arguments


def test_auto_backend_treats_a_window_as_a_bias():
    rope = posenc.build("rope", head_dim=D)
    big_len = int((FLEX_MIN_BIAS_BYTES / (B * H * 4)) ** 0.5) + 1
    big = [torch.zeros(()).expand(B, h, big_len, D) for h in (H, HKV, HKV)]
    assert _resolve_backend("auto", rope, *qkv(8, 8), windowed=True) == "sdpa"
    assert _resolve_backend("auto", rope, *big) == "sdpa"
    assert _resolve_backend("auto", rope, *big, windowed=True) == "flex"


def test_bad_windows_are_refused():
    q, k, v = qkv(8, 8)
    for bad in (0, -1, 1.5, True, "4"):
        with pytest.raises(ValueError, match=r"window=.*positive integer"):
            posenc.attention(q, k, v, window=bad)
    with pytest.raises(ValueError, match=r"window=4 .*causal=False"):
        posenc.attention(q, k, v, window=4, causal=False)
    grid = posenc.build("rope_axial", head_dim=D)
    from posenc.functional.axial_rope import grid_positions

    with pytest.raises(ValueError, match=r"q_positions\.shape=\(8, 2\).*window="):
        posenc.attention(q, k, v, encoding=grid, q_positions=grid_positions(4, 2), window=4)
    method = posenc.remapping.remap_method("self_extend", original=8, target=16)
    with pytest.raises(ValueError, match=r"window=.*remap="):
        posenc.attention(q, k, v, encoding=posenc.build("rope", head_dim=D), remap=method, window=4)


def test_windows_and_chunks_past_int64_are_refused():
    """Positions are compared as int64: a window or chunk size past 2**63 - 1 was accepted and died in the mask with
    an OverflowError (issue 46); the largest one is global attention."""
    q, k, v = qkv(8, 8)
    with torch.no_grad():
        widest = posenc.attention(q, k, v, window=2**63 - 1, chunk_size=2**63 - 1, backend="eager")
        assert_close(widest, posenc.attention(q, k, v, backend="eager"), rtol=0, atol=0)
    for name in ("window", "chunk_size"):
        for bad in (2**63, 10**20):
            with pytest.raises(ValueError, match=rf"^{name}={bad} is invalid: expected a positive integer up to "
                                                 r"2\*\*63 - 1 \(positions are compared as int64\)$"):
                posenc.attention(q, k, v, **{name: bad})
