"""Fixed sinusoidal absolute position encodings, 1-D (sequences) and 2-D (image patch grids), as pure functions.

Papers: Vaswani et al. 2017, "Attention Is All You Need" (arXiv:1706.03762), section 3.5 (1-D); He et al. 2022,
"Masked Autoencoders Are Scalable Vision Learners" (CVPR 2022, arXiv:2111.06377) (2-D sin-cos).
Reference implementations checked against: Hugging Face DistilBERT ``create_sinusoidal_embeddings`` (1-D) and
facebookresearch/mae ``util/pos_embed.py`` ``get_2d_sincos_pos_embed`` (2-D), both re-derived in
``tests/reference/sinusoidal.py``. The two channel layouts differ, as in the papers' code: interleaved
``sin, cos`` pairs in 1-D (``sinusoidal_encoding``), four blocks in 2-D (``sinusoidal_2d_encoding``).

Shapes:
    B batch, S positions, D = dim.
    positions (S,) or (B, S) (1-D); (S, 2) or (B, S, 2), columns (x, y) (2-D); integer or floating point
    returns   (S, D) or (B, S, D), ``dtype``

Numerics: angles in float64 (float32 on devices without it, Apple MPS); sin/cos rounded once to ``dtype``, so a
bf16 model gets the float64 encoding rounded to bf16, also at positions in the millions.
"""

from __future__ import annotations

import torch

from posenc._checks import check_number, check_positions, check_positive_int, fail
from posenc.functional.rope import angle_dtype, angles_of, rope_angles


def _check_args(dim: int, base: float, dtype: torch.dtype, multiple: int, why: str) -> None:
    check_positive_int("dim", dim)
    if dim % multiple:
        fail("dim", dim, f"a multiple of {multiple} ({why})")
    check_number("base", base, above=1.0)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        fail("dtype", dtype, "a floating point torch.dtype")


def _frequencies(dim: int, base: float, device: torch.device) -> torch.Tensor:
    """``base ** (-2i / dim)`` for ``i < dim // 2``, in the angle dtype: ``(dim // 2,)``."""
    exponent = torch.arange(0, dim, 2, dtype=angle_dtype(device, torch.float32), device=device) / dim
    return 1.0 / (float(base) ** exponent)


def sinusoidal_encoding(
    positions: torch.Tensor, dim: int, *, base: float = 10000.0, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """Vaswani et al.'s sinusoidal encoding, sine and cosine interleaved: ``PE[p, 2i] = sin(p * base ** (-2i/dim))``,
    ``PE[p, 2i + 1] = cos(p * base ** (-2i/dim))``.

    Equal to Hugging Face DistilBERT's ``create_sinusoidal_embeddings`` (``base=10000``) at integer positions.

    Args:
        positions: one position per token, integer or float (float positions interpolate smoothly).
        dim: channels ``D``, even.
        base: the wavelength scale (10000 in the paper); wavelengths run from 2 pi to about ``2 pi * base``.
        dtype: output dtype; the angles are computed in float64 regardless.

    Shapes:
        positions (S,) or (B, S) -> (S, D) or (B, S, D)
    """
    _check_args(dim, base, dtype, 2, "a sine and a cosine per frequency")
    if not isinstance(positions, torch.Tensor) or positions.dim() not in (1, 2):
        fail("positions.shape", getattr(positions, "shape", type(positions).__name__), "(S,) or (B, S)")
    angles = rope_angles(positions, _frequencies(dim, base, positions.device))  # (..., S, D/2)
    return torch.stack((angles.sin(), angles.cos()), dim=-1).flatten(-2).to(dtype)  # (..., S, D/2, 2) -> (..., S, D)


def sinusoidal_2d_encoding(
    positions: torch.Tensor, dim: int, *, base: float = 10000.0, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """MAE's 2-D sin-cos encoding: ``[sin(x w) | cos(x w) | sin(y w) | cos(y w)]``, ``w_i = base ** (-i / (D/4))``.

    Four blocks of ``dim / 4``: each half is MAE's 1-D encoding ``[sin | cos]`` of one coordinate, ``x`` (the
    fastest-varying axis, column 0 of ``grid_positions(W, H)``) first. MAE's code names the first half ``emb_h`` but,
    through ``np.meshgrid(grid_w, grid_h)``, feeds it the width coordinate ``x``.

    For ``positions = grid_positions(W, H)`` this is ``get_2d_sincos_pos_embed`` of facebookresearch/mae (square
    grids there), without the cls-token row: pass only the patch tokens.

    Args:
        positions: grid coordinates ``(x, y)`` per token, integer or float (float: e.g. rescaled grids).
        dim: channels ``D``, a multiple of 4.
        base: the wavelength scale (10000 in MAE).
        dtype: output dtype; the angles are computed in float64 regardless.

    Shapes:
        positions (S, 2) or (B, S, 2) -> (S, D) or (B, S, D)
    """
    _check_args(dim, base, dtype, 4, "a sine and a cosine block for each of x and y")
    if not isinstance(positions, torch.Tensor) or positions.dim() not in (2, 3) or positions.shape[-1] != 2:
        fail("positions.shape", getattr(positions, "shape", type(positions).__name__), "(S, 2) or (B, S, 2): (x, y)")
    check_positions(positions)  # once for both columns
    inv_freq = _frequencies(dim // 2, base, positions.device)  # (D/4,), shared by both axes
    blocks = []
    for axis in range(2):  # x, then y
        angles = angles_of(positions[..., axis], inv_freq)  # (..., S, D/4)
        blocks += [angles.sin(), angles.cos()]
    return torch.cat(blocks, dim=-1).to(dtype)  # (..., S, D)
