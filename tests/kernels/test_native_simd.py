"""The C kernel's AVX-512 rows and its position blocks (``posenc.kernels.native``, ``rope.c``): every SIMD level
gives the portable rows' bits (NaN, infinities, subnormal results, rounding ties, every row length and tail),
position blocks of any size give the unblocked bits, and the block size follows the L2 cache size, bounded."""

import ctypes
import subprocess

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import posenc
from posenc.kernels import native

pytestmark = pytest.mark.skipif(not native.available(), reason=f"C kernel not built here: {native.error()}")

#: The levels this CPU runs (0 portable, 1 AVX-512, 2 AVX-512 + BF16); on other CPUs only the portable rows.
LEVELS = list(range(1, native.simd_level() + 1))


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The stored bits, so signed zeros count too, and bfloat16's one NaN (0x7FC0, as torch rounds); a float32 NaN
    counts as one value: its sign and payload follow the hardware's NaN propagation and the compiler's operand
    order, which torch's own kernels do not pin either."""
    if t.dtype in (torch.float32, torch.float64):
        t = t.where(~t.isnan(), float("nan"))
    return t.view({2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def _tables(n: int, f: int):
    cos, sin = posenc.rope_cos_sin(torch.arange(n) * 37 + 5, posenc.default_inv_freq(2 * f))
    return cos, sin  # (S, F) float32


def _rotate(x, cos, sin, layout, simd, *, inplace=False):
    out = x.clone() if inplace else torch.empty_like(x)
    assert native.rotary_into(out if inplace else x, out, cos, sin, layout=layout, simd=simd)
    return out


def _awkward(dtype, shape, seed=0) -> torch.Tensor:
    """Random values with the cases vector conversions get wrong: NaN, infinities, zeros of both signs, values
    whose products are float32 subnormals, values at bfloat16 rounding ties and at the largest finite float."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g, dtype=torch.float32)
    flat = x.view(-1)
    k = flat.numel()
    picks = torch.randint(0, k, (k // 4,), generator=g)
    specials = torch.tensor(
        [float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 1e-39, -3e-39, 2.5e-38, 1.2e-38, 3.0e38, -3.3e38]
        + [1.0 + 2.0**-8, 1.0 + 3 * 2.0**-8, 2.0**-126, 5e-41]  # bfloat16 ties; smallest normal; a subnormal
    )
    flat[picks] = specials[torch.randint(0, len(specials), (len(picks),), generator=g)]
    return x.to(dtype)


@pytest.mark.skipif(not LEVELS, reason="no AVX-512 on this CPU: only the portable rows run")
@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("f", [1, 3, 7, 8, 15, 16, 17, 24, 31, 32, 33, 64, 67])
@pytest.mark.parametrize("inplace", [False, True])
def test_simd_rows_equal_the_portable_rows_bit_for_bit(level, dtype, layout, f, inplace):
    """Every row length (whole vectors and masked tails), partial rotary (channels past 2F), in place or not."""
    x = _awkward(dtype, (2, 3, 9, 2 * f + 6), seed=f)
    cos, sin = _tables(9, f)
    want = _rotate(x, cos, sin, layout, 0, inplace=inplace)
    got = _rotate(x, cos, sin, layout, level, inplace=inplace)
    assert torch.equal(_bits(got), _bits(want))


@pytest.mark.skipif(not LEVELS, reason="no AVX-512 on this CPU: only the portable rows run")
@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_bfloat16_subnormal_and_nan_results_are_rounded_like_torch(layout):
    """vcvtneps2bf16 flushes subnormals to zero and keeps NaN payloads; those lanes must come out as bf16_store
    (torch's rounding) makes them: a subnormal bfloat16, and 0x7FC0."""
    f = 16
    cos, sin = torch.ones(2, f), torch.zeros(2, f)  # the identity rotation: out == x exactly
    x = torch.full((2, 2 * f), 1e-39).to(torch.bfloat16)  # a bfloat16 subnormal, kept exactly in float32
    x[1] = -float("nan")  # 0xFFC0, which vcvtneps2bf16 would keep
    for level in [0, *LEVELS]:
        out = _rotate(x, cos, sin, layout, level)
        assert torch.equal(out[0], x[0]) and (out[0] != 0).all()
        assert (_bits(out[1]) == 0x7FC0).all()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float64])
def test_every_level_asked_for_is_capped_by_the_cpu(dtype):
    """Asking for more than the CPU has runs the best it has; a float64 call has only portable rows."""
    x = torch.randn(2, 4, 5, 32).to(dtype)
    cos, sin = _tables(5, 16)
    cos, sin = (cos.double(), sin.double()) if dtype == torch.float64 else (cos, sin)
    best = _rotate(x, cos, sin, "half", native.simd_level())
    for level in (0, 1, 2, 99):
        assert torch.equal(_bits(_rotate(x, cos, sin, "half", level)), _bits(best))


@given(
    b=st.integers(1, 3),
    h=st.integers(1, 4),
    s=st.integers(1, 40),
    f=st.integers(1, 20),
    block=st.integers(1, 45),
    layout=st.sampled_from(["half", "interleaved"]),
    dtype=st.sampled_from([torch.float32, torch.bfloat16]),
    threads=st.integers(1, 4),
    per_token=st.booleans(),
    transposed=st.booleans(),
)
def test_any_block_of_positions_gives_the_unblocked_bits(b, h, s, f, block, layout, dtype, threads, per_token,
                                                         transposed):
    """Rows visited block by block (every head of positions [0, block), then the next block), split into chunks
    across threads, give exactly the plain row order's result: each row depends on its own inputs only."""
    x = (torch.randn(b, s, h, 2 * f + 2).transpose(1, 2) if transposed else torch.randn(b, h, s, 2 * f + 2)).to(dtype)
    positions = torch.randint(0, 9000, (b, s) if per_token else (s,))
    cos, sin = posenc.rope_cos_sin(positions, posenc.default_inv_freq(2 * f))
    if per_token:
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)  # (B, 1, S, F): shared by the heads
    old_min, old_threads, old_block = native._MIN_PER_THREAD, torch.get_num_threads(), native.block_positions
    try:
        native._MIN_PER_THREAD = 1
        native.block_positions = lambda *a: 0
        plain = torch.empty_like(x)
        assert native.rotary_into(x, plain, cos, sin, layout=layout)
        torch.set_num_threads(threads)
        native.block_positions = lambda *a: block
        blocked = torch.empty_like(x)
        assert native.rotary_into(x, blocked, cos, sin, layout=layout)
    finally:
        native._MIN_PER_THREAD, native.block_positions = old_min, old_block
        torch.set_num_threads(old_threads)
    assert torch.equal(_bits(blocked), _bits(plain))


def _capture_block(monkeypatch, x, cos, sin) -> int:
    """The ``block`` rotary_into hands the C code for this call."""
    seen = []
    name = native._DTYPES[x.dtype]
    real = native._state["funcs"][name]
    monkeypatch.setitem(native._state["funcs"], name, lambda args: seen.append(args._obj.block) or real(args))
    assert native.rotary_into(x, torch.empty_like(x), cos, sin, layout="half")
    return seen[0]


@pytest.mark.parametrize("l2", [256 << 10, 1 << 20, 2 << 20, 48 << 20])
def test_block_size_follows_the_l2_cache_and_is_used(monkeypatch, l2):
    """A block's cos and sin rows fill at most a quarter of L2, blocks hold at least 16 positions and at most all
    of them; the call passes that size to the C code when heads share the tables, and no blocking otherwise."""
    monkeypatch.setitem(native._state, "l2", (l2, "test"))
    for s, f, size in [(16384, 64, 4), (4096, 64, 4), (8192, 32, 8), (100, 64, 4), (8, 64, 4), (4096, 4096, 4)]:
        block = native.block_positions(s, f, size)
        assert min(s, 16) <= block <= s
        assert block == s or block == 16 or block * 2 * f * size <= l2 // 4
        assert block == s or (block + 1) * 2 * f * size > l2 // 4 or block == 16
    x = torch.randn(1, 4, 4096, 128)
    cos, sin = _tables(4096, 64)
    assert _capture_block(monkeypatch, x, cos, sin) == native.block_positions(4096, 64, 4)
    assert _capture_block(monkeypatch, x, cos.expand(1, 4, 4096, 64).contiguous(), sin.expand(1, 4, 4096, 64)) == 0


def test_l2_size_from_sysfs_then_sysconf_then_a_fallback(monkeypatch, tmp_path):
    monkeypatch.delitem(native._state, "l2", raising=False)
    caches = [("1", "Data", "48K"), ("1", "Instruction", "64K"), ("2", "Unified", "2048K"), ("3", "Unified", "105M")]
    for i, (level, kind, size) in enumerate(caches):
        d = tmp_path / f"index{i}"
        d.mkdir()
        (d / "level").write_text(level + "\n")
        (d / "type").write_text(kind + "\n")
        (d / "size").write_text(size + "\n")
    monkeypatch.setattr(native, "_CACHE_SYSFS", tmp_path)
    assert native._read_l2() == (2 << 20, "sysfs")
    monkeypatch.setattr(native, "_CACHE_SYSFS", tmp_path / "missing")
    monkeypatch.setattr(native.os, "sysconf", lambda name: 1 << 20)
    assert native._read_l2() == (1 << 20, "sysconf")
    monkeypatch.setattr(native.os, "sysconf", lambda name: 0)  # glibc's answer where it does not know
    monkeypatch.setattr(native.sys, "platform", "linux")
    assert native._read_l2() == (native._L2_FALLBACK, "fallback")
    assert [native._parse_size(t) for t in ("48K", "2048K\n", "1M", "4096")] == [48 << 10, 2 << 20, 1 << 20, 4096]
    assert native.l2_cache_bytes()[0] > 0 and "L2" in native.describe()


def test_a_generic_build_finds_the_same_simd_rows(tmp_path):
    """Without -march=native (the fallback build, or a cache shared by different CPUs) the AVX-512 rows are still
    compiled (target attributes) and picked by cpuid at run time: the same level, the same bits."""
    compiler = native._compiler()
    flags = (*native.FLAGS, "-fopenmp-simd")
    path = tmp_path / "rope-generic.so"
    failed = native._build(compiler, flags, ("-lm",), path)
    if failed:
        pytest.skip(f"generic build failed: {failed}")
    lib = ctypes.CDLL(str(path))
    assert lib.posenc_rope_simd() == native.simd_level()
    x = _awkward(torch.bfloat16, (2, 3, 7, 40))
    cos, sin = _tables(7, 20)
    want = _rotate(x, cos, sin, "interleaved", native.simd_level())
    funcs = native._functions(lib)
    saved = native._state["funcs"]
    try:
        native._state["funcs"] = funcs
        got = _rotate(x, cos, sin, "interleaved", native.simd_level())
    finally:
        native._state["funcs"] = saved
    assert torch.equal(_bits(got), _bits(want))
    assert subprocess.run([compiler, "--version"], capture_output=True).returncode == 0


@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_fresh_outputs_faulted_in_a_run_at_a_time_give_the_same_bits(monkeypatch, layout):
    """An output past glibc's largest mmap threshold (32 MiB) is fresh pages, which ``populate_run`` faults in a run
    of rows at a time (256 KiB runs here): the same bits as the ordinary per-page faults."""
    x = torch.randn(1, 9, 16384, 128).to(torch.bfloat16)  # 36 MiB
    cos, sin = _tables(16384, 64)
    results = []
    for populate in (False, True):
        monkeypatch.setattr(native, "populate_outputs", populate)
        out = torch.empty_like(x)
        assert native.rotary_into(x, out, cos, sin, layout=layout)
        results.append(out)
    assert torch.equal(_bits(results[1]), _bits(results[0]))


def test_a_strided_output_keeps_what_lies_between_its_rows():
    """Only the rows are written: what lies between them (another tensor's channels) keeps its contents."""
    x = torch.randn(2, 4, 1024, 64).to(torch.bfloat16)
    cos, sin = _tables(1024, 32)
    want = _rotate(x, cos, sin, "half", native.simd_level())
    wide = torch.full((2, 4, 1024, 80), 7.0, dtype=torch.bfloat16)
    assert native.rotary_into(x, wide[..., :64], cos, sin, layout="half")
    assert (wide[..., 64:] == 7).all() and torch.equal(_bits(wide[..., :64]), _bits(want))
