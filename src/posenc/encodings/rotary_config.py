"""``RotaryConfig``: everything that defines a RoPE (head dim, base, scaling, layout, partial rotary), validated on
construction; ``posenc.encodings.rotary.RotaryEmbedding`` runs it and ``posenc.encodings.rotary_hf`` translates it
to and from Hugging Face configs (both import it from here, so neither imports the other's module for it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from posenc._checks import check_choice, check_number
from posenc._config import DictConfig
from posenc.functional.rope import LAYOUTS
from posenc.scalings import RopeScaling, check_rotary_keys, parse_scaling, rotary_dim


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
