"""``XPos``: rotary position embedding with an exponential decay of ``q . k`` with distance.

Paper: Sun et al. 2022, "A Length-Extrapolatable Transformer" (arXiv:2212.10554).
Reference implementation: torchscale ``XPOS`` (``torchscale/component/xpos_relative_position.py``), interleaved
layout; the formula-level reference the tests compare against is ``tests/reference/xpos.py``.

Shapes:
    q (B, H, S, D), k (B, Hkv, T, D); positions (S,) or (B, S), integer or float. With ``k_positions`` omitted,
    keys use the query positions (T == S).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from posenc._checks import check_choice, check_number, check_positive_int, fail
from posenc._config import DictConfig
from posenc.encodings._base import FrequencyModule, check_position_values, check_qk
from posenc.encodings.rotary import check_positions
from posenc.functional.rope import LAYOUTS, default_inv_freq, table_dtype
from posenc.functional.xpos import check_xpos_positions, cos_sin_of, xpos_cos_sin, xpos_max_distance
from posenc.registry import register


@dataclass(frozen=True, kw_only=True, slots=True)
class XPosConfig(DictConfig):
    """Everything that defines an xPos: validated on construction, round-trips through ``to_dict``/``from_dict``."""

    head_dim: int
    base: float = 10000.0
    scale_base: float = 512.0
    layout: str = "interleaved"
    center: float = 0.0

    def __post_init__(self) -> None:
        check_positive_int("head_dim", self.head_dim)
        if self.head_dim % 2:
            fail("head_dim", self.head_dim, "an even number (xPos rotates and scales channel pairs)")
        check_number("base", self.base, above=1.0)
        check_number("scale_base", self.scale_base, above=0.0)
        check_number("center", self.center)
        check_choice("layout", self.layout, LAYOUTS)


@register("xpos")
class XPos(FrequencyModule):
    """xPos: RoPE whose pair ``i`` is also scaled by ``zeta_i ** ((m - center) / scale_base)`` for queries and by
    its inverse at the key position, with ``zeta_i = (2i + 0.4 D) / (1.4 D)``.

    ``<q_m, k_n>`` then depends on ``m - n`` only and decays as ``zeta_i ** ((m - n) / scale_base)``.

    Args:
        head_dim: channels per head ``D`` (even); all of them rotate.
        base: RoPE base for the rotation frequencies.
        scale_base: distance over which the factors change by ``zeta_i``; larger means slower decay.
        layout: ``"interleaved"`` (torchscale, GPT-J) pairs 2i with 2i + 1; ``"half"`` (GPT-NeoX / HF) pairs i with
            i + D/2. Pair ``i`` has frequency ``base ** (-2i / D)`` and decay base ``zeta_i`` in both layouts.
        center: position at which both factors are 1. It cancels in ``q . k``; it only keeps the factors of
            positions far from 0 inside the float range. Positions with ``|p - center| > max_distance(x.dtype)``
            (float32/bfloat16 ``69.7 * scale_base``, float16 ``7.7 * scale_base``, float64 ``565 * scale_base``;
            see ``posenc.functional.xpos``) are refused with a ``ValueError``. torchscale centres at half the
            length.

    Shapes:
        q (B, H, S, D), k (B, Hkv, T, D), positions (S,) or (B, S) -> q, k of the same shapes and dtypes.
    """

    inv_freq: torch.Tensor

    config_class = XPosConfig

    def __init__(
        self,
        head_dim: int,
        *,
        base: float = 10000.0,
        scale_base: float = 512.0,
        layout: str = "interleaved",
        center: float = 0.0,
    ) -> None:
        super().__init__()
        self.config = XPosConfig(head_dim=head_dim, base=base, scale_base=scale_base, layout=layout, center=center)
        self.register_buffer("inv_freq", self.build_inv_freq(), persistent=False)

    def build_inv_freq(self) -> torch.Tensor:
        return default_inv_freq(self.config.head_dim, base=self.config.base)

    def cos_sin(
        self, positions: torch.Tensor, *, downscale: bool = False, dtype: torch.dtype = torch.float32
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Cos/sin tables with the xPos factor folded in: ``(S, F)`` or ``(B, S, F)``; keys use ``downscale``."""
        c = self.config
        return xpos_cos_sin(
            positions,
            self.inv_freq.to(positions.device),
            scale_base=c.scale_base,
            center=c.center,
            downscale=downscale,
            dtype=dtype,
        )

    def max_distance(self, dtype: torch.dtype = torch.float32) -> float:
        """The largest ``|position - center|`` whose factors stay normal ``dtype`` numbers (inputs of ``dtype``)."""
        return xpos_max_distance(self.config.head_dim, scale_base=self.config.scale_base, dtype=dtype)

    def check_position_range(self, positions: torch.Tensor, x_dtype: torch.dtype, name: str = "positions") -> None:
        """Refuse positions past ``max_distance(x_dtype)`` from ``center`` (one host sync per positions tensor,
        none under ``torch.compile``/``vmap``). The factors live in the tables (float32, float64 for float64) and
        then in the output, ``x_dtype``: the narrower range of the two, which is ``x_dtype``'s."""
        c = self.config
        check_xpos_positions(
            positions, dim=c.head_dim, scale_base=c.scale_base, center=c.center, dtype=x_dtype, name=name
        )

    def rotate_one(self, x: torch.Tensor, positions: torch.Tensor, *, downscale: bool = False) -> torch.Tensor:
        """Rotate and scale one tensor ``x (B, H, S, D)`` (or ``(S, D)``, ``(H, S, D)``) at ``positions``.

        Queries use ``downscale=False``, keys ``downscale=True``.
        """
        if x.shape[-1] != self.config.head_dim:
            fail("x.shape[-1]", x.shape[-1], f"head_dim = {self.config.head_dim}")
        check_positions(positions, x)
        check_position_values(positions, x)
        self.check_position_range(positions, x.dtype)
        return self._scaled_rotation(x, positions, downscale)

    def rotate(
        self, q: torch.Tensor, k: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The ``Encoding`` hook: queries rotated and scaled up at ``q_pos``, keys rotated and scaled down at
        ``k_pos``."""
        check_qk(q, k, self.config.head_dim)
        check_positions(q_pos, q, "positions")
        check_positions(k_pos, k, "k_positions")
        self._check_position_pair(q, k, q_pos, k_pos)
        self.check_position_range(q_pos, q.dtype, "positions")
        if k_pos is not q_pos or k.dtype != q.dtype:
            self.check_position_range(k_pos, k.dtype, "positions" if k_pos is q_pos else "k_positions")
        return self._scaled_rotation(q, q_pos, False), self._scaled_rotation(k, k_pos, True)

    def _scaled_rotation(self, x: torch.Tensor, positions: torch.Tensor, downscale: bool) -> torch.Tensor:
        """``rotate_one`` for arguments already checked."""
        c = self.config
        cos, sin = cos_sin_of(
            positions,
            self.inv_freq.to(positions.device),
            scale_base=c.scale_base,
            center=c.center,
            downscale=downscale,
            dtype=table_dtype(x.dtype),
        )
        return self._apply_tables(x, cos, sin, batched=positions.dim() == 2)

    def extra_repr(self) -> str:
        c = self.config
        return (
            f"head_dim={c.head_dim}, base={c.base}, scale_base={c.scale_base}, layout={c.layout!r}, center={c.center}"
        )
