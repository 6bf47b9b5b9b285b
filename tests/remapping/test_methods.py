"""Each remapping method against its reference written out (``tests/reference/remapping.py``), several shapes;
the properties every method promises (inside its window it is plain RoPE attention; the no-op settings equal plain
RoPE; the branches' regions are disjoint; decode == full); the paper rules for the parameters, and bad input."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import assume, given, settings
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
    StreamingLLM,
    String,
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
    if isinstance(method, String):
        return ref.string(
            q,
            k,
            v,
            diag_size=method.shifted_offset,
            local_window=method.local_window,
            attention_factor_string=method.mscale,
            **rot,
        )
    if isinstance(method, StreamingLLM):
        return ref.streaming_llm(q, k, v, start_size=method.sinks, recent_size=method.window, **rot)
    return ref.lm_infinite(q, k, v, local_branch=method.window, global_branch=method.global_tokens, **rot)


def logit_factor(method, s):
    if isinstance(method, String):
        return method.mscale**2
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
    String(shifted_offset=9, local_window=3),
    String(shifted_offset=6, local_window=1, mscale=1.0),
    StreamingLLM(window=7, sinks=4),
    StreamingLLM(window=5, sinks=1),
    StreamingLLM(window=6, sinks=0),
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
    if isinstance(method, String):
        return method.shifted_offset  # the diagonal band (its logits times mscale**2)
    if isinstance(method, StreamingLLM):
        return method.window + 1  # the query and its recent keys
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
    scale = 8**-0.5 * (method.mscale**2 if isinstance(method, String) else 1.0)
    plain = posenc.attention(q, k, v, encoding=enc, scale=scale)
    out = remap_attention(q, k, v, method=method, encoding=enc, block=4)
    assert_close(out, plain, atol=rotated_softmax_atol(q, k, v, torch.float64, max_position=s), rtol=0)


@pytest.mark.parametrize(
    "method",
    [
        SelfExtend(window=3, group=1),
        DualChunk(chunk_size=60, local_window=10, original_max_position_embeddings=60),  # S <= L: factor 1
        ReRoPE(window=50),
        LMInfinite(window=50, global_tokens=4),
        String(shifted_offset=50, local_window=3, mscale=1.0),
        StreamingLLM(window=44, sinks=4),
    ],
    ids=repr,
)
def test_no_op_settings_equal_plain_rope(method):
    """Self-Extend with G = 1, DCA with a chunk >= S, ReRoPE / LM-Infinite / STRING (without its mscale) /
    StreamingLLM with a window >= S."""
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
    if name == "string":  # STRING reaches 2L - W at most (and also runs within L)
        target = int(original * factor / 2)
        assume(target <= String.longest_target(original) and int(0.33 * target) > String.default_local_window(original))
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
    if name not in ("lm_infinite", "streaming_llm"):  # both mask the middle
        assert bool((count == causal).all())


@pytest.mark.parametrize(
    "name, original, target, expected",
    [
        ("self_extend", 8192, 16384, SelfExtend(window=2048, group=3)),
        ("self_extend", 4096, 16384, SelfExtend(window=1024, group=6)),  # group 5 reaches 5 * (3072 + 204) = 16380
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
        ("string", 131072, 131072, String(shifted_offset=43253, local_window=128)),  # the README's Llama 3.1
        ("string", 8192, 8192, String(shifted_offset=2703, local_window=128)),
        ("string", 8192, 4096, String(shifted_offset=1351, local_window=128)),  # within L: 0.33 * the length
        ("string", 8192, 12288, String(shifted_offset=4224, local_window=128)),  # past L: raised to T - L + W
        ("string", 8192, 16256, String(shifted_offset=8192, local_window=128)),  # 2L - W, the longest
        ("string", 256, 256, String(shifted_offset=84, local_window=32)),  # W <= L // 8 on a short model
        ("streaming_llm", 8192, 16384, StreamingLLM(window=8187, sinks=4)),
        ("streaming_llm", 4096, 10**6, StreamingLLM(window=4091, sinks=4)),
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
        ("string", dict(shifted_offset=5000), "shifted_offset"),  # reaches 8192 + 5000 - 128 < 16384
        ("string", dict(local_window=3000, shifted_offset=2000), "local_window"),
        ("string", dict(shifted_offset=8192, mscale=0.0), "mscale"),
        ("streaming_llm", dict(window=8192), "window"),  # the cache would reach position 8196
        ("streaming_llm", dict(sinks=-1), "sinks"),
        ("streaming_llm", dict(sinks=8191), "sinks"),
    ],
)
def test_bad_parameters_name_the_parameter(name, options, match):
    with pytest.raises(ValueError, match=match):
        remap_method(name, original=8192, target=16384, **options)


@pytest.mark.parametrize("name", ["dca", "streaming_llm"])
@pytest.mark.parametrize("target", [4096, 8192])
def test_a_target_within_the_original_context_is_refused(name, target):
    with pytest.raises(ValueError, match="target"):
        remap_method(name, original=8192, target=target)


def test_string_refuses_a_target_past_its_longest_reach():
    assert String.longest_target(8192) == 16256
    remap_method("string", original=8192, target=16256)
    with pytest.raises(ValueError, match="at most 16256 tokens"):
        remap_method("string", original=8192, target=16257)


def test_string_changes_attention_within_the_training_length():
    """STRING is meant for the training length itself: past the offset it is not plain RoPE attention there."""
    method = remap_method("string", original=64, target=64)
    assert method == String(shifted_offset=21, local_window=8)
    q, k, v = qkv(1, 2, 2, 64, 8, seed=9)
    enc = rope(8)
    plain = posenc.attention(q, k, v, encoding=enc, scale=8**-0.5 * method.mscale**2)
    out = remap_attention(q, k, v, method=method, encoding=enc)
    assert_close(out[:, :, :21], plain[:, :, :21])  # queries before the offset: the diagonal band only
    assert float((out[:, :, 21:] - plain[:, :, 21:]).abs().max()) > 1e-3


def test_streaming_llm_positions_are_the_cache_indices():
    """A sink's distance is the query's cache index minus its own: distinct and ordered (LM-Infinite's global
    tokens all sit at one distance); inside the window the distances are the true ones."""
    method = StreamingLLM(window=5, sinks=2)
    window, sinks = method.branches()
    i = torch.tensor([[20]])
    j = torch.arange(21)[None]
    assert window.region(i, j)[0].nonzero().flatten().tolist() == [15, 16, 17, 18, 19, 20]
    assert sinks.region(i, j)[0].nonzero().flatten().tolist() == [0, 1]
    assert (sinks.query(i) - sinks.key(torch.tensor([0, 1]))).tolist() == [[7, 6]]


def test_methods_round_trip_through_dicts():
    for method in CASES:
        assert type(method).from_dict(method.to_dict()) == method
