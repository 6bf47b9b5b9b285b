"""RotaryEmbedding == Hugging Face (half layout), GPT-J and Meta llama (interleaved layout), on full tensors."""

import pytest
import torch
from transformers.models.gptj.modeling_gptj import apply_rotary_pos_emb as gptj_apply

import posenc
import posenc.hf
from hf_oracle import angle_atol, hf_config, hf_rotary, neox_apply
from posenc.hf import rotary_config_from_hf
from reference.meta_llama import apply_rotary_emb, precompute_freqs_cis

SCALINGS = {
    "default": ({}, 2048),
    "linear": ({"rope_type": "linear", "factor": 4.0}, 2048),
    "dynamic": ({"rope_type": "dynamic", "factor": 4.0}, 64),
    "yarn": ({"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 64, "beta_fast": 16}, 512),
    "yarn-deepseek": (
        {
            "rope_type": "yarn",
            "factor": 40.0,
            "mscale": 0.707,
            "mscale_all_dim": 0.707,
            "original_max_position_embeddings": 64,
        },
        2560,
    ),
    "llama3": (
        {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
        512,
    ),
}


def _longrope(dim):
    g = torch.Generator().manual_seed(3)
    short, long = (1 + 3 * torch.rand(2, dim // 2, generator=g)).tolist()
    return {"rope_type": "longrope", "short_factor": short, "long_factor": long, "original_max_position_embeddings": 64}


def _dict_for_posenc(params, max_pos):
    d = dict(params)
    if d.get("rope_type") in ("dynamic", "yarn", "longrope"):
        d["max_position_embeddings"] = max_pos
    return d


def _qk(b, s, d, dtype=torch.float32, h=4, hkv=2):
    return torch.randn(b, h, s, d, dtype=dtype), torch.randn(b, hkv, s, d, dtype=dtype)


def _hf_rotate(config, q, k, position_ids):
    cos, sin = hf_rotary(config)(q, position_ids)  # fresh module: dynamic/longrope see only this call's length
    return neox_apply(q, k, cos, sin)


def _cases():
    for name, (params, max_pos) in SCALINGS.items():
        yield name, params, max_pos
    yield "longrope", None, 1024  # built per rotary dim


@pytest.mark.parametrize("case", list(_cases()), ids=lambda c: c[0])
@pytest.mark.parametrize("partial", [1.0, 0.5])
@pytest.mark.parametrize("batched", [False, True])
@pytest.mark.parametrize("length", [40, 200])  # below and above the original length of the length-dependent types
def test_half_layout_matches_hf_module(case, partial, batched, length):
    name, params, max_pos = case
    head_dim = 64
    if params is None:
        params = _longrope(int(head_dim * partial))
    config = hf_config(
        head_dim, base=10000.0, rope_parameters=params, partial_rotary_factor=partial, max_position_embeddings=max_pos
    )
    q, k = _qk(2, length, head_dim)
    # batched: per-row positions, as with left padding or packed documents
    positions = torch.stack([torch.arange(length), torch.arange(length) + 7]) if batched else torch.arange(length)
    want_q, want_k = _hf_rotate(config, q, k, positions if batched else positions[None].expand(2, -1))
    rope = posenc.RotaryEmbedding(head_dim, scaling=_dict_for_posenc(params, max_pos), partial_rotary_factor=partial)
    got_q, got_k = rope(q, k, positions)
    atol = angle_atol(positions.max() + 1, q) * max(rope.attention_factor, 1.0)
    torch.testing.assert_close(got_q, want_q, rtol=1e-5, atol=atol)
    torch.testing.assert_close(got_k, want_k, rtol=1e-5, atol=atol)


@pytest.mark.parametrize("partial", [1.0, 0.5, 0.25])
@pytest.mark.parametrize("head_dim", [32, 64, 128])
def test_half_layout_rotation_is_hf_apply_rotary_pos_emb(partial, head_dim):
    """Same float64 cos/sin into both: the rotation itself must agree to float64 round-off."""
    q, k = _qk(2, 33, head_dim, torch.float64)
    positions = torch.arange(33) * 3
    inv_freq, _ = posenc.rope_frequencies(head_dim, partial_rotary_factor=partial)
    cos, sin = posenc.rope_cos_sin(positions, inv_freq, dtype=torch.float64)  # (S, F)
    want_q, want_k = neox_apply(q, k, torch.cat([cos, cos], -1)[None], torch.cat([sin, sin], -1)[None])
    got_q = posenc.apply_rotary(q, cos, sin, layout="half")
    got_k = posenc.apply_rotary(k, cos, sin, layout="half")
    torch.testing.assert_close(got_q, want_q, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(got_k, want_k, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("rotary_dim", [64, 32, 16])
def test_interleaved_layout_is_gptj(rotary_dim):
    """GPT-J rotates pairs (2i, 2i+1) of the first rotary_dim channels of (B, S, H, D) tensors."""
    head_dim, s = 64, 29
    x = torch.randn(2, 4, s, head_dim, dtype=torch.float64)
    positions = torch.arange(s)
    inv_freq = posenc.default_inv_freq(rotary_dim).double()
    angles = positions.double()[:, None] * inv_freq  # (S, F)
    x_bshd = x.transpose(1, 2)  # (B, S, H, D), GPT-J's layout
    rot = gptj_apply(x_bshd[..., :rotary_dim], angles.sin()[None], angles.cos()[None])
    want = torch.cat([rot, x_bshd[..., rotary_dim:]], -1).transpose(1, 2)
    rope = posenc.RotaryEmbedding(head_dim, layout="interleaved", partial_rotary_factor=rotary_dim / head_dim)
    got = rope.rotate_one(x, positions)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("base", [10000.0, 500000.0])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_interleaved_layout_is_meta_llama_complex_form(base, dtype):
    head_dim, s = 128, 50
    x = torch.randn(1, 8, s, head_dim, dtype=dtype)
    positions = torch.arange(100, 100 + s)
    rope = posenc.RotaryEmbedding(head_dim, base=base, layout="interleaved")
    want = apply_rotary_emb(x.double(), precompute_freqs_cis(rope.inv_freq, positions)).to(dtype)
    tol = 1e-12 if dtype == torch.float64 else 2e-6
    torch.testing.assert_close(rope.rotate_one(x, positions), want, rtol=tol, atol=tol)


def test_bf16_matches_hf_within_bf16_tolerance():
    """HF rounds cos/sin to bf16 and rotates in bf16; posenc rotates in float32 and rounds once: both are
    within bf16 tolerance of each other."""
    config = hf_config(64, base=10000.0)
    q, k = _qk(1, 64, 64, torch.bfloat16)
    positions = torch.arange(64)
    want_q, want_k = _hf_rotate(config, q, k, positions[None])
    got_q, got_k = posenc.RotaryEmbedding(64)(q, k, positions)
    assert got_q.dtype == torch.bfloat16
    torch.testing.assert_close(got_q, want_q, rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(got_k, want_k, rtol=2e-2, atol=2e-2)


def test_dynamic_decode_uses_one_length_for_q_and_k():
    """Decoding one token past the original length: q and k share the frequencies of the full length."""
    config = hf_config(
        64, base=10000.0, rope_parameters={"rope_type": "dynamic", "factor": 4.0}, max_position_embeddings=64
    )
    rope = posenc.RotaryEmbedding(64, scaling={"rope_type": "dynamic", "factor": 4.0, "max_position_embeddings": 64})
    q, k = _qk(1, 100, 64)
    full_q, full_k = rope(q, k, torch.arange(100))
    last_q, all_k = rope(q[:, :, -1:], k, torch.tensor([99]), torch.arange(100))
    torch.testing.assert_close(last_q, full_q[:, :, -1:], rtol=0, atol=0)
    torch.testing.assert_close(all_k, full_k, rtol=0, atol=0)
    want_q, _ = _hf_rotate(config, q, k, torch.arange(100)[None])
    torch.testing.assert_close(full_q, want_q, rtol=1e-5, atol=angle_atol(100, q))


# --- Hugging Face config interop -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", [*SCALINGS, "longrope"])
def test_from_hf_config_object_matches_hf_module(name):
    params, max_pos = SCALINGS.get(name, (None, 1024))
    params = _longrope(32) if params is None else params
    config = hf_config(
        64, base=50000.0, rope_parameters=params, partial_rotary_factor=0.5, max_position_embeddings=max_pos
    )
    rope = posenc.RotaryEmbedding.from_hf(config)
    assert rope.config.partial_rotary_factor == 0.5 and rope.config.base == 50000.0
    q, k = _qk(1, 150, 64)
    want_q, want_k = _hf_rotate(config, q, k, torch.arange(150)[None])
    got_q, got_k = rope(q, k, torch.arange(150))
    atol = angle_atol(150, q) * max(rope.attention_factor, 1.0)
    torch.testing.assert_close(got_q, want_q, rtol=1e-5, atol=atol)
    torch.testing.assert_close(got_k, want_k, rtol=1e-5, atol=atol)


def test_from_legacy_config_json_dicts():
    """Older config.json files: top-level rope_theta, rope_scaling with the legacy 'type' key."""
    llama31 = {
        "hidden_size": 4096,
        "num_attention_heads": 32,
        "max_position_embeddings": 131072,
        "rope_theta": 500000.0,
        "rope_scaling": {
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
            "rope_type": "llama3",
        },
    }
    c = rotary_config_from_hf(llama31)
    assert (
        c.head_dim == 128
        and c.base == 500000.0
        and c.scaling
        == posenc.Llama3Scaling(
            factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=8192
        )
    )
    phi3 = {  # Phi-3: top-level original_max_position_embeddings wins, attention factor from the two lengths
        "hidden_size": 3072,
        "num_attention_heads": 32,
        "max_position_embeddings": 131072,
        "original_max_position_embeddings": 4096,
        "rope_theta": 10000.0,
        "rope_scaling": {"type": "longrope", "short_factor": [1.0] * 48, "long_factor": [2.0] * 48},
    }
    rope = posenc.RotaryEmbedding.from_hf(phi3)
    assert rope.config.scaling.original_max_position_embeddings == 4096
    assert rope.attention_factor == pytest.approx(
        (1 + torch.log(torch.tensor(32.0)).item() / torch.log(torch.tensor(4096.0)).item()) ** 0.5
    )
    neox = {"hidden_size": 512, "num_attention_heads": 8, "rotary_pct": 0.25, "rotary_emb_base": 20000}
    neox_config = posenc.RotaryEmbedding.from_hf(neox).config
    assert neox_config.rotary_dim == 16 and neox_config.base == 20000.0
    deepseek = {
        "head_dim": 64,
        "max_position_embeddings": 163840,
        "rope_theta": 10000.0,
        "rope_scaling": {
            "type": "yarn",
            "factor": 40,
            "beta_fast": 32,
            "beta_slow": 1,
            "mscale": 1.0,
            "mscale_all_dim": 1.0,
            "original_max_position_embeddings": 4096,
        },
    }
    assert rotary_config_from_hf(deepseek).scaling.mscale_all_dim == 1.0


def test_nested_per_layer_rope_parameters_need_layer_type():
    gemma3 = {
        "head_dim": 256,
        "rope_parameters": {
            "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        },
    }
    with pytest.raises(ValueError, match="layer_type"):
        rotary_config_from_hf(gemma3)
    full = rotary_config_from_hf(gemma3, layer_type="full_attention")
    assert full.base == 1000000.0 and full.scaling == posenc.LinearScaling(factor=8.0)
    assert rotary_config_from_hf(gemma3, layer_type="sliding_attention").scaling is None
    assert posenc.RotaryEmbedding.from_hf(gemma3, layer_type="full_attention").config == full


@pytest.mark.parametrize("name", [*SCALINGS, "longrope"])
@pytest.mark.parametrize("legacy", [False, True])
def test_to_hf_builds_the_same_rope_in_transformers(name, legacy):
    params, max_pos = SCALINGS.get(name, (None, 1024))
    params = _longrope(64) if params is None else params
    rope = posenc.RotaryEmbedding(64, base=20000.0, scaling=_dict_for_posenc(params, max_pos))
    exported = rope.to_hf()
    if legacy:
        exported = posenc.hf.rotary_config_to_hf(rope.config, legacy=True)
    from transformers import LlamaConfig

    config = LlamaConfig(hidden_size=256, num_attention_heads=4, **{"max_position_embeddings": max_pos, **exported})
    q, k = _qk(1, 120, 64)
    want_q, _ = _hf_rotate(config, q, k, torch.arange(120)[None])
    got_q, _ = rope(q, k, torch.arange(120))
    torch.testing.assert_close(got_q, want_q, rtol=1e-5, atol=angle_atol(120, q) * max(rope.attention_factor, 1.0))
