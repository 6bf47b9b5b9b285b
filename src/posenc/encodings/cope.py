"""``CoPE``: contextual positions, counted by gates ``sigmoid(q . k)`` over the causal past, as attention biases.

Paper: Golovneva, Wang, Weston, Sukhbaatar 2024, "Contextual Position Encoding: Learning to Count What's Important"
(arXiv:2405.18719), Eqs. (3)-(7): ``p_ij = min(sum_{t=j..i} sigmoid(q_i . k_t), p_max)``, ``e[p]`` interpolated
between ``e[floor p]`` and ``e[ceil p]``, logit ``q_i . (k_j + e[p_ij])``.
Reference implementation: facebookresearch/RAM ``projects/cope/src/cope/context_position.py`` (default options);
checked against the equations written out with loops in ``tests/reference/cope.py``. See ``posenc.functional.cope``
for the numerics (scaling, masking, interpolation).

CoPE ignores the tokens' positions: positions come from the content, so ``q_pos``/``k_pos`` are accepted (and
checked by ``posenc.attention``) but unused, and shifting them changes nothing. The bias reads every key, so the
encoding sets ``needs_keys``: ``posenc.attention`` passes it the keys and the attention mask (documents never count
each other's tokens; KV-cache queries are the last keys), and only the ``eager`` and ``sdpa`` backends run it
(a FlexAttention ``score_mod`` sees one key at a time, not the sum over the keys between query and key). The
counting runs over the causal past, the only form the paper defines: ``causal=False`` is refused.

Shapes:
    q (B, H, S, D), k (B, Hkv, T, D); mask (B|1, 1|H, S, T) bool; bias (B, H, S, T) float32.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import torch
from torch import nn

from posenc._checks import check_positions, check_positive_int, fail
from posenc._config import DictConfig
from posenc.encodings._base import ConfiguredModule
from posenc.functional.cope import check_cope_inputs, cope_bias, cope_positions
from posenc.registry import register


@dataclass(frozen=True, kw_only=True, slots=True)
class CoPEConfig(DictConfig):
    """Everything that defines a CoPE: validated on construction, round-trips through ``to_dict``/``from_dict``.

    ``max_position`` is ``p_max``, the largest position (the table has ``p_max + 1`` rows, positions 0..p_max);
    ``num_heads`` is needed for ``per_head`` tables and, when given, checked against the queries.
    """

    head_dim: int
    max_position: int
    num_heads: int | None = None
    per_head: bool = False

    def __post_init__(self) -> None:
        check_positive_int("head_dim", self.head_dim)
        check_positive_int("max_position", self.max_position)
        if not isinstance(self.per_head, bool):
            fail("per_head", self.per_head, "False (one table shared by the heads, the reference's) or True")
        if self.num_heads is not None:
            check_positive_int("num_heads", self.num_heads)
        elif self.per_head:
            fail("num_heads", None, "the number of heads: per_head=True keeps one table per head")


@register("cope")
class CoPE(ConfiguredModule):
    """Contextual position encoding: ``bias = scale * q_i . e[p_ij]`` with ``p_ij`` counted by gates.

    Args:
        head_dim: channels per head ``D``, the width of the position embeddings.
        max_position: ``p_max``, where counts are clipped. None takes ``max_len``, as the reference does when
            its ``--cope-npos`` is not set (``block_size + 1`` embeddings).
        max_len: the training length (a model fact ``posenc.build`` passes); used only when ``max_position`` is
            None, and not stored.
        num_heads: query heads ``H``; required for ``per_head``, checked against ``q`` whenever given.
        per_head: one table per head ``(H, p_max + 1, D)`` instead of the reference's one shared table.

    Parameter ``embeddings``: ``(p_max + 1, D)`` (or ``(H, p_max + 1, D)``), row ``p`` is ``e[p]``. Init: zeros,
    as the reference's ``pos_emb`` (the position term starts at 0 and grows from the gradient to the table).

    Shapes:
        q (B, H, S, D), k (B, Hkv, T, D), mask (B|1, 1|H, S, T) bool -> bias (B, H, S, T) float32 (float64 for
        float64 q).
    """

    has_bias = True
    needs_keys = True
    causal_only = True
    config_class = CoPEConfig
    # per layer, as the authors' code runs it (facebookresearch/RAM projects/cope: one table per ContextPosSelfAttn,
    # --cope-shared off by default; @ e6f051f)
    per_layer = True

    def __init__(
        self,
        head_dim: int,
        *,
        max_position: int | None = None,
        max_len: int | None = None,
        num_heads: int | None = None,
        per_head: bool = False,
    ) -> None:
        super().__init__()
        if max_position is None:
            if max_len is None:
                fail("max_position", None, "p_max, a positive integer (or max_len, the training length, to use it)")
            max_position = check_positive_int("max_len", max_len)
        self.config = CoPEConfig(head_dim=head_dim, max_position=max_position, num_heads=num_heads, per_head=per_head)
        rows = (num_heads,) if per_head else ()
        self.embeddings = nn.Parameter(torch.zeros(*rows, max_position + 1, head_dim))

    def bias(
        self,
        q_pos: torch.Tensor,
        k_pos: torch.Tensor,
        *,
        q: torch.Tensor | None = None,
        scale: float | None = None,
        k: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``scale * q_i . e[p_ij]`` ``(B, H, S, T)``, 0 where a query does not see a key.

        ``q`` and ``k`` are required (the gates are ``sigmoid(scale * q . k)``); ``scale`` defaults to
        ``1 / sqrt(head_dim)`` (pass the attention's own); ``mask`` (True where a key is visible, e.g. the same
        document) is applied on top of the causal mask, queries being the last ``S`` keys. ``q_pos``/``k_pos``
        are unused (CoPE's positions come from the content) but, when given, refused like every encoding's unless
        exact and finite, so a bad positions tensor fails here as it would with any other encoding.
        """
        for name, pos in (("q_pos", q_pos), ("k_pos", k_pos)):
            if pos is not None:
                check_positions(pos, name)
        self._check_content(q, k)
        q, k = cast(torch.Tensor, q), cast(torch.Tensor, k)  # checked by _check_content
        return cope_bias(q, k, self.embeddings, scale=scale, mask=mask)

    def positions(
        self, q: torch.Tensor, k: torch.Tensor, *, scale: float | None = None, mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The contextual positions ``p_ij`` ``(B, H, S, T)`` in ``[0, max_position]``: what each head counts."""
        self._check_content(q, k)
        return cope_positions(q, k, max_position=self.config.max_position, scale=scale, mask=mask)

    def _check_content(self, q: object, k: object) -> None:
        for name, x in (("q", q), ("k", k)):
            if not isinstance(x, torch.Tensor):
                fail(name, type(x).__name__, f"the {'queries' if name == 'q' else 'keys'} (B, heads, length, "
                     f"{self.config.head_dim}): CoPE's positions count gates sigmoid(q . k)")
        check_cope_inputs(q, k)
        q = cast(torch.Tensor, q)  # checked by the loop
        self.check_heads(q)
        if q.shape[-1] != self.config.head_dim:
            fail("q.shape[-1]", q.shape[-1], f"head_dim = {self.config.head_dim}")

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, *, scale: float | None = None, mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The bias ``(B, H, S, T)`` for queries ``q`` against keys ``k`` (no token positions needed)."""
        self._check_content(q, k)
        return cope_bias(q, k, self.embeddings, scale=scale, mask=mask)

    def extra_repr(self) -> str:
        return ", ".join(f"{key}={value!r}" for key, value in self.config.to_dict().items())
