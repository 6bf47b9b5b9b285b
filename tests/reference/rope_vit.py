"""Formula-level reference for RoPE-ViT (Heo et al. 2024, arXiv:2403.13298), in the paper code's complex form.

Written from the formulas of naver-ai/rope-vit ``models/vit_rope.py`` (``init_t_xy``, ``compute_axial_cis``,
``init_random_2d_freqs``, ``compute_mixed_cis``, ``apply_rotary_emb``), not copied. Two additions for testing:
a ``dtype`` argument (the original is float32; tests run it in float64 too) and a ``generator`` for the random
init; plus an N-axis generalisation of the axial tables (``init_t_nd`` / ``compute_axial_cis_nd``) for video.
Rotation multiplies adjacent channel pairs ``(2i, 2i + 1)``, viewed as complex numbers, by ``exp(i * angle)``.
"""

from __future__ import annotations

import math

import torch


def init_t_xy(end_x: int, end_y: int, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ``t`` of an ``end_y x end_x`` grid sits at ``x = t % end_x``, ``y = t // end_x``."""
    t = torch.arange(end_x * end_y, dtype=dtype)
    return t % end_x, torch.div(t, end_x, rounding_mode="floor")


def compute_axial_cis(dim: int, end_x: int, end_y: int, theta: float = 100.0, dtype=torch.float32) -> torch.Tensor:
    """``exp(i * angle)`` per token and pair: x pairs first (``dim // 4``), then y pairs. Returns (N, dim // 2)."""
    freqs = 1.0 / (theta ** (torch.arange(0, dim, 4, dtype=dtype)[: dim // 4] / dim))
    t_x, t_y = init_t_xy(end_x, end_y, dtype)
    ang_x, ang_y = torch.outer(t_x, freqs), torch.outer(t_y, freqs)
    cis_x = torch.polar(torch.ones_like(ang_x), ang_x)
    cis_y = torch.polar(torch.ones_like(ang_y), ang_y)
    return torch.cat([cis_x, cis_y], dim=-1)


def init_t_nd(*ends: int, dtype: torch.dtype = torch.float32) -> list[torch.Tensor]:
    """Mixed-radix digits of the token index, first axis fastest: ``t = x + end_x * (y + end_y * z)``."""
    t = torch.arange(math.prod(ends), dtype=torch.int64)
    coords, stride = [], 1
    for end in ends:
        coords.append(((t // stride) % end).to(dtype))
        stride *= end
    return coords


def compute_axial_cis_nd(dim: int, *ends: int, theta: float = 100.0, dtype=torch.float32) -> torch.Tensor:
    """N-axis axial table: axis ``a`` owns pairs ``[a * dim / (2N), (a + 1) * dim / (2N))``. Returns (N, dim // 2)."""
    n = len(ends)
    step = 2 * n
    freqs = 1.0 / (theta ** (torch.arange(0, dim, step, dtype=dtype)[: dim // step] / dim))
    blocks = []
    for coord in init_t_nd(*ends, dtype=dtype):
        ang = torch.outer(coord, freqs)
        blocks.append(torch.polar(torch.ones_like(ang), ang))
    return torch.cat(blocks, dim=-1)


def init_random_2d_freqs(
    dim: int,
    num_heads: int,
    theta: float = 10.0,
    rotate: bool = True,
    generator: torch.Generator | None = None,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Per head: directions at angle ``phi`` and ``phi + pi/2``, magnitudes of axial RoPE. Returns (2, H, dim // 2)."""
    freqs_x, freqs_y = [], []
    mag = 1.0 / (theta ** (torch.arange(0, dim, 4, dtype=dtype)[: dim // 4] / dim))
    for _ in range(num_heads):
        # One uniform draw per head, in head order: the stream a torch.Generator reproduces.
        angles = torch.rand(1, generator=generator).to(dtype) * 2 * torch.pi if rotate else torch.zeros(1, dtype=dtype)
        freqs_x.append(torch.cat([mag * torch.cos(angles), mag * torch.cos(torch.pi / 2 + angles)], dim=-1))
        freqs_y.append(torch.cat([mag * torch.sin(angles), mag * torch.sin(torch.pi / 2 + angles)], dim=-1))
    return torch.stack([torch.stack(freqs_x, dim=0), torch.stack(freqs_y, dim=0)], dim=0)


def compute_mixed_cis(freqs: torch.Tensor, t_x: torch.Tensor, t_y: torch.Tensor, num_heads: int) -> torch.Tensor:
    """``exp(i * (t_x * freqs[0, h] + t_y * freqs[1, h]))`` via the paper's matmul form. Returns (H, N, F)."""
    n = t_x.shape[0]
    flat_x, flat_y = freqs[0].reshape(-1), freqs[1].reshape(-1)  # (H * F,)
    ang_x = (t_x.unsqueeze(-1) @ flat_x.unsqueeze(-2)).view(n, num_heads, -1).permute(1, 0, 2)  # (H, N, F)
    ang_y = (t_y.unsqueeze(-1) @ flat_y.unsqueeze(-2)).view(n, num_heads, -1).permute(1, 0, 2)  # (H, N, F)
    return torch.polar(torch.ones_like(ang_x), ang_x + ang_y)


def apply_rotary_emb(xq: torch.Tensor, xk: torch.Tensor, freqs_cis: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Multiply channel pairs ``(2i, 2i + 1)`` of ``xq``/``xk`` (..., N, D) by ``freqs_cis`` (…, N, D/2)."""
    real = torch.float64 if xq.dtype == torch.float64 else torch.float32
    xq_ = torch.view_as_complex(xq.to(real).reshape(*xq.shape[:-1], -1, 2))  # (..., N, D/2) complex
    xk_ = torch.view_as_complex(xk.to(real).reshape(*xk.shape[:-1], -1, 2))  # (..., N, D/2) complex
    cis = freqs_cis.to(xq_.dtype)
    xq_out = torch.view_as_real(xq_ * cis).flatten(-2)  # (..., N, D)
    xk_out = torch.view_as_real(xk_ * cis).flatten(-2)  # (..., N, D)
    return xq_out.to(xq.dtype), xk_out.to(xk.dtype)
