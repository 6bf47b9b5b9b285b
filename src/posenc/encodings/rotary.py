"""``RotaryEmbedding``: RoPE for attention queries and keys, with every context-extension scaling.

Paper: Su et al. 2021, "RoFormer" (arXiv:2104.09864); scalings in ``posenc.functional.rope_scaling``.
Reference implementation: Hugging Face transformers ``LlamaRotaryEmbedding`` + ``apply_rotary_pos_emb`` (half
layout) and GPT-J ``apply_rotary_pos_emb`` / ``rotate_every_two`` (interleaved layout).

Shapes:
    q (B, H, S, D), k (B, Hkv, T, D); positions (S,) or (B, S), integer or float. With ``k_positions`` omitted,
    keys use the query positions (T == S).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from posenc import kernels
from posenc._checks import check_choice, check_number, fail
from posenc._config import DictConfig
from posenc.encodings._base import FrequencyModule, check_position_values, check_qk
from posenc.functional.rope import LAYOUTS, rope_cos_sin, table_dtype
from posenc.registry import register
from posenc.scalings import RopeScaling, check_rotary_keys, parse_scaling, rope_frequencies, rotary_dim


@dataclass(frozen=True, kw_only=True, slots=True)
class RotaryConfig(DictConfig):
    """Everything that defines a RoPE: validated on construction, round-trips through ``to_dict``/``from_dict``."""

    head_dim: int
    base: float = 10000.0
    scaling: RopeScaling | None = None
    layout: str = "half"
    partial_rotary_factor: float = 1.0

    def __post_init__(self) -> None:
        check_rotary_keys(self.scaling, base=self.base, partial_rotary_factor=self.partial_rotary_factor)
        object.__setattr__(self, "scaling", parse_scaling(self.scaling))
        check_choice("layout", self.layout, LAYOUTS)
        check_number("base", self.base, above=1.0)
        dim = rotary_dim(self.head_dim, self.partial_rotary_factor)
        if self.scaling is not None:
            self.scaling.check_dim(dim)

    @property
    def rotary_dim(self) -> int:
        return rotary_dim(self.head_dim, self.partial_rotary_factor)

    def to_dict(self) -> dict[str, Any]:
        out = DictConfig.to_dict(self)
        out["scaling"] = None if self.scaling is None else self.scaling.to_dict()
        return out


def check_positions(positions: torch.Tensor, x: torch.Tensor, name: str = "positions") -> torch.Tensor:
    """Positions must be ``(S,)`` or ``(B, S)`` (``B`` may be 1) for ``x`` of shape ``(B, H, S, D)``."""
    if not isinstance(positions, torch.Tensor):
        fail(name, type(positions).__name__, "a torch.Tensor of shape (S,) or (B, S)")
    s, b = x.shape[-2], x.shape[0] if x.dim() >= 4 else None
    ok = positions.dim() == 1 and positions.shape[0] == s
    ok = ok or (positions.dim() == 2 and positions.shape[1] == s and b is not None and positions.shape[0] in (1, b))
    if not ok:
        batched = f" or ({b}, {s})" if b is not None else " (batched positions need x of shape (B, H, S, D))"
        fail(f"{name}.shape", tuple(positions.shape), f"({s},){batched} to match x of shape {tuple(x.shape)}")
    return positions


@register("rope")
class RotaryEmbedding(FrequencyModule):
    """Rotary position embedding applied to queries and keys.

    Args:
        head_dim: channels per head ``D``.
        base: RoPE base (HF ``rope_theta``).
        scaling: None, a ``posenc`` scaling config, or an HF ``rope_scaling`` / ``rope_parameters`` dict.
        layout: ``"half"`` (GPT-NeoX / HF) pairs channel i with i + F; ``"interleaved"`` (GPT-J / Meta llama)
            pairs 2i with 2i + 1.
        partial_rotary_factor: fraction of ``head_dim`` that rotates; the trailing channels pass through.

    Shapes:
        q (B, H, S, D), k (B, Hkv, T, D), positions (S,) or (B, S) -> q, k of the same shapes and dtypes.

    Frequencies are a pure function of the config and, for ``dynamic``/``longrope``, of the current length
    ``max(positions) + 1``: nothing is cached or mutated in ``forward``.
    """

    inv_freq: torch.Tensor

    config_class = RotaryConfig

    def __init__(
        self,
        head_dim: int,
        *,
        base: float = 10000.0,
        scaling: RopeScaling | Mapping[str, Any] | None = None,
        layout: str = "half",
        partial_rotary_factor: float = 1.0,
    ) -> None:
        super().__init__()
        self.config = RotaryConfig(
            head_dim=head_dim, base=base, scaling=scaling, layout=layout, partial_rotary_factor=partial_rotary_factor
        )
        inv_freq, self.attention_factor = self._frequencies(None, device=None)
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    @classmethod
    def from_hf(cls, config: Any, *, layer_type: str | None = None) -> RotaryEmbedding:
        """Build from a Hugging Face model config (``PretrainedConfig`` or its dict); see ``posenc.hf``."""
        from posenc.hf import rotary_config_from_hf

        return cls.from_config(rotary_config_from_hf(config, layer_type=layer_type))

    def to_hf(self) -> dict[str, Any]:
        """The Hugging Face config keys that describe this RoPE; see ``posenc.hf``."""
        from posenc.hf import rotary_config_to_hf

        return rotary_config_to_hf(self.config)

    def build_inv_freq(self) -> torch.Tensor:
        return self._frequencies(None, device=None)[0]

    def _frequencies(self, seq_len, device) -> tuple[torch.Tensor, float]:
        c = self.config
        return rope_frequencies(
            c.head_dim,
            base=c.base,
            scaling=c.scaling,
            partial_rotary_factor=c.partial_rotary_factor,
            seq_len=seq_len,
            device=device,
        )

    def cos_sin(
        self,
        positions: torch.Tensor,
        *,
        seq_len: int | torch.Tensor | None = None,
        dtype: torch.dtype = torch.float32,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Cos/sin tables (attention factor included) for ``positions``: ``(S, F)`` or ``(B, S, F)``.

        ``seq_len`` is the current length for ``dynamic``/``longrope``; default ``positions.max() + 1``.
        """
        inv_freq, factor = self.inv_freq, self.attention_factor
        scaling = self.config.scaling
        if scaling is not None and scaling.depends_on_length:
            # The current length stays a tensor: no host sync, no graph break.
            length = positions.max() + 1 if seq_len is None else seq_len
            inv_freq, factor = self._frequencies(length, device=positions.device)
        return rope_cos_sin(positions, inv_freq.to(positions.device), attention_factor=factor, dtype=dtype)

    def rotate_one(
        self, x: torch.Tensor, positions: torch.Tensor, *, seq_len: int | torch.Tensor | None = None
    ) -> torch.Tensor:
        """Rotate one tensor ``x (B, H, S, D)`` (or ``(S, D)``, ``(H, S, D)``) at ``positions``."""
        if x.shape[-1] != self.config.head_dim:
            fail("x.shape[-1]", x.shape[-1], f"head_dim = {self.config.head_dim}")
        check_positions(positions, x)
        check_position_values(positions, x)
        cos, sin = self.cos_sin(positions, seq_len=seq_len, dtype=table_dtype(x.dtype))
        return self._apply_tables(x, cos, sin, batched=positions.dim() == 2)

    def rotate(
        self, q: torch.Tensor, k: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The ``Encoding`` hook: rotate queries at ``q_pos`` and keys at ``k_pos``."""
        check_qk(q, k, self.config.head_dim)
        check_positions(q_pos, q, "positions")
        check_positions(k_pos, k, "k_positions")
        self._check_position_pair(q, k, q_pos, k_pos)
        seq_len = None
        if self.config.scaling is not None and self.config.scaling.depends_on_length and q_pos is not k_pos:
            # One length for both, so q.k stays a function of distance (decoding passes fewer queries).
            seq_len = torch.maximum(q_pos.max().double(), k_pos.max().to(device=q_pos.device).double()) + 1
        q_tables, k_tables = self._table_pair(
            q, k, q_pos, k_pos, lambda pos, dtype: self.cos_sin(pos, seq_len=seq_len, dtype=dtype)
        )
        fused = kernels.rotate_qk(q, k, q_tables, k_tables, layout=self.config.layout)  # CUDA + Triton: one launch
        if fused is not None:
            return fused
        return (
            self._apply_tables(q, *q_tables, batched=q_pos.dim() == 2),
            self._apply_tables(k, *k_tables, batched=k_pos.dim() == 2),
        )

    def extra_repr(self) -> str:
        c = self.config
        scaling = "None" if c.scaling is None else c.scaling.rope_type
        return (
            f"head_dim={c.head_dim}, base={c.base}, layout={c.layout!r}, rotary_dim={c.rotary_dim}, scaling={scaling}"
        )
