"""FIRE: a learned function of the log-scaled query-key distance, normalised by the query's position.

Paper: Li et al. 2024, "Functional Interpolation for Relative Positions Improves Long Context Transformers"
(ICLR 2024, arXiv:2310.04418), Sec. 3: for query position ``i`` and key position ``j``,

    b(i, j) = f_theta( psi(i - j) / psi(max(L, i)) ),        psi(x) = log(c x + 1),

``f_theta`` an MLP ``1 -> width -> H`` with ReLU, one output per head, ``c`` and the threshold ``L`` learned
(parametrised as in the paper's PyTorch listing: ``fire_bias``). Checked against those equations written out as
float64 loops in ``tests/reference/fire.py``.

Shapes:
    H heads, W MLP width, S query positions, T key positions.
    q_pos, k_pos         (S,) or (B|1, S); (T,) or (B|1, T)   integer, float32 or float64
    c, threshold         ()                                   float; used in float32
    w1, b1               (W,), (W,)                           first layer: weight[:, 0] and bias of Linear(1, W)
    w2, b2               (H, W), (H,)                         second layer: Linear(W, H)
    bias                 (B|1, H, S, T)                       float32
"""

from __future__ import annotations

from typing import Any, cast

import torch

from posenc._checks import check_number, fail
from posenc.functional.alibi import alibi_distance, check_alibi_positions


def fire_threshold(multiplier: torch.Tensor, *, init_L: float) -> torch.Tensor:
    """The learned threshold ``L = |multiplier * init_L|`` as float32 (``()`` -> ``()``)."""
    check_number("init_L", init_L, minimum=0.0)
    return threshold_of(multiplier, init_L)


def threshold_of(multiplier: torch.Tensor, init_L: float | torch.Tensor) -> torch.Tensor:
    """``fire_threshold`` without the check, for inside a ``score_mod`` (traced: no Python-side validation;
    ``init_L`` a float32 0-d tensor there)."""
    return (multiplier.float() * init_L).abs()


def fire_normalized_distance(
    q_pos: torch.Tensor,
    k_pos: torch.Tensor,
    c: torch.Tensor,
    threshold: torch.Tensor,
    *,
    eps: float | torch.Tensor = 1e-6,
) -> torch.Tensor:
    """Elementwise ``log(|c (i - j)| + 1) / (log(|c max(i, L)| + 1) + eps)`` in float32, for broadcastable
    query positions ``i``, key positions ``j``, and 0-d ``c``, ``L`` (float32); ``eps`` a float or (in a
    ``score_mod``) a float32 0-d tensor.

    ``psi(max(L, i))`` makes the bias depend on the query's position, not only on ``i - j``: below the threshold
    (``i <= L``) it is a function of the distance alone; beyond it distances are interpolated into ``[0, 1]``
    ("progressive interpolation"). The paper's FIRE is causal (``j <= i``); through ``|c x|`` keys after the query get
    the bias of ``|i - j|``, so bidirectional attention works too (the normalised distance may then exceed 1).
    """
    d = alibi_distance(q_pos, k_pos, symmetric=True)  # |i - j|, exact then rounded once to float32
    normaliser = torch.maximum(q_pos.to(torch.float32), threshold)
    return torch.log1p((c * d).abs()) / (torch.log1p((c * normaliser).abs()) + eps)


def fire_mlp(x: torch.Tensor, w1: torch.Tensor, b1: torch.Tensor, w2: torch.Tensor, b2: torch.Tensor) -> torch.Tensor:
    """Elementwise ``f_theta(x) = b2 + sum_u w2[..., u] relu(w1[u] x + b1[u])``, hidden units in order ``u = 0..W-1``.

    ``w2`` holds the heads' rows with the width last (``(H, 1, 1, W)`` for a bias grid, ``w2[h]`` in a score_mod),
    ``b2`` broadcasts against ``x`` the same way.

    Written out as a sum over its ``W`` hidden units rather than a matrix product: a ``score_mod`` sees one score at a
    time, and the materialised bias and a FlexAttention ``score_mod`` call this and ``fire_normalized_distance`` on
    tensors of the same shapes, in the same order, so both agree bit for bit when evaluated eagerly.
    """
    out = b2
    for u in range(w1.shape[0]):  # W hidden units, unrolled: every step is a pointwise op
        out = out + w2[..., u] * torch.relu(x * w1[u] + b1[u])
    return out


def check_fire_params(c: object, threshold: object, w1: object, b1: object, w2: object, b2: object) -> tuple[int, int]:
    """Shapes of FIRE's parameters; returns ``(H, W)``."""
    tensors = {"c": c, "threshold": threshold, "w1": w1, "b1": b1, "w2": w2, "b2": b2}
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor) or not t.is_floating_point():
            fail(name, type(t).__name__ if not isinstance(t, torch.Tensor) else t.dtype, "a floating point tensor")
    checked = cast("dict[str, torch.Tensor]", tensors)  # each checked above
    w1, b1, w2, b2 = checked["w1"], checked["b1"], checked["w2"], checked["b2"]
    for name in ("c", "threshold"):
        if checked[name].dim() != 0:
            fail(f"{name}.shape", tuple(checked[name].shape), "(): a scalar tensor")
    if w1.dim() != 1:
        fail("w1.shape", tuple(w1.shape), "(W,): the first layer's weight[:, 0]")
    width = w1.shape[0]
    if b1.shape != (width,):
        fail("b1.shape", tuple(b1.shape), f"({width},), one bias per hidden unit")
    if w2.dim() != 2 or w2.shape[1] != width:
        fail("w2.shape", tuple(w2.shape), f"(H, {width}): the second layer's weight")
    if b2.shape != (w2.shape[0],):
        fail("b2.shape", tuple(b2.shape), f"({w2.shape[0]},), one bias per head")
    return w2.shape[0], width


def fire_bias(
    q_pos: torch.Tensor,
    k_pos: torch.Tensor,
    c: torch.Tensor,
    threshold: torch.Tensor,
    w1: torch.Tensor,
    b1: torch.Tensor,
    w2: torch.Tensor,
    b2: torch.Tensor,
    *,
    eps: float = 1e-6,
) -> torch.Tensor:
    """FIRE's additive score bias ``f_theta(psi(i - j) / psi(max(L, i)))`` for every head, query and key.

    Differentiable in every parameter (``c``, ``threshold``, the MLP's). Parameters of any floating dtype are used
    in float32.

    The paper's PyTorch listing (appendix), followed here: ``psi(x) = log(|c x| + 1)``, ``L = |L_multiplier * init_L|``
    with ``init_L`` fixed (512) and ``L_multiplier`` learned (init 1), ``c`` init 0.1, ``eps = 1e-6`` added to the
    normaliser, ``width = 32``, ``nn.Linear`` default initialisation.

    Numerics: float32 throughout (positions rounded once: exact for integers below 2**24). The MLP is a sum over its
    hidden units (``fire_mlp``), so the bias costs ``O(W)`` elementwise passes over ``(B, H, S, T)``.

    Shapes:
        q_pos (S,) or (B|1, S); k_pos (T,) or (B|1, T); c, threshold (); w1, b1 (W,); w2 (H, W); b2 (H,)
        -> (B|1, H, S, T) float32
    """
    heads, width = check_fire_params(c, threshold, w1, b1, w2, b2)
    check_number("eps", eps, minimum=0.0)
    q, k = check_alibi_positions(q_pos, k_pos)  # (1|B, S), (1|B, T)
    f32: dict[str, Any] = {"device": q.device, "dtype": torch.float32}
    x = fire_normalized_distance(
        q[:, None, :, None], k[:, None, None, :], c.to(**f32), threshold.to(**f32), eps=eps
    )  # (B|1, 1, S, T)
    rows = w2.to(**f32).view(heads, 1, 1, width)  # (H, 1, 1, W): broadcast over (B|1, H, S, T)
    return fire_mlp(x, w1.to(**f32), b1.to(**f32), rows, b2.to(**f32).view(heads, 1, 1))  # (B|1, H, S, T)
