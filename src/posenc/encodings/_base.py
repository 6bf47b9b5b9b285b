"""Base classes for the encoding modules: built from their config, frequencies kept exact."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, ClassVar

import torch
from torch import nn

from posenc._checks import fail
from posenc.functional.rope import apply_rotary, table_dtype


class ConfiguredModule(nn.Module):
    """A module whose constructor arguments are exactly the fields of ``config_class``."""

    config_class: ClassVar[type]

    @classmethod
    def from_config(cls, config: Any, **kwargs: Any):  # noqa: ANN206 - returns cls
        """Build from a config object or its dict (``to_dict()`` output); ``kwargs`` go to the constructor."""
        if isinstance(config, Mapping):
            config = cls.config_class.from_dict(config)
        if not isinstance(config, cls.config_class):
            fail("config", config, f"a {cls.config_class.__name__} or its dict")
        return cls(**{f.name: getattr(config, f.name) for f in dataclasses.fields(config)}, **kwargs)


def check_qk(q: torch.Tensor, k: torch.Tensor, head_dim: int | None = None) -> None:
    """``q`` and ``k`` must be 4-D ``(B, heads, S, head_dim)`` with the same batch size (and ``head_dim``)."""
    for name, t in (("q", q), ("k", k)):
        if t.dim() != 4:
            fail(f"{name}.dim()", t.dim(), "4, a tensor of shape (B, heads, S, head_dim)")
        if head_dim is not None and t.shape[-1] != head_dim:
            fail(f"{name}.shape[-1]", t.shape[-1], f"head_dim = {head_dim}")
    if q.shape[0] != k.shape[0]:
        fail("k.shape[0]", k.shape[0], f"the batch size of q, {q.shape[0]}")


class RotaryModule(ConfiguredModule):
    """Shared shell of the rotary family: ``forward`` delegates to the ``rotate(q, k, q_pos, k_pos)`` hook."""

    def rotate(self, q, k, q_pos, k_pos):  # noqa: ANN001, ANN201 - defined by each encoding
        raise NotImplementedError

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, k_positions: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotate ``q`` and ``k``; keys use ``k_positions`` if given, else ``positions``."""
        if k_positions is None and k.dim() >= 2 and q.dim() >= 2 and k.shape[-2] != q.shape[-2]:
            fail("k_positions", None, f"the keys' positions, since k has {k.shape[-2]} positions and q {q.shape[-2]}")
        return self.rotate(q, k, positions, positions if k_positions is None else k_positions)

    def _table_pair(self, q, k, q_pos, k_pos, tables):  # noqa: ANN001, ANN202
        """``tables(positions, dtype)`` for q and for k, built once when they share positions and table dtype."""
        q_tables = tables(q_pos, table_dtype(q.dtype))
        if k_pos is q_pos and table_dtype(k.dtype) == table_dtype(q.dtype):
            return q_tables, q_tables
        return q_tables, tables(k_pos, table_dtype(k.dtype))

    def _apply_tables(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, batched: bool) -> torch.Tensor:
        """Rotate ``x (..., S, D)`` by tables ``(S, F)``, or ``(B, S, F)`` for per-row positions."""
        if batched:
            cos, sin = cos.unsqueeze(-3), sin.unsqueeze(-3)  # (B, S, F) -> (B, 1, S, F), broadcast over heads
        return apply_rotary(x, cos, sin, layout=self.config.layout)


class FrequencyModule(RotaryModule):
    """Keeps ``inv_freq`` float32 and exact through ``.to(dtype)``, ``.half()``, device moves and ``to_empty()``.

    ``model.to(torch.bfloat16)`` would otherwise round the frequencies to bf16 and rotate long positions by wrong
    angles; ``to_empty()`` after a meta-device build would leave them uninitialised. Instead of casting, the buffer
    is rebuilt from the config on the new device.
    """

    inv_freq: torch.Tensor

    def build_inv_freq(self) -> torch.Tensor:
        """The float32 frequencies for this module's config (on CPU)."""
        raise NotImplementedError

    def _apply(self, fn, recurse=True):  # noqa: ANN001 - nn.Module's hook for .to/.cuda/.half/to_empty
        super()._apply(fn, recurse)
        self.inv_freq = self.build_inv_freq().to(self.inv_freq.device)
        return self
