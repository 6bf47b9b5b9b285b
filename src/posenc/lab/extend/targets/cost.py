"""A target's cost model: the sizes that decide a forward's memory and time (``ModelDims``), a forward's compute in
token-equivalents (``forward_cost``), the forwards perplexity makes (``windows``) and the fit of timed forwards that
calibrates it on this machine (``calibration_lengths``, ``fit_forward_times``, ``fitted_l0``). ``study.plan`` checks
and estimates with it."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

HEAD_CHUNK = 1024  # rows of hidden states through the output head at a time (SmolLM2: 192 MiB of float32 logits)


@dataclass(frozen=True)
class ModelDims:
    """The sizes that decide a forward's memory and time, read from a config and a weight-free (meta) model."""

    params: int
    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    masked: bool = False  # sliding-window layers: transformers builds an (S, T) mask

    @property
    def l0(self) -> float:
        """The length at which attention's compute per token equals the weights': a token costs ``2 * params``
        FLOPs in the matrix products and ``2 * layers * heads * head_dim * S`` in attention (causal, QK and PV)."""
        return self.params / (self.layers * self.heads * self.head_dim)

    @classmethod
    def of(cls, config: Any, params: int) -> ModelDims:
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        hidden = int(text.hidden_size)
        heads = int(text.num_attention_heads)
        head_dim = int(getattr(text, "head_dim", None) or hidden // heads)
        kv_heads = int(getattr(text, "num_key_value_heads", None) or heads)
        intermediate = int(getattr(text, "intermediate_size", None) or 4 * hidden)
        types = getattr(text, "layer_types", None) or ()
        masked = bool(getattr(text, "sliding_window", None)) or any("sliding" in str(t) for t in types)
        return cls(
            params=int(params), layers=int(text.num_hidden_layers), hidden=hidden, intermediate=intermediate,
            heads=heads, kv_heads=kv_heads, head_dim=head_dim, vocab=int(text.vocab_size), masked=masked,
        )


def forward_cost(length: int, l0: float) -> float:
    """Compute of one forward over ``length`` tokens in token-equivalents: ``length * (1 + length / l0)``
    (linear in the weights' work, quadratic in attention's). Measured for SmolLM2-135M on 2 CPU cores: 7.5 s at 4096
    and 37-40 s at 12288 tokens, a ratio of 5.0-5.3; this model (l0 = 7784) gives 5.3."""
    return length * (1.0 + length / l0)


#: The lengths ``calibration_lengths`` times forwards at: a short one, one where attention starts to weigh, and one
#: where it weighs enough to fit its quadratic part (timed only for studies beyond it).
CALIBRATION_LENGTHS = (1024, 4096, 8192)


def calibration_lengths(longest: int) -> tuple[int, ...]:
    """The forward lengths to time for a study whose longest forward is ``longest`` tokens: ``CALIBRATION_LENGTHS``
    up to it, each at least twice the one before (1024 alone below 2048; ``longest`` itself where it falls between
    two); 8192 only for studies beyond it: the estimate scales the longest timed forward, and the further it is
    scaled the more the crossover length's error counts (on SmolLM2, a crossover off by 2x moves an estimate at
    32,768 tokens by up to 1.39x from a 4096-token forward, 1.25x from an 8192-token one)."""
    sizes = [min(CALIBRATION_LENGTHS[0], longest)]
    for n in CALIBRATION_LENGTHS[1:]:
        if longest < 2 * sizes[-1] or (n == CALIBRATION_LENGTHS[-1] and longest <= n):
            break
        sizes.append(min(n, longest))
    return tuple(sizes)


def fit_forward_times(points: Sequence[tuple[int, float]]) -> tuple[float, float] | None:
    """``(a, b)`` of ``t(n) = c + a*n + b*n**2`` through timed forwards ``(n, seconds)``, lengths increasing: the
    linear (weights) and quadratic (attention) parts, ``c`` a forward's fixed cost, which only shorter forwards
    feel (left out of the estimate of a long one). Three or more points: least squares with ``c``; where that gives a
    negative part (timing noise), the two longest points without ``c``. None where no positive ``a`` and ``b`` fit
    (then the model's own crossover length stays)."""
    ns = [float(n) for n, _ in points]
    ts = [float(t) for _, t in points]
    if len(ns) >= 3:
        scale = ns[-1]  # lengths in units of the longest: a well-conditioned system
        design = torch.tensor([[1.0, n / scale, (n / scale) ** 2] for n in ns], dtype=torch.float64)
        coef = torch.linalg.lstsq(design, torch.tensor(ts, dtype=torch.float64)[:, None]).solution[:, 0]
        c, a, b = float(coef[0]), float(coef[1]) / scale, float(coef[2]) / scale**2
        if c >= 0 and a > 0 and b > 0:
            return a, b
    if len(ns) < 2:
        return None
    (n1, n2), (t1, t2) = ns[-2:], ts[-2:]
    b = (t2 / n2 - t1 / n1) / (n2 - n1)
    a = t1 / n1 - b * n1
    return (a, b) if a > 0 and b > 0 else None


#: A fitted crossover length is kept only within this factor of the model's own (from its FLOPs): single timed
#: forwards are noisy by ~10%, which moves a fit's ``l0`` far more. On the idle 2-core Xeon (2026-11-28) fits of
#: SmolLM2's forwards ranged from 6,899 to ~132,000 tokens (through 1024 and 4096: 6,899 and ~132,000; with 8192 too:
#: 7,173 and 18,284), while forwards of 4,096 and 20,480 tokens measured about 8,000 -- the model's own is 7,784.
L0_RANGE = 2.0


def fitted_l0(fit: tuple[float, float] | None, model_l0: float) -> float:
    """The crossover length ``a / b`` of ``fit`` where it lies within ``L0_RANGE`` of ``model_l0``, else
    ``model_l0`` (no fit, or one that timing noise put out of range)."""
    if fit is None:
        return model_l0
    l0 = fit[0] / fit[1]
    return l0 if model_l0 / L0_RANGE <= l0 <= model_l0 * L0_RANGE else model_l0


def windows(data_tokens: int, length: int, eval_tokens: int) -> int:
    """Forwards ``posenc.lab.common.corpus.eval_windows`` makes: ``ceil(min(N - 1, eval_tokens) / length)``."""
    return math.ceil(min(data_tokens - 1, eval_tokens) / length)
