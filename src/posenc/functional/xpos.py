"""xPos: rotary position embedding with an exponential decay, as pure functions of tensors.

Paper: Sun et al. 2022, "A Length-Extrapolatable Transformer" (arXiv:2212.10554).
Reference implementation checked against: torchscale ``XPOS`` (``torchscale/component/xpos_relative_position.py``:
``fixed_pos_embedding``, ``rotate_every_two``, ``duplicate_interleave``, ``scale ** (pos / scale_base)``),
re-derived from the formula in ``tests/reference/xpos.py``.

xPos rotates exactly like RoPE and also multiplies both channels of pair ``i`` by

    zeta_i ** (+(m - center) / scale_base)   for a query at position m,
    zeta_i ** (-(n - center) / scale_base)   for a key at position n,    zeta_i = (2i + 0.4 D) / (1.4 D),

so ``<q_m, k_n>`` is a function of ``m - n`` only and, since ``zeta_i < 1``, shrinks as ``m - n`` grows. Both
factors fold into the cosine/sine tables (:func:`xpos_cos_sin`); the range of positions a dtype holds:
:func:`xpos_max_distance`.

Shapes:
    B batch, S positions, D head dim, F = D / 2.
    inv_freq   (F,)                  float32
    zeta       (F,)                  float64
    positions  (S,) or (B, S)        integer or floating point
    scale      (S, F) or (B, S, F)   float64 (float32 on MPS)
    cos, sin   (S, F) or (B, S, F)   float32 (float64 on request), scale included
"""

from __future__ import annotations

import math
import weakref

import torch

from posenc._checks import _readable, check_number, check_positions, check_positive_int, fail
from posenc.functional.rope import angle_dtype, rope_angles, rope_cos_sin, table_dtype


def xpos_zeta(dim: int, *, device: torch.device | str | None = None) -> torch.Tensor:
    """The per-pair decay bases ``zeta_i = (2i + 0.4 dim) / (1.4 dim)`` for ``i < dim // 2``, in float64.

    Shapes:
        returns (dim // 2,)
    """
    check_positive_int("dim", dim)
    if dim % 2:
        fail("dim", dim, "an even number (xPos scales channel pairs)")
    return (torch.arange(0, dim, 2, dtype=torch.float64, device=device) + 0.4 * dim) / (1.4 * dim)


def xpos_max_distance(dim: int, *, scale_base: float = 512.0, dtype: torch.dtype = torch.float32) -> float:
    """The largest ``|p - center|`` at which every factor ``zeta_i ** (+-(p - center) / scale_base)`` is a normal
    ``dtype`` number, in ``[tiny, 1 / tiny]`` (``torch.finfo(dtype).tiny``).

    The steepest pair is ``i = 0``, ``zeta_0 = 2/7`` for every ``dim``: ``-ln(tiny) / ln(7/2) * scale_base``, about
    ``69.7 * scale_base`` for float32 and bfloat16, ``7.7 * scale_base`` for float16, ``565 * scale_base`` for float64.

    Numerics: past it (35,694 for float32 and bfloat16 at ``scale_base=512``, 3,966 for float16, 289,519 for float64)
    the key factors overflow to inf and the query factors underflow to 0, and the outputs turn into inf and NaN, so
    those positions are refused (``check_xpos_positions``; a ``ValueError`` naming the position). Within it every output
    pair is its input pair's norm times a factor in ``[tiny, 1 / tiny]``: finite for pairs of norm below ``tiny * max``,
    about 4. ``center`` cancels in ``q . k``: set it near the middle of the positions in use (torchscale centres at half
    the length) to double the usable length.
    """
    check_positive_int("dim", dim)
    check_number("scale_base", scale_base, above=0.0)
    steepest = -math.log((0.4 * dim) / (1.4 * dim))  # -ln(zeta_0), the arithmetic of xpos_zeta in float64
    return -math.log(torch.finfo(dtype).tiny) / steepest * float(scale_base)


def check_xpos_positions(
    positions: torch.Tensor,
    *,
    dim: int,
    scale_base: float = 512.0,
    center: float = 0.0,
    dtype: torch.dtype = torch.float32,
    name: str = "positions",
) -> None:
    """Refuse positions past ``xpos_max_distance`` from ``center``, where the ``dtype`` factors over/underflow.

    ``dtype`` is the dtype the factors are kept in: the tables', or the output's where it is narrower (float16).
    ``positions`` must have passed ``posenc._checks.check_positions`` (the callers' first check). Reading them is
    one host sync per positions tensor (see ``_extremes``); like that function's finiteness check it is skipped
    under ``torch.compile``/``torch.jit`` tracing, ``vmap``/``grad`` transforms, for fake, meta and subclass tensors
    and during CUDA graph capture.

    Shapes:
        positions (S,) or (B, S), integer or floating point, finite
    """
    if positions.numel() == 0 or not _readable(positions):
        return
    limit = xpos_max_distance(dim, scale_base=scale_base, dtype=dtype)
    low, high = _extremes(positions)
    if max(high - center, center - low) <= limit:
        return
    where = tuple(int(i) for i in torch.unravel_index((positions.double() - center).abs().argmax(), positions.shape))
    fail(
        f"{name}[{', '.join(map(str, where))}]",
        positions[where].item(),
        f"|position - center| <= {_floor(limit)} for {dtype} (positions {_floor(center - limit, up=True)} .. "
        f"{_floor(center + limit)} with center={center}, scale_base={scale_base}): the xPos scale "
        f"zeta**(±(n - center)/scale_base) overflows/underflows {dtype} beyond it (inf and NaN outputs); set "
        "center near the middle of the positions in use, or a larger scale_base",
    )


def _floor(x: float, *, up: bool = False) -> str:
    """``x`` rounded towards the inside of the allowed range, to 0.1: never shows a refused position as allowed."""
    return f"{(math.ceil(x * 10) if up else math.floor(x * 10)) / 10:g}"


# Extremes of position tensors already read, by id: (weak reference, version counter, min, max). A model passes the
# same positions to every layer: one host sync per tensor and forward instead of one per layer (as ``_FINITE`` in
# ``posenc._checks``). Views share their base's version counter, so an in-place change anywhere forces a new read.
_EXTREMES: dict[int, tuple[weakref.ref, int, float, float]] = {}
_EXTREMES_SLOTS = 16


def _extremes(positions: torch.Tensor) -> tuple[float, float]:
    """``(positions.min(), positions.max())`` as Python numbers: the one host sync, cached per tensor version."""
    cacheable = not positions.is_inference()  # inference tensors have no version counter
    entry = _EXTREMES.get(id(positions)) if cacheable else None
    if entry is not None and entry[0]() is positions and entry[1] == positions._version:
        return entry[2], entry[3]
    low, high = torch.stack((positions.min(), positions.max())).tolist()
    if cacheable:
        if len(_EXTREMES) >= _EXTREMES_SLOTS:
            _EXTREMES.pop(next(iter(_EXTREMES)), None)
        _EXTREMES[id(positions)] = (weakref.ref(positions), positions._version, low, high)
    return low, high


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
    ``rope_angles`` promotes ``p`` to float64 first, so integer positions beyond 2**24 lose nothing. Positions past
    ``xpos_max_distance`` for that dtype are refused.

    Shapes:
        positions (S,) or (B, S) -> (S, F) or (B, S, F), F = dim // 2
    """
    check_positions(positions)
    check_number("scale_base", scale_base, above=0.0)
    check_number("center", center)
    dtype = angle_dtype(positions.device, torch.float32)
    check_xpos_positions(positions, dim=dim, scale_base=scale_base, center=center, dtype=dtype)
    return scale_of(positions, dim=dim, scale_base=scale_base, center=center, downscale=downscale)


def scale_of(positions: torch.Tensor, *, dim: int, scale_base: float, center: float, downscale: bool) -> torch.Tensor:
    """``xpos_scale`` for arguments already checked: the shared arithmetic, no validation of the position range.

    Shapes:
        positions (S,) or (B, S) -> (S, F) or (B, S, F), F = dim // 2
    """
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

    The exponent ``(p - center) / scale_base * ln(zeta_i)`` is computed in float64 and the scaled tables are rounded
    once, so ``apply_rotary`` does the rotation and the scaling in one pass.

    Queries take ``downscale=False``, keys ``downscale=True``. Positions past ``xpos_max_distance`` for ``dtype``
    are refused.

    Shapes:
        positions (S,) or (B, S); inv_freq (F,) -> cos, sin (S, F) or (B, S, F)
    """
    check_positions(positions)
    check_number("scale_base", scale_base, above=0.0)
    check_number("center", center)
    dim = 2 * inv_freq.shape[-1]
    check_xpos_positions(positions, dim=dim, scale_base=scale_base, center=center, dtype=table_dtype(dtype))
    return cos_sin_of(positions, inv_freq, scale_base=scale_base, center=center, downscale=downscale, dtype=dtype)


def cos_sin_of(
    positions: torch.Tensor,
    inv_freq: torch.Tensor,
    *,
    scale_base: float,
    center: float,
    downscale: bool,
    dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``xpos_cos_sin`` for arguments already checked: no validation of the position range.

    Shapes:
        positions (S,) or (B, S); inv_freq (F,) -> cos, sin (S, F) or (B, S, F)
    """
    dim = 2 * inv_freq.shape[-1]
    scale = scale_of(positions, dim=dim, scale_base=scale_base, center=center, downscale=downscale)  # (..., S, F)
    return rope_cos_sin(positions, inv_freq, attention_factor=scale, dtype=dtype)
