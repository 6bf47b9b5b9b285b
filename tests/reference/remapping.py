"""The remapping methods written out one (query, key) pair at a time, in float64, from their reference code.

Each function decides for every pair ``(i, j)``, ``j <= i``, with an explicit if/else taken from the reference
repository (not from posenc's branch descriptions), the two positions RoPE rotates the query and the key at, and
any logit factor; then one softmax per query. Sources:

- Self-Extend: ``datamllab/LongLM`` ``self_extend_patch/Llama.py`` -- neighbour positions where ``i - j <
  group_size_2`` (the window), else the key at ``j // group_size_1`` and the query at ``i // group_size_1 +
  group_size_2 - group_size_2 // group_size_1``.
- Dual Chunk Attention: ``HKUNLP/ChunkLlama`` ``chunkllama_attn_replace.py`` (commit 847ae71, 2024-06-09, its
  latest) -- ``chunk_len = chunk_size - local_window``; tables ``q_t = arange(chunk_len)``, ``qc_t = (q_t +
  chunk_len).clamp(max=chunk_size)``, ``k_t = arange % chunk_len``; keys at ``k_t[j]``; the query's own chunk with
  ``q_t[i % chunk_len]``, the previous chunk with ``qc_t[i % chunk_len]``, earlier chunks with ``qc_t[chunk_len -
  1]``; every cos/sin table (queries and keys) times ``get_mscale(kv_seq_len / L)`` (``0.05 ln(scale) + 1`` for
  ``scale > 1``, else 1), ``L`` the model's ``max_position_embeddings``.
- Dual Chunk Attention as vLLM serves it: ``vllm-project/vllm`` ``vllm/attention/backends/dual_chunk_flash_attn.py``
  (``DualChunkFlashAttentionMetadata.scaling_factor = (0.1 * log(orig_seq_len / original_max_position_embeddings) +
  1).clip(min=1)``; the keys ``mul_(scaling_factor)`` before the cache, ``softmax_scale * scaling_factor`` in the
  prefill) with ``vllm/model_executor/layers/rotary_embedding/dual_chunk_rope.py`` (the same ``q``/``qc``/``k``
  tables as ChunkLlama; ``query_inter`` at ``qc[chunk_len - 1]``).
- ReRoPE / Leaky ReRoPE: ``bojone/rerope`` -- queries times ``max(1, log(i + 1) / log(L))``; ``i - j < window``:
  normal positions; else ReRoPE the query at ``window`` and the key un-rotated, Leaky ReRoPE the query at
  ``window + (i - window) / k`` and the key at ``j / k``.
- LM-Infinite: ``Glaciohound/LM-Infinite`` ``models/llama.py`` + ``lambda_attention.py`` -- ``i - j <
  local_branch``: normal positions; ``j < global_branch`` farther: the query at ``limit_distance`` (= local_branch)
  and the key un-rotated; every other pair masked.
- STRING: ``HKUNLP/STRING`` ``string_for_llama.py`` (read in ``justHungryMan/STRING`` at 9594e5b), its decoding
  path: with ``kv_seq_len = i + 1`` keys, ``shifted_size = kv_seq_len - diag_size``; the keys from
  ``shifted_size`` on (the last ``diag_size``) with the query at ``i``, the earlier ones with the query at ``i -
  diag_size + local_window``; keys at ``j``; every cos/sin table times ``attention_factor`` (the logit twice).
- StreamingLLM: ``mit-han-lab/streaming-llm`` ``kv_cache.py`` (``StartRecentKVCache.__call__`` after each token)
  and ``pos_shift/modify_llama.py``: the cache simulated token by token as ``examples/eval_long_ppl.py`` runs it;
  the query at the cache length before it is appended, each key at its index in the cache; keys not in the cache
  masked.

Shapes:
    q (B, H, S, D), k (B, Hkv, T, D), v (B, Hkv, T, Dv); positions are 0..T-1, queries the last S ->
    (B, H, S, Dv) float64.
"""

from __future__ import annotations

import math

import torch

from reference.rope_float64 import rotate_float64


def _attend(q, k, v, pair, inv_freq, *, layout="half", attention_factor=1.0, scale=None):
    """``pair(i, j) -> (query_pos, key_pos, logit_factor) or None`` (masked) for every causal pair."""
    b_, h_, s_, d_ = q.shape
    hkv, t_ = k.shape[1], k.shape[2]
    scale = d_**-0.5 if scale is None else scale
    out = torch.zeros(b_, h_, s_, v.shape[-1], dtype=torch.float64)

    def rot(x, p):
        return rotate_float64(
            x[None, :],
            torch.tensor([p], dtype=torch.float64),
            inv_freq,
            layout=layout,
            attention_factor=attention_factor,
        )[0]

    for b in range(b_):
        for h in range(h_):
            g = h // (h_ // hkv)
            for a in range(s_):
                i = t_ - s_ + a
                logits, keys = [], []
                for j in range(i + 1):
                    chosen = pair(i, j)
                    if chosen is None:
                        continue
                    qp, kp, factor = chosen
                    logits.append(float(rot(q[b, h, a], qp) @ rot(k[b, g, j], kp)) * scale * factor)
                    keys.append(j)
                w = torch.softmax(torch.tensor(logits, dtype=torch.float64), dim=0)
                out[b, h, a] = w @ v[b, g, keys].double()
    return out


def self_extend(q, k, v, inv_freq, *, window, group, **rope):
    def pair(i, j):
        if i - j < window:
            return i, j, 1.0
        return i // group + window - window // group, j // group, 1.0

    return _attend(q, k, v, pair, inv_freq, **rope)


def _chunk_positions(chunk_size, local_window):
    chunk_len = chunk_size - local_window
    q_t = list(range(chunk_len))
    qc_t = [min(p + chunk_len, chunk_size) for p in q_t]

    def positions(i, j):
        ci, cj = i // chunk_len, j // chunk_len
        if ci == cj:
            return q_t[i % chunk_len], j % chunk_len
        if cj == ci - 1:
            return qc_t[i % chunk_len], j % chunk_len
        return qc_t[chunk_len - 1], j % chunk_len

    return positions


def dual_chunk(q, k, v, inv_freq, *, chunk_size, local_window, pretraining_length=None, seq_len=None, **rope):
    """ChunkLlama; ``pretraining_length=None``: no ``get_mscale`` (the code before 2024-04-25). ``seq_len``: the
    reference's ``kv_seq_len``, default the number of keys."""
    positions = _chunk_positions(chunk_size, local_window)
    mscale = 1.0
    if pretraining_length is not None:
        scale = (k.shape[2] if seq_len is None else seq_len) / pretraining_length
        mscale = 1.0 if scale <= 1 else 0.05 * math.log(scale) + 1.0
    # mscale multiplies the query's and the key's cos/sin tables: the logit gets it twice.
    return _attend(q, k, v, lambda i, j: (*positions(i, j), mscale * mscale), inv_freq, **rope)


def dual_chunk_vllm(
    q, k, v, inv_freq, *, chunk_size, local_size, original_max_position_embeddings, seq_len=None, **rope
):
    """vLLM's dual-chunk attention without sparse attention: keys and the softmax scale times ``scaling_factor``."""
    positions = _chunk_positions(chunk_size, local_size)
    orig_seq_len = k.shape[2] if seq_len is None else seq_len
    scaling_factor = max(1.0, 0.1 * math.log(orig_seq_len / original_max_position_embeddings) + 1.0)
    k = k * scaling_factor
    d = q.shape[-1]
    scale = rope.pop("scale", None)
    scale = (d**-0.5 if scale is None else scale) * scaling_factor
    return _attend(q, k, v, lambda i, j: (*positions(i, j), 1.0), inv_freq, scale=scale, **rope)


def rerope(q, k, v, inv_freq, *, window, training_length, leak=None, **rope):
    def pair(i, j):
        factor = max(1.0, math.log(i + 1) / math.log(training_length)) if training_length else 1.0
        if i - j < window:
            return i, j, factor
        if leak is None:
            return window, 0, factor
        return window + (i - window) / leak, j / leak, factor

    return _attend(q, k, v, pair, inv_freq, **rope)


def lm_infinite(q, k, v, inv_freq, *, local_branch, global_branch, **rope):
    def pair(i, j):
        if i - j < local_branch:
            return i, j, 1.0
        if j < global_branch:
            return local_branch, 0, 1.0
        return None

    return _attend(q, k, v, pair, inv_freq, **rope)


def string(q, k, v, inv_freq, *, diag_size, local_window, attention_factor_string, **rope):
    def pair(i, j):
        kv_seq_len = i + 1
        shifted_size = kv_seq_len - diag_size
        factor = attention_factor_string * attention_factor_string
        if j >= shifted_size:  # k_cache[:, shifted_size:kv_seq_len]: query_states_1, at position_ids
            return i, j, factor
        return i - diag_size + local_window, j, factor  # k_cache[:, :shifted_size]: query_states_2

    return _attend(q, k, v, pair, inv_freq, **rope)


def streaming_llm(q, k, v, inv_freq, *, start_size, recent_size, **rope):
    cache_size = start_size + recent_size
    cached: dict[int, list[int]] = {}  # query i -> the token indices in the cache its forward attends to

    def keys_of(i):
        if i not in cached:
            past = list(range(i))  # the cache after token i - 1, evicted as StartRecentKVCache.__call__ does
            if len(past) > cache_size:
                past = past[:start_size] + past[len(past) - recent_size :]
            cached[i] = past + [i]  # torch.cat([past_key_value[0], key_states])
        return cached[i]

    def pair(i, j):
        keys = keys_of(i)
        if j not in keys:
            return None
        return len(keys) - 1, keys.index(j), 1.0  # query: position_ids = the past length; key: arange(kv_seq_len)

    return _attend(q, k, v, pair, inv_freq, **rope)


def plain(q, k, v, inv_freq, **rope):
    """Causal RoPE attention: every method inside its window."""
    return _attend(q, k, v, lambda i, j: (i, j, 1.0), inv_freq, **rope)
