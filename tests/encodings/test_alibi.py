"""ALiBi / ALiBi2D modules: registry, configs, score_mod == bias (broadcast and through compiled FlexAttention),
slope interpolation, float32 slopes through dtype moves, and bad input."""

import pytest
import torch
from torch.nn.attention.flex_attention import flex_attention
from torch.testing import assert_close

from encoding_cases import attention_tol
from posenc.encodings.alibi import ALiBi, ALiBi2D, ALiBi2DConfig, ALiBiConfig
from posenc.functional.alibi import alibi_2d_bias, alibi_bias, alibi_slopes
from posenc.functional.axial_rope import grid_positions
from posenc.registry import build

EXACT = {"rtol": 0.0, "atol": 0.0}


def _indices(b: int, h: int, s: int, t: int):
    """FlexAttention's (b, h, q_idx, kv_idx) as broadcasting index tensors over a (B, H, S, T) score grid."""
    return (
        torch.arange(b).view(b, 1, 1, 1),
        torch.arange(h).view(1, h, 1, 1),
        torch.arange(s).view(1, 1, s, 1),
        torch.arange(t).view(1, 1, 1, t),
    )


def _score_mod_grid(enc, q_pos, k_pos, b, s, t):
    mod = enc.score_mod(q_pos, k_pos)
    h = enc.config.num_heads
    return mod(torch.zeros(b, h, s, t), *_indices(b, h, s, t))  # (B, H, S, T)


def test_registered_and_built_by_name():
    enc = build("alibi", num_heads=6, dim=64, head_dim=16, max_len=128)
    assert isinstance(enc, ALiBi) and enc.config == ALiBiConfig(num_heads=6)
    assert isinstance(build("alibi_2d", num_heads=4, grid_size=8), ALiBi2D)
    assert ALiBi.has_bias and ALiBi2D.has_bias
    assert ALiBi2D.position_kind == "grid"


@pytest.mark.parametrize(
    "config",
    [
        ALiBiConfig(num_heads=8),
        ALiBiConfig(num_heads=12, symmetric=True, train_len=512, eval_len=2048),
        ALiBiConfig(num_heads=3, train_len=64),
        ALiBi2DConfig(num_heads=16),
    ],
)
def test_config_round_trip(config):
    assert type(config).from_dict(config.to_dict()) == config
    cls = ALiBi if isinstance(config, ALiBiConfig) else ALiBi2D
    assert cls.from_config(config.to_dict()).config == config


# ---- bias and score_mod ---------------------------------------------------------------------------------------------

B, S, T = 2, 5, 7


def _sequence_positions(kind):
    g = torch.Generator().manual_seed(3)
    return {
        "shared": (torch.arange(S) + 10, torch.arange(T)),
        "one_row": (torch.arange(S).unsqueeze(0), torch.arange(T).unsqueeze(0) * 3),
        "batched": (torch.randint(0, 1000, (B, S), generator=g), torch.randint(0, 1000, (B, T), generator=g)),
        "mixed": (torch.randint(0, 1000, (B, S), generator=g), torch.arange(T)),
        "float": (torch.rand(S, generator=g) * 100, torch.rand(B, T, generator=g) * 100),
    }[kind]


@pytest.mark.parametrize("kind", ["shared", "one_row", "batched", "mixed", "float"])
@pytest.mark.parametrize(
    "kwargs", [{}, {"symmetric": True}, {"train_len": 16, "eval_len": 48}, {"symmetric": True, "train_len": 4}]
)
@pytest.mark.parametrize("num_heads", [1, 6])
def test_alibi_bias_and_score_mod(kind, kwargs, num_heads):
    q_pos, k_pos = _sequence_positions(kind)
    enc = ALiBi(num_heads, **kwargs)
    bias = enc.bias(q_pos, k_pos)
    assert_close(bias, alibi_bias(q_pos, k_pos, enc.slopes, symmetric=enc.config.symmetric), **EXACT)
    got = _score_mod_grid(enc, q_pos, k_pos, B, S, T)
    assert_close(got, bias.expand(B, -1, -1, -1), **EXACT)


@pytest.mark.parametrize("kind", ["grid", "batched", "float"])
def test_alibi_2d_bias_and_score_mod(kind):
    g = torch.Generator().manual_seed(4)
    if kind == "grid":
        q_pos, k_pos = grid_positions(S, 1), grid_positions(T, 1) + torch.tensor([0.0, 2.0])
    elif kind == "batched":
        q_pos, k_pos = torch.randint(0, 9, (B, S, 2), generator=g), torch.randint(0, 9, (1, T, 2), generator=g)
    else:
        q_pos, k_pos = torch.rand(S, 2, generator=g) * 9, torch.rand(B, T, 2, generator=g) * 9
    enc = ALiBi2D(5)
    bias = enc.bias(q_pos, k_pos)
    assert_close(bias, alibi_2d_bias(q_pos, k_pos, alibi_slopes(5)), **EXACT)
    assert_close(_score_mod_grid(enc, q_pos, k_pos, B, S, T), bias.expand(B, -1, -1, -1), **EXACT)


def test_forward_is_self_bias():
    enc = ALiBi(4)
    pos = torch.arange(6)
    assert_close(enc(pos), enc.bias(pos, pos), **EXACT)
    assert_close(enc(pos[-1:], pos), enc.bias(pos[-1:], pos), **EXACT)


def _eager_attention(q, k, v, bias):
    scores = q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5 + bias  # (B, H, S, T)
    return torch.softmax(scores, dim=-1) @ v


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("encoding", ["alibi", "alibi_2d"])
def test_score_mod_in_compiled_flex_attention(device, encoding):
    # qk head dim >= 24: torch 2.13's compiled CPU FlexAttention is wrong at 16 and below on AVX2-only CPUs
    b, h, s, t, d = 2, 4, 8, 16, 32
    q = torch.randn(b, h, s, d, device=device)
    k, v = torch.randn(b, h, t, d, device=device), torch.randn(b, h, t, d, device=device)
    if encoding == "alibi":  # per-row query positions (decode-like offsets), shared key positions
        enc = ALiBi(h).to(device)
        q_pos, k_pos = (
            torch.stack((torch.arange(s) + 8, torch.arange(s) + 3)).to(device),
            torch.arange(t, device=device),
        )
    else:
        enc = ALiBi2D(h).to(device)
        q_pos, k_pos = grid_positions(4, 2, device=device), grid_positions(4, 4, device=device)
    got = torch.compile(flex_attention, dynamic=False)(q, k, v, score_mod=enc.score_mod(q_pos, k_pos))
    bias = enc.bias(q_pos, k_pos)
    assert_close(got, _eager_attention(q, k, v, bias), **attention_tol(q, k, v, bias=bias))


# ---- slopes ---------------------------------------------------------------------------------------------------------


def test_slope_interpolation_only_beyond_train_len():
    base = alibi_slopes(8)
    assert_close(ALiBi(8, train_len=512, eval_len=2048).slopes, base / 4, **EXACT)
    for kwargs in ({}, {"train_len": 512}, {"train_len": 512, "eval_len": 512}, {"train_len": 512, "eval_len": 100}):
        assert_close(ALiBi(8, **kwargs).slopes, base, **EXACT)
    assert_close(
        ALiBi(8, train_len=512, eval_len=2048).bias(torch.arange(3), torch.arange(3)),
        alibi_bias(torch.arange(3), torch.arange(3), base / 4),
        **EXACT,
    )


@pytest.mark.parametrize("cls", [ALiBi, ALiBi2D])
@pytest.mark.parametrize("cast", [lambda m: m.to(torch.bfloat16), lambda m: m.half(), lambda m: m.double()])
def test_slopes_stay_float32_through_dtype_casts(cls, cast):
    enc = cls(12)
    cast(enc)
    assert enc.slopes.dtype == torch.float32
    assert_close(enc.slopes, alibi_slopes(12), **EXACT)
    assert "_slopes" not in enc.state_dict()  # rebuilt from the config, never saved


def test_meta_build_then_to_empty():
    with torch.device("meta"):
        enc = ALiBi(10, train_len=8, eval_len=32)
    assert enc.slopes.is_meta
    enc.to_empty(device="cpu")
    assert_close(enc.slopes, alibi_slopes(10) / 4, **EXACT)


# ---- positions checks and bad input ---------------------------------------------------------------------------------


def test_check_positions():
    ALiBi(2).check_positions(torch.arange(5), 5, 3)
    ALiBi2D(2).check_positions(grid_positions(5, 1), 5, 3)
    ALiBi2D(2).check_positions(torch.zeros(3, 5, 2), 5, 3)
    with pytest.raises(ValueError, match=r"k_positions\.shape"):
        ALiBi2D(2).check_positions(torch.zeros(5), 5, 3, "k_positions")
    with pytest.raises(ValueError, match=r"positions\.shape"):
        ALiBi2D(2).check_positions(torch.zeros(5, 3), 5, 3)
    with pytest.raises(ValueError, match=r"positions\.shape"):
        ALiBi(2).check_positions(torch.zeros(5, 2), 5, 3)


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"num_heads": 0}, "num_heads"),
        ({"num_heads": -2}, "num_heads"),
        ({"num_heads": 4.0}, "num_heads"),
        ({"num_heads": True}, "num_heads"),
        ({"num_heads": 4, "eval_len": 1024}, "eval_len"),
        ({"num_heads": 4, "train_len": 0}, "train_len"),
        ({"num_heads": 4, "train_len": -8, "eval_len": 16}, "train_len"),
        ({"num_heads": 4, "train_len": 8, "eval_len": 0}, "eval_len"),
        ({"num_heads": 4, "train_len": 8, "eval_len": 16.5}, "eval_len"),
        ({"num_heads": 4, "symmetric": "yes"}, "symmetric"),
    ],
)
def test_bad_alibi_config(kwargs, name):
    with pytest.raises(ValueError, match=name):
        ALiBiConfig(**kwargs)
    num_heads = kwargs.pop("num_heads")
    with pytest.raises(ValueError, match=name):
        ALiBi(num_heads, **kwargs)


def test_bad_alibi_2d_config_and_unknown_keys():
    with pytest.raises(ValueError, match="num_heads"):
        ALiBi2D(0)
    with pytest.raises(ValueError, match="scale"):
        ALiBiConfig.from_dict({"num_heads": 4, "scale": 2.0})


@pytest.mark.parametrize("hook", ["bias", "score_mod"])
def test_bad_positions_in_hooks(hook):
    with pytest.raises(ValueError, match=r"k_pos\.shape"):
        getattr(ALiBi(2), hook)(torch.zeros(2, 4), torch.zeros(3, 4))
    with pytest.raises(ValueError, match=r"q_pos\.shape"):
        getattr(ALiBi2D(2), hook)(torch.zeros(4), torch.zeros(4, 2))
