"""``posenc bench``: RoPE and bias-attention speed against the memory-bandwidth limit and the usual alternatives.

Rotary rows time rotating q and k (cos/sin built from the positions included, as a model layer runs it) on the
Llama-3-8B attention geometry (32 query heads, 8 key/value heads, head dim 128) at each length, plus head dims 64
and 256, float32 and bfloat16, both channel layouts. Each row is one shape; every column is measured in the same
process, back to back:

    ms            posenc (``RotaryEmbedding(...)(q, k, positions)``), median of ``torch.utils.benchmark``
    GB/s          bytes read and written (q and k once each way) / time
    x copy        time / time of ``q.clone(), k.clone()``: the same bytes moved, the practical floor (1.00 is ideal);
                  the median of 3 rounds, each timing posenc then the copy right after it (``paired_ms``)
    vs ...        the alternative's time / posenc's time (above 1: posenc is faster): transformers' eager
                  ``apply_rotary_pos_emb`` (Llama for the half layout, GPT-J for interleaved, each with its own
                  cos/sin), ``torch.compile`` of it (``--compile``), rotary-embedding-torch (interleaved), and on
                  CUDA Liger's and flash-attn's kernels when installed. Empty where the library is missing or has
                  no such layout.

Attention rows run each bias encoding (ALiBi, 2-D ALiBi, T5) through ``posenc.attention`` with ``flex``, against
SDPA without a bias (the flash-path ceiling) and SDPA with the bias materialised: time and peak memory above the
inputs (``torch.cuda.max_memory_allocated`` on CUDA; on CPU torch's own allocations, from ``torch.profiler``'s memory
events, ``cpu_peak_bytes``; ``n/a`` where nothing could be measured, never a 0.00 that was not).
"""

from __future__ import annotations

import contextlib
import csv
import datetime
import io
import math
import os
import platform
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.utils.benchmark as tb

import posenc
from posenc._checks import check_choice, check_positive_int, fail
from posenc.functional.axial_rope import grid_positions
from posenc.lab.common.files import write_text_atomic
from posenc.lab.common.report import wide_console

LLAMA3_8B = {"q_heads": 32, "kv_heads": 8, "head_dim": 128}
DEFAULT_LENGTHS = (1024, 2048, 4096, 8192, 16384)
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
LAYOUTS = ("half", "interleaved")
BIAS_ENCODINGS = ("alibi", "alibi_2d", "t5")
CONTENDERS = ("hf_eager", "hf_compiled", "rotary_embedding_torch", "liger", "flash_attn")


@dataclass(frozen=True)
class RotaryCase:
    """One rotary benchmark shape: q ``(batch, q_heads, seq, head_dim)``, k ``(batch, kv_heads, seq, head_dim)``."""

    seq: int
    head_dim: int
    dtype: str
    layout: str
    batch: int = 1
    q_heads: int = LLAMA3_8B["q_heads"]
    kv_heads: int = LLAMA3_8B["kv_heads"]

    @property
    def bytes_moved(self) -> int:
        """q and k read once and written once."""
        elements = self.batch * (self.q_heads + self.kv_heads) * self.seq * self.head_dim
        return 2 * elements * DTYPES[self.dtype].itemsize


def rotary_cases(
    lengths: Sequence[int] = DEFAULT_LENGTHS,
    head_dims: Sequence[int] = (64, 128, 256),
    dtypes: Sequence[str] = ("float32", "bfloat16"),
    layouts: Sequence[str] = LAYOUTS,
) -> list[RotaryCase]:
    """Head dim 128 (Llama-3-8B) at every length; the other head dims at the middle length.

    Raises:
        ValueError: naming the parameter, for an empty one (no case to time) or a value outside its choices.
    """
    for name, values in (("lengths", lengths), ("head_dims", head_dims), ("dtypes", dtypes), ("layouts", layouts)):
        if not values:
            fail(name, values, "at least one value")
    for n in lengths:
        check_positive_int("lengths", n)
    for d in head_dims:
        check_positive_int("head_dims", d)
        if d % 2:
            fail("head_dims", d, "even head dims (rotary pairs)")
    for t in dtypes:
        check_choice("dtypes", t, list(DTYPES))
    for layout in layouts:
        check_choice("layouts", layout, LAYOUTS)
    middle = sorted(lengths)[len(lengths) // 2]
    shapes = [(n, 128) for n in lengths if 128 in head_dims] + [(middle, d) for d in head_dims if d != 128]
    return [RotaryCase(seq=n, head_dim=d, dtype=t, layout=lay) for n, d in shapes for t in dtypes for lay in layouts]


def settle_allocator() -> None:
    """Put glibc's malloc where a long-running process ends up, before timing anything on CPU.

    Freeing a block just under 32 MiB raises glibc's mmap threshold to its maximum: from then on, blocks up to that
    size are recycled from the heap, and larger ones are always fresh, page-faulted memory. Without this, whether
    a copy or a kernel pays for page faults depends on what the process freed before, and ratios for 8-32 MiB
    tensors swing several-fold between runs. Harmless with other allocators.
    """
    torch.empty((32 << 20) - (64 << 10), dtype=torch.uint8)


def warm_timer(fn: Callable[[], Any]) -> tb.Timer:
    """A ``torch.utils.benchmark`` timer for ``fn`` (which synchronises CUDA) after one warm-up call (allocator,
    first-call paths), on all of torch's CPU threads (``Timer`` would otherwise run with one)."""
    fn()
    return tb.Timer(stmt="fn()", globals={"fn": fn}, num_threads=torch.get_num_threads())


def time_ms(fn: Callable[[], Any], min_run_time: float) -> float:
    """Median milliseconds per call (``warm_timer``)."""
    return warm_timer(fn).blocked_autorange(min_run_time=min_run_time).median * 1e3


def paired_ms(
    fn: Callable[[], Any], reference: Callable[[], Any], min_run_time: float, rounds: int = 3
) -> tuple[float, float, float]:
    """``(fn ms, reference ms, ratio)``: ``rounds`` rounds, each timing ``fn`` then ``reference`` right after it
    (``min_run_time / rounds`` each); times are the best round's medians, the ratio the median of the rounds'.

    On CPU, what a fresh output costs drifts within one process (page faults, glibc's mmap threshold, free huge
    pages): timed next to each other, a kernel and a copy of the same bytes pay the same.
    """
    timers = warm_timer(fn), warm_timer(reference)
    results = [
        [t.blocked_autorange(min_run_time=min_run_time / rounds).median * 1e3 for t in timers] for _ in range(rounds)
    ]
    ratios = sorted(a / b for a, b in results)
    return min(a for a, _ in results), min(b for _, b in results), ratios[len(ratios) // 2]


# ---------------------------------------------------------------------------------------------------------------------
# The alternatives, each a zero-argument callable doing what a model layer does, or None when unavailable


def _hf_eager(case: RotaryCase, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor) -> Callable | None:
    try:
        if case.layout == "half":
            from transformers import LlamaConfig
            from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb
        else:
            from transformers.models.gptj.modeling_gptj import apply_rotary_pos_emb as gptj_apply
            from transformers.models.gptj.modeling_gptj import create_sinusoidal_positions
    except ImportError:
        return None
    if case.layout == "half":
        config = LlamaConfig(hidden_size=case.head_dim * case.q_heads, num_attention_heads=case.q_heads,
                             num_key_value_heads=case.kv_heads, head_dim=case.head_dim)
        rotary = LlamaRotaryEmbedding(config).to(q.device)
        position_ids = positions[None]

        def llama() -> Any:
            cos, sin = rotary(q, position_ids)
            return apply_rotary_pos_emb(q, k, cos, sin)

        return llama
    # GPT-J: (B, S, H, D) tensors and a float32 sin/cos table indexed by position, as GPTJAttention runs it.
    table = create_sinusoidal_positions(int(positions.max()) + 1, case.head_dim).to(q.device)
    qt, kt = q.transpose(1, 2), k.transpose(1, 2)  # (B, S, H, D) views, as GPT-J's projections produce them
    position_ids = positions[None]

    def gptj() -> Any:
        sincos = table[position_ids]  # (1, S, D)
        sin, cos = torch.split(sincos, sincos.shape[-1] // 2, dim=-1)
        return gptj_apply(qt, sin, cos), gptj_apply(kt, sin, cos)

    return gptj


def _rotary_embedding_torch(case: RotaryCase, q: torch.Tensor, k: torch.Tensor) -> Callable | None:
    if case.layout != "interleaved":
        return None  # it rotates adjacent pairs only
    try:
        from rotary_embedding_torch import RotaryEmbedding as LucidRotary
    except ImportError:
        return None
    rotary = LucidRotary(dim=case.head_dim, cache_if_possible=False).to(q.device)
    return lambda: (rotary.rotate_queries_or_keys(q), rotary.rotate_queries_or_keys(k))


def _liger(case: RotaryCase, q: torch.Tensor, k: torch.Tensor, rope: posenc.RotaryEmbedding, positions) -> Any:
    if case.layout != "half" or q.device.type != "cuda":
        return None
    try:
        from liger_kernel.transformers.rope import liger_rotary_pos_emb
    except ImportError:
        return None

    def run() -> Any:
        cos, sin = rope.cos_sin(positions)  # (S, D/2) float32
        cos, sin = (torch.cat([t, t], dim=-1)[None].to(q.dtype) for t in (cos, sin))  # (1, S, D), HF form
        return liger_rotary_pos_emb(q, k, cos, sin)

    return run


def _flash_attn(case: RotaryCase, q: torch.Tensor, k: torch.Tensor, rope: posenc.RotaryEmbedding, positions) -> Any:
    if q.device.type != "cuda":
        return None
    try:
        from flash_attn.layers.rotary import apply_rotary_emb
    except ImportError:
        return None
    qt, kt = q.transpose(1, 2).contiguous(), k.transpose(1, 2).contiguous()  # (B, S, H, D): flash-attn's layout

    def run() -> Any:
        cos, sin = rope.cos_sin(positions)  # (S, D/2) float32
        cos, sin = cos.to(q.dtype), sin.to(q.dtype)
        inter = case.layout == "interleaved"
        return apply_rotary_emb(qt, cos, sin, interleaved=inter), apply_rotary_emb(kt, cos, sin, interleaved=inter)

    return run


def run_rotary_case(case: RotaryCase, *, device: str, min_run_time: float, compile_hf: bool) -> dict[str, Any]:
    """Time posenc, a copy and every available alternative on ``case``; one result row."""
    dtype = DTYPES[case.dtype]
    g = torch.Generator().manual_seed(0)
    q = torch.randn(case.batch, case.q_heads, case.seq, case.head_dim, generator=g).to(device, dtype)
    k = torch.randn(case.batch, case.kv_heads, case.seq, case.head_dim, generator=g).to(device, dtype)
    positions = torch.arange(case.seq, device=device)
    rope = posenc.RotaryEmbedding(case.head_dim, layout=case.layout).to(device)
    ours, copy, x_copy = paired_ms(lambda: rope(q, k, positions), lambda: (q.clone(), k.clone()), min_run_time)
    hf = _hf_eager(case, q, k, positions)
    others = {
        "hf_eager": hf,
        "hf_compiled": torch.compile(hf) if hf is not None and compile_hf else None,
        "rotary_embedding_torch": _rotary_embedding_torch(case, q, k),
        "liger": _liger(case, q, k, rope, positions),
        "flash_attn": _flash_attn(case, q, k, rope, positions),
    }
    row: dict[str, Any] = {**asdict(case), "device": device, "ms": ours, "gb_s": case.bytes_moved / ours / 1e6}
    row["x_copy"] = x_copy
    row["copy_ms"] = copy
    for name in CONTENDERS:
        fn = others[name]
        theirs = time_ms(fn, min_run_time) if fn is not None else None
        row[f"{name}_ms"] = theirs
        row[f"vs_{name}"] = None if theirs is None else theirs / ours
    return row


# ---------------------------------------------------------------------------------------------------------------------
# Bias attention


@contextlib.contextmanager
def _quiet_stderr() -> Iterator[None]:
    """Silence file descriptor 2 (kineto prints two log lines per profiling session, at the C++ level)."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def cpu_peak_bytes(fn: Callable[[], Any]) -> int | None:
    """Peak of torch's CPU allocations during one call of ``fn``, above what was allocated before it, in bytes.

    Read from ``torch.profiler``'s memory events (every allocation and free of torch's CPU allocator, in order):
    the process's resident size cannot show it, since glibc recycles freed heap blocks (``settle_allocator``) and
    a call that fits in them adds nothing. None where the profiler gives no allocation events.
    """
    try:
        from torch._C._profiler import _EventType
        from torch.profiler import ProfilerActivity, profile
    except ImportError:
        return None
    with _quiet_stderr(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    try:
        stack = list(prof.profiler.kineto_results.experimental_event_tree())
    except (AttributeError, RuntimeError):
        return None
    events = []
    while stack:
        node = stack.pop()
        stack.extend(node.children)
        if node.tag == _EventType.Allocation and node.extra_fields.device.type == "cpu":
            events.append((node.start_time_ns, node.extra_fields.alloc_size))  # frees are negative
    if not events:
        return None
    held = peak = 0
    for _, size in sorted(events):
        held += size
        peak = max(peak, held)
    return peak


def peak_mib(fn: Callable[[], Any], device: str) -> float | None:
    """Peak memory of one call above what was held before it, in MiB (None where it cannot be measured).

    CUDA: ``torch.cuda.max_memory_allocated``; CPU: ``cpu_peak_bytes`` (torch's allocations, from the profiler).
    """
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        fn()
        torch.cuda.synchronize()
        return (torch.cuda.max_memory_allocated() - before) / 2**20
    if device != "cpu":
        return None
    peak = cpu_peak_bytes(fn)
    return None if peak is None else peak / 2**20


def memory_method(device: str) -> str:
    """How ``peak_mib`` measures on ``device``, for the header (``n/a`` cells: not measurable there)."""
    if device.startswith("cuda"):
        return "peak MiB above the inputs: torch.cuda.max_memory_allocated"
    if device == "cpu":
        return "peak MiB above the inputs: torch's CPU allocations from torch.profiler memory events (n/a: no events)"
    return f"memory n/a: no peak-memory counter for {device}"


def run_attention_case(
    name: str, length: int, *, device: str, dtype: str, min_run_time: float, heads: int = 8, head_dim: int = 64
) -> dict[str, Any]:
    """flex with ``name``'s score_mod vs SDPA without a bias vs SDPA with the bias materialised (inference)."""
    kind = torch.float32 if device == "cpu" else DTYPES[dtype]  # CPU flex runs float32 here
    extra = {"bidirectional": False} if name == "t5" else {}
    enc = posenc.build(name, num_heads=heads, head_dim=head_dim, **extra).to(device)
    causal = enc.position_kind != "grid"
    if causal:
        pos = torch.arange(length, device=device)
    else:
        width = 2 ** math.ceil(math.log2(length) / 2)
        pos = grid_positions(width, length // width, device=device)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, heads, length, head_dim, generator=g).to(device, kind) for _ in range(3))

    def call(backend: str, encoding: Any) -> Callable[[], Any]:
        positions = pos if encoding is not None else None
        return lambda: posenc.attention(q, k, v, encoding=encoding, q_positions=positions, causal=causal,
                                        backend=backend)

    row: dict[str, Any] = {"encoding": name, "seq": length, "heads": heads, "head_dim": head_dim,
                           "dtype": str(kind).removeprefix("torch."), "device": device}
    with torch.no_grad():
        for label, fn in (("flex", call("flex", enc)), ("sdpa_no_bias", call("sdpa", None)),
                          ("sdpa_bias", call("sdpa", enc))):
            try:
                row[f"{label}_ms"] = time_ms(fn, min_run_time)
                row[f"{label}_mib"] = peak_mib(fn, device)
            except (RuntimeError, torch.OutOfMemoryError) as err:  # e.g. the materialised bias does not fit
                row[f"{label}_ms"], row[f"{label}_mib"] = None, None
                row[f"{label}_error"] = type(err).__name__
    flex, ceiling = row.get("flex_ms"), row.get("sdpa_no_bias_ms")
    row["flex_vs_ceiling"] = None if flex is None or ceiling is None else ceiling / flex
    bias = row.get("sdpa_bias_ms")
    row["flex_vs_sdpa_bias"] = None if flex is None or bias is None else bias / flex
    return row


# ---------------------------------------------------------------------------------------------------------------------
# Output


def _fmt(value: Any, digits: int = 2) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _cell(row: dict, key: str) -> str:
    """A table cell: memory ``n/a`` where nothing was measured (never a 0.00 that was not measured), and small
    peaks with 3 significant digits rather than rounded to 0.00."""
    value = row.get(key)
    if key in MEMORY_KEYS:
        if value is None:
            return "n/a"
        return f"{value:.2f}" if value >= 0.1 else f"{value:.2g}"
    return _fmt(value)


def _kept(rows: Sequence[dict], columns: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
    """Columns with a value in some row; memory columns always (their ``n/a`` says it was not measured)."""
    return [(key, t) for key, t in columns if key in MEMORY_KEYS or any(r.get(key) is not None for r in rows)]


ROTARY_COLUMNS = [("seq", "S"), ("head_dim", "D"), ("dtype", "dtype"), ("layout", "layout"), ("ms", "ms"),
                  ("gb_s", "GB/s"), ("x_copy", "x copy"), ("vs_hf_eager", "vs HF eager"),
                  ("vs_hf_compiled", "vs HF compiled"), ("vs_rotary_embedding_torch", "vs rotary-embedding-torch"),
                  ("vs_liger", "vs Liger"), ("vs_flash_attn", "vs flash-attn")]
ATTENTION_COLUMNS = [("encoding", "encoding"), ("seq", "S"), ("dtype", "dtype"), ("flex_ms", "flex ms"),
                     ("flex_mib", "flex MiB"), ("sdpa_no_bias_ms", "SDPA no bias ms"),
                     ("sdpa_no_bias_mib", "SDPA no bias MiB"), ("sdpa_bias_ms", "SDPA+bias ms"),
                     ("sdpa_bias_mib", "SDPA+bias MiB"), ("flex_vs_ceiling", "flex speed / no-bias speed"),
                     ("flex_vs_sdpa_bias", "flex vs SDPA+bias")]
MEMORY_KEYS = frozenset({"flex_mib", "sdpa_no_bias_mib", "sdpa_bias_mib"})


def markdown(rows: Sequence[dict], columns: Sequence[tuple[str, str]]) -> str:
    keep = _kept(rows, columns)
    lines = ["| " + " | ".join(t for _, t in keep) + " |", "|" + "|".join("---:" for _ in keep) + "|"]
    lines += ["| " + " | ".join(_cell(r, key) for key, _ in keep) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def write_outputs(out: Path, rotary: Sequence[dict], attention: Sequence[dict], header: str) -> list[Path]:
    """``rotary.csv``, ``attention.csv`` (every measured field) and ``bench.md`` (the tables), atomically."""
    written = []
    for name, rows in (("rotary.csv", rotary), ("attention.csv", attention)):
        if not rows:
            continue
        fields = list(dict.fromkeys(key for r in rows for key in r))
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, fieldnames=fields, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
        written.append(write_text_atomic(out / name, buffer.getvalue()))
    text = [header, ""]
    if rotary:
        text += ["## RoPE on q and k", "", markdown(rotary, ROTARY_COLUMNS)]
    if attention:
        text += ["## Bias attention", "", markdown(attention, ATTENTION_COLUMNS)]
    written.append(write_text_atomic(out / "bench.md", "\n".join(text)))
    return written


def print_rows(rows: Sequence[dict], columns: Sequence[tuple[str, str]], title: str) -> None:
    from rich.table import Table

    keep = _kept(rows, columns)
    table = Table(title=title)
    for _, t in keep:
        table.add_column(t, justify="right")
    for r in rows:
        table.add_row(*(_cell(r, key) for key, _ in keep))
    console = wide_console()
    console.width = max(console.width, 140)
    console.print(table)


def header(device: str) -> str:
    where = torch.cuda.get_device_name() if device.startswith("cuda") else platform.processor() or platform.machine()
    return (
        f"# posenc bench, {datetime.date.today()}: {device} ({where}), torch {torch.__version__}, "
        f"{torch.get_num_threads()} CPU threads"
        + ("" if device.startswith("cuda") else f", {cpu_kernel_name()}")
        + f"\n\nAttention memory: {memory_method(device)}."
    )


def cpu_kernel_name() -> str:
    """Which CPU RoPE path the posenc rows ran: the C kernel, or the blocked torch path and why."""
    from posenc import kernels
    from posenc.kernels import native

    if not kernels.use_cpu:
        return "CPU RoPE: plain eager ops"
    if kernels.use_native and native.available():
        return f"CPU RoPE: {native.describe()}"
    why = "turned off" if not kernels.use_native else native.error()
    return f"CPU RoPE: the blocked torch path (C kernel {why})"
