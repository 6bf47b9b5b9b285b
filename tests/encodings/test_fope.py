"""FoPE == the paper's complex-number form (``tests/reference/fope.py``) on full tensors; clipping; the properties
the form has (and the shift invariance it gives up); gradients; GQA layouts; configs and errors."""

from __future__ import annotations

import json
import math

import pytest
import torch
from torch.testing import assert_close

import posenc
from encoding_cases import attention_tol
from posenc import FoPE
from posenc.functional.fope import (
    apply_fope,
    fope_cos_sin,
    fope_frequencies,
    fope_num_frequencies,
    init_fope_coefficients,
)
from posenc.functional.rope import default_inv_freq, rope_cos_sin
from reference import fope as ref
from tolerances import fope_rotation_atol, unit_roundoff

# (head_dim, base, train_len, num_frequencies): kept M of F = head_dim / 2 in the comment
CASES = [
    (16, 10000.0, 512, None),  # 4 of 8
    (64, 10000.0, 2048, None),  # 21 of 32
    (64, 500.0, 64, None),  # 22 of 32
    (32, 10000.0, None, 5),  # 5 of 16, fixed count
    (80, 1e6, 4096, None),  # 24 of 40
    (8, 10000.0, 4, None),  # 0 of 4: every wavelength >= 2 pi > 4, NoPE
    (16, 10000.0, 10**9, None),  # 8 of 8: nothing clipped
]
# (name, num_kv_heads, per_head, key heads): one set per query head, vLLM's per-KV-head sets, one shared set
SETS = [("per_query_head", None, True, 4), ("per_kv_head", 2, True, 2), ("shared", None, False, 2)]


def _fope(head_dim=16, num_heads=4, *, std=0.3, seed=1, **kw):
    if "num_frequencies" not in kw:
        kw.setdefault("train_len", 512)
    return FoPE(head_dim, num_heads, init_std=std, generator=torch.Generator().manual_seed(seed), **kw)


def _reference(enc, x, pos):
    c = enc.config
    return ref.fope(
        x,
        pos,
        head_dim=c.head_dim,
        base=c.base,
        a=enc.cos_coef.detach(),
        b=enc.sin_coef.detach(),
        train_len=c.train_len,
        num_frequencies=c.num_frequencies,
        layout=c.layout,
    )


def _positions(batched, s):
    pos = torch.arange(s) * 37 + 3  # spread up to ~1000: high frequencies wrap many times
    return torch.stack([pos, pos * 41 + 5]) if batched else pos  # rows differ, one reaches ~40000


# ---------------------------------------------------------------------------------------------------------------
# Full tensors vs the reference


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"D{c[0]}-base{c[1]:g}-L{c[2]}-n{c[3]}")
@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("sets", SETS, ids=lambda s: s[0])
@pytest.mark.parametrize("batched", [False, True])
def test_matches_reference_float64(case, layout, sets, batched):
    head_dim, base, train_len, num_frequencies = case
    _, num_kv_heads, per_head, key_heads = sets
    enc = _fope(
        head_dim,
        base=base,
        train_len=train_len,
        num_frequencies=num_frequencies,
        num_kv_heads=num_kv_heads,
        per_head=per_head,
        layout=layout,
    )
    q = torch.randn(2, 4, 9, head_dim, dtype=torch.float64)
    k = torch.randn(2, key_heads, 9, head_dim, dtype=torch.float64)
    pos = _positions(batched, 9)
    rq, rk = enc.rotate(q, k, pos, pos)
    assert rq.dtype == rk.dtype == torch.float64
    assert_close(rq, _reference(enc, q, pos), rtol=0, atol=1e-10)
    assert_close(rk, _reference(enc, k, pos), rtol=0, atol=1e-10)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_low_precision_inputs_match_reference(dtype, layout):
    """Tables are float32 for float32/bf16 inputs (never half); the result is cast back to the input dtype."""
    enc = _fope(64, train_len=2048, layout=layout)
    q = torch.randn(2, 4, 12, 64).to(dtype)
    pos = torch.arange(12) * 300
    out = enc.rotate_one(q, pos)
    assert out.dtype == dtype
    tol = {"atol": 2e-5, "rtol": 2e-5} if dtype == torch.float32 else {"atol": 6e-2, "rtol": 2e-2}
    assert_close(out.double(), _reference(enc, q.double(), pos), **tol)


def test_tables_are_per_set_and_padded():
    enc = _fope(16, num_kv_heads=2)  # 2 sets, 4 of 8 frequencies kept
    cos, sin = enc.cos_sin(torch.arange(5))
    assert cos.shape == sin.shape == (2, 5, 8) and cos.dtype == torch.float32
    assert torch.equal(cos[..., 4:], torch.ones(2, 5, 4)) and torch.equal(sin[..., 4:], torch.zeros(2, 5, 4))
    cos_b, _ = enc.cos_sin(torch.arange(5).expand(3, 5))
    assert cos_b.shape == (3, 2, 5, 8)
    assert_close(cos_b[1], cos, rtol=0, atol=0)
    cos64, _ = enc.cos_sin(torch.arange(5), dtype=torch.float64)
    assert cos64.dtype == torch.float64


# ---------------------------------------------------------------------------------------------------------------
# Clipping


@pytest.mark.parametrize("head_dim", [16, 64, 128])
@pytest.mark.parametrize("base", [10000.0, 500000.0])
@pytest.mark.parametrize("train_len", [16, 100, 512, 4096, 32768])
def test_clipping_keeps_exactly_the_wavelengths_below_train_len(head_dim, base, train_len):
    wavelengths = [2 * math.pi * base ** (2 * j / head_dim) for j in range(head_dim // 2)]  # float64, by hand
    kept = fope_num_frequencies(head_dim, base=base, train_len=train_len)
    assert all(w < train_len for w in wavelengths[:kept])
    assert all(w >= train_len for w in wavelengths[kept:])
    inv_freq = fope_frequencies(head_dim, base=base, train_len=train_len)
    assert torch.equal(inv_freq, default_inv_freq(head_dim, base=base)[:kept])  # RoPE's own values, a prefix


@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_clipped_pairs_pass_through_exactly(layout):
    """Pairs with wavelength >= train_len are unchanged bit for bit whatever the coefficients; the others turn."""
    enc = _fope(64, train_len=1000, std=1.0, layout=layout)  # 18 of 32 pairs kept
    kept = enc.inv_freq.numel()
    assert kept == 18
    q = torch.randn(2, 4, 7, 64)
    out = enc.rotate_one(q, torch.arange(7) * 1000 + 11)
    channels = torch.arange(64)
    pair = channels % 32 if layout == "half" else channels // 2
    assert torch.equal(out[..., pair >= kept], q[..., pair >= kept])
    assert (out[..., pair < kept] - q[..., pair < kept]).abs().amin(dim=(0, 2)).gt(0).all()


def test_num_frequencies_takes_precedence_and_zero_is_nope():
    enc = _fope(32, train_len=512, num_frequencies=3)  # train_len alone would keep 7
    assert enc.inv_freq.numel() == 3 and enc.cos_coef.shape == (4, 3, 3)
    nope = _fope(32, num_frequencies=0, std=1.0)
    q, k = torch.randn(2, 1, 4, 5, 32).unbind(0)
    pos = torch.arange(5) * 100
    rq, rk = nope.rotate(q, k.expand(-1, 4, -1, -1), pos, pos)
    assert torch.equal(rq, q) and torch.equal(rk, k.expand(-1, 4, -1, -1))


# ---------------------------------------------------------------------------------------------------------------
# What the form keeps: identity coefficients are clipped RoPE; relative position only for diagonal, equal ones


def test_identity_coefficients_are_rope_with_the_clipped_frequencies_at_zero():
    enc = _fope(16, std=0.0)  # 4 of 8 kept
    pos = torch.arange(50) * 13
    cos, sin = enc.cos_sin(pos)
    inv_freq = torch.cat([enc.inv_freq, torch.zeros(4)])
    rope_cos, rope_sin = rope_cos_sin(pos, inv_freq)
    assert_close(cos, rope_cos.expand(4, -1, -1), rtol=0, atol=0)
    assert_close(sin, rope_sin.expand(4, -1, -1), rtol=0, atol=0)
    # ... which is p-RoPE keeping half the pairs (its float32-computed frequencies differ by an ulp)
    q = torch.randn(1, 4, 50, 16)
    p_rope = posenc.build("p_rope", head_dim=16, p=0.5)
    # an ulp of a frequency (<= 2 u f, f <= 1) turns into <= 49 * 2 u radians at position 49: that much of |q| moves
    atol = (49 * 2 + 4) * unit_roundoff() * float(q.abs().max())
    assert_close(enc.rotate_one(q, torch.arange(50)), p_rope.rotate_one(q, torch.arange(50)), rtol=0, atol=atol)


def _scores(enc, q, k, q_pos, k_pos):
    rq, rk = enc.rotate(q, k, q_pos, k_pos)
    return rq @ rk.transpose(-1, -2)


def _shift_gap(enc, shift):
    q = torch.randn(1, 4, 6, 16, dtype=torch.float64)
    k = torch.randn(1, 4, 6, 16, dtype=torch.float64)
    pos = torch.tensor([0, 3, 10, 50, 200, 333])
    return (_scores(enc, q, k, pos + shift, pos + shift) - _scores(enc, q, k, pos, pos)).abs().max()


@pytest.mark.parametrize("shift", [1, 37, 1000])
def test_relative_position_with_identity_or_equal_diagonal_coefficients(shift):
    identity = _fope(16, std=0.0)
    assert _shift_gap(identity, shift) < 1e-9
    diagonal = _fope(16, std=0.0)
    with torch.no_grad():
        scale = torch.rand(4, 1, 4) + 0.5
        diagonal.cos_coef.mul_(scale)
        diagonal.sin_coef.copy_(diagonal.cos_coef)  # cos and sin series equal: each pair's turn is scaled
    assert _shift_gap(diagonal, shift) < 1e-9


@pytest.mark.parametrize("shift", [1, 37, 1000])
def test_general_coefficients_depend_on_absolute_position(shift):
    """Mixing frequencies (or cos != sin coefficients) leaves terms in m + n: scores change under a common shift."""
    assert _shift_gap(_fope(16, std=0.3), shift) > 1e-2
    unequal = _fope(16, std=0.0)
    with torch.no_grad():
        unequal.sin_coef.mul_(0.5)  # diagonal, but cos and sin series differ
    assert _shift_gap(unequal, shift) > 1e-2


def test_position_zero_scales_each_pair_by_its_cos_coefficients():
    """At p = 0 every cosine is 1 and every sine 0: pair d is multiplied by sum_j cos_coef[c, j, d]."""
    enc = _fope(16, num_kv_heads=2, std=0.5)  # query heads 0, 1 use set 0; 2, 3 use set 1
    q = torch.randn(2, 4, 1, 16, dtype=torch.float64)
    out = enc.rotate_one(q, torch.zeros(1, dtype=torch.long))
    colsum = enc.cos_coef.detach().double().sum(dim=1)  # (2, 4)
    scale = torch.cat([colsum, torch.ones(2, 4, dtype=torch.float64)], dim=-1).repeat_interleave(2, dim=0)
    assert_close(out, q * torch.cat([scale, scale], dim=-1)[None, :, None], rtol=0, atol=1e-12)


def test_chunks_equal_the_full_rotation():
    """Tables depend on each token's own position only: a chunk (a decode step, a context-parallel shard) is the
    matching slice of the full result, up to float32 rounding (the coefficient matmul may block another length
    differently). ``tests/test_attention.py`` checks decoding, chunking and packing through ``posenc.attention`` for
    every registered encoding."""
    enc = _fope(64, train_len=2048)
    x = torch.randn(2, 4, 20, 64)
    pos = torch.arange(20) + 100
    full = enc.rotate_one(x, pos)
    # Bound from the computation, not from one BLAS (tests/tolerances.fope_rotation_atol)
    atol = fope_rotation_atol(enc.cos_coef, enc.sin_coef, x.abs().max().item())
    for a, b in [(0, 7), (7, 8), (8, 20)]:
        assert_close(enc.rotate_one(x[:, :, a:b], pos[a:b]), full[:, :, a:b], rtol=0, atol=atol)


# ---------------------------------------------------------------------------------------------------------------
# Heads: vLLM's per-KV-head sets, and GQA through posenc.attention


def test_per_kv_head_sets_are_shared_by_each_query_group():
    enc = _fope(16, num_kv_heads=2, std=0.5)
    q = torch.randn(1, 4, 6, 16)
    pos = torch.arange(6)
    out = enc.rotate_one(q, pos)
    for h in range(4):
        one = _fope(16, num_heads=1, std=0.5)
        with torch.no_grad():
            one.cos_coef.copy_(enc.cos_coef[h // 2 : h // 2 + 1])
            one.sin_coef.copy_(enc.sin_coef[h // 2 : h // 2 + 1])
        assert_close(out[:, h : h + 1], one.rotate_one(q[:, h : h + 1], pos), rtol=0, atol=0)


@pytest.mark.parametrize("backend", ["eager", "sdpa"])
def test_gqa_keys_equal_repeated_keys_and_decode_equals_full(backend):
    enc = _fope(16, num_kv_heads=2)
    assert not enc.per_head_keys
    q = torch.randn(2, 4, 12, 16)
    k, v = torch.randn(2, 2, 2, 12, 16).unbind(0)
    with torch.no_grad():
        grouped = posenc.attention(q, k, v, encoding=enc, backend=backend)
        repeated = posenc.attention(
            q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), encoding=enc, backend=backend
        )
        pos = torch.arange(12)
        steps = [
            posenc.attention(
                q[:, :, a:b], k[:, :, :b], v[:, :, :b], encoding=enc, q_positions=pos[a:b], k_positions=pos[:b]
            )
            for a, b in [(0, 9), (9, 10), (10, 12)]
        ]
    tol = attention_tol(q, k, v, encoding=enc, k_positions=pos)
    assert_close(repeated, grouped, **tol)
    assert_close(torch.cat(steps, dim=2), grouped, **tol)


def test_compiles_without_graph_breaks():
    enc = _fope(16, train_len=64)
    q, k, v = torch.randn(3, 2, 4, 32, 16).unbind(0)
    pos = torch.arange(32)

    def step(q, k, v):
        return posenc.attention(q, k, v, encoding=enc, backend="sdpa", q_positions=pos, k_positions=pos)

    with torch.no_grad():
        compiled = torch.compile(step, fullgraph=True, dynamic=False)
        assert_close(compiled(q, k, v), step(q, k, v), **attention_tol(q, k, v, encoding=enc, k_positions=pos))


def test_state_dict_has_vllm_names_and_shapes():
    enc = _fope(64, num_heads=8, num_kv_heads=2, train_len=2048)  # 21 of 32 kept
    state = enc.state_dict()
    assert sorted(state) == ["cos_coef", "sin_coef"]  # inv_freq is rebuilt from the config, not saved
    assert state["cos_coef"].shape == state["sin_coef"].shape == (2, 21, 21)
    assert _fope(64, num_heads=8, per_head=False, train_len=2048).cos_coef.shape == (1, 21, 21)


# ---------------------------------------------------------------------------------------------------------------
# Gradients


def test_gradients_reach_the_coefficients_and_match_finite_differences():
    pos = torch.tensor([0, 5, 40, 300])
    inv_freq = fope_frequencies(16, train_len=512).double()
    gen = torch.Generator().manual_seed(2)
    a = init_fope_coefficients(2, 4, std=0.3, generator=gen).double().requires_grad_()
    b = init_fope_coefficients(2, 4, std=0.3, generator=gen).double().requires_grad_()
    x = torch.randn(1, 4, 4, 16, dtype=torch.float64, requires_grad=True)

    def turn(x, a, b):
        cos, sin = fope_cos_sin(pos, inv_freq, a, b, pairs=8, dtype=torch.float64)
        return apply_fope(x, cos, sin)

    assert torch.autograd.gradcheck(turn, (x, a, b))
    # x alone (fixed tables): the fast path's custom backward, the transpose of a non-orthogonal 2x2 map per pair
    cos, sin = fope_cos_sin(pos, inv_freq, a.detach(), b.detach(), pairs=8, dtype=torch.float64)
    assert torch.autograd.gradcheck(lambda x: apply_fope(x, cos, sin, layout="interleaved"), (x,))


def test_module_gradients_reach_coefficients_unless_frozen():
    enc = _fope(16)
    q, k = torch.randn(2, 2, 4, 6, 16).unbind(0)
    rq, rk = enc.rotate(q, k, torch.arange(6), torch.arange(6))
    (rq.square().sum() + rk.sum()).backward()
    assert enc.cos_coef.grad.abs().sum() > 0 and enc.sin_coef.grad.abs().sum() > 0
    frozen = _fope(16, learnable=False)
    assert not frozen.cos_coef.requires_grad and not frozen.sin_coef.requires_grad
    assert not frozen.rotate_one(q, torch.arange(6)).requires_grad


# ---------------------------------------------------------------------------------------------------------------
# Initialisation, configs, devices


def test_initial_coefficients_are_identity_plus_noise_drawn_cos_first():
    enc = FoPE(16, 4, train_len=512, init_std=0.25, generator=torch.Generator().manual_seed(7))
    gen = torch.Generator().manual_seed(7)
    cos_noise, sin_noise = torch.randn(4, 4, 4, generator=gen), torch.randn(4, 4, 4, generator=gen)
    assert_close(enc.cos_coef.detach(), torch.eye(4) + 0.25 * cos_noise, rtol=0, atol=0)
    assert_close(enc.sin_coef.detach(), torch.eye(4) + 0.25 * sin_noise, rtol=0, atol=0)
    assert torch.equal(FoPE(16, 4, train_len=512, init_std=0.0).cos_coef.detach(), torch.eye(4).expand(4, 4, 4))


def test_config_round_trips_and_builds_by_name():
    """``build`` passes the model's training length as ``max_len``; FoPE keeps it as ``train_len`` (a config
    ``max_len`` would tell the lab the encoding cannot run past it, as a learned table cannot)."""
    enc = posenc.build("fope", dim=64, num_heads=4, head_dim=16, max_len=300, num_kv_heads=2, layout="interleaved")
    d = enc.config.to_dict()
    assert FoPE.from_config(json.loads(json.dumps(d))).config == enc.config
    assert d["train_len"] == 300 and d["num_kv_heads"] == 2 and d["per_head"] is True and "max_len" not in d
    assert posenc.build("fope", head_dim=16, num_heads=4, max_len=300, train_len=5000).config.train_len == 5000
    with pytest.raises(ValueError, match=r"train_len=None is invalid: expected the training length"):
        posenc.build("fope", head_dim=16, num_heads=4)
    with pytest.raises(ValueError, match=r"fope: max_length=3"):
        posenc.build("fope", head_dim=16, num_heads=4, max_length=3)


def test_meta_build_then_to_empty_and_reset():
    with torch.device("meta"):
        enc = FoPE(16, 4, train_len=512)
    assert enc.cos_coef.is_meta and enc.inv_freq.is_meta
    enc.to_empty(device="cpu")
    enc.reset_parameters(torch.Generator().manual_seed(3))
    fresh = FoPE(16, 4, train_len=512, generator=torch.Generator().manual_seed(3))
    assert torch.equal(enc.inv_freq, fresh.inv_freq)
    assert torch.equal(enc.cos_coef, fresh.cos_coef) and torch.equal(enc.sin_coef, fresh.sin_coef)


def test_bfloat16_module_keeps_float32_frequencies():
    enc = _fope(64, train_len=2048).to(torch.bfloat16)
    assert enc.inv_freq.dtype == torch.float32
    assert torch.equal(enc.inv_freq, fope_frequencies(64, train_len=2048))


# ---------------------------------------------------------------------------------------------------------------
# Errors name the parameter


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"head_dim": 15}, r"head_dim=15 is invalid: expected an even number"),
        ({"train_len": None}, r"train_len=None is invalid: expected the training length"),
        ({"train_len": 0}, r"train_len=0 is invalid"),
        ({"num_frequencies": 9}, r"num_frequencies=9 is invalid: expected an integer in \[0, head_dim // 2 = 8\]"),
        ({"num_frequencies": -1}, r"num_frequencies=-1"),
        ({"init_std": -0.1}, r"init_std=-0.1"),
        ({"per_head": "yes"}, r"per_head='yes'"),
        ({"learnable": 1}, r"learnable=1"),
        ({"num_kv_heads": 3}, r"num_kv_heads=3 is invalid: expected a divisor of num_heads=4"),
        ({"num_heads": 0}, r"num_heads=0"),
        ({"base": 1.0}, r"base=1.0"),
        ({"layout": "neox"}, r"layout='neox'"),
    ],
)
def test_bad_config(kwargs, match):
    args = {"head_dim": 16, "num_heads": 4, "train_len": 512, **kwargs}
    with pytest.raises(ValueError, match=match):
        FoPE(**args)


def test_bad_tensors():
    enc = _fope(16, num_kv_heads=2)
    q, k = torch.randn(1, 4, 5, 16), torch.randn(1, 2, 5, 16)
    pos = torch.arange(5)
    with pytest.raises(ValueError, match=r"q\.shape\[-3\]=2 is invalid: expected num_heads = 4"):
        enc.rotate(k, k, pos, pos)
    with pytest.raises(ValueError, match=r"k\.shape\[-3\]=3 is invalid: expected one of \[2, 4\]"):
        enc.rotate(q, torch.randn(1, 3, 5, 16), pos, pos)
    with pytest.raises(ValueError, match=r"q\.shape\[-1\]=8"):
        enc.rotate(q[..., :8], k[..., :8], pos, pos)
    with pytest.raises(ValueError, match=r"positions\.shape=\(4,\)"):
        enc.rotate(q, k, pos[:4], pos)
    with pytest.raises(ValueError, match=r"x\.shape\[-3\]=3 is invalid: expected a multiple of the 2 coefficient"):
        enc.rotate_one(torch.randn(1, 3, 5, 16), pos)
    cos, sin = enc.cos_sin(pos)
    with pytest.raises(ValueError, match=r"sin_coef\.shape=\(2, 3, 3\)"):
        fope_cos_sin(pos, enc.inv_freq, enc.cos_coef, enc.sin_coef[:, :3, :3], pairs=8)
    with pytest.raises(ValueError, match=r"pairs=2 is invalid"):
        fope_cos_sin(pos, enc.inv_freq, enc.cos_coef, enc.sin_coef, pairs=2)
    with pytest.raises(ValueError, match=r"dtype=torch\.float16"):
        fope_cos_sin(pos, enc.inv_freq, enc.cos_coef, enc.sin_coef, pairs=8, dtype=torch.float16)
    with pytest.raises(ValueError, match=r"layout='x'"):
        apply_fope(q, cos, sin, layout="x")
