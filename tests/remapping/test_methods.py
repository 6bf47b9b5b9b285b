"""Each remapping method against its reference written out (``tests/reference/remapping.py``), several shapes;
the properties every method promises (inside its window it is plain RoPE attention; the no-op settings equal plain
RoPE; the branches' regions are disjoint; decode == full); the paper rules for the parameters, and bad input."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.testing import assert_close

import posenc
from posenc.remapping import (
    CHUNKLLAMA_MSCALE,
    METHODS,
    VLLM_MSCALE,
    DualChunk,
    LMInfinite,
    ReRoPE,
    SelfExtend,
    remap_attention,
    remap_method,
)
from reference import remapping as ref
from tolerances import rotated_softmax_atol


def qkv(b, h, hkv, s, d, *, dtype=torch.float64, seed=0, dv=0):
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randn(b, h, s, d, generator=g, dtype=dtype),
        torch.randn(b, hkv, s, d, generator=g, dtype=dtype),
        torch.randn(b, hkv, s, d + dv, generator=g, dtype=dtype),
    )


def rope(d, layout="half"):
    return posenc.build("rope", head_dim=d, base=100.0, layout=layout)


def reference(method, q, k, v, enc, layout="half", *, inv_freq=None, attention_factor=1.0):
    """The written-out reference of ``method`` (a posenc method object: only its numbers are read), with ``enc``'s
    frequencies or ``inv_freq`` and an attention factor on the rotated q and k."""
    rot = dict(inv_freq=enc.inv_freq if inv_freq is None else inv_freq, layout=layout)
    if attention_factor != 1.0:
        rot["attention_factor"] = attention_factor
    if isinstance(method, SelfExtend):
        return ref.self_extend(q, k, v, window=method.window, group=method.group, **rot)
    if isinstance(method, DualChunk) and method.mscale == VLLM_MSCALE:
        return ref.dual_chunk_vllm(
            q,
            k,
            v,
            chunk_size=method.chunk_size,
            local_size=method.local_window,
            original_max_position_embeddings=method.original_max_position_embeddings,
            **rot,
        )
    if isinstance(method, DualChunk):
        assert method.mscale in (0, CHUNKLLAMA_MSCALE)
        original = method.original_max_position_embeddings if method.mscale else None
        return ref.dual_chunk(
            q, k, v, chunk_size=method.chunk_size, local_window=method.local_window, pretraining_length=original, **rot
        )
    if isinstance(method, ReRoPE):
        return ref.rerope(
            q, k, v, window=method.window, training_length=method.log_scale_length, leak=method.leak, **rot
        )
    return ref.lm_infinite(q, k, v, local_branch=method.window, global_branch=method.global_tokens, **rot)


def logit_factor(method, s):
    if isinstance(method, ReRoPE) and method.log_scale_length:
        return max(1.0, math.log(s) / math.log(method.log_scale_length))
    if isinstance(method, DualChunk) and method.mscale:
        return float(method.logit_factor(torch.tensor(float(s))))
    return 1.0


CASES = [
    SelfExtend(window=6, group=3),
    DualChunk(chunk_size=9, local_window=3, original_max_position_embeddings=12),  # ChunkLlama: m(S)^2 past 12
    DualChunk(chunk_size=9, local_window=2, original_max_position_embeddings=10, mscale=VLLM_MSCALE),  # vLLM
    DualChunk(chunk_size=7, local_window=1, mscale=0),  # no factor
    ReRoPE(window=5, log_scale_length=12),
    ReRoPE(window=4, leak=3.0, log_scale_length=16),
    ReRoPE(window=7),
    LMInfinite(window=8, global_tokens=3),
    LMInfinite(window=5, global_tokens=1),
]
SHAPES = [  # b, h, hkv, s, d, dv, block, layout
    (1, 2, 2, 31, 8, 0, 256, "half"),
    (2, 4, 2, 40, 16, 2, 6, "interleaved"),
    (1, 3, 1, 27, 12, 0, 5, "half"),
]


@pytest.mark.parametrize("method", CASES, ids=repr)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("backend", ["eager", "auto"])
def test_matches_the_written_out_reference(method, shape, backend):
    b, h, hkv, s, d, dv, block, layout = shape
    q, k, v = qkv(b, h, hkv, s, d, dv=dv)
    enc = rope(d, layout)
    out = remap_attention(q, k, v, method=method, encoding=enc, block=block, backend=backend)
    tol = rotated_softmax_atol(q, k, v, torch.float64, max_position=s, logit_factor=logit_factor(method, s))
    assert_close(out, reference(method, q, k, v, enc, layout), atol=tol, rtol=0)


@pytest.mark.parametrize("method", CASES, ids=repr)
def test_float32_within_its_bound_of_the_reference(method):
    q, k, v = qkv(2, 4, 2, 36, 16, dtype=torch.float32, seed=3)
    enc = rope(16)
    out = remap_attention(q, k, v, method=method, encoding=enc, block=8)
    tol = rotated_softmax_atol(q, k, v, torch.float32, max_position=36, logit_factor=logit_factor(method, 36))
    assert_close(out.double(), reference(method, q, k, v, enc), atol=tol, rtol=0)


def _window(method):
    if isinstance(method, DualChunk):
        return method.chunk_len  # the first chunk is plain attention
    return method.window


@pytest.mark.parametrize("method", CASES, ids=repr)
def test_inside_the_window_every_method_is_plain_rope_attention(method):
    """Sequences no longer than the window (first chunk for DCA): exactly plain RoPE attention (ReRoPE's log
    scaling is 1 up to L when L >= the length)."""
    s = _window(method)
    if isinstance(method, ReRoPE) and method.log_scale_length and method.log_scale_length < s:
        pytest.skip("log scaling active inside the window")
    q, k, v = qkv(2, 4, 2, s, 8, seed=5)
    enc = rope(8)
    plain = posenc.attention(q, k, v, encoding=enc)
    out = remap_attention(q, k, v, method=method, encoding=enc, block=4)
    assert_close(out, plain, atol=rotated_softmax_atol(q, k, v, torch.float64, max_position=s), rtol=0)


@pytest.mark.parametrize(
    "method",
    [
        SelfExtend(window=3, group=1),
        DualChunk(chunk_size=60, local_window=10, original_max_position_embeddings=60),  # S <= L: factor 1
        ReRoPE(window=50),
        LMInfinite(window=50, global_tokens=4),
    ],
    ids=repr,
)
def test_no_op_settings_equal_plain_rope(method):
    """Self-Extend with G = 1, DCA with a chunk >= S, ReRoPE / LM-Infinite with a window >= S."""
    q, k, v = qkv(1, 4, 2, 45, 16, seed=6)
    enc = rope(16)
    plain = ref.plain(q, k, v, enc.inv_freq)
    out = remap_attention(q, k, v, method=method, encoding=enc, block=16)
    assert_close(out, plain, atol=rotated_softmax_atol(q, k, v, torch.float64, max_position=45), rtol=0)


@pytest.mark.parametrize("method", CASES, ids=repr)
def test_decode_one_token_at_a_time_equals_the_full_forward(method):
    """Each step (one query, the keys so far) equals the last row of the full forward over its prefix; for a method
    without a length factor that is also the full forward's row."""
    q, k, v = qkv(1, 4, 2, 30, 8, seed=7)
    enc = rope(8)
    full = remap_attention(q, k, v, method=method, encoding=enc)
    tol = rotated_softmax_atol(q, k, v, torch.float64, max_position=30, logit_factor=logit_factor(method, 30))
    for t in range(20, 31):
        prefix = remap_attention(q[:, :, :t], k[:, :, :t], v[:, :, :t], method=method, encoding=enc)[:, :, -1:]
        if not (isinstance(method, DualChunk) and method.mscale):
            assert_close(prefix, full[:, :, t - 1 : t], atol=tol, rtol=0)
        step = remap_attention(
            q[:, :, t - 1 : t],
            k[:, :, :t],
            v[:, :, :t],
            method=method,
            encoding=enc,
            q_positions=torch.tensor([t - 1]),
            k_positions=torch.arange(t),
        )
        assert_close(step, prefix, atol=tol, rtol=0)


@settings(max_examples=60, deadline=None)
@given(
    name=st.sampled_from(sorted(METHODS)),
    original=st.integers(16, 64),
    factor=st.floats(1.0, 6.0),
    s=st.integers(1, 120),
)
def test_regions_are_disjoint_and_cover_the_causal_past(name, original, factor, s):
    """Every causal pair is scored by exactly one branch (LM-Infinite: at most one, the rest masked), and no scored
    distance exceeds the pretraining length within the method's reach."""
    target = max(original + 1, int(original * factor))
    method = remap_method(name, original=original, target=target)
    i = torch.arange(s)[:, None]
    j = torch.arange(s)[None, :]
    causal = j <= i
    count = torch.zeros(s, s, dtype=torch.long)
    for branch in method.branches():
        region = branch.region(i, j) & causal
        count += region
        qp, kp = branch.query(i.expand(s, s)), branch.key(j.expand(s, s))
        dist = (qp.double() - kp.double())[region]
        assert bool((dist >= 0).all())
        if s <= target:  # LM-Infinite caps the distance *at* L, as its reference (limit_distance = local_branch)
            cap = original if name == "lm_infinite" else original - 1
            assert bool((dist <= cap).all()), (branch.name, float(dist.max()))
    assert int(count.max()) <= 1
    if name != "lm_infinite":
        assert bool((count == causal).all())


@pytest.mark.parametrize(
    "name, original, target, expected",
    [
        ("self_extend", 8192, 16384, SelfExtend(window=2048, group=3)),
        ("self_extend", 4096, 16384, SelfExtend(window=1024, group=5)),
        ("dca", 8192, 16384, DualChunk(chunk_size=6144, local_window=1024, original_max_position_embeddings=8192)),
        (
            "dca_vllm",
            8192,
            16384,
            DualChunk(chunk_size=6144, local_window=1024, original_max_position_embeddings=8192, mscale=0.1),
        ),
        ("rerope", 8192, 16384, ReRoPE(window=1024, log_scale_length=8192)),
        ("leaky_rerope", 8192, 16384, ReRoPE(window=1024, leak=2.15, log_scale_length=8192)),
        ("lm_infinite", 8192, 16384, LMInfinite(window=8192, global_tokens=10)),
    ],
)
def test_paper_rules(name, original, target, expected):
    method = remap_method(name, original=original, target=target)
    assert method == expected
    assert method.reach(original) >= target


def test_options_override_the_rule():
    assert remap_method("self_extend", original=8192, target=16384, window=1024, group=4) == SelfExtend(
        window=1024, group=4
    )
    assert remap_method("dca", original=8192, target=16384, chunk_size=4096).chunk_size == 4096
    assert remap_method("rerope", original=8192, target=16384, log_scale=False).log_scale_length is None


@pytest.mark.parametrize(
    "name, options, match",
    [
        ("self_extend", dict(group=1), "group"),  # reaches only 8192
        ("self_extend", dict(window=8192), "window"),
        ("self_extend", dict(window=0), "window"),
        ("dca", dict(chunk_size=8192), "chunk_size"),
        ("dca", dict(local_window=6144), "local_window"),
        ("leaky_rerope", dict(leak=1.5), "leak"),
        ("rerope", dict(leak=2.0), "leak"),  # an option of leaky_rerope, not rerope
        ("lm_infinite", dict(window=9000), "window"),
        ("lm_infinite", dict(global_tokens=0), "global_tokens"),
        ("yarn", {}, "method"),
    ],
)
def test_bad_parameters_name_the_parameter(name, options, match):
    with pytest.raises(ValueError, match=match):
        remap_method(name, original=8192, target=16384, **options)


@pytest.mark.parametrize("target", [4096, 8192])
def test_a_target_within_the_original_context_is_refused(target):
    with pytest.raises(ValueError, match="target"):
        remap_method("dca", original=8192, target=target)


def test_methods_round_trip_through_dicts():
    for method in CASES:
        assert type(method).from_dict(method.to_dict()) == method
