"""``ALiBi`` and ``ALiBi2D``: a fixed linear penalty on the attention scores, growing with query-key distance.

Paper: Press, Smith, Lewis 2022, "Train Short, Test Long: Attention with Linear Biases Enables Input Length
Extrapolation" (ICLR 2022, arXiv:2108.12409); slope interpolation from Al-Khateeb et al. 2023, "Position
Interpolation Improves ALiBi Extrapolation" (arXiv:2310.13017); 2-D form from Fuller et al. 2023, "CROMA"
(NeurIPS 2023, arXiv:2311.00566).
Reference implementations: ofirpress/attention_with_linear_biases ``get_slopes``, Hugging Face BLOOM
``build_alibi_tensor``, antofuller/CROMA ``get_2dalibi``; see ``posenc.functional.alibi`` for how each was checked.

Shapes:
    positions (S,) or (B|1, S) for ``ALiBi``; (S, 2) or (B|1, S, 2) for ``ALiBi2D`` (columns x, y);
    bias (B|1, H, S, T) float32; score_mod(score, b, h, q_idx, kv_idx) -> score + bias[b, h, q_idx, kv_idx].
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import torch

from posenc._checks import check_positive_int, fail
from posenc._config import DictConfig
from posenc.encodings._base import ConfiguredModule, ScoreMod, check_grid_positions, position_reader, shape_stub
from posenc.functional.alibi import (
    alibi_2d_bias,
    alibi_2d_distance,
    alibi_bias,
    alibi_distance,
    alibi_slopes,
    check_alibi_positions,
    interpolated_slopes,
)
from posenc.registry import register


@dataclass(frozen=True, kw_only=True, slots=True)
class ALiBiConfig(DictConfig):
    """Everything that defines an ALiBi: validated on construction, round-trips through ``to_dict``/``from_dict``.

    ``eval_len`` is the length the model is being evaluated at (the lab sets it per evaluation length); with
    ``train_len`` also given and ``eval_len > train_len`` the slopes are scaled by ``train_len / eval_len``.
    ``train_len`` alone changes nothing; ``eval_len`` alone is an error (there is nothing to scale against).
    """

    num_heads: int
    symmetric: bool = False
    train_len: int | None = None
    eval_len: int | None = None

    def __post_init__(self) -> None:
        check_positive_int("num_heads", self.num_heads)
        if not isinstance(self.symmetric, bool):
            fail("symmetric", self.symmetric, "True (bidirectional, -m|q - k|) or False (causal, -m(q - k))")
        if self.train_len is not None:
            check_positive_int("train_len", self.train_len)
        if self.eval_len is not None:
            check_positive_int("eval_len", self.eval_len)
            if self.train_len is None:
                fail("eval_len", self.eval_len, "None unless train_len is also set (slopes scale by their ratio)")


@dataclass(frozen=True, kw_only=True, slots=True)
class ALiBi2DConfig(DictConfig):
    """2-D ALiBi (CROMA): only the number of heads."""

    num_heads: int

    def __post_init__(self) -> None:
        check_positive_int("num_heads", self.num_heads)


class _SlopeModule(ConfiguredModule):
    """Keeps the slopes a float32 buffer rebuilt from the config through ``.to(dtype)``, ``.half()``, device moves
    and ``to_empty()`` (as ``FrequencyModule`` does for ``inv_freq``): a bf16 slope would misplace every bias."""

    has_bias = True
    _slopes: torch.Tensor

    def _init_slopes(self) -> None:
        self.register_buffer("_slopes", self.build_slopes(), persistent=False)

    def build_slopes(self) -> torch.Tensor:
        """The float32 slopes ``(H,)`` for this module's config (on CPU)."""
        return alibi_slopes(self.config.num_heads)

    @property
    def slopes(self) -> torch.Tensor:
        """The per-head slopes in use, ``(H,)`` float32 (interpolated where the config says so)."""
        return self._slopes

    def _apply(self, fn, recurse=True):  # noqa: ANN001 - nn.Module's hook for .to/.cuda/.half/to_empty
        super()._apply(fn, recurse)
        self._slopes = self.build_slopes().to(self._slopes.device)
        return self

    def forward(self, positions: torch.Tensor, k_positions: torch.Tensor | None = None) -> torch.Tensor:
        """The bias ``(B|1, H, S, T)``; keys use ``k_positions`` if given, else ``positions``."""
        bias = self.bias(positions, positions if k_positions is None else k_positions)
        return cast(torch.Tensor, bias)  # has_bias: never None

    def extra_repr(self) -> str:
        return ", ".join(f"{k}={v!r}" for k, v in self.config.to_dict().items())


@register("alibi")
class ALiBi(_SlopeModule):
    """ALiBi: head ``h`` adds ``-m_h (q - k)`` to the score of query position ``q`` and key position ``k``.

    Args:
        num_heads: query heads ``H``; slopes follow the paper's ``get_slopes`` (any ``H``, not only powers of 2).
        symmetric: ``False`` for the paper's causal form (use with a causal mask: later keys get a positive bias);
            ``True`` for ``-m_h |q - k|``, the bidirectional form for encoders.
        train_len: training length, for slope interpolation.
        eval_len: evaluation length; the lab builds the encoding with the length it evaluates at. When it exceeds
            ``train_len`` the slopes are multiplied by ``train_len / eval_len`` (Al-Khateeb et al. 2023).

    Shapes:
        q_pos (S,) or (B|1, S), k_pos (T,) or (B|1, T) -> bias (B|1, H, S, T) float32.
    """

    config_class = ALiBiConfig

    def __init__(
        self, num_heads: int, *, symmetric: bool = False, train_len: int | None = None, eval_len: int | None = None
    ) -> None:
        super().__init__()
        self.config = ALiBiConfig(num_heads=num_heads, symmetric=symmetric, train_len=train_len, eval_len=eval_len)
        self._init_slopes()

    def build_slopes(self) -> torch.Tensor:
        c, slopes = self.config, alibi_slopes(self.config.num_heads)
        if c.train_len is None or c.eval_len is None:
            return slopes
        return interpolated_slopes(slopes, train_len=c.train_len, eval_len=c.eval_len)

    def bias(
        self, q_pos: torch.Tensor, k_pos: torch.Tensor, *, q: torch.Tensor | None = None, scale: float | None = None
    ) -> torch.Tensor:
        """The materialised bias ``(B|1, H, S, T)`` float32; ``q`` (optional) is only checked for its head count."""
        self.check_heads(q)
        return alibi_bias(q_pos, k_pos, self._slopes, symmetric=self.config.symmetric)

    def score_mod(
        self, q_pos: torch.Tensor, k_pos: torch.Tensor, *, q: torch.Tensor | None = None, scale: float | None = None
    ) -> ScoreMod:
        """FlexAttention ``score_mod`` adding ``bias(q_pos, k_pos)[b, h, q_idx, kv_idx]`` (bit for bit eagerly)."""
        self.check_heads(q)
        check_alibi_positions(q_pos, k_pos)
        slopes, symmetric = self._slopes.to(q_pos.device), self.config.symmetric
        q_at, k_at = position_reader(q_pos), position_reader(k_pos)

        def alibi_mod(score, b, h, q_idx, kv_idx):  # noqa: ANN001, ANN202 - FlexAttention's signature
            d = alibi_distance(q_at(b, q_idx), k_at(b, kv_idx), symmetric=symmetric)
            return score + -(d * slopes[h])

        return alibi_mod


@register("alibi_2d")
class ALiBi2D(_SlopeModule):
    """2-D ALiBi (CROMA): head ``h`` adds ``-m_h * ||p_q - p_k||``, the Euclidean distance between grid positions.

    Positions come from ``posenc.functional.grid_positions(W, H)``; tokens without a grid position (a cls token)
    are left out, as for ``rope_axial``.

    Args:
        num_heads: query heads ``H``; slopes as ``ALiBi``'s (CROMA reuses the paper's ``get_slopes``).

    Shapes:
        q_pos (S, 2) or (B|1, S, 2), k_pos (T, 2) or (B|1, T, 2) -> bias (B|1, H, S, T) float32.
    """

    config_class = ALiBi2DConfig
    position_kind = "grid"

    def __init__(self, num_heads: int) -> None:
        super().__init__()
        self.config = ALiBi2DConfig(num_heads=num_heads)
        self._init_slopes()

    def check_positions(self, positions: torch.Tensor, length: int, batch: int, name: str = "positions") -> None:
        check_grid_positions(positions, shape_stub(batch, length), 2, name)

    def bias(
        self, q_pos: torch.Tensor, k_pos: torch.Tensor, *, q: torch.Tensor | None = None, scale: float | None = None
    ) -> torch.Tensor:
        """The materialised bias ``(B|1, H, S, T)`` float32; ``q`` (optional) is only checked for its head count."""
        self.check_heads(q)
        return alibi_2d_bias(q_pos, k_pos, self._slopes)

    def score_mod(
        self, q_pos: torch.Tensor, k_pos: torch.Tensor, *, q: torch.Tensor | None = None, scale: float | None = None
    ) -> ScoreMod:
        """FlexAttention ``score_mod`` adding ``bias(q_pos, k_pos)[b, h, q_idx, kv_idx]`` (bit for bit eagerly)."""
        self.check_heads(q)
        check_alibi_positions(q_pos, k_pos, grid=True)
        slopes = self._slopes.to(q_pos.device)
        # (..., L, 2) -> contiguous x and y columns (..., L), so each read is one flat index
        qx, qy = (position_reader(q_pos[..., a].contiguous()) for a in range(2))
        kx, ky = (position_reader(k_pos[..., a].contiguous()) for a in range(2))

        def alibi_2d_mod(score, b, h, q_idx, kv_idx):  # noqa: ANN001, ANN202 - FlexAttention's signature
            d = alibi_2d_distance(qx(b, q_idx), qy(b, q_idx), kx(b, kv_idx), ky(b, kv_idx))
            return score + -(d * slopes[h])

        return alibi_2d_mod
