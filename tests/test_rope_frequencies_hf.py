"""rope_frequencies == transformers' ROPE_INIT_FUNCTIONS for every rope type and key combination."""

import math

import pytest
import torch

import posenc
from hf_oracle import hf_config, hf_frequencies
from tolerances import frequency_rtol, ulps

HEAD_DIMS = [64, 128, 80]
BASES = [10000.0, 500000.0]
PARTIAL = [1.0, 0.5]


def _long_short(dim, seed):
    g = torch.Generator().manual_seed(seed)
    return [float(v) for v in 1 + 3 * torch.rand(dim // 2, generator=g)]


def _cases():
    yield "default", {}, 2048
    for factor in (1.0, 2.0, 8.0):
        yield f"linear-{factor}", {"rope_type": "linear", "factor": factor}, 2048
    for factor in (1.0, 2.0, 4.0):
        yield f"dynamic-{factor}", {"rope_type": "dynamic", "factor": factor}, 256
    yarn = {"rope_type": "yarn", "original_max_position_embeddings": 2048}
    for factor in (1.0, 4.0, 16.0):
        yield f"yarn-{factor}", {**yarn, "factor": factor}, 2048
    yield "yarn-betas", {**yarn, "factor": 8.0, "beta_fast": 16, "beta_slow": 2}, 2048
    yield "yarn-no-truncate", {**yarn, "factor": 8.0, "truncate": False}, 2048
    yield "yarn-mscale", {**yarn, "factor": 40.0, "mscale": 1.0, "mscale_all_dim": 1.0}, 2048
    yield "yarn-mscale-0707", {**yarn, "factor": 40.0, "mscale": 0.707, "mscale_all_dim": 1.0}, 2048
    yield "yarn-attention-factor", {**yarn, "factor": 4.0, "attention_factor": 0.9}, 2048
    yield (
        "yarn-factor-from-max-pos",
        {"rope_type": "yarn", "factor": None, "original_max_position_embeddings": 1024},
        8192,
    )
    yield (
        "llama3.1",
        {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
        131072,
    )
    yield (
        "llama3.2",
        {
            "rope_type": "llama3",
            "factor": 32.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
        131072,
    )
    yield (
        "llama3-small",
        {
            "rope_type": "llama3",
            "factor": 4.0,
            "low_freq_factor": 2.0,
            "high_freq_factor": 8.0,
            "original_max_position_embeddings": 256,
        },
        2048,
    )


def _longrope_cases(dim):
    short, long = _long_short(dim, 1), _long_short(dim, 2)
    base = {
        "rope_type": "longrope",
        "short_factor": short,
        "long_factor": long,
        "original_max_position_embeddings": 4096,
    }
    yield "longrope-factor-from-max-pos", base, 131072
    yield "longrope-factor", {**base, "factor": 8.0}, 4096
    yield "longrope-attention-factor", {**base, "attention_factor": 1.2}, 131072


def _posenc_dict(rope_parameters, max_pos):
    """What a user pastes: the HF rope dict, carrying max_position_embeddings where HF reads it from the model."""
    d = dict(rope_parameters)
    if d.get("rope_type") in ("dynamic", "yarn", "longrope"):
        d["max_position_embeddings"] = max_pos
    return d


def _check(head_dim, base, partial, rope_parameters, max_pos, seq_len=None):
    config = hf_config(
        head_dim,
        base=base,
        rope_parameters=rope_parameters,
        partial_rotary_factor=partial,
        max_position_embeddings=max_pos,
    )
    want, want_factor = hf_frequencies(config, seq_len=seq_len)
    got, got_factor = posenc.rope_frequencies(
        head_dim,
        base=base,
        scaling=_posenc_dict(rope_parameters, max_pos),
        partial_rotary_factor=partial,
        seq_len=seq_len,
    )
    assert got.dtype == torch.float32
    assert got.shape == (int(head_dim * partial) // 2,)
    params = rope_parameters or {}
    factor = params.get("factor") or max_pos / params.get("original_max_position_embeddings", max_pos)
    rtol = frequency_rtol(base, float(factor))
    torch.testing.assert_close(got, want.float(), rtol=rtol, atol=0)
    assert math.isclose(got_factor, float(want_factor), rel_tol=rtol)


@pytest.mark.parametrize("case", list(_cases()), ids=lambda c: c[0])
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("base", BASES)
@pytest.mark.parametrize("partial", PARTIAL)
def test_matches_hf(case, head_dim, base, partial):
    _, rope_parameters, max_pos = case
    _check(head_dim, base, partial, rope_parameters, max_pos)


@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("partial", PARTIAL)
@pytest.mark.parametrize("seq_len", [None, 1, 4096, 4097, 20000])
def test_longrope_matches_hf(head_dim, partial, seq_len):
    for _, rope_parameters, max_pos in _longrope_cases(int(head_dim * partial)):
        _check(head_dim, 10000.0, partial, rope_parameters, max_pos, seq_len=seq_len)


@pytest.mark.parametrize("seq_len", [None, 10, 256, 257, 1000, 10**5])
@pytest.mark.parametrize("factor", [2.0, 8.0])
@pytest.mark.parametrize("partial", PARTIAL)
def test_dynamic_matches_hf(seq_len, factor, partial):
    _check(64, 10000.0, partial, {"rope_type": "dynamic", "factor": factor}, 256, seq_len=seq_len)


@pytest.mark.parametrize("seq_len", [10, 256, 257, 3000])
def test_length_dependent_accept_tensor_seq_len(seq_len):
    """A module passes max(positions) + 1 as a 0-d tensor; HF's module does the same."""
    dim = 64
    for rope_parameters, max_pos in [
        ({"rope_type": "dynamic", "factor": 4.0}, 256),
        *[(p, m) for _, p, m in _longrope_cases(dim)],
    ]:
        config = hf_config(dim, base=10000.0, rope_parameters=rope_parameters, max_position_embeddings=max_pos)
        want, _ = hf_frequencies(config, seq_len=torch.tensor(seq_len))
        got, _ = posenc.rope_frequencies(
            dim, scaling=_posenc_dict(rope_parameters, max_pos), seq_len=torch.tensor(seq_len)
        )
        torch.testing.assert_close(got, want.float(), rtol=frequency_rtol(10000.0, 4.0), atol=0)


@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("factor", [1.0, 2.0, 16.0])
@pytest.mark.parametrize("partial", PARTIAL)
def test_ntk_is_default_rope_with_enlarged_base(head_dim, factor, partial):
    """Static NTK (absent from HF): default HF rope at base * factor ** (d / (d - 2)), d the rotary dim."""
    d = int(head_dim * partial)
    config = hf_config(head_dim, base=10000.0 * factor ** (d / (d - 2)), partial_rotary_factor=partial)
    want, _ = hf_frequencies(config)
    got, af = posenc.rope_frequencies(
        head_dim, scaling={"rope_type": "ntk", "factor": factor}, partial_rotary_factor=partial
    )
    torch.testing.assert_close(got, want.float(), rtol=frequency_rtol(10000.0 * factor ** (d / (d - 2))), atol=0)
    assert af == 1.0
    # The defining property: the lowest frequency is interpolated by exactly `factor`, the highest untouched.
    plain, _ = posenc.rope_frequencies(head_dim, partial_rotary_factor=partial)
    torch.testing.assert_close(got[0], plain[0])
    # both float64 rounded once, then one float32 multiply: 3 roundings
    torch.testing.assert_close(got[-1] * factor ** ((d - 2) / (d - 2)), plain[-1], **ulps(1.5))


def test_legacy_type_key_and_config_objects_agree():
    d = {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 2048}
    a, fa = posenc.rope_frequencies(64, scaling=d)
    b, fb = posenc.rope_frequencies(64, scaling=posenc.YaRNScaling(factor=4.0, original_max_position_embeddings=2048))
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert fa == fb
