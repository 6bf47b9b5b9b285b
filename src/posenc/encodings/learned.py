"""``LearnedPositions`` and ``LearnedPositions2D``: a trained table of position vectors added to the tokens.

Papers: Gehring et al. 2017, "Convolutional Sequence to Sequence Learning" (arXiv:1705.03122) and GPT / BERT
(1-D tables); Dosovitskiy et al. 2021, "An Image is Worth 16x16 Words" (ViT, arXiv:2010.11929) (patch-grid
tables, resized by 2-D interpolation for a new resolution, section 3.2).
Reference implementations: GPT-2's ``wpe`` / BERT's ``position_embeddings`` (1-D); timm ``VisionTransformer.pos_embed``
with ``resample_abs_pos_embed`` and MAE's ``interpolate_pos_embed`` (2-D). Resizing is checked against the
hand-written interpolations in ``tests/reference/resize.py``.

Shapes:
    x (B, S, D); positions (S,) or (B, S) (1-D), (S, 2) or (B, S, 2) with columns (x, y) (2-D) -> (B, S, D).
    table (max_len, D) (1-D); (H, W, D) for grid_size (W, H), token (x, y) reads table[y, x] (2-D).

Positions are integers (or whole-number floats) inside the table; anything else is a ``ValueError`` telling you to
``.resized(...)`` the table. The check reads the positions (one device sync); it is skipped while
``torch.compile`` traces and on the meta device.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torch import nn

from posenc._checks import check_number, check_positions, check_positive_int, fail
from posenc._config import DictConfig
from posenc.encodings._base import ConfiguredModule, check_embed, check_grid
from posenc.functional.learned import check_grid_size, resize_table_1d, resize_table_2d
from posenc.registry import register


def table_indices(positions: torch.Tensor, limits: tuple[int, ...], hint: str) -> torch.Tensor:
    """``positions (..., n)`` as int64 indices, each column ``a`` checked to be a whole number in ``[0, limits[a])``.

    ``hint`` ends the error message (how to get a larger table).
    """
    check_positions(positions, finite=False)  # the range check below reads the values and catches NaN and inf
    if torch.compiler.is_compiling() or positions.is_meta:
        return positions.long()
    limit = torch.tensor(limits, device=positions.device)  # (n,)
    outside = (positions < 0) | (positions >= limit)  # (..., n); NaN compares False, caught below
    fractional = positions != positions.round() if positions.is_floating_point() else torch.zeros_like(outside)
    if (outside | fractional).any():  # the one sync
        bad = fractional if fractional.any() else outside
        where = tuple(bad.nonzero()[0].tolist())
        index = where[:-1] if len(limits) == 1 else where  # 1-D positions were given a trailing axis of 1
        name = f"positions[{', '.join(map(str, index))}]"
        value = positions[where].item()
        if bad is fractional:
            fail(name, value, "a whole number: a learned table has entries at integer positions only")
        what = "a position" if len(limits) == 1 else ("an x position", "a y position")[where[-1]]
        fail(name, value, f"{what} in [0, {limits[where[-1]]}); {hint}")
    return positions.long()


@dataclass(frozen=True, kw_only=True, slots=True)
class LearnedConfig(DictConfig):
    """A learned 1-D table: ``max_len`` positions of ``dim`` channels, initialised ``N(0, init_std)`` cut at 2 std."""

    dim: int
    max_len: int
    init_std: float = 0.02

    def __post_init__(self) -> None:
        check_positive_int("dim", self.dim)
        check_positive_int("max_len", self.max_len)
        check_number("init_std", self.init_std, above=0.0)


@dataclass(frozen=True, kw_only=True, slots=True)
class Learned2DConfig(DictConfig):
    """A learned grid table for ``grid_size = (W, H)`` patches of ``dim`` channels."""

    dim: int
    grid_size: tuple[int, int]
    init_std: float = 0.02

    def __post_init__(self) -> None:
        check_positive_int("dim", self.dim)
        object.__setattr__(self, "grid_size", check_grid_size("grid_size", self.grid_size))  # lists from JSON
        check_number("init_std", self.init_std, above=0.0)


class _Learned(ConfiguredModule):
    """Shared shell: one parameter ``table``, truncated-normal init, ``forward`` = ``embed``."""

    table: nn.Parameter

    def reset_parameters(self) -> None:
        """Redraw the table from ``N(0, init_std)`` truncated at 2 std (BERT's and ViT's init)."""
        std = self.config.init_std
        nn.init.trunc_normal_(self.table, std=std, a=-2 * std, b=2 * std)

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.embed(x, positions)

    def _with_table(self, config: DictConfig, table: torch.Tensor):  # noqa: ANN202 - returns type(self)
        """A new module of this class for ``config``, holding ``table`` (no throwaway random init)."""
        with torch.device("meta"):
            new = type(self).from_config(config)
        new.table = nn.Parameter(table, requires_grad=self.table.requires_grad)
        new.train(self.training)
        return new


@register("learned")
class LearnedPositions(_Learned):
    """A trained position table added to the token embeddings: ``x + table[positions]`` (GPT-2, BERT).

    Args:
        dim: model width ``D``.
        max_len: number of table rows; positions must lie in ``[0, max_len)``. ``resized(n)`` interpolates.
        init_std: standard deviation of the initial table (0.02, GPT-2 / BERT).

    Shapes:
        x (B, S, D), positions (S,) or (B, S), integer -> (B, S, D), dtype of x; table (max_len, D).
    """

    config_class = LearnedConfig

    def __init__(self, dim: int, max_len: int, *, init_std: float = 0.02) -> None:
        super().__init__()
        self.config = LearnedConfig(dim=dim, max_len=max_len, init_std=init_std)
        self.table = nn.Parameter(torch.empty(max_len, dim))
        self.reset_parameters()

    def embed(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """The ``Encoding`` hook: ``x (B, S, D)`` plus the table rows at ``positions``."""
        check_embed(self, x, positions)
        hint = f"call .resized(new_len) for a table longer than max_len={self.config.max_len}"
        index = table_indices(positions.unsqueeze(-1), (self.config.max_len,), hint)[..., 0]  # (S,) or (B, S)
        return x + self.table[index].to(x.dtype)  # (S, D) or (B, S, D), broadcast over the batch

    def resized(self, new_len: int) -> LearnedPositions:
        """A new module whose table is this one linearly interpolated to ``new_len`` rows (this one is untouched).

        Row ``j`` of the new table samples the old one at ``(j + 0.5) * max_len / new_len - 0.5``.
        """
        check_positive_int("new_len", new_len)
        table = resize_table_1d(self.table.detach(), new_len)  # (new_len, D)
        return self._with_table(dataclasses.replace(self.config, max_len=new_len), table)

    def extra_repr(self) -> str:
        c = self.config
        return f"dim={c.dim}, max_len={c.max_len}, init_std={c.init_std}"


@register("learned_2d")
class LearnedPositions2D(_Learned):
    """A trained table over a ``(W, H)`` patch grid added to the patch embeddings: ``x + table[y, x]`` (ViT).

    Pass patch tokens only; a cls token's position vector belongs to the model. ``resized((W', H'))`` interpolates
    the table bicubically for a new resolution, as ViT fine-tuning does.

    Args:
        dim: model width ``D``.
        grid_size: ``(W, H)``, fastest-varying axis first, as ``grid_positions(W, H)``.
        init_std: standard deviation of the initial table (0.02, ViT).

    Shapes:
        x (B, S, D), positions (S, 2) or (B, S, 2), integer columns (x, y) -> (B, S, D), dtype of x;
        table (H, W, D).
    """

    config_class = Learned2DConfig
    position_kind = "grid"  # positions (S, 2) / (B, S, 2), see Encoding

    def __init__(self, dim: int, grid_size: tuple[int, int], *, init_std: float = 0.02) -> None:
        super().__init__()
        self.config = Learned2DConfig(dim=dim, grid_size=grid_size, init_std=init_std)
        w, h = self.config.grid_size
        self.table = nn.Parameter(torch.empty(h, w, dim))  # row-major: token y * W + x
        self.reset_parameters()

    def check_positions(self, positions: torch.Tensor, length: int, batch: int, name: str = "positions") -> None:
        check_grid(positions, length, batch, name)

    def embed(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """The ``Encoding`` hook: ``x (B, S, D)`` plus ``table[y, x]`` for each token's grid position."""
        check_embed(self, x, positions)
        hint = f"call .resized((W, H)) for a grid larger than grid_size={self.config.grid_size}"
        index = table_indices(positions, self.config.grid_size, hint)  # (..., S, 2), columns (x, y)
        return x + self.table[index[..., 1], index[..., 0]].to(x.dtype)  # (S, D) or (B, S, D)

    def resized(self, new_grid_size: tuple[int, int], *, antialias: bool = False) -> LearnedPositions2D:
        """A new module whose table is this one resized bicubically to ``new_grid_size = (W', H')``.

        ``antialias=False`` is MAE / DeiT's ``interpolate_pos_embed``; ``True`` is timm's default (see
        ``posenc.functional.learned.resize_table_2d``). This module is untouched.
        """
        new_grid_size = check_grid_size("new_grid_size", new_grid_size)
        table = resize_table_2d(self.table.detach(), new_grid_size, antialias=antialias)  # (H', W', D)
        return self._with_table(dataclasses.replace(self.config, grid_size=new_grid_size), table)

    def extra_repr(self) -> str:
        c = self.config
        return f"dim={c.dim}, grid_size={c.grid_size}, init_std={c.init_std}"
