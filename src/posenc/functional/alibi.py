"""ALiBi (attention with linear biases) and its 2-D form for patch grids, as pure functions of tensors.

Paper: Press, Smith, Lewis 2022, "Train Short, Test Long: Attention with Linear Biases Enables Input Length
Extrapolation" (ICLR 2022, arXiv:2108.12409). Slope interpolation: Al-Khateeb et al. 2023, "Position Interpolation
Improves ALiBi Extrapolation" (arXiv:2310.13017). 2-D ALiBi: Fuller et al. 2023, "CROMA" (NeurIPS 2023,
arXiv:2311.00566).
Reference implementations checked against: ofirpress/attention_with_linear_biases ``get_slopes``
(``fairseq/models/transformer.py``; equal bit for bit for every head count 1..128), Hugging Face BLOOM
``build_alibi_tensor`` (same slopes to 7e-7 relative: BLOOM raises a float32-rounded base to integer powers;
equal attention weights under a causal mask), antofuller/CROMA ``get_2dalibi`` (to an ulp: the distance is
rounded to float32 before the product), and the naive float64 loops in ``tests/reference/alibi.py``.
Numerics: ``alibi_distance``, ``alibi_2d_distance``.

Shapes:
    H heads, S query positions, T key positions.
    slopes          (H,)                                          float32
    q_pos, k_pos    (S,) or (B|1, S); (T,) or (B|1, T)            integer or floating point
    grid positions  (S, 2) or (B|1, S, 2); (T, 2) or (B|1, T, 2)  columns (x, y), see ``grid_positions``
    bias            (B|1, H, S, T)                                float32
"""

from __future__ import annotations

import torch

from posenc._checks import check_positions, check_positive_int, check_same_device, fail


def alibi_slopes(num_heads: int, *, device: torch.device | str | None = None) -> torch.Tensor:
    """ALiBi's per-head slopes, the paper's ``get_slopes(num_heads)``, as float32.

    With ``n = 2 ** floor(log2(num_heads))``, head ``i < n`` has slope ``2 ** (-8 (i + 1) / n)``; the remaining
    ``num_heads - n`` heads take every other slope of a ``2n``-head model, ``2 ** (-4 (2j + 1) / n)``. Computed in
    float64 from exact exponents and rounded once.

    Shapes:
        returns (num_heads,), float32
    """
    check_positive_int("num_heads", num_heads)
    n = 1 << (num_heads.bit_length() - 1)  # closest power of 2 <= num_heads
    powers = torch.arange(1, n + 1, dtype=torch.float64, device=device) * (-8.0 / n)  # (n,)
    extra = (2 * torch.arange(num_heads - n, dtype=torch.float64, device=device) + 1) * (-4.0 / n)  # (H - n,)
    return torch.exp2(torch.cat((powers, extra))).to(torch.float32)  # (H,)


def interpolated_slopes(slopes: torch.Tensor, *, train_len: int, eval_len: int) -> torch.Tensor:
    """Slopes for evaluating at ``eval_len`` a model trained at ``train_len`` (Al-Khateeb et al. 2023).

    Beyond the training length every slope is multiplied by ``train_len / eval_len``, so the largest distance seen
    at evaluation gets the bias the training length got; at or below it the slopes are returned unchanged. The
    product is taken in float64 and rounded once to ``slopes.dtype``.

    Shapes:
        slopes (H,) -> (H,), same dtype
    """
    check_positive_int("train_len", train_len)
    check_positive_int("eval_len", eval_len)
    if eval_len <= train_len:
        return slopes
    return (slopes.to(torch.float64) * train_len / eval_len).to(slopes.dtype)


def _distance_dtype(a: torch.Tensor, b: torch.Tensor) -> torch.dtype:
    """Integers stay integers (exact differences); floats are promoted to at least float32."""
    dtype = torch.promote_types(a.dtype, b.dtype)
    return torch.promote_types(dtype, torch.float32) if dtype.is_floating_point else dtype


def alibi_distance(q_pos: torch.Tensor, k_pos: torch.Tensor, *, symmetric: bool = False) -> torch.Tensor:
    """Elementwise ``q - k`` (causal) or ``|q - k|`` (symmetric) as float32, for broadcastable or 0-d tensors.

    Numerics: distances are taken in the positions' dtype (integers stay exact, float32 and float64 stay as they are;
    float16/bfloat16 positions are refused, see ``posenc._checks.check_positions``), rounded once to float32 and
    multiplied by the float32 slopes. Integer positions (``|q - k| < 2**24``) thus give the correctly rounded
    ``-m * (q - k)``. float64 throughout would cost float64 arithmetic per score inside FlexAttention kernels, so it is
    not done; pass float64 positions to keep fractional distances between large positions exact. The same elementwise
    functions (this and ``alibi_2d_distance``) serve the materialised bias and the FlexAttention ``score_mod``
    closures, so both agree bit for bit when evaluated eagerly (a compiled kernel may fuse the add).
    """
    dtype = _distance_dtype(q_pos, k_pos)
    d = q_pos.to(dtype) - k_pos.to(dtype)
    return (d.abs() if symmetric else d).to(torch.float32)


def alibi_2d_distance(qx: torch.Tensor, qy: torch.Tensor, kx: torch.Tensor, ky: torch.Tensor) -> torch.Tensor:
    """Elementwise Euclidean distance ``sqrt(dx^2 + dy^2)`` as float32, for broadcastable or 0-d tensors.

    An integer's float32 square root for integer grids, so the bias is one ulp from the exact product at most.
    """
    dtype = _distance_dtype(qx, kx)
    dx, dy = qx.to(dtype) - kx.to(dtype), qy.to(dtype) - ky.to(dtype)
    return (dx * dx + dy * dy).to(torch.float32).sqrt()


def _check_slopes(slopes: torch.Tensor) -> None:
    if not isinstance(slopes, torch.Tensor) or slopes.dim() != 1:
        fail("slopes.shape", tuple(getattr(slopes, "shape", ())), "(H,): one slope per head")


def _batched(positions: torch.Tensor, name: str, n_axes: int) -> torch.Tensor:
    """``(L,)``/``(B, L)`` -> ``(1|B, L)``; grids ``(L, 2)``/``(B, L, 2)`` -> ``(1|B, L, 2)``."""
    want = "(L,) or (B, L)" if n_axes == 0 else f"(L, {n_axes}) or (B, L, {n_axes})"
    if not isinstance(positions, torch.Tensor):
        fail(name, type(positions).__name__, f"a torch.Tensor of shape {want}")
    rank = positions.dim() - (n_axes > 0)
    if rank not in (1, 2) or (n_axes and positions.shape[-1] != n_axes):
        fail(f"{name}.shape", tuple(positions.shape), want)
    check_positions(positions, name)
    return positions.unsqueeze(0) if rank == 1 else positions


def check_alibi_positions(
    q_pos: torch.Tensor, k_pos: torch.Tensor, *, grid: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """Validate query and key positions; return them with a leading batch dimension.

    Shapes:
        sequences (S,) or (B|1, S) -> (1|B, S); grids (grid=True) (S, 2) or (B|1, S, 2) -> (1|B, S, 2); same for k.
    """
    n_axes = 2 if grid else 0
    q, k = _batched(q_pos, "q_pos", n_axes), _batched(k_pos, "k_pos", n_axes)
    check_same_device("k_pos", k_pos, q_pos.device, "q_pos's device")
    if q.shape[0] != k.shape[0] and 1 not in (q.shape[0], k.shape[0]):
        fail("k_pos.shape", tuple(k_pos.shape), f"a batch size of 1 or {q.shape[0]}, the batch size of q_pos")
    return q, k


def alibi_bias(
    q_pos: torch.Tensor, k_pos: torch.Tensor, slopes: torch.Tensor, *, symmetric: bool = False
) -> torch.Tensor:
    """ALiBi's additive score bias: ``-m_h (q - k)`` (causal) or ``-m_h |q - k|`` (symmetric).

    The causal form is the paper's bias on the keys a causal mask allows (``k <= q``); keys after the query get a
    positive bias and must be masked. Under a causal mask it gives the same attention weights as BLOOM's
    ``m_h * k``, which differs from it by ``-m_h * q``, a constant per row. ``symmetric=True`` is the
    bidirectional form for encoders (no mask needed).

    Shapes:
        q_pos (S,) or (B|1, S); k_pos (T,) or (B|1, T); slopes (H,) -> (B|1, H, S, T) float32
    """
    _check_slopes(slopes)
    q, k = check_alibi_positions(q_pos, k_pos)  # (1|B, S), (1|B, T)
    d = alibi_distance(q[:, :, None], k[:, None, :], symmetric=symmetric)  # (B|1, S, T)
    return -(d[:, None] * slopes.to(d.device, torch.float32)[:, None, None])  # (B|1, H, S, T)


def alibi_2d_bias(q_pos: torch.Tensor, k_pos: torch.Tensor, slopes: torch.Tensor) -> torch.Tensor:
    """2-D ALiBi (CROMA): ``-m_h * ||p_q - p_k||``, the Euclidean distance between patch positions.

    Symmetric and rotation invariant; CROMA uses it without a mask, on ``grid_positions(W, H)``.

    Shapes:
        q_pos (S, 2) or (B|1, S, 2); k_pos (T, 2) or (B|1, T, 2); slopes (H,) -> (B|1, H, S, T) float32
    """
    _check_slopes(slopes)
    q, k = check_alibi_positions(q_pos, k_pos, grid=True)  # (1|B, S, 2), (1|B, T, 2)
    d = alibi_2d_distance(q[:, :, None, 0], q[:, :, None, 1], k[:, None, :, 0], k[:, None, :, 1])  # (B|1, S, T)
    return -(d[:, None] * slopes.to(d.device, torch.float32)[:, None, None])  # (B|1, H, S, T)
