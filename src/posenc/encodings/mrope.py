"""``MRoPE``: multimodal rotary position embedding, one position stream per group of frequencies (Qwen2-VL).

Paper: Wang et al. 2024, "Qwen2-VL" (arXiv:2409.12191), section 2.1; interleaved sections: Qwen3-VL.
Reference implementation: Hugging Face transformers ``Qwen2VLRotaryEmbedding`` + ``apply_rotary_pos_emb``
(``transformers/models/qwen2_vl/modeling_qwen2_vl.py``) and, for ``interleaved_sections=True``,
``Qwen3VLTextRotaryEmbedding`` (``transformers/models/qwen3_vl/modeling_qwen3_vl.py``).

Shapes:
    q (B, H, S, D), k (B, Hkv, T, D); positions (3, S) or (3, B, S), rows [temporal, height, width], as Hugging
    Face's Qwen2-VL ``position_ids``. With ``k_positions`` omitted, keys use the query positions (T == S).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

import torch

from posenc._checks import check_choice, check_number, check_positive_int, fail
from posenc._config import DictConfig
from posenc.encodings._multistream import MultiStreamRoPE, check_stream_positions
from posenc.functional.mrope import STREAMS, check_mrope_section, mrope_stream_list
from posenc.functional.rope import LAYOUTS, default_inv_freq
from posenc.registry import register


@dataclass(frozen=True, kw_only=True, slots=True)
class MRoPEConfig(DictConfig):
    """Everything that defines an M-RoPE: validated on construction, round-trips through ``to_dict``/``from_dict``.

    ``mrope_section`` is stored as a tuple and written out as a list, as in Hugging Face's ``rope_parameters``.
    None takes Qwen2-VL's proportions, a quarter of the frequencies temporal and 3/8 for each spatial axis
    (``(16, 24, 24)`` at ``head_dim=128``), rounded with the remainder temporal.
    """

    head_dim: int
    base: float = 10000.0
    mrope_section: tuple[int, int, int] | None = None
    layout: str = "half"
    interleaved_sections: bool = False

    def __post_init__(self) -> None:
        check_positive_int("head_dim", self.head_dim)
        if self.head_dim % 2:
            fail("head_dim", self.head_dim, "an even number (M-RoPE rotates channel pairs)")
        check_number("base", self.base, above=1.0)
        check_choice("layout", self.layout, LAYOUTS)
        if not isinstance(self.interleaved_sections, bool):
            fail("interleaved_sections", self.interleaved_sections, "True or False")
        section = self.mrope_section
        if section is None:
            spatial = 3 * (self.head_dim // 2) // 8
            section = (self.head_dim // 2 - 2 * spatial, spatial, spatial)
        section = check_mrope_section(section, self.head_dim // 2, interleaved=self.interleaved_sections)
        object.__setattr__(self, "mrope_section", section)


def check_mrope_positions(positions: torch.Tensor, x: torch.Tensor, name: str = "positions") -> torch.Tensor:
    """Positions must be ``(3, S)`` or ``(3, B, S)`` (``B`` may be 1) for ``x`` of shape ``(B, H, S, D)``."""
    return check_stream_positions(positions, x, STREAMS, name)


@register("mrope")
class MRoPE(MultiStreamRoPE):
    """Multimodal RoPE: frequency ``f`` of section ``j`` rotates by position stream ``j`` (temporal, height, width).

    With three equal streams (text tokens) it is exactly ``RotaryEmbedding(head_dim, base=base, layout=layout)``.

    Args:
        head_dim: channels per head ``D`` (even); all of them rotate.
        base: RoPE base (HF ``rope_theta``; Qwen2-VL uses 1e6).
        mrope_section: frequencies per stream ``(temporal, height, width)``, summing to ``head_dim // 2``
            (HF ``rope_parameters["mrope_section"]``; Qwen2-VL: ``(16, 24, 24)`` for ``head_dim=128``). None:
            Qwen2-VL's proportions for this ``head_dim``.
        layout: ``"half"`` (HF, Qwen) pairs channel i with i + F; ``"interleaved"`` pairs 2i with 2i + 1.
        interleaved_sections: False: contiguous sections ``[t..t h..h w..w]`` (Qwen2-VL, Qwen2.5-VL); True: the
            streams take turns ``[t h w t h w ... t]`` (Qwen3-VL, HF ``mrope_interleaved``; e.g. ``(24, 20, 20)``).

    Shapes:
        q (B, H, S, D), k (B, Hkv, T, D), positions (3, S) or (3, B, S) -> q, k of the same shapes and dtypes.
    """

    config_class = MRoPEConfig

    def __init__(
        self,
        head_dim: int,
        *,
        base: float = 10000.0,
        mrope_section: Sequence[int] | None = None,
        layout: str = "half",
        interleaved_sections: bool = False,
    ) -> None:
        super().__init__()
        self.config = MRoPEConfig(
            head_dim=head_dim,
            base=base,
            mrope_section=cast("tuple[int, int, int] | None", mrope_section),  # a tuple after __post_init__
            layout=layout,
            interleaved_sections=interleaved_sections,
        )
        self.stream_names = STREAMS
        section = cast("tuple[int, int, int]", self.config.mrope_section)
        self.streams = tuple(mrope_stream_list(section, interleaved=self.config.interleaved_sections))
        self.register_buffer("inv_freq", self.build_inv_freq(), persistent=False)

    def build_inv_freq(self) -> torch.Tensor:
        return default_inv_freq(self.config.head_dim, base=self.config.base)

    def extra_repr(self) -> str:
        c = self.config
        return (
            f"head_dim={c.head_dim}, base={c.base}, mrope_section={c.mrope_section}, layout={c.layout!r}, "
            f"interleaved_sections={c.interleaved_sections}"
        )
