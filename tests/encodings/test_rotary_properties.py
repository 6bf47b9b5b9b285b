"""Properties of ``RotaryEmbedding`` over layout x partial_rotary_factor x scaling, on full tensors.

The scalings use small original lengths (16-64) so that positions of a few dozen already change their frequencies;
``test_scalings_change_frequencies`` checks that, so no property below passes because a scaling was a no-op.
Hugging Face reference comparisons live in ``test_rotary_hf.py``; these tests need no reference model.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import posenc
from posenc import RotaryEmbedding, apply_rotary, rope_frequencies
from reference.rope_float64 import rotate_float64
from tolerances import rotated_softmax_atol

LAYOUTS = ("half", "interleaved")
PARTIALS = (1.0, 0.5)
SCALINGS = ("none", "linear", "ntk", "yarn", "llama3", "longrope", "dynamic")
SCALINGS += ("ntk_alpha", "ntk_mixed", "telechat3_yarn", "yarn_log")  # vLLM's variants (issue 40, item 5)
LENGTH_DEPENDENT = ("dynamic", "longrope")
HEAD_DIMS = (8, 12, 16, 20, 32, 64)  # every one gives an even rotary dim >= 4 at both partial factors

YARN_FACTOR = 4.0
LONGROPE_FACTOR, LONGROPE_ORIGINAL = 4.0, 16
DYNAMIC_MAX = 16

all_cases = pytest.mark.parametrize(
    "scaling,layout,partial",
    [(s, lay, p) for s in SCALINGS for lay in LAYOUTS for p in PARTIALS],
)
# Positional plumbing (shapes, dtypes) needs fewer draws than the numerical properties; keeps the file fast.
plumbing = settings(max_examples=15)
scalings_and_partials = pytest.mark.parametrize("scaling,partial", [(s, p) for s in SCALINGS for p in PARTIALS])


def make_scaling(name: str, rotary_dim: int):
    """A scaling that changes the frequencies at small positions; half as config objects, half as HF dicts."""
    f = rotary_dim // 2
    if name == "none":
        return None
    if name == "linear":
        return posenc.LinearScaling(factor=4.0)
    if name == "ntk":
        return posenc.NTKScaling(factor=4.0)
    if name == "yarn":
        return posenc.YaRNScaling(factor=YARN_FACTOR, original_max_position_embeddings=32)
    if name == "llama3":
        return {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        }
    if name == "longrope":
        return {
            "rope_type": "longrope",
            "short_factor": [1.0 + 0.5 * i for i in range(f)],
            "long_factor": [1.0 + 3.0 * i for i in range(f)],
            "original_max_position_embeddings": LONGROPE_ORIGINAL,
            "factor": LONGROPE_FACTOR,
        }
    if name == "dynamic":
        return posenc.DynamicNTKScaling(factor=4.0, max_position_embeddings=DYNAMIC_MAX)
    if name == "ntk_alpha":
        return {"type": "dynamic", "alpha": 4.0}  # Hunyuan's spelling
    if name == "ntk_mixed":
        return posenc.MixedNTKScaling(factor=4.0, mixed_b=0.625)
    if name == "telechat3_yarn":
        return {"rope_type": "telechat3-yarn", "factor": YARN_FACTOR, "original_max_position_embeddings": 32}
    if name == "yarn_log":
        return posenc.YaRNLogScaling(factor=YARN_FACTOR, original_max_position_embeddings=32)
    raise AssertionError(name)


def expected_attention_factor(name: str) -> float:
    """Written out from the papers, not read from posenc."""
    if name == "yarn":
        return 0.1 * math.log(YARN_FACTOR) + 1.0
    if name == "telechat3_yarn":
        return 0.07 * math.log(YARN_FACTOR) + 1.0
    if name == "longrope":
        return math.sqrt(1.0 + math.log(LONGROPE_FACTOR) / math.log(LONGROPE_ORIGINAL))
    return 1.0


def build(name: str, head_dim: int, layout: str = "half", partial: float = 1.0, base: float = 10000.0):
    rd = int(head_dim * partial)
    return RotaryEmbedding(
        head_dim, base=base, scaling=make_scaling(name, rd), layout=layout, partial_rotary_factor=partial
    )


def randn(shape, seed: int, dtype=torch.float64) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g, dtype=torch.float64).to(dtype)


def positions_st(size: int, max_value: int = 64):
    return st.lists(st.integers(0, max_value), min_size=size, max_size=size).map(torch.tensor)


def half_from_interleaved_index(head_dim: int, rotary_dim: int) -> torch.Tensor:
    """``idx`` with ``x_interleaved = x_half[..., idx]``: interleaved 2i <- half i, 2i + 1 <- half i + F."""
    f = rotary_dim // 2
    idx = torch.arange(head_dim)
    idx[0:rotary_dim:2] = torch.arange(f)
    idx[1:rotary_dim:2] = torch.arange(f, rotary_dim)
    return idx


# --------------------------------------------------------------------------------------------------------------
# the scalings used here really change the frequencies (so the properties below are not vacuous)


@pytest.mark.parametrize("scaling", SCALINGS[1:])
@pytest.mark.parametrize("partial", PARTIALS)
def test_scalings_change_frequencies(scaling, partial):
    head_dim = 16
    rd = int(head_dim * partial)
    default, _ = rope_frequencies(head_dim, partial_rotary_factor=partial)
    scaled, _ = rope_frequencies(
        head_dim, scaling=make_scaling(scaling, rd), partial_rotary_factor=partial, seq_len=1000
    )
    assert scaled.shape == default.shape == (rd // 2,)
    assert not torch.allclose(scaled, default)


# --------------------------------------------------------------------------------------------------------------
# <R(m) q, R(n) k> depends on m - n only


@all_cases
@given(data=st.data())
def test_scores_depend_only_on_relative_position(scaling, layout, partial, data):
    d = data.draw(st.sampled_from(HEAD_DIMS))
    b, h, s, t = (data.draw(st.integers(1, n)) for n in (2, 2, 5, 5))
    emb = build(scaling, d, layout, partial)
    seed = data.draw(st.integers(0, 2**16))
    q, k = randn((b, h, s, d), seed), randn((b, h, t, d), seed + 1)
    q_pos, k_pos = data.draw(positions_st(s)), data.draw(positions_st(t))
    shift = data.draw(st.integers(1, 1000))

    if scaling in LENGTH_DEPENDENT:
        # Frequencies follow the length: hold it fixed so that the shift is the only change (a length that covers
        # the shifted positions; shorter ones are refused).
        reach = int(torch.cat([q_pos.flatten(), k_pos.flatten()]).max().ceil()) + shift + 1
        length = reach + data.draw(st.integers(0, 2000))

        def rotate(q_pos, k_pos):
            return emb.rotate_one(q, q_pos, seq_len=length), emb.rotate_one(k, k_pos, seq_len=length)
    else:

        def rotate(q_pos, k_pos):
            return emb(q, k, q_pos, k_positions=k_pos)

    rq, rk = rotate(q_pos, k_pos)
    rq_shifted, rk_shifted = rotate(q_pos + shift, k_pos + shift)
    scores = rq @ rk.transpose(-1, -2)  # (B, H, S, T)
    torch.testing.assert_close(rq_shifted @ rk_shifted.transpose(-1, -2), scores, rtol=1e-9, atol=1e-9)


@all_cases
@plumbing
@given(data=st.data())
def test_queries_and_keys_share_one_length(scaling, layout, partial, data):
    """``forward`` with ``k_positions`` rotates q and k with the frequencies of ``max(all positions) + 1``."""
    d = data.draw(st.sampled_from(HEAD_DIMS))
    s, t = data.draw(st.integers(1, 4)), data.draw(st.integers(1, 8))
    emb = build(scaling, d, layout, partial)
    q, k = randn((1, 2, s, d), 0), randn((1, 2, t, d), 1)
    q_pos, k_pos = data.draw(positions_st(s, 40)), data.draw(positions_st(t, 40))
    rq, rk = emb(q, k, q_pos, k_positions=k_pos)
    length = torch.maximum(q_pos.max(), k_pos.max()) + 1
    torch.testing.assert_close(rq, emb.rotate_one(q, q_pos, seq_len=length), rtol=0, atol=0)
    torch.testing.assert_close(rk, emb.rotate_one(k, k_pos, seq_len=length), rtol=0, atol=0)


@all_cases
def test_decode_step_equals_full_forward(scaling, layout, partial):
    """The last query alone against all keys (a KV-cache decode step) == the last row of the full forward."""
    d, s = 16, 24  # s > every original length used here, so dynamic and longrope are in their scaled regime
    emb = build(scaling, d, layout, partial)
    q, k = randn((2, 3, s, d), 0, torch.float32), randn((2, 1, s, d), 1, torch.float32)
    positions = torch.arange(s)
    full_q, full_k = emb(q, k, positions)
    step_q, step_k = emb(q[:, :, -1:], k, positions[-1:], k_positions=positions)
    torch.testing.assert_close(step_q, full_q[:, :, -1:], rtol=0, atol=0)
    torch.testing.assert_close(step_k, full_k, rtol=0, atol=0)


# --------------------------------------------------------------------------------------------------------------
# norms, position 0, pass-through channels


@all_cases
@given(data=st.data())
def test_rotation_scales_norms_by_attention_factor(scaling, layout, partial, data):
    d = data.draw(st.sampled_from(HEAD_DIMS))
    b, h, s = (data.draw(st.integers(1, n)) for n in (2, 2, 6))
    emb = build(scaling, d, layout, partial)
    x = randn((b, h, s, d), data.draw(st.integers(0, 2**16)))
    out = emb.rotate_one(x, data.draw(positions_st(s, 100_000)))
    rd = emb.config.rotary_dim
    factor = expected_attention_factor(scaling)
    assert emb.attention_factor == pytest.approx(factor, rel=1e-12)
    torch.testing.assert_close(out[..., :rd].norm(dim=-1), factor * x[..., :rd].norm(dim=-1), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(out[..., rd:], x[..., rd:], rtol=0, atol=0)


@all_cases
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_position_zero_is_identity_times_attention_factor(scaling, layout, partial, dtype):
    d = 16
    emb = build(scaling, d, layout, partial)
    q, k = randn((2, 3, 5, d), 0, dtype), randn((2, 1, 5, d), 1, dtype)
    rd = emb.config.rotary_dim
    factor = expected_attention_factor(scaling)
    for out, x in zip(emb(q, k, torch.zeros(5, dtype=torch.long)), (q, k), strict=True):
        assert out.dtype == dtype
        if factor == 1.0:
            torch.testing.assert_close(out, x, rtol=0, atol=0)
        else:
            torch.testing.assert_close(out[..., :rd], factor * x[..., :rd])
        torch.testing.assert_close(out[..., rd:], x[..., rd:], rtol=0, atol=0)


@pytest.mark.parametrize("scaling", SCALINGS)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("path", ["no_grad", "x_requires_grad", "tables_require_grad"])
def test_partial_rotary_pass_through_is_bit_identical(scaling, layout, dtype, path):
    d = 20  # rotary dim 10, pass-through 10
    emb = build(scaling, d, layout, 0.5)
    x = randn((2, 3, 6, d), 0, dtype)
    positions = torch.tensor([0, 3, 17, 40, 999, 123_456])
    if path == "tables_require_grad":  # the differentiable expression path of apply_rotary
        cos, sin = emb.cos_sin(positions)
        out = apply_rotary(x, cos.requires_grad_(), sin, layout=layout)
    else:
        out = emb.rotate_one(x.requires_grad_(path == "x_requires_grad"), positions)
    assert out.dtype == dtype and out.shape == x.shape
    assert torch.equal(out[..., 10:], x[..., 10:])
    assert not torch.equal(out[..., :10], x[..., :10])


# --------------------------------------------------------------------------------------------------------------
# layouts are one rotation up to a channel permutation


@scalings_and_partials
@given(data=st.data())
def test_layouts_equal_up_to_channel_permutation(scaling, partial, data):
    d = data.draw(st.sampled_from(HEAD_DIMS))
    b, h, s = (data.draw(st.integers(1, n)) for n in (2, 2, 6))
    half, inter = build(scaling, d, "half", partial), build(scaling, d, "interleaved", partial)
    rd = half.config.rotary_dim
    idx = half_from_interleaved_index(d, rd)
    inv = torch.argsort(idx)
    assert torch.equal(idx[rd:], torch.arange(rd, d))  # pass-through channels stay in place
    assert not torch.equal(idx, torch.arange(d))
    assert torch.equal(idx[inv], torch.arange(d))

    x = randn((b, h, s, d), data.draw(st.integers(0, 2**16)))
    positions = data.draw(positions_st(s, 10_000))
    expected = half.rotate_one(x, positions)
    actual = inter.rotate_one(x[..., idx], positions)[..., inv]
    torch.testing.assert_close(actual, expected, rtol=1e-12, atol=1e-12)


# --------------------------------------------------------------------------------------------------------------
# scaling factor 1 is no scaling


def _assert_default_frequencies(head_dim, base, partial, scaling, seq_len=None):
    default, default_af = rope_frequencies(head_dim, base=base, partial_rotary_factor=partial)
    inv_freq, af = rope_frequencies(
        head_dim, base=base, scaling=scaling, partial_rotary_factor=partial, seq_len=seq_len
    )
    assert default_af == 1.0 and af == 1.0
    torch.testing.assert_close(inv_freq, default)


factor_one_common = st.tuples(
    st.sampled_from(HEAD_DIMS), st.sampled_from(PARTIALS), st.floats(2.0, 1e6, allow_nan=False)
)


@given(common=factor_one_common)
def test_linear_and_ntk_factor_one_are_identity(common):
    head_dim, partial, base = common
    for scaling in (posenc.LinearScaling(factor=1.0), posenc.NTKScaling(factor=1.0)):
        _assert_default_frequencies(head_dim, base, partial, scaling)


@given(
    common=factor_one_common,
    max_pos=st.integers(1, 10_000),
    fraction=st.floats(0.0, 1.0),
    as_tensor=st.booleans(),
)
def test_dynamic_factor_one_is_identity_up_to_max_position(common, max_pos, fraction, as_tensor):
    head_dim, partial, base = common
    scaling = posenc.DynamicNTKScaling(factor=1.0, max_position_embeddings=max_pos)
    seq_len = max(1, round(fraction * max_pos))
    _assert_default_frequencies(head_dim, base, partial, scaling)
    _assert_default_frequencies(head_dim, base, partial, scaling, torch.tensor(seq_len) if as_tensor else seq_len)


def test_dynamic_factor_one_still_grows_the_base_past_max_position():
    """Not an identity beyond max_position_embeddings: base * (L / max_pos) ** (dim / (dim - 2)), as in HF."""
    scaling = posenc.DynamicNTKScaling(factor=1.0, max_position_embeddings=16)
    inv_freq, _ = rope_frequencies(8, scaling=scaling, seq_len=64)
    expected, _ = rope_frequencies(8, base=10000.0 * 4.0 ** (8 / 6))
    torch.testing.assert_close(inv_freq, expected)


@given(
    common=factor_one_common,
    original=st.integers(1, 100_000),
    betas=st.tuples(st.floats(0.1, 8.0), st.floats(0.1, 64.0)),
    truncate=st.booleans(),
    mscales=st.sampled_from([(None, None), (0.707, 0.707), (1.0, 0.5), (0.1, None)]),
)
def test_yarn_factor_one_is_identity(common, original, betas, truncate, mscales):
    """With factor 1 interpolation == extrapolation, so the ramp is irrelevant; every mscale gives 1."""
    head_dim, partial, base = common
    beta_slow, extra = betas
    scaling = posenc.YaRNScaling(
        factor=1.0,
        original_max_position_embeddings=original,
        beta_slow=beta_slow,
        beta_fast=beta_slow + extra,
        truncate=truncate,
        mscale=mscales[0],
        mscale_all_dim=mscales[1],
    )
    _assert_default_frequencies(head_dim, base, partial, scaling)


@given(
    common=factor_one_common,
    original=st.integers(1, 100_000),
    freq_factors=st.tuples(st.floats(0.1, 8.0), st.floats(0.1, 8.0)),
)
def test_llama3_factor_one_is_identity(common, original, freq_factors):
    head_dim, partial, base = common
    low, extra = freq_factors
    scaling = posenc.Llama3Scaling(
        factor=1.0, low_freq_factor=low, high_freq_factor=low + extra, original_max_position_embeddings=original
    )
    _assert_default_frequencies(head_dim, base, partial, scaling)


@pytest.mark.parametrize(
    "scaling",
    [
        posenc.LinearScaling(factor=1.0),
        posenc.NTKScaling(factor=1.0),
        {"rope_type": "dynamic", "factor": 1.0, "max_position_embeddings": 64},
        {"rope_type": "yarn", "factor": 1.0, "original_max_position_embeddings": 8},
        {
            "rope_type": "llama3",
            "factor": 1.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8,
        },
    ],
    ids=["linear", "ntk", "dynamic", "yarn", "llama3"],
)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_factor_one_module_equals_unscaled_module(scaling, layout):
    q, k = randn((2, 2, 7, 16), 0, torch.float32), randn((2, 1, 7, 16), 1, torch.float32)
    positions = torch.tensor([0, 1, 5, 9, 30, 50, 63])  # <= dynamic's max_position_embeddings
    expected = RotaryEmbedding(16, layout=layout)(q, k, positions)
    actual = RotaryEmbedding(16, layout=layout, scaling=scaling)(q, k, positions)
    torch.testing.assert_close(actual, expected)


# --------------------------------------------------------------------------------------------------------------
# positions: shapes, per-batch rows, integer vs float


@all_cases
@plumbing
@given(data=st.data())
def test_shared_positions_equal_broadcast_batch_positions(scaling, layout, partial, data):
    d = data.draw(st.sampled_from(HEAD_DIMS))
    b, s = data.draw(st.integers(1, 3)), data.draw(st.integers(1, 6))
    emb = build(scaling, d, layout, partial)
    seed = data.draw(st.integers(0, 2**16))
    q, k = randn((b, 2, s, d), seed, torch.float32), randn((b, 1, s, d), seed + 1, torch.float32)
    positions = data.draw(positions_st(s, 200))
    expected = emb(q, k, positions)
    torch.testing.assert_close(emb(q, k, positions.expand(b, s)), expected)
    torch.testing.assert_close(emb(q, k, positions.unsqueeze(0)), expected)


@all_cases
@plumbing
@given(data=st.data())
def test_per_batch_positions_equal_rotating_each_row(scaling, layout, partial, data):
    d = data.draw(st.sampled_from(HEAD_DIMS))
    b, s = data.draw(st.integers(2, 3), label="b"), data.draw(st.integers(1, 6), label="s")
    emb = build(scaling, d, layout, partial)
    seed = data.draw(st.integers(0, 2**16))
    q, k = randn((b, 2, s, d), seed, torch.float32), randn((b, 1, s, d), seed + 1, torch.float32)
    positions = torch.stack([data.draw(positions_st(s, 200)) for _ in range(b)])  # (B, S), rows differ
    if scaling in LENGTH_DEPENDENT:
        # The batch shares one length (max over the whole batch); a single row alone would see its own max.
        length = positions.max() + 1
        expected_q = torch.cat([emb.rotate_one(q[i : i + 1], positions[i], seq_len=length) for i in range(b)])
        expected_k = torch.cat([emb.rotate_one(k[i : i + 1], positions[i], seq_len=length) for i in range(b)])
    else:
        rows = [emb(q[i : i + 1], k[i : i + 1], positions[i]) for i in range(b)]
        expected_q, expected_k = torch.cat([r[0] for r in rows]), torch.cat([r[1] for r in rows])
    actual_q, actual_k = emb(q, k, positions)
    torch.testing.assert_close(actual_q, expected_q)
    torch.testing.assert_close(actual_k, expected_k)


@all_cases
@plumbing
@given(data=st.data())
def test_integer_and_float_positions_agree(scaling, layout, partial, data):
    d = data.draw(st.sampled_from(HEAD_DIMS))
    s = data.draw(st.integers(1, 6))
    emb = build(scaling, d, layout, partial)
    seed = data.draw(st.integers(0, 2**16))
    q, k = randn((2, 2, s, d), seed, torch.float32), randn((2, 1, s, d), seed + 1, torch.float32)
    positions = data.draw(positions_st(s, 2**20))  # integers exact in float32
    expected = emb(q, k, positions)  # int64
    dtypes = [torch.int32, torch.float32, torch.float64] + ([torch.int16] if positions.max() < 2**15 else [])
    for dtype in dtypes:
        torch.testing.assert_close(emb(q, k, positions.to(dtype)), expected, rtol=0, atol=0)


@pytest.mark.parametrize("scaling", LENGTH_DEPENDENT)
def test_integer_query_positions_with_fractional_key_positions(scaling):
    """The shared length must not depend on the query positions' dtype (float positions are allowed)."""
    emb = build(scaling, 8)
    q, k = randn((1, 1, 1, 8), 0), randn((1, 1, 4, 8), 1)
    # Length 16.5: past the original 16 of both (dynamic scales, longrope takes long_factor); 16 would not be.
    k_pos = torch.tensor([0.0, 1.0, 2.0, 15.5], dtype=torch.float64)
    expected = emb(q, k, torch.tensor([3.0], dtype=torch.float64), k_positions=k_pos)
    actual = emb(q, k, torch.tensor([3]), k_positions=k_pos)
    torch.testing.assert_close(actual, expected)


# --------------------------------------------------------------------------------------------------------------
# precision at large positions (angles in float64)


def _reference(emb, x, positions):
    c = emb.config
    inv_freq, factor = rope_frequencies(
        c.head_dim,
        base=c.base,
        scaling=c.scaling,
        partial_rotary_factor=c.partial_rotary_factor,
        seq_len=int(positions.max()) + 1,
    )
    return rotate_float64(x, positions, inv_freq.double(), layout=c.layout, attention_factor=factor)


@all_cases
@given(data=st.data())
def test_bf16_and_float32_at_a_million_match_float64_reference(scaling, layout, partial, data):
    d = data.draw(st.sampled_from(HEAD_DIMS))
    s = data.draw(st.integers(1, 8))
    emb = build(scaling, d, layout, partial)
    offsets = data.draw(st.lists(st.integers(-2000, 2000), min_size=s, max_size=s))
    positions = 1_000_000 + torch.tensor(offsets)
    x32 = randn((2, 2, s, d), data.draw(st.integers(0, 2**16)), torch.float32)
    x16 = x32.bfloat16()

    out16 = emb.rotate_one(x16, positions)
    assert out16.dtype == torch.bfloat16
    torch.testing.assert_close(out16.double(), _reference(emb, x16, positions), rtol=1.6e-2, atol=1e-5)

    out32 = emb.rotate_one(x32, positions)
    assert out32.dtype == torch.float32
    torch.testing.assert_close(out32.double(), _reference(emb, x32, positions), rtol=1.3e-6, atol=1e-5)


def test_float32_angles_would_fail_the_float64_reference():
    """The tolerance above is tight enough to catch float32 angles at 1e6 (what the float64 angles are for)."""
    emb = build("none", 64)
    x = randn((1, 1, 16, 64), 0, torch.float32)
    positions = 1_000_000 + torch.arange(16)
    angles = positions.float()[:, None] * emb.inv_freq  # (S, F) float32: ~0.06 rad off at 1e6
    naive = apply_rotary(x.double(), angles.cos().double(), angles.sin().double())
    with pytest.raises(AssertionError):
        torch.testing.assert_close(naive, _reference(emb, x, positions), rtol=1.3e-6, atol=1e-5)
    torch.testing.assert_close(
        emb.rotate_one(x, positions).double(), _reference(emb, x, positions), rtol=1.3e-6, atol=1e-5
    )


# --------------------------------------------------------------------------------------------------------------
# gradients: the custom autograd.Function fast path


@all_cases
def test_gradcheck_fast_path(scaling, layout, partial):
    emb = build(scaling, 8, layout, partial)
    positions = torch.tensor([0, 5, 40])
    q = randn((2, 2, 3, 8), 0).requires_grad_()
    k = randn((2, 1, 3, 8), 1).requires_grad_()
    out_q, out_k = emb(q, k, positions)
    assert type(out_q.grad_fn).__name__ == "_RotateBackward"  # the custom Function, not the traced expression
    with torch.no_grad():
        ref_q, ref_k = emb(q, k, positions)
    torch.testing.assert_close(out_q, ref_q, rtol=0, atol=0)
    torch.testing.assert_close(out_k, ref_k, rtol=0, atol=0)
    assert torch.autograd.gradcheck(lambda q, k: emb(q, k, positions), (q, k))


@all_cases
def test_fast_path_gradient_equals_expression_path_gradient(scaling, layout, partial):
    """Backward of the custom Function (inverse rotation) == autograd through the plain expression."""
    emb = build(scaling, 16, layout, partial)
    positions = torch.tensor([0, 5, 40, 300])
    cos, sin = emb.cos_sin(positions)
    x = randn((2, 3, 4, 16), 0, torch.float32)
    grad = randn((2, 3, 4, 16), 1, torch.float32)

    x_fast = x.clone().requires_grad_()
    out_fast = apply_rotary(x_fast, cos, sin, layout=layout)
    out_fast.backward(grad)

    x_expr = x.clone().requires_grad_()
    out_expr = apply_rotary(x_expr, cos.clone().requires_grad_(), sin, layout=layout)  # tables need grad: expr path
    assert type(out_fast.grad_fn).__name__ != type(out_expr.grad_fn).__name__
    out_expr.backward(grad)

    torch.testing.assert_close(out_fast, out_expr)
    torch.testing.assert_close(x_fast.grad, x_expr.grad)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("partial", PARTIALS)
def test_gradgradcheck(layout, partial):
    """Double backward (gradient penalties, meta-learning) through the rotation."""
    emb = build("none", 8, layout, partial)
    positions = torch.tensor([0, 5, 40])
    q = randn((1, 2, 3, 8), 0).requires_grad_()
    assert torch.autograd.gradgradcheck(lambda q: emb.rotate_one(q, positions), (q,))


# --------------------------------------------------------------------------------------------------------------
# torch.compile: one compile per scaling


class TestCompile:
    @pytest.mark.parametrize("scaling", ["none", "yarn", "dynamic"])
    def test_fullgraph_matches_eager(self, scaling):
        from torch._dynamo.testing import CompileCounterWithBackend

        emb = build(scaling, 16, "half", 0.5)
        counter = CompileCounterWithBackend("inductor")

        def rotate(q, k, positions):
            return emb(q, k, positions)

        compiled = torch.compile(rotate, backend=counter, fullgraph=True, dynamic=False)
        q, k = randn((2, 2, 12, 16), 0, torch.float32), randn((2, 1, 12, 16), 1, torch.float32)
        # Same shapes, different lengths: dynamic's length must be read from the tensor, not baked in.
        for start in (0, 40):
            positions = torch.arange(start, start + 12)
            torch.testing.assert_close(compiled(q, k, positions), emb(q, k, positions))
        assert counter.frame_count == 1  # one graph, no recompile for new position values

    @pytest.mark.parametrize("order", [LENGTH_DEPENDENT, LENGTH_DEPENDENT[::-1]], ids="-then-".join)
    @pytest.mark.parametrize("kind", [int, float])
    def test_fullgraph_after_another_length_dependent_compile(self, order, kind):
        """Two length-dependent scalings compiled one after the other in one process, through one function (one
        code object), as ``torch.compile(fn, fullgraph=True)`` with its default ``dynamic=None``. Dynamo keeps
        per-code-object state across compilations: the second compile sees that the Python ``seq_len`` changed
        since the first and traces it as a symbolic number. Checking it with ``math.isfinite`` broke that graph
        ("torch.* op returned non-Tensor"), whichever scaling came second."""
        torch._dynamo.reset()  # the scenario starts from a fresh process's dynamo state, whatever ran before

        def step(q, k, v, encoding, seq_len):
            return posenc.attention(q, k, v, encoding=encoding, seq_len=seq_len, backend="eager")

        q, k, v = (randn((1, 2, 12, 16), seed, torch.float32) for seed in range(3))
        # The first scaling runs at one length, the second at others, within and past both original lengths (16):
        # each scaling's output moves by 2e-2 and more between them, so a length baked into a graph fails too.
        for name, lengths in zip(order, [(20,), (28, 12, 36)], strict=True):
            enc = build(name, 16)
            # Both sides are float32 computations of the same rotated attention (positions 0..11), each within the
            # bound of the exact one; the attention factor multiplies cos and sin, so the logits by its square.
            atol = 2 * rotated_softmax_atol(
                q, k, v, torch.float32, max_position=11, logit_factor=enc.attention_factor**2
            )
            compiled = torch.compile(step, backend="eager", fullgraph=True)
            for seq_len in map(kind, lengths):
                torch.testing.assert_close(
                    compiled(q, k, v, enc, seq_len), step(q, k, v, enc, seq_len), rtol=0, atol=atol
                )


# --------------------------------------------------------------------------------------------------------------
# module plumbing: state_dict, .to(dtype), meta device


@pytest.mark.parametrize("scaling", SCALINGS)
def test_state_dict_round_trip(scaling):
    emb = build(scaling, 16, "interleaved", 0.5)
    assert "inv_freq" in dict(emb.named_buffers())
    assert "inv_freq" not in emb.state_dict()  # non-persistent: recomputed from the config
    other = build(scaling, 16, "interleaved", 0.5)
    other.load_state_dict(emb.state_dict(), strict=True)
    q, k = randn((1, 2, 5, 16), 0, torch.float32), randn((1, 2, 5, 16), 1, torch.float32)
    positions = torch.tensor([1, 2, 3, 50, 60])
    torch.testing.assert_close(other(q, k, positions), emb(q, k, positions), rtol=0, atol=0)


@pytest.mark.parametrize("scaling", SCALINGS)
def test_to_float64_keeps_rotation(scaling):
    """``.to(float64)`` casts the inv_freq buffer today (float32 values are exact in float64); either way the
    frequencies and the rotation must not move."""
    emb = build(scaling, 16, "half", 0.5)
    inv_freq = emb.inv_freq.clone()
    q, k = randn((1, 2, 5, 16), 0, torch.float32), randn((1, 2, 5, 16), 1, torch.float32)
    positions = torch.tensor([1, 2, 3, 50, 1_000_000])
    expected32, expected64 = emb(q, k, positions), emb(q.double(), k.double(), positions)
    emb.to(torch.float64)
    assert emb.inv_freq.dtype in (torch.float32, torch.float64)
    assert torch.equal(emb.inv_freq.double(), inv_freq.double())
    torch.testing.assert_close(emb(q, k, positions), expected32, rtol=0, atol=0)
    torch.testing.assert_close(emb(q.double(), k.double(), positions), expected64, rtol=0, atol=0)


@pytest.mark.parametrize("scaling", ["none", "yarn", "llama3"])
def test_to_bfloat16_keeps_angles(scaling):
    """``model.to(torch.bfloat16)`` is how bf16 models are made; the rotation angles must survive it."""
    emb = build(scaling, 16, "half", 1.0)
    x = randn((1, 2, 4, 16), 0, torch.bfloat16)
    positions = 1_000_000 + torch.arange(4)
    emb.to(torch.bfloat16)
    torch.testing.assert_close(
        emb.rotate_one(x, positions).double(), _reference(emb, x, positions), rtol=1.6e-2, atol=1e-5
    )


@pytest.mark.parametrize("scaling", SCALINGS)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_meta_device_build(scaling, layout):
    cpu = build(scaling, 16, layout, 0.5)
    with torch.device("meta"):
        emb = build(scaling, 16, layout, 0.5)
        q, k = torch.empty(2, 4, 5, 16, dtype=torch.bfloat16), torch.empty(2, 2, 5, 16, dtype=torch.bfloat16)
        out_q, out_k = emb(q, k, torch.arange(5))
    assert emb.inv_freq.is_meta and emb.inv_freq.shape == cpu.inv_freq.shape and emb.inv_freq.dtype == torch.float32
    assert emb.attention_factor == cpu.attention_factor
    assert emb.config == cpu.config
    assert out_q.is_meta and out_q.shape == q.shape and out_q.dtype == torch.bfloat16
    assert out_k.is_meta and out_k.shape == k.shape and out_k.dtype == torch.bfloat16
