"""The fused CPU path (``posenc.kernels.cpu``) == the float64 formula and == the eager path, on full tensors.

These run whichever path users get here: the C kernel where it builds, else the blocked torch path (``chunk``
sizes only matter there). ``test_native.py`` compares the two directly.
"""

import pytest
import torch

import posenc
from posenc import kernels
from posenc.functional.rope import table_dtype
from posenc.kernels import cpu, native
from reference.rope_float64 import rotate_float64
from rotation_rounding import assert_rotations_agree, torch_rounds_like_native

TOL = {torch.float64: (1e-12, 1e-12), torch.float32: (1.3e-6, 1e-5), torch.bfloat16: (1.6e-2, 1e-5)}


@pytest.fixture(params=["tiny", "default"])
def chunk(request, monkeypatch):
    """``tiny`` blocks split every input (both along positions and along dim 0); ``default`` is what users get."""
    if request.param == "tiny":
        monkeypatch.setattr(cpu, "_CHUNK_BYTES", 256)
    return request.param


def _case(kind, dtype, positions_kind, rotary_dim, d=16, s=7):
    b, h = 3, 5
    x = {
        "contiguous": lambda: torch.randn(b, h, s, d),
        "transposed": lambda: torch.randn(b, s, h, d).transpose(1, 2),  # (B, S, H, D) -> (B, H, S, D) view
        "3d": lambda: torch.randn(h, s, d),
        "2d": lambda: torch.randn(s, d),
    }[kind]().to(dtype)
    positions = {
        "shared": torch.arange(s) + 11,
        "batched": torch.stack([torch.randperm(s) * (i + 1) for i in range(b)]),  # (B, S), per-token positions
        "one-row": (torch.arange(s) * 3).unsqueeze(0),  # (1, S)
    }[positions_kind]
    inv_freq = posenc.default_inv_freq(rotary_dim)
    cos, sin = posenc.rope_cos_sin(positions, inv_freq, dtype=table_dtype(dtype))
    if positions.dim() == 2:
        cos, sin = cos.unsqueeze(-3), sin.unsqueeze(-3)  # (B|1, S, F) -> (B|1, 1, S, F): shared by the heads
    return x, positions, inv_freq, cos, sin


CASES = [
    (kind, pk)
    for kind in ("contiguous", "transposed", "3d", "2d")
    for pk in ("shared", "batched", "one-row")
    if kind in ("contiguous", "transposed") or pk == "shared"
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("rotary_dim", [16, 8])
@pytest.mark.parametrize(("kind", "positions_kind"), CASES)
def test_matches_float64_formula_and_eager_path(chunk, dtype, layout, rotary_dim, kind, positions_kind, monkeypatch):
    x, positions, inv_freq, cos, sin = _case(kind, dtype, positions_kind, rotary_dim)
    got = cpu.rotary(x, cos, sin, layout=layout)
    assert got.shape == x.shape and got.dtype == dtype

    want = rotate_float64(x, positions, inv_freq, layout=layout)
    rtol, atol = TOL[dtype]
    torch.testing.assert_close(got.double(), want, rtol=rtol, atol=atol)
    torch.testing.assert_close(got[..., rotary_dim:], x[..., rotary_dim:], rtol=0, atol=0)  # pass-through

    # Bit-equal to the eager path it replaces where the C kernel and torch's ops round alike; elsewhere (torch's
    # complex multiply fuses multiply-adds in its scalar loop only: interleaved pairs with F not a multiple of its
    # vector step) within the bound of two evaluations of the rotation (tests/rotation_rounding.py). Without the
    # kernel both sides are torch's ops, rounded alike.
    monkeypatch.setattr(kernels, "use_cpu", False)
    eager = posenc.apply_rotary(x, cos, sin, layout=layout)
    if not native.supports(dtype) or torch_rounds_like_native(dtype, layout, rotary_dim):
        torch.testing.assert_close(got, eager, rtol=0, atol=0)
    else:
        assert_rotations_agree(got, eager, x, cos, sin, layout)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("rotary_dim", [16, 8])
@pytest.mark.parametrize(("kind", "positions_kind"), [("contiguous", "batched"), ("transposed", "shared")])
def test_inplace_overwrites_x_with_the_out_of_place_result(chunk, dtype, layout, rotary_dim, kind, positions_kind):
    x, _, _, cos, sin = _case(kind, dtype, positions_kind, rotary_dim)
    expected = cpu.rotary(x, cos, sin, layout=layout)
    before, ptr = x.clone(), x.data_ptr()
    out = cpu.rotary_(x, cos, sin, layout=layout)
    assert out is x and x.data_ptr() == ptr
    torch.testing.assert_close(x, expected, rtol=0, atol=0)
    torch.testing.assert_close(x[..., rotary_dim:], before[..., rotary_dim:], rtol=0, atol=0)


def test_many_heads_few_positions_split_along_dim_zero(monkeypatch):
    """One position across all rows is bigger than a block: blocks split dim 0 too, per-row tables follow."""
    monkeypatch.setattr(cpu, "_CHUNK_BYTES", 64)
    x, positions, inv_freq, cos, sin = _case("contiguous", torch.float32, "batched", 16, s=2)
    got = cpu.rotary(x, cos, sin, layout="half")
    torch.testing.assert_close(got.double(), rotate_float64(x, positions, inv_freq), rtol=1.3e-6, atol=1e-5)


@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_rotary_embedding_uses_it_and_gradients_are_the_inverse_rotation(layout, monkeypatch):
    emb = posenc.RotaryEmbedding(16, layout=layout, partial_rotary_factor=0.5)
    positions = torch.tensor([[0, 5, 40], [7, 1, 2]])
    q = torch.randn(2, 4, 3, 16, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, 2, 3, 16, dtype=torch.float64, requires_grad=True)
    monkeypatch.setattr(cpu, "_CHUNK_BYTES", 256)  # these tiny tensors take the fused path too
    calls = []
    original = cpu.rotary
    monkeypatch.setattr(cpu, "rotary", lambda *a, **kw: calls.append(1) or original(*a, **kw))
    out_q, out_k = emb(q, k, positions)
    assert calls  # forward went through the fused path
    assert torch.autograd.gradcheck(lambda q, k: emb(q, k, positions), (q, k))
    monkeypatch.setattr(kernels, "use_cpu", False)
    ref_q, ref_k = emb(q, k, positions)
    # bit-equal where torch rounds like the fused path (tests/rotation_rounding.py), else within float64 defaults
    exact = {"rtol": 0, "atol": 0} if torch_rounds_like_native(torch.float64, layout, 8) else {}
    torch.testing.assert_close(out_q, ref_q, **exact)
    torch.testing.assert_close(out_k, ref_k, **exact)


def test_bad_input_names_the_parameter():
    x = torch.randn(2, 3, 8)
    cos, sin = torch.ones(3, 4), torch.zeros(3, 4)
    with pytest.raises(ValueError, match="layout"):
        cpu.rotary(x, cos, sin, layout="neox")
    with pytest.raises(ValueError, match="cos.shape"):
        cpu.rotary(x, torch.ones(5, 4), torch.ones(5, 4))
    with pytest.raises(ValueError, match="x.shape"):
        cpu.rotary(x, torch.ones(3, 5), torch.ones(3, 5))
    with pytest.raises(ValueError, match="x.dtype"):
        cpu.rotary(x.long(), cos, sin)
    with pytest.raises(ValueError, match="sin.shape"):
        cpu.rotary(x, cos, sin[:2])
