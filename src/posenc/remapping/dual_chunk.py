"""Dual Chunk Attention (An et al. 2024, "Training-Free Long-Context Scaling of Large Language Models",
arXiv:2402.17463), as in ChunkLlama and Qwen2.5-1M.

The sequence is cut into chunks of ``c = chunk_size - local_window`` tokens; every key is rotated at its position
within its chunk, ``j mod c``. The query's position depends on where the key is: the same chunk (*intra*:
``i mod c``), the previous chunk (*successive*: ``min(i mod c + c, chunk_size)``, so neighbours across the boundary
keep their order and distance up to ``chunk_size``), any earlier chunk (*inter*: the constant
``min(2c - 1, chunk_size)``). No distance exceeds ``chunk_size``, so the reach is unlimited. Past the pretraining
length every logit is multiplied by a factor of the sequence length (``DualChunk.logit_factor``), whose coefficient
follows ChunkLlama (``HKUNLP/ChunkLlama``, the default), vLLM/SGLang (``dca_vllm``) or the paper (none):
``DualChunk``. Reference implementation: checked in ``tests/reference/remapping.py`` (``dual_chunk``,
``dual_chunk_vllm``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import cast

import torch

from posenc._checks import check_number, check_positive_int, fail
from posenc.remapping._branch import Branch, KeyInterval, RemapMethod

#: ``get_mscale``'s coefficient in ChunkLlama's current code.
CHUNKLLAMA_MSCALE = 0.05
#: The coefficient of vLLM's and SGLang's dual-chunk attention (``scaling_factor``).
VLLM_MSCALE = 0.1


@dataclass(frozen=True, kw_only=True, slots=True)
class DualChunk(RemapMethod):
    """Dual Chunk Attention with ``chunk_size`` and ``local_window`` (vLLM/SGLang: ``chunk_size``, ``local_size``),
    and the logit factor ``max(1, mscale * ln(S / L) + 1) ** 2`` past ``L = original_max_position_embeddings``
    (``mscale=0``: none, and ``L`` may be None).

    The factor is ``m(S)**2``, ``m(S) = max(1, mscale * ln(S / L) + 1)``, for a sequence of ``S`` tokens (the number of
    keys, as the reference counts them: a query of a KV-cache step sees the length so far, so decoding equals the full
    forward of each prefix):

    - ``mscale=0.05``, ``local_window = L // 8``: ``HKUNLP/ChunkLlama``'s current code (``chunkllama_attn_replace.py``
      at 847ae71, 2024-06-09: ``replace_with_chunkllama`` sets ``chunk_size = L * 3 // 4`` and
      ``local_window = L // 8``; ``ChunkLlamaRotaryEmbedding`` multiplies the cos/sin tables of queries and keys by
      ``get_mscale(S / L)``). The default. Its ``ppl/test_ppl.py`` passes ``local_window = L // 4``.
    - ``mscale=0.1`` (method name ``dca_vllm``): vLLM's and SGLang's dual-chunk attention, which a
      ``dual_chunk_attention_config`` switches on (``dual_chunk_flash_attn.py``: keys and the softmax scale each times
      ``clip(0.1 * ln(S / L) + 1, min=1)``). What a saved DCA model is served with (posenc writes no
      ``sparse_attention_config``, so their sparse MInference path, and its unclamped "critical" query positions, stay
      off).
    - ``mscale=0``, ``local_window = L // 16``: the paper's equations without the factor, as ChunkLlama before
      2024-04-25 and its ``chunkqwen_attn_replace.py`` (posenc's DCA before this factor).
    """

    chunk_size: int
    local_window: int
    original_max_position_embeddings: int | None = None
    mscale: float = CHUNKLLAMA_MSCALE

    def __post_init__(self) -> None:
        check_positive_int("chunk_size", self.chunk_size)
        check_positive_int("local_window", self.local_window)
        if self.local_window >= self.chunk_size:
            fail("local_window", self.local_window, f"less than chunk_size = {self.chunk_size}")
        object.__setattr__(self, "mscale", check_number("mscale", self.mscale, minimum=0.0))
        if self.original_max_position_embeddings is not None:
            check_positive_int("original_max_position_embeddings", self.original_max_position_embeddings)
        elif self.mscale > 0:
            fail(
                "original_max_position_embeddings",
                None,
                f"the pretraining length L of the logit factor max(1, {self.mscale:g} ln(S/L) + 1)^2, or mscale=0 "
                "for no factor",
            )

    @classmethod
    def for_target(
        cls,
        original: int,
        target: int,
        *,
        chunk_size: int | None = None,
        local_window: int | None = None,
        mscale: float = CHUNKLLAMA_MSCALE,
    ) -> DualChunk:
        """The reference's rule (``replace_with_chunkllama``): ``chunk_size = 3L // 4``, ``local_window = L // 8``,
        the factor over ``L = original``."""
        chunk_size = original * 3 // 4 if chunk_size is None else chunk_size
        local_window = max(1, original // 8) if local_window is None else local_window
        method = cls(
            chunk_size=chunk_size, local_window=local_window, original_max_position_embeddings=original, mscale=mscale
        )
        if method.chunk_size >= original:
            fail("chunk_size", chunk_size, f"less than the pretraining length {original} (no distance exceeds it)")
        method.check_target(original, target)
        return method

    @property
    def name(self) -> str:  # type: ignore[override]
        return "dca_vllm" if self.mscale == VLLM_MSCALE else "dca"

    @property
    def chunk_len(self) -> int:
        return self.chunk_size - self.local_window

    def reach(self, original: int) -> float:
        return math.inf if self.chunk_size < original else 0

    def limiting_parameter(self) -> tuple[str, object]:
        return "chunk_size", self.chunk_size

    @property
    def depends_on_length(self) -> bool:
        return self.mscale > 0

    def logit_factor(self, length: torch.Tensor) -> torch.Tensor | None:
        """``max(1, mscale * ln(S / L) + 1) ** 2`` for lengths ``S`` (float64); None without a factor.

        The reference keeps its tables for the longest length it has seen in the process (a shorter input after a longer
        one keeps the longer one's factor) and rotates cached keys with the factor of the step that wrote them; vLLM
        also scales each key once, when written. posenc computes the factor from the current length for every key (its
        cache holds un-rotated keys), so prefill equals both and each decoding step equals the full forward of its
        prefix; vLLM's decoding differs from that by at most ``0.1 * ln((S + n) / S)`` in the factor of keys written
        ``n`` steps earlier.
        """
        if not self.depends_on_length:
            return None
        original = cast(int, self.original_max_position_embeddings)  # set wherever mscale > 0
        m = (self.mscale * torch.log(length.double() / original) + 1).clamp_min(1.0)
        return m * m

    def branches(self) -> tuple[Branch, ...]:
        c, size = self.chunk_len, self.chunk_size

        def start(x: torch.Tensor, back: int = 0) -> torch.Tensor:  # where the chunk ``back`` chunks before x's starts
            return (torch.div(x, c, rounding_mode="floor") - back) * c

        def key(j: torch.Tensor) -> torch.Tensor:
            return torch.remainder(j, c)

        return (
            Branch(  # the same chunk
                name="intra", query=key, key=key, region=KeyInterval(first=start, end=lambda i: start(i) + c)
            ),
            Branch(
                name="successive",
                query=lambda i: torch.clamp(torch.remainder(i, c) + c, max=size),
                key=key,
                region=KeyInterval(first=lambda i: start(i, 1), end=start),  # the chunk before
            ),
            Branch(
                name="inter",
                query=lambda i: torch.full_like(i, min(2 * c - 1, size)),
                key=key,
                region=KeyInterval(end=lambda i: start(i, 1)),  # two chunks back or more
            ),
        )
