"""Fourier Position Embedding (FoPE) as pure functions of tensors.

Paper: Hua et al. 2024, "Fourier Position Embedding: Enhancing Attention's Periodic Extension for Length
Generalization" (arXiv:2412.17739, ICML 2025), Sec. 5.
Reference implementation: vLLM ``FourierRotaryEmbedding`` (``model_executor/layers/rotary_embedding/fope.py``, which
serves InternLM / Intern-S1 checkpoints): the same frequencies, coefficient layout and clipping; checked against the
paper's complex-number form re-derived in ``tests/reference/fope.py``.

FoPE turns each channel pair by a Fourier series of RoPE's frequencies ``w_j = base ** (-2j / D)`` instead of a
single one: frequencies too low to complete a period in training are clipped to zero (:func:`fope_num_frequencies`),
and pair ``d`` turns by ``C(p) = sum_j cos_coef[c, j, d] cos(w_j p)``, ``S(p) = sum_j sin_coef[c, j, d] sin(w_j p)``
(:func:`fope_cos_sin`), the coefficients trained from the identity (:func:`init_fope_coefficients`).

Shapes:
    D head dim, F = D / 2 pairs, M kept frequencies (<= F), C coefficient sets (heads, or 1 shared), H heads.
    inv_freq            (M,)                       float32
    cos_coef, sin_coef  (C, M, M)                  [set, input frequency j, output pair d], vLLM's layout
    positions           (S,) or (B, S)             integer or floating point
    cos, sin            (C, S, F) or (B, C, S, F)  float32 (float64 on request)
    x                   (..., H, S, D)             H a multiple of C: head h uses set h // (H / C)
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as nnf

from posenc._checks import check_choice, check_number, check_positive_int, fail
from posenc.functional.rope import LAYOUTS, apply_rotary, default_inv_freq, rope_angles


def fope_num_frequencies(
    head_dim: int, *, base: float = 10000.0, train_len: int | None = None, num_frequencies: int | None = None
) -> int:
    """``M``: how many of RoPE's ``head_dim / 2`` frequencies FoPE keeps.

    A frequency whose wavelength ``2 pi / w_j`` is at least the training length ``L`` never completes a period in
    training, so it is under-trained; FoPE sets it to zero. The kept frequencies are a prefix, as ``w`` decreases.

    ``num_frequencies`` if given (vLLM's ``num_inv_freq``, which takes precedence), else the number with wavelength
    below ``train_len``: ``w_j > 2 pi / train_len`` for the float32 frequencies, as vLLM compares them.
    """
    _check_head_dim(head_dim)
    pairs = head_dim // 2
    if num_frequencies is not None:
        integer = isinstance(num_frequencies, int) and not isinstance(num_frequencies, bool)
        if not integer or not 0 <= num_frequencies <= pairs:
            fail("num_frequencies", num_frequencies, f"an integer in [0, head_dim // 2 = {pairs}]")
        return num_frequencies
    if train_len is None:
        fail("train_len", None, "the training length (longer wavelengths are clipped), or num_frequencies")
    check_positive_int("train_len", train_len)
    # On the CPU whatever the default device: the count sets parameter shapes, also for a meta-device build.
    inv_freq = default_inv_freq(head_dim, base=base, device="cpu")
    return int((inv_freq.double() > 2 * math.pi / train_len).sum())


def fope_frequencies(
    head_dim: int,
    *,
    base: float = 10000.0,
    train_len: int | None = None,
    num_frequencies: int | None = None,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """The ``M`` kept frequencies: RoPE's first ``M`` (``default_inv_freq``), float32.

    Shapes:
        returns (M,)
    """
    kept = fope_num_frequencies(head_dim, base=base, train_len=train_len, num_frequencies=num_frequencies)
    return default_inv_freq(head_dim, base=base, device=device)[:kept]


def init_fope_coefficients(
    num_sets: int,
    num_frequencies: int,
    *,
    std: float,
    generator: torch.Generator | None = None,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """``I + N(0, std^2)``: each pair starts on its own frequency, with a little of every kept frequency.

    With identity coefficients FoPE is RoPE with the clipped frequencies at zero, and ``<q_m, k_n>`` depends on
    ``m - n`` only; with cos and sin coefficients equal and diagonal that still holds (each pair's turn is scaled).
    General coefficients break it: products of two frequencies leave terms in ``m + n``.

    The paper draws the other frequencies' weights from ``N(0, sigma)``; its code and XTuner use a Xavier-normal
    draw with gain ``g``, i.e. ``std = g * sqrt(2 / (fan_in + fan_out))``. One ``torch.randn`` call.

    Shapes:
        returns (num_sets, num_frequencies, num_frequencies), float32
    """
    check_positive_int("num_sets", num_sets)
    if isinstance(num_frequencies, bool) or not isinstance(num_frequencies, int) or num_frequencies < 0:
        fail("num_frequencies", num_frequencies, "a non-negative integer")
    check_number("std", std, minimum=0.0)
    m = num_frequencies
    noise = torch.randn(num_sets, m, m, generator=generator, device=device, dtype=torch.float32)
    return torch.eye(m, device=noise.device, dtype=torch.float32) + std * noise


def fope_cos_sin(
    positions: torch.Tensor,
    inv_freq: torch.Tensor,
    cos_coef: torch.Tensor,
    sin_coef: torch.Tensor,
    *,
    pairs: int,
    dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor]:
    """FoPE's per-set cos and sin series at ``positions``, padded with ``(1, 0)`` to ``pairs`` channel pairs.

    Pair ``d < M`` of set ``c`` turns by ``C(p) = sum_j cos_coef[c, j, d] cos(w_j p)`` and
    ``S(p) = sum_j sin_coef[c, j, d] sin(w_j p)`` (``j < M``) in place of ``cos(w_d p)``, ``sin(w_d p)``:
    ``(x_a, x_b) -> (x_a C - x_b S, x_b C + x_a S)``. Pairs ``d >= M`` have frequency zero: ``C = 1, S = 0``, they pass
    through unchanged (vLLM pads sin with 0; SGLang's and XTuner's copies pad it with 1, which mixes the pair's two
    channels). The tables depend on each token's own position only, so KV-cache decoding, chunking and packing equal
    the full forward.

    Angles are float64 (``rope_angles``); the basis ``cos(w_j p)``, ``sin(w_j p)`` is rounded to ``dtype`` and mixed by
    the coefficients in ``dtype``. Differentiable with respect to the coefficients.

    Shapes:
        positions (S,) or (B, S); inv_freq (M,); cos_coef, sin_coef (C, M, M) -> cos, sin (C, S, F) or (B, C, S, F)
    """
    if dtype not in (torch.float32, torch.float64):
        fail("dtype", dtype, "torch.float32 or torch.float64 (trig tables are never kept in half precision)")
    m = inv_freq.shape[-1] if isinstance(inv_freq, torch.Tensor) else None
    for name, coef in (("cos_coef", cos_coef), ("sin_coef", sin_coef)):
        if not isinstance(coef, torch.Tensor) or coef.dim() != 3 or coef.shape[1:] != (m, m):
            shape = tuple(coef.shape) if isinstance(coef, torch.Tensor) else type(coef).__name__
            fail(f"{name}.shape", shape, f"(C, M, M) with M = len(inv_freq) = {m}")
    if cos_coef.shape != sin_coef.shape:
        fail("sin_coef.shape", tuple(sin_coef.shape), f"the shape of cos_coef, {tuple(cos_coef.shape)}")
    if isinstance(pairs, bool) or not isinstance(pairs, int) or pairs < m:
        fail("pairs", pairs, f"an integer >= len(inv_freq) = {m}: the head's channel pairs")
    angles = rope_angles(positions, inv_freq).unsqueeze(-3)  # (..., 1, S, M): one basis for every set
    cos = angles.cos().to(dtype) @ cos_coef.to(dtype)  # (..., C, S, M)
    sin = angles.sin().to(dtype) @ sin_coef.to(dtype)
    # Clipped pairs: frequency zero, cos = 1 and sin = 0, the identity.
    return nnf.pad(cos, (0, pairs - m), value=1.0), nnf.pad(sin, (0, pairs - m), value=0.0)


def apply_fope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *, layout: str = "half") -> torch.Tensor:
    """Turn ``x`` by FoPE tables ``(C, S, F)`` or ``(B, C, S, F)``: head ``h`` of ``H`` uses set ``h // (H / C)``.

    ``C == H`` gives each head its own set; ``C`` = the key/value heads shares a set across each GQA group of query
    heads (vLLM's layout); ``C == 1`` shares one set.

    Shapes:
        x (..., H, S, D); cos, sin (C, S, F) or (B, C, S, F) with H % C == 0, 2F <= D -> (..., H, S, D)
    """
    check_choice("layout", layout, LAYOUTS)
    if not isinstance(x, torch.Tensor) or x.dim() < 3:
        fail("x.shape", getattr(x, "shape", type(x).__name__), "(..., H, S, D): heads, positions, channels")
    if cos.dim() < 3:
        fail("cos.shape", tuple(cos.shape), "(C, S, F) or (B, C, S, F): one table per coefficient set")
    heads, sets = x.shape[-3], cos.shape[-3]
    if heads % sets:
        fail("x.shape[-3]", heads, f"a multiple of the {sets} coefficient sets (head h uses set h // (H / C))")
    if sets in (1, heads):
        return apply_rotary(x, cos, sin, layout=layout)
    grouped = x.unflatten(-3, (sets, heads // sets))  # (..., C, H / C, S, D): a view, no copy
    out = apply_rotary(grouped, cos.unsqueeze(-3), sin.unsqueeze(-3), layout=layout)
    return out.flatten(-4, -3)


def _check_head_dim(head_dim: int) -> None:
    if check_positive_int("head_dim", head_dim) % 2:
        fail("head_dim", head_dim, "an even number (channel pairs)")
