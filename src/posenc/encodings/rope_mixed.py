"""``RoPEMixed``: rotary position embedding with learnable per-head 2-D frequencies (RoPE-Mixed).

Paper: Heo et al. 2024, "Rotary Position Embedding for Vision Transformer" (ECCV 2024, arXiv:2403.13298), Sec. 3.
Reference implementation: naver-ai/rope-vit ``models/vit_rope.py`` (``init_random_2d_freqs``,
``compute_mixed_cis``, ``apply_rotary_emb``); checked against the complex-number re-derivation in
``tests/reference/rope_vit.py``, forward and gradients.

Shapes:
    q (B, H, S, D), k (B, H, T, D) with H == num_heads; positions (S, 2) or (B, S, 2), integer or float, columns
    ``(x, y)`` with ``x`` the fastest-varying axis (``posenc.functional.axial_rope.grid_positions(W, H)``).
    With ``k_positions`` omitted, keys use the query positions (T == S).

Per-layer frequencies: RoPE-ViT keeps one ``(2, depth, H * F)`` parameter and gives every block its own slice,
drawn independently. Here each attention layer builds its own ``RoPEMixed``; drawing the layers in order from one
``torch.Generator`` reproduces the reference's per-layer initialisation. Tokens without a grid position (the cls
token) are not rotated, as in RoPE-ViT: pass only the patch tokens, e.g. ``q[:, :, 1:]``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from posenc._checks import check_number, check_positive_int, fail
from posenc._config import DictConfig
from posenc.encodings._base import RotaryModule, check_grid_positions, check_position_values, check_qk, shape_stub
from posenc.functional.rope import apply_rotary, table_dtype
from posenc.functional.rope_mixed import init_mixed_freqs, mixed_cos_sin
from posenc.registry import register


@dataclass(frozen=True, kw_only=True, slots=True)
class RoPEMixedConfig(DictConfig):
    """Everything that defines a RoPE-Mixed: validated on construction, round-trips through ``to_dict``/``from_dict``.

    ``base`` defaults to 10, RoPE-ViT's ``rope_theta`` for the mixed variant. ``rotate=False`` starts every head
    from the axial frequencies (no random rotation); the frequencies are trained either way.
    """

    head_dim: int
    num_heads: int
    base: float = 10.0
    rotate: bool = True

    def __post_init__(self) -> None:
        check_positive_int("head_dim", self.head_dim)
        if self.head_dim % 4 != 0:
            fail("head_dim", self.head_dim, "a multiple of 4 (half of the channel pairs per frequency direction)")
        check_positive_int("num_heads", self.num_heads)
        check_number("base", self.base, above=1.0)
        if not isinstance(self.rotate, bool):
            fail("rotate", self.rotate, "True or False")


@register("rope_mixed")
class RoPEMixed(RotaryModule):
    """Rotary embedding whose pair ``f`` of head ``h`` turns by ``x * freqs[0, h, f] + y * freqs[1, h, f]``.

    The frequencies are an ``nn.Parameter`` trained with the model (the paper's RoPE-Mixed); ``<q, k>`` still
    depends only on the 2-D offset between tokens. Rotation uses the interleaved layout of RoPE-ViT's complex form.

    Args:
        head_dim: channels per head ``D``; a multiple of 4.
        num_heads: query (and key) heads ``H``; each has its own frequencies.
        base: frequency base (RoPE-ViT's ``rope_theta``, 10 for the mixed variant).
        rotate: draw a random direction per head (the paper); ``False`` starts from axial frequencies.
        generator: random source for the initial directions, for reproducible initialisation.

    Shapes:
        freqs (2, H, D/2); q (B, H, S, D), k (B, H, T, D), positions (S, 2) or (B, S, 2) -> q, k, same shapes/dtypes.
    """

    config_class = RoPEMixedConfig
    # per layer and head, as RoPE-ViT learns them (naver-ai/rope-vit models/vit_rope.py: freqs per block; @ ce85c2e)
    per_layer = True
    position_kind = "grid"
    per_head_keys = True

    def __init__(
        self,
        head_dim: int,
        num_heads: int,
        *,
        base: float = 10.0,
        rotate: bool = True,
        generator: torch.Generator | None = None,
    ) -> None:
        super().__init__()
        self.config = RoPEMixedConfig(head_dim=head_dim, num_heads=num_heads, base=base, rotate=rotate)
        c = self.config
        self.freqs = nn.Parameter(
            init_mixed_freqs(c.head_dim, c.num_heads, base=c.base, rotate=c.rotate, generator=generator)
        )

    @torch.no_grad()
    def reset_parameters(self, generator: torch.Generator | None = None) -> None:
        """Redraw ``freqs`` in place (e.g. after building on the meta device and ``to_empty``)."""
        c = self.config
        fresh = init_mixed_freqs(c.head_dim, c.num_heads, base=c.base, rotate=c.rotate, generator=generator)
        self.freqs.copy_(fresh)

    def cos_sin(
        self, positions: torch.Tensor, *, dtype: torch.dtype = torch.float32
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Cos/sin tables for ``positions (S, 2)`` or ``(B, S, 2)``: ``(H, S, F)`` or ``(B, H, S, F)``.

        Differentiable with respect to ``freqs``.
        """
        return mixed_cos_sin(positions, self.freqs, dtype=dtype)

    def rotate_one(self, x: torch.Tensor, positions: torch.Tensor, name: str = "x") -> torch.Tensor:
        """Rotate one tensor ``x (B, H, S, D)`` (or ``(H, S, D)``) at ``positions (S, 2)`` or ``(B, S, 2)``."""
        c = self.config
        if x.shape[-1] != c.head_dim:
            fail(f"{name}.shape[-1]", x.shape[-1], f"head_dim = {c.head_dim}")
        self._check_heads(x, name)
        check_grid_positions(positions, x, 2)
        check_position_values(positions, x, "positions", name)
        cos, sin = self.cos_sin(positions, dtype=table_dtype(x.dtype))  # (H, S, F) or (B, H, S, F): already per head
        return apply_rotary(x, cos, sin, layout="interleaved")

    def _check_heads(self, x: torch.Tensor, name: str) -> None:
        c = self.config
        if x.dim() in (3, 4) and name != "k":  # keys: the message below says how to repeat GQA key heads
            self.check_heads(x, name)
        if x.dim() not in (3, 4) or x.shape[-3] != c.num_heads:
            fail(
                f"{name}.shape",
                tuple(x.shape),
                f"(B, {c.num_heads}, S, {c.head_dim}) or ({c.num_heads}, S, {c.head_dim}): one head per frequency "
                "set (for GQA, repeat the key heads to num_heads before rotating)",
            )

    def check_positions(self, positions: torch.Tensor, length: int, batch: int, name: str = "positions") -> None:
        check_grid_positions(positions, shape_stub(batch, length), 2, name)

    def rotate(
        self, q: torch.Tensor, k: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The ``Encoding`` hook: rotate queries at ``q_pos`` and keys at ``k_pos``."""
        check_qk(q, k, self.config.head_dim)
        check_grid_positions(q_pos, q, 2, "positions")
        check_grid_positions(k_pos, k, 2, "k_positions")
        self._check_heads(q, "q")
        self._check_heads(k, "k")
        self._check_position_pair(q, k, q_pos, k_pos)
        q_tables, k_tables = self._table_pair(q, k, q_pos, k_pos, lambda pos, dtype: self.cos_sin(pos, dtype=dtype))
        return apply_rotary(q, *q_tables, layout="interleaved"), apply_rotary(k, *k_tables, layout="interleaved")

    def extra_repr(self) -> str:
        c = self.config
        return f"head_dim={c.head_dim}, num_heads={c.num_heads}, base={c.base}, rotate={c.rotate}"
