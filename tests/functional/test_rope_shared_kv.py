"""DeepSeek-V4's RoPE (``posenc.functional.rope_shared_kv``) against transformers' ``deepseek_v4`` pieces built from a
tiny config -- its rotary module and rotation, the HCA compressor's positions and mask, whole attention layers (a
sliding one and a heavily compressed one) -- and against the float64 reference ``tests/reference/deepseek_v4_rope.py``;
the output rotated back makes it depend on relative positions only."""

from __future__ import annotations

import logging

import pytest
import torch
from torch.testing import assert_close

pytest.importorskip("transformers")

from transformers import DeepseekV4Config  # noqa: E402 - after the skip
from transformers.models.deepseek_v4 import modeling_deepseek_v4 as v4  # noqa: E402

from hf_oracle import angle_atol  # noqa: E402
from posenc.functional import (  # noqa: E402
    apply_rotary_tail,
    compressed_positions,
    compressed_visible,
    rope_cos_sin,
    shared_kv_rope_attention,
)
from posenc.hf import rotary_config_from_hf  # noqa: E402
from posenc.scalings import rope_frequencies  # noqa: E402
from reference import deepseek_v4_rope as ref  # noqa: E402

logging.getLogger("transformers").setLevel(logging.ERROR)

RATE, WINDOW, S = 8, 8, 28  # HCA entries of 8 tokens, an 8-token sliding window, 28 tokens: 3 complete entries


def _config() -> DeepseekV4Config:
    """Head dim 16 of which the last 8 channels rotate (``partial_rotary_factor`` 0.5); sliding layers at base 1e4,
    the compressed ones YaRN x4 over 16 at 1.6e5 with the attention factor 1 DeepSeek-V4 forces."""
    config = DeepseekV4Config(
        hidden_size=32, num_attention_heads=4, head_dim=16, partial_rotary_factor=0.5, q_lora_rank=16, o_groups=2,
        o_lora_rank=8, num_hidden_layers=2, layer_types=["sliding_attention", "heavily_compressed_attention"],
        compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": RATE}, sliding_window=WINDOW,
        index_n_heads=2, index_head_dim=8, index_topk=4, n_routed_experts=4, num_experts_per_tok=2,
        moe_intermediate_size=16, vocab_size=64, max_position_embeddings=64,
        rope_parameters={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16},
    )
    config._attn_implementation = "eager"
    return config


def _frequencies(config, rope: str) -> tuple[torch.Tensor, float]:
    """posenc's reading of the config's ``rope_parameters[rope]`` ("main" or "compress")."""
    setup = rotary_config_from_hf(config, layer_type=rope)
    return rope_frequencies(setup.head_dim, base=setup.base, scaling=setup.scaling,
                            partial_rotary_factor=setup.partial_rotary_factor)


@pytest.mark.parametrize("rope", ["main", "compress"])
def test_the_config_is_read_as_its_rotary_module_builds_it(rope):
    config = _config()
    rotary = v4.DeepseekV4RotaryEmbedding(config)
    inv_freq, factor = _frequencies(config, rope)
    assert_close(inv_freq, getattr(rotary, f"{rope}_inv_freq"), rtol=2e-6, atol=0)
    assert factor == getattr(rotary, f"{rope}_attention_scaling") == 1.0
    assert rotary_config_from_hf(config, layer_type=rope).rotary_dim == 8


@pytest.mark.parametrize("rope", ["main", "compress"])
@pytest.mark.parametrize("inverse", [False, True])
def test_the_rotation_is_transformers(rope, inverse):
    """On the last 8 of 16 channels, interleaved; ``inverse`` is transformers' ``apply_rotary_pos_emb(x, cos, -sin)``
    (and vLLM's ``inverse=True``). HF computes the angles in float32, posenc in float64: ``angle_atol``."""
    config = _config()
    rotary = v4.DeepseekV4RotaryEmbedding(config)
    x = torch.randn(2, 4, S, 16)  # (B, H, S, D)
    positions = torch.arange(100, 100 + S).expand(2, S)
    cos, sin = rotary(x, position_ids=positions, layer_type=rope)  # (B, S, F)
    want = v4.apply_rotary_pos_emb(x, cos, -sin if inverse else sin)
    inv_freq, factor = _frequencies(config, rope)
    c, s = rope_cos_sin(positions, inv_freq, attention_factor=factor)
    got = apply_rotary_tail(x, c.unsqueeze(1), s.unsqueeze(1), inverse=inverse)
    assert_close(got, want, rtol=0, atol=angle_atol(100 + S, x))
    assert torch.equal(got[..., :8], x[..., :8])  # the nope channels pass through


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_rotation_is_the_float64_reference_and_inverse_undoes_it(dtype):
    x = torch.randn(3, 5, 24, dtype=dtype)
    positions = torch.tensor([0, 3, 17, 1000, 65535])
    inv_freq = 1.0 / 1e4 ** (torch.arange(0, 12, 2, dtype=torch.float64) / 12)
    c, s = rope_cos_sin(positions, inv_freq, dtype=torch.float64)
    got = apply_rotary_tail(x, c.to(dtype), s.to(dtype))
    want = ref.rotate_tail(x, *ref.tables(positions, inv_freq))
    tol = {"rtol": 0, "atol": 1e-12} if dtype == torch.float64 else {"rtol": 0, "atol": 4 * 2**-24 * 4}
    assert_close(got.double(), want, **tol)
    assert_close(apply_rotary_tail(got, c.to(dtype), s.to(dtype), inverse=True).double(), x.double(), **tol)


def test_compressed_entries_are_rotated_at_their_windows_first_position():
    """The HCA compressor's output == its pooling, rotated by posenc at ``compressed_positions``; its block mask ==
    ``compressed_visible``."""
    config = _config()
    torch.manual_seed(0)
    compressor = v4.DeepseekV4HCACompressor(config)
    torch.nn.init.normal_(compressor.position_bias)
    hidden = torch.randn(2, S, 32)
    positions = torch.arange(S).expand(2, S)
    with torch.no_grad():
        got, block_bias = compressor(hidden, None, positions, None, 0)  # (B, 1, 3, D), (B, 1, S, 3)
        kv = compressor.kv_proj(hidden)[:, : 3 * RATE].view(2, 3, RATE, -1)
        gate = compressor.gate_proj(hidden)[:, : 3 * RATE].view(2, 3, RATE, -1) + compressor.position_bias
        pooled = compressor.kv_norm((kv * gate.softmax(dim=2)).sum(dim=2))  # (B, 3, D), not rotated yet
    where = compressed_positions(3, rate=RATE)
    assert where.tolist() == ref.compressed_positions(3, RATE).tolist() == [0, 8, 16]
    c, s = rope_cos_sin(where, *_frequencies(config, "compress")[:1])
    assert_close(apply_rotary_tail(pooled, c, s).unsqueeze(1), got, rtol=0, atol=angle_atol(16, pooled))
    visible = compressed_visible(positions[0], 3, rate=RATE)  # (S, 3)
    assert torch.equal(visible, ref.compressed_visible(positions[0], 3, RATE))
    assert torch.equal(block_bias[0, 0] == 0, visible) and visible.sum().item() == 8 + 2 * 8 + 3 * 5
    assert compressed_positions(2, rate=4, start=12).tolist() == [12, 16]
    assert compressed_visible(torch.tensor([14, 15, 19]), 2, rate=4, start=12).tolist() == [
        [False, False], [True, False], [True, True]
    ]


def _window_mask(length: int) -> torch.Tensor:
    """Causal, the ``WINDOW`` most recent keys (the query's own included): ``p - WINDOW < k <= p``."""
    p, k = torch.arange(length)[:, None], torch.arange(length)[None, :]
    return (k <= p) & (p - k < WINDOW)


@pytest.mark.parametrize("layer", [0, 1], ids=["sliding", "heavily_compressed"])
def test_a_transformers_attention_layer_is_its_projections_around_posenc(layer):
    """``DeepseekV4Attention.forward``'s output == the module's own projections and norms around
    ``shared_kv_rope_attention`` (and, for the compressed layer, its compressor's pooling rotated by
    ``apply_rotary_tail`` at ``compressed_positions``, seen as ``compressed_visible`` says)."""
    config = _config()
    torch.manual_seed(layer)
    attention = v4.DeepseekV4Attention(config, layer).eval()
    torch.nn.init.normal_(attention.sinks)
    rope = "main" if layer == 0 else "compress"
    inv_freq, factor = _frequencies(config, rope)
    rotary = v4.DeepseekV4RotaryEmbedding(config)
    hidden = torch.randn(2, S, 32)
    positions = torch.arange(S).expand(2, S)
    window = _window_mask(S)
    additive = torch.zeros(S, S).masked_fill(~window, float("-inf")).expand(2, 1, S, S)
    embeddings = {kind: rotary(hidden, position_ids=positions, layer_type=kind) for kind in ("main", "compress")}
    with torch.no_grad():
        if attention.compressor is not None:
            torch.nn.init.normal_(attention.compressor.position_bias)
        want, _ = attention(hidden, embeddings, positions, additive)

        q = attention.q_b_norm(attention.q_b_proj(attention.q_a_norm(attention.q_a_proj(hidden))).view(2, S, 4, 16))
        kv = attention.kv_norm(attention.kv_proj(hidden)).view(2, S, 1, 16)
        q, kv = q.transpose(1, 2), kv.transpose(1, 2)  # (B, H, S, D), (B, 1, S, D)
        kv_positions, mask = torch.arange(S), window
        if attention.compressor is not None:  # three entries of 8 tokens, pooled by the compressor's weights
            comp = attention.compressor
            ckv = comp.kv_proj(hidden)[:, : 3 * RATE].view(2, 3, RATE, -1)
            gate = comp.gate_proj(hidden)[:, : 3 * RATE].view(2, 3, RATE, -1) + comp.position_bias
            pooled = comp.kv_norm((ckv * gate.softmax(dim=2)).sum(dim=2)).unsqueeze(1)  # (B, 1, 3, D)
            kv = torch.cat((kv, pooled), dim=2)
            kv_positions = torch.cat((kv_positions, compressed_positions(3, rate=RATE)))
            mask = torch.cat((mask, compressed_visible(torch.arange(S), 3, rate=RATE)), dim=-1)
        out = shared_kv_rope_attention(q, kv, torch.arange(S), kv_positions, inv_freq, attention_factor=factor,
                                       mask=mask, sinks=attention.sinks, scale=attention.scaling)
        grouped = out.transpose(1, 2).reshape(2, S, config.o_groups, -1)
        got = attention.o_b_proj(attention.o_a_proj(grouped).flatten(2))
    assert not torch.allclose(embeddings["main"][0], embeddings["compress"][0])  # the two ropes differ here
    assert_close(got, want, rtol=1e-5, atol=1e-5)


def _random_case(seed: int, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2, 4, 6, 16, generator=g, dtype=dtype)
    kv = torch.randn(2, 1, 9, 16, generator=g, dtype=dtype)
    q_pos = torch.tensor([3, 4, 5, 6, 7, 8])
    kv_pos = torch.tensor([0, 1, 2, 3, 4, 5, 6, 7, 8])
    mask = kv_pos[None, :] <= q_pos[:, None]
    sinks = torch.randn(4, generator=g, dtype=dtype)
    inv_freq = 1.0 / 1.6e5 ** (torch.arange(0, 8, 2, dtype=torch.float64) / 8)
    return q, kv, q_pos, kv_pos, mask, sinks, inv_freq


def test_the_composition_is_the_float64_reference():
    q, kv, q_pos, kv_pos, mask, sinks, inv_freq = _random_case(1)
    got = shared_kv_rope_attention(q, kv, q_pos, kv_pos, inv_freq, mask=mask, sinks=sinks, scale=0.3)
    want = ref.shared_kv_attention(q, kv, q_pos, kv_pos, inv_freq, mask=mask, scale=0.3, sinks=sinks)
    assert_close(got, want, rtol=0, atol=1e-12)
    # float32 inputs: the same within float32 rounding; batch positions (B, S) broadcast per row
    got32 = shared_kv_rope_attention(q.float(), kv.float(), q_pos.expand(2, 6), kv_pos.expand(2, 9), inv_freq.float(),
                                     mask=mask, sinks=sinks.float(), scale=0.3)
    assert got32.dtype == torch.float32
    assert_close(got32.double(), want, rtol=0, atol=1e-5)


def test_rotating_the_output_back_leaves_only_relative_positions():
    """Shifting every position by the same amount changes nothing (the scores and, through the rotation back, the
    values see only ``p_k - p_q``); without the rotation back, the values would carry their absolute position."""
    q, kv, q_pos, kv_pos, mask, sinks, inv_freq = _random_case(2)
    base = shared_kv_rope_attention(q, kv, q_pos, kv_pos, inv_freq, mask=mask, sinks=sinks)
    shifted = shared_kv_rope_attention(q, kv, q_pos + 5000, kv_pos + 5000, inv_freq, mask=mask, sinks=sinks)
    assert_close(shifted, base, rtol=0, atol=1e-9)
    c, s = rope_cos_sin(q_pos + 5000, inv_freq, dtype=torch.float64)
    c0, s0 = rope_cos_sin(q_pos, inv_freq, dtype=torch.float64)
    unrotated, unrotated_shifted = apply_rotary_tail(base, c0, s0), apply_rotary_tail(shifted, c, s)
    assert not torch.allclose(unrotated, unrotated_shifted)  # the absolute position is in the raw output


def test_bfloat16_inputs_are_computed_in_float32_and_returned_in_bfloat16():
    q, kv, q_pos, kv_pos, mask, sinks, inv_freq = _random_case(3, torch.float32)
    want = shared_kv_rope_attention(q.bfloat16().float(), kv.bfloat16().float(), q_pos, kv_pos, inv_freq, mask=mask)
    got = shared_kv_rope_attention(q.bfloat16(), kv.bfloat16(), q_pos, kv_pos, inv_freq, mask=mask)
    assert got.dtype == torch.bfloat16
    assert_close(got, want.bfloat16(), rtol=0, atol=0)


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda x, c: apply_rotary_tail(x, c, c, layout="neox"), r"layout='neox' is invalid"),
        (lambda x, c: apply_rotary_tail(x[..., :4], c, c), r"x.shape\[-1\]=4 is invalid: expected >= 2 \* cos"),
        (lambda x, c: apply_rotary_tail(x, c, c[..., :2]), r"sin.shape=\(3, 2\) is invalid"),
        (lambda x, c: apply_rotary_tail(x, c, c, inverse=1), r"inverse=1 is invalid: expected True or False"),
        (lambda x, c: compressed_positions(-1, rate=4), r"count=-1 is invalid"),
        (lambda x, c: compressed_positions(2, rate=0), r"rate=0 is invalid: expected a positive integer"),
        (lambda x, c: compressed_visible(torch.tensor([1.5]), 2, rate=4), r"q_positions.dtype=torch.float32"),
    ],
)
def test_bad_arguments_name_the_parameter(call, match):
    with pytest.raises(ValueError, match=match):
        call(torch.randn(3, 8), torch.randn(3, 3))


def test_bad_attention_arguments_name_the_parameter():
    q, kv, q_pos, kv_pos, mask, sinks, inv_freq = _random_case(4)
    with pytest.raises(ValueError, match=r"kv.shape\[1\]=3 is invalid: expected a divisor of the 4 query heads"):
        shared_kv_rope_attention(q, kv.expand(2, 3, 9, 16), q_pos, kv_pos, inv_freq)
    with pytest.raises(ValueError, match=r"kv_positions.shape=\(8,\) is invalid: expected \(9,\) or \(B, 9\)"):
        shared_kv_rope_attention(q, kv, q_pos, kv_pos[:8], inv_freq)
    with pytest.raises(ValueError, match=r"mask.dtype=torch.float64 is invalid: expected torch.bool"):
        shared_kv_rope_attention(q, kv, q_pos, kv_pos, inv_freq, mask=mask.double())
    with pytest.raises(ValueError, match=r"sinks.shape=\(3,\) is invalid: expected \(4,\)"):
        shared_kv_rope_attention(q, kv, q_pos, kv_pos, inv_freq, sinks=sinks[:3])
