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

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from posenc._checks import check_choice, check_number, check_positive_int, fail
from posenc.encodings._frequencies import FrequencyModule
from posenc.functional.axial_rope import axial_cos_sin, axial_inv_freq
from posenc.functional.rope import LAYOUTS, apply_rotary


@dataclass(frozen=True, kw_only=True, slots=True)
class AxialRoPEConfig:
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

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    @classmethod
    def from_dict(cls, config: Mapping[str, Any]) -> AxialRoPEConfig:
        unknown = sorted(set(config) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            fail(
                f"config[{unknown[0]!r}]",
                config[unknown[0]],
                f"only the keys {[f.name for f in dataclasses.fields(cls)]}",
            )
        return cls(**config)


def check_grid_positions(positions: torch.Tensor, x: torch.Tensor, n_axes: int, name: str = "positions") -> None:
    """Positions must be ``(S, n_axes)`` or ``(B, S, n_axes)`` (``B`` may be 1) for ``x`` of shape ``(B, H, S, D)``.

    Batched positions need a 4-D ``x``; an unbatched ``x`` (``(S, D)`` or ``(H, S, D)``) takes ``(S, n_axes)``.
    """
    if not isinstance(positions, torch.Tensor):
        fail(name, type(positions).__name__, f"a torch.Tensor of shape (S, {n_axes}) or (B, S, {n_axes})")
    s, b = x.shape[-2], x.shape[0] if x.dim() >= 4 else None
    ok = positions.dim() == 2 and positions.shape == (s, n_axes)
    ok = ok or (
        positions.dim() == 3 and positions.shape[1:] == (s, n_axes) and b is not None and positions.shape[0] in (1, b)
    )
    if not ok:
        fail(
            f"{name}.shape",
            tuple(positions.shape),
            f"({s}, {n_axes}) or ({b}, {s}, {n_axes}) to match x of shape {tuple(x.shape)} and n_axes={n_axes}",
        )


def check_qk(q: torch.Tensor, k: torch.Tensor) -> None:
    """``q`` and ``k`` must be 4-D ``(B, heads, S, head_dim)`` with the same batch size."""
    for name, t in (("q", q), ("k", k)):
        if t.dim() != 4:
            fail(f"{name}.dim()", t.dim(), "4, a tensor of shape (B, heads, S, head_dim)")
    if q.shape[0] != k.shape[0]:
        fail("k.shape[0]", k.shape[0], f"the batch size of q, {q.shape[0]}")


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

    def __init__(self, head_dim: int, *, n_axes: int = 2, base: float = 100.0, layout: str = "interleaved") -> None:
        super().__init__()
        self.config = AxialRoPEConfig(head_dim=head_dim, n_axes=n_axes, base=base, layout=layout)
        self.register_buffer("inv_freq", self.build_inv_freq(), persistent=False)

    def build_inv_freq(self) -> torch.Tensor:
        c = self.config
        return axial_inv_freq(c.head_dim, n_axes=c.n_axes, base=c.base)

    @classmethod
    def from_config(cls, config: AxialRoPEConfig | Mapping[str, Any]) -> AxialRoPE:
        if isinstance(config, Mapping):
            config = AxialRoPEConfig.from_dict(config)
        c = config.to_dict()
        return cls(c.pop("head_dim"), **c)

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
        dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
        cos, sin = self.cos_sin(positions, dtype=dtype)
        if positions.dim() == 3:
            cos, sin = cos.unsqueeze(-3), sin.unsqueeze(-3)  # (B, S, F) -> (B, 1, S, F), broadcast over heads
        return apply_rotary(x, cos, sin, layout=self.config.layout)

    def rotate(
        self, q: torch.Tensor, k: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The ``Encoding`` hook: rotate queries at ``q_pos`` and keys at ``k_pos``."""
        check_qk(q, k)
        check_grid_positions(q_pos, q, self.config.n_axes, "positions")
        check_grid_positions(k_pos, k, self.config.n_axes, "k_positions")
        return self.rotate_one(q, q_pos, "q"), self.rotate_one(k, k_pos, "k")

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, k_positions: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotate ``q`` and ``k``; keys use ``k_positions`` if given, else ``positions``."""
        return self.rotate(q, k, positions, positions if k_positions is None else k_positions)

    def extra_repr(self) -> str:
        c = self.config
        return f"head_dim={c.head_dim}, n_axes={c.n_axes}, base={c.base}, layout={c.layout!r}"
