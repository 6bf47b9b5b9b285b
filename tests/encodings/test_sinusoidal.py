"""Sinusoidal / Sinusoidal2D modules: the embed hook against the references, module plumbing, configs, errors."""

import json

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import posenc
from posenc.encodings.sinusoidal import Sinusoidal, Sinusoidal2D, Sinusoidal2DConfig, SinusoidalConfig
from posenc.functional.axial_rope import grid_positions
from posenc.functional.sinusoidal import sinusoidal_2d_encoding, sinusoidal_encoding
from reference.sinusoidal import get_2d_sincos_pos_embed, vaswani
from tolerances import unit_roundoff

#: float64 as the reference's own rounding allows; float32/bfloat16: x + pe, each rounded once to the dtype and the
#: sum once more: within 2 u (|x| + |pe|) <= 2 u (|x| + 1) + u |x + pe| -- bounded here by 3 roundings of 1 + max|x|.
TOL = {
    torch.float64: dict(rtol=1e-12, atol=1e-10),
    torch.float32: dict(rtol=0.0, atol=3 * unit_roundoff(torch.float32) * (1 + 5.0)),
    torch.bfloat16: dict(rtol=0.0, atol=3 * unit_roundoff(torch.bfloat16) * (1 + 5.0)),
}  # |x| < 5: standard normal draws from a fixed seed (checked in _x)


def _x(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    x = torch.randn(*shape, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    assert x.abs().max() < 5.0  # what TOL assumes
    return x.to(dtype)


@pytest.mark.parametrize("dtype", list(TOL))
@pytest.mark.parametrize("batched", [False, True])
def test_embed_adds_vaswani(dtype, batched):
    b, s, d = 2, 9, 16
    pos = torch.randint(0, 3000, (b, s)) if batched else torch.arange(s) + 40
    x = _x(b, s, d, dtype=dtype)
    rows = pos.reshape(-1, s).tolist()
    pe = torch.from_numpy(np.stack([vaswani(r, d) for r in rows])).reshape(*pos.shape, d)  # (S, D) or (B, S, D)
    out = Sinusoidal(d)(x, pos)
    assert out.dtype == dtype and out.shape == x.shape
    torch.testing.assert_close(out, x + pe.to(dtype), **TOL[dtype])  # the sum is rounded in x.dtype, as documented


@pytest.mark.parametrize("dtype", list(TOL))
def test_embed_2d_adds_mae(dtype):
    w, h, d = 5, 3, 24
    x = _x(2, w * h, d, dtype=dtype)
    pe = torch.from_numpy(get_2d_sincos_pos_embed(d, h, w, base=500.0))  # (H*W, D)
    out = Sinusoidal2D(d, base=500.0)(x, grid_positions(w, h))
    assert out.dtype == dtype and out.shape == x.shape
    torch.testing.assert_close(out, x + pe.to(dtype), **TOL[dtype])


def test_bfloat16_model_gets_the_accurate_encoding():
    """Only the final cast is bf16: at positions ~1e6 a bf16 angle computation would be off by radians."""
    pos = 1_000_000 + torch.arange(8) * 4321
    out = Sinusoidal(32)(torch.zeros(1, 8, 32, dtype=torch.bfloat16), pos)
    expected = torch.from_numpy(vaswani(pos.tolist(), 32)).to(torch.bfloat16)
    torch.testing.assert_close(out[0], expected, rtol=0, atol=0)


def test_hooks_other_than_embed_are_identity():
    enc = Sinusoidal(8)
    q, k = torch.randn(1, 2, 3, 4), torch.randn(1, 2, 3, 4)
    pos = torch.arange(3)
    assert enc.rotate(q, k, pos, pos) == (q, k) and enc.bias(pos, pos) is None and enc.score_mod(pos, pos) is None


def test_nothing_stored():
    """No buffer for ``.to(bfloat16)`` to round, no parameter, empty state dict."""
    for enc in (Sinusoidal(8), Sinusoidal2D(8)):
        assert not list(enc.buffers()) and not list(enc.parameters()) and enc.state_dict() == {}


@pytest.mark.parametrize("cls, pos", [(Sinusoidal, torch.arange(6) + 3), (Sinusoidal2D, grid_positions(3, 2))])
def test_compiles_without_graph_breaks(cls, pos):
    enc, x = cls(8), _x(2, 6, 8)
    torch.testing.assert_close(torch.compile(enc, backend="eager", fullgraph=True)(x, pos), enc(x, pos))


def test_meta_device():
    with torch.device("meta"):
        out = Sinusoidal2D(16)(torch.empty(2, 6, 16, dtype=torch.bfloat16), grid_positions(3, 2))
    assert out.is_meta and out.shape == (2, 6, 16) and out.dtype == torch.bfloat16


# ---- properties ---------------------------------------------------------------------------------------------------


@given(
    quarter=st.integers(1, 16),
    batch=st.integers(1, 3),
    length=st.integers(1, 8),
    dtype=st.sampled_from([torch.float32, torch.float64, torch.bfloat16, torch.float16]),
    two_d=st.booleans(),
)
def test_shape_and_dtype_kept(quarter, batch, length, dtype, two_d):
    enc = Sinusoidal2D(4 * quarter) if two_d else Sinusoidal(4 * quarter)
    x = torch.randn(batch, length, 4 * quarter).to(dtype)
    tail = (2,) if two_d else ()
    for pos in (torch.randint(0, 99, (length, *tail)), torch.randint(0, 99, (batch, length, *tail))):
        out = enc(x, pos)
        assert out.shape == x.shape and out.dtype == dtype


@given(values=st.lists(st.integers(0, 1 << 22), min_size=1, max_size=6), batch=st.integers(1, 3))
def test_integer_float_and_batched_positions_agree(values, batch):
    enc, enc2d = Sinusoidal(12), Sinusoidal2D(12)
    x = torch.randn(batch, len(values), 12, dtype=torch.float64)
    pos = torch.tensor(values)  # (S,)
    grid = torch.stack((pos, pos.flip(0)), dim=-1)  # (S, 2)
    out, out2d = enc(x, pos), enc2d(x, grid)
    for other in (enc(x, pos.double()), enc(x, pos.expand(batch, -1)), enc(x, pos[None])):
        torch.testing.assert_close(other, out, rtol=0, atol=0)
    for other in (enc2d(x, grid.double()), enc2d(x, grid.expand(batch, -1, -1))):
        torch.testing.assert_close(other, out2d, rtol=0, atol=0)


def test_encoding_method_is_the_functional():
    pos = torch.arange(5)
    torch.testing.assert_close(Sinusoidal(8, base=50.0).encoding(pos), sinusoidal_encoding(pos, 8, base=50.0))
    grid = grid_positions(2, 3)
    torch.testing.assert_close(Sinusoidal2D(8).encoding(grid), sinusoidal_2d_encoding(grid, 8))


# ---- configs and registry ----------------------------------------------------------------------------------------


@given(quarter=st.integers(1, 256), base=st.floats(1.01, 1e7))
def test_config_round_trip(quarter, base):
    for cls in (Sinusoidal, Sinusoidal2D):
        enc = cls(4 * quarter, base=base)
        d = enc.config.to_dict()
        assert d == {"dim": 4 * quarter, "base": base}
        again = cls.from_config(json.loads(json.dumps(d)))
        assert type(again) is cls and again.config == enc.config


def test_registered_and_built_by_name():
    enc = posenc.registry.build("sinusoidal", dim=16, num_heads=4, head_dim=4, max_len=128)  # model keys dropped
    assert type(enc) is Sinusoidal and enc.config == SinusoidalConfig(dim=16)
    enc = posenc.registry.build("sinusoidal_2d", dim=16, base=100.0, grid_size=(4, 4))
    assert type(enc) is Sinusoidal2D and enc.config == Sinusoidal2DConfig(dim=16, base=100.0)


# ---- bad input ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "cls, kwargs, pattern",
    [
        (Sinusoidal, dict(dim=7), r"dim=7 is invalid: expected an even number"),
        (Sinusoidal, dict(dim=-2), r"dim=-2 is invalid"),
        (Sinusoidal, dict(dim=True), r"dim=True is invalid"),
        (Sinusoidal, dict(dim=8, base=0.5), r"base=0\.5 is invalid"),
        (Sinusoidal, dict(dim=8, base="1e4"), r"base='1e4' is invalid"),
        (Sinusoidal2D, dict(dim=6), r"dim=6 is invalid: expected a multiple of 4"),
        (Sinusoidal2D, dict(dim=8, base=float("nan")), r"base=nan is invalid"),
    ],
)
def test_bad_config(cls, kwargs, pattern):
    with pytest.raises(ValueError, match=pattern):
        cls(**kwargs)


def test_unknown_config_key():
    with pytest.raises(ValueError, match=r"config\['theta'\]=10000\.0 is invalid"):
        Sinusoidal.from_config({"dim": 8, "theta": 10000.0})


@pytest.mark.parametrize(
    "cls, x, pos, pattern",
    [
        (Sinusoidal, torch.zeros(5, 8), torch.arange(5), r"x\.shape=torch\.Size\(\[5, 8\]\) is invalid: expected \(B"),
        (Sinusoidal, torch.zeros(1, 5, 6), torch.arange(5), r"x\.shape\[-1\]=6 is invalid: expected dim = 8"),
        (Sinusoidal, torch.zeros(1, 5, 8, dtype=torch.int64), torch.arange(5), r"x\.dtype=torch\.int64 is invalid"),
        (Sinusoidal, torch.zeros(2, 5, 8), torch.arange(4), r"positions\.shape=\(4,\) is invalid"),
        (Sinusoidal, torch.zeros(2, 5, 8), torch.zeros(3, 5), r"positions\.shape=\(3, 5\) is invalid"),
        (Sinusoidal, torch.zeros(1, 2, 8), torch.tensor([True, False]), r"positions\.dtype=torch\.bool is invalid"),
        (Sinusoidal2D, torch.zeros(1, 6, 8), torch.arange(6), r"positions\.shape=\(6,\) is invalid"),
        (Sinusoidal2D, torch.zeros(2, 6, 8), torch.zeros(6, 3), r"positions\.shape=\(6, 3\) is invalid"),
        (Sinusoidal2D, torch.zeros(2, 6, 8), torch.zeros(3, 6, 2), r"positions\.shape=\(3, 6, 2\) is invalid"),
    ],
)
def test_bad_inputs(cls, x, pos, pattern):
    with pytest.raises(ValueError, match=pattern):
        cls(8)(x, pos)
