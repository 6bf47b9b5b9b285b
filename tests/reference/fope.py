"""Formula-level reference for FoPE (Hua et al. 2024, arXiv:2412.17739, Sec. 5), written from the paper's equations.

A channel pair is a complex number ``z = x_a + i x_b``. RoPE multiplies it by ``exp(i w_d p)``; FoPE by a Fourier
series over the kept frequencies instead, with separate real (cosine) and imaginary (sine) coefficients:

    h_d(p) = sum_j ( a[j, d] cos(w_j p) + i b[j, d] sin(w_j p) ),   w_j = base ** (-2j / D),

and frequencies whose wavelength ``2 pi / w_j`` is not below the training length ``L`` are clipped to zero, so a
clipped pair is multiplied by ``h = 1``. Everything here is float64 / complex128, element by element from these
formulas, independent of ``posenc.functional``: plain Python for the frequencies, per-head loops for the sets.
"""

from __future__ import annotations

import math

import torch


def frequencies(head_dim: int, base: float, train_len: int | None = None, num_frequencies: int | None = None):
    """RoPE's frequencies, highest first, and how many survive clipping (wavelength < train_len, or the first n).

    The frequencies are rounded to float32 once, as every implementation (vLLM, posenc) stores them; the clipping
    decision is taken on the exact wavelengths.
    """
    exact = [base ** (-2 * j / head_dim) for j in range(head_dim // 2)]
    omegas = torch.tensor(exact, dtype=torch.float64).float().double().tolist()
    if num_frequencies is not None:
        return omegas, num_frequencies
    return omegas, sum(1 for w in exact if 2 * math.pi / w < train_len)


def series(positions: torch.Tensor, omegas, kept: int, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``h[c, ..., s, d]``: the complex multiplier of pair ``d`` for coefficient set ``c`` at ``positions[..., s]``.

    ``a``, ``b`` are ``(C, M, M)`` cosine and sine coefficients ``[set, frequency j, pair d]``.
    """
    p = positions.to(torch.float64)
    pairs = len(omegas)
    out = torch.ones(a.shape[0], *p.shape, pairs, dtype=torch.complex128)
    for c in range(a.shape[0]):
        for d in range(kept):
            real = sum(float(a[c, j, d]) * torch.cos(omegas[j] * p) for j in range(kept))
            imag = sum(float(b[c, j, d]) * torch.sin(omegas[j] * p) for j in range(kept))
            out[c, ..., d] = torch.complex(real, imag)
    return out


def fope(
    x: torch.Tensor,
    positions: torch.Tensor,
    *,
    head_dim: int,
    base: float,
    a: torch.Tensor,
    b: torch.Tensor,
    train_len: int | None = None,
    num_frequencies: int | None = None,
    layout: str = "half",
) -> torch.Tensor:
    """FoPE applied to ``x (B, H, S, D)`` at positions ``(S,)`` or ``(B, S)``; head ``h`` uses set ``h // (H / C)``.

    ``layout="half"`` pairs channel ``d`` with ``d + D/2``; ``"interleaved"`` pairs ``2d`` with ``2d + 1``.
    Returns float64.
    """
    omegas, kept = frequencies(head_dim, base, train_len, num_frequencies)
    h = series(positions, omegas, kept, a.double(), b.double())  # (C, S, F) or (C, B, S, F)
    x = x.double()
    f = head_dim // 2
    a_part, b_part = (x[..., :f], x[..., f:]) if layout == "half" else (x[..., 0::2], x[..., 1::2])
    z = torch.complex(a_part, b_part)  # pair d as one complex number
    sets, heads = a.shape[0], x.shape[1]
    out = torch.empty_like(z)
    for head in range(heads):
        mult = h[head // (heads // sets)]  # (S, F) or (B, S, F)
        out[:, head] = z[:, head] * mult
    if layout == "half":
        return torch.cat((out.real, out.imag), dim=-1)
    return torch.stack((out.real, out.imag), dim=-1).flatten(-2)
