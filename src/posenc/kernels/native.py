"""The one-pass C RoPE kernel for CPU (``rope.c``): built once per machine with the system C compiler, called
through ``ctypes``, on torch's own OpenMP threads.

torch ops can't rotate the half layout in one pass over memory: each op reads or writes a whole block. ``rope.c``
reads every row once and writes it once, so it runs at about the speed of copying q and k (BENCHMARKS.md). Results
are bit-equal to the torch path (``rotary_into``); how it is built and cached: ``available``; tuned to the CPU:
``simd_level``, ``block_positions``; threads: ``openmp_runtime``. It also builds the float32 cos/sin tables
(``cos_sin_table``). With no C compiler, or with ``POSENC_NATIVE=0``, ``available()`` is False, ``error()`` says
why, and ``posenc.kernels.cpu`` uses its blocked torch path instead.

Paper: Su et al. 2021, "RoFormer" (arXiv:2104.09864). Checked against the blocked torch path and the float64
formula (``tests/reference/rope_float64.py``) in ``tests/kernels/test_native.py``.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import threading
from pathlib import Path

import torch

from posenc import _files, kernels

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("rope.c")
ABI = 6
MAX_DIMS = 16  # rope_args' index arrays
FLAGS = ("-O3", "-fPIC", "-ffp-contract=off", "-fno-math-errno")
# Elements below which one thread does the whole call: waking a thread costs about as much as rotating this.
_MIN_PER_THREAD = 1 << 16
# Share of one core's L2 cache that a block's cos/sin rows may take: the rest holds the rows of x and out streaming
# through, and what the hardware prefetchers bring in ahead of them.
_TABLE_SHARE_OF_L2 = 4
_L2_FALLBACK = 256 << 10  # bytes, where the cache size can't be read: small (Intel cores of 2008-2015 had this)
_MIN_BLOCK = 16  # positions: shorter runs per head cost more in pointer set-up than a table re-read
SIMD_LEVELS = ("portable", "AVX-512", "AVX-512 + BF16")  # rope.c's row levels, by number
#: Fault in fresh output pages a run of rows at a time (``populate_run`` in rope.c, Linux): False for the per-page
#: faults every other op pays (benchmarks compare the two).
populate_outputs = True
_CACHE_SYSFS = Path("/sys/devices/system/cpu/cpu0/cache")

_DTYPES = {torch.float32: "float32", torch.float64: "float64", torch.bfloat16: "bfloat16", torch.float16: "float16"}
_RUNTIME = re.compile(r"lib(gomp|omp|iomp5)\b[^/]*\.(so[.\d]*|dylib)$")
_lock = threading.Lock()
_state: dict = {}  # "lib", "error", "funcs", "variant"


class RopeArgs(ctypes.Structure):
    """``rope_args`` in ``rope.c``: one struct per call instead of fifteen ctypes arguments."""

    _fields_ = [
        ("x", ctypes.c_void_p),
        ("out", ctypes.c_void_p),
        ("cos", ctypes.c_void_p),
        ("sin", ctypes.c_void_p),
        ("ndim", ctypes.c_int64),
        ("shape", ctypes.c_int64 * MAX_DIMS),
        ("x_strides", ctypes.c_int64 * MAX_DIMS),
        ("out_strides", ctypes.c_int64 * MAX_DIMS),
        ("t_strides", ctypes.c_int64 * MAX_DIMS),
        ("d", ctypes.c_int64),
        ("f", ctypes.c_int64),
        ("interleaved", ctypes.c_int64),
        ("copy_rest", ctypes.c_int64),
        ("rows", ctypes.c_int64),
        ("grain", ctypes.c_int64),
        ("block", ctypes.c_int64),
        ("simd", ctypes.c_int64),
        ("populate", ctypes.c_int64),
    ]


class TableArgs(ctypes.Structure):
    """``table_args`` in ``rope.c``."""

    _fields_ = [
        ("pos", ctypes.c_void_p),
        ("inv", ctypes.c_void_p),
        ("cos", ctypes.c_void_p),
        ("sin", ctypes.c_void_p),
        ("n", ctypes.c_int64),
        ("f", ctypes.c_int64),
        ("factor", ctypes.c_double),
        ("grain", ctypes.c_int64),
    ]


def available() -> bool:
    """The kernel is built (or loaded from the cache) and ready; builds it on the first call.

    It is compiled on first use (``cc -O3 -march=native``, under a second) into ``$POSENC_CACHE`` or
    ``~/.cache/posenc``, keyed by the source, compiler, flags, OpenMP runtime and CPU (``_key``), so later processes
    just load it.
    """
    return _load() is not None


def error() -> str | None:
    """Why the kernel is unavailable (None when it is available)."""
    _load()
    return _state.get("error")


def describe() -> str:
    """One line for benchmark headers: what was built, how it threads, its rows' SIMD level and the L2 it blocks
    positions for."""
    if not available():
        return f"unavailable: {error()}"
    l2, source = l2_cache_bytes()
    return f"{_state['variant']}, {SIMD_LEVELS[simd_level()]} rows, L2 {l2 >> 10} KiB ({source})"


def simd_level() -> int:
    """The highest row level the built kernel uses on this CPU: 0 portable loops (vectorised by the compiler for
    the build's target), 1 AVX-512 intrinsics, 2 AVX-512 with AVX512-BF16 conversion; -1 when unavailable."""
    return int(_state["lib"].posenc_rope_simd()) if available() else -1


def l2_cache_bytes() -> tuple[int, str]:
    """One core's L2 (data or unified) cache in bytes, and where that came from: Linux's
    ``/sys/devices/system/cpu/cpu0/cache``, else ``sysconf(_SC_LEVEL2_CACHE_SIZE)`` (glibc), else macOS's
    ``hw.l2cachesize``, else a 256 KiB fallback."""
    if "l2" not in _state:
        _state["l2"] = _read_l2()
    return _state["l2"]


def _read_l2() -> tuple[int, str]:
    for index in sorted(_CACHE_SYSFS.glob("index*")):
        try:
            level = (index / "level").read_text().strip()
            kind = (index / "type").read_text().strip()
            size = _parse_size((index / "size").read_text())
        except (OSError, ValueError):
            continue
        if level == "2" and kind in ("Data", "Unified") and size > 0:
            return size, "sysfs"
    try:
        size = os.sysconf("SC_LEVEL2_CACHE_SIZE")
        if size > 0:
            return int(size), "sysconf"
    except (AttributeError, ValueError, OSError):
        pass
    if sys.platform == "darwin":
        try:
            done = subprocess.run(["sysctl", "-n", "hw.l2cachesize"], capture_output=True, text=True, timeout=10)
            size = int(done.stdout.strip())
            if size > 0:
                return size, "sysctl"
        except (OSError, ValueError, subprocess.SubprocessError):
            pass
    return _L2_FALLBACK, "fallback"


def _parse_size(text: str) -> int:
    """sysfs cache sizes: ``48K``, ``2048K``, ``1M``, or plain bytes."""
    text = text.strip().upper()
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    return int(text[:-1] if scale > 1 else text) * scale


def block_positions(positions: int, pairs: int, table_itemsize: int) -> int:
    """Positions per block for ``rope.c``: as many as keep one block's cos and sin rows (``2 * pairs`` entries of
    ``table_itemsize`` bytes per position) within a quarter of one core's L2 cache, at least 16, at most all of
    them. Every head of a block is rotated before the next block, so its table rows come from cache after the
    first head: at 16k positions the float32 tables are 8 MiB, read once per head without blocking."""
    l2, _ = l2_cache_bytes()
    per_position = max(1, 2 * pairs * table_itemsize)
    return max(min(positions, _MIN_BLOCK), min(positions, l2 // _TABLE_SHARE_OF_L2 // per_position))


def supports(dtype: torch.dtype) -> bool:
    """The built kernel handles ``dtype`` (float32, float64, bfloat16; float16 where the compiler has _Float16)."""
    return available() and _DTYPES.get(dtype) in _state["funcs"]


def rotary_into(
    x: torch.Tensor, out: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *, layout: str, simd: int = 2
) -> bool:
    """Write the rotation of ``x`` into ``out`` (which may be ``x``: in place); False if this kernel can't take it.

    Channels past ``2F`` are copied to ``out`` unless ``out`` is ``x``. Arguments are assumed checked
    (``posenc.kernels.cpu.rotary``); this only checks what the C code needs: CPU, a supported dtype, unit stride
    along channels, at most 16 leading dims, and tables of the compute dtype (float64 for float64 ``x``, else
    float32). ``simd`` caps the row level (``simd_level``; the tests compare the levels, which give the same bits).

    Results are bit-equal to the torch path: the same float32 multiplies and fused multiply-adds as torch's ``mul``,
    ``addcmul`` and complex ``mul``, rounded once (``-ffp-contract=off`` keeps the compiler from fusing anything
    else). Without ``-march=native`` on a CPU with FMA, ``fmaf`` is a slow library call.

    Tuned to the CPU at run time, never at the cost of a bit: rows use AVX-512 intrinsics where cpuid reports AVX-512
    (bfloat16 rounded by AVX512-BF16's ``vcvtne2ps2bf16`` where present), the compiler's loops elsewhere, with the same
    results (``simd_level``); rows are visited in blocks of positions sized from one core's L2 cache
    (``l2_cache_bytes``, ``block_positions``), so a block's cos/sin rows come from memory once for all its heads;
    threads take chunks on demand; and a fresh output's pages are faulted in a run of rows at a time rather than one
    trap per page (``populate_outputs``, Linux).

    Shapes:
        x, out (..., S, D); cos, sin broadcastable to (..., S, F), 2F <= D
    """
    name = _DTYPES.get(x.dtype)
    compute = torch.float64 if x.dtype == torch.float64 else torch.float32
    if not all(t.device.type == "cpu" for t in (x, out, cos, sin)) or not 2 <= x.dim() <= MAX_DIMS + 1:
        return False
    if not _plain(x, out, cos, sin):
        return False
    if name is None or cos.dtype != compute or sin.dtype != compute or out.dtype != x.dtype:
        return False
    if x.stride(-1) != 1 or out.stride(-1) != 1 or cos.shape != sin.shape or out.shape != x.shape:
        return False
    if out is x and any(st == 0 and n > 1 for st, n in zip(x.stride(), x.shape, strict=True)):
        return False  # in place on an expanded tensor: the blocked path raises torch's own overlap error
    if _load() is None or name not in _state["funcs"]:
        return False
    if cos.stride() != sin.stride() or cos.stride(-1) != 1:
        cos, sin = cos.contiguous(), sin.contiguous()
    cos, sin = cos.expand(*x.shape[:-1], cos.shape[-1]), sin.expand(*x.shape[:-1], cos.shape[-1])  # (..., S, F)
    rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
    if rows == 0 or (cos.shape[-1] == 0 and out is x):
        return True
    lead = x.dim() - 1
    # Blocks of positions pay off where the table rows are shared by other rows (heads, batch): a stride 0.
    shared = any(st == 0 and n > 1 for st, n in zip(cos.stride()[:-2], cos.shape[:-2], strict=True))
    block = block_positions(x.shape[-2], cos.shape[-1], cos.element_size()) if shared and lead > 1 else 0
    args = RopeArgs(
        x=x.data_ptr(),
        out=out.data_ptr(),
        cos=cos.data_ptr(),
        sin=sin.data_ptr(),
        ndim=lead,
        d=x.shape[-1],
        f=cos.shape[-1],
        interleaved=int(layout == "interleaved"),
        copy_rest=int(out is not x),
        rows=rows,
        grain=max(1, _MIN_PER_THREAD // x.shape[-1]),
        block=block,
        simd=simd,
        populate=int(populate_outputs),
    )
    args.shape[:lead] = x.shape[:-1]
    args.x_strides[:lead] = x.stride()[:-1]
    args.out_strides[:lead] = out.stride()[:-1]
    args.t_strides[:lead] = cos.stride()[:-1]
    _state["funcs"][name](ctypes.byref(args))
    return True


def cos_sin_table(
    positions: torch.Tensor, inv_freq: torch.Tensor, attention_factor: float
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Float32 ``attention_factor * cos/sin(positions * inv_freq)``, angles in float64; None if the kernel is off.

    The same numbers as ``posenc.functional.rope.rope_cos_sin``'s torch ops (float64 angles, float64 sin/cos,
    rounded once), in one pass that evaluates sin and cos together: about 5x faster than torch's two float64 trig
    passes. Arguments are assumed checked: CPU tensors, nothing requiring grad.

    Shapes:
        positions (...,); inv_freq (F,) -> cos, sin (..., F) float32
    """
    if _load() is None or not _plain(positions, inv_freq):
        return None
    if positions.device.type != "cpu" or inv_freq.device.type != "cpu":  # the C code reads host memory
        return None
    pos = positions.to(torch.float64).contiguous()
    inv = inv_freq.to(torch.float64).contiguous()
    cos = torch.empty(*positions.shape, inv.numel(), dtype=torch.float32)  # (..., F)
    sin = torch.empty_like(cos)
    if cos.numel():
        args = TableArgs(
            pos=pos.data_ptr(),
            inv=inv.data_ptr(),
            cos=cos.data_ptr(),
            sin=sin.data_ptr(),
            n=pos.numel(),
            f=inv.numel(),
            factor=attention_factor,
            grain=max(1, _MIN_PER_THREAD // (8 * inv.numel())),  # a sin/cos pair costs ~8 rotated elements
        )
        _state["funcs"]["table"](ctypes.byref(args))
    return cos, sin


def _plain(*tensors: torch.Tensor) -> bool:
    """Ordinary tensors with storage the C code can read: not functorch wrappers (``vmap``, ``grad``), not
    subclasses (FakeTensor, DTensor, ...), which go through torch ops."""
    return all(type(t) in (torch.Tensor, torch.nn.Parameter) for t in tensors) and not kernels.transformed(*tensors)


def cache_dir() -> Path:
    """Where built kernels live: posenc's cache folder (``posenc._files.cache_dir``: ``$POSENC_CACHE``, else
    ``$XDG_CACHE_HOME/posenc``, else ``~/.cache/posenc``)."""
    return _files.cache_dir()


def openmp_runtime() -> Path | None:
    """The OpenMP runtime torch uses: the one mapped into this process, else one shipped in torch's ``lib``.

    The kernel is linked to the OpenMP runtime torch has loaded (found in ``/proc/self/maps`` or torch's ``lib``
    folder), so its parallel rows run on torch's thread pool and follow ``torch.set_num_threads``; a second pool would
    fight torch's spinning workers for the cores. Where that fails it builds single-threaded.
    """
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.split()[-1]
                if _RUNTIME.search(path) and os.path.exists(path):
                    return Path(path)
    except OSError:
        pass
    shipped = sorted(p for p in (Path(torch.__file__).parent / "lib").glob("lib*omp*") if _RUNTIME.search(str(p)))
    return shipped[0] if shipped else None


def _load() -> ctypes.CDLL | None:
    if "lib" in _state:
        return _state["lib"]
    with _lock:
        if "lib" not in _state:
            try:
                lib, variant, why = _build_and_load()
            except Exception as exc:  # noqa: BLE001 - optional: any failure means the blocked path, with the reason
                lib, variant, why = None, None, f"build failed: {exc!r}"
            _state.update(lib=lib, error=why, variant=variant, funcs=_functions(lib) if lib else {})
            if why:
                log.info("posenc: C RoPE kernel unavailable (%s); CPU RoPE uses the blocked torch path", why)
    return _state["lib"]


def _functions(lib: ctypes.CDLL) -> dict:
    funcs = {}
    for name in _DTYPES.values():
        func = getattr(lib, f"posenc_rope_{name}", None)
        if func is None:
            continue  # float16 needs _Float16
        func.restype, func.argtypes = None, [ctypes.POINTER(RopeArgs)]
        funcs[name] = func
    funcs["table"] = lib.posenc_rope_table
    funcs["table"].restype, funcs["table"].argtypes = None, [ctypes.POINTER(TableArgs)]
    lib.posenc_rope_simd.restype, lib.posenc_rope_simd.argtypes = ctypes.c_int, []
    return funcs


def _variants(runtime: Path | None):
    """(compile flags, link inputs, description), best first: OpenMP on torch's runtime, then one thread; each
    with ``-march=native`` first (some compilers or CPUs lack it)."""
    for arch in (("-march=native",), ()):
        if runtime is not None:
            link = (str(runtime), f"-Wl,-rpath,{runtime.parent}", "-lm")
            yield (*FLAGS, *arch, "-fopenmp"), link, f"C kernel, {' '.join(arch) or 'generic'}, OpenMP ({runtime})"
        yield (*FLAGS, *arch, "-fopenmp-simd"), ("-lm",), f"C kernel, {' '.join(arch) or 'generic'}, one thread"


def _build_and_load() -> tuple[ctypes.CDLL | None, str | None, str | None]:
    if os.environ.get("POSENC_NATIVE", "1") == "0":
        return None, None, "disabled by POSENC_NATIVE=0"
    compiler = _compiler()
    if compiler is None:
        return None, None, "no C compiler found (set CC, or install gcc or clang)"
    last = "no build was tried"
    for flags, link, variant in _variants(openmp_runtime()):
        path = cache_dir() / f"rope-{_key(compiler, (*flags, *link))}.so"
        if not path.exists():
            failed = _build(compiler, flags, link, path)
            if failed:
                last = failed
                continue
        try:
            lib = ctypes.CDLL(str(path))
        except OSError as exc:
            last = f"could not load {path}: {exc}"
            continue
        if lib.posenc_rope_abi() != ABI:
            last = f"{path} has ABI {lib.posenc_rope_abi()}, expected {ABI}"
            continue
        return lib, variant, None
    return None, None, last


def _compiler() -> str | None:
    configured = (sysconfig.get_config_var("CC") or "").split()[:1]
    for name in (os.environ.get("CC") or "").split()[:1] + configured + ["cc", "gcc", "clang"]:
        found = shutil.which(name)
        if found:
            return found
    return None


def _key(compiler: str, flags: tuple[str, ...]) -> str:
    """Source, compiler (path and version), flags (the OpenMP runtime among them) and CPU: a cached build is
    reused only where it would be rebuilt the same way (``-march=native`` code runs only on CPUs like this one)."""
    try:
        version = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        version = ""  # the build itself will report what is wrong with this compiler
    parts = [SOURCE.read_bytes(), compiler.encode(), version.encode(), " ".join(flags).encode(), _cpu().encode()]
    return hashlib.sha256(b"\0".join(parts)).hexdigest()[:20]


def _cpu() -> str:
    try:
        info = Path("/proc/cpuinfo").read_text()
        return next((line for line in info.splitlines() if line.startswith(("flags", "Features"))), info[:2000])
    except OSError:
        return f"{platform.machine()} {platform.processor()} {sys.platform}"


def _build(compiler: str, flags: tuple[str, ...], link: tuple[str, ...], path: Path) -> str | None:
    """Compile, then link (without ``-fopenmp``, which would add the system's OpenMP runtime beside torch's), into
    temporary files next to ``path``, and rename into place: concurrent builds are safe, failures leave nothing."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix=".build-", dir=path.parent))
    except OSError as exc:
        return f"cannot write to {path.parent}: {exc} (set POSENC_CACHE)"
    obj, lib = work / "rope.o", work / "rope.so"
    steps = ([*flags, "-c", str(SOURCE), "-o", str(obj)], ["-shared", str(obj), *link, "-o", str(lib)])
    try:
        for step in steps:
            done = subprocess.run([compiler, *step], capture_output=True, text=True, timeout=300)
            if done.returncode != 0:
                return f"{Path(compiler).name} {' '.join(step)} failed: {done.stderr.strip()[-500:]}"
        os.replace(lib, path)
        return None
    except (OSError, subprocess.SubprocessError) as exc:
        return f"{Path(compiler).name} could not run: {exc}"
    finally:
        shutil.rmtree(work, ignore_errors=True)
