"""Formula-level xPos reference, written after torchscale's ``XPOS`` (Sun et al. 2022, arXiv:2212.10554).

torchscale (``torchscale/component/xpos_relative_position.py``) builds ``scale = zeta ** (pos / scale_base)``,
``sin, cos`` of ``pos * inv_freq``, spreads them over channel pairs with ``duplicate_interleave`` and returns
``x * (cos * scale) + rotate_every_two(x) * (sin * scale)``; keys use ``1 / scale``. This file follows those steps
one to one, in float64 throughout, with explicit positions and a ``center`` instead of torchscale's
``-(length + offset) // 2`` offset. The ``"half"`` layout swaps in ``rotate_half`` and a concatenated spread.

The only thing taken from posenc's conventions is that ``inv_freq`` is stored in float32 (as in torchscale and
Hugging Face): it is computed in float64 here and rounded once, so float64 comparisons can be tight.
"""

from __future__ import annotations

import torch


def inv_freq(head_dim: int, base: float) -> torch.Tensor:
    """``base ** (-2i / D)``, rounded once to float32 and returned as float64. Shape (D/2,)."""
    exponent = torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim
    return (1.0 / base**exponent).to(torch.float32).to(torch.float64)


def zeta(head_dim: int) -> torch.Tensor:
    """torchscale's ``scale`` buffer: ``(arange(0, D, 2) + 0.4 D) / (1.4 D)``. Shape (D/2,)."""
    return (torch.arange(0, head_dim, 2, dtype=torch.float64) + 0.4 * head_dim) / (1.4 * head_dim)


def rotate_every_two(x: torch.Tensor) -> torch.Tensor:
    """GPT-J / torchscale: ``(x0, x1, x2, x3, ...) -> (-x1, x0, -x3, x2, ...)``."""
    x1, x2 = x[..., ::2], x[..., 1::2]
    return torch.stack((-x2, x1), dim=-1).flatten(-2)  # (..., D/2, 2) -> (..., D)


def duplicate_interleave(m: torch.Tensor) -> torch.Tensor:
    """``(..., D/2) -> (..., D)`` with every entry repeated twice in place: ``(a, a, b, b, ...)``."""
    return torch.stack((m, m), dim=-1).flatten(-2)  # (..., D/2, 2) -> (..., D)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """GPT-NeoX / HF: ``(x_a, x_b) -> (-x_b, x_a)`` on the two halves."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def duplicate_half(m: torch.Tensor) -> torch.Tensor:
    """``(..., D/2) -> (..., D)`` as ``(a, b, ..., a, b, ...)``."""
    return torch.cat((m, m), dim=-1)


def xpos(
    x: torch.Tensor,
    positions: torch.Tensor,
    *,
    base: float = 10000.0,
    scale_base: float = 512.0,
    center: float = 0.0,
    downscale: bool = False,
    layout: str = "interleaved",
) -> torch.Tensor:
    """xPos of ``x (B, H, S, D)`` at ``positions (S,)`` or ``(B, S)``, computed in float64.

    Queries: ``downscale=False``; keys: ``downscale=True``.
    """
    d = x.shape[-1]
    pos = _broadcast_positions(positions)  # (..., S, 1)
    scale = _scale(pos, d, scale_base=scale_base, center=center, downscale=downscale)  # (..., S, D/2)
    angles = pos * inv_freq(d, base)  # (..., S, D/2)
    sin, cos = torch.sin(angles), torch.cos(angles)
    spread, rotate = (
        (duplicate_interleave, rotate_every_two) if layout == "interleaved" else (duplicate_half, rotate_half)
    )
    cos, sin = spread(cos * scale), spread(sin * scale)  # (..., S, D)
    x64 = x.to(torch.float64)
    return x64 * cos + rotate(x64) * sin


def xpos_factor(
    positions: torch.Tensor,
    head_dim: int,
    *,
    scale_base: float = 512.0,
    center: float = 0.0,
    downscale: bool = False,
    layout: str = "interleaved",
) -> torch.Tensor:
    """The xPos factor of every channel, ``(S, D)`` or ``(B, 1, S, D)``: what the rotated ``x`` is multiplied by."""
    pos = _broadcast_positions(positions)  # (..., S, 1)
    scale = _scale(pos, head_dim, scale_base=scale_base, center=center, downscale=downscale)  # (..., S, D/2)
    return (duplicate_interleave if layout == "interleaved" else duplicate_half)(scale)  # (..., S, D)


def _broadcast_positions(positions: torch.Tensor) -> torch.Tensor:
    pos = positions.to(torch.float64)
    if pos.dim() == 2:
        pos = pos[:, None, :]  # (B, S) -> (B, 1, S): broadcast over heads
    return pos[..., None]  # (..., S) -> (..., S, 1)


def _scale(pos: torch.Tensor, head_dim: int, *, scale_base: float, center: float, downscale: bool) -> torch.Tensor:
    scale = zeta(head_dim) ** ((pos - center) / scale_base)  # (..., S, D/2)
    return 1.0 / scale if downscale else scale
