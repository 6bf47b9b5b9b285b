"""Sandwich: the inner product of two sinusoidal position embeddings as a parameter-free score bias.

Paper: Chi, Fan, Rudnicky, Ramadge 2023, "Dissecting Transformer Length Extrapolation via the Lens of Receptive
Field Analysis" (ACL 2023, arXiv:2212.10356), Sec. 5. With ``p_m`` the sinusoidal embedding of Vaswani et al. of
dimension ``d'`` (``pe_dim``), ``p_m . p_n = sum_k cos((m - n) w_k)``, ``w_k = base ** (-2k / d')``, a function of
``m - n`` alone that decays roughly logarithmically with distance. Head ``h`` adds

    b_h(m, n) = p_{m / r_h} . p_{n / r_h} - d' / 2 = sum_k (cos((m - n) w_k / r_h) - 1)

with a compression ratio ``r_h`` per head (:func:`sandwich_ratios`) that, like ALiBi's slopes, gives each head its
own reach; ``- d' / 2`` changes no softmax and makes the bias 0 on the diagonal, negative elsewhere.
Checked against the embeddings' dot products, built independently with the Vaswani formula in float64
(``tests/reference/sandwich.py``), and against NVIDIA NeMo's implementation written out
(``tests/reference/sandwich_nemo.py``; NeMo PR #6666), which reads the paper differently: :func:`sandwich_frequencies`.

Shapes:
    H heads, F = d' / 2 frequencies, S query positions, T key positions.
    frequencies     (H, F)                                float32: ``w_k / r_h`` (``sandwich_frequencies``)
    q_pos, k_pos    (S,) or (B|1, S); (T,) or (B|1, T)    integer, float32 or float64
    bias            (B|1, H, S, T)                        float32
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import torch

from posenc._checks import check_number, check_positive_int, fail
from posenc.functional.alibi import alibi_distance, check_alibi_positions


def sandwich_ratios(num_heads: int) -> tuple[float, ...]:
    """Default per-head compression ratios ``r_h = 8h / H`` for ``h = 1..H`` (``H = 8``: 1, 2, ..., 8).

    These follow the paper's per-head exponents for ALiBi (its Fig. 1, slope ``1 / 2**h`` with ``h = 8n / H``); pass
    ``ratios`` to use others (all 1 for the plain inner product).
    """
    check_positive_int("num_heads", num_heads)
    return tuple(8.0 * h / num_heads for h in range(1, num_heads + 1))


def check_sandwich_ratios(ratios: object, num_heads: int | None = None) -> tuple[float, ...]:
    """One finite ratio > 0 per head (``num_heads`` of them when given), as a tuple of floats (lists from JSON)."""
    n = num_heads
    if (
        isinstance(ratios, (str, bytes))
        or not isinstance(ratios, Sequence)
        or len(ratios) == 0
        or (n is not None and len(ratios) != n)
    ):
        want = f"{n} compression ratios, one per head" if n is not None else "one compression ratio per head"
        fail("ratios", ratios, f"a sequence of {want} (or None: 8h/H)")
    for i, r in enumerate(ratios):
        check_number(f"ratios[{i}]", r, above=0.0)
    return tuple(float(r) for r in ratios)


def sandwich_frequencies(
    pe_dim: int, ratios: Sequence[float], *, base: float = 10000.0, device: torch.device | str | None = None
) -> torch.Tensor:
    """Per-head frequencies ``base ** (-2k / pe_dim) / r_h`` for ``k < pe_dim / 2``, float64 rounded once to float32.

    NVIDIA NeMo (PR #6666, ``tests/reference/sandwich_nemo.py``) reads the paper differently on two points: its
    frequencies run over ``k = 1..d'/2`` with ``d'`` the head dimension (posenc: ``k = 0..d'/2 - 1``, the Vaswani
    embedding's indices, and ``d' = pe_dim``), and its head value ``8n/H`` divides the *bias* instead of the distance.
    The first is posenc with ratios ``10000 ** (2/d')``; with it, NeMo's head ``n`` times ``8n/H`` equals posenc's bias
    exactly (tested on full tensors). The second is a different function of the head (a compressed distance vs a scaled
    amplitude) and is posenc's reading of ``p_{m/r_h}``; the paper's Sec. 5 text was not available to settle it (see
    the issue 25 note), so the default is unchanged.

    Shapes:
        returns (H, pe_dim / 2) float32, H = len(ratios)
    """
    check_positive_int("pe_dim", pe_dim)
    if pe_dim % 2:
        fail("pe_dim", pe_dim, "an even number (a sine and a cosine per frequency)")
    check_number("base", base, above=1.0)
    ratios = check_sandwich_ratios(ratios)
    exponent = torch.arange(0, pe_dim, 2, dtype=torch.float64, device=device) / pe_dim  # (F,)
    omega = 1.0 / (float(base) ** exponent)  # (F,)
    r = torch.tensor(ratios, dtype=torch.float64, device=device)  # (H,)
    return (omega[None, :] / r[:, None]).to(torch.float32)  # (H, F)


def sandwich_kernel(distance: torch.Tensor, half_frequencies: torch.Tensor) -> torch.Tensor:
    """Elementwise ``-2 sum_k sin(d * half_frequencies[..., k]) ** 2``, terms added in order ``k = 0..F-1``.

    Numerics: ``-2 sum_k sin(d w_k / (2 r_h)) ** 2`` is the bias's ``sum_k (cos - 1)``
    (``cos x - 1 = -2 sin(x / 2)**2``) without the cancellation near ``d = 0`` where ``sum cos - d'/2`` would lose
    the small values. Angles are float32 products of the exact distance and the float32 frequencies (computed in
    float64, rounded once), so their error grows with distance: about ``d * 6e-8`` radians per term, i.e. below 1e-3
    per term up to distances of 10**4. Elementwise: the materialised bias and a FlexAttention ``score_mod`` call it on
    tensors of the same shapes, so both agree bit for bit when evaluated eagerly.

    ``half_frequencies`` holds the heads' rows of ``frequencies / 2`` with ``F`` last (``(H, 1, 1, F)`` for a bias
    grid, ``half[h]`` in a score_mod).
    """
    total = None
    for k in range(half_frequencies.shape[-1]):  # F terms, unrolled: every step is a pointwise op
        s = torch.sin(distance * half_frequencies[..., k])
        total = s * s if total is None else total + s * s
    return -2.0 * cast(torch.Tensor, total)  # F >= 1 terms


def check_sandwich_frequencies(frequencies: object) -> tuple[int, int]:
    """``(H, F)`` floating point frequencies; returns ``(H, F)``."""
    if not isinstance(frequencies, torch.Tensor) or frequencies.dim() != 2 or not frequencies.is_floating_point():
        shape = tuple(frequencies.shape) if isinstance(frequencies, torch.Tensor) else type(frequencies).__name__
        fail("frequencies.shape", shape, "(H, F) floating point: sandwich_frequencies(pe_dim, ratios)")
    return frequencies.shape[0], frequencies.shape[1]


def sandwich_bias(q_pos: torch.Tensor, k_pos: torch.Tensor, frequencies: torch.Tensor) -> torch.Tensor:
    """Sandwich's additive score bias ``sum_k (cos((i - j) w_hk) - 1)`` for every head, query and key.

    A sum of ``F`` terms per score (64 at the paper's ``d' = 128``), so it costs ``F`` elementwise passes over
    ``(B, H, S, T)``.

    Symmetric in ``i - j``: it serves causal and bidirectional attention alike.

    Shapes:
        q_pos (S,) or (B|1, S); k_pos (T,) or (B|1, T); frequencies (H, F) -> (B|1, H, S, T) float32
    """
    heads, n_freq = check_sandwich_frequencies(frequencies)
    q, k = check_alibi_positions(q_pos, k_pos)  # (1|B, S), (1|B, T)
    d = alibi_distance(q[:, None, :, None], k[:, None, None, :], symmetric=True)  # (B|1, 1, S, T), float32
    half = (frequencies.to(d.device, torch.float32) * 0.5).view(heads, 1, 1, n_freq)  # (H, 1, 1, F)
    return sandwich_kernel(d, half)  # (B|1, H, S, T)
