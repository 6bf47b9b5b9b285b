"""Tolerances derived from the computation, not from one machine's BLAS.

Two float computations of the same quantity (eager vs SDPA, a chunk vs the full call, compiled vs eager, a matmul
vs a written-out sum) differ by how they block their sums, and that depends on the CPU (AVX2 vs AVX-512 kernels),
the BLAS build and the thread count. A fixed ``atol=1e-6`` that holds on one machine fails on another. These bounds
follow Higham, *Accuracy and Stability of Numerical Algorithms* (2nd ed.), §3.1: a float sum of ``n`` terms
computed in any order is within ``gamma(n) * sum |term|`` of the exact sum, ``gamma(n) = n u / (1 - n u)``, ``u``
the unit roundoff (half the machine epsilon). Two orders therefore differ by at most ``2 gamma(n) sum |term|``.

They are worst-case bounds: loose by ~sqrt(n) against typical rounding, still orders of magnitude below what a
wrong position, mask or scale moves (~1e-2 and up), which is what these tests are there to catch.
"""

from __future__ import annotations

import torch


def unit_roundoff(dtype: torch.dtype = torch.float32) -> float:
    """u = eps / 2: the largest relative error of one correctly rounded operation."""
    return torch.finfo(dtype).eps / 2


def gamma(n: int, dtype: torch.dtype = torch.float32) -> float:
    """Higham's gamma_n = n u / (1 - n u): the relative error bound of an ``n``-term float sum (or dot product)."""
    nu = n * unit_roundoff(dtype)
    if nu >= 1:
        raise ValueError(f"gamma: n={n} terms is beyond the bound's reach in {dtype} (n u = {nu:.3g} >= 1)")
    return nu / (1 - nu)


def ulps(n: float, dtype: torch.dtype = torch.float32) -> dict:
    """``assert_close`` arguments for elementwise results within ``n`` roundings of each other (relative)."""
    return {"rtol": n * torch.finfo(dtype).eps, "atol": 0.0}


def sum_atol(terms: int, magnitude: float, dtype: torch.dtype = torch.float32) -> float:
    """Two summation orders of ``terms`` float products whose absolute values add up to at most ``magnitude``
    differ by at most ``2 gamma(terms + 1) magnitude`` (the +1: the product's own rounding)."""
    return 2 * gamma(terms + 1, dtype) * float(magnitude)


def dot_magnitude(a: torch.Tensor, b: torch.Tensor) -> float:
    """max over rows i of a and b of sum_d |a_id| |b_jd|: the ``magnitude`` of the dot products ``a @ b.T``."""
    return float((a.detach().abs().double().flatten(0, -2) @ b.detach().abs().double().flatten(0, -2).T).max())


def softmax_atol(score_error: float, terms: int, v_max: float, dtype: torch.dtype = torch.float32) -> float:
    """Bound on the difference of two computations of ``softmax(s) @ v`` over ``terms`` keys.

    Scores differing by at most ``score_error`` move every probability by a factor within exp(+-2 score_error),
    so the output by at most (exp(2 score_error) - 1) max|v|; the weighted sum of ``terms`` values adds
    2 gamma(terms) max|v| (the weights sum to 1); exp, the normalisation and an online softmax's rescaling add a
    few roundings of each weight (8 u, generous).
    """
    u = unit_roundoff(dtype)
    moved = torch.expm1(torch.tensor(2 * score_error, dtype=torch.float64)).item()
    return float(v_max) * (moved + 2 * gamma(terms, dtype) + 8 * u)


def attention_atol(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    scale: float | None = None,
    bias_max: float = 0.0,
    extra_score_error: float = 0.0,
    value_max: float | None = None,
    dtype: torch.dtype = torch.float32,
) -> float:
    """Bound on the difference of two float computations of softmax(q k^T scale + bias) v (any backend, blocking,
    chunking or compilation), for q (..., S, D), k (..., T, D), v (..., T, Dv) as given to attention -- after any
    rotation, which is elementwise and rounds the same way on both paths.

    A score is a D-term dot product, scaled, plus a bias: two orders differ by 2 gamma(D + 1) scale max sum|q k|, and
    the scale multiply, the bias add and an online softmax's max subtraction round each side once more relative to
    |score| (4 u (max|q k| scale + bias_max)). ``extra_score_error``: how far two computations of the bias or the
    rotation may move a score beyond that (0 when both paths evaluate the same elementwise formula, as most encodings
    do; ``encoding_cases.score_error`` for the others). ``value_max``: max|v| unless a value term adds to it.
    """
    d, t = q.shape[-1], k.shape[-2]
    scale = d**-0.5 if scale is None else scale
    qk = dot_magnitude(q, k) * abs(scale)
    score_error = sum_atol(d, qk, dtype) + 4 * unit_roundoff(dtype) * (qk + bias_max) + extra_score_error
    value_max = float(v.detach().abs().max()) if value_max is None else value_max
    return softmax_atol(score_error, t, value_max, dtype)


def mlp_atol(w1: torch.Tensor, b1: torch.Tensor, w2: torch.Tensor, b2: torch.Tensor, *, x_max: float = 1.0) -> float:
    """Bound on two float32 evaluations of ``w2 relu(w1 x + b1) + b2`` for scalar inputs |x| <= x_max that are
    themselves within 8 roundings (a log, a ratio and their inputs: FIRE's normalised distance).

    The hidden units are within 8 u |w1| x_max + 2 u (|w1| x_max + |b1|) of each other, the output adds the sum
    over the W units (2 gamma(W + 1) of sum |w2| |h|) and its bias' rounding.
    """
    u = unit_roundoff()
    w1, b1, w2, b2 = (t.detach().abs().double() for t in (w1, b1, w2, b2))
    hidden = w1 * x_max + b1  # (W,) bound on |h|
    moved = 8 * u * w1 * x_max + 2 * u * hidden  # (W,) bound on |h - h'|
    return float((w2 @ moved + sum_atol(w2.shape[-1], 1.0) * (w2 @ hidden) + 4 * u * (w2 @ hidden + b2)).max())


def grad_atols(fn, params: list[torch.Tensor], weights: torch.Tensor, *, roundings: int = 16) -> list[float]:
    """Bounds on two float32 computations of the gradients of ``(weights * fn(*params)).sum()``, one per parameter.

    Each gradient element is a sum over fn's outputs of ``weights * d out / d param``, every term computed in at most
    ``roundings`` float32 operations: two computations differ by at most 2 gamma(n + roundings) times the sum of
    the terms' magnitudes, which the float64 Jacobian gives exactly.
    """
    from torch.autograd.functional import jacobian

    p64 = tuple(p.detach().double() for p in params)
    jac = jacobian(lambda *ps: fn(*ps).double(), p64)  # per parameter: (*out.shape, *param.shape)
    w = weights.detach().abs().double().flatten()
    n = w.numel()
    atols = []
    for j, p in zip(jac, p64, strict=True):
        magnitude = (w @ j.abs().reshape(n, -1)).max() if p.numel() else torch.tensor(0.0)
        atols.append(2 * gamma(n + roundings) * float(magnitude))
    return atols


def bloom_slopes_rtol(num_heads: int) -> float:
    """Relative bound between exact ALiBi slopes and BLOOM's (transformers ``build_alibi_tensor``), which raises a
    float32-rounded base ``2 ** (-8 / n)`` to integer powers ``p <= n`` (odd powers ``<= 2 n`` of the next base for
    the extra heads): ``p`` times the base's rounding error, plus an ulp of ``pow`` and one of the rounded slope."""
    import math

    closest = 2 ** math.floor(math.log2(num_heads))
    worst = 0.0
    for n, top in ((closest, closest), (2 * closest, 2 * (num_heads - closest) - 1)):
        base = 2.0 ** (-(2.0 ** -(math.log2(n) - 3)))
        rounded = torch.tensor(base, dtype=torch.float32).item()
        worst = max(worst, max(top, 0) * abs(rounded / base - 1))
    return worst + 4 * unit_roundoff()


def mpt_slopes_rtol(num_heads: int) -> float:
    """Relative bound between exact ALiBi slopes and MPT's, which evaluates ``2 ** -(8 m / n)`` in float32: the
    exponent (|e| <= 8) rounds once or twice (2 u |e| ln 2 relative on the power), plus an ulp of ``pow`` and one of
    the slope (the next power of two's exponents when n is not one reach 16)."""
    import math

    exponent = 16.0 if num_heads & (num_heads - 1) else 8.0
    return (2 * exponent * math.log(2) + 4) * unit_roundoff()


def frequency_rtol(base: float, factor: float = 1.0) -> float:
    """Relative bound between posenc's RoPE frequencies (float64, rounded once) and transformers' float32 ones.

    Transformers evaluates ``base ** -e`` in float32 with ``e = 2i / d`` rounded once: ``u e ln(base) <= u ln(base)``
    relative on the power; ``pow``, the reciprocal and a scaling's float32 operations (at most 8: a divide, a
    dynamic base, a ramp) add <= 2 u each; a YaRN-style mix ``f / factor (1 - m) + f m`` turns the ramp's absolute
    error (a few u) into ``factor`` times that, relative; posenc's own rounding adds u.
    """
    import math

    return (math.log(max(base, math.e)) + 2 * 8 + 4 * factor + 1) * unit_roundoff()


def like_reference_atol(reference: torch.Tensor, exact: torch.Tensor, *, factor: float = 4.0) -> float:
    """FlashAttention's test criterion, for computations too deep for a closed-form bound (whole layers, models):
    a float32 result may be ``factor`` times as far from the float64 ``exact`` result as the reference
    implementation's own float32 result is (its rounding on this machine and BLAS, measured), plus 8 roundings of
    the largest value."""
    exact = exact.detach().double()
    own = float((reference.detach().double() - exact).abs().max())
    return factor * own + 8 * unit_roundoff() * float(exact.abs().max())


def bicubic_atol(table_max: float, *, sides: int = 1) -> float:
    """Bound on a float32 bicubic resize against the exact one (``sides=2``: two float32 resizes against each other).

    Each output is a weighted sum of at most 16 table entries (4 taps per axis) whose weights add up to at most 1.5
    in absolute value per axis (bicubic's negative lobes), each weight rounded once: within gamma(16 + 2) 1.5**2
    max|table| of the exact sum.
    """
    return sides * gamma(16 + 2) * 1.5**2 * float(table_max)


def fope_rotation_atol(cos_coef: torch.Tensor, sin_coef: torch.Tensor, x_max: float) -> float:
    """Bound on two float32 FoPE rotations of one channel (e.g. a chunk and the full call) of inputs |x| <= x_max.

    Each table entry is a float32 sum of M products ``|coef| * 1``: two summation orders differ by at most
    2 (M - 1) eps sum_j |coef[j, d]| (plus one rounding of the entry); an output mixes two entries with two channels
    of x, each rounded once more.
    """
    m = cos_coef.shape[1]
    column = float(torch.maximum(cos_coef.detach().abs().sum(1), sin_coef.detach().abs().sum(1)).max())
    return 2 * float(x_max) * (2 * (m - 1) + 2) * torch.finfo(torch.float32).eps * column


def rotated_softmax_atol(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    dtype: torch.dtype,
    *,
    max_position: float,
    logit_factor: float = 1.0,
) -> float:
    """RoPE attention in ``dtype`` against a float64 reference: the scores' error is the dot product's summation
    (``sum_atol``) plus the rotation's on each factor -- an angle ``position * inv_freq`` rounded to
    ``max_position * u`` radians, cos/sin and the products a few roundings (8 u) -- times the scale and any logit
    factor; the output's then follows from ``softmax_atol`` over every key."""
    d, t = q.shape[-1], k.shape[-2]
    mag = dot_magnitude(q.reshape(-1, d), k.reshape(-1, d))
    u = unit_roundoff(dtype)
    rotation = 2 * mag * (max_position * u + 8 * u)
    score_error = logit_factor * d**-0.5 * (sum_atol(d, mag, dtype) + rotation)
    return softmax_atol(score_error, t, float(v.abs().max()), dtype)


def rope_table_atol(max_angle: float) -> float:
    """Bound on posenc's float32 cos/sin table entry against the exact (float64) one, for angles up to
    ``max_angle`` radians: posenc's angle ``t * fl32(inv_freq)`` is off by ``u |theta|`` (the frequency's rounding,
    the angle itself in float64), cos/sin and the cast round a few more times (4 u); doubled for slack."""
    return 2 * (max_angle + 4) * unit_roundoff()


def hf_rope_table_atol(max_angle: float, base: float) -> float:
    """Bound on a transformers float32 cos/sin table entry against posenc's: transformers' frequency is within
    ``frequency_rtol(base)`` of the exact one and its float32 angle ``t * inv_freq`` rounds once more (``u``), so an
    angle differs by ``max_angle (frequency_rtol + 2 u)``; each side's trig result and cast round twice (4 u)."""
    return max_angle * (frequency_rtol(base) + 2 * unit_roundoff()) + 4 * unit_roundoff()


def rope_rotation_atol(table_atol: float, x_max: float) -> float:
    """Bound on two float32 rotations of inputs ``|x| <= x_max`` by tables within ``table_atol`` of each other: each
    output channel is ``x1 c - x2 s`` (two table entries times ``|x|``), plus three roundings of a value
    ``<= 2 x_max`` on each side."""
    return 2 * x_max * table_atol + 6 * unit_roundoff() * x_max
