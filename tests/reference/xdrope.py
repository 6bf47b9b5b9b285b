"""HunYuan-VL's XD-RoPE written out in float64, as each code that runs it computes it.

- vLLM (``vllm-project/vllm``): ``vllm/model_executor/layers/rotary_embedding/xdrope.py`` @
  b91ee1b47c8e8462ada5e5b8d18244bc96a0ebbc, ``XDRotaryEmbedding.forward_native``: the cache of
  ``DynamicNTKAlphaRotaryEmbedding`` (``dynamic_ntk_alpha_rope.py`` @ a42938c2e7432785b64b436dd8b9905ad854cbb1: base
  ``base * alpha ** (rotary_dim / (rotary_dim - 2))``) indexed by positions ``[N, num_tokens]``, ``cos (N, T, F)``
  split by ``xdrope_section`` along F, chunk ``i`` from stream ``i``, then vLLM's rotation (``is_neox_style``:
  pairs ``(i, i + F)``, else ``(2i, 2i + 1)``). ``get_rope`` builds it from ``rope_type "xdrope"``, ``alpha`` and
  ``xdrope_section`` (``__init__.py`` @ 07b12f1b16d5568eeb29a52fd8c9296a51f478ed): ``vllm_rope_parameters``.
- Tencent (``Tencent-Hunyuan/HunyuanOCR``): ``train/modeling_hunyuan_vl.py`` @
  c55965d3da1e6f41987abec8068f2e70851318bc, ``HunYuanVLRotaryEmbedding.forward`` with ``position_ids (B, N, S)``:
  per stream ``cat((freqs, freqs))`` over the head, ``section_doubled = xdrope_section * 2`` -- the *list* repeated,
  2N chunks -- chunk ``i`` from stream ``i % N``; ``apply_rotary_pos_emb_xdrope``: ``q cos + rotate_half(q) sin``.
- transformers 5.24.0: ``transformers/models/hunyuan_vl/modeling_hunyuan_vl.py``,
  ``HunYuanVLRotaryEmbedding.recomposition_frequencies``: ``split_sizes = [section * 2 for section in
  mrope_section]`` -- each *section* doubled, N chunks over the whole duplicated table -- chunk ``i`` from stream
  ``i % N``, then ``apply_rotary_pos_emb`` (the same ``q cos + rotate_half(q) sin``).

vLLM and Tencent agree (stream ``j`` turns frequencies ``sum(s[:j]) .. sum(s[:j+1]) - 1`` of both halves of the
head); transformers 5.24 agrees with them only where the N positions of a token are equal.

Shapes:
    x (..., S, D) with positions (N, S), or x (B, H, S, D) with positions (N, B, S); inv_freq (F,) float64;
    tables (..., S, F) (vLLM) or (..., S, D) (Tencent, transformers) -> float64
"""

from __future__ import annotations

import torch


def inv_freq(dim: int, base: float, alpha: float = 1.0) -> torch.Tensor:
    """``DynamicNTKAlphaRotaryEmbedding``'s frequencies: ``1 / base' ** (arange(0, dim, 2) / dim)``."""
    base = base * alpha ** (dim / (dim - 2))
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))


def vllm_rope_parameters(rope_parameters: dict) -> dict:
    """What ``get_rope``'s ``"xdrope"`` branch passes to ``XDRotaryEmbedding``: ``rope_theta`` (default 10000),
    ``alpha`` and ``xdrope_section``, read from the config's ``rope_parameters``."""
    assert rope_parameters.get("rope_type", "default") == "xdrope", rope_parameters
    return {
        "base": rope_parameters.get("rope_theta", 10000),
        "alpha": rope_parameters["alpha"],
        "xdrope_section": list(rope_parameters["xdrope_section"]),
    }


def _stream_angles(positions: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    """Angles per stream: (N, S, F) or (N, B, S, F)."""
    return positions.to(torch.float64).unsqueeze(-1) * freqs


def vllm_cos_sin(positions: torch.Tensor, freqs: torch.Tensor, section: list[int]) -> tuple[torch.Tensor, ...]:
    """``cos.split(xdrope_section, dim=-1)``, ``m[i]`` for chunk ``i``: tables (..., S, F)."""
    angles = _stream_angles(positions, freqs)
    cos = torch.cat([m[i] for i, m in enumerate(angles.cos().split(section, dim=-1))], dim=-1)
    sin = torch.cat([m[i] for i, m in enumerate(angles.sin().split(section, dim=-1))], dim=-1)
    return cos, sin


def vllm_rotate(
    x: torch.Tensor, positions: torch.Tensor, freqs: torch.Tensor, section: list[int], *, neox: bool = True
):
    """``XDRotaryEmbedding.forward_native`` on one tensor: vLLM's rotation of pairs by the (..., S, F) tables."""
    cos, sin = vllm_cos_sin(positions, freqs, section)
    if positions.dim() == 3:
        cos, sin = cos.unsqueeze(-3), sin.unsqueeze(-3)  # (B, S, F) -> (B, 1, S, F): shared by the heads
    x = x.to(torch.float64)
    if neox:
        f = cos.shape[-1]
        x1, x2 = x[..., :f], x[..., f : 2 * f]
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).flatten(-2)


def _duplicated_cos_sin(positions, freqs, split_sizes: list[int], n: int) -> tuple[torch.Tensor, ...]:
    """Tables over the whole head ``cat((freqs, freqs))``, chunk ``i`` of ``split_sizes`` from stream ``i % n``."""
    angles = _stream_angles(positions, freqs)
    emb = torch.cat((angles, angles), dim=-1)  # (N, ..., S, D)
    cos = torch.cat([m[i % n] for i, m in enumerate(emb.cos().split(split_sizes, dim=-1))], dim=-1)
    sin = torch.cat([m[i % n] for i, m in enumerate(emb.sin().split(split_sizes, dim=-1))], dim=-1)
    return cos, sin


def tencent_cos_sin(positions: torch.Tensor, freqs: torch.Tensor, section: list[int]) -> tuple[torch.Tensor, ...]:
    """Tencent's ``section_doubled = xdrope_section * 2`` (list repetition): tables (..., S, D)."""
    return _duplicated_cos_sin(positions, freqs, list(section) * 2, len(section))


def transformers_cos_sin(positions: torch.Tensor, freqs: torch.Tensor, section: list[int]) -> tuple[torch.Tensor, ...]:
    """transformers 5.24's ``[section * 2 for section in mrope_section]`` (each section doubled): (..., S, D)."""
    return _duplicated_cos_sin(positions, freqs, [2 * s for s in section], len(section))


def rotate_half_tables(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``x cos + rotate_half(x) sin`` with (..., S, D) tables, ``(B, S, D)`` ones shared by the heads."""
    if cos.dim() == 3:
        cos, sin = cos.unsqueeze(-3), sin.unsqueeze(-3)
    x = x.to(torch.float64)
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin
