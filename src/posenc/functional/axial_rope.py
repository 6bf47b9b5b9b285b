"""Axial N-D rotary position embedding (RoPE-Axial) for images (2 axes) and video (3 axes), as pure functions.

Paper: Heo et al. 2024, "Rotary Position Embedding for Vision Transformer" (ECCV 2024, arXiv:2403.13298).
Reference implementation checked against: naver-ai/rope-vit ``models/vit_rope.py`` (``init_t_xy``,
``compute_axial_cis``, ``apply_rotary_emb``), re-derived in ``tests/reference/rope_vit.py``.

A token's position is a row of ``n_axes`` coordinates, **fastest-varying axis first**: ``(x, y)`` for images,
``(x, y, t)`` for video (``grid_positions``). The rotated pairs are split evenly over the axes, ``x`` block first
(``axial_inv_freq``).

Shapes:
    N number of axes, F = head_dim / 2 rotated pairs, F_a = F / N pairs per axis.
    positions (S, N) or (B, S, N)         integer or floating point
    inv_freq  (N, F_a)                    float32, one row per axis
    cos, sin  (S, F) or (B, S, F)         float32 (float64 on request); axis blocks concatenated in axis order
"""

from __future__ import annotations

import math

import torch

from posenc._checks import check_positions, check_positive_int, fail
from posenc.functional.rope import angles_of, default_inv_freq


def grid_positions(*sizes: int, device: torch.device | str | None = None) -> torch.Tensor:
    """Integer coordinates of every cell of a grid, fastest-varying axis first, as float32.

    ``grid_positions(W, H)`` lists the tokens of an ``(H, W)`` patch grid flattened row-major (``x`` fastest, exactly
    RoPE-ViT's ``init_t_xy(end_x=W, end_y=H)``), and ``grid_positions(W, H, T)`` those of a ``(T, H, W)`` video.

    Token ``t`` has coordinates ``x = t % sizes[0]``, ``y = (t // sizes[0]) % sizes[1]``, ... : the order of an
    ``(..., sizes[1], sizes[0])`` tensor flattened row-major, and of RoPE-ViT's ``init_t_xy(end_x, end_y)``.
    Tokens without a grid position (a cls token, registers) are not listed: rotate only the patch tokens.

    Args:
        *sizes: grid size along each axis, fastest-varying first: ``(W, H)`` for an image, ``(W, H, T)`` for video.
        device: where to build the positions.

    Shapes:
        returns (prod(sizes), len(sizes)); column ``a`` is the coordinate along ``sizes[a]``
    """
    if not sizes:
        fail("sizes", sizes, "at least one grid size, e.g. grid_positions(W, H)")
    for a, size in enumerate(sizes):
        check_positive_int(f"sizes[{a}]", size)
    # meshgrid "ij" varies its last argument fastest, so build the axes slowest-first and flip the columns back.
    axes = [torch.arange(size, dtype=torch.float32, device=device) for size in reversed(sizes)]
    grid = torch.stack(torch.meshgrid(*axes, indexing="ij"), dim=-1)  # (sizes[-1], ..., sizes[0], N), slowest first
    return grid.reshape(math.prod(sizes), len(sizes)).flip(-1)  # (prod(sizes), N), fastest axis first


def axial_inv_freq(
    head_dim: int, *, n_axes: int = 2, base: float = 100.0, device: torch.device | str | None = None
) -> torch.Tensor:
    """Per-axis frequencies: each row is ``default_inv_freq(head_dim // n_axes, base=base)``.

    The ``F = head_dim / 2`` rotated pairs are split evenly over the axes. Axis ``a`` owns the block of pairs
    ``[a * F_a, (a + 1) * F_a)``, ``F_a = F / n_axes``, rotated by ``position[a]`` times the default RoPE frequencies
    of a head of ``head_dim / n_axes`` channels. For 2 axes this is RoPE-ViT's
    ``1 / (theta ** (arange(0, dim, 4)[: dim // 4] / dim))`` for both ``x`` and ``y``, ``x`` block first.

    ``head_dim`` must be divisible by ``2 * n_axes`` so every axis gets a whole number of channel pairs.

    Shapes:
        returns (n_axes, head_dim // (2 * n_axes)), float32
    """
    check_positive_int("head_dim", head_dim)
    check_positive_int("n_axes", n_axes)
    if head_dim % (2 * n_axes) != 0:
        fail("head_dim", head_dim, f"a multiple of 2 * n_axes = {2 * n_axes} (whole channel pairs per axis)")
    per_axis = default_inv_freq(head_dim // n_axes, base=base, device=device)  # (F_a,)
    return per_axis.expand(n_axes, -1).clone()  # (N, F_a)


def _check_axial(positions: torch.Tensor, inv_freq: torch.Tensor) -> None:
    check_positions(positions)
    if not isinstance(inv_freq, torch.Tensor) or inv_freq.dim() != 2:
        fail("inv_freq.shape", tuple(inv_freq.shape), "(n_axes, F_a): one row of frequencies per axis")
    n_axes = inv_freq.shape[0]
    if positions.dim() not in (2, 3) or positions.shape[-1] != n_axes:
        fail("positions.shape", tuple(positions.shape), f"(S, {n_axes}) or (B, S, {n_axes}): one column per axis")


def axial_angles(positions: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """Angles ``positions[..., a] * inv_freq[a]``, axis blocks concatenated in axis order, in float64.

    Shapes:
        positions (S, N) or (B, S, N); inv_freq (N, F_a) -> (S, N * F_a) or (B, S, N * F_a)
    """
    _check_axial(positions, inv_freq)
    blocks = [angles_of(positions[..., a], inv_freq[a]) for a in range(inv_freq.shape[0])]  # N x (..., S, F_a)
    return torch.cat(blocks, dim=-1)  # (..., S, F)


def axial_cos_sin(
    positions: torch.Tensor, inv_freq: torch.Tensor, *, dtype: torch.dtype = torch.float32
) -> tuple[torch.Tensor, torch.Tensor]:
    """Cosine and sine tables of ``axial_angles``, ready for ``apply_rotary``.

    ``dtype`` is float32 (the default) or float64: trig tables are never kept in half precision.

    Shapes:
        positions (S, N) or (B, S, N); inv_freq (N, F_a) -> cos, sin (S, F) or (B, S, F)
    """
    if dtype not in (torch.float32, torch.float64):
        fail("dtype", dtype, "torch.float32 or torch.float64 (trig tables are never kept in half precision)")
    angles = axial_angles(positions, inv_freq)
    return angles.cos().to(dtype), angles.sin().to(dtype)
