"""``ShawRelative`` against the paper's formulas (``tests/reference/shaw.py``), score_mod == bias, properties."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch.nn.attention.flex_attention import flex_attention
from torch.testing import assert_close

from posenc.encodings.shaw import ShawRelative, ShawRelativeConfig
from posenc.registry import build
from reference import shaw as ref


def eager_attention(enc, q, k, v, q_pos, k_pos, *, scale, mask=None):
    """softmax(q k^T * scale + bias) v + value_term: how ``posenc.attention``'s eager backend combines the hooks."""
    scores = q @ k.transpose(-1, -2) * scale + enc.bias(q_pos, k_pos, q=q, scale=scale)  # (B, H, S, T)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    extra = enc.value_term(weights, q_pos, k_pos)
    return weights @ v + (0 if extra is None else extra)


def double_shaw(head_dim, max_distance, values=True):
    return ShawRelative(head_dim, max_distance=max_distance, values=values).double()


def qkv(b, h, s, t, d, dtype=torch.float64):
    return tuple(torch.randn(b, h, n, d, dtype=dtype) for n in (s, t, t))


POSITIONS = {
    "arange": lambda b, s, t: (torch.arange(s), torch.arange(t)),
    "decode": lambda b, s, t: (torch.arange(t - s, t), torch.arange(t)),  # queries are the last keys
    "per_row": lambda b, s, t: (torch.randint(0, 50, (b, s)), torch.randint(0, 50, (b, t))),
    "packed": lambda b, s, t: (torch.tensor([0, 1, 2, 0, 1, 2, 3][:s]), torch.tensor([0, 1, 2, 0, 1, 2, 3, 4][:t])),
}


@pytest.mark.parametrize("values", [True, False])
@pytest.mark.parametrize("kind", sorted(POSITIONS))
@pytest.mark.parametrize(("head_dim", "max_distance"), [(4, 1), (8, 3), (16, 16)])
def test_attention_matches_paper(kind, head_dim, max_distance, values):
    b, h, s, t = 2, 3, 6, 8
    enc = double_shaw(head_dim, max_distance, values)
    q, k, v = qkv(b, h, s, t, head_dim)
    q_pos, k_pos = POSITIONS[kind](b, s, t)
    got = eager_attention(enc, q, k, v, q_pos, k_pos, scale=0.4)
    w_v = enc.relative_values.detach() if values else None
    want = ref.attention(q, k, v, q_pos, k_pos, enc.relative_keys.detach(), w_v, scale=0.4)
    assert_close(got, want)


def test_causal_attention_matches_paper_and_gradients_too():
    b, h, s, d = 1, 2, 7, 8
    enc = double_shaw(d, 2)
    q, k, v = (x.requires_grad_() for x in qkv(b, h, s, s, d))
    pos = torch.arange(s) * 2
    mask = torch.ones(s, s, dtype=torch.bool).tril()
    got = eager_attention(enc, q, k, v, pos, pos, scale=d**-0.5, mask=mask)
    want = ref.attention(q, k, v, pos, pos, enc.relative_keys, enc.relative_values, scale=d**-0.5, mask=mask)
    assert_close(got, want)
    grad_out = torch.randn_like(got)
    inputs = (q, k, v, enc.relative_keys, enc.relative_values)
    for g, w in zip(
        torch.autograd.grad(got, inputs, grad_out), torch.autograd.grad(want, inputs, grad_out), strict=True
    ):
        assert_close(g, w)


@pytest.mark.parametrize("kind", sorted(POSITIONS))
def test_bias_and_value_term_match_paper(kind):
    b, h, s, t, d = 2, 3, 6, 8, 8
    enc = double_shaw(d, 3)
    q = torch.randn(b, h, s, d, dtype=torch.float64)
    q_pos, k_pos = POSITIONS[kind](b, s, t)
    weights = torch.softmax(torch.randn(b, h, s, t, dtype=torch.float64), dim=-1)
    w_k, w_v = enc.relative_keys.detach(), enc.relative_values.detach()
    assert_close(enc.bias(q_pos, k_pos, q=q, scale=0.3), ref.key_bias(q, q_pos, k_pos, w_k, 0.3))
    assert_close(enc.bias(q_pos, k_pos, q=q), ref.key_bias(q, q_pos, k_pos, w_k, d**-0.5))
    assert_close(enc.value_term(weights, q_pos, k_pos), ref.value_term(weights, q_pos, k_pos, w_v))


def broadcast_indices(b, h, s, t):
    return (
        torch.arange(b).view(b, 1, 1, 1),
        torch.arange(h).view(1, h, 1, 1),
        torch.arange(s).view(1, 1, s, 1),
        torch.arange(t).view(1, 1, 1, t),
    )


@pytest.mark.parametrize("kind", sorted(POSITIONS))
def test_score_mod_equals_bias_broadcast(kind):
    b, h, s, t, d = 2, 3, 6, 8, 8
    enc = ShawRelative(d, max_distance=2)
    q = torch.randn(b, h, s, d)
    q_pos, k_pos = POSITIONS[kind](b, s, t)
    fn = enc.score_mod(q_pos, k_pos, q=q, scale=0.3)
    got = fn(torch.zeros(b, h, s, t), *broadcast_indices(b, h, s, t))
    assert torch.equal(got, enc.bias(q_pos, k_pos, q=q, scale=0.3))


def test_score_mod_in_compiled_flex_attention():
    # qk head dim >= 24: torch 2.13's compiled CPU FlexAttention is wrong at 16 and below on AVX2-only CPUs
    b, h, s, t, d = 2, 3, 37, 45, 32
    enc = ShawRelative(d, max_distance=4, values=False)
    q, k, v = qkv(b, h, s, t, d, torch.float32)
    q_pos, k_pos = torch.randint(0, 100, (b, s)), torch.arange(t)
    with torch.no_grad():
        fn = enc.score_mod(q_pos, k_pos, q=q, scale=0.3)
        got = torch.compile(flex_attention, dynamic=False)(q, k, v, score_mod=fn, scale=0.3)
        want = eager_attention(enc, q, k, v, q_pos, k_pos, scale=0.3)
    assert_close(got, want)


@given(st.integers(1, 8), st.integers(1, 8), st.integers(-(10**6), 10**6), st.integers(1, 4), st.integers(0, 2**31 - 1))
def test_bias_depends_on_distance_only(s, t, shift, max_distance, seed):
    gen = torch.Generator().manual_seed(seed)
    q_pos, k_pos = torch.randint(-20, 20, (s,), generator=gen), torch.randint(-20, 20, (t,), generator=gen)
    q = torch.randn(2, 2, s, 4, generator=gen, dtype=torch.float64)
    weights = torch.rand(2, 2, s, t, generator=gen, dtype=torch.float64)
    enc = double_shaw(4, max_distance)
    assert torch.equal(enc.bias(q_pos + shift, k_pos + shift, q=q), enc.bias(q_pos, k_pos, q=q))
    assert torch.equal(enc.value_term(weights, q_pos + shift, k_pos + shift), enc.value_term(weights, q_pos, k_pos))


@given(st.integers(1, 3), st.integers(1, 8), st.integers(1, 8), st.integers(0, 2**31 - 1))
def test_shared_positions_equal_batched_positions(b, s, t, seed):
    gen = torch.Generator().manual_seed(seed)
    q_pos, k_pos = torch.randint(0, 30, (s,), generator=gen), torch.randint(0, 30, (t,), generator=gen)
    q = torch.randn(b, 2, s, 8, generator=gen)
    weights = torch.rand(b, 2, s, t, generator=gen)
    enc = ShawRelative(8, max_distance=3)
    shared, batched = enc.bias(q_pos, k_pos, q=q), enc.bias(q_pos.expand(b, s), k_pos.expand(b, t), q=q)
    assert shared.shape == (b, 2, s, t) and shared.dtype == torch.float32
    assert torch.equal(shared, batched)
    values = enc.value_term(weights, q_pos, k_pos)
    assert values.shape == (b, 2, s, 8)
    assert torch.equal(values, enc.value_term(weights, q_pos[None], k_pos.expand(b, t)))


def test_gradients_reach_both_tables():
    enc = ShawRelative(8, max_distance=2)
    q, k, v = (x.requires_grad_() for x in qkv(2, 2, 5, 5, 8, torch.float32))
    pos = torch.arange(5)
    eager_attention(enc, q, k, v, pos, pos, scale=0.35).square().sum().backward()
    for p in (enc.relative_keys, enc.relative_values, q):
        assert p.grad is not None and p.grad.abs().sum() > 0


def test_values_false_has_no_value_term():
    enc = ShawRelative(8, max_distance=2, values=False)
    assert enc.has_bias and not enc.has_value_term and enc.relative_values is None
    assert [n for n, _ in enc.named_parameters()] == ["relative_keys"]
    assert enc.value_term(torch.rand(1, 1, 3, 3), torch.arange(3), torch.arange(3)) is None
    assert ShawRelative(8).has_value_term and not ShawRelative.has_value_term


def test_registry_config_round_trip_and_meta_build():
    enc = build("shaw", head_dim=16, num_heads=4, dim=64, max_distance=5)
    assert isinstance(enc, ShawRelative) and enc.relative_keys.shape == enc.relative_values.shape == (11, 16)
    assert enc.config.to_dict() == dict(head_dim=16, max_distance=5, values=True)
    assert ShawRelative.from_config(enc.config.to_dict()).config == enc.config
    with torch.device("meta"):
        assert ShawRelative(8).relative_keys.is_meta


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(head_dim=0), "head_dim=0"),
        (dict(head_dim=8, max_distance=0), "max_distance=0"),
        (dict(head_dim=8, max_distance=2.5), "max_distance=2.5"),
        (dict(head_dim=8, values=1), "values=1"),
    ],
)
def test_bad_config(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ShawRelative(**kwargs)
    with pytest.raises(ValueError, match=match):
        ShawRelativeConfig(**kwargs)


def test_bad_inputs():
    enc = ShawRelative(8, max_distance=2)
    q = torch.randn(2, 2, 4, 8)
    pos = torch.arange(4)
    with pytest.raises(ValueError, match=r"q=None is invalid"):
        enc.bias(pos, pos)
    with pytest.raises(ValueError, match=r"q=None is invalid"):
        enc.score_mod(pos, pos)
    with pytest.raises(ValueError, match=r"q\.shape\[-1\]=4 is invalid"):
        enc.bias(pos, pos, q=torch.randn(2, 2, 4, 4))
    with pytest.raises(ValueError, match=r"q_pos\.dtype=torch\.float32 is invalid"):
        enc.bias(pos.float(), pos, q=q)
    with pytest.raises(ValueError, match=r"k_pos\.dtype=torch\.float64 is invalid"):
        enc.score_mod(pos, pos.double(), q=q)
    with pytest.raises(ValueError, match=r"q_pos\.shape=\(5,\) is invalid"):
        enc.score_mod(torch.arange(5), pos, q=q)
    with pytest.raises(ValueError, match=r"k_pos\.shape=\(3, 4\) is invalid"):
        enc.bias(pos, pos.expand(3, 4), q=q)
    with pytest.raises(ValueError, match=r"weights\.shape"):
        enc.value_term(torch.rand(4, 4), pos, pos)
    with pytest.raises(ValueError, match=r"k_pos\.shape=\(4,\) is invalid"):
        enc.value_term(torch.rand(2, 2, 4, 5), pos, pos)
    with pytest.raises(ValueError, match=r"k_positions\.dtype"):
        enc.check_positions(pos.float(), 4, 2, "k_positions")
