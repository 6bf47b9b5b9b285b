"""vLLM's paged attention with learned attention sinks (GPT-OSS), written out in float64.

Of vLLM's attention backends that take sinks (``supports_sink``), this follows the Triton unified-attention kernel
(``TRITON_ATTN``, which runs on every GPU vLLM supports; the FlashAttention 3 and FlashInfer/TRT-LLM kernels that take
``sinks`` too are not written out): its online softmax over key tiles, its 3D split-KV decode path and that path's
reduction, in float64 instead of the kernel's float32, so that a test can hold posenc's float32 result to its own
rounding. Sources, all in ``vllm-project/vllm``:

- ``vllm/v1/attention/ops/triton_unified_attention.py`` @ 001394336840495fb529a33f71767ecbfdc88372:
  ``kernel_unified_attention`` (``S = scale * Q K^T`` per tile, the running max ``M`` from ``init_softmax_M``, the
  running sum ``L = 1``, ``acc / L`` at the end of the 2D path; the 3D path stores each segment's ``(M, L, acc)``)
  and ``reduce_segments`` (``max`` of the segment maxima, ``sum L_s exp(M_s - max)``, ``0`` where that sum is 0);
  ``unified_attention``: ``SLIDING_WINDOW = 1 + window_size[0]``, 3D only when ``max_seqlen_q == 1``.
- ``vllm/v1/attention/ops/triton_quant_kv/_helpers.py`` @ 86a153bd8b83b38fb301ca1d9bf6db303ad03228:
  ``init_softmax_M`` (``M`` starts at ``sinks[h]`` in the 2D path and in segment 0 of the 3D path, at ``-inf``
  elsewhere), ``softmax_step`` (a row whose running max is still ``-inf`` uses 0 instead), ``compute_kv_seq_mask``
  (causal ``j <= context_len + query_pos``, and ``(context_len + query_pos) - j < SLIDING_WINDOW`` with a window),
  ``apply_softcap``.
- ``vllm/v1/attention/backends/triton_attn.py`` @ 63013883d93ca538eab430b4f5242916b878f618: ``TritonAttentionImpl``
  turns a decoder layer's ``sliding_window`` W into ``window_size = (W - 1, 0)`` and passes ``sinks``, one per query
  head.
- ``vllm/model_executor/models/gpt_oss.py`` @ a6b6cfaa0cedff84872a0118380c6cfea91b635d: ``OAIAttention``: a
  ``sinks`` parameter of ``num_attention_heads`` values per layer, ``sliding_window = config.sliding_window`` (128)
  on even layers and None on odd ones, scale ``head_dim ** -0.5``, all layers with sinks.
- ``tests/kernels/attention/test_triton_unified_attention.py`` @ 003ee61625d33ae27df77f97748cb5867d0747b6:
  ``ref_paged_attn``, whose layout this follows (packed queries ``(N, H, D)``, a paged cache with block tables,
  ``query_lens``/``kv_lens``) and whose window mask (``torch.triu`` with diagonal ``kv_len - (query_len + W) + 1``)
  is the same ``W`` keys as the kernel's. At that commit it takes no ``sinks``: the sink term here is read from the
  kernel.

What the kernel computes, for query head ``h`` at absolute position ``p = kv_len - query_len + i``: key ``j`` is
visible iff ``j <= p`` and, with a window ``W``, ``p - j < W`` -- the query itself and the ``W - 1`` keys before it,
``W`` keys in all. Starting from ``M = sinks[h]``, ``L = 1``, ``acc = 0`` each tile does ``m = max(M, max_j s_j)``,
``L = L exp(M - m) + sum_j exp(s_j - m)``, ``acc = acc exp(M - m) + sum_j exp(s_j - m) v_j``, ``M = m``, so that at
the end ``acc / L = sum_j exp(s_j) v_j / (exp(sinks[h]) + sum_j exp(s_j))``: the sink is one more logit in every
query's softmax denominator, whatever the window, and contributes no value (GPT-OSS's ``softmax([scores, sink])
[..., :T] v``). In the 3D decode path only segment 0 starts from the sink; the other segments' ``L = 1`` is
multiplied by ``exp(-inf - m) = 0`` at their first tile (or, for a segment without tiles, by ``exp(M_s - max) = 0``
in the reduction), so the sink enters once. The kernel also zeroes ``V`` rows outside the window of a query block's
first query, keys whose probabilities are already 0: a guard against non-finite cache contents, not a change to the
result; this reference reads only the ``kv_len`` cached keys of each sequence.

Not written out: soft-capping (vLLM caps the scores, ``cap * tanh(s / cap)``, before masking, and never the sink;
GPT-OSS has no soft cap and posenc.attention none to compare with), ALiBi, the QQ bias, multimodal prefix ranges and
FP8/INT8 caches. Differences from ``posenc.attention(..., sinks=)``:

- Sliding window: the same keys. ``posenc.attention(..., window=W)`` keeps ``p - W < k <= p`` by *positions*, the
  kernel ``p - j < W`` by cache index: equal where the positions are the cache indices (GPT-OSS), whether posenc is
  given the whole cache or only its last ``min(W, p + 1)`` keys (a ring buffer); ``window=W + 1``, or no window, is a
  different result (``tests/test_attention_sinks_vllm.py`` checks all three).
- Precision: the kernel converts the ``sinks`` tensor it is given to float32 (``.to(tl.float32)``), so float32 sinks
  with bfloat16 queries stay unrounded (vLLM's GPT-OSS creates its sinks in the default dtype at model construction,
  the model's dtype, so a bfloat16 model hands it bfloat16 sinks). posenc's eager and flex backends do the same; its
  sdpa backend rounds the sinks to q's dtype (they travel in SDPA's float mask). Identical for the float32 and
  float64 inputs compared here; for float32 sinks with bfloat16/float16 inputs sdpa uses the rounded sink
  (``test_half_precision_sink_rounding`` pins which backend does what).

Shapes:
    query (N, H, D), N = sum(query_lens): the new tokens of every sequence, packed; key_cache, value_cache
    (num_blocks, block_size, Hkv, D), Hkv dividing H (query head h reads kv head h // (H / Hkv)); block_tables
    (num_seqs, max_blocks) integer; query_lens, kv_lens: one per sequence, kv_len >= query_len (the cached tokens and
    the new ones); sinks (H,) or None -> (N, H, D) float64.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch


def paged_attention_with_sinks(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    *,
    query_lens: Sequence[int],
    kv_lens: Sequence[int],
    block_tables: torch.Tensor,
    scale: float,
    sinks: torch.Tensor | None,
    sliding_window: int | None = None,
    tile_size: int = 32,
    num_segments: int | None = None,
) -> torch.Tensor:
    """vLLM's ``unified_attention(..., sinks=sinks, window_size=(W - 1, 0))`` in float64; see the module docstring.

    Args:
        sliding_window: vLLM's ``sliding_window`` of the layer (GPT-OSS: 128 on even layers), None for full
            attention.
        tile_size: keys per step of the online softmax (vLLM: 16 or 32); the result does not depend on it.
        num_segments: vLLM's ``num_par_softmax_segments`` (16) to run the 3D split-KV path, which vLLM takes when
            every sequence decodes one token; None for the 2D path.
    """
    _, block_size, num_kv_heads, head_size = key_cache.shape
    use_3d = num_segments is not None and max(query_lens) == 1
    outputs = []
    start = 0
    for i, (query_len, kv_len) in enumerate(zip(query_lens, kv_lens, strict=True)):
        q = query[start : start + query_len].double()  # (S, H, D)
        blocks = block_tables[i, : -(-kv_len // block_size)].long()
        k = key_cache[blocks].reshape(-1, num_kv_heads, head_size)[:kv_len].double()  # (T, Hkv, D)
        v = value_cache[blocks].reshape(-1, num_kv_heads, value_cache.shape[-1])[:kv_len].double()  # (T, Hkv, D)
        out = _sequence(q, k, v, scale, sinks, sliding_window, tile_size, num_segments if use_3d else None)
        outputs.append(out)
        start += query_len
    return torch.cat(outputs, dim=0)


def _sequence(q, k, v, scale, sinks, window, tile_size, num_segments):  # noqa: ANN001, ANN202
    """One sequence: q (S, H, D), k/v (T, Hkv, D) float64 -> (S, H, D)."""
    s, h = q.shape[:2]
    t = k.shape[0]
    group = h // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)  # (T, H, D): kv head h // group
    scores = torch.einsum("shd,thd->hst", q, k) * scale  # (H, S, T)
    p = (t - s) + torch.arange(s)[:, None]  # absolute query positions, context_len + query_pos
    j = torch.arange(t)[None, :]
    visible = j <= p
    if window is not None:
        visible = visible & (p - j < window)  # SLIDING_WINDOW = 1 + (W - 1)
    scores = scores.masked_fill(~visible, float("-inf"))
    values = v.transpose(0, 1)  # (H, T, D)
    sink = torch.full((h, s), float("-inf"), dtype=torch.float64)
    if sinks is not None:
        sink = sinks.double()[:, None].expand(h, s)  # (H, S): init_softmax_M
    tiles = list(range(0, t, tile_size))
    if num_segments is None:
        m, l_, acc = _online_softmax(scores, values, sink, tiles, tile_size)
        return (acc / l_[..., None]).transpose(0, 1)
    # 3D: segment g covers tiles [g * per, (g + 1) * per); segments starting past the keys are never launched.
    per = -(-t // (num_segments * tile_size))
    parts = []
    for g in range(num_segments):
        if g * per * tile_size >= t:
            break
        start = sink if g == 0 else torch.full_like(sink, float("-inf"))
        parts.append(_online_softmax(scores, values, start, tiles[g * per : (g + 1) * per], tile_size))
    m_s = torch.stack([m for m, _, _ in parts])  # (G, H, S)
    overall = m_s.amax(0)
    weight = torch.exp(m_s - overall)
    expsum = (torch.stack([l_ for _, l_, _ in parts]) * weight).sum(0)
    acc = (torch.stack([a for _, _, a in parts]) * weight[..., None]).sum(0)
    out = torch.where(expsum[..., None] == 0, 0.0, acc / expsum[..., None])
    return out.transpose(0, 1)


def _online_softmax(scores, values, m0, tiles, tile_size):  # noqa: ANN001, ANN202
    """The kernel's loop from ``M = m0``, ``L = 1``, ``acc = 0``: scores (H, S, T), values (H, T, D), m0 (H, S)."""
    m = m0.clone()
    l_ = torch.ones_like(m)
    acc = torch.zeros(*m.shape, values.shape[-1], dtype=torch.float64)
    for a in tiles:
        tile = scores[..., a : a + tile_size]  # (H, S, tile)
        m_new = torch.maximum(m, tile.amax(-1))
        m_new = torch.where(m_new > -math.inf, m_new, 0.0)  # a row masked so far: 0, not -inf (no NaN)
        p = torch.exp(tile - m_new[..., None])
        alpha = torch.exp(m - m_new)
        l_ = l_ * alpha + p.sum(-1)
        acc = acc * alpha[..., None] + p @ values[:, a : a + tile_size]
        m = m_new
    return m, l_, acc
