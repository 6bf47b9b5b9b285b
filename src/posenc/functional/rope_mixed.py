"""RoPE-Mixed: rotary position embedding with learnable, per-head 2-D frequencies, as pure functions.

Paper: Heo et al. 2024, "Rotary Position Embedding for Vision Transformer" (ECCV 2024, arXiv:2403.13298), Sec. 3.
Reference implementation checked against: naver-ai/rope-vit ``models/vit_rope.py`` (``init_random_2d_freqs``,
``compute_mixed_cis``, ``apply_rotary_emb``), re-derived in ``tests/reference/rope_vit.py``.

Pair ``f`` of head ``h`` rotates by ``x * freqs[0, h, f] + y * freqs[1, h, f]``: a frequency *vector* per pair,
so one pair can respond to diagonal directions, and the vectors are trained. Positions use the axis order of
``posenc.functional.axial_rope``: column 0 is ``x`` (fastest-varying), column 1 is ``y``.

Shapes:
    H heads, F = head_dim / 2 rotated pairs.
    freqs     (2, H, F)                     float32 parameter; freqs[0] multiplies x, freqs[1] multiplies y
    positions (S, 2) or (B, S, 2)           integer or floating point
    angles    (H, S, F) or (B, H, S, F)     float64, differentiable w.r.t. freqs
    cos, sin  (H, S, F) or (B, H, S, F)     float32 (float64 on request), broadcast over q (B, H, S, D)
"""

from __future__ import annotations

import math

import torch

from posenc._checks import check_number, check_positions, check_positive_int, fail
from posenc.functional.rope import angle_dtype


def init_mixed_freqs(
    head_dim: int,
    num_heads: int,
    *,
    base: float = 10.0,
    rotate: bool = True,
    generator: torch.Generator | None = None,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """RoPE-ViT's ``init_random_2d_freqs``: per head, two orthogonal frequency directions at a random angle.

    For head ``h`` with angle ``phi_h = 2 pi * U[0, 1)`` (``0`` if not ``rotate``) and magnitudes
    ``mag = 1 / base ** (arange(0, head_dim, 4) / head_dim)`` (``head_dim / 4`` of them)::

        freqs[0, h] = cat(mag * cos(phi_h), mag * cos(pi/2 + phi_h))
        freqs[1, h] = cat(mag * sin(phi_h), mag * sin(pi/2 + phi_h))

    The angles are drawn in one ``torch.rand(num_heads, generator=generator)`` call, which on CPU yields the same
    numbers as the reference's ``torch.rand(1)`` per head. Everything after the draw is computed in float64 and
    rounded once, with ``cos(pi/2 + phi) = -sin(phi)`` and ``sin(pi/2 + phi) = cos(phi)``, so ``rotate=False`` gives
    exact zeros (the reference's float32 ``cos(pi/2)`` leaves ``-4.4e-8 * mag``) and is exactly RoPE-Axial.

    Shapes:
        returns (2, num_heads, head_dim // 2), float32
    """
    check_positive_int("head_dim", head_dim)
    check_positive_int("num_heads", num_heads)
    check_number("base", base, above=1.0)
    if head_dim % 4 != 0:
        fail("head_dim", head_dim, "a multiple of 4 (half of the channel pairs per frequency direction)")
    if not isinstance(rotate, bool):
        fail("rotate", rotate, "True or False")
    draw_device = generator.device if generator is not None else device
    if rotate:
        u = torch.rand(num_heads, generator=generator, device=draw_device)  # (H,)
    else:
        u = torch.zeros(num_heads, device=draw_device)  # (H,)
    phi = (u.to(torch.float64) * (2 * math.pi)).to(device).unsqueeze(-1)  # (H, 1)
    exponent = torch.arange(0, head_dim, 4, dtype=torch.float64, device=device) / head_dim
    mag = 1.0 / (float(base) ** exponent)  # (F / 2,)
    cos, sin = mag * phi.cos(), mag * phi.sin()  # (H, F / 2)
    fx = torch.cat((cos, -sin), dim=-1)  # (H, F)
    fy = torch.cat((sin, cos), dim=-1)  # (H, F)
    return torch.stack((fx, fy), dim=0).to(torch.float32)  # (2, H, F)


def _check_mixed(positions: torch.Tensor, freqs: torch.Tensor) -> None:
    check_positions(positions)
    if not isinstance(freqs, torch.Tensor) or freqs.dim() != 3 or freqs.shape[0] != 2:
        fail("freqs.shape", tuple(freqs.shape), "(2, num_heads, F): x and y frequencies per head")
    if positions.dim() not in (2, 3) or positions.shape[-1] != 2:
        fail("positions.shape", tuple(positions.shape), "(S, 2) or (B, S, 2): (x, y) per token")


def mixed_angles(positions: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    """Angles ``x * freqs[0, h] + y * freqs[1, h]`` per head, in float64 (float32 on MPS), differentiable in freqs.

    Shapes:
        positions (S, 2) or (B, S, 2); freqs (2, H, F) -> (H, S, F) or (B, H, S, F)
    """
    _check_mixed(positions, freqs)
    dtype = angle_dtype(positions.device, freqs.dtype)
    pos = positions.to(dtype).unsqueeze(-3).unsqueeze(-1)  # (..., S, 2) -> (..., 1, S, 2, 1)
    f = freqs.to(device=positions.device, dtype=dtype)
    fx, fy = f[0].unsqueeze(-2), f[1].unsqueeze(-2)  # (H, F) -> (H, 1, F)
    return pos[..., 0, :] * fx + pos[..., 1, :] * fy  # (..., 1, S, 1) * (H, 1, F) -> (..., H, S, F)


def mixed_cos_sin(
    positions: torch.Tensor, freqs: torch.Tensor, *, dtype: torch.dtype = torch.float32
) -> tuple[torch.Tensor, torch.Tensor]:
    """Cosine and sine tables of ``mixed_angles``, ready for ``apply_rotary(layout="interleaved")``.

    ``dtype`` is float32 (the default) or float64: trig tables are never kept in half precision.

    Shapes:
        positions (S, 2) or (B, S, 2); freqs (2, H, F) -> cos, sin (H, S, F) or (B, H, S, F)
    """
    if dtype not in (torch.float32, torch.float64):
        fail("dtype", dtype, "torch.float32 or torch.float64 (trig tables are never kept in half precision)")
    angles = mixed_angles(positions, freqs)
    return angles.cos().to(dtype), angles.sin().to(dtype)
