"""``ShawRelative``: learned relative position representations added to the keys and values (Shaw et al.).

Paper: Shaw, Uszkoreit, Vaswani 2018, "Self-Attention with Relative Position Representations" (NAACL,
arXiv:1803.02155), Eqs. (3)-(4): with ``a_ij = w_{clip(j - i, -K, K)}``,

    e_ij = q_i . (k_j + a^K_ij) * scale,        z_i = sum_j softmax_j(e_ij) (v_j + a^V_ij),

``w^K``, ``w^V`` of shape ``(2K + 1, D)`` shared by all heads (Sec. 3.3). Reference: the equations written out with
explicit ``(S, T, D)`` tensors in ``tests/reference/shaw.py``; tensor2tensor's
``dot_product_attention_relative`` (``_relative_attention_inner``) computes the same terms.

Shapes:
    q (B, H, S, D); q_pos (S,) or (B, S), k_pos (T,) or (B, T), integer; weights (B, H, S, T)
    -> bias (B, H, S, T), value_term (B, H, S, D), float32 (float64 for float64 inputs).

Here ``i``, ``j`` are the tokens' positions, not their indices, so KV-cache decoding and packed documents (positions
reset per document) need nothing special. The value term only runs in ``posenc.attention``'s ``eager`` backend;
``values=False`` keeps the key term alone, which every backend runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import torch
from torch import nn

from posenc._checks import check_number, check_positive_int, fail
from posenc._config import DictConfig
from posenc.encodings._base import ConfiguredModule, ScoreMod, position_reader
from posenc.functional.relative import (
    check_integer_positions,
    check_shaw_query,
    shaw_bias,
    shaw_query_scores,
    shaw_value_term,
)
from posenc.registry import register


@dataclass(frozen=True, kw_only=True, slots=True)
class ShawRelativeConfig(DictConfig):
    """Everything that defines Shaw et al.'s encoding: validated on construction, round-trips through dicts."""

    head_dim: int
    max_distance: int = 16
    values: bool = True

    def __post_init__(self) -> None:
        check_positive_int("head_dim", self.head_dim)
        check_positive_int("max_distance", self.max_distance)
        if not isinstance(self.values, bool):
            fail("values", self.values, "True (relative keys and values) or False (keys only)")


@register("shaw")
class ShawRelative(ConfiguredModule):
    """Relative position representations ``w^K`` (and ``w^V``) for the clipped distance ``k_pos - q_pos``.

    Args:
        head_dim: channels per head ``D``; the tables are ``(2 * max_distance + 1, D)``.
        max_distance: ``K``, the clipping distance (the paper finds ``K >= 2`` enough for translation; 16 here).
        values: also add ``a^V`` to the values (the paper's full form). False: keys only, no value term.

    Parameters ``relative_keys`` (``w^K``) and ``relative_values`` (``w^V``, None without values), row ``r + K``
    for distance ``r``, are shared by all heads as in the paper. Init: Xavier (Glorot) uniform, TensorFlow's
    ``get_variable`` default, which tensor2tensor's ``_generate_relative_positions_embeddings`` falls back on.

    Shapes:
        q (B, H, S, D), positions (S,) or (B, S) integer -> bias (B, H, S, T); weights (B, H, S, T) ->
        value_term (B, H, S, D).
    """

    has_bias = True
    config_class = ShawRelativeConfig
    # per layer, shared by the heads, as tensor2tensor builds it (common_attention.py's relative embeddings under each
    # layer's own variable scope; tensorflow/tensor2tensor @ bafdc1b)
    per_layer = True

    def __init__(self, head_dim: int, *, max_distance: int = 16, values: bool = True) -> None:
        super().__init__()
        self.config = ShawRelativeConfig(head_dim=head_dim, max_distance=max_distance, values=values)
        rows = 2 * max_distance + 1
        self.relative_keys = nn.Parameter(nn.init.xavier_uniform_(torch.empty(rows, head_dim)))
        self.relative_values = nn.Parameter(nn.init.xavier_uniform_(torch.empty(rows, head_dim))) if values else None
        self.has_value_term = values

    def check_positions(self, positions: torch.Tensor, length: int, batch: int, name: str = "positions") -> None:
        super().check_positions(positions, length, batch, name)
        check_integer_positions(positions, name)

    def _scale(self, scale: float | None) -> float:
        return self.config.head_dim**-0.5 if scale is None else check_number("scale", scale)

    def bias(
        self,
        q_pos: torch.Tensor,
        k_pos: torch.Tensor,
        *,
        q: torch.Tensor | None = None,
        scale: float | None = None,
    ) -> torch.Tensor:
        """``scale * q_i . w^K_{clip(k_j - q_i)}`` ``(B, H, S, T)``; ``q`` is required, ``scale`` defaults to
        ``1 / sqrt(head_dim)`` (pass the attention's own scale)."""
        # q=None is refused by shaw_bias's own check (check_shaw_query)
        return shaw_bias(cast(torch.Tensor, q), q_pos, k_pos, self.relative_keys, scale=self._scale(scale))

    def score_mod(
        self,
        q_pos: torch.Tensor,
        k_pos: torch.Tensor,
        *,
        q: torch.Tensor | None = None,
        scale: float | None = None,
    ) -> ScoreMod:
        """FlexAttention ``score_mod`` adding ``bias(q_pos, k_pos, q=q, scale=scale)[b, h, q_idx, kv_idx]``.

        Captures ``scale * q @ w^K.T`` ``(B, H, S, 2K + 1)`` and the positions, never an ``S x T`` tensor.
        """
        k_max = check_shaw_query(q, q_pos, k_pos, self.relative_keys)
        q = cast(torch.Tensor, q)  # checked: a (B, H, S, D) tensor
        qr = shaw_query_scores(q, self.relative_keys, scale=self._scale(scale))  # (B, H, S, 2K + 1)
        q_at, k_at = position_reader(q_pos.long()), position_reader(k_pos.long())

        def shaw_score_mod(score, b, h, q_idx, kv_idx):  # noqa: ANN001, ANN202 - FlexAttention's signature
            row = torch.clamp(k_at(b, kv_idx) - q_at(b, q_idx), -k_max, k_max) + k_max
            return score + qr[b, h, q_idx, row].to(score.dtype)

        return shaw_score_mod

    def value_term(self, weights: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor | None:
        """``sum_j weights_ij w^V_{clip(k_j - q_i)}`` ``(B, H, S, D)``, to add to ``weights @ v``; None without
        values."""
        if self.relative_values is None:
            return None
        return shaw_value_term(weights, q_pos, k_pos, self.relative_values)

    def extra_repr(self) -> str:
        c = self.config
        return f"head_dim={c.head_dim}, max_distance={c.max_distance}, values={c.values}"
