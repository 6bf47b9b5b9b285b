"""SGLang's RoPE as its ``get_rope`` builds it, written out in float64 (issue 48, ``posenc.runtimes.sglang``).

Each function follows one SGLang class or helper line by line, in float64 instead of ``torch.float``. Sources, all in
``sgl-project/sglang``:

- ``python/sglang/srt/layers/rotary_embedding/factory.py`` @ 108c36c008291c3a1ea524342837056c503c5724:
  ``get_rope`` (``_get_rope_param`` defaults a missing ``factor`` to 1, ``original_max_position_embeddings`` to
  ``max_position``, llama3's ``low_freq_factor`` / ``high_freq_factor`` to 1 / 4; ``yarn`` passes
  ``extrapolation_factor``, ``attn_factor``, ``beta_fast``, ``beta_slow``, ``mscale``, ``mscale_all_dim`` and
  ``truncate=rope_scaling.get("truncate", True)``);
- ``.../yarn.py`` @ 0b1fd02d56f010c589968aa6e05534e10c2d4bf3: ``yarn_find_correction_range(..., truncate)``,
  ``yarn_linear_ramp_mask``, ``yarn_get_mscale_simple``, ``yarn_get_mscale``, ``YaRNScalingRotaryEmbedding``;
- ``.../rope_variant.py`` @ 0b1fd02d: ``DynamicNTKScalingRotaryEmbedding``, ``DynamicNTKAlphaRotaryEmbedding``,
  ``DeepseekScalingRotaryEmbedding``, ``Llama3RotaryEmbedding``, ``Phi3LongRoPEScaledRotaryEmbedding`` (its
  ``forward``: ``long_prompt_offset = any(positions > original) * original``), ``Gemma4RotaryEmbedding``;
- ``.../base.py`` @ 0b1fd02d: ``RotaryEmbedding._compute_inv_freq``, ``LinearScalingRotaryEmbedding``;
- ``python/sglang/srt/utils/hf_transformers/common.py`` @ d7287464193f2efe5b2e72385f883534e2ba04f5:
  ``get_context_length``.

Shapes:
    every frequency function -> inv_freq (dim // 2,) float64 and the factor SGLang multiplies cos and sin by
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch


def _inv_freq(dim: int, base: float) -> torch.Tensor:
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))


def yarn_find_correction_dim(num_rotations: float, dim: int, base: float, max_position_embeddings: int) -> float:
    return (dim * math.log(max_position_embeddings / (num_rotations * 2 * math.pi))) / (2 * math.log(base))


def yarn_find_correction_range(low_rot, high_rot, dim, base, max_position_embeddings, truncate=True):
    low = yarn_find_correction_dim(low_rot, dim, base, max_position_embeddings)
    high = yarn_find_correction_dim(high_rot, dim, base, max_position_embeddings)
    if truncate:
        low = math.floor(low)
        high = math.ceil(high)
    return max(low, 0), min(high, dim - 1)


def yarn_linear_ramp_mask(low: float, high: float, dim: int) -> torch.Tensor:
    if low == high:
        high += 0.001
    linear_func = (torch.arange(dim, dtype=torch.float64) - low) / (high - low)
    return torch.clamp(linear_func, 0, 1)


def yarn_get_mscale_simple(scale: float = 1) -> float:
    if scale <= 1:
        return 1.0
    return 0.1 * math.log(scale) + 1.0


def yarn_get_mscale(scale: float = 1, mscale: float = 1) -> float:
    if scale <= 1:
        return 1.0
    return 0.1 * mscale * math.log(scale) + 1.0


def default(dim: int, base: float) -> tuple[torch.Tensor, float]:
    """``RotaryEmbedding``."""
    return _inv_freq(dim, base), 1.0


def linear(dim: int, base: float, factor: float) -> tuple[torch.Tensor, float]:
    """``LinearScalingRotaryEmbedding``: positions over ``factor``, i.e. the frequencies over ``factor``."""
    return _inv_freq(dim, base) / factor, 1.0


def dynamic_ntk(dim: int, base: float, factor: float) -> tuple[torch.Tensor, float]:
    """``DynamicNTKScalingRotaryEmbedding._compute_cos_sin_cache``: ``max_len = max_position_embeddings *
    scaling_factor``; ``base * ((scaling_factor * max_len / max_position_embeddings) - (scaling_factor - 1)) **
    (rotary_dim / (rotary_dim - 2))``."""
    return _inv_freq(dim, base * ((factor * factor) - (factor - 1)) ** (dim / (dim - 2))), 1.0


def ntk_alpha(dim: int, base: float, alpha: float) -> tuple[torch.Tensor, float]:
    """``DynamicNTKAlphaRotaryEmbedding``: ``base * scaling_alpha ** (rotary_dim / (rotary_dim - 2))``."""
    return _inv_freq(dim, base * alpha ** (dim / (dim - 2))), 1.0


def yarn(
    dim: int,
    base: float,
    factor: float,
    original_max_position_embeddings: int,
    *,
    extrapolation_factor: float = 1,
    attn_factor: float = 1,
    beta_fast: float = 32,
    beta_slow: float = 1,
    truncate: bool = True,
    mscale: float | None = None,
    mscale_all_dim: float | None = None,
) -> tuple[torch.Tensor, float]:
    """``YaRNScalingRotaryEmbedding``: the ramp (truncated per ``truncate``) times ``extrapolation_factor``;
    ``mscale = yarn_get_mscale(s, mscale) / yarn_get_mscale(s, mscale_all_dim)`` when both are given, else
    ``yarn_get_mscale_simple(s)``, then times ``attn_factor``."""
    pos_freqs = base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    inv_freq_extrapolation = 1.0 / pos_freqs
    inv_freq_interpolation = 1.0 / (factor * pos_freqs)
    low, high = yarn_find_correction_range(beta_fast, beta_slow, dim, base, original_max_position_embeddings, truncate)
    inv_freq_mask = (1 - yarn_linear_ramp_mask(low, high, dim // 2)) * extrapolation_factor
    inv_freq = inv_freq_interpolation * (1 - inv_freq_mask) + inv_freq_extrapolation * inv_freq_mask
    if mscale is not None and mscale_all_dim is not None:
        m = float(yarn_get_mscale(factor, mscale) / yarn_get_mscale(factor, mscale_all_dim))
    else:
        m = float(yarn_get_mscale_simple(factor))
    return inv_freq, m * attn_factor


def deepseek_yarn(
    dim: int,
    base: float,
    factor: float,
    original_max_position_embeddings: int,
    *,
    extrapolation_factor: float = 1,
    attn_factor: float = 1,
    beta_fast: float = 32,
    beta_slow: float = 1,
    mscale: float = 1,
    mscale_all_dim: float = 0,
) -> tuple[torch.Tensor, float]:
    """``DeepseekScalingRotaryEmbedding`` (the correction range truncated: its call passes no ``truncate``)."""
    inv_freq, _ = yarn(
        dim,
        base,
        factor,
        original_max_position_embeddings,
        extrapolation_factor=extrapolation_factor,
        beta_fast=beta_fast,
        beta_slow=beta_slow,
    )
    return inv_freq, yarn_get_mscale(factor, float(mscale)) / yarn_get_mscale(
        factor, float(mscale_all_dim)
    ) * attn_factor


def llama3(dim, base, factor=1.0, low_freq_factor=1.0, high_freq_factor=4.0, orig_max_position=None):
    """``Llama3RotaryEmbedding._compute_inv_freq`` with ``get_rope``'s defaults for missing keys."""
    inv_freqs = _inv_freq(dim, base)
    low_freq_wavelen = orig_max_position / low_freq_factor
    high_freq_wavelen = orig_max_position / high_freq_factor
    wave_len = 2 * math.pi / inv_freqs
    if low_freq_factor != high_freq_factor:
        smooth = (orig_max_position / wave_len - low_freq_factor) / (high_freq_factor - low_freq_factor)
    else:
        smooth = 0
    return torch.where(
        wave_len < high_freq_wavelen,
        inv_freqs,
        torch.where(
            wave_len > low_freq_wavelen, inv_freqs / factor, (1 - smooth) * inv_freqs / factor + smooth * inv_freqs
        ),
    ), 1.0


def longrope(dim, base, short_factor, long_factor, max_position_embeddings, original_max_position_embeddings):
    """``Phi3LongRoPEScaledRotaryEmbedding``: ``(short inv_freq, long inv_freq, short_mscale, long_mscale)``."""

    def inv(factors):
        rescale_factors = torch.tensor(factors, dtype=torch.float64)
        return 1.0 / (rescale_factors * (base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)))

    scale = max_position_embeddings / original_max_position_embeddings
    if scale <= 1.0:
        scaling_factor = 1.0
    else:
        scaling_factor = math.sqrt(1 + math.log(scale) / math.log(original_max_position_embeddings))
    return inv(short_factor), inv(long_factor), scaling_factor, scaling_factor


def longrope_uses_long(positions: torch.Tensor, original_max_position_embeddings: int) -> bool:
    """``Phi3LongRoPEScaledRotaryEmbedding.forward``: the batch reads the long table once any position exceeds the
    original length."""
    return bool(torch.any(positions > original_max_position_embeddings))


def proportional(head_size: int, rotary_dim: int, base: float) -> tuple[torch.Tensor, float]:
    """``Gemma4RotaryEmbedding._compute_inv_freq``."""
    rope_angles = rotary_dim // 2
    nope_angles = (head_size // 2) - rope_angles
    freq_exponents = torch.arange(0, 2 * rope_angles, 2, dtype=torch.float64) / head_size
    inv_freq = 1.0 / (base**freq_exponents)
    if nope_angles > 0:
        inv_freq = torch.cat([inv_freq, torch.zeros(nope_angles, dtype=torch.float64)])
    return inv_freq, 1.0


CONTEXT_LENGTH_KEYS = [
    "max_sequence_length",
    "seq_length",
    "max_seq_len",
    "model_max_length",
    "max_position_embeddings",
]


def get_context_length(config: Mapping, rope_scaling: Mapping | None) -> int:
    """``get_context_length`` on a config given as a dict, ``rope_scaling`` being what the config object returns for
    ``config.rope_scaling`` (transformers 5: its ``rope_parameters``)."""
    if rope_scaling:
        rope_scaling_factor = rope_scaling.get("factor", 1)
        if "original_max_position_embeddings" in rope_scaling:
            rope_scaling_factor = 1
        if rope_scaling.get("rope_type", None) == "llama3":
            rope_scaling_factor = 1
    else:
        rope_scaling_factor = 1
    for key in CONTEXT_LENGTH_KEYS:
        val = config.get(key)
        if val is not None:
            return int(rope_scaling_factor * val)
    return 2048
