"""DeepSeek-V4's RoPE on a shared key/value head: trailing channels rotated, the output rotated back.

DeepSeek-V4 (DeepSeek-AI 2026, transformers ``deepseek_v4``) attends with one KV head that is both the keys and the
values, each head laid out ``[nope | rope]``: RoPE, GPT-J style (interleaved pairs), rotates the *last* ``2F``
channels of the queries and of that head (``apply_rotary_tail``). The values carry their keys' rotation; the output
is rotated back by its query's position, so each value enters it rotated by the relative position,
``R(p_j - p_i) v_j`` (``shared_kv_rope_attention``). Compressed KV entries are rotated at their window's first
token (``compressed_positions``, ``compressed_visible``). The sliding layers use RoPE at ``rope_theta``
(``rope_parameters["main"]``), the compressed layers YaRN at ``compress_rope_theta`` (``rope_parameters["compress"]``)
with the attention factor forced to 1; ``posenc.hf.rotary_config_from_hf(config, layer_type=...)`` reads both.

Reference implementations checked against: transformers 5.24 ``models/deepseek_v4/modeling_deepseek_v4.py``
(``apply_rotary_pos_emb``, ``DeepseekV4RotaryEmbedding``, the ``DeepseekV4HCACompressor`` positions and block mask,
``DeepseekV4Attention.forward`` and its ``apply_rotary_pos_emb(attn_output, cos, -sin)``), in
``tests/functional/test_rope_shared_kv.py`` and through the float64 reference ``tests/reference/deepseek_v4_rope.py``;
and vLLM's ``DeepseekV4ScalingRotaryEmbedding`` (the commits: ``apply_rotary_tail``).

Shapes:
    B batch, H query heads, Hkv kv heads (1 in DeepSeek-V4), S queries, T keys, D head dim, F = rotary dims / 2.
    x          (..., S, D)                 the last 2F channels rotate, the first D - 2F pass through
    cos, sin   broadcastable to (..., S, F)
    q (B, H, S, D), kv (B, Hkv, T, D), q_positions (S,) or (B, S), kv_positions (T,) or (B, T), inv_freq (F,),
    mask (B|1, H|1, S, T) bool, sinks (H,) -> (B, H, S, D)
"""

from __future__ import annotations

import torch

from posenc._checks import check_choice, check_number, check_positions, check_positive_int, fail
from posenc.functional.rope import LAYOUTS, apply_rotary, rope_cos_sin


def apply_rotary_tail(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *, layout: str = "interleaved", inverse: bool = False
) -> torch.Tensor:
    """Rotate the *last* ``2F`` channels of ``x`` (DeepSeek-V4's ``[nope | rope]`` heads); the rest pass through.

    ``inverse=True`` rotates by the opposite angles (``sin`` negated, vLLM's ``inverse=``): with unscaled tables
    (attention factor 1) it undoes the rotation; DeepSeek-V4 applies it to the attention output at the query's
    positions. ``layout`` is ``"interleaved"`` (pairs ``(2i, 2i + 1)`` of the rope channels, DeepSeek-V4) or
    ``"half"``.

    vLLM does the same: ``DeepseekV4ScalingRotaryEmbedding.forward_native(..., inverse=)`` negates ``sin`` and
    rotates from ``rope_dim_offset = head_size - rotary_dim`` on, GPT-J style (``vllm/ir/ops/rotary_embedding.py`` @
    0c1d2cc94016883a88656a016db32872aad27adf, ``cos_sin_format="deepseek"``), built by
    ``vllm/models/deepseek_v4/common/rope.py`` @ 06d0369d75e060e83dffac3e0190ceff8fc37e12 (``is_neox_style=False``,
    ``mscale`` off) and applied to the attention output before the grouped output projection; the class itself is
    read from ``vllm/model_executor/layers/rotary_embedding/deepseek_scaling_rope.py`` in the vLLM fork
    ``Whamp/vllm`` @ 96e9b37479db8ff9bee719172a12164aaa88fb6e (a float32 cos/sin cache, the rotation in float32 cast
    back to the input's dtype).

    Shapes:
        x (..., S, D); cos, sin broadcastable to (..., S, F) with 2F <= D -> (..., S, D), dtype of x
    """
    check_choice("layout", layout, LAYOUTS)
    if not isinstance(inverse, bool):
        fail("inverse", inverse, "True or False")
    if cos.shape != sin.shape:
        fail("sin.shape", tuple(sin.shape), f"the shape of cos, {tuple(cos.shape)}")
    rd = 2 * cos.shape[-1]
    if rd > x.shape[-1]:
        fail("x.shape[-1]", x.shape[-1], f">= 2 * cos.shape[-1] = {rd} (the rotated channels)")
    if inverse:
        sin = -sin
    if rd == x.shape[-1]:
        return apply_rotary(x, cos, sin, layout=layout)
    rotated = apply_rotary(x[..., -rd:].contiguous(), cos, sin, layout=layout)
    return torch.cat((x[..., :-rd], rotated), dim=-1)


def compressed_positions(
    count: int, *, rate: int, start: int = 0, device: torch.device | str | None = None
) -> torch.Tensor:
    """The positions DeepSeek-V4 rotates its compressed KV entries at: entry ``w`` stands for the ``rate`` tokens
    from ``start + w * rate`` on and is rotated at that first position (CSA compresses every ``m = 4`` tokens, HCA
    every ``m' = 128``; sliding layers at base ``rope_theta`` 10^4, compressed ones and their compressors YaRN at
    ``compress_rope_theta`` 1.6 * 10^5).

    Args:
        count: entries (complete windows), >= 0.
        rate: tokens per entry (``compress_rates``: 4 for CSA, 128 for HCA).
        start: position of the first window's first token (0 for a sequence from its start).

    Shapes:
        returns (count,) int64
    """
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        fail("count", count, "an integer >= 0 (complete windows)")
    check_positive_int("rate", rate)
    if isinstance(start, bool) or not isinstance(start, int) or start < 0:
        fail("start", start, "an integer >= 0 (the first window's first position)")
    return start + rate * torch.arange(count, dtype=torch.int64, device=device)


def compressed_visible(q_positions: torch.Tensor, count: int, *, rate: int, start: int = 0) -> torch.Tensor:
    """Which compressed entries each query may attend to: those whose window is complete at the query,
    ``start + (w + 1) * rate <= p + 1`` (transformers' ``w < (p + 1) // rate`` for ``start = 0``); CSA's indexer
    then keeps its top-k of those.

    Shapes:
        q_positions (S,) or (B, S) integer -> (S, count) or (B, S, count) bool
    """
    check_positions(q_positions, "q_positions")
    if q_positions.is_floating_point():
        fail("q_positions.dtype", q_positions.dtype, "an integer dtype (token positions)")
    ends = compressed_positions(count, rate=rate, start=start, device=q_positions.device) + rate
    return ends <= q_positions.unsqueeze(-1) + 1


def _tables(
    positions: torch.Tensor, inv_freq: torch.Tensor, factor: float, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin for positions ``(S,)`` or ``(B, S)``, shaped to broadcast over heads: ``(S, F)`` or ``(B, 1, S, F)``."""
    cos, sin = rope_cos_sin(positions, inv_freq, attention_factor=factor, dtype=dtype)
    if positions.dim() == 2:
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return cos, sin


def shared_kv_rope_attention(
    q: torch.Tensor,
    kv: torch.Tensor,
    q_positions: torch.Tensor,
    kv_positions: torch.Tensor,
    inv_freq: torch.Tensor,
    *,
    attention_factor: float = 1.0,
    mask: torch.Tensor | None = None,
    scale: float | None = None,
    sinks: torch.Tensor | None = None,
    layout: str = "interleaved",
) -> torch.Tensor:
    """DeepSeek-V4's attention over one shared key/value head, its positional part whole: the last ``2F`` channels of
    ``q`` rotated at ``q_positions`` and of ``kv`` at ``kv_positions`` (a compressed entry at
    ``compressed_positions``), ``softmax(q kv^T * scale + mask [, sinks]) kv``, and the output's last ``2F`` channels
    rotated back at ``q_positions`` (the same tables with ``sin`` negated, as DeepSeek-V4 and vLLM do).

    Eager, in float32 (float64 for float64 inputs), the result cast to ``q.dtype``; a row that sees no key and has
    no sink is NaN, as in transformers.

    Args:
        q, kv: queries and the shared key/value heads (``Hkv`` divides ``H``; DeepSeek-V4 has one); see Shapes.
        q_positions, kv_positions: integer positions, or finite float32/float64.
        inv_freq: the rotary frequencies (``posenc.scalings.rope_frequencies`` of the layer's ``RotaryConfig``).
        attention_factor: what cos and sin are multiplied by (DeepSeek-V4 forces 1 on its YaRN).
        mask: True where a query may see a key (causal, sliding window, ``compressed_visible``); None: every key.
        scale: score scale; default ``1 / sqrt(D)``.
        sinks: one logit per query head added to each softmax's denominator, with no value (DeepSeek-V4, GPT-OSS).
        layout: ``"interleaved"`` (DeepSeek-V4) or ``"half"``.

    Shapes:
        q (B, H, S, D), kv (B, Hkv, T, D), q_positions (S,) or (B, S), kv_positions (T,) or (B, T), inv_freq (F,),
        mask broadcastable to (B, H, S, T), sinks (H,) -> (B, H, S, D)
    """
    if q.dim() != 4 or kv.dim() != 4 or q.shape[0] != kv.shape[0] or q.shape[-1] != kv.shape[-1]:
        fail("kv.shape", tuple(kv.shape), f"(B, Hkv, T, D) matching q's (B, H, S, D) = {tuple(q.shape)}")
    heads, groups = q.shape[1], kv.shape[1]
    if groups == 0 or heads % groups:
        fail("kv.shape[1]", groups, f"a divisor of the {heads} query heads")
    given = (("q_positions", q_positions, q.shape[2]), ("kv_positions", kv_positions, kv.shape[2]))
    for name, positions, length in given:
        check_positions(positions, name)
        if positions.shape[-1] != length or positions.dim() not in (1, 2):
            fail(f"{name}.shape", tuple(positions.shape), f"({length},) or (B, {length})")
    check_number("attention_factor", attention_factor, above=0.0)
    if scale is None:
        scale = q.shape[-1] ** -0.5
    check_number("scale", scale, above=0.0)
    compute = torch.promote_types(q.dtype, torch.float32)
    cos_q, sin_q = _tables(q_positions, inv_freq, attention_factor, compute)
    cos_k, sin_k = _tables(kv_positions, inv_freq, attention_factor, compute)
    rq = apply_rotary_tail(q.to(compute), cos_q, sin_q, layout=layout)
    rkv = apply_rotary_tail(kv.to(compute), cos_k, sin_k, layout=layout)
    rkv = rkv.repeat_interleave(heads // groups, dim=1)  # (B, H, T, D)
    scores = rq @ rkv.transpose(-1, -2) * scale  # (B, H, S, T)
    if mask is not None:
        if mask.dtype != torch.bool:
            fail("mask.dtype", mask.dtype, "torch.bool (True where a query may see a key)")
        scores = scores.masked_fill(~mask, float("-inf"))
    if sinks is not None:
        if sinks.shape != (heads,):
            fail("sinks.shape", tuple(sinks.shape), f"({heads},), one logit per query head")
        sink = sinks.to(compute).view(1, heads, 1, 1).expand(*scores.shape[:-1], 1)
        probs = torch.softmax(torch.cat((scores, sink), dim=-1), dim=-1)[..., :-1]
    else:
        probs = torch.softmax(scores, dim=-1)
    out = probs @ rkv  # (B, H, S, D): each value carries its key's rotation
    return apply_rotary_tail(out, cos_q, sin_q, layout=layout, inverse=True).to(q.dtype)
