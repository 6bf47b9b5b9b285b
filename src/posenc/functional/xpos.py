"""xPos: rotary position embedding with an exponential decay, as pure functions of tensors.

Paper: Sun et al. 2022, "A Length-Extrapolatable Transformer" (arXiv:2212.10554).
Reference implementation checked against: torchscale ``XPOS`` (``torchscale/component/xpos_relative_position.py``:
``fixed_pos_embedding``, ``rotate_every_two``, ``duplicate_interleave``, ``scale ** (pos / scale_base)``),
re-derived from the formula in ``tests/reference/xpos.py``.

xPos rotates exactly like RoPE and also multiplies both channels of pair ``i`` by

    zeta_i ** (+(m - center) / scale_base)   for a query at position m,
    zeta_i ** (-(n - center) / scale_base)   for a key at position n,    zeta_i = (2i + 0.4 D) / (1.4 D),

so ``<q_m, k_n>`` is a function of ``m - n`` only and, since ``zeta_i < 1``, shrinks as ``m - n`` grows. Both
factors fold into the cosine/sine tables, so ``apply_rotary`` does the rotation and the scaling in one pass.

Shapes:
    B batch, S positions, D head dim, F = D / 2.
    inv_freq   (F,)                  float32
    zeta       (F,)                  float64
    positions  (S,) or (B, S)        integer or floating point
    scale      (S, F) or (B, S, F)   float64 (float32 on MPS)
    cos, sin   (S, F) or (B, S, F)   float32 (float64 on request), scale included

Numerics: the exponent ``(p - center) / scale_base * ln(zeta_i)`` is computed in float64 and the scaled tables are
rounded once. ``ln(zeta_0) = ln(2/7) = -1.25``, so a factor leaves the normal float32/bfloat16 range
(``1e-38 .. 3e38``) once ``|p - center| > 69 * scale_base`` (about 35,000 positions at ``scale_base=512``), and the
float16 range once ``|p - center| > 7 * scale_base`` (about 3,900). ``center`` cancels in ``q . k``: set it near the
middle of the positions in use (torchscale centres at half the length) to keep long sequences in range.
"""

from __future__ import annotations

import torch

from posenc._checks import check_number, check_positions, check_positive_int, fail
from posenc.functional.rope import angle_dtype, rope_angles, rope_cos_sin


def xpos_zeta(dim: int, *, device: torch.device | str | None = None) -> torch.Tensor:
    """The per-pair decay bases ``zeta_i = (2i + 0.4 dim) / (1.4 dim)`` for ``i < dim // 2``, in float64.

    Shapes:
        returns (dim // 2,)
    """
    check_positive_int("dim", dim)
    if dim % 2:
        fail("dim", dim, "an even number (xPos scales channel pairs)")
    return (torch.arange(0, dim, 2, dtype=torch.float64, device=device) + 0.4 * dim) / (1.4 * dim)


def xpos_scale(
    positions: torch.Tensor,
    *,
    dim: int,
    scale_base: float = 512.0,
    center: float = 0.0,
    downscale: bool = False,
) -> torch.Tensor:
    """Per-pair factors ``zeta_i ** ((p - center) / scale_base)``, inverted for keys (``downscale=True``).

    Computed as ``exp(p * r_i - center * r_i)`` with ``r_i = ln(zeta_i) / scale_base``, in float64 (float32 on MPS):
    ``rope_angles`` promotes ``p`` to float64 first, so integer positions beyond 2**24 lose nothing.

    Shapes:
        positions (S,) or (B, S) -> (S, F) or (B, S, F), F = dim // 2
    """
    check_positions(positions)
    check_number("scale_base", scale_base, above=0.0)
    check_number("center", center)
    dtype = angle_dtype(positions.device, torch.float32)
    rate = (xpos_zeta(dim).log() / float(scale_base)).to(dtype)  # (F,): d(log scale) / d(position)
    exponent = rope_angles(positions, rate)  # (..., S, F): p * ln(zeta) / scale_base
    if center != 0.0:
        exponent = exponent - (float(center) * rate).to(device=positions.device, dtype=dtype)
    if downscale:
        exponent = -exponent
    return exponent.exp()


def xpos_cos_sin(
    positions: torch.Tensor,
    inv_freq: torch.Tensor,
    *,
    scale_base: float = 512.0,
    center: float = 0.0,
    downscale: bool = False,
    dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor]:
    """RoPE cosine and sine tables with the xPos factor folded in: ``apply_rotary`` then rotates and scales.

    Queries take ``downscale=False``, keys ``downscale=True``.

    Shapes:
        positions (S,) or (B, S); inv_freq (F,) -> cos, sin (S, F) or (B, S, F)
    """
    scale = xpos_scale(
        positions, dim=2 * inv_freq.shape[-1], scale_base=scale_base, center=center, downscale=downscale
    )  # (..., S, F)
    return rope_cos_sin(positions, inv_freq, attention_factor=scale, dtype=dtype)
