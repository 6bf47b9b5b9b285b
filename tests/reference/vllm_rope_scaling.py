"""vLLM's RoPE frequency variants written out in float64: NTK-by-alpha, (mixed) NTK, TeleChat3 YaRN, Grok yarn_log;
YaRN and DeepSeek YaRN as the release vLLM 0.33.0 computes them (``yarn_release``, ``deepseek_yarn_release``).

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

The rest of ``get_rope`` at 41c5903d049b80b83a6e570f52f0f55e31316e49 (issue 48, ``posenc.runtimes.vllm``), each
function after one class:

- ``.../base.py`` @ 41c5903d: ``RotaryEmbedding`` (``default``), cache of ``max_position`` rows;
- ``.../linear_scaling_rope.py`` @ 9ba5ac5152d2425832a8e9ce78f3d01dff864cd2: positions ``t / factor`` over
  ``max_position * factor`` rows;
- ``.../dynamic_ntk_scaling_rope.py`` after PR #41277 (the class taking ``max_trained_positions``, which ``get_rope``
  at 41c5903d defaults to ``max_position``), and before it @ 50feac95f9e53a97d6ed27fee6bfe3b163d18594;
- ``.../yarn_scaling_rope.py``: the keyword arguments ``get_rope`` passes at 41c5903d (``extrapolation_factor``,
  ``attn_factor``, ``beta_fast``, ``beta_slow``, ``apply_yarn_scaling``, ``truncate``); the mask and mscale as
  @ ffdc985737c94233f2c88629c4450022e5bf4925, ``truncate`` as @ 0cd5784803d83f81fac0794b82cb592d4317d4bf;
- ``.../deepseek_scaling_rope.py`` @ 00d678e109f09c2d1845e7a6626ba9fd5980e4f0 (``yarn_get_mscale(s, mscale)``
  ratio, always truncated);
- ``.../llama3_rope.py`` @ 045d7575500e01e0f4a7ff84e039a9f7f7dc3bd0;
- ``.../phi3_long_rope_scaled_rope.py`` @ 63c2b7abcd705edb754604f83ac72a4269c05a52;
- ``.../gemma4_rope.py`` @ 41c5903d (``proportional``);
- ``.../dual_chunk_rope.py`` @ 07b13497a9b52274d334090a9a8e04d5ec9ca7e9 (its tables).

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


def _yarn_inv_freq(
    dim: int, base: float, factor: float, original: int, beta_fast: float, beta_slow: float, truncate: bool
) -> torch.Tensor:
    """``YaRNScalingRotaryEmbedding._compute_inv_freq``: the blend of interpolated and extrapolated frequencies over
    the correction range (shared by YaRN, TeleChat3's YaRN and the release's YaRN)."""
    pos_freqs = base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    inv_freq_extrapolation = 1.0 / pos_freqs
    inv_freq_interpolation = 1.0 / (factor * pos_freqs)
    low, high = _correction_range(beta_fast, beta_slow, dim, base, original, truncate)
    inv_freq_mask = 1 - _linear_ramp_mask(low, high, dim // 2)
    return inv_freq_interpolation * (1 - inv_freq_mask) + inv_freq_extrapolation * inv_freq_mask


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
    inv_freq = _yarn_inv_freq(dim, base, factor, original_max_position_embeddings, beta_fast, beta_slow, truncate)
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


# --------------------------------------------------------------------------------------------------------------
# get_rope's other classes (issue 48)


def default(dim: int, base: float) -> tuple[torch.Tensor, float]:
    """``RotaryEmbedding``."""
    return _inv_freq(dim, base), 1.0


def linear(dim: int, base: float, factor: float) -> tuple[torch.Tensor, float]:
    """``LinearScalingRotaryEmbedding``: ``t = arange(max_len) / factor`` times RoPE's ``inv_freq``, i.e. the
    frequencies over ``factor``."""
    return _inv_freq(dim, base) / factor, 1.0


def dynamic_ntk(dim: int, base: float, factor: float, max_position: int, max_trained_positions: int | None = None):
    """``DynamicNTKScalingRotaryEmbedding`` after PR #41277: ``base * (factor * max_position_embeddings /
    max_trained_positions - (factor - 1)) ** (rotary_dim / (rotary_dim - 2))`` for the whole cache of
    ``max_position_embeddings`` rows (``get_rope`` passes ``max_trained_positions = max_position`` unless the rope
    dict has one)."""
    trained = max_position if max_trained_positions is None else max_trained_positions
    scaled = base * ((factor * max_position / trained) - (factor - 1)) ** (dim / (dim - 2))
    return _inv_freq(dim, scaled), 1.0


def dynamic_ntk_before_41277(dim: int, base: float, factor: float) -> tuple[torch.Tensor, float]:
    """``DynamicNTKScalingRotaryEmbedding`` @ 50feac95: ``max_len = max_position_embeddings * scaling_factor``,
    ``base * ((scaling_factor * max_len / max_position_embeddings) - (scaling_factor - 1)) ** (d / (d - 2))`` --
    ``factor**2 - factor + 1`` whatever the length (vLLM #41236)."""
    return _inv_freq(dim, base * ((factor * factor) - (factor - 1)) ** (dim / (dim - 2))), 1.0


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
    apply_yarn_scaling: bool = True,
    truncate: bool = True,
) -> tuple[torch.Tensor, float]:
    """``YaRNScalingRotaryEmbedding`` (``max_position_embeddings`` of the class is ``get_rope``'s
    ``original_max_position``): ``inv_freq_mask = (1 - ramp) * extrapolation_factor``; ``mscale =
    yarn_get_mscale(factor) * attn_factor`` if ``apply_yarn_scaling`` else ``attn_factor``."""
    pos_freqs = base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    inv_freq_extrapolation = 1.0 / pos_freqs
    inv_freq_interpolation = 1.0 / (factor * pos_freqs)
    low, high = _correction_range(beta_fast, beta_slow, dim, base, original_max_position_embeddings, truncate)
    inv_freq_mask = (1 - _linear_ramp_mask(low, high, dim // 2)) * extrapolation_factor
    inv_freq = inv_freq_interpolation * (1 - inv_freq_mask) + inv_freq_extrapolation * inv_freq_mask
    mscale = (1.0 if factor <= 1 else 0.1 * math.log(factor) + 1.0) if apply_yarn_scaling else 1.0
    return inv_freq, mscale * attn_factor


def yarn_release(
    dim: int,
    base: float,
    factor: float,
    original_max_position_embeddings: int,
    *,
    beta_fast: float = 32,
    beta_slow: float = 1,
    mscale: float | None = None,
    mscale_all_dim: float | None = None,
    attention_factor: float | None = None,
    truncate: bool = True,
) -> tuple[torch.Tensor, float]:
    """``YaRNScalingRotaryEmbedding`` of vLLM 0.33.0 (the wheel on PyPI,
    ``vllm/model_executor/layers/rotary_embedding/yarn_scaling_rope.py``; the same file in 0.30.0, 0.31.0 and 0.32.0;
    0.29.0 and 0.26.0 read ``attn_factor``):
    ``get_rope`` passes ``beta_fast``, ``beta_slow``, ``mscale``, ``mscale_all_dim``, ``attention_factor``,
    ``truncate``; ``self.mscale = attention_factor`` if it is not None, ``elif mscale and mscale_all_dim``:
    ``yarn_get_mscale(s, mscale) / yarn_get_mscale(s, mscale_all_dim)``, else ``yarn_get_mscale(s)`` (``common.py``);
    no ``extrapolation_factor``, ``attn_factor`` or ``apply_yarn_scaling``."""
    inv_freq = _yarn_inv_freq(dim, base, factor, original_max_position_embeddings, beta_fast, beta_slow, truncate)
    if attention_factor is not None:
        return inv_freq, float(attention_factor)
    if mscale and mscale_all_dim:
        return inv_freq, float(yarn_get_mscale(factor, mscale) / yarn_get_mscale(factor, mscale_all_dim))
    return inv_freq, float(yarn_get_mscale(factor))


def deepseek_yarn_release(
    dim: int,
    base: float,
    factor: float,
    original_max_position_embeddings: int,
    *,
    beta_fast: float = 32,
    beta_slow: float = 1,
    mscale: float = 1,
    mscale_all_dim: float = 0,
) -> tuple[torch.Tensor, float]:
    """``DeepseekScalingRotaryEmbedding`` of vLLM 0.33.0 (``.../deepseek_scaling_rope.py`` of the wheel): YaRN's
    blend with the truncated range, ``mscale = yarn_get_mscale(s, mscale) / yarn_get_mscale(s, mscale_all_dim)``;
    ``get_rope`` passes ``beta_fast``, ``beta_slow``, ``mscale``, ``mscale_all_dim`` only."""
    inv_freq, _ = yarn_release(dim, base, factor, original_max_position_embeddings, beta_fast=beta_fast,
                               beta_slow=beta_slow)
    return inv_freq, yarn_get_mscale(factor, float(mscale)) / yarn_get_mscale(factor, float(mscale_all_dim))


def yarn_get_mscale(scale: float = 1, mscale: float = 1) -> float:
    """``deepseek_scaling_rope.yarn_get_mscale``."""
    if scale <= 1:
        return 1.0
    return 0.1 * mscale * math.log(scale) + 1.0


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
    """``DeepseekScalingRotaryEmbedding``: YaRN's blend with the truncated range; ``mscale = yarn_get_mscale(s,
    mscale) / yarn_get_mscale(s, mscale_all_dim) * attn_factor``."""
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


def llama3(
    dim: int, base: float, factor: float, low_freq_factor: float, high_freq_factor: float, orig_max_position: int
) -> tuple[torch.Tensor, float]:
    """``Llama3RotaryEmbedding._compute_inv_freq``."""
    inv_freqs = _inv_freq(dim, base)
    low_freq_wavelen = orig_max_position / low_freq_factor
    high_freq_wavelen = orig_max_position / high_freq_factor
    wave_len = 2 * math.pi / inv_freqs
    if low_freq_factor != high_freq_factor:
        smooth = (orig_max_position / wave_len - low_freq_factor) / (high_freq_factor - low_freq_factor)
    else:
        smooth = 0
    new_freqs = torch.where(
        wave_len < high_freq_wavelen,
        inv_freqs,
        torch.where(
            wave_len > low_freq_wavelen,
            inv_freqs / factor,
            (1 - smooth) * inv_freqs / factor + smooth * inv_freqs,
        ),
    )
    return new_freqs, 1.0


def longrope(
    dim: int,
    base: float,
    rescale_factors,
    max_position_embeddings: int,
    original_max_position_embeddings: int,
    mscale: float | None = None,
) -> tuple[torch.Tensor, float]:
    """``Phi3LongRoPEScaledRotaryEmbedding``: ``1 / (rescale_factors * base ** (arange(0, d, 2) / d))``; the cache
    rows times ``mscale`` (``short_mscale`` / ``long_mscale``, by default ``sqrt(1 + ln(scale) / ln(original))``,
    ``scale = max_position_embeddings / original``)."""
    factors = torch.tensor(rescale_factors, dtype=torch.float64)
    inv_freq = 1.0 / (factors * (base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)))
    if mscale is None:
        scale = max_position_embeddings / original_max_position_embeddings
        mscale = 1.0 if scale <= 1.0 else math.sqrt(1 + math.log(scale) / math.log(original_max_position_embeddings))
    return inv_freq, mscale


def proportional(head_size: int, rotary_dim: int, base: float) -> tuple[torch.Tensor, float]:
    """``Gemma4RotaryEmbedding._compute_inv_freq``: ``rope_angles = rotary_dim // 2`` frequencies with the head size
    as the exponent's denominator, zero-padded to ``head_size // 2`` (the class rotates the whole head)."""
    rope_angles = rotary_dim // 2
    nope_angles = head_size // 2 - rope_angles
    freq_exponents = torch.arange(0, 2 * rope_angles, 2, dtype=torch.float64) / head_size
    inv_freq = 1.0 / (base**freq_exponents)
    if nope_angles > 0:
        inv_freq = torch.cat([inv_freq, torch.zeros(nope_angles, dtype=torch.float64)])
    return inv_freq, 1.0


def dual_chunk_positions(positions: torch.Tensor, chunk_size: int, local_size: int) -> dict[str, torch.Tensor]:
    """The positions ``DualChunkRotaryEmbedding`` rotates at (its five cos/sin tables indexed as ``forward_native``
    indexes them): keys ``j mod c``, queries ``i mod c`` (intra), ``min(i mod c + c, chunk_size)`` (successive),
    ``min(2c - 1, chunk_size)`` (inter), ``c = chunk_size - local_size``."""
    c = chunk_size - local_size
    q = positions % c
    return {
        "key": positions % c,
        "query": q,
        "query_succ": (q + c).clamp(max=chunk_size),
        "query_inter": torch.full_like(positions, min(2 * c - 1, chunk_size)),
        "query_succ_critical": q + c,
        "query_inter_critical": q + chunk_size,
    }
