"""``T5Bias`` against Hugging Face's ``T5Attention`` (weights copied), plus score_mod == bias and properties."""

import logging

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch.nn.attention.flex_attention import flex_attention
from torch.testing import assert_close
from transformers import T5Config
from transformers.models.t5.modeling_t5 import T5Attention

from posenc.encodings.t5 import T5Bias, T5BiasConfig
from posenc.functional.relative import t5_relative_position_bucket
from posenc.registry import build

logging.getLogger("transformers").setLevel(logging.ERROR)  # a decoder T5Attention without layer_idx warns


def hf_attention(heads, num_buckets, max_distance, is_decoder, d_kv=4):
    config = T5Config(
        d_model=heads * d_kv,
        d_kv=d_kv,
        num_heads=heads,
        relative_attention_num_buckets=num_buckets,
        relative_attention_max_distance=max_distance,
        is_decoder=is_decoder,
        dropout_rate=0.0,
    )
    config._attn_implementation = "eager"
    return T5Attention(config, has_relative_attention_bias=True, layer_idx=0).eval()


def from_hf(attn):
    """A T5Bias loading the HF layer's own state-dict entry, under the same name."""
    c = attn.config
    enc = T5Bias(
        c.num_heads,
        num_buckets=c.relative_attention_num_buckets,
        max_distance=c.relative_attention_max_distance,
        bidirectional=not c.is_decoder,
    )
    enc.load_state_dict({"relative_attention_bias.weight": attn.state_dict()["relative_attention_bias.weight"]})
    return enc


def broadcast_indices(b, h, s, t):
    return (
        torch.arange(b).view(b, 1, 1, 1),
        torch.arange(h).view(1, h, 1, 1),
        torch.arange(s).view(1, 1, s, 1),
        torch.arange(t).view(1, 1, 1, t),
    )


@pytest.mark.parametrize("is_decoder", [False, True])
@pytest.mark.parametrize(("num_buckets", "max_distance"), [(32, 128), (8, 16), (33, 300)])
@pytest.mark.parametrize(("s", "t", "past"), [(7, 7, 0), (150, 150, 0), (3, 200, 197), (1, 500, 499), (4, 9, 0)])
def test_bias_equals_hf_compute_bias(is_decoder, num_buckets, max_distance, s, t, past):
    """compute_bias(S, T, past_seen_tokens=p) puts queries at p .. p+S-1 and keys at 0 .. T-1."""
    attn = hf_attention(4, num_buckets, max_distance, is_decoder)
    enc = from_hf(attn)
    with torch.no_grad():
        want = attn.compute_bias(s, t, past_seen_tokens=past)
    got = enc.bias(torch.arange(s) + past, torch.arange(t))
    assert got.shape == want.shape == (1, 4, s, t)
    assert torch.equal(got, want)


def test_encoder_attention_equals_hf_forward():
    """A whole HF encoder self-attention layer: T5 adds the bias to unscaled scores (scale = 1.0)."""
    attn = hf_attention(4, 32, 128, is_decoder=False, d_kv=8).double()
    enc = from_hf(attn).double()
    x = torch.randn(2, 40, 32, dtype=torch.float64)
    with torch.no_grad():
        want = attn(x)[0]
        q, k, v = (proj(x).view(2, 40, 4, 8).transpose(1, 2) for proj in (attn.q, attn.k, attn.v))  # (B, H, S, D)
        pos = torch.arange(40)
        weights = torch.softmax(q @ k.transpose(-1, -2) * 1.0 + enc.bias(pos, pos, q=q, scale=1.0), dim=-1)
        got = attn.o((weights @ v).transpose(1, 2).reshape(2, 40, 32))
    assert_close(got, want)


POSITION_KINDS = ["shared", "one_row", "per_row", "decode"]


def positions(kind, b, s, t):
    if kind == "shared":
        return torch.arange(s) + 3, torch.arange(t)
    if kind == "one_row":
        return torch.arange(s)[None] * 7, torch.arange(t)[None] * 5
    if kind == "per_row":
        return torch.randint(0, 400, (b, s)), torch.randint(0, 400, (b, t))
    return torch.arange(t - s, t).expand(b, s), torch.arange(t)  # decoding: queries are the last keys


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("kind", POSITION_KINDS)
def test_score_mod_equals_bias_broadcast(kind, bidirectional):
    b, h, s, t = 2, 3, 5, 11
    enc = T5Bias(h, num_buckets=8, max_distance=20, bidirectional=bidirectional)
    q_pos, k_pos = positions(kind, b, s, t)
    fn = enc.score_mod(q_pos, k_pos)
    got = fn(torch.zeros(b, h, s, t), *broadcast_indices(b, h, s, t))
    want = enc.bias(q_pos, k_pos).expand(b, h, s, t)
    assert torch.equal(got, want)


def test_score_mod_in_compiled_flex_attention():
    # qk head dim >= 24: torch 2.13's compiled CPU FlexAttention is wrong at 16 and below on AVX2-only CPUs
    b, h, s, t, d = 2, 3, 37, 45, 32
    enc = T5Bias(h, num_buckets=8, max_distance=20)
    q, k, v = torch.randn(b, h, s, d), torch.randn(b, h, t, d), torch.randn(b, h, t, d)
    q_pos, k_pos = torch.randint(0, 300, (b, s)), torch.arange(t)
    with torch.no_grad():
        got = torch.compile(flex_attention, dynamic=False)(q, k, v, score_mod=enc.score_mod(q_pos, k_pos), scale=0.3)
        want = torch.softmax(q @ k.transpose(-1, -2) * 0.3 + enc.bias(q_pos, k_pos), dim=-1) @ v
    assert_close(got, want)


@given(st.integers(1, 9), st.integers(1, 9), st.integers(-(10**6), 10**6), st.integers(0, 2**31 - 1), st.booleans())
def test_bias_depends_on_distance_only(s, t, shift, seed, bidirectional):
    gen = torch.Generator().manual_seed(seed)
    q_pos, k_pos = torch.randint(-300, 300, (s,), generator=gen), torch.randint(-300, 300, (t,), generator=gen)
    enc = T5Bias(2, num_buckets=16, max_distance=64, bidirectional=bidirectional)
    assert torch.equal(enc.bias(q_pos + shift, k_pos + shift), enc.bias(q_pos, k_pos))


@given(st.integers(1, 3), st.integers(1, 9), st.integers(1, 9), st.integers(0, 2**31 - 1))
def test_shared_positions_equal_batched_positions(b, s, t, seed):
    gen = torch.Generator().manual_seed(seed)
    q_pos, k_pos = torch.randint(0, 500, (s,), generator=gen), torch.randint(0, 500, (t,), generator=gen)
    enc = T5Bias(3)
    shared = enc.bias(q_pos, k_pos)
    batched = enc.bias(q_pos.expand(b, s), k_pos.expand(b, t))
    assert shared.shape == (1, 3, s, t) and batched.shape == (b, 3, s, t) and shared.dtype == torch.float32
    assert torch.equal(batched, shared.expand(b, 3, s, t))


def test_gradients_reach_the_table():
    enc = T5Bias(4, num_buckets=8, max_distance=16)
    pos = torch.arange(30)
    grad_out = torch.randn(1, 4, 30, 30)
    (enc.bias(pos, pos) * grad_out).sum().backward()
    buckets = enc.relative_attention_bias.weight.new_zeros(8, 4)
    b = t5_relative_position_bucket(pos[None, :] - pos[:, None], num_buckets=8, max_distance=16)  # (S, T)
    # Each bucket's gradient is the sum of grad_out over the (i, j) pairs that read it.
    buckets.index_put_((b.flatten(),), grad_out[0].permute(1, 2, 0).reshape(-1, 4), accumulate=True)
    assert_close(enc.relative_attention_bias.weight.grad, buckets)


def test_low_precision_table_gives_float32_bias_and_builds_on_meta():
    enc = T5Bias(2).to(torch.bfloat16)
    pos = torch.arange(5)
    bias = enc.bias(pos, pos)
    assert bias.dtype == torch.float32
    assert torch.equal(bias, enc.float().bias(pos, pos))
    with torch.device("meta"):
        assert T5Bias(8).relative_attention_bias.weight.is_meta


def test_registry_and_config_round_trip():
    enc = build("t5", num_heads=4, head_dim=64, dim=256, num_buckets=16, bidirectional=False)
    assert isinstance(enc, T5Bias) and enc.has_bias and not enc.has_value_term
    assert enc.config.to_dict() == dict(num_heads=4, num_buckets=16, max_distance=128, bidirectional=False)
    again = T5Bias.from_config(enc.config.to_dict())
    assert again.config == enc.config == T5BiasConfig.from_dict(enc.config.to_dict())
    assert enc(torch.arange(3)).shape == (1, 4, 3, 3)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(num_heads=0), "num_heads=0"),
        (dict(num_heads=2, num_buckets=3), "num_buckets=3"),
        (dict(num_heads=2, num_buckets=1, bidirectional=False), "num_buckets=1"),
        (dict(num_heads=2, num_buckets=32, max_distance=8), "max_distance=8"),
        (dict(num_heads=2, max_distance=0), "max_distance=0"),
        (dict(num_heads=2, bidirectional="yes"), "bidirectional='yes'"),
        (dict(num_heads=2.0), "num_heads=2.0"),
    ],
)
def test_bad_config(kwargs, match):
    with pytest.raises(ValueError, match=match):
        T5Bias(**kwargs)
    with pytest.raises(ValueError, match=match):
        T5BiasConfig(**kwargs)


def test_bad_positions():
    enc = T5Bias(2)
    pos = torch.arange(4)
    with pytest.raises(ValueError, match=r"q_pos\.dtype=torch\.float32 is invalid"):
        enc.bias(pos.float(), pos)
    with pytest.raises(ValueError, match=r"k_pos\.dtype=torch\.float64 is invalid"):
        enc.score_mod(pos, pos.double())
    with pytest.raises(ValueError, match=r"q_pos\.shape=\(1, 1, 4\) is invalid"):
        enc.bias(pos.view(1, 1, 4), pos)
    with pytest.raises(ValueError, match=r"k_pos\.shape=\(3, 4\) is invalid"):
        enc.bias(pos.expand(2, 4), pos.expand(3, 4))
    with pytest.raises(ValueError, match=r"q_positions\.dtype"):
        enc.check_positions(pos.float(), 4, 1, "q_positions")
    with pytest.raises(ValueError, match=r"k_positions\.shape"):
        enc.check_positions(pos, 5, 1, "k_positions")
    with pytest.raises(ValueError, match=r"config\['heads'\]"):
        T5Bias.from_config({"heads": 2})
