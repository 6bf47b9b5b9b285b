"""Qwen2 (Qwen2.5, causal) forward in float64, read straight from a llama.cpp GGUF file with the ``gguf`` package.

Source of the formulas: the Qwen team's own implementation, which they released as transformers'
``models/qwen2/modeling_qwen2.py`` ("Copyright 2024 The Qwen team, Alibaba Group and the HuggingFace Inc. team";
read in transformers 5.24.0): ``Qwen2RMSNorm``, ``Qwen2Attention`` (q/k/v with bias, o without),
``rotate_half`` / ``apply_rotary_pos_emb``, ``Qwen2MLP``, ``Qwen2DecoderLayer``. The formulas carry over; the code is
written here, not copied, and the model under test is loaded by transformers, so what is independent is: the
tensors read with ``gguf`` (not transformers' loader), their layout, and the attention and RoPE arithmetic in float64.

- RMSNorm ``x * rsqrt(mean(x^2) + eps) * w`` (no ``1 + w``: Qwen2's converter stores ``w`` itself);
- a block: ``x + o(attn(rope(q), rope(k), v))`` over ``input_layernorm(x)``, then ``x + down(silu(gate(h)) * up(h))``
  over ``h = post_attention_layernorm(x)``; q, k, v projections with biases;
- attention: causal, GQA (query head ``h`` reads kv head ``h // (H / Hkv)``), scale ``head_dim ** -0.5``; no sliding
  window (``use_sliding_window`` false in the released configs, and nothing about one in the GGUF header);
- RoPE over the whole head, halves layout (``rotate_half``), ``inv_freq = base ** (-2i / head_dim)``, base from the
  header (1 000 000 for Qwen2.5);
- final norm, then ``output.weight`` when the file has one (this Qwen2.5-Coder-0.5B-Instruct AWQ file does: it was
  converted with an ``lm_head``), else the embedding (tied).

The GGUF layout (llama.cpp): ``convert_hf_to_gguf.py`` ``Qwen2Model.modify_tensors`` (commit
0024aa7417efd50a7c2a79e049dfbbbceb0beaaf) passes q/k through unpermuted
(only ``LlamaModel`` permutes for its interleaved RoPE), and llama.cpp rotates Qwen2 NEOX-style:
``llama_model_rope_type`` lists ``LLM_ARCH_QWEN2`` under "the pairs of head values are offset by n_rot/2"
(``src/llama-model.cpp``, commit a5410f046c01d01330c8a42f13b64a211fedf2c3). So the rows are used as stored, halves
layout, no inverse permutation.

Shapes:
    ids ``(B, S)``; hidden states ``(B, S, Dm)``; q ``(B, H, S, D)``; k, v ``(B, Hkv, S, D)``;
    logits ``(B, S, V)`` (``logits`` yields vocabulary slices ``(B, S, chunk)``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from reference.gemma3 import attention, rope
from reference.gguf_tensors import GGUFTensors, layer_weights

Weights = Callable[[str, torch.dtype], torch.Tensor]  # a layer's tensors by name (``layer_weights``)


@dataclass(frozen=True)
class Qwen2Config:
    """The sizes and constants of one Qwen2 model (``from_gguf`` reads them from a file's header)."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    eps: float
    base: float

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @classmethod
    def from_gguf(cls, t: GGUFTensors) -> Qwen2Config:
        arch = t.value("general.architecture")
        if arch != "qwen2":
            raise ValueError(f"{t.path}: general.architecture {arch!r}, not 'qwen2'")
        key = lambda name: t.value(f"qwen2.{name}")
        return cls(
            layers=key("block_count"),
            hidden=key("embedding_length"),
            heads=key("attention.head_count"),
            kv_heads=key("attention.head_count_kv"),
            eps=float(key("attention.layer_norm_rms_epsilon")),
            base=float(key("rope.freq_base")),
        )


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``x / rms(x) * weight`` over the last dimension."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def block(x: torch.Tensor, weight: Weights, config: Qwen2Config, positions: torch.Tensor) -> torch.Tensor:
    """One decoder layer: ``(B, S, Dm) -> (B, S, Dm)``; ``weight(name, dtype)`` gives the layer's
    ``blk.{layer}.{name}``."""
    c = config
    w = lambda name, kind="weight": weight(f"{name}.{kind}", x.dtype)
    b, s, _ = x.shape

    h = rms_norm(x, w("attn_norm"), c.eps)
    q = (h @ w("attn_q").T + w("attn_q", "bias")).view(b, s, c.heads, c.head_dim).transpose(1, 2)  # (B, H, S, D)
    k = (h @ w("attn_k").T + w("attn_k", "bias")).view(b, s, c.kv_heads, c.head_dim).transpose(1, 2)  # (B, Hkv, S, D)
    v = (h @ w("attn_v").T + w("attn_v", "bias")).view(b, s, c.kv_heads, c.head_dim).transpose(1, 2)
    q, k = rope(q, positions, c.base), rope(k, positions, c.base)
    a = attention(q, k, v, scale=c.head_dim**-0.5, window=None)  # (B, H, S, D)
    x = x + a.transpose(1, 2).reshape(b, s, c.hidden) @ w("attn_output").T

    h = rms_norm(x, w("ffn_norm"), c.eps)  # post_attention_layernorm
    return x + (F.silu(h @ w("ffn_gate").T) * (h @ w("ffn_up").T)) @ w("ffn_down").T


def hidden_states(
    t: GGUFTensors,
    ids: torch.Tensor,
    *,
    config: Qwen2Config | None = None,
    dtypes: Sequence[torch.dtype] = (torch.float64,),
) -> list[torch.Tensor]:
    """The final-normed hidden states ``(B, S, Dm)`` of token ids ``(B, S)`` (positions ``0 .. S-1``), one per dtype,
    each computed in its dtype throughout (float64; float32 to measure what rounding alone moves), side by side layer
    by layer so each layer's weights are decoded once."""
    c = config or Qwen2Config.from_gguf(t)
    b, s = ids.shape
    xs = [t("token_embd.weight", ids.flatten(), dtype=dtype).view(b, s, c.hidden) for dtype in dtypes]
    positions = torch.arange(s)
    for layer in range(c.layers):
        weight = layer_weights(t, f"blk.{layer}.")
        xs = [block(x, weight, c, positions) for x in xs]
    norm = t("output_norm.weight")
    return [rms_norm(x, norm.to(x.dtype), c.eps) for x in xs]


def head_name(t: GGUFTensors) -> str:
    """The output matrix: ``output.weight``, or the embedding when the file ties them."""
    return "output.weight" if "output.weight" in t else "token_embd.weight"


def logits(
    t: GGUFTensors, hidden: Sequence[torch.Tensor], *, chunk: int = 8192
) -> Iterator[tuple[int, list[torch.Tensor]]]:
    """``(start, [h @ W[start:start + chunk].T for h in hidden])`` over the vocabulary, ``W`` the output matrix:
    slices ``(B, S, chunk)``, each slice of ``W`` decoded once for all ``hidden``, so the full ``(B, S, V)`` float64
    logits are never held at once."""
    name = head_name(t)
    vocab = int(t.infos[name].shape[-1])
    for start in range(0, vocab, chunk):
        rows = torch.arange(start, min(start + chunk, vocab))
        head = t(name, rows, dtype=torch.float32)
        yield start, [h @ head.to(h.dtype).T for h in hidden]
