"""vLLM's RoPE frequency variants written out in float64: NTK-by-alpha, (mixed) NTK, TeleChat3 YaRN, Grok yarn_log.

Each function follows one vLLM class line by line, in float64 instead of vLLM's float32 (``torch.float`` tensors),
so that a test can hold posenc's float32 result to its own rounding. Sources, all in ``vllm-project/vllm``:

- ``vllm/model_executor/layers/rotary_embedding/__init__.py`` @ 926c71f6f25f8fe0a71ba4b168205e64bef24a36,
  ``get_rope``: ``rope_type "dynamic"`` with an ``"alpha"`` key -> ``DynamicNTKAlphaRotaryEmbedding(alpha)``, with
  ``"factor"`` -> dynamic NTK; ``rope_type "ntk"`` -> ``NTKScalingRotaryEmbedding(factor, mixed_b=get("mixed_b"))``.
- ``.../dynamic_ntk_alpha_rope.py`` @ a42938c2e7432785b64b436dd8b9905ad854cbb1, ``_compute_cos_sin_cache``.
- ``.../ntk_scaling_rope.py`` @ 03587f553db4139402cc19f424c488c8e2fe25d1, ``_compute_inv_freq``.
- ``.../telechat3_scaling_rope.py`` @ d5a17e05172e358f2d4d6f18e67cb13f8d7c6988 (``get_mscale`` with 0.07), over
  ``.../yarn_scaling_rope.py`` @ 0cd5784803d83f81fac0794b82cb592d4317d4bf (``_compute_inv_freq``, cos/sin times
  ``mscale``) and ``.../common.py`` @ 002d181a55a03803d7d69547846630069d2378b8 (``yarn_find_correction_dim``,
  ``yarn_find_correction_range``, ``yarn_linear_ramp_mask``).
- ``.../grok1_scaling_rope.py`` @ e443db5afd899bae8a673ccb3ee2bc21c38969d9, ``extra_method == "yarn_log"``; its
  ``_compute_cos_sin_cache`` leaves ``mscale`` out (commented out), so the tables are unscaled.

``RotaryEmbedding._compute_inv_freq(base)`` (vLLM's base class) is ``1 / base ** (arange(0, dim, 2) / dim)``.

Shapes:
    every function -> inv_freq (dim // 2,) float64 and the factor vLLM multiplies cos and sin by
"""

from __future__ import annotations

import math

import torch


def _inv_freq(dim: int, base: float) -> torch.Tensor:
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))


def ntk_alpha(dim: int, base: float, alpha: float) -> tuple[torch.Tensor, float]:
    """``DynamicNTKAlphaRotaryEmbedding``: ``base = self.base * scaling_alpha ** (rotary_dim / (rotary_dim - 2))``."""
    return _inv_freq(dim, base * alpha ** (dim / (dim - 2))), 1.0


def ntk(dim: int, base: float, factor: float, mixed_b: float | None) -> tuple[torch.Tensor, float]:
    """``NTKScalingRotaryEmbedding._compute_inv_freq``: fixed (``mixed_b`` None) or mixed NTK."""
    inv_freq = _inv_freq(dim, base * (factor if mixed_b is None else 1))
    if mixed_b is None:
        return inv_freq / factor ** (2 / dim), 1.0
    a = torch.tensor(factor, dtype=torch.float64).log() / (dim / 2) ** mixed_b
    lambda_1_m = (a * torch.arange(1, dim // 2 + 1, dtype=torch.float64) ** mixed_b).exp()
    return inv_freq / lambda_1_m, 1.0


def _correction_dim(num_rotations: float, dim: int, base: float, max_position_embeddings: int) -> float:
    return (dim * math.log(max_position_embeddings / (num_rotations * 2 * math.pi))) / (2 * math.log(base))


def _correction_range(low_rot, high_rot, dim, base, max_position_embeddings, truncate=True):
    low = _correction_dim(low_rot, dim, base, max_position_embeddings)
    high = _correction_dim(high_rot, dim, base, max_position_embeddings)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    return max(low, 0), min(high, dim - 1)


def _linear_ramp_mask(low: float, high: float, dim: int) -> torch.Tensor:
    if low == high:
        high += 0.001
    return torch.clamp((torch.arange(dim, dtype=torch.float64) - low) / (high - low), 0, 1)


def telechat3_yarn(
    dim: int,
    base: float,
    factor: float,
    original_max_position_embeddings: int,
    *,
    beta_fast: float = 32,
    beta_slow: float = 1,
    truncate: bool = True,
    attn_factor: float = 1.0,
) -> tuple[torch.Tensor, float]:
    """``TeleChat3RoPEScaledRotaryEmbedding``: YaRN's ``_compute_inv_freq``; mscale ``0.07 ln(s) + 1`` (1 for
    ``s <= 1``) times ``attn_factor``. ``max_position_embeddings`` of the class is ``get_rope``'s
    ``original_max_position``."""
    pos_freqs = base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    inv_freq_extrapolation = 1.0 / pos_freqs
    inv_freq_interpolation = 1.0 / (factor * pos_freqs)
    low, high = _correction_range(beta_fast, beta_slow, dim, base, original_max_position_embeddings, truncate)
    inv_freq_mask = 1 - _linear_ramp_mask(low, high, dim // 2)
    inv_freq = inv_freq_interpolation * (1 - inv_freq_mask) + inv_freq_extrapolation * inv_freq_mask
    mscale = 1.0 if factor <= 1 else 0.07 * math.log(factor) + 1.0
    return inv_freq, mscale * attn_factor


def grok_yarn_log(
    dim: int,
    base: float,
    factor: float,
    original_max_position_embeddings: int,
    *,
    beta_fast: float = 32,
    beta_slow: float = 1,
    extrapolation_factor: float = 1.0,
) -> tuple[torch.Tensor, float]:
    """``Grok1ScalingRotaryEmbedding`` with ``extra_method="yarn_log"``; the class's ``max_position_embeddings`` is
    the config's ``original_max_position_embeddings`` (Grok's ``get_rope_scaling``); truncated correction range."""
    pos_freqs = base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    inv_freq_extrapolation = 1.0 / pos_freqs
    inv_freq_interpolation = 1.0 / (factor * pos_freqs)
    low, high = _correction_range(beta_fast, beta_slow, dim, base, original_max_position_embeddings)
    inv_freq_mask = (1 - _linear_ramp_mask(low, high, dim // 2)) * extrapolation_factor
    inv_freq = torch.exp(
        torch.log(inv_freq_extrapolation) * inv_freq_mask + torch.log(inv_freq_interpolation) * (1.0 - inv_freq_mask)
    )
    return inv_freq, 1.0  # cos = freqs.cos(); sin = freqs.sin(): mscale left out


def cos_sin(positions: torch.Tensor, inv_freq: torch.Tensor, factor: float) -> tuple[torch.Tensor, float]:
    """vLLM's cache rows ``cos(t inv_freq) * mscale``, ``sin(t inv_freq) * mscale`` in float64: (S, F) each."""
    freqs = positions.to(torch.float64).unsqueeze(-1) * inv_freq
    return freqs.cos() * factor, freqs.sin() * factor
