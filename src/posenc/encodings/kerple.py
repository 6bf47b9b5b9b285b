"""``KERPLE``: a learned kernel of the query-key distance, logarithmic or power, added to the attention scores.

Paper: Chi, Fan, Ramadge, Rudnicky 2022, "KERPLE: Kernelized Relative Positional Embedding for Length
Extrapolation" (NeurIPS 2022, arXiv:2205.09921): per head ``-r1 log(1 + r2 |i - j|)`` (``kernel="log"``, the
paper's best) or ``-r1 |i - j| ** r2`` (``kernel="power"``, ``0 < r2 <= 2``).
Reference implementation: chijames/KERPLE ``ParallelKerpleLog`` / ``ParallelKerplePower`` (initialisation, bounds);
the bias is checked against the equations written out in ``tests/reference/kerple.py``. See
``posenc.functional.kerple`` for the mapping of the reference's parameter names and the bounds.

Shapes:
    positions (S,) or (B|1, S), integer or float; bias (B|1, H, S, T) float32;
    score_mod(score, b, h, q_idx, kv_idx) -> score + bias[b, h, q_idx, kv_idx].
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from posenc._checks import check_choice, check_positive_int
from posenc._config import DictConfig
from posenc.encodings._base import ConfiguredModule, ScoreMod, position_reader
from posenc.functional.alibi import alibi_distance, check_alibi_positions
from posenc.functional.kerple import KERNELS, kerple_bias, kerple_constrained, kerple_init, kerple_kernel
from posenc.registry import register


@dataclass(frozen=True, kw_only=True, slots=True)
class KERPLEConfig(DictConfig):
    """Everything that defines a KERPLE: validated on construction, round-trips through ``to_dict``/``from_dict``."""

    num_heads: int
    kernel: str = "log"

    def __post_init__(self) -> None:
        check_positive_int("num_heads", self.num_heads)
        check_choice("kernel", self.kernel, KERNELS)


@register("kerple")
class KERPLE(ConfiguredModule):
    """KERPLE: head ``h`` adds ``-r1_h log(1 + r2_h |q - k|)`` (log) or ``-r1_h |q - k| ** r2_h`` (power).

    Args:
        num_heads: query heads ``H``; two learned scalars per head.
        kernel: ``"log"`` (the paper's KERPLE-log, its best) or ``"power"`` (KERPLE-power).

    Parameters ``r1``, ``r2`` ``(H,)`` float32, drawn as the reference does (log: ``r1 ~ U(0, 2)``, ``r2 ~ U(0, 1)``;
    power: ``r1 ~ U(0, 1)``, ``r2 ~ U(0, 2)``). The kernel uses them clamped to ``>= 0.01`` (``r2 <= 2`` for power)
    with straight-through gradients (``kernel_parameters()``; why in ``posenc.functional.kerple``). Symmetric in
    ``q - k``: causal and bidirectional attention alike.

    Shapes:
        q_pos (S,) or (B|1, S), k_pos (T,) or (B|1, T) -> bias (B|1, H, S, T) float32.
    """

    has_bias = True
    config_class = KERPLEConfig

    def __init__(self, num_heads: int, *, kernel: str = "log") -> None:
        super().__init__()
        self.config = KERPLEConfig(num_heads=num_heads, kernel=kernel)
        r1, r2 = kerple_init(num_heads, kernel=kernel)
        self.r1, self.r2 = nn.Parameter(r1), nn.Parameter(r2)

    def kernel_parameters(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(r1, r2)`` as the kernel uses them: bounded, float32, differentiable in the parameters."""
        return kerple_constrained(self.r1, self.r2, kernel=self.config.kernel)

    def bias(
        self, q_pos: torch.Tensor, k_pos: torch.Tensor, *, q: torch.Tensor | None = None, scale: float | None = None
    ) -> torch.Tensor:
        """The materialised bias ``(B|1, H, S, T)`` float32; ``q`` (if given) must have ``num_heads`` heads,
        ``scale`` is unused."""
        self.check_heads(q)
        r1, r2 = self.kernel_parameters()
        return kerple_bias(q_pos, k_pos, r1, r2, kernel=self.config.kernel)

    def score_mod(
        self, q_pos: torch.Tensor, k_pos: torch.Tensor, *, q: torch.Tensor | None = None, scale: float | None = None
    ) -> ScoreMod:
        """FlexAttention ``score_mod`` adding ``bias(q_pos, k_pos)[b, h, q_idx, kv_idx]`` (bit for bit eagerly);
        captures the ``(H,)`` parameters and the positions."""
        self.check_heads(q)
        check_alibi_positions(q_pos, k_pos)
        kernel = self.config.kernel
        # The raw parameters, bounded per score inside the closure: under torch.compile a score_mod that captures a
        # tensor computed in the same graph fails to lower on CPU (torch 2.13), one that captures a parameter works.
        r1, r2 = self.r1.to(q_pos.device), self.r2.to(q_pos.device)
        q_at, k_at = position_reader(q_pos), position_reader(k_pos)

        def kerple_mod(score, b, h, q_idx, kv_idx):  # noqa: ANN001, ANN202 - FlexAttention's signature
            d = alibi_distance(q_at(b, q_idx), k_at(b, kv_idx), symmetric=True)
            r1_h, r2_h = kerple_constrained(r1[h], r2[h], kernel=kernel)
            return score + kerple_kernel(d, r1_h, r2_h, kernel=kernel).to(score.dtype)

        return kerple_mod

    def forward(self, positions: torch.Tensor, k_positions: torch.Tensor | None = None) -> torch.Tensor:
        """The bias ``(B|1, H, S, T)``; keys use ``k_positions`` if given, else ``positions``."""
        return self.bias(positions, positions if k_positions is None else k_positions)

    def extra_repr(self) -> str:
        return f"num_heads={self.config.num_heads}, kernel={self.config.kernel!r}"
