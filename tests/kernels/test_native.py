"""The C kernel (``posenc.kernels.native``): bit-equal to the blocked torch path it stands in for, close to the
float64 formula, the same however its rows are split across threads; and its build, cache and fallbacks."""

import stat
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import posenc
from posenc import kernels
from posenc.functional.rope import table_dtype
from posenc.kernels import cpu, native
from reference.rope_float64 import rotate_float64
from rotation_rounding import assert_rotations_agree, torch_rounds_like_native

needs_kernel = pytest.mark.skipif(not native.available(), reason=f"C kernel not built here: {native.error()}")
TOL = {
    torch.float64: (1e-12, 1e-12),
    torch.float32: (1.3e-6, 1e-5),
    torch.bfloat16: (1.6e-2, 1e-5),
    torch.float16: (1e-3, 1e-5),
}


def _x(view: str, dtype: torch.dtype, b=2, h=3, s=5, d=16) -> torch.Tensor:
    """q-like ``(B, H, S, D)`` tensors as callers hold them: contiguous, or views with unit channel stride."""
    return {
        "contiguous": lambda: torch.randn(b, h, s, d),
        "transposed": lambda: torch.randn(b, s, h, d).transpose(1, 2),  # (B, S, H, D) -> (B, H, S, D)
        "qkv slice": lambda: torch.randn(b, s, 3, h, d)[:, :, 1].transpose(1, 2),  # k out of a fused qkv
    }[view]().to(dtype)


def _tables(positions: torch.Tensor, rotary_dim: int, dtype: torch.dtype):
    inv_freq = posenc.default_inv_freq(rotary_dim)
    cos, sin = posenc.rope_cos_sin(positions, inv_freq, dtype=table_dtype(dtype))
    if positions.dim() == 2:
        cos, sin = cos.unsqueeze(-3), sin.unsqueeze(-3)  # (B, S, F) -> (B, 1, S, F): shared by the heads
    return inv_freq, cos, sin


def _blocked(x, cos, sin, layout, *, inplace=False):
    kernels.use_native = False
    try:
        return cpu.rotary(x, cos, sin, layout=layout, inplace=inplace)
    finally:
        kernels.use_native = True


#: Head dims whose F = D/2 is and is not a multiple of torch's vector step (8 float32 / 4 float64 on AVX2).
HEAD_DIMS = [16, 6, 10, 12, 20, 36, 68, 100]


@needs_kernel
@pytest.mark.parametrize("dtype", list(TOL))
@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("d", HEAD_DIMS)
@pytest.mark.parametrize("partial", [False, True])
@pytest.mark.parametrize("view", ["contiguous", "transposed", "qkv slice"])
@pytest.mark.parametrize("per_token", [False, True])
def test_matches_blocked_path_and_float64_formula(dtype, layout, d, partial, view, per_token):
    """Bit-equal to the torch path (``POSENC_NATIVE=0``) where both round alike (``torch_rounds_like_native``: the
    half layout, and the interleaved one for F a multiple of torch's vector step); elsewhere within the bound two
    evaluations of the rotation can differ by (``tests/rotation_rounding.py``), a rounding of its terms."""
    rotary_dim = 2 * (d // 4) if partial else d
    x = _x(view, dtype, d=d)
    positions = torch.stack([torch.randperm(5) * 7, torch.arange(5) + 1000]) if per_token else torch.arange(5) + 3
    inv_freq, cos, sin = _tables(positions, rotary_dim, dtype)
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    assert native.rotary_into(x, out, cos, sin, layout=layout)

    rtol, atol = TOL[dtype]
    torch.testing.assert_close(
        out.double(), rotate_float64(x, positions, inv_freq, layout=layout), rtol=rtol, atol=atol
    )
    torch.testing.assert_close(out[..., rotary_dim:], x[..., rotary_dim:], rtol=0, atol=0)
    blocked = _blocked(x, cos, sin, layout)
    if torch_rounds_like_native(dtype, layout, rotary_dim):
        torch.testing.assert_close(out, blocked, rtol=0, atol=0)
    else:
        assert_rotations_agree(out, blocked, x, cos, sin, layout)

    # In place: the same values in x, the channels past 2F untouched.
    y, before = x.clone(), x.clone()
    assert native.rotary_into(y, y, cos, sin, layout=layout)
    torch.testing.assert_close(y, out, rtol=0, atol=0)
    torch.testing.assert_close(y[..., rotary_dim:], before[..., rotary_dim:], rtol=0, atol=0)


@needs_kernel
@given(
    b=st.integers(1, 3),
    h=st.integers(1, 4),
    s=st.integers(1, 9),
    half_rot=st.integers(1, 4),
    extra=st.sampled_from([0, 2, 4]),
    layout=st.sampled_from(["half", "interleaved"]),
    dtype=st.sampled_from([torch.float32, torch.bfloat16]),
    threads=st.integers(2, 5),
    per_token=st.booleans(),
    cut=st.integers(0, 9),
)
def test_any_thread_split_and_any_chunk_of_positions_give_the_same_bits(
    b, h, s, half_rot, extra, layout, dtype, threads, per_token, cut
):
    """Rows split across threads at arbitrary points (mid-head, mid-batch) and positions rotated in two chunks
    both equal the one-thread, one-call result exactly: every row depends only on its own position."""
    rotary_dim = 2 * half_rot
    x = torch.randn(b, h, s, rotary_dim + extra).to(dtype)
    positions = torch.randint(0, 5000, (b, s) if per_token else (s,))
    _, cos, sin = _tables(positions, rotary_dim, dtype)
    whole = torch.empty_like(x)
    assert native.rotary_into(x, whole, cos, sin, layout=layout)

    old_min, old_threads = native._MIN_PER_THREAD, torch.get_num_threads()
    native._MIN_PER_THREAD, _ = 1, torch.set_num_threads(threads)
    try:
        split = torch.empty_like(x)
        assert native.rotary_into(x, split, cos, sin, layout=layout)
    finally:
        native._MIN_PER_THREAD, _ = old_min, torch.set_num_threads(old_threads)
    torch.testing.assert_close(split, whole, rtol=0, atol=0)

    cut = min(cut, s)
    chunks = torch.empty_like(x)
    for lo, hi in ((0, cut), (cut, s)):
        c, sn = cos[..., lo:hi, :], sin[..., lo:hi, :]
        assert native.rotary_into(x[..., lo:hi, :], chunks[..., lo:hi, :], c, sn, layout=layout)
    torch.testing.assert_close(chunks, whole, rtol=0, atol=0)


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_nan_and_inf_propagate_as_in_the_blocked_path(dtype, layout):
    """A NaN poisons its pair, an infinity gives inf or NaN (inf * 0): the same as torch's ops, never a number."""
    x = torch.randn(2, 3, 6, 16).to(dtype)
    x[0, 1, 2, 3], x[1, 0, 4, 9], x[1, 2, 0, 0] = float("nan"), float("inf"), -float("inf")
    positions = torch.tensor([0, 1, 2, 3, 700, 10_000])  # position 0: cos 1, sin 0, so inf * sin = NaN
    _, cos, sin = _tables(positions, 16, dtype)
    out = torch.empty_like(x)
    assert native.rotary_into(x, out, cos, sin, layout=layout)
    want = _blocked(x, cos, sin, layout)
    assert out.isnan().any() and out.isinf().any()
    assert (out.isnan() == want.isnan()).all() and (out.isinf() == want.isinf()).all()
    if torch_rounds_like_native(dtype, layout, 16):
        torch.testing.assert_close(out, want, rtol=0, atol=0, equal_nan=True)
    else:  # the finite pairs within the bound (rotation_rounding), the others as above
        finite = out.isfinite()
        assert_rotations_agree(out.where(finite, 0), want.where(finite, 0), x.where(x.isfinite(), 0), cos, sin, layout)


@needs_kernel
def test_rotary_embedding_and_apply_rotary_use_it(monkeypatch):
    calls = []
    original = native.rotary_into
    monkeypatch.setattr(native, "rotary_into", lambda *a, **kw: calls.append(1) or original(*a, **kw))
    emb = posenc.RotaryEmbedding(16)
    q, k = torch.randn(1, 4, 3, 16, dtype=torch.bfloat16), torch.randn(1, 2, 3, 16, dtype=torch.bfloat16)
    positions = torch.arange(3)
    got = emb(q, k, positions)
    assert len(calls) == 2
    monkeypatch.setattr(kernels, "use_native", False)
    want = emb(q, k, positions)
    torch.testing.assert_close(got, want, rtol=0, atol=0)


@needs_kernel
def test_threads_follow_torch_set_num_threads():
    """Built with OpenMP, the kernel runs on the runtime torch loaded, so torch's thread setting is its own."""
    if "OpenMP" not in native.describe():
        pytest.skip(f"built without OpenMP here: {native.describe()}")
    before = torch.get_num_threads()
    try:
        for n in (1, 3):
            torch.set_num_threads(n)
            assert native._state["lib"].posenc_rope_max_threads() == n
    finally:
        torch.set_num_threads(before)


@needs_kernel
def test_declines_what_it_cannot_take():
    x = torch.randn(2, 5, 16)
    cos, sin = torch.ones(5, 8), torch.zeros(5, 8)
    out = torch.empty_like(x)
    assert not native.rotary_into(x.transpose(-1, -2).contiguous().transpose(-1, -2), out, cos, sin, layout="half")
    assert not native.rotary_into(x, out, cos.double(), sin.double(), layout="half")  # tables not float32
    assert not native.rotary_into(x.double(), out.double(), cos, sin, layout="half")  # float64 wants float64 tables
    assert not native.rotary_into(x, out.half(), cos, sin, layout="half")
    deep = torch.randn((1,) * 16 + (5, 16))  # 17 leading dims: more than rope.c indexes
    assert not native.rotary_into(deep, torch.empty_like(deep), cos, sin, layout="half")
    expanded = torch.randn(2, 1, 5, 16).expand(2, 3, 5, 16)  # three heads sharing one memory row
    assert not native.rotary_into(expanded, expanded, cos, sin, layout="half")
    with pytest.raises(RuntimeError, match="single memory location"):
        cpu.rotary_(expanded, cos, sin)  # torch's own error, not rows rotated three times over
    # cpu.rotary still answers those, through the blocked path.
    strided = x.transpose(-1, -2).contiguous().transpose(-1, -2)
    torch.testing.assert_close(cpu.rotary(strided, cos, sin), cpu.rotary(x, cos, sin), rtol=0, atol=0)


# Build, cache and fallbacks: a fresh module state each, so nothing leaks into the cached kernel other tests use.


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    monkeypatch.setattr(native, "_state", {})
    monkeypatch.setenv("POSENC_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("POSENC_NATIVE", raising=False)
    return tmp_path


@needs_kernel
def test_builds_once_into_the_cache_then_loads_without_compiling(fresh, monkeypatch):
    assert native.available() and native.error() is None
    built = list((fresh / "cache").glob("rope-*.so"))
    assert len(built) == 1
    assert not [p for p in (fresh / "cache").iterdir() if p not in built]  # no temporary files left behind

    monkeypatch.setattr(native, "_state", {})
    monkeypatch.setattr(native, "_build", lambda *a: pytest.fail("rebuilt although the cache holds the kernel"))
    assert native.available()
    x = torch.randn(3, 4, 8)
    cos, sin = torch.rand(4, 4), torch.rand(4, 4)
    got, want = cpu.rotary(x, cos, sin), _blocked(x, cos, sin, "half")
    if torch_rounds_like_native(x.dtype, "half", 2 * cos.shape[-1]):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert_rotations_agree(got, want, x, cos, sin, "half")


def test_disabled_by_environment_falls_back_to_the_blocked_path(fresh, monkeypatch):
    monkeypatch.setenv("POSENC_NATIVE", "0")
    assert not native.available()
    assert "POSENC_NATIVE=0" in native.error()
    assert not native.supports(torch.float32)
    x = torch.randn(2, 3, 6, 8)
    positions = torch.arange(6)
    inv_freq, cos, sin = _tables(positions, 8, torch.float32)
    rtol, atol = TOL[torch.float32]
    torch.testing.assert_close(
        cpu.rotary(x, cos, sin).double(), rotate_float64(x, positions, inv_freq), rtol=rtol, atol=atol
    )


def test_no_compiler_is_reported(fresh, monkeypatch):
    monkeypatch.setattr(native, "_compiler", lambda: None)
    assert not native.available()
    assert "no C compiler" in native.error()


def test_a_failing_compiler_is_reported_and_leaves_nothing(fresh, monkeypatch):
    bad = fresh / "badcc"
    bad.write_text("#!/bin/sh\n[ \"$1\" = --version ] && exit 0\necho 'badcc: boom' >&2\nexit 1\n")
    bad.chmod(bad.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("CC", str(bad))
    assert not native.available()
    assert "boom" in native.error()
    assert not list((fresh / "cache").glob("*"))  # the failed build left nothing behind


def test_a_compiler_that_cannot_run_is_reported(fresh, monkeypatch):
    broken = fresh / "notexecutable"
    broken.write_text("not a program")
    monkeypatch.setattr(native, "_compiler", lambda: str(broken))
    assert not native.available()
    assert "could not run" in native.error()


def test_any_other_build_failure_is_reported_not_raised(fresh, monkeypatch):
    def no_home():
        raise RuntimeError("Could not determine home directory.")

    monkeypatch.setattr(native, "cache_dir", no_home)
    assert not native.available()
    assert "home directory" in native.error()
    x, cos, sin = torch.randn(2, 3, 8), torch.rand(3, 4), torch.rand(3, 4)
    got, want = cpu.rotary(x, cos, sin), _blocked(x, cos, sin, "half")
    if torch_rounds_like_native(x.dtype, "half", 2 * cos.shape[-1]):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert_rotations_agree(got, want, x, cos, sin, "half")


def test_unwritable_cache_dir_is_reported(fresh, monkeypatch):
    blocker = fresh / "a file"
    blocker.write_text("")
    monkeypatch.setenv("POSENC_CACHE", str(blocker / "cache"))
    monkeypatch.setattr(native, "_compiler", lambda: sys.executable)  # never run: the cache dir fails first
    assert not native.available()
    assert "POSENC_CACHE" in native.error()


def test_cache_dir_follows_the_environment(monkeypatch):
    monkeypatch.delenv("POSENC_CACHE_DIR", raising=False)
    monkeypatch.setenv("POSENC_CACHE", "/somewhere/posenc")
    assert native.cache_dir() == Path("/somewhere/posenc")
    monkeypatch.delenv("POSENC_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", "/xdg")
    assert native.cache_dir() == Path("/xdg/posenc")


def test_kernels_share_the_one_cache_folder_and_read_the_old_name_with_a_warning(monkeypatch):
    from posenc import _files

    monkeypatch.setenv("POSENC_CACHE", "/one/cache")
    monkeypatch.setenv("POSENC_CACHE_DIR", "/old/name")
    assert native.cache_dir() == _files.cache_dir() == Path("/one/cache")  # the new name wins, no warning
    monkeypatch.delenv("POSENC_CACHE")
    with pytest.warns(FutureWarning, match="POSENC_CACHE_DIR is the old name of POSENC_CACHE"):
        assert native.cache_dir() == Path("/old/name")
