"""``T5Bias``: T5's learned, bucketed relative position bias, one scalar per (distance bucket, head).

Paper: Raffel et al. 2020, "Exploring the Limits of Transfer Learning with a Unified Text-to-Text Transformer"
(JMLR, arXiv:1910.10683), Sec. 2.1.
Reference implementation: Hugging Face transformers ``T5Attention`` (``_relative_position_bucket``,
``compute_bias``); the tests compare buckets and biases bit for bit, with weights copied from HF.

Shapes:
    q_pos (S,) or (B, S), k_pos (T,) or (B, T), integer -> bias (B|1, H, S, T) float32.

Hugging Face conventions: the relative position is ``key - query`` (``memory_position - context_position``);
``compute_bias(S, T, past_seen_tokens=p)`` places the queries at ``p .. p + S - 1`` and the keys at
``0 .. T - 1``; the decoder (``is_decoder=True``) is ``bidirectional=False``, where keys after the query share
distance 0's bucket (the causal mask hides them). T5 does not scale ``q . k`` (its ``scaling`` is 1.0, folded into
the initialisation): pass ``scale=1.0`` to ``posenc.attention`` to reproduce a T5 checkpoint.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from posenc._checks import check_positive_int
from posenc._config import DictConfig
from posenc.encodings._base import ConfiguredModule, ScoreMod, position_reader
from posenc.functional.relative import (
    check_integer_positions,
    check_position_pair,
    check_t5_buckets,
    t5_bias,
    t5_relative_position_bucket,
)
from posenc.registry import register


@dataclass(frozen=True, kw_only=True, slots=True)
class T5BiasConfig(DictConfig):
    """Everything that defines a T5 bias: validated on construction, round-trips through ``to_dict``/``from_dict``.

    HF ``T5Config`` names: ``num_heads``, ``relative_attention_num_buckets``, ``relative_attention_max_distance``,
    and ``bidirectional = not is_decoder``.
    """

    num_heads: int
    num_buckets: int = 32
    max_distance: int = 128
    bidirectional: bool = True

    def __post_init__(self) -> None:
        check_positive_int("num_heads", self.num_heads)
        check_t5_buckets(num_buckets=self.num_buckets, max_distance=self.max_distance, bidirectional=self.bidirectional)


@register("t5")
class T5Bias(ConfiguredModule):
    """T5 relative attention bias: ``bias[b, h, i, j] = relative_attention_bias.weight[bucket(k_j - q_i), h]``.

    Args:
        num_heads: attention heads ``H``; one learned scalar per bucket and head.
        num_buckets: distance buckets (HF ``relative_attention_num_buckets``); half per direction when bidirectional.
        max_distance: distances at or beyond it share the last bucket (HF ``relative_attention_max_distance``).
        bidirectional: True for the encoder; False for the decoder (causal), where only ``k <= q`` is bucketed.

    The table is ``relative_attention_bias = nn.Embedding(num_buckets, num_heads)``, HF's name and layout, so the
    state dict entry of a T5 layer with ``has_relative_attention_bias=True`` loads as is. Init: ``nn.Embedding``'s
    N(0, 1); HF initialises N(0, factor / sqrt(d_model)), which a loaded checkpoint overrides anyway.

    Shapes:
        q_pos (S,) or (B, S), k_pos (T,) or (B, T), integer -> bias (B|1, H, S, T) float32.
    """

    has_bias = True
    config_class = T5BiasConfig

    def __init__(
        self, num_heads: int, *, num_buckets: int = 32, max_distance: int = 128, bidirectional: bool = True
    ) -> None:
        super().__init__()
        self.config = T5BiasConfig(
            num_heads=num_heads, num_buckets=num_buckets, max_distance=max_distance, bidirectional=bidirectional
        )
        self.relative_attention_bias = nn.Embedding(num_buckets, num_heads)

    def check_positions(self, positions: torch.Tensor, length: int, batch: int, name: str = "positions") -> None:
        super().check_positions(positions, length, batch, name)
        check_integer_positions(positions, name)

    def bias(
        self,
        q_pos: torch.Tensor,
        k_pos: torch.Tensor,
        *,
        q: torch.Tensor | None = None,
        scale: float | None = None,
    ) -> torch.Tensor:
        """The bias ``(B|1, H, S, T)`` for queries at ``q_pos`` and keys at ``k_pos``; ``q`` (optional) is only
        checked for its head count."""
        self.check_heads(q)
        c = self.config
        return t5_bias(
            q_pos,
            k_pos,
            self.relative_attention_bias.weight,
            bidirectional=c.bidirectional,
            num_buckets=c.num_buckets,
            max_distance=c.max_distance,
        )

    def score_mod(
        self,
        q_pos: torch.Tensor,
        k_pos: torch.Tensor,
        *,
        q: torch.Tensor | None = None,
        scale: float | None = None,
    ) -> ScoreMod:
        """FlexAttention ``score_mod`` adding ``bias(q_pos, k_pos)[b, h, q_idx, kv_idx]``; captures only the
        ``(H, num_buckets)`` table, the positions and the config's ints and bool."""
        self.check_heads(q)
        check_position_pair(q_pos, k_pos)  # validates dtypes, ranks and batch sizes without an S x T tensor
        # Tensors, ints and bools only, never the config object (tests/test_attention_flex_captures.py)
        c = self.config
        bidirectional, num_buckets, max_distance = c.bidirectional, c.num_buckets, c.max_distance
        per_head = self.relative_attention_bias.weight.t()  # (H, num_buckets)
        q_at, k_at = position_reader(q_pos.long()), position_reader(k_pos.long())

        def t5_score_mod(score, b, h, q_idx, kv_idx):  # noqa: ANN001, ANN202 - FlexAttention's signature
            bucket = t5_relative_position_bucket(
                k_at(b, kv_idx) - q_at(b, q_idx),
                bidirectional=bidirectional,
                num_buckets=num_buckets,
                max_distance=max_distance,
            )
            return score + per_head[h, bucket].to(score.dtype)

        return t5_score_mod

    def forward(self, q_pos: torch.Tensor, k_pos: torch.Tensor | None = None) -> torch.Tensor:
        """The bias for ``q_pos`` against ``k_pos`` (default: the same positions)."""
        return self.bias(q_pos, q_pos if k_pos is None else k_pos)

    def extra_repr(self) -> str:
        c = self.config
        return (
            f"num_heads={c.num_heads}, num_buckets={c.num_buckets}, max_distance={c.max_distance}, "
            f"bidirectional={c.bidirectional}"
        )
