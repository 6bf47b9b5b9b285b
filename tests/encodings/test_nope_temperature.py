"""NoPETemperature == transformers' Llama 4 NoPE layers (attention temperature tuning), on full tensors."""

import copy
import math

import pytest
import torch
from torch.testing import assert_close
from transformers import DynamicCache, Llama4TextConfig
from transformers.models.llama4 import modeling_llama4

import posenc
from encoding_cases import attention_tol
from posenc.functional import apply_temperature, attention_temperature
from tolerances import like_reference_atol

B, S, H, HKV, D = 2, 12, 4, 2, 8
FLOOR, STRENGTH = 4, 0.5  # small floor_scale so the temperature changes inside a short test sequence


def _llama4_nope_attention(dtype=torch.float32, **overrides):
    """Transformers' Llama 4 text attention for layer 4 of 4, a NoPE layer (no_rope_layers = [1, 1, 1, 0])."""
    config = Llama4TextConfig(
        hidden_size=H * D, num_attention_heads=H, num_key_value_heads=HKV, head_dim=D, num_hidden_layers=4,
        intermediate_size=64, intermediate_size_mlp=64, vocab_size=100, floor_scale=FLOOR, attn_scale=STRENGTH,
        **overrides,
    )
    config._attn_implementation = "eager"
    torch.manual_seed(1)
    layer = modeling_llama4.Llama4TextAttention(config, layer_idx=3).to(dtype).eval()
    assert not layer.use_rope
    return layer


def _posenc_attention(layer, x, encoding, q_positions, k_positions, k=None, v=None):
    """The same layer written with posenc: projections from the HF module, positions through ``encoding``."""
    b, s, _ = x.shape
    q = layer.q_proj(x).view(b, s, H, D).transpose(1, 2)  # (B, H, S, D)
    k_new = layer.k_proj(x).view(b, s, HKV, D).transpose(1, 2)  # (B, Hkv, S, D)
    v_new = layer.v_proj(x).view(b, s, HKV, D).transpose(1, 2)
    k = k_new if k is None else torch.cat([k, k_new], dim=2)
    v = v_new if v is None else torch.cat([v, v_new], dim=2)
    y = posenc.attention(
        q, k, v, encoding=encoding, q_positions=q_positions, k_positions=k_positions, causal=True, backend="eager"
    )
    return layer.o_proj(y.transpose(1, 2).reshape(b, s, H * D)), k, v


def _causal_mask(s):
    return torch.full((s, s), float("-inf")).triu(1)[None, None]  # (1, 1, S, S) additive


@torch.no_grad()
def test_equals_llama4_nope_layer_forward():
    layer = _llama4_nope_attention()
    x = torch.randn(B, S, H * D)
    want, _ = layer(x, None, _causal_mask(S))
    exact, _ = copy.deepcopy(layer).double()(x.double(), None, _causal_mask(S).double())
    encoding = posenc.build("nope_temperature", floor_scale=FLOOR, attn_scale=STRENGTH)
    got, _, _ = _posenc_attention(layer, x, encoding, torch.arange(S), torch.arange(S))
    assert_close(got.double(), exact, rtol=0, atol=like_reference_atol(want, exact))
    plain, _, _ = _posenc_attention(layer, x, posenc.NoPE(), torch.arange(S), torch.arange(S))
    assert not torch.allclose(plain, want, atol=1e-4)  # the temperature matters at these positions


@torch.no_grad()
def test_equals_llama4_decoding_with_a_kv_cache():
    """Transformers places the new queries after the cached tokens; posenc is given those positions explicitly."""
    layer = _llama4_nope_attention()
    x = torch.randn(B, S, H * D)
    cache, cache64, layer64 = DynamicCache(), DynamicCache(), copy.deepcopy(layer).double()
    encoding = posenc.NoPETemperature(floor_scale=FLOOR, attn_scale=STRENGTH)
    k = v = None
    for start, stop in [(0, 7), (7, 8), (8, 12)]:
        mask = torch.zeros(1, 1, stop - start, stop)  # the cached keys visible, causal among the new ones
        mask[..., start:] = _causal_mask(stop - start)
        want, _ = layer(x[:, start:stop], None, mask, cache=cache)
        exact, _ = layer64(x[:, start:stop].double(), None, mask.double(), cache=cache64)
        got, k, v = _posenc_attention(
            layer, x[:, start:stop], encoding, torch.arange(start, stop), torch.arange(stop), k, v
        )
        assert_close(got.double(), exact, rtol=0, atol=like_reference_atol(want, exact))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_scaled_queries_are_llama4s_bit_for_bit(dtype, monkeypatch):
    """The queries transformers hands to its attention function, compared with rtol = atol = 0 in each dtype."""
    layer = _llama4_nope_attention(dtype)
    seen = {}
    original = modeling_llama4.eager_attention_forward

    def spy(module, query, key, value, *args, **kwargs):
        seen["q"], seen["k"] = query, key
        return original(module, query, key, value, *args, **kwargs)

    monkeypatch.setattr(modeling_llama4, "eager_attention_forward", spy)
    x = torch.randn(B, 40, H * D, dtype=dtype)
    with torch.no_grad():
        layer(x, None, None)
        q = layer.q_proj(x).view(B, 40, H, D).transpose(1, 2)
        k = layer.k_proj(x).view(B, 40, HKV, D).transpose(1, 2)
        encoding = posenc.NoPETemperature(floor_scale=FLOOR, attn_scale=STRENGTH)
        got_q, got_k = encoding.rotate(q, k, torch.arange(40), torch.arange(40))
    assert got_q.dtype == dtype and got_k is k
    assert_close(got_q, seen["q"], rtol=0, atol=0)
    assert_close(got_k, seen["k"], rtol=0, atol=0)


def test_batched_positions_scale_each_row_at_its_own_positions():
    q, k = torch.randn(B, H, 6, D), torch.randn(B, HKV, 6, D)
    rows = torch.stack([torch.arange(6), torch.arange(6) + 9])  # (B, S)
    encoding = posenc.NoPETemperature(floor_scale=FLOOR, attn_scale=STRENGTH)
    got, _ = encoding.rotate(q, k, rows, rows)
    for r in range(B):
        want, _ = encoding.rotate(q[r : r + 1], k[r : r + 1], rows[r], rows[r])
        assert_close(got[r : r + 1], want, rtol=0, atol=0)
    scale = attention_temperature(rows, floor_scale=FLOOR, attn_scale=STRENGTH)  # (B, S)
    assert_close(got, q * scale[:, None, :, None], rtol=0, atol=0)
    assert_close(apply_temperature(q[0, 0], rows[0], floor_scale=FLOOR, attn_scale=STRENGTH), got[0, 0])


def test_zero_strength_is_nope_and_keys_are_untouched():
    q, k = torch.randn(B, H, S, D), torch.randn(B, HKV, S, D)
    pos = torch.arange(S) * 1000
    rq, rk = posenc.NoPETemperature(floor_scale=1, attn_scale=0.0).rotate(q, k, pos, pos)
    assert torch.equal(rq, q) and rk is k


@pytest.mark.parametrize("backend", ["eager", "sdpa"])
def test_decode_and_chunks_equal_the_full_forward(backend):
    """The temperature reads each query's own position: one token at a time or in chunks, the same attention.

    (The registry-wide versions of these tests use Llama 4's floor_scale=8192, where short sequences see 1.)"""
    encoding = posenc.NoPETemperature(floor_scale=3, attn_scale=STRENGTH)
    q, k, v = torch.randn(B, H, 20, D), torch.randn(B, HKV, 20, D), torch.randn(B, HKV, 20, D)
    pos = torch.arange(20) + 5
    full = posenc.attention(q, k, v, encoding=encoding, q_positions=pos, k_positions=pos, backend=backend)
    steps = [
        posenc.attention(
            q[:, :, a:b], k[:, :, :b], v[:, :, :b], encoding=encoding, q_positions=pos[a:b], k_positions=pos[:b],
            backend=backend,
        )
        for a, b in [(0, 9), (9, 10), (10, 16), (16, 20)]
    ]
    assert_close(torch.cat(steps, dim=2), full, **attention_tol(q, k, v, encoding=encoding, k_positions=pos))
    nope = posenc.attention(q, k, v, encoding=posenc.NoPE(), q_positions=pos, k_positions=pos, backend=backend)
    assert not torch.allclose(nope, full, atol=1e-3)


def test_gradients_flow_through_the_scale():
    q = torch.randn(1, H, S, D, requires_grad=True)
    k = torch.randn(1, HKV, S, D)
    encoding = posenc.NoPETemperature(floor_scale=FLOOR, attn_scale=STRENGTH)
    rq, _ = encoding.rotate(q, k, torch.arange(S), torch.arange(S))
    rq.sum().backward()
    scale = attention_temperature(torch.arange(S), floor_scale=FLOOR, attn_scale=STRENGTH)
    assert_close(q.grad, scale[:, None].expand(1, H, S, D), rtol=0, atol=0)


def test_config_round_trip_and_build():
    encoding = posenc.build("nope_temperature", dim=32, num_heads=4, head_dim=8, max_len=16, floor_scale=64)
    assert isinstance(encoding, posenc.NoPETemperature)
    assert encoding.config == posenc.NoPETemperatureConfig(floor_scale=64, attn_scale=0.1)
    assert posenc.NoPETemperature.from_config(encoding.config.to_dict()).config == encoding.config
    assert encoding.position_kind == "sequence" and not encoding.has_bias
    assert "floor_scale=64" in repr(encoding)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"floor_scale": 0}, r"floor_scale=0 is invalid: expected a number > 0"),
        ({"floor_scale": math.inf}, r"floor_scale=inf is invalid: expected a finite number"),
        ({"attn_scale": -0.1}, r"attn_scale=-0.1 is invalid: expected a number >= 0"),
        ({"attn_scale": math.nan}, r"attn_scale=nan is invalid"),
    ],
)
def test_config_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        posenc.NoPETemperature(**kwargs)
    with pytest.raises(ValueError, match=match):
        attention_temperature(torch.arange(4), **kwargs)


def test_input_errors():
    encoding = posenc.NoPETemperature()
    q, k = torch.randn(1, H, 4, D), torch.randn(1, HKV, 4, D)
    with pytest.raises(ValueError, match=r"^positions\.shape=\(5,\) is invalid"):
        encoding.rotate(q, k, torch.arange(5), torch.arange(4))
    with pytest.raises(ValueError, match=r"^k_positions\.shape=\(3,\) is invalid"):
        encoding.rotate(q, k, torch.arange(4), torch.arange(3))
    with pytest.raises(ValueError, match=r"^positions\.dtype=torch\.bfloat16 is invalid"):
        encoding.rotate(q, k, torch.arange(4).bfloat16(), torch.arange(4))
    with pytest.raises(ValueError, match=r"^positions\[2\]=nan is invalid"):
        encoding.rotate(q, k, torch.tensor([0.0, 1.0, math.nan, 3.0]), torch.arange(4))
    with pytest.raises(ValueError, match=r"^q=.* is invalid: expected a floating point tensor"):
        apply_temperature(torch.ones(4, 8, dtype=torch.long), torch.arange(4))
