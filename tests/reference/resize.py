"""Hand-written table interpolation in NumPy float64 loops, following PyTorch's ``F.interpolate`` conventions.

Written from the definitions, without calling ``F.interpolate``:

- source coordinate of output index ``j`` (``align_corners=False``, half-pixel centres):
  ``src = (j + 0.5) * in / out - 0.5``; linear clamps ``src`` at 0, cubic does not.
- ``linear``: weights ``(1 - t, t)`` on ``floor(src)`` and the next index (clamped to the last one).
- ``bicubic``: Keys' cubic convolution with ``a = -0.75`` on the four indices ``floor(src) - 1 .. floor(src) + 2``,
  each clamped into the table (border replication); the 2-D kernel is the outer product of the 1-D weights.
- ``bicubic_antialias`` (PyTorch's ``antialias=True``, Pillow's filter, timm's default): cubic with ``a = -0.5``,
  centre ``(j + 0.5) * scale`` with ``scale = in / out``, support ``2 * max(scale, 1)``, taps inside the table
  only, arguments divided by ``max(scale, 1)``, weights normalised to sum 1; separable, width first.
"""

from __future__ import annotations

import math

import numpy as np


def cubic_weights(t: float, a: float = -0.75) -> list[float]:
    """Weights of the taps at offsets -1, 0, 1, 2 from ``floor(src)``, ``t = src - floor(src)``."""
    return [keys(1.0 + t, a), keys(t, a), keys(1.0 - t, a), keys(2.0 - t, a)]


def keys(x: float, a: float) -> float:
    """Keys (1981) cubic convolution kernel."""
    x = abs(x)
    if x <= 1.0:
        return (a + 2.0) * x**3 - (a + 3.0) * x**2 + 1.0
    if x < 2.0:
        return a * x**3 - 5.0 * a * x**2 + 8.0 * a * x - 4.0 * a
    return 0.0


def linear_resize(table: np.ndarray, new_len: int) -> np.ndarray:
    """``(L, D) -> (new_len, D)``."""
    length = table.shape[0]
    out = np.zeros((new_len, table.shape[1]), dtype=np.float64)
    for j in range(new_len):
        src = max((j + 0.5) * length / new_len - 0.5, 0.0)
        i0 = min(int(math.floor(src)), length - 1)
        i1 = min(i0 + 1, length - 1)
        t = src - i0
        out[j] = (1.0 - t) * table[i0] + t * table[i1]
    return out


def bicubic_resize(table: np.ndarray, new_h: int, new_w: int) -> np.ndarray:
    """``(H, W, D) -> (new_h, new_w, D)``, PyTorch ``mode="bicubic", align_corners=False, antialias=False``."""
    h, w, d = table.shape
    out = np.zeros((new_h, new_w, d), dtype=np.float64)
    for oy in range(new_h):
        sy = (oy + 0.5) * h / new_h - 0.5
        iy, wy = int(math.floor(sy)), cubic_weights(sy - math.floor(sy))
        for ox in range(new_w):
            sx = (ox + 0.5) * w / new_w - 0.5
            ix, wx = int(math.floor(sx)), cubic_weights(sx - math.floor(sx))
            for m in range(4):
                y = min(max(iy - 1 + m, 0), h - 1)
                for n in range(4):
                    x = min(max(ix - 1 + n, 0), w - 1)
                    out[oy, ox] += wy[m] * wx[n] * table[y, x]
    return out


def _aa_weights(in_size: int, out_size: int) -> np.ndarray:
    """``(out_size, in_size)`` resampling matrix of the antialiased cubic filter."""
    scale = in_size / out_size
    stretch = max(scale, 1.0)
    support = 2.0 * stretch
    mat = np.zeros((out_size, in_size), dtype=np.float64)
    for j in range(out_size):
        centre = (j + 0.5) * scale
        lo = max(int(centre - support + 0.5), 0)
        hi = min(int(centre + support + 0.5), in_size)
        for i in range(lo, hi):
            mat[j, i] = keys((i - centre + 0.5) / stretch, -0.5)
        mat[j] /= mat[j].sum()
    return mat


def bicubic_antialias_resize(table: np.ndarray, new_h: int, new_w: int) -> np.ndarray:
    """``(H, W, D) -> (new_h, new_w, D)``, PyTorch ``mode="bicubic", align_corners=False, antialias=True``."""
    h, w, _ = table.shape
    across = np.einsum("xi,yid->yxd", _aa_weights(w, new_w), table)  # (H, W', D)
    return np.einsum("yi,ixd->yxd", _aa_weights(h, new_h), across)  # (H', W', D)
