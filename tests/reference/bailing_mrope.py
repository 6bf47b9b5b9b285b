"""Bailing's M-RoPE (inclusionAI Ling / Ming, ``bailing_moe_v3``) written out in float64, as vLLM and SGLang run it.

- vLLM (``vllm-project/vllm``): ``vllm/model_executor/layers/rotary_embedding/bailing_mrope.py`` @
  9c5b71639542eda95a0a3fa92e6802e4b4ecbdae, ``BailingMRotaryEmbedding``: ``_validate_bailing_mrope_config``
  (``mrope_section = [T, H, W]``, ``H == W``, summing to ``rotary_dim // 2``); ``select_cos_sin``: 1-D positions
  take the cache rows as they are (text), ``[3, N]`` positions take ``cos[1]`` (height) at even and ``cos[2]``
  (width) at odd frequencies below ``spatial_size = H + W`` and ``cos[0]`` (temporal) above; ``forward_native``
  rotates with vLLM's rotation. ``vllm/model_executor/models/bailing_moe_v3.py`` @
  055e47c28003156421365af985d676fc921cb075 builds its MLA rotary embedding over ``qk_rope_head_dim`` channels with
  ``is_neox_style=False`` (pairs ``(2i, 2i + 1)``) from ``_build_rope_parameters`` (``rope_parameters`` updated by
  ``rope_scaling``, ``partial_rotary_factor`` dropped): ``vllm_rope_parameters``; vLLM's test of
  ``BailingMRotaryEmbedding`` builds it the same way (``is_neox_style=False``, ``rope_theta`` 6e6,
  ``mrope_section = [8, 12, 12]``, ``head_size = 64``) through the later ``_build_mla_rotary_embedding``.
- SGLang (``sgl-project/sglang``): ``python/sglang/srt/layers/rotary_embedding/bailing_mrope.py`` @
  a1efab20a5fcd9d5f7abc467ca9e920620f9686e: "the checkpoint stores [time, height, width], while the shared Ernie4.5
  kernel consumes [height, width, time]": ``sglang_ernie_section``.

Shapes:
    positions (3, S) or (3, B, S), rows [temporal, height, width] (height and width may be negative: Bailing centres
    them); x (..., S, D) or (B, H, S, D) -> float64
"""

from __future__ import annotations

import copy

import torch


def inv_freq(dim: int, base: float) -> torch.Tensor:
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))


def vllm_rope_parameters(config: dict) -> dict:
    """``bailing_moe_v3._build_rope_parameters``: ``rope_parameters`` (``rope_theta`` from the config when missing),
    updated by ``rope_scaling`` (``type`` renamed ``rope_type``), ``partial_rotary_factor`` dropped from both."""
    rope = copy.deepcopy(config.get("rope_parameters")) or {}
    if "rope_theta" not in rope and "rope_theta" in config:
        rope["rope_theta"] = config["rope_theta"]
    rope.pop("partial_rotary_factor", None)
    scaling = copy.deepcopy(config.get("rope_scaling"))
    if isinstance(scaling, dict):
        if "type" in scaling and "rope_type" not in scaling:
            scaling["rope_type"] = scaling.pop("type")
        scaling.pop("partial_rotary_factor", None)
        rope.update(scaling)
    return rope


def vllm_cos_sin(positions: torch.Tensor, dim: int, base: float, section: list[int]) -> tuple[torch.Tensor, ...]:
    """``select_cos_sin`` in float64: tables (..., S, F)."""
    t, h, w = section
    assert h == w and t + h + w == dim // 2, section
    spatial = h + w
    angles = positions.to(torch.float64).unsqueeze(-1) * inv_freq(dim, base)  # (3, ..., S, F) or (S, F)
    cos, sin = angles.cos(), angles.sin()
    if positions.dim() == 1:
        return cos, sin
    mask = torch.arange(spatial) % 2 == 0

    def select(table: torch.Tensor) -> torch.Tensor:
        spatial_part = torch.where(mask, table[1][..., :spatial], table[2][..., :spatial])
        return torch.cat((spatial_part, table[0][..., spatial:]), dim=-1)

    return select(cos), select(sin)


def sglang_ernie_section(section: list[int]) -> list[int]:
    """SGLang's reordering for ERNIE's kernel: ``[t, h, w] -> [h, w, t]``."""
    return [section[1], section[2], section[0]]
