"""Every bad RoPE input raises ``ValueError`` whose message names the offending parameter."""

from __future__ import annotations

import re

import pytest
import torch

import posenc
from posenc import RotaryConfig, RotaryEmbedding, apply_rotary, rope_cos_sin, rope_frequencies
from posenc.hf import rotary_config_to_hf

LLAMA3 = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
}
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}
LONGROPE = {
    "rope_type": "longrope",
    "short_factor": [1.0] * 4,
    "long_factor": [2.0] * 4,
    "original_max_position_embeddings": 64,
    "factor": 4.0,
}
DYNAMIC = {"rope_type": "dynamic", "factor": 2.0, "max_position_embeddings": 64}


def raises(pattern: str):
    return pytest.raises(ValueError, match=pattern)


# --------------------------------------------------------------------------------------------------------------
# rotary dims, base, layout


@pytest.mark.parametrize(
    "head_dim,partial,pattern",
    [
        (7, 1.0, r"rotary dim=7 .*head_dim=7"),
        (1, 1.0, r"rotary dim=1 .*head_dim=1"),
        (6, 0.5, r"rotary dim=3 .*partial_rotary_factor=0\.5"),  # even head_dim, odd rotary dim
        (8, 0.1, r"rotary dim=0 .*partial_rotary_factor=0\.1"),
        (0, 1.0, r"head_dim=0"),
        (-8, 1.0, r"head_dim=-8"),
        (8.0, 1.0, r"head_dim=8\.0"),
    ],
)
def test_bad_rotary_dims(head_dim, partial, pattern):
    with raises(pattern):
        RotaryEmbedding(head_dim, partial_rotary_factor=partial)
    with raises(pattern):
        rope_frequencies(head_dim, partial_rotary_factor=partial)


@pytest.mark.parametrize("partial", [0, 0.0, -0.5, 1.5, 2, float("nan"), float("inf"), True, "0.5"])
def test_bad_partial_rotary_factor(partial):
    with raises(r"^partial_rotary_factor="):
        RotaryEmbedding(8, partial_rotary_factor=partial)


@pytest.mark.parametrize("base", [1.0, 1, 0.5, 0.0, -10000.0, float("inf"), float("nan"), "10000", None])
def test_bad_base(base):
    with raises(r"^base="):
        RotaryEmbedding(8, base=base)
    with raises(r"^base="):
        rope_frequencies(8, base=base)


@pytest.mark.parametrize("layout", ["neox", "HALF", "", None, "gptj"])
def test_bad_layout(layout):
    with raises(r"^layout=.*'half', 'interleaved'"):
        RotaryEmbedding(8, layout=layout)
    with raises(r"^layout="):
        apply_rotary(torch.zeros(3, 8), torch.zeros(3, 4), torch.zeros(3, 4), layout=layout)


# --------------------------------------------------------------------------------------------------------------
# scaling dicts and configs


def test_unknown_rope_type_lists_available():
    every = (
        "'default', 'dynamic', 'linear', 'llama3', 'longrope', 'ntk', 'ntk_alpha', 'ntk_mixed', 'proportional', "
        "'telechat3_yarn', 'yarn', 'yarn_log'"
    )
    with raises(rf"^rope_type='super' .*{every}"):
        RotaryEmbedding(8, scaling={"rope_type": "super", "factor": 2.0})
    with raises(r"^rope_type='super'"):
        posenc.parse_scaling({"type": "super", "factor": 2.0})  # legacy key


def test_legacy_type_conflicting_with_rope_type():
    with raises(r"^rope_scaling\['type'\]='linear' .*'yarn'"):
        RotaryEmbedding(8, scaling={**YARN, "type": "linear"})


def test_legacy_type_agreeing_with_rope_type_is_fine():
    assert posenc.parse_scaling({**YARN, "type": "yarn"}) == posenc.parse_scaling(YARN)


@pytest.mark.parametrize(
    "config,key",
    [
        ({**YARN, "beta_fats": 32.0}, "beta_fats"),
        ({"rope_type": "linear", "factor": 2.0, "low_freq_factor": 1.0}, "low_freq_factor"),
        ({**LLAMA3, "mscale": 1.0}, "mscale"),
        ({**DYNAMIC, "original_max_position_embeddings": 8}, "original_max_position_embeddings"),
        ({"rope_type": "default", "factor": 2.0}, "factor"),
        ({"factor": 2.0}, "factor"),  # no type: default, which takes no scaling keys
    ],
)
def test_unknown_scaling_keys(config, key):
    with raises(rf"^rope_scaling\['{key}'\]="):
        RotaryEmbedding(8, scaling=config)


@pytest.mark.parametrize(
    "config,key",
    [
        ({"rope_type": "yarn", "factor": 4.0}, "original_max_position_embeddings"),
        ({k: v for k, v in LLAMA3.items() if k != "low_freq_factor"}, "low_freq_factor"),
        (
            {k: v for k, v in LLAMA3.items() if k != "original_max_position_embeddings"},
            "original_max_position_embeddings",
        ),
        ({"rope_type": "dynamic", "factor": 2.0}, "max_position_embeddings"),
        ({"rope_type": "linear"}, "factor"),
        ({"rope_type": "ntk"}, "factor"),
        ({k: v for k, v in LONGROPE.items() if k != "long_factor"}, "long_factor"),
    ],
)
def test_missing_required_scaling_keys(config, key):
    with raises(rf"^rope_scaling=.*\['{key}'\] for rope_type '{config['rope_type']}'"):
        RotaryEmbedding(8, scaling=config)


@pytest.mark.parametrize("rope_type", ["linear", "ntk", "dynamic", "yarn", "llama3"])
@pytest.mark.parametrize("factor", [0.5, 0.999, 0.0, -2.0, float("nan"), float("inf")])
def test_factor_below_one(rope_type, factor):
    base = {"linear": {}, "ntk": {}, "dynamic": DYNAMIC, "yarn": YARN, "llama3": LLAMA3}[rope_type]
    with raises(r"^factor="):
        RotaryEmbedding(8, scaling={**base, "rope_type": rope_type, "factor": factor})


@pytest.mark.parametrize("rope_type", ["dynamic", "yarn", "llama3"])
def test_a_bad_factor_is_named_before_a_missing_key(rope_type):
    """``{"rope_type": "yarn", "factor": 0}`` lacks ``original_max_position_embeddings`` too, but the value given is
    what is wrong: the error names the factor."""
    with raises(r"^factor=0 is invalid: expected a number >= 1"):
        RotaryEmbedding(8, scaling={"rope_type": rope_type, "factor": 0})


def test_yarn_derived_factor_below_one():
    with raises(r"^factor=0\.5"):
        posenc.YaRNScaling(original_max_position_embeddings=64, max_position_embeddings=32)


def test_yarn_without_factor_or_max_position():
    with raises(r"^factor=None .*max_position_embeddings"):
        posenc.YaRNScaling(original_max_position_embeddings=64)


@pytest.mark.parametrize("name", ["short_factor", "long_factor"])
@pytest.mark.parametrize("length", [3, 5, 0])
def test_longrope_factor_length_must_match_rotary_dim(name, length):
    with raises(rf"^len\({name}\)={length} .*rotary dim // 2 = 4"):
        RotaryEmbedding(8, scaling={**LONGROPE, name: [1.0] * length})
    with raises(rf"^len\({name}\)={length}"):
        rope_frequencies(8, scaling={**LONGROPE, name: [1.0] * length})


def test_longrope_factor_length_checked_against_partial_rotary_dim():
    with raises(r"^len\(short_factor\)=4 .*rotary dim // 2 = 2"):
        RotaryEmbedding(8, scaling=LONGROPE, partial_rotary_factor=0.5)


@pytest.mark.parametrize("name", ["short_factor", "long_factor"])
@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), float("inf"), "2"])
def test_longrope_factor_entries_must_be_positive(name, bad):
    with raises(rf"^{name}\[2\]="):
        RotaryEmbedding(8, scaling={**LONGROPE, name: [1.0, 1.0, bad, 1.0]})


@pytest.mark.parametrize("name", ["short_factor", "long_factor"])
@pytest.mark.parametrize("bad", [2.0, "abcd", None])
def test_longrope_factor_must_be_a_list(name, bad):
    with raises(rf"^{name}="):
        posenc.LongRoPEScaling(**{**{k: v for k, v in LONGROPE.items() if k != "rope_type"}, name: bad})


@pytest.mark.parametrize("extra", [{"factor": 4.0}, {"max_position_embeddings": 128}])
def test_longrope_original_length_one(extra):
    """The default attention factor divides by ln(original_max_position_embeddings): 1 must be refused up front."""
    config = {k: v for k, v in LONGROPE.items() if k != "factor"}
    with raises(r"original_max_position_embeddings"):
        RotaryEmbedding(8, scaling={**config, **extra, "original_max_position_embeddings": 1})


@pytest.mark.parametrize("beta_fast,beta_slow", [(1.0, 1.0), (0.5, 1.0), (32.0, 64.0)])
def test_yarn_beta_fast_must_exceed_beta_slow(beta_fast, beta_slow):
    with raises(r"^beta_fast=.*beta_slow"):
        RotaryEmbedding(8, scaling={**YARN, "beta_fast": beta_fast, "beta_slow": beta_slow})


@pytest.mark.parametrize("low,high", [(4.0, 4.0), (4.0, 1.0)])
def test_llama3_high_freq_factor_must_exceed_low(low, high):
    with raises(r"^high_freq_factor=.*low_freq_factor"):
        RotaryEmbedding(8, scaling={**LLAMA3, "low_freq_factor": low, "high_freq_factor": high})


@pytest.mark.parametrize("rope_type", ["ntk", "dynamic"])
@pytest.mark.parametrize("head_dim,partial", [(2, 1.0), (4, 0.5)])
def test_ntk_needs_rotary_dim_above_two(rope_type, head_dim, partial):
    scaling = {"rope_type": rope_type, "factor": 2.0, "max_position_embeddings": 64}
    if rope_type == "ntk":
        del scaling["max_position_embeddings"]
    with raises(r"^rotary dim=2 .*NTK"):
        RotaryEmbedding(head_dim, scaling=scaling, partial_rotary_factor=partial)
    with raises(r"^rotary dim=2 .*NTK"):
        rope_frequencies(head_dim, scaling=scaling, partial_rotary_factor=partial)


def test_scaling_of_wrong_type():
    with raises(r"^scaling="):
        RotaryEmbedding(8, scaling="yarn")


def test_class_from_dict_rejects_another_rope_type():
    """``RopeScaling.from_dict`` documents that ``rope_type`` / ``type`` "may be present and must match"."""
    with raises(r"rope_type"):
        posenc.LinearScaling.from_dict({"rope_type": "ntk", "factor": 2.0})
    with raises(r"type"):
        posenc.NTKScaling.from_dict({"type": "linear", "factor": 2.0})


@pytest.mark.parametrize("key,value", [("rope_theta", 500000.0), ("partial_rotary_factor", 0.5)])
def test_rotary_keys_in_scaling_dict_are_not_silently_dropped(key, value):
    """An HF ``rope_parameters`` dict carries rope_theta / partial_rotary_factor; passed as ``scaling`` they must
    either take effect or be refused, never be ignored in favour of the (different) constructor defaults."""
    try:
        emb = RotaryEmbedding(8, scaling={"rope_type": "linear", "factor": 2.0, key: value})
    except ValueError as e:
        assert key in str(e)
        return
    kwargs = {"base": value} if key == "rope_theta" else {"partial_rotary_factor": value}
    expected = RotaryEmbedding(8, scaling={"rope_type": "linear", "factor": 2.0}, **kwargs)
    assert emb.config == expected.config


def test_rotary_config_from_dict_unknown_key():
    with raises(r"^config\['theta'\]=.*'head_dim'"):
        RotaryConfig.from_dict({"head_dim": 8, "theta": 10000.0})


def test_rotary_config_to_hf_rejects_interleaved():
    config = RotaryConfig(head_dim=8, layout="interleaved")
    with raises(r"^layout='interleaved' .*'half'"):
        rotary_config_to_hf(config)
    with raises(r"^layout='interleaved'"):
        RotaryEmbedding.from_config(config).to_hf()


# --------------------------------------------------------------------------------------------------------------
# forward inputs


@pytest.fixture
def emb():
    return RotaryEmbedding(8)


def qk(b=2, s=5, t=None, d=8):
    return torch.zeros(b, 4, s, d), torch.zeros(b, 2, s if t is None else t, d)


@pytest.mark.parametrize(
    "positions,shape",
    [
        (torch.arange(4), "(4,)"),  # wrong S
        (torch.arange(6), "(6,)"),
        (torch.zeros(3, 5, dtype=torch.long), "(3, 5)"),  # wrong B (B=2; 1 would broadcast)
        (torch.zeros(2, 4, dtype=torch.long), "(2, 4)"),
        (torch.zeros(2, 1, 5, dtype=torch.long), "(2, 1, 5)"),  # 3-D
        (torch.tensor(0), "()"),
    ],
)
def test_positions_shape_must_match_q(emb, positions, shape):
    q, k = qk()
    with raises(rf"^positions\.shape={re.escape(shape)} .*\(5,\) or \(2, 5\)"):
        emb(q, k, positions)


def test_positions_not_a_tensor(emb):
    q, k = qk()
    with raises(r"^positions='list'"):
        emb(q, k, [0, 1, 2, 3, 4])


def test_k_positions_shape_must_match_k(emb):
    q, k = qk(t=7)
    with raises(r"^k_positions\.shape=\(5,\) .*\(7,\)"):
        emb(q, k, torch.arange(5), k_positions=torch.arange(5))


@pytest.mark.parametrize("scaling", [None, DYNAMIC, LONGROPE])
def test_bool_positions(scaling):
    emb = RotaryEmbedding(8, scaling=scaling)
    q, k = qk()
    with raises(r"^positions\.dtype=torch\.bool"):
        emb(q, k, torch.ones(5, dtype=torch.bool))
    with raises(r"^positions\.dtype=torch\.bool"):
        rope_cos_sin(torch.ones(5, dtype=torch.bool), emb.inv_freq)


def test_complex_positions(emb):
    q, k = qk()
    with raises(r"^positions\.dtype=torch\.complex64"):
        emb(q, k, torch.zeros(5, dtype=torch.complex64))


def test_q_with_wrong_head_dim(emb):
    q, k = qk(d=8)
    with raises(r"q\.shape\[-1\]=6 .*head_dim"):
        emb(q[..., :6], k, torch.arange(5))


def test_k_with_wrong_head_dim(emb):
    q, k = qk(d=8)
    with raises(r"k\.shape\[-1\]=6 .*head_dim"):
        emb(q, k[..., :6], torch.arange(5))


def test_rotate_one_with_wrong_head_dim(emb):
    with raises(r"^x\.shape\[-1\]=6 .*head_dim = 8"):
        emb.rotate_one(torch.zeros(5, 6), torch.arange(5))


def test_q_k_batch_mismatch(emb):
    q, _ = qk(b=2)
    _, k = qk(b=3)
    with raises(r"^k\.shape\[0\]=3 .*2"):
        emb(q, k, torch.arange(5))


@pytest.mark.parametrize("shape", [(5, 8), (4, 5, 8), (1, 2, 4, 5, 8)])
@pytest.mark.parametrize("which", ["q", "k"])
def test_q_and_k_must_be_4d(emb, shape, which):
    good = torch.zeros(2, 4, 5, 8)
    bad = torch.zeros(shape)
    q, k = (bad, good) if which == "q" else (good, bad)
    with raises(rf"^{which}\.dim\(\)={len(shape)} "):
        emb(q, k, torch.arange(5))


def test_apply_rotary_cos_sin_shape_mismatch():
    x = torch.zeros(2, 5, 8)
    with raises(r"^sin\.shape=\(5, 3\) .*\(5, 4\)"):
        apply_rotary(x, torch.zeros(5, 4), torch.zeros(5, 3))


@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_apply_rotary_too_many_rotary_dims(layout):
    with raises(r"^x\.shape\[-1\]=8 .*>= 2 \* cos\.shape\[-1\] = 10"):
        apply_rotary(torch.zeros(2, 5, 8), torch.zeros(5, 5), torch.zeros(5, 5), layout=layout)


def test_apply_rotary_integer_x():
    with raises(r"^x\.dtype=torch\.int64"):
        apply_rotary(torch.zeros(5, 8, dtype=torch.long), torch.zeros(5, 4), torch.zeros(5, 4))


@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("head_dim", [8, 12])
def test_apply_rotary_tables_with_more_batch_than_x(layout, head_dim):
    """cos/sin must broadcast to x's shape; a larger batch in the tables has no place to go in the output."""
    x = torch.randn(3, head_dim)
    cos, sin = torch.randn(2, 3, 4), torch.randn(2, 3, 4)
    with raises(r"cos"):
        apply_rotary(x, cos, sin, layout=layout)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.int64])
def test_rope_cos_sin_half_precision_dtype(dtype):
    with raises(r"^dtype=torch\.\w+ .*float32 or torch\.float64"):
        rope_cos_sin(torch.arange(5), posenc.default_inv_freq(8), dtype=dtype)
