"""Dual Chunk Attention (An et al. 2024, "Training-Free Long-Context Scaling of Large Language Models",
arXiv:2402.17463), as in ChunkLlama and Qwen2.5-1M.

The sequence is cut into chunks of ``c = chunk_size - local_window`` tokens; every key is rotated at its position
within its chunk, ``j mod c``. The query's position depends on where the key is: the same chunk (*intra*:
``i mod c``), the previous chunk (*successive*: ``min(i mod c + c, chunk_size)``, so neighbours across the boundary
keep their order and distance up to ``chunk_size``), any earlier chunk (*inter*: the constant
``min(2c - 1, chunk_size)``). No distance exceeds ``chunk_size``, so the reach is unlimited; the defaults are the
reference's ``chunk_size = 3L/4``, ``local_window = L/16`` for pretraining length ``L``.
Reference implementation: ``HKUNLP/ChunkLlama`` (``chunkllama_attn_replace.py``: ``ChunkLlamaRotaryEmbedding``
``q_t``/``qc_t``/``k_t`` tables and the three flash-attention calls merged by log-sum-exp), which vLLM's
``DualChunkRotaryEmbedding`` follows; checked in ``tests/reference/remapping.py``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from posenc._checks import check_positive_int, fail
from posenc.remapping._branch import Branch, RemapMethod


@dataclass(frozen=True, kw_only=True, slots=True)
class DualChunk(RemapMethod):
    """Dual Chunk Attention with ``chunk_size`` and ``local_window`` (vLLM/SGLang: ``chunk_size``, ``local_size``)."""

    chunk_size: int
    local_window: int
    name = "dca"

    def __post_init__(self) -> None:
        check_positive_int("chunk_size", self.chunk_size)
        check_positive_int("local_window", self.local_window)
        if self.local_window >= self.chunk_size:
            fail("local_window", self.local_window, f"less than chunk_size = {self.chunk_size}")

    @classmethod
    def for_target(cls, original: int, target: int, *, chunk_size: int | None = None, local_window: int | None = None):  # noqa: ANN206
        """The reference's rule (``replace_with_chunkllama``): ``chunk_size = 3L // 4``, ``local_window = L // 16``."""
        chunk_size = original * 3 // 4 if chunk_size is None else chunk_size
        local_window = max(1, original // 16) if local_window is None else local_window
        method = cls(chunk_size=chunk_size, local_window=local_window)
        if method.chunk_size >= original:
            fail("chunk_size", chunk_size, f"less than the pretraining length {original} (no distance exceeds it)")
        method.check_target(original, target)
        return method

    @property
    def chunk_len(self) -> int:
        return self.chunk_size - self.local_window

    def reach(self, original: int) -> float:
        return math.inf if self.chunk_size < original else 0

    def limiting_parameter(self) -> tuple[str, object]:
        return "chunk_size", self.chunk_size

    def branches(self) -> tuple[Branch, ...]:
        c, size = self.chunk_len, self.chunk_size

        def chunk(x: torch.Tensor) -> torch.Tensor:
            return torch.div(x, c, rounding_mode="floor")

        def key(j: torch.Tensor) -> torch.Tensor:
            return torch.remainder(j, c)

        return (
            Branch(name="intra", query=key, key=key, region=lambda i, j: chunk(i) == chunk(j)),
            Branch(
                name="successive",
                query=lambda i: torch.clamp(torch.remainder(i, c) + c, max=size),
                key=key,
                region=lambda i, j: chunk(j) == chunk(i) - 1,
            ),  # fmt: skip
            Branch(
                name="inter",
                query=lambda i: torch.full_like(i, min(2 * c - 1, size)),
                key=key,
                region=lambda i, j: chunk(j) <= chunk(i) - 2,
            ),  # fmt: skip
        )
