"""LearnedPositions / LearnedPositions2D: lookups, gradients, explicit resizing, configs, errors."""

import json

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import posenc
from posenc.encodings.learned import Learned2DConfig, LearnedConfig, LearnedPositions, LearnedPositions2D
from posenc.functional.axial_rope import grid_positions
from posenc.functional.learned import resize_table_1d, resize_table_2d


def _x(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(*shape, dtype=torch.float64, generator=torch.Generator().manual_seed(0)).to(dtype)


# ---- lookups ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("batched", [False, True])
def test_embed_adds_table_rows(batched):
    b, s, d = 2, 5, 4
    enc = LearnedPositions(d, 10)
    pos = torch.tensor([[0, 9, 3, 3, 1], [2, 2, 8, 0, 5]]) if batched else torch.tensor([7, 0, 2, 9, 4])
    x = _x(b, s, d)
    rows = pos.expand(b, s)
    expected = torch.stack([torch.stack([x[i, j] + enc.table[rows[i, j]] for j in range(s)]) for i in range(b)])
    torch.testing.assert_close(enc(x, pos), expected, rtol=0, atol=0)


def test_embed_2d_reads_table_y_x():
    """On ``grid_positions(W, H)`` the encoding is the table flattened row-major: token y * W + x is table[y, x]."""
    w, h, d = 4, 3, 5
    enc = LearnedPositions2D(d, (w, h))
    out = enc(torch.zeros(1, w * h, d), grid_positions(w, h))
    torch.testing.assert_close(out[0], enc.table.detach().reshape(h * w, d), rtol=0, atol=0)
    pos = torch.tensor([[3, 0], [0, 2], [1, 1]])  # (x, y) rows
    out = enc(torch.zeros(1, 3, d), pos)
    expected = torch.stack([enc.table[0, 3], enc.table[2, 0], enc.table[1, 1]]).detach()
    torch.testing.assert_close(out[0], expected, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float64])
def test_table_is_cast_to_the_input_dtype(dtype):
    enc, x = LearnedPositions(8, 6), _x(2, 6, 8, dtype=dtype)
    out = enc(x, torch.arange(6))
    assert out.dtype == dtype
    torch.testing.assert_close(out, x + enc.table.detach().to(dtype), rtol=0, atol=0)


def test_gradient_reaches_the_table():
    d = 3
    enc = LearnedPositions(d, 6)
    pos = torch.tensor([[1, 4, 1], [5, 1, 0]])
    x = _x(2, 3, d).requires_grad_()
    weights = _x(2, 3, d)
    (enc(x, pos) * weights).sum().backward()
    expected = torch.zeros(6, d, dtype=torch.float32).index_add_(0, pos.reshape(-1), weights.reshape(-1, d))
    torch.testing.assert_close(enc.table.grad, expected)
    torch.testing.assert_close(x.grad, weights, rtol=0, atol=0)


def test_gradient_reaches_the_2d_table():
    w, h, d = 3, 2, 4
    enc = LearnedPositions2D(d, (w, h))
    weights = _x(1, w * h, d)
    (enc(torch.zeros(1, w * h, d), grid_positions(w, h)) * weights).sum().backward()
    torch.testing.assert_close(enc.table.grad, weights.reshape(h, w, d), rtol=0, atol=0)


def test_reset_parameters_is_a_truncated_normal():
    enc = LearnedPositions(64, 512, init_std=0.05)
    table = enc.table.detach()
    assert table.abs().max() <= 0.1 and 0.03 < table.std() < 0.05  # cut at 2 std: std of the cut normal ~0.88 sigma
    before = table.clone()
    enc.reset_parameters()
    assert not torch.equal(enc.table.detach(), before)


# ---- properties ---------------------------------------------------------------------------------------------------

dtype_st = st.sampled_from([torch.float32, torch.float64, torch.bfloat16])


@given(max_len=st.integers(1, 20), dim=st.integers(1, 6), batch=st.integers(1, 3), data=st.data())
def test_integer_float_and_batched_positions_agree(max_len, dim, batch, data):
    enc = LearnedPositions(dim, max_len)
    values = data.draw(st.lists(st.integers(0, max_len - 1), min_size=1, max_size=6))
    x = torch.randn(batch, len(values), dim)
    pos = torch.tensor(values)
    out = enc(x, pos)
    assert out.shape == x.shape and out.dtype == x.dtype
    for other in (pos.float(), pos.double(), pos.expand(batch, -1), pos[None], pos.int()):
        torch.testing.assert_close(enc(x, other), out, rtol=0, atol=0)


@given(w=st.integers(1, 6), h=st.integers(1, 6), batch=st.integers(1, 3), dtype=dtype_st)
def test_2d_shape_dtype_and_batched_positions(w, h, batch, dtype):
    enc, x = LearnedPositions2D(4, (w, h)), torch.randn(batch, w * h, 4).to(dtype)
    pos = grid_positions(w, h)
    out = enc(x, pos)
    assert out.shape == x.shape and out.dtype == dtype
    for other in (pos.long(), pos.expand(batch, -1, -1), pos[None]):
        torch.testing.assert_close(enc(x, other), out, rtol=0, atol=0)


@given(max_len=st.integers(1, 30), w=st.integers(1, 8), h=st.integers(1, 8))
def test_resized_to_the_same_size_is_identity(max_len, w, h):
    for enc, size in ((LearnedPositions(3, max_len), max_len), (LearnedPositions2D(3, (w, h)), (w, h))):
        torch.testing.assert_close(enc.resized(size).table, enc.table, rtol=0, atol=0)


# ---- explicit resizing --------------------------------------------------------------------------------------------


def test_resized_returns_a_new_interpolated_module():
    enc = LearnedPositions(4, 8, init_std=0.1)
    before = enc.table.detach().clone()
    longer = enc.resized(20)
    assert type(longer) is LearnedPositions and longer is not enc
    assert longer.config == LearnedConfig(dim=4, max_len=20, init_std=0.1)
    assert longer.table.shape == (20, 4) and longer.table.requires_grad and not longer.table.is_meta
    torch.testing.assert_close(longer.table.detach(), resize_table_1d(before, 20), rtol=0, atol=0)
    torch.testing.assert_close(enc.table.detach(), before, rtol=0, atol=0)  # untouched
    assert enc.config.max_len == 8
    x = torch.zeros(1, 3, 4)
    torch.testing.assert_close(longer(x, torch.tensor([19, 8, 0]))[0], longer.table.detach()[[19, 8, 0]])


def test_resized_2d_returns_a_new_bicubic_module():
    enc = LearnedPositions2D(4, (3, 2))
    before = enc.table.detach().clone()
    bigger = enc.resized((5, 4))
    assert type(bigger) is LearnedPositions2D and bigger.config == Learned2DConfig(dim=4, grid_size=(5, 4))
    assert bigger.table.shape == (4, 5, 4)  # (H', W', D)
    torch.testing.assert_close(bigger.table.detach(), resize_table_2d(before, (5, 4)), rtol=0, atol=0)
    smooth = enc.resized((5, 4), antialias=True).table.detach()
    torch.testing.assert_close(smooth, resize_table_2d(before, (5, 4), antialias=True), rtol=0, atol=0)
    torch.testing.assert_close(enc.table.detach(), before, rtol=0, atol=0)
    assert bigger(torch.zeros(2, 20, 4), grid_positions(5, 4)).shape == (2, 20, 4)


def test_resized_2d_keeps_orientation():
    """A table varying only along x keeps varying only along x in the resized module."""
    enc = LearnedPositions2D(2, (4, 3))
    with torch.no_grad():
        enc.table.copy_(torch.randn(1, 4, 2).expand(3, 4, 2))
    table = enc.resized((7, 5)).table.detach()  # (5, 7, 2)
    torch.testing.assert_close(table, table[:1].expand_as(table))
    assert (table[:, 1:] - table[:, :-1]).abs().max() > 1e-3


def test_resized_keeps_dtype_mode_and_frozen_table():
    enc = LearnedPositions(4, 8).to(torch.bfloat16).requires_grad_(False).eval()
    out = enc.resized(12)
    assert out.table.dtype == torch.bfloat16 and not out.table.requires_grad and not out.training


# ---- module plumbing ----------------------------------------------------------------------------------------------


def test_state_dict_round_trip():
    enc, other = LearnedPositions2D(4, (3, 2)), LearnedPositions2D(4, (3, 2))
    assert list(enc.state_dict()) == ["table"]
    other.load_state_dict(enc.state_dict(), strict=True)
    x, pos = _x(1, 6, 4), grid_positions(3, 2)
    torch.testing.assert_close(other(x, pos), enc(x, pos), rtol=0, atol=0)


def test_meta_device_build():
    with torch.device("meta"):
        enc = LearnedPositions(8, 16)
        out = enc(torch.empty(2, 5, 8, dtype=torch.bfloat16), torch.arange(5))
    assert enc.table.is_meta and enc.table.shape == (16, 8)
    assert out.is_meta and out.shape == (2, 5, 8) and out.dtype == torch.bfloat16


@pytest.mark.parametrize("two_d", [False, True])
def test_compiles_without_graph_breaks(two_d):
    """The data-dependent range check is skipped while tracing, so the graph has no break."""
    enc = LearnedPositions2D(4, (3, 2)) if two_d else LearnedPositions(4, 6)
    pos = grid_positions(3, 2) if two_d else torch.tensor([5, 0, 2, 2, 1, 3])
    x = _x(2, 6, 4)
    torch.testing.assert_close(torch.compile(enc, backend="eager", fullgraph=True)(x, pos), enc(x, pos))


@given(dim=st.integers(1, 1024), max_len=st.integers(1, 1 << 16), w=st.integers(1, 64), h=st.integers(1, 64))
def test_config_round_trip(dim, max_len, w, h):
    for config in (LearnedConfig(dim=dim, max_len=max_len), Learned2DConfig(dim=dim, grid_size=(w, h), init_std=0.1)):
        d = json.loads(json.dumps(config.to_dict()))
        assert type(config).from_dict(d) == config
    assert Learned2DConfig(dim=dim, grid_size=[w, h]).grid_size == (w, h)  # lists (JSON) become tuples


def test_from_config_and_registry():
    enc = LearnedPositions2D.from_config({"dim": 8, "grid_size": [4, 3], "init_std": 0.02})
    assert enc.table.shape == (3, 4, 8) and enc.config.grid_size == (4, 3)
    enc = posenc.registry.build("learned", dim=8, max_len=32, num_heads=2, grid_size=(2, 2))  # model keys
    assert type(enc) is LearnedPositions and enc.config == LearnedConfig(dim=8, max_len=32)
    enc = posenc.registry.build("learned_2d", dim=8, grid_size=(4, 3), max_len=32)
    assert type(enc) is LearnedPositions2D and enc.table.shape == (3, 4, 8)


# ---- bad input ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "pos, pattern",
    [
        (
            torch.tensor([0, 1, 2, 16, 3]),
            r"positions\[3\]=16 is invalid: expected a position in \[0, 16\).*\.resized\(",
        ),
        (torch.tensor([[0, 1, 2, 3, -1]]), r"positions\[0, 4\]=-1 is invalid: .*max_len=16"),
        (torch.tensor([0.0, 1.5, 2, 3, 4]), r"positions\[1\]=1\.5 is invalid: expected a whole number"),
        (torch.tensor([0.0, 1, float("nan"), 3, 4]), r"positions\[2\]=nan is invalid"),
        (torch.tensor([0.0, 1, float("inf"), 3, 4]), r"positions\[2\]=inf is invalid: expected a position"),
        (torch.tensor([True] * 5), r"positions\.dtype=torch\.bool is invalid"),
        (torch.arange(4), r"positions\.shape=\(4,\) is invalid"),
    ],
)
def test_bad_positions(pos, pattern):
    with pytest.raises(ValueError, match=pattern):
        LearnedPositions(8, 16)(torch.zeros(2, 5, 8), pos)


@pytest.mark.parametrize(
    "pos, pattern",
    [
        (torch.tensor([[0, 0], [3, 1], [4, 2]]), r"positions\[2, 0\]=4 is invalid: expected an x position in \[0, 4\)"),
        (torch.tensor([[0, 0], [3, 3], [1, 2]]), r"positions\[1, 1\]=3 is invalid: expected a y position in \[0, 3\)"),
        (torch.tensor([[0.0, 0], [1, 0.5], [1, 2]]), r"positions\[1, 1\]=0\.5 is invalid: expected a whole number"),
        (torch.tensor([[0, 0], [1, 1], [2, 2]])[None].expand(2, 3, 2) * 2, r"positions\[0, 2, 0\]=4 .*\.resized\("),
        (torch.arange(3), r"positions\.shape=\(3,\) is invalid"),
    ],
)
def test_bad_grid_positions(pos, pattern):
    with pytest.raises(ValueError, match=pattern):
        LearnedPositions2D(8, (4, 3))(torch.zeros(2, 3, 8), pos)


@pytest.mark.parametrize(
    "build, pattern",
    [
        (lambda: LearnedPositions(0, 8), r"dim=0 is invalid"),
        (lambda: LearnedPositions(8, 0), r"max_len=0 is invalid"),
        (lambda: LearnedPositions(8, 16.0), r"max_len=16\.0 is invalid"),
        (lambda: LearnedPositions(8, 16, init_std=0.0), r"init_std=0\.0 is invalid"),
        (lambda: LearnedPositions(8, 16, init_std=float("nan")), r"init_std=nan is invalid"),
        (lambda: LearnedPositions2D(8, (0, 3)), r"grid_size\[0\]=0 is invalid"),
        (lambda: LearnedPositions2D(8, (3,)), r"grid_size=\(3,\) is invalid: expected a pair \(W, H\)"),
        (lambda: LearnedPositions2D(8, 16), r"grid_size=16 is invalid"),
        (lambda: LearnedPositions(8, 16).resized(0), r"new_len=0 is invalid"),
        (lambda: LearnedPositions2D(8, (2, 2)).resized((4, 0)), r"new_grid_size\[1\]=0 is invalid"),
        (lambda: LearnedPositions(8, 16)(torch.zeros(1, 2, 4), torch.arange(2)), r"x\.shape\[-1\]=4 is invalid"),
    ],
)
def test_bad_config_and_arguments(build, pattern):
    with pytest.raises(ValueError, match=pattern):
        build()
