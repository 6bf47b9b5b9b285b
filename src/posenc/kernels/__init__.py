"""Fused RoPE kernels: for CPU (``cpu``: the one-pass C kernel ``native`` where a C compiler built it, else a
blocked torch path) and a Triton kernel for CUDA (``triton_rope``).

``RotaryEmbedding`` and ``apply_rotary`` pick them automatically; set ``use_cpu`` / ``use_triton`` to False to
run the plain eager path instead, or ``use_native`` to False for the blocked CPU path (e.g. to compare).
Importing this package never imports Triton nor builds the C kernel.
"""

from __future__ import annotations

import importlib.util

import torch

use_cpu: bool = True
use_native: bool = True
use_triton: bool = True


def transformed(*tensors: torch.Tensor) -> bool:
    """Any of ``tensors`` is a functorch wrapper (inside ``vmap``, ``grad``, ``jvp``): no storage to hand a kernel,
    no ``out=`` batching rules, so only plain torch expressions run."""
    return any(torch._C._functorch.is_functorch_wrapped_tensor(t) for t in tensors)


def triton_available() -> bool:
    """Triton is installed (the kernel module imports it on first use)."""
    return importlib.util.find_spec("triton") is not None


def rotate_qk(
    q: torch.Tensor,
    k: torch.Tensor,
    q_tables: tuple[torch.Tensor, torch.Tensor],
    k_tables: tuple[torch.Tensor, torch.Tensor],
    *,
    layout: str,
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The Triton kernel's ``(q, k)`` for CUDA inputs it can take, else None (the caller runs the eager path).

    Shapes:
        q (B, H, S, D), k (B, Hkv, T, D); tables (S, F) or (1|B, S, F) float32
    """
    tables = (*q_tables, *k_tables)
    if not (use_triton and q.is_cuda and k.is_cuda and q.dtype == k.dtype and q.dim() == 4 and k.dim() == 4):
        return None
    if any(t.dtype != torch.float32 or t.requires_grad or t.device != q.device for t in tables):
        return None  # float64 inputs, or gradients wanted for the tables: eager path
    if not triton_available():
        return None
    from posenc.kernels.triton_rope import rotary_qk

    qc, qs, kc, ks = (_per_token(t) for t in tables)
    return rotary_qk(q, k, qc, qs, kc, ks, layout=layout)


def _per_token(table: torch.Tensor) -> torch.Tensor:
    """``(1, S, F)`` (positions ``(1, S)``) -> ``(S, F)``, shared by every row of the batch."""
    return table[0] if table.dim() == 3 and table.shape[0] == 1 else table
