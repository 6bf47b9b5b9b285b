"""The C kernel's cos/sin tables (``native.cos_sin_table``, used by ``rope_cos_sin`` on CPU): the same float32
numbers as torch's float64 ops and as the C library's ``math.cos``/``math.sin``, for every kind of position, split
across any number of threads; and ``rope_cos_sin`` only uses it where nothing else is lost (autograd, compile)."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import posenc
from posenc import kernels
from posenc.functional.rope import angles_of, rope_cos_sin
from posenc.kernels import native
from rotation_rounding import torch_rounds_like_native

pytestmark = pytest.mark.skipif(not native.available(), reason=f"C kernel not built here: {native.error()}")

POSITIONS = {
    "arange": lambda: torch.arange(4096),
    "per token (B, S), large": lambda: torch.randint(0, 2_000_000, (3, 1000)),
    "negative": lambda: -torch.arange(300),
    "fractional": lambda: torch.rand(2, 500, dtype=torch.float64) * 1e5,
    "float32": lambda: torch.rand(700) * 3e4,
    "beyond 2^30 radians, non-finite": lambda: torch.tensor(
        [0.0, 2.0**30, 2.0**30 + 1, -(2.0**31), 1e12, 1e300, float("nan"), float("inf"), -float("inf")],
        dtype=torch.float64,
    ),
    "empty": lambda: torch.arange(0),
}


def _torch_ops(positions, inv_freq, factor):
    if not bool(positions.isfinite().all()):
        # rope_cos_sin refuses non-finite positions; its torch expression, for what the kernel makes of them
        angles = angles_of(positions, inv_freq)
        return (angles.cos() * factor).float(), (angles.sin() * factor).float()
    kernels.use_native = False
    try:
        return rope_cos_sin(positions, inv_freq, attention_factor=factor)
    finally:
        kernels.use_native = True


@pytest.mark.parametrize("case", list(POSITIONS))
@pytest.mark.parametrize("factor", [1.0, 1.2345, torch.tensor(0.75)])
@pytest.mark.parametrize("dims", [128, 6])
def test_tables_equal_torch_float64_ops_bit_for_bit(case, factor, dims):
    positions = POSITIONS[case]()
    inv_freq = posenc.default_inv_freq(dims)
    cos, sin = native.cos_sin_table(positions, inv_freq, float(factor))
    want_cos, want_sin = _torch_ops(positions, inv_freq, factor)
    assert cos.shape == want_cos.shape == (*positions.shape, dims // 2) and cos.dtype == torch.float32
    torch.testing.assert_close(cos, want_cos, rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(sin, want_sin, rtol=0, atol=0, equal_nan=True)


@given(
    positions=st.lists(
        st.one_of(st.integers(-(2**40), 2**40), st.floats(-1e9, 1e9, allow_nan=False)), min_size=1, max_size=40
    ),
    inv_freq=st.lists(st.floats(1e-9, 10.0), min_size=1, max_size=9),
    factor=st.floats(0.1, 4.0),
    threads=st.integers(1, 4),
)
def test_tables_equal_the_c_library_in_any_thread_split(positions, inv_freq, factor, threads):
    """Against the C library's correctly reduced float64 ``cos``/``sin`` (Python's ``math``), rounded once; rows
    split over 1-4 threads at any point give the same bits."""
    pos = torch.tensor([float(p) for p in positions], dtype=torch.float64)
    inv = torch.tensor(inv_freq, dtype=torch.float64)
    old_min, old_threads = native._MIN_PER_THREAD, torch.get_num_threads()
    native._MIN_PER_THREAD, _ = 1, torch.set_num_threads(threads)
    try:
        cos, sin = native.cos_sin_table(pos, inv, factor)
    finally:
        native._MIN_PER_THREAD, _ = old_min, torch.set_num_threads(old_threads)
    angles = [[p * w for w in inv.tolist()] for p in pos.tolist()]
    want_cos = np.array([[math.cos(a) * factor for a in row] for row in angles], dtype=np.float32)
    want_sin = np.array([[math.sin(a) * factor for a in row] for row in angles], dtype=np.float32)
    np.testing.assert_array_equal(cos.numpy(), want_cos)
    np.testing.assert_array_equal(sin.numpy(), want_sin)


def test_rope_cos_sin_and_rotary_embedding_use_it(monkeypatch):
    calls = []
    original = native.cos_sin_table
    monkeypatch.setattr(native, "cos_sin_table", lambda *a: calls.append(1) or original(*a))
    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8}
    emb = posenc.RotaryEmbedding(16, scaling=yarn)
    q, k = torch.randn(1, 4, 5, 16), torch.randn(1, 2, 5, 16)
    got = emb(q, k, torch.arange(5))
    assert calls == [1]  # q and k share positions: one table
    monkeypatch.setattr(kernels, "use_native", False)
    want = emb(q, k, torch.arange(5))
    exact = torch_rounds_like_native(torch.float32, "half", 16)  # the tables are bit-equal (above); the rotation is
    torch.testing.assert_close(got, want, **({"rtol": 0, "atol": 0} if exact else {}))  # where torch fuses alike


@pytest.mark.parametrize(
    "why",
    ["float64 tables", "positions require grad", "inv_freq requires grad", "factor requires grad", "switched off"],
)
def test_torch_ops_run_where_the_kernel_would_lose_something(why, monkeypatch):
    monkeypatch.setattr(native, "cos_sin_table", lambda *a: pytest.fail("the C table kernel ran"))
    positions, inv_freq = torch.arange(6.0), posenc.default_inv_freq(8)
    factor, dtype = 1.5, torch.float32
    if why == "float64 tables":
        dtype = torch.float64
    elif why == "positions require grad":
        positions.requires_grad_()
    elif why == "inv_freq requires grad":
        inv_freq.requires_grad_()
    elif why == "factor requires grad":
        factor = torch.tensor(1.5, requires_grad=True)
    else:
        monkeypatch.setattr(kernels, "use_native", False)
    cos, sin = rope_cos_sin(positions, inv_freq, attention_factor=factor, dtype=dtype)
    if why.endswith("grad"):
        (cos.sum() + sin.sum()).backward()  # gradients still flow through the torch ops


def test_functorch_transforms_take_the_torch_expression():
    """Under ``vmap``/``grad`` tensors are wrappers without storage: tables and rotation go through torch ops
    (which have batching rules) and match the unbatched results."""
    inv_freq = posenc.default_inv_freq(8)
    positions = torch.tensor([[0.0, 3.0, 70.0], [5.0, 1e4, 2.0]])
    batched = torch.vmap(lambda p: rope_cos_sin(p, inv_freq))(positions)
    for got, want in zip(batched, rope_cos_sin(positions, inv_freq), strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=0)

    x = torch.randn(2, 4, 3, 8)
    cos, sin = rope_cos_sin(torch.arange(3), inv_freq)
    rotated = torch.vmap(lambda xi: posenc.apply_rotary(xi, cos, sin))(x)
    torch.testing.assert_close(rotated, posenc.apply_rotary(x, cos, sin))  # float32 round-off apart at most
    grad = torch.func.grad(lambda xi: posenc.apply_rotary(xi, cos, sin).square().sum())(x)
    torch.testing.assert_close(grad, 2 * x)  # a rotation keeps norms: d|Rx|^2/dx = 2x
