"""``AxialRoPE``: RoPE over N spatial axes (RoPE-Axial), for images (2 axes) and video (3 axes).

Paper: Heo et al. 2024, "Rotary Position Embedding for Vision Transformer" (ECCV 2024, arXiv:2403.13298).
Reference implementation: naver-ai/rope-vit ``models/vit_rope.py`` (``init_t_xy``, ``compute_axial_cis``,
``apply_rotary_emb``); checked against the complex-number re-derivation in ``tests/reference/rope_vit.py``.

Shapes:
    q (B, H, S, D), k (B, Hkv, T, D); positions (S, N) or (B, S, N), integer or float, one column per axis,
    fastest-varying axis first (``(x, y)``, ``(x, y, t)``; see ``posenc.functional.axial_rope.grid_positions``).
    With ``k_positions`` omitted, keys use the query positions (T == S).

Tokens without a grid position (a cls token, registers) are not rotated, as in RoPE-ViT: pass only the patch
tokens, e.g. ``rope(q[:, :, 1:], k[:, :, 1:], grid_positions(W, H))``, and concatenate the cls token back.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from posenc._checks import check_choice, check_number, check_positive_int, fail
from posenc._config import DictConfig
from posenc.encodings._base import FrequencyModule, check_grid_positions, check_position_values, check_qk, shape_stub
from posenc.functional.axial_rope import axial_cos_sin, axial_inv_freq
from posenc.functional.rope import LAYOUTS, table_dtype
from posenc.registry import register


@dataclass(frozen=True, kw_only=True, slots=True)
class AxialRoPEConfig(DictConfig):
    """Everything that defines a RoPE-Axial: validated on construction, round-trips through ``to_dict``/``from_dict``.

    ``base`` defaults to 100, RoPE-ViT's ``rope_theta`` for the axial variant; ``layout`` to ``"interleaved"``,
    the channel pairing of RoPE-ViT's complex-number code.
    """

    head_dim: int
    n_axes: int = 2
    base: float = 100.0
    layout: str = "interleaved"

    def __post_init__(self) -> None:
        check_positive_int("head_dim", self.head_dim)
        check_positive_int("n_axes", self.n_axes)
        if self.head_dim % (2 * self.n_axes) != 0:
            fail("head_dim", self.head_dim, f"a multiple of 2 * n_axes = {2 * self.n_axes} (whole pairs per axis)")
        check_number("base", self.base, above=1.0)
        check_choice("layout", self.layout, LAYOUTS)


@register("rope_axial")
class AxialRoPE(FrequencyModule):
    """Rotary position embedding over ``n_axes`` spatial axes, channels split evenly between the axes.

    Axis ``a`` rotates the ``a``-th block of ``head_dim / (2 * n_axes)`` channel pairs by ``positions[..., a]``
    times the default RoPE frequencies of a ``head_dim / n_axes`` head, so ``<q, k>`` depends only on the
    per-axis offsets between tokens. With 2 axes, interleaved layout and ``base=100`` this is RoPE-ViT's
    RoPE-Axial exactly; with 1 axis it is plain RoPE.

    Args:
        head_dim: channels per head ``D``; a multiple of ``2 * n_axes``.
        n_axes: number of spatial axes: 2 for images, 3 for video.
        base: RoPE base (RoPE-ViT's ``rope_theta``, 100 for the axial variant).
        layout: ``"interleaved"`` (RoPE-ViT) pairs channels 2i and 2i + 1; ``"half"`` pairs i with i + D/2.

    Shapes:
        q (B, H, S, D), k (B, Hkv, T, D), positions (S, N) or (B, S, N) -> q, k of the same shapes and dtypes.
    """

    inv_freq: torch.Tensor

    config_class = AxialRoPEConfig
    position_kind = "grid"

    def __init__(self, head_dim: int, *, n_axes: int = 2, base: float = 100.0, layout: str = "interleaved") -> None:
        super().__init__()
        self.config = AxialRoPEConfig(head_dim=head_dim, n_axes=n_axes, base=base, layout=layout)
        self.register_buffer("inv_freq", self.build_inv_freq(), persistent=False)

    def build_inv_freq(self) -> torch.Tensor:
        c = self.config
        return axial_inv_freq(c.head_dim, n_axes=c.n_axes, base=c.base)

    def cos_sin(
        self, positions: torch.Tensor, *, dtype: torch.dtype = torch.float32
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Cos/sin tables for ``positions (S, N)`` or ``(B, S, N)``: ``(S, F)`` or ``(B, S, F)``."""
        return axial_cos_sin(positions, self.inv_freq.to(positions.device), dtype=dtype)

    def rotate_one(self, x: torch.Tensor, positions: torch.Tensor, name: str = "x") -> torch.Tensor:
        """Rotate ``x (B, H, S, D)`` (or ``(S, D)``, ``(H, S, D)``) at ``positions (S, N)`` or ``(B, S, N)``."""
        if x.shape[-1] != self.config.head_dim:
            fail(f"{name}.shape[-1]", x.shape[-1], f"head_dim = {self.config.head_dim}")
        check_grid_positions(positions, x, self.config.n_axes)
        check_position_values(positions, x, "positions", name)
        cos, sin = self.cos_sin(positions, dtype=table_dtype(x.dtype))
        return self._apply_tables(x, cos, sin, batched=positions.dim() == 3)

    def check_positions(self, positions: torch.Tensor, length: int, batch: int, name: str = "positions") -> None:
        check_grid_positions(positions, shape_stub(batch, length), self.config.n_axes, name)

    def rotate(
        self, q: torch.Tensor, k: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The ``Encoding`` hook: rotate queries at ``q_pos`` and keys at ``k_pos``."""
        check_qk(q, k, self.config.head_dim)
        check_grid_positions(q_pos, q, self.config.n_axes, "positions")
        check_grid_positions(k_pos, k, self.config.n_axes, "k_positions")
        self._check_position_pair(q, k, q_pos, k_pos)
        q_tables, k_tables = self._table_pair(q, k, q_pos, k_pos, lambda pos, dtype: self.cos_sin(pos, dtype=dtype))
        return (
            self._apply_tables(q, *q_tables, batched=q_pos.dim() == 3),
            self._apply_tables(k, *k_tables, batched=k_pos.dim() == 3),
        )

    def extra_repr(self) -> str:
        c = self.config
        return f"head_dim={c.head_dim}, n_axes={c.n_axes}, base={c.base}, layout={c.layout!r}"
