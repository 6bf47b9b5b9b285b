"""Formula-level references for the sinusoidal encodings, in plain Python / NumPy float64.

``vaswani``: section 3.5 of Vaswani et al. 2017 (arXiv:1706.03762) written out element by element with ``math``:
``PE[p, 2i] = sin(p / base ** (2i / d))``, ``PE[p, 2i + 1] = cos(p / base ** (2i / d))``.

``get_1d_sincos_pos_embed_from_grid`` / ``get_2d_sincos_pos_embed_from_grid`` / ``get_2d_sincos_pos_embed``: the
formulas of facebookresearch/mae ``util/pos_embed.py`` (He et al. 2022), written from the formula, not copied, with
two generalisations for testing: a ``base`` (MAE hard-codes 10000) and non-square grids ``(grid_h, grid_w)`` (MAE
takes one ``grid_size``). The meshgrid keeps MAE's order, ``np.meshgrid(grid_w, grid_h)``: ``grid[0]`` is the
width coordinate, and it is encoded first (MAE names that block ``emb_h``).
"""

from __future__ import annotations

import math

import numpy as np


def vaswani(positions, dim: int, base: float = 10000.0) -> np.ndarray:
    """``(len(positions), dim)`` float64, one ``math.sin`` / ``math.cos`` per element."""
    out = np.zeros((len(positions), dim), dtype=np.float64)
    for row, p in enumerate(positions):
        for i in range(dim // 2):
            angle = float(p) / base ** (2 * i / dim)
            out[row, 2 * i] = math.sin(angle)
            out[row, 2 * i + 1] = math.cos(angle)
    return out


def get_1d_sincos_pos_embed_from_grid(embed_dim: int, pos: np.ndarray, base: float = 10000.0) -> np.ndarray:
    """MAE's 1-D encoding ``[sin(p * omega) | cos(p * omega)]``, ``omega_i = base ** -(i / (embed_dim / 2))``."""
    omega = np.arange(embed_dim // 2, dtype=np.float64) / (embed_dim / 2.0)
    omega = 1.0 / base**omega  # (D/2,)
    out = np.outer(np.asarray(pos, dtype=np.float64).reshape(-1), omega)  # (M, D/2)
    return np.concatenate([np.sin(out), np.cos(out)], axis=1)  # (M, D)


def get_2d_sincos_pos_embed_from_grid(embed_dim: int, grid: np.ndarray, base: float = 10000.0) -> np.ndarray:
    """Half the channels for ``grid[0]``, then half for ``grid[1]``."""
    emb_first = get_1d_sincos_pos_embed_from_grid(embed_dim // 2, grid[0], base)  # (H*W, D/2)
    emb_second = get_1d_sincos_pos_embed_from_grid(embed_dim // 2, grid[1], base)  # (H*W, D/2)
    return np.concatenate([emb_first, emb_second], axis=1)  # (H*W, D)


def get_2d_sincos_pos_embed(embed_dim: int, grid_h: int, grid_w: int, base: float = 10000.0) -> np.ndarray:
    """``(grid_h * grid_w, embed_dim)``, tokens in row-major order of an ``(grid_h, grid_w)`` grid, no cls row."""
    ws = np.arange(grid_w, dtype=np.float64)
    hs = np.arange(grid_h, dtype=np.float64)
    grid = np.stack(np.meshgrid(ws, hs), axis=0)  # (2, H, W); grid[0][i, j] = ws[j], "here w goes first"
    return get_2d_sincos_pos_embed_from_grid(embed_dim, grid.reshape(2, 1, grid_h, grid_w), base)
