"""RoPE rotation in float64, straight from the formula: the reference for precision tests at large positions.

Angles ``positions * inv_freq`` in float64; for ``layout="half"`` the pairs are ``(x[i], x[i + F])``, for
``"interleaved"`` ``(x[2i], x[2i + 1])``; each pair becomes ``(x1 cos - x2 sin, x2 cos + x1 sin)``, times the
attention factor. Channels past ``2F`` pass through.

Shapes:
    x (..., S, D); positions (S,) or (B, S) with x (B, H, S, D); inv_freq (F,) -> (..., S, D) float64
"""

from __future__ import annotations

import torch


def rotate_float64(
    x: torch.Tensor,
    positions: torch.Tensor,
    inv_freq: torch.Tensor,
    *,
    layout: str = "half",
    attention_factor: float = 1.0,
) -> torch.Tensor:
    x = x.to(torch.float64)
    f = inv_freq.shape[-1]
    rd = 2 * f
    angles = positions.to(torch.float64).unsqueeze(-1) * inv_freq.to(torch.float64)  # (..., S, F)
    if positions.dim() == 2:
        angles = angles.unsqueeze(-3)  # (B, S, F) -> (B, 1, S, F): shared by the heads
    cos, sin = angles.cos() * attention_factor, angles.sin() * attention_factor
    if layout == "half":
        x1, x2 = x[..., :f], x[..., f:rd]
        rotated = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
    elif layout == "interleaved":
        x1, x2 = x[..., 0:rd:2], x[..., 1:rd:2]
        rotated = torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).flatten(-2)
    else:
        raise ValueError(f"layout={layout!r}")
    return torch.cat((rotated, x[..., rd:]), dim=-1)
