"""KERPLE: conditionally positive definite kernels of the query-key distance as a learned score bias.

Paper: Chi, Fan, Ramadge, Rudnicky 2022, "KERPLE: Kernelized Relative Positional Embedding for Length
Extrapolation" (NeurIPS 2022, arXiv:2205.09921), Sec. 4: with ``d = |i - j|`` and per-head ``r1, r2 > 0``,

    log:    b_h(i, j) = -r1_h * log(1 + r2_h * d)
    power:  b_h(i, j) = -r1_h * d ** r2_h,          0 < r2_h <= 2

Reference implementation: chijames/KERPLE ``megatron/mpu/layers.py`` (``ParallelKerpleLog``, ``ParallelKerplePower``,
bias part). Its names map onto the paper's as: log ``bias_p`` -> ``r1``, ``bias_a`` -> ``r2``; power ``bias_a`` ->
``r1``, ``bias_p`` -> ``r2``. Checked against the equations written out as float64 loops in
``tests/reference/kerple.py``.

Shapes:
    H heads, S query positions, T key positions.
    r1, r2          (H,)                                  any floating dtype; used in float32
    q_pos, k_pos    (S,) or (B|1, S); (T,) or (B|1, T)    integer, float32 or float64
    bias            (B|1, H, S, T)                        float32
"""

from __future__ import annotations

from typing import cast

import torch

from posenc._checks import check_choice, fail
from posenc.functional.alibi import alibi_distance, check_alibi_positions

KERNELS = ("log", "power")

#: The reference clamps both parameters to at least this after every update (``self.eps = 1e-2``), and the power
#: kernel's exponent to at most 2 (beyond 2, ``d ** r2`` is no longer conditionally positive definite).
MIN_VALUE = 1e-2
MAX_POWER = 2.0


def kerple_init(
    num_heads: int, *, kernel: str = "log", device: torch.device | str | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Initial ``(r1, r2)``, ``(H,)`` float32 each, drawn as the reference's ``get_parameter(scale, 'uniform')``.

    log: ``r1 ~ U(0, 2)``, ``r2 ~ U(0, 1)``; power: ``r1 ~ U(0, 1)``, ``r2 ~ U(0, 2)`` (torch's global generator).
    """
    check_choice("kernel", kernel, KERNELS)
    scale1, scale2 = (2.0, 1.0) if kernel == "log" else (1.0, 2.0)
    r1 = torch.rand(num_heads, dtype=torch.float32, device=device) * scale1
    r2 = torch.rand(num_heads, dtype=torch.float32, device=device) * scale2
    return r1, r2


def _straight_through(p: torch.Tensor, low: float, high: float | None) -> torch.Tensor:
    """``p`` clamped to ``[low, high]`` in value, with the identity as gradient (exactly the clamped value)."""
    clamped = p.clamp(min=low, max=high)
    return clamped.detach() + (p - p.detach())


def kerple_constrained(r1: torch.Tensor, r2: torch.Tensor, *, kernel: str = "log") -> tuple[torch.Tensor, torch.Tensor]:
    """The parameter values the kernel uses: ``r1, r2 >= 0.01`` (and ``r2 <= 2`` for the power kernel), float32.

    The reference projects the parameters in place (``bias_p.data.clamp(...)``) at every forward, a projected
    gradient step. Mutating parameters in a forward pass breaks ``torch.compile`` and autograd's bookkeeping, so here
    the clamp acts on the value only and passes gradients through unchanged (a straight-through estimator): a
    parameter that crossed a bound still feels the loss and can come back, where a plain ``clamp`` would zero its
    gradient for good. Inside the bounds it is the identity, in value and gradient.

    Shapes:
        r1, r2 (H,) -> (H,), (H,) float32
    """
    check_choice("kernel", kernel, KERNELS)
    r1, r2 = r1.float(), r2.float()  # a bf16 model keeps float32 math: .float() is differentiable
    high = MAX_POWER if kernel == "power" else None
    return _straight_through(r1, MIN_VALUE, None), _straight_through(r2, MIN_VALUE, high)


def kerple_kernel(distance: torch.Tensor, r1: torch.Tensor, r2: torch.Tensor, *, kernel: str = "log") -> torch.Tensor:
    """Elementwise bias of a distance ``d >= 0`` for per-head ``r1``, ``r2`` broadcast against it.

    Numerics: the distance is taken exactly in the positions' dtype and rounded once to float32 (exact for integer
    distances below 2**24), as in ``posenc.functional.alibi``. Elementwise: the materialised bias and a FlexAttention
    ``score_mod`` call it on tensors of the same shapes, so both agree bit for bit when evaluated eagerly. ``log1p``
    replaces the reference's ``log(1 + x)`` (the same function, better rounded for small ``x``).

    ``-r1 * log1p(r2 * d)`` (log) or ``-r1 * d ** r2`` (power); ``d ** r2`` is 0 at ``d = 0`` and its gradient with
    respect to ``r2`` is 0 there (torch's ``pow`` special-cases ``0 ** r``).
    """
    if kernel == "log":
        return -(r1 * torch.log1p(r2 * distance))
    return -(r1 * distance.pow(r2))


def _check_params(r1: object, r2: object) -> None:
    for name, p in (("r1", r1), ("r2", r2)):
        if not isinstance(p, torch.Tensor) or p.dim() != 1 or not p.is_floating_point():
            shape = tuple(p.shape) if isinstance(p, torch.Tensor) else type(p).__name__
            fail(f"{name}.shape", shape, "(H,): one floating point value per head")
    r1, r2 = cast(torch.Tensor, r1), cast(torch.Tensor, r2)  # both checked by the loop
    if r1.shape != r2.shape:
        fail("r2.shape", tuple(r2.shape), f"{tuple(r1.shape)}, the shape of r1 (one value per head)")


def kerple_bias(
    q_pos: torch.Tensor, k_pos: torch.Tensor, r1: torch.Tensor, r2: torch.Tensor, *, kernel: str = "log"
) -> torch.Tensor:
    """KERPLE's additive score bias for every head, query and key, with ``r1``, ``r2`` used as given.

    Pass the values through ``kerple_constrained`` first to apply the paper's bounds (``posenc.build("kerple")``
    does). The kernel is symmetric in ``i - j``, so it serves causal and bidirectional attention alike.

    Shapes:
        q_pos (S,) or (B|1, S); k_pos (T,) or (B|1, T); r1, r2 (H,) -> (B|1, H, S, T) float32
    """
    check_choice("kernel", kernel, KERNELS)
    _check_params(r1, r2)
    q, k = check_alibi_positions(q_pos, k_pos)  # (1|B, S), (1|B, T)
    d = alibi_distance(q[:, None, :, None], k[:, None, None, :], symmetric=True)  # (B|1, 1, S, T), float32
    heads = (-1, 1, 1)  # (H,) -> (H, 1, 1): broadcast over (B|1, H, S, T)
    r1, r2 = (p.to(d.device, torch.float32).view(heads) for p in (r1, r2))
    return kerple_kernel(d, r1, r2, kernel=kernel)  # (B|1, H, S, T)
