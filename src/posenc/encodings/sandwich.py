"""``Sandwich``: the dot product of sinusoidal position embeddings as a fixed, parameter-free score bias.

Paper: Chi, Fan, Rudnicky, Ramadge 2023, "Dissecting Transformer Length Extrapolation via the Lens of Receptive
Field Analysis" (ACL 2023, arXiv:2212.10356): head ``h`` adds ``p_{i/r_h} . p_{j/r_h} - d'/2 =
sum_k (cos((i - j) w_k / r_h) - 1)``, ``p`` the sinusoidal embedding of dimension ``d'`` (``pe_dim``), ``r_h`` a
per-head compression ratio. Checked against dot products of embeddings built with Vaswani et al.'s formula
(``tests/reference/sandwich.py``). See ``posenc.functional.sandwich`` for the default ratios and the numerics.

Shapes:
    positions (S,) or (B|1, S), integer or float; bias (B|1, H, S, T) float32;
    score_mod(score, b, h, q_idx, kv_idx) -> score + bias[b, h, q_idx, kv_idx].
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from posenc._checks import check_number, check_positive_int, fail
from posenc._config import DictConfig
from posenc.encodings._base import ConfiguredModule, ScoreMod, position_reader
from posenc.functional.alibi import alibi_distance, check_alibi_positions
from posenc.functional.sandwich import (
    check_sandwich_ratios,
    sandwich_bias,
    sandwich_frequencies,
    sandwich_kernel,
    sandwich_ratios,
)
from posenc.registry import register


@dataclass(frozen=True, kw_only=True, slots=True)
class SandwichConfig(DictConfig):
    """Everything that defines a Sandwich bias: validated on construction, round-trips through dicts.

    ``ratios`` is stored as a tuple of floats and written out as a list; None means ``8h / H`` for ``h = 1..H``.
    """

    num_heads: int
    pe_dim: int = 128
    base: float = 10000.0
    ratios: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        check_positive_int("num_heads", self.num_heads)
        check_positive_int("pe_dim", self.pe_dim)
        if self.pe_dim % 2:
            fail("pe_dim", self.pe_dim, "an even number (a sine and a cosine per frequency)")
        check_number("base", self.base, above=1.0)
        if self.ratios is not None:
            object.__setattr__(self, "ratios", check_sandwich_ratios(self.ratios, self.num_heads))

    def head_ratios(self) -> tuple[float, ...]:
        """The compression ratio of each head: ``ratios``, or ``8h / H``."""
        return sandwich_ratios(self.num_heads) if self.ratios is None else self.ratios


@register("sandwich")
class Sandwich(ConfiguredModule):
    """Sandwich: head ``h`` adds ``sum_k (cos((q - k) w_k / r_h) - 1)``, ``w_k = base ** (-2k / pe_dim)``.

    Args:
        num_heads: query heads ``H``.
        pe_dim: ``d'``, the dimension of the sinusoidal embeddings whose dot product is the bias (``d'/2``
            frequencies); 128 by default.
        base: the sinusoids' wavelength scale (10000, as in Vaswani et al.).
        ratios: per-head compression ratios ``r_h > 0``; None for ``8h / H`` (``h = 1..H``). All 1 gives the plain
            ``p_i . p_j - d'/2`` for every head.

    No parameters; the float32 frequency table ``(H, d'/2)`` is a buffer rebuilt from the config on device and dtype
    moves (as ALiBi's slopes), never saved. Symmetric in ``q - k``: causal and bidirectional attention alike.

    Shapes:
        q_pos (S,) or (B|1, S), k_pos (T,) or (B|1, T) -> bias (B|1, H, S, T) float32.
    """

    has_bias = True
    config_class = SandwichConfig
    _frequencies: torch.Tensor

    def __init__(
        self, num_heads: int, *, pe_dim: int = 128, base: float = 10000.0, ratios: tuple[float, ...] | None = None
    ) -> None:
        super().__init__()
        self.config = SandwichConfig(num_heads=num_heads, pe_dim=pe_dim, base=base, ratios=ratios)
        self.register_buffer("_frequencies", self.build_frequencies(), persistent=False)

    def build_frequencies(self) -> torch.Tensor:
        """The float32 frequencies ``w_k / r_h``, ``(H, pe_dim / 2)``, for this module's config (default device)."""
        c = self.config
        return sandwich_frequencies(c.pe_dim, c.head_ratios(), base=c.base)

    @property
    def frequencies(self) -> torch.Tensor:
        """The per-head frequencies in use, ``(H, pe_dim / 2)`` float32."""
        return self._frequencies

    def _apply(self, fn, recurse=True):  # noqa: ANN001 - nn.Module's hook for .to/.cuda/.half/to_empty
        super()._apply(fn, recurse)
        self._frequencies = self.build_frequencies().to(self._frequencies.device)
        return self

    def bias(
        self, q_pos: torch.Tensor, k_pos: torch.Tensor, *, q: torch.Tensor | None = None, scale: float | None = None
    ) -> torch.Tensor:
        """The materialised bias ``(B|1, H, S, T)`` float32; ``q`` (if given) must have ``num_heads`` heads,
        ``scale`` is unused."""
        self.check_heads(q)
        return sandwich_bias(q_pos, k_pos, self._frequencies)

    def score_mod(
        self, q_pos: torch.Tensor, k_pos: torch.Tensor, *, q: torch.Tensor | None = None, scale: float | None = None
    ) -> ScoreMod:
        """FlexAttention ``score_mod`` adding ``bias(q_pos, k_pos)[b, h, q_idx, kv_idx]`` (bit for bit eagerly);
        captures the ``(H, pe_dim / 2)`` table and the positions, summing ``pe_dim / 2`` sines per score."""
        self.check_heads(q)
        check_alibi_positions(q_pos, k_pos)
        # The buffer itself, halved per score: under torch.compile a score_mod that captures a tensor computed in
        # the same graph fails to lower on CPU (torch 2.13), one that captures a buffer works.
        frequencies = self._frequencies.to(q_pos.device)  # (H, F)
        q_at, k_at = position_reader(q_pos), position_reader(k_pos)

        def sandwich_mod(score, b, h, q_idx, kv_idx):  # noqa: ANN001, ANN202 - FlexAttention's signature
            d = alibi_distance(q_at(b, q_idx), k_at(b, kv_idx), symmetric=True)
            return score + sandwich_kernel(d, frequencies[h] * 0.5).to(score.dtype)

        return sandwich_mod

    def forward(self, positions: torch.Tensor, k_positions: torch.Tensor | None = None) -> torch.Tensor:
        """The bias ``(B|1, H, S, T)``; keys use ``k_positions`` if given, else ``positions``."""
        return self.bias(positions, positions if k_positions is None else k_positions)

    def extra_repr(self) -> str:
        return ", ".join(f"{k}={v!r}" for k, v in self.config.to_dict().items())
