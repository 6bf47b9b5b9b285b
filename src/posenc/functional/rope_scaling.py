"""Context-extension frequency transforms for RoPE: one pure function per method.

Every function takes the rotary dimension ``dim`` (= 2F) and keyword-only scalars, and returns
``(inv_freq, attention_factor)``: float32 frequencies of shape ``(dim // 2,)`` (``(..., dim // 2)`` for a shaped
``seq_len``, ``SeqLen``) and the multiplier that Hugging Face applies to both cos and sin. Arithmetic is float64,
rounded to float32 once at the end. Reference implementation: ``transformers.modeling_rope_utils.ROPE_INIT_FUNCTIONS``
(tested to 1e-6 relative).

Papers:
    linear    Chen et al. 2023, "Extending Context Window of LLMs via Positional Interpolation" (arXiv:2306.15595)
    ntk       bloc97 2023, "NTK-Aware Scaled RoPE" (r/LocalLLaMA); base * factor ** (dim / (dim - 2))
    dynamic   emozilla 2023, "Dynamically Scaled RoPE"; the NTK base grown with the current length
    yarn      Peng et al. 2023, "YaRN: Efficient Context Window Extension of LLMs" (arXiv:2309.00071)
    longrope  Ding et al. 2024, "LongRoPE: Extending LLM Context Window Beyond 2 Million Tokens" (arXiv:2402.13753)
    llama3    Meta 2024, "The Llama 3 Herd of Models" (arXiv:2407.21783), rope scaling of Llama 3.1
    proportional  Barbero et al. 2024, "Round and Round We Go! What makes Rotary Positional Encodings useful?"
              (arXiv:2410.06205), p-RoPE; Gemma 4's ``rope_type: "proportional"``
    ntk_alpha Tencent Hunyuan's "DynamicNTKAlpha" (static despite the name): ``base * alpha ** (dim / (dim - 2))``
    ntk_mixed Su 2023, "Mixed NTK" (kexue.fm/archives/9706), as vLLM's ``NTKScalingRotaryEmbedding(mixed_b=)``
    telechat3_yarn  TeleChat3's YaRN: temperature ``0.07 ln(factor) + 1`` instead of ``0.1 ln(factor) + 1``
    yarn_log  xAI Grok's YaRN with a geometric (log-space) blend of the two frequencies across the ramp

The last four are checked against vLLM's ``vllm/model_executor/layers/rotary_embedding/`` (see each function).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from posenc._checks import check_number, check_positive_int, fail

#: A length: an int, a 0-d tensor (so a module can pass ``positions.max() + 1`` without a host sync or a graph
#: break), a tensor of lengths of any shape ``(...)`` (one per token: packed documents each with their own length),
#: or None; a shaped ``seq_len`` gives frequencies of shape ``(..., dim // 2)``.
SeqLen = int | torch.Tensor | None
_Device = torch.device | str | None  # where the frequencies are built


def _check(dim: int, base: float, *, ntk: bool = False, lengths: dict | None = None, **positive: object) -> None:
    """The scalars of a transform: ``dim``, ``base > 1``, positive integer ``lengths`` and finite ``positive``
    numbers (None: not given). NaN or inf would otherwise come back as NaN frequencies without a word."""
    check_positive_int("dim", dim)
    if ntk and dim <= 2:
        fail("dim", dim, "> 2 for NTK scaling (its exponent is dim / (dim - 2))")
    check_number("base", base, above=1.0)
    for name, value in (lengths or {}).items():
        check_positive_int(name, value)
    for name, value in positive.items():
        if value is not None:
            check_number(name, value, above=0.0)


def _check_seq_len(seq_len: SeqLen) -> None:
    if seq_len is not None and not isinstance(seq_len, torch.Tensor):
        check_number("seq_len", seq_len, minimum=0.0)


def _exponents(dim: int, device: torch.device | str | None) -> torch.Tensor:
    return torch.arange(0, dim, 2, dtype=torch.float64, device=device) / dim  # (F,)


def _base_inv_freq(dim: int, base: float | torch.Tensor, device: torch.device | str | None) -> torch.Tensor:
    if isinstance(base, torch.Tensor):
        base = base.unsqueeze(-1)  # (...) -> (..., 1): one base per length
    return 1.0 / (base ** _exponents(dim, device))  # (..., F) float64


def _out(inv_freq: torch.Tensor, attention_factor: float) -> tuple[torch.Tensor, float]:
    return inv_freq.to(torch.float32), float(attention_factor)


def default_frequencies(dim: int, *, base: float, device: _Device = None) -> tuple[torch.Tensor, float]:
    """Unscaled RoPE: ``base ** (-2i / dim)``."""
    _check(dim, base)
    return _out(_base_inv_freq(dim, base, device), 1.0)


def linear_frequencies(dim: int, *, base: float, factor: float, device: _Device = None) -> tuple[torch.Tensor, float]:
    """Position Interpolation: every frequency divided by ``factor`` (positions squeezed into the trained range)."""
    _check(dim, base, factor=factor)
    return _out(_base_inv_freq(dim, base, device) / factor, 1.0)


def ntk_frequencies(dim: int, *, base: float, factor: float, device: _Device = None) -> tuple[torch.Tensor, float]:
    """Static NTK-aware scaling: the base raised to ``base * factor ** (dim / (dim - 2))``.

    The lowest frequency is interpolated by exactly ``factor``; the highest is untouched.
    """
    _check(dim, base, ntk=True, factor=factor)
    return _out(_base_inv_freq(dim, base * factor ** (dim / (dim - 2)), device), 1.0)


def dynamic_ntk_frequencies(
    dim: int,
    *,
    base: float,
    factor: float,
    max_position_embeddings: int,
    seq_len: SeqLen = None,
    device: _Device = None,
) -> tuple[torch.Tensor, float]:
    """Dynamic NTK: the NTK base for the current length, unscaled up to ``max_position_embeddings``.

    ``base * (factor * L / max_position_embeddings - (factor - 1)) ** (dim / (dim - 2))`` with
    ``L = max(seq_len, max_position_embeddings)``.
    """
    _check(dim, base, ntk=True, lengths={"max_position_embeddings": max_position_embeddings}, factor=factor)
    _check_seq_len(seq_len)
    if seq_len is None:
        length = torch.tensor(float(max_position_embeddings), dtype=torch.float64, device=device)
    else:
        length = torch.as_tensor(seq_len, device=device).to(torch.float64).clamp(min=max_position_embeddings)
        device = length.device
    new_base = base * (factor * length / max_position_embeddings - (factor - 1)) ** (dim / (dim - 2))
    return _out(_base_inv_freq(dim, new_base, device), 1.0)


def yarn_get_mscale(scale: float, mscale: float = 1.0) -> float:
    """YaRN's attention temperature ``0.1 * mscale * ln(scale) + 1`` (1 for ``scale <= 1``)."""
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def yarn_correction_range(
    dim: int, *, base: float, original_max_position_embeddings: int, beta_fast: float, beta_slow: float, truncate: bool
) -> tuple[float, float]:
    """Dimension indices where frequencies complete ``beta_fast`` and ``beta_slow`` turns over the original length."""

    def correction_dim(rotations: float) -> float:
        return dim * math.log(original_max_position_embeddings / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    return max(low, 0), min(high, dim - 1)


def _yarn_ramp(dim: int, base: float, original: int, beta_fast: float, beta_slow: float, truncate: bool,
               device) -> torch.Tensor:  # noqa: ANN001
    """YaRN's ramp over the pairs, ``(F,)`` float64: 0 below the correction range (kept), 1 above it (scaled)."""
    low, high = yarn_correction_range(
        dim, base=base, original_max_position_embeddings=original, beta_fast=beta_fast, beta_slow=beta_slow,
        truncate=truncate,
    )
    if low == high:
        high += 0.001  # a zero-width ramp would divide by zero
    return ((torch.arange(dim // 2, dtype=torch.float64, device=device) - low) / (high - low)).clamp(0, 1)


def yarn_frequencies(
    dim: int,
    *,
    base: float,
    factor: float,
    original_max_position_embeddings: int,
    beta_fast: float = 32.0,
    beta_slow: float = 1.0,
    truncate: bool = True,
    mscale: float | None = None,
    mscale_all_dim: float | None = None,
    attention_factor: float | None = None,
    device: _Device = None,
) -> tuple[torch.Tensor, float]:
    """YaRN "NTK-by-parts": high frequencies kept, low frequencies interpolated, a linear ramp in between.

    The attention factor defaults to ``yarn_get_mscale(factor)``, or the DeepSeek form
    ``mscale(factor, mscale) / mscale(factor, mscale_all_dim)`` when both are set.
    """
    lengths = {"original_max_position_embeddings": original_max_position_embeddings}
    _check(
        dim,
        base,
        lengths=lengths,
        factor=factor,
        beta_fast=beta_fast,
        beta_slow=beta_slow,
        attention_factor=attention_factor,
    )
    for name, value in (("mscale", mscale), ("mscale_all_dim", mscale_all_dim)):
        if value is not None:
            check_number(name, value)  # 0 is HF's "not set"
    if attention_factor is None:
        if mscale and mscale_all_dim:
            attention_factor = yarn_get_mscale(factor, mscale) / yarn_get_mscale(factor, mscale_all_dim)
        else:
            attention_factor = yarn_get_mscale(factor)
    ramp = _yarn_ramp(dim, base, original_max_position_embeddings, beta_fast, beta_slow, truncate, device)
    extrapolated = _base_inv_freq(dim, base, device)
    return _out(extrapolated / factor * ramp + extrapolated * (1 - ramp), attention_factor)


def longrope_attention_factor(factor: float, original_max_position_embeddings: int) -> float:
    """LongRoPE's default ``sqrt(1 + ln(factor) / ln(original_max_position_embeddings))`` (1 for factor <= 1)."""
    if factor <= 1.0:
        return 1.0
    return math.sqrt(1 + math.log(factor) / math.log(original_max_position_embeddings))


def longrope_frequencies(
    dim: int,
    *,
    base: float,
    short_factor: Sequence[float],
    long_factor: Sequence[float],
    original_max_position_embeddings: int,
    factor: float,
    attention_factor: float | None = None,
    seq_len: SeqLen = None,
    device: _Device = None,
) -> tuple[torch.Tensor, float]:
    """LongRoPE: per-frequency rescale factors, ``long_factor`` beyond the original length, ``short_factor`` within."""
    lengths = {"original_max_position_embeddings": original_max_position_embeddings}
    _check(dim, base, lengths=lengths, factor=factor, attention_factor=attention_factor)
    _check_seq_len(seq_len)
    if attention_factor is None:
        attention_factor = longrope_attention_factor(factor, original_max_position_embeddings)
    short = torch.tensor(short_factor, dtype=torch.float64, device=device)
    long = torch.tensor(long_factor, dtype=torch.float64, device=device)
    if seq_len is None:
        ext = short
    elif isinstance(seq_len, torch.Tensor):
        past = seq_len.to(short.device).unsqueeze(-1) > original_max_position_embeddings  # (..., 1)
        ext = torch.where(past, long, short)  # (..., F)
    else:
        ext = long if seq_len > original_max_position_embeddings else short
    return _out(_base_inv_freq(dim, base, device) / ext, attention_factor)


def llama3_frequencies(
    dim: int,
    *,
    base: float,
    factor: float,
    low_freq_factor: float,
    high_freq_factor: float,
    original_max_position_embeddings: int,
    device: _Device = None,
) -> tuple[torch.Tensor, float]:
    """Llama 3.1: wavelengths above ``L / low_freq_factor`` divided by ``factor``, below ``L / high_freq_factor``
    kept, and a smooth blend in between (``L`` the original context length).

    Unlike the other transforms this one runs in float32, in the reference's order of operations: the blend
    cancels, and float32 rounding moves band frequencies by ~1e-6 relative. Pretrained Llama 3.x checkpoints were
    trained with exactly those rounded values, so we reproduce them rather than the exact ones.
    """
    lengths = {"original_max_position_embeddings": original_max_position_embeddings}
    _check(
        dim, base, lengths=lengths, factor=factor, low_freq_factor=low_freq_factor, high_freq_factor=high_freq_factor
    )
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, device=device).float() / dim))  # float32 pow, as Meta/HF
    wavelen = 2 * math.pi / inv_freq
    low_wavelen = original_max_position_embeddings / low_freq_factor
    high_wavelen = original_max_position_embeddings / high_freq_factor
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (original_max_position_embeddings / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return _out(torch.where(medium, smoothed, scaled), 1.0)


def proportional_frequencies(
    dim: int, *, base: float, partial_rotary_factor: float, factor: float = 1.0, device: _Device = None
) -> tuple[torch.Tensor, float]:
    """p-RoPE: the ``int(partial_rotary_factor * dim // 2)`` highest frequencies rotate, the rest are 0.

    Rotating pair ``i`` keeps RoPE's frequency ``base ** (-2i / dim)`` (the exponent is over the whole ``dim``, not
    the rotating part, unlike partial rotary); the lowest-frequency pairs get frequency 0, so cos = 1 and sin = 0
    leave them exactly unchanged at every position (the paper's "truncating the lowest frequencies"). Every
    frequency is then divided by ``factor`` (transformers' optional linear interpolation). The result has the full
    ``(dim // 2,)`` size with trailing zeros, as transformers returns it for Gemma 4.

    Like ``llama3_frequencies``, this runs in float32 in the reference's order of operations, so the frequencies
    are bit-equal to transformers' (on the same device) rather than rounded from float64.

    Reference implementation: ``transformers.modeling_rope_utils._compute_proportional_rope_parameters``.
    """
    _check(dim, base, factor=factor)
    if check_number("partial_rotary_factor", partial_rotary_factor, minimum=0.0) > 1.0:
        fail("partial_rotary_factor", partial_rotary_factor, "a number in [0, 1]: the fraction of pairs that rotate")
    rotating = int(partial_rotary_factor * dim // 2)  # the reference's expression and float rounding, exactly
    exponent = torch.arange(0, 2 * rotating, 2, dtype=torch.int64, device=device).float() / dim
    inv_freq = torch.cat((1.0 / (base**exponent), torch.zeros(dim // 2 - rotating, dtype=torch.float32, device=device)))
    return _out(inv_freq / factor, 1.0)


def ntk_alpha_frequencies(dim: int, *, base: float, alpha: float, device: _Device = None) -> tuple[torch.Tensor, float]:
    """NTK-by-alpha (Tencent Hunyuan): default RoPE at base ``base * alpha ** (dim / (dim - 2))``.

    The NTK-aware base change with the scale given directly as ``alpha`` (Hunyuan ships ``alpha = 1000``); it is
    static, though released configs spell it ``{"type": "dynamic", "alpha": ...}``. The lowest frequency is divided by
    exactly ``alpha``, the highest is untouched.

    Reference implementation: vLLM ``DynamicNTKAlphaRotaryEmbedding._compute_cos_sin_cache``
    (``vllm/model_executor/layers/rotary_embedding/dynamic_ntk_alpha_rope.py``).
    """
    _check(dim, base, ntk=True, alpha=alpha)
    return _out(_base_inv_freq(dim, base * alpha ** (dim / (dim - 2)), device), 1.0)


def ntk_mixed_frequencies(
    dim: int, *, base: float, factor: float, mixed_b: float, device: _Device = None
) -> tuple[torch.Tensor, float]:
    """Mixed NTK (Su 2023): pair ``i`` (``m = i + 1``) divided by ``lambda_m = exp(a m ** b)``,
    ``a = ln(factor) / (dim / 2) ** b``.

    The lowest frequency (``m = dim / 2``) is divided by exactly ``factor``; ``b`` sets how fast the division grows
    from the highest frequency (``b = 1``: ``factor ** (2m / dim)``, vLLM's fixed ``"ntk"``, which also divides the
    highest frequency, by ``factor ** (2 / dim)``, unlike bloc97's NTK-aware base change).

    Reference implementation: vLLM ``NTKScalingRotaryEmbedding._compute_inv_freq``
    (``vllm/model_executor/layers/rotary_embedding/ntk_scaling_rope.py``).
    """
    _check(dim, base, factor=factor, mixed_b=mixed_b)
    a = math.log(factor) / (dim / 2) ** mixed_b
    m = torch.arange(1, dim // 2 + 1, dtype=torch.float64, device=device)  # (F,)
    return _out(_base_inv_freq(dim, base, device) / torch.exp(a * m**mixed_b), 1.0)


def telechat3_attention_factor(factor: float) -> float:
    """TeleChat3's YaRN temperature ``0.07 ln(factor) + 1`` (1 for ``factor <= 1``)."""
    return 1.0 if factor <= 1 else 0.07 * math.log(factor) + 1.0


def telechat3_yarn_frequencies(
    dim: int,
    *,
    base: float,
    factor: float,
    original_max_position_embeddings: int,
    beta_fast: float = 32.0,
    beta_slow: float = 1.0,
    truncate: bool = True,
    attn_factor: float = 1.0,
    device: _Device = None,
) -> tuple[torch.Tensor, float]:
    """TeleChat3's YaRN: YaRN's frequencies, attention factor ``(0.07 ln(factor) + 1) * attn_factor``.

    Reference implementation: vLLM ``TeleChat3RoPEScaledRotaryEmbedding``
    (``vllm/model_executor/layers/rotary_embedding/telechat3_scaling_rope.py``: its ``get_mscale``, YaRN's
    ``_compute_inv_freq`` and cos/sin times that mscale).
    """
    check_number("attn_factor", attn_factor, above=0.0)
    return yarn_frequencies(
        dim,
        base=base,
        factor=factor,
        original_max_position_embeddings=original_max_position_embeddings,
        beta_fast=beta_fast,
        beta_slow=beta_slow,
        truncate=truncate,
        attention_factor=telechat3_attention_factor(factor) * attn_factor,
        device=device,
    )


def yarn_log_frequencies(
    dim: int,
    *,
    base: float,
    factor: float,
    original_max_position_embeddings: int,
    beta_fast: float = 32.0,
    beta_slow: float = 1.0,
    extrapolation_factor: float = 1.0,
    device: _Device = None,
) -> tuple[torch.Tensor, float]:
    """Grok's ``yarn_log``: YaRN's ramp, but the two frequencies blended in log space,
    ``exp(ln(theta) * w + ln(theta / factor) * (1 - w))`` with ``w = (1 - ramp) * extrapolation_factor``: a pair
    inside the ramp is divided by ``factor ** (1 - w)`` instead of YaRN's ``1 / (w + (1 - w) / factor)``.
    The attention factor is 1: vLLM computes YaRN's mscale for it but leaves it out of the cos/sin tables.

    Reference implementation: vLLM ``Grok1ScalingRotaryEmbedding`` (``extra_method="yarn_log"``,
    ``vllm/model_executor/layers/rotary_embedding/grok1_scaling_rope.py``).
    """
    lengths = {"original_max_position_embeddings": original_max_position_embeddings}
    _check(dim, base, lengths=lengths, factor=factor, beta_fast=beta_fast, beta_slow=beta_slow)
    check_number("extrapolation_factor", extrapolation_factor, minimum=0.0)
    ramp = _yarn_ramp(dim, base, original_max_position_embeddings, beta_fast, beta_slow, True, device)
    kept = (1 - ramp) * extrapolation_factor  # (F,) weight of the unscaled frequency
    extrapolated = _base_inv_freq(dim, base, device)
    return _out(extrapolated * factor ** (kept - 1), 1.0)
