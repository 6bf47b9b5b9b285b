"""Which dtype a pretrained model's long forwards run in: fast where the machine has the units for it, float32 else.

On a CPU, bfloat16 matrix products are fast only with bfloat16 units (AVX512-BF16, AMX-BF16): measured on
SmolLM2-135M (BENCHMARKS.md), a 12k-token forward with bfloat16 weights took 0.32x the float32 time on an Intel
Xeon with AMX, but 2.8-5.0x on an AVX2-only AMD EPYC, where oneDNN emulates bfloat16. float16 on CPU is the same
story with AMX-FP16 / AVX512-FP16. So ``auto`` picks bfloat16 only where the units are there (on CUDA: the
checkpoint's own dtype, else bfloat16), and an explicit low-precision dtype the CPU cannot run fast is refused with
the reason, never run at minutes per forward.

bfloat16 here means bfloat16 weights and activations with RoPE's tables and rotation in float32
(``posenc.hf.keep_rope_float32``): the split that kept SmolLM2's perplexity within 0.05% of float32 at 4k and 12k
tokens (BENCHMARKS.md, "Where bfloat16's error comes from").
"""

from __future__ import annotations

import torch

from posenc._checks import fail
from posenc._dtypes import DTYPE_CHOICES as DTYPE_CHOICES  # the command line's, defined without torch

_UNITS = {torch.bfloat16: ("avx512_bf16", "amx_bf16"), torch.float16: ("avx512_fp16", "amx_fp16")}


def cpu_units(dtype: torch.dtype) -> list[str]:
    """The CPU features this machine has that make ``dtype`` matrix products fast ([] for none, or for a dtype
    that needs none: float32, float64)."""
    if dtype not in _UNITS:
        return []
    caps = torch.cpu.get_capabilities() if hasattr(torch.cpu, "get_capabilities") else {}
    return [name for name in _UNITS[dtype] if caps.get(name)]


def slow_reason(dtype: torch.dtype, device: str | torch.device) -> str | None:
    """Why ``dtype`` would run slowly on ``device`` (None: it runs at full speed there)."""
    if torch.device(device).type != "cpu" or dtype not in _UNITS or cpu_units(dtype):
        return None
    name = str(dtype).removeprefix("torch.")
    caps = torch.cpu.get_capabilities() if hasattr(torch.cpu, "get_capabilities") else {}
    cpu = caps.get("cpu_name") or "this CPU"
    cost = "2.8-5x the float32 time for SmolLM2 on an AVX2 CPU" if dtype == torch.bfloat16 else "not measured"
    return (
        f"{cpu} has no {name} units ({' or '.join(u.upper().replace('_', '-') for u in _UNITS[dtype])}): its "
        f"{name} matrix products are emulated, slower than float32 ({cost}; BENCHMARKS.md)"
    )


def check_runs_fast(name: str, dtype: torch.dtype, device: str | torch.device) -> None:
    """Refuse a dtype the device cannot run fast, naming the setting ``name`` and what to use instead."""
    reason = slow_reason(dtype, device)
    if reason is not None:
        fail(name, str(dtype).removeprefix("torch."), f"float32 or auto on this machine ({reason})")


def auto_dtype(device: str | torch.device, checkpoint: torch.dtype | None = None) -> torch.dtype:
    """The dtype ``auto`` means: on CUDA the checkpoint's own (float16, bfloat16 or float32; bfloat16 when it has
    none, as a GGUF); on CPU bfloat16 where the CPU has bfloat16 units, else float32; float32 on other devices."""
    kind = torch.device(device).type
    if kind == "cuda":
        return checkpoint if checkpoint in (torch.float16, torch.bfloat16, torch.float32) else torch.bfloat16
    if kind == "cpu" and cpu_units(torch.bfloat16):
        return torch.bfloat16
    return torch.float32
