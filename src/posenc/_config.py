"""Shared behaviour of posenc's frozen config dataclasses."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from posenc._checks import fail

_Config = TypeVar("_Config", bound="DictConfig")


class DictConfig:
    """Mixin for ``@dataclass(frozen=True, kw_only=True, slots=True)`` configs: strict dict round trips."""

    __slots__ = ()
    if TYPE_CHECKING:  # what @dataclass adds to every subclass: dataclasses.fields accepts it
        __dataclass_fields__: ClassVar[dict[str, dataclasses.Field[Any]]]

    def to_dict(self) -> dict[str, Any]:
        """Every field by name; tuples become lists (JSON-friendly)."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return {k: list(v) if isinstance(v, tuple) else v for k, v in out.items()}

    @classmethod
    def from_dict(cls: type[_Config], config: Mapping[str, Any]) -> _Config:
        """Build from a dict; an unknown key is an error, never silently dropped."""
        names = [f.name for f in dataclasses.fields(cls)]
        if not isinstance(config, Mapping):
            fail("config", config, f"a dict with the keys {names}")
        unknown = sorted(set(config) - set(names))
        if unknown:
            fail(f"config[{unknown[0]!r}]", config[unknown[0]], f"only the keys {names}")
        return cls(**config)
