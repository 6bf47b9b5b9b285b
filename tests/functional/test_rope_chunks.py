"""Low-precision inputs are rotated in float32 one cache-sized piece at a time; pieces must not change results."""

import pytest
import torch

import posenc
from posenc.functional import rope as rope_module


@pytest.fixture(autouse=True)
def _tiny_chunks(monkeypatch):
    monkeypatch.setattr(rope_module, "_CHUNK_BYTES", 512)  # a few rows per piece, so every path splits


def _tables(positions, rotary_dim):
    inv_freq = posenc.default_inv_freq(rotary_dim)
    cos, sin = posenc.rope_cos_sin(positions, inv_freq)
    if positions.dim() == 2:
        cos, sin = cos.unsqueeze(-3), sin.unsqueeze(-3)  # (B, 1, S, F)
    return cos, sin


def _inputs(kind, dtype):
    x = torch.randn(3, 5, 7, 16).to(dtype)  # (B, H, S, D)
    if kind == "transposed":  # q = proj(x).view(B, S, H, D).transpose(1, 2): not viewable as (-1, S, D)
        return torch.randn(3, 7, 5, 16).to(dtype).transpose(1, 2)
    if kind == "3d":
        return x[0]
    return x


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("rotary_dim", [16, 8])
@pytest.mark.parametrize(
    ("kind", "batched_positions"),
    [("contiguous", False), ("contiguous", True), ("transposed", False), ("transposed", True), ("3d", False)],
)
def test_pieces_equal_one_float32_rotation(dtype, layout, rotary_dim, kind, batched_positions):
    x = _inputs(kind, dtype)
    positions = torch.stack([torch.arange(7) + 3 * b for b in range(3)]) if batched_positions else torch.arange(7)
    cos, sin = _tables(positions, rotary_dim)
    got = posenc.apply_rotary(x, cos, sin, layout=layout)
    want = posenc.apply_rotary(x.float(), cos, sin, layout=layout).to(dtype)  # one float32 pass, rounded once
    assert got.dtype == dtype and got.shape == x.shape
    torch.testing.assert_close(got, want, rtol=0, atol=0)
