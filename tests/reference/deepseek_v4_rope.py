"""DeepSeek-V4's RoPE on its shared key/value head, written out in float64 from transformers' model file.

Source: ``huggingface/transformers`` 5.24.0 (the installed version), ``src/transformers/models/deepseek_v4/
modeling_deepseek_v4.py``:

- ``rotate_half``: ``stack((-x[..., 1::2], x[..., 0::2]), -1).flatten(-2)`` (GPT-J pairs);
- ``apply_rotary_pos_emb(x, cos, sin)``: ``cos``/``sin`` hold one value per pair and are ``repeat_interleave``d to
  the rope width ``2F``; the *last* ``2F`` channels of ``x`` become ``x * cos + rotate_half(x) * sin``, the leading
  ``D - 2F`` ("nope") channels pass through;
- ``DeepseekV4RotaryEmbedding.forward``: ``freqs = position * inv_freq``, ``cos = cos(freqs) * attention_scaling``,
  ``sin`` likewise (no duplication: interleaved pairs);
- ``DeepseekV4HCACompressor.forward``: compressed entry ``w`` is rotated at ``w * compress_rate +
  first_window_position``; query ``t`` sees entry ``w`` iff ``w < (t + 1) // compress_rate`` (its ``block_bias``);
- ``DeepseekV4Attention.forward`` with ``eager_attention_forward``: q and kv rotated, ``kv`` both keys and values
  (one head, repeated to every query head), ``scores = q k^T * scaling + mask``, one sink logit per head concatenated,
  the row max subtracted, softmax, the sink column dropped, ``probs @ v``; then
  ``apply_rotary_pos_emb(attn_output, cos, -sin)`` at the query positions.

vLLM's ``DeepseekV4ScalingRotaryEmbedding`` (``vllm-project/vllm``, ``vllm/ir/ops/rotary_embedding.py`` @
0c1d2cc94016883a88656a016db32872aad27adf, ``_apply_deepseek_rope`` with ``inverse=True`` and ``rope_dim_offset =
head_size - rotary_dim``) is the same rotation and inverse. The class itself, ``DeepseekV4ScalingRotaryEmbedding``
in ``vllm/model_executor/layers/rotary_embedding/deepseek_scaling_rope.py``, is read from the vLLM fork
``Whamp/vllm`` @ 96e9b37479db8ff9bee719172a12164aaa88fb6e (the upstream file stored for reading, @ 7bc8d408, predates
the class): ``forward_native`` rotates the last ``rotary_dim`` channels, ``inverse=True`` negates ``sin``, the
cos/sin cache is float32 (``freqs.cos() * mscale``), the rotation runs in float32 and is cast back to the input's dtype,
``is_neox_style=False`` takes GPT-J pairs (``repeat_interleave``) -- the rotation and inverse written here.

Everything here is float64 and written as loops over heads where the model file broadcasts, so that nothing in it
shares code with posenc.
"""

from __future__ import annotations

import torch

F64 = torch.float64


def rotate_pairs(x: torch.Tensor) -> torch.Tensor:
    """transformers' DeepSeek-V4 ``rotate_half``: ``(x0, x1, x2, x3, ...) -> (-x1, x0, -x3, x2, ...)``."""
    return torch.stack((-x[..., 1::2], x[..., 0::2]), dim=-1).flatten(-2)


def tables(positions: torch.Tensor, inv_freq: torch.Tensor, attention_scaling: float = 1.0):
    """(cos, sin) of ``positions * inv_freq``, one per pair, times the attention scaling: ``(..., S, F)``."""
    freqs = positions.to(F64)[..., None] * inv_freq.to(F64)
    return freqs.cos() * attention_scaling, freqs.sin() * attention_scaling


def rotate_tail(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *, inverse: bool = False) -> torch.Tensor:
    """``apply_rotary_pos_emb``: the last ``2F`` channels of ``x (..., S, D)`` rotated; ``inverse``: ``sin`` negated."""
    x = x.to(F64)
    cos2 = cos.to(F64).repeat_interleave(2, dim=-1)
    sin2 = sin.to(F64).repeat_interleave(2, dim=-1) * (-1.0 if inverse else 1.0)
    width = cos2.shape[-1]
    nope, rope = x[..., :-width], x[..., -width:]
    return torch.cat((nope, rope * cos2 + rotate_pairs(rope) * sin2), dim=-1)


def compressed_positions(count: int, rate: int, start: int = 0) -> torch.Tensor:
    return torch.tensor([w * rate + start for w in range(count)], dtype=torch.int64)


def compressed_visible(q_positions: torch.Tensor, count: int, rate: int) -> torch.Tensor:
    """``block_bias == 0``: entry ``w`` visible to the query at ``t`` iff ``w < (t + 1) // rate``."""
    return torch.tensor([[w < (int(t) + 1) // rate for w in range(count)] for t in q_positions.reshape(-1)]).view(
        *q_positions.shape, count
    )


def shared_kv_attention(q, kv, q_positions, kv_positions, inv_freq, *, mask, scale, sinks, attention_scaling=1.0):
    """``DeepseekV4Attention``'s positional path in float64: rotate q ``(B, H, S, D)`` and kv ``(B, 1, T, D)``,
    attend with the sink logit, rotate the output back at the query positions.

    Positions ``(S,)`` / ``(T,)``; ``mask`` ``(S, T)`` bool, True where visible; ``sinks`` ``(H,)``."""
    batch, heads, s, _ = q.shape
    cos_q, sin_q = tables(q_positions, inv_freq, attention_scaling)
    cos_k, sin_k = tables(kv_positions, inv_freq, attention_scaling)
    out = torch.empty(q.shape, dtype=F64)
    for b in range(batch):
        k = rotate_tail(kv[b, 0], cos_k, sin_k)  # (T, D): the keys, and the values
        for h in range(heads):
            qh = rotate_tail(q[b, h], cos_q, sin_q)  # (S, D)
            scores = qh @ k.T * scale
            scores = scores.masked_fill(~mask, float("-inf"))
            combined = torch.cat((scores, sinks.to(F64)[h].expand(s, 1)), dim=-1)
            combined = combined - combined.max(dim=-1, keepdim=True).values
            probs = torch.softmax(combined, dim=-1)[:, :-1]
            out[b, h] = rotate_tail(probs @ k, cos_q, sin_q, inverse=True)
    return out
