"""Resizing learned absolute position tables to a new length or grid, as pure functions.

A table trained at one sequence length or image resolution is interpolated before use at another: Dosovitskiy et
al. 2021, "An Image is Worth 16x16 Words" (ViT, arXiv:2010.11929), section 3.2, "2D interpolation of the
pre-trained position embeddings".
Reference implementations checked against: facebookresearch/mae and DeiT ``interpolate_pos_embed`` (bicubic,
``align_corners=False``, no antialiasing: ``resize_table_2d``'s default) and timm ``resample_abs_pos_embed``
(bicubic with ``antialias=True`` by default: pass ``antialias=True``), through the hand-written interpolations in
``tests/reference/resize.py``.

Sizes are given fastest-varying axis first, as everywhere in posenc: ``grid_size = (W, H)`` like
``grid_positions(W, H)``. Tables are stored row-major, ``(H, W, D)``, so token ``t = y * W + x`` is ``table[y, x]``
and ``table.reshape(H * W, D)`` is a timm / MAE ``pos_embed`` without its prefix (cls) tokens.

Shapes:
    L, L' lengths; W, H and W', H' grid sizes; D channels.
    resize_table_1d: (L, D) -> (L', D)
    resize_table_2d: (H, W, D) -> (H', W', D)
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from posenc._checks import check_positive_int, fail


def check_grid_size(name: str, value: object) -> tuple[int, int]:
    """A pair ``(W, H)`` of positive integers, as a tuple."""
    if not isinstance(value, Sequence) or isinstance(value, str) or len(value) != 2:
        fail(name, value, "a pair (W, H) of positive integers, fastest-varying axis (width) first")
    for axis, size in enumerate(value):
        check_positive_int(f"{name}[{axis}]", size)
    return (value[0], value[1])


def _check_table(table: object, dims: str) -> None:
    if not isinstance(table, torch.Tensor) or table.dim() != len(dims.split(",")):
        fail("table.shape", getattr(table, "shape", type(table).__name__), f"({dims})")
    if not table.is_floating_point():
        fail("table.dtype", table.dtype, "a floating point dtype")


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    # F.interpolate's CPU kernels want float32 or float64; half tables are resized in float32 and rounded once.
    return torch.promote_types(dtype, torch.float32)


def resize_table_1d(table: torch.Tensor, new_len: int) -> torch.Tensor:
    """Linear interpolation of a ``(L, D)`` table to ``new_len`` rows (``align_corners=False``, PyTorch's
    half-pixel convention: row ``j`` samples ``(j + 0.5) * L / new_len - 0.5``, clamped to the table).

    Computed in float32 (float64 for float64 tables), returned in the table's dtype. Same length: the table.

    Shapes:
        table (L, D) -> (new_len, D)
    """
    _check_table(table, "L, D")
    check_positive_int("new_len", new_len)
    grid = table.to(_compute_dtype(table.dtype)).t().unsqueeze(0)  # (1, D, L): channels first
    out = F.interpolate(grid, size=new_len, mode="linear", align_corners=False)  # (1, D, L')
    return out[0].t().to(table.dtype).contiguous()  # (L', D)


def resize_table_2d(table: torch.Tensor, new_size: Sequence[int], *, antialias: bool = False) -> torch.Tensor:
    """Bicubic interpolation of an ``(H, W, D)`` grid table to ``new_size = (W', H')``.

    PyTorch's bicubic: Keys' cubic convolution with ``a = -0.75``, ``align_corners=False``, borders clamped. This is
    MAE / DeiT's ``interpolate_pos_embed``. ``antialias=True`` is timm's ``resample_abs_pos_embed`` default: a
    Pillow-style filter (``a = -0.5``, widened when shrinking); it differs from the default also when enlarging.

    Computed in float32 (float64 for float64 tables), returned in the table's dtype. Same size: the table.

    Shapes:
        table (H, W, D), new_size (W', H') -> (H', W', D)
    """
    _check_table(table, "H, W, D")
    new_w, new_h = check_grid_size("new_size", new_size)
    if not isinstance(antialias, bool):
        fail("antialias", antialias, "True or False")
    grid = table.to(_compute_dtype(table.dtype)).permute(2, 0, 1).unsqueeze(0)  # (1, D, H, W)
    out = F.interpolate(grid, size=(new_h, new_w), mode="bicubic", align_corners=False, antialias=antialias)
    return out[0].permute(1, 2, 0).to(table.dtype).contiguous()  # (H', W', D)
