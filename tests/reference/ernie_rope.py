"""ERNIE-4.5-VL's 3-D RoPE written out in float64, as transformers and vLLM compute it.

- transformers 5.24.0: ``transformers/models/ernie4_5_vl_moe/modeling_ernie4_5_vl_moe.py``,
  ``Ernie4_5_VLMoeTextRotaryEmbedding``: ``compute_default_rope_parameters`` "pre-rotates" the frequencies
  (``inv_freq_3d[:h + w] = cat(inv_freq[:-t][0::2], inv_freq[:-t][1::2])``, ``inv_freq_3d[-t:] = inv_freq[-t:]``);
  ``forward`` takes ``position_ids (3, B, S)``; ``recomposition_frequencies`` splits by ``mrope_section = [h, w, t]``
  and takes chunk ``i`` from row ``(i + 1) % 3`` (height from row 1, width from row 2, temporal from row 0),
  stacks ``[h, w]`` pairwise, appends ``t`` and ``repeat_interleave(2)``; ``apply_rotary_pos_emb`` is
  ``q cos + rotate_half_text(q) sin`` with ``rotate_half_text`` on pairs ``(2i, 2i + 1)``.
- vLLM (``vllm-project/vllm``): ``vllm/model_executor/layers/rotary_embedding/ernie45_vl_rope.py`` @
  1e6351024580aa51478ddeede54a0ffc5b546750, ``Ernie4_5_VLRotaryEmbedding.forward_native``: ``cos[..., :h + w:2]``
  from row 1, ``cos[..., 1:h + w:2]`` from row 2, ``cos[..., -t:]`` from row 0, ``[h w h w ... t]``; the ERNIE
  model builds it with ``is_neox_style=False`` and ``mrope_section = [h, w, t]``, ``t = freq_allocation``.

Shapes:
    positions (3, S) or (3, B, S), rows [temporal, height, width]; x (..., S, D) or (B, H, S, D) -> float64
"""

from __future__ import annotations

import torch


def inv_freq(dim: int, base: float) -> torch.Tensor:
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))


def transformers_cos_sin(
    positions: torch.Tensor, dim: int, base: float, section: list[int]
) -> tuple[torch.Tensor, ...]:
    """``Ernie4_5_VLMoeTextRotaryEmbedding.forward`` in float64: tables (..., S, D), channel pairs (2i, 2i + 1)."""
    h, w, t = section
    freqs = inv_freq(dim, base)
    freqs_3d = torch.empty_like(freqs)
    freqs_3d[: h + w] = torch.cat([freqs[:-t][0::2], freqs[:-t][1::2]])
    freqs_3d[-t:] = freqs[-t:]
    angles = positions.to(torch.float64).unsqueeze(-1) * freqs_3d  # (3, ..., S, F)

    def recompose(table: torch.Tensor) -> torch.Tensor:
        freq_h, freq_w, freq_t = (m[(i + 1) % 3] for i, m in enumerate(table.split(section, dim=-1)))
        freq_hw = torch.stack([freq_h, freq_w], dim=-1).flatten(-2)
        return torch.cat([freq_hw, freq_t], dim=-1).repeat_interleave(2, dim=-1)

    return recompose(angles.cos()), recompose(angles.sin())


def vllm_cos_sin(positions: torch.Tensor, dim: int, base: float, section: list[int]) -> tuple[torch.Tensor, ...]:
    """``Ernie4_5_VLRotaryEmbedding.forward_native``'s tables in float64: (..., S, F), one per frequency."""
    h, w, t = section
    assert h == w
    angles = positions.to(torch.float64).unsqueeze(-1) * inv_freq(dim, base)  # (3, ..., S, F)

    def select(table: torch.Tensor) -> torch.Tensor:
        t_part, h_part, w_part = table[0][..., -t:], table[1][..., : h + w : 2], table[2][..., 1 : h + w : 2]
        hw = torch.stack([h_part, w_part], dim=-1).reshape(h_part.shape[:-1] + (h_part.shape[-1] * 2,))
        return torch.cat([hw, t_part], dim=-1)

    return select(angles.cos()), select(angles.sin())


def rotate_pairs(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """vLLM's GPT-J rotation (``is_neox_style=False``) by per-frequency tables (..., S, F), ``(B, S, F)`` shared by
    the heads: ``(x[2i], x[2i + 1]) -> (x1 c - x2 s, x2 c + x1 s)``."""
    if cos.dim() == 3:
        cos, sin = cos.unsqueeze(-3), sin.unsqueeze(-3)
    x = x.to(torch.float64)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).flatten(-2)


def rotate_half_text(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """transformers' ``q cos + rotate_half_text(q) sin`` with (..., S, D) tables, ``(B, S, D)`` shared by heads."""
    if cos.dim() == 3:
        cos, sin = cos.unsqueeze(-3), sin.unsqueeze(-3)
    x = x.to(torch.float64)
    rotated = torch.stack((-x[..., 1::2], x[..., 0::2]), dim=-1).flatten(-2)
    return x * cos + rotated * sin
