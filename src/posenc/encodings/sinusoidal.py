"""``Sinusoidal`` and ``Sinusoidal2D``: fixed sin/cos encodings added to the token embeddings.

Papers: Vaswani et al. 2017, "Attention Is All You Need" (arXiv:1706.03762), section 3.5 (1-D, interleaved sin/cos);
He et al. 2022, "Masked Autoencoders Are Scalable Vision Learners" (arXiv:2111.06377) (2-D, MAE's sin-cos).
Reference implementations checked against: Hugging Face DistilBERT ``create_sinusoidal_embeddings`` and
facebookresearch/mae ``get_2d_sincos_pos_embed``, via ``tests/reference/sinusoidal.py``; the formulas and
channel layouts are in ``posenc.functional.sinusoidal``.

Shapes:
    x (B, S, D); positions (S,) or (B, S) (1-D), (S, 2) or (B, S, 2) with columns (x, y) (2-D) -> (B, S, D).

Nothing is stored: the encoding is computed from the positions on every call, in float64, and cast to ``x.dtype``
at the end, so ``model.to(torch.bfloat16)`` cannot round a cached table.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from posenc._checks import check_number, check_positive_int, fail
from posenc._config import DictConfig
from posenc.encodings._base import ConfiguredModule, check_embed, check_grid
from posenc.functional.sinusoidal import sinusoidal_2d_encoding, sinusoidal_encoding
from posenc.registry import register


@dataclass(frozen=True, kw_only=True, slots=True)
class SinusoidalConfig(DictConfig):
    """A 1-D sinusoidal encoding: ``dim`` (even) channels, wavelengths up to about ``2 pi * base``."""

    dim: int
    base: float = 10000.0

    def __post_init__(self) -> None:
        check_positive_int("dim", self.dim)
        if self.dim % 2:
            fail("dim", self.dim, "an even number (a sine and a cosine per frequency)")
        check_number("base", self.base, above=1.0)


@dataclass(frozen=True, kw_only=True, slots=True)
class Sinusoidal2DConfig(DictConfig):
    """A 2-D (MAE) sin-cos encoding: ``dim`` (a multiple of 4) channels, half for x and half for y."""

    dim: int
    base: float = 10000.0

    def __post_init__(self) -> None:
        check_positive_int("dim", self.dim)
        if self.dim % 4:
            fail("dim", self.dim, "a multiple of 4 (a sine and a cosine block for each of x and y)")
        check_number("base", self.base, above=1.0)


@register("sinusoidal")
class Sinusoidal(ConfiguredModule):
    """Vaswani et al.'s fixed encoding, added to the token embeddings: ``x + PE[positions]``.

    Args:
        dim: model width ``D`` (even): channels ``2i`` and ``2i + 1`` hold ``sin`` and ``cos`` of
            ``p * base ** (-2i / D)``.
        base: wavelength scale, 10000 in the paper.

    Shapes:
        x (B, S, D), positions (S,) or (B, S), integer or float -> (B, S, D), dtype of x.
    """

    config_class = SinusoidalConfig

    def __init__(self, dim: int, *, base: float = 10000.0) -> None:
        super().__init__()
        self.config = SinusoidalConfig(dim=dim, base=base)

    def encoding(self, positions: torch.Tensor, *, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The encoding alone: ``(S,)`` or ``(B, S)`` positions -> ``(S, D)`` or ``(B, S, D)``."""
        return sinusoidal_encoding(positions, self.config.dim, base=self.config.base, dtype=dtype)

    def embed(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """The ``Encoding`` hook: ``x (B, S, D)`` plus the encoding of ``positions``."""
        check_embed(self, x, positions)
        return x + self.encoding(positions, dtype=x.dtype)  # (B|1, S, D) or (S, D) broadcasts over the batch

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.embed(x, positions)

    def extra_repr(self) -> str:
        return f"dim={self.config.dim}, base={self.config.base}"


@register("sinusoidal_2d")
class Sinusoidal2D(ConfiguredModule):
    """MAE's fixed 2-D sin-cos encoding of patch-grid positions, added to the patch embeddings.

    Channels: ``[sin(x w) | cos(x w) | sin(y w) | cos(y w)]``, ``D / 4`` each, ``w_i = base ** (-i / (D / 4))``.
    Pass patch tokens only (MAE gives its cls token a zero encoding); ``grid_positions(W, H)`` lists an
    ``(H, W)`` patch grid in row-major order.

    Args:
        dim: model width ``D``, a multiple of 4.
        base: wavelength scale, 10000 in MAE.

    Shapes:
        x (B, S, D), positions (S, 2) or (B, S, 2), columns (x, y) -> (B, S, D), dtype of x.
    """

    config_class = Sinusoidal2DConfig
    position_kind = "grid"  # positions (S, 2) / (B, S, 2), see Encoding

    def __init__(self, dim: int, *, base: float = 10000.0) -> None:
        super().__init__()
        self.config = Sinusoidal2DConfig(dim=dim, base=base)

    def encoding(self, positions: torch.Tensor, *, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The encoding alone: ``(S, 2)`` or ``(B, S, 2)`` positions -> ``(S, D)`` or ``(B, S, D)``."""
        return sinusoidal_2d_encoding(positions, self.config.dim, base=self.config.base, dtype=dtype)

    def check_positions(self, positions: torch.Tensor, length: int, batch: int, name: str = "positions") -> None:
        check_grid(positions, length, batch, name)

    def embed(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """The ``Encoding`` hook: ``x (B, S, D)`` plus the encoding of the grid ``positions``."""
        check_embed(self, x, positions)
        return x + self.encoding(positions, dtype=x.dtype)  # (B|1, S, D) or (S, D) broadcasts over the batch

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.embed(x, positions)

    def extra_repr(self) -> str:
        return f"dim={self.config.dim}, base={self.config.base}"
