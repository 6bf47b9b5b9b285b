"""Gemma 3 (text, causal) forward in float64, read straight from a llama.cpp GGUF file with the ``gguf`` package.

Reference implementation: google/gemma_pytorch, ``gemma/model.py`` and ``gemma/config.py`` at commit
014acb7ac4563a5f77c76d7ff98f31b568c16508 (2025-03-12, "1B working in GPUs now"): ``GemmaForCausalLM``,
``Gemma2DecoderLayer`` (used for Gemma 2 and 3), ``GemmaAttention``, ``RMSNorm``, ``GemmaMLP``,
``precompute_freqs_cis`` / ``apply_rotary_emb``, and the Gemma 3 configs ``get_config_for_1b`` ... ``_27b_v3``.
Written from those formulas, not copied; the authors' buffers (bfloat16 weights, a float32 ``complex64`` RoPE table,
a KV cache) are replaced by float64 throughout.

What the authors define, as applied here:

- embedding times ``sqrt(hidden_size)``; the output head is the embedding matrix (tied); no final soft-capping (the
  Gemma 3 configs leave ``final_logit_softcapping`` and ``attn_logit_softcapping`` None);
- RMSNorm ``x * rsqrt(mean(x^2) + eps) * (1 + w)``, also on each head's query and key (``use_qk_norm``), before RoPE;
- a block: ``x + post_attn_norm(attn(input_norm(x)))``, then ``x + post_ffw_norm(mlp(pre_ffw_norm(x)))``;
- MLP ``down(gelu_tanh(gate(x)) * up(x))``;
- attention: GQA (query head ``h`` reads kv head ``h // (H / Hkv)``: ``repeat_interleave``), the query scaled by
  ``query_pre_attn_scalar ** -0.5`` (None, i.e. ``head_dim``, for every Gemma 3 but the 27B's ``hidden / heads``);
- layer types ``(local, local, local, local, local, global)`` repeated (5:1); a local layer's mask keeps key ``j``
  for query ``i`` when ``i - window < j <= i`` (``tril(..., diagonal=-window)`` removed: ``window`` keys);
- RoPE over the whole head, ``inv_freq = base ** (-2i / head_dim)``, ``base`` 10 000 on local layers and 1 000 000 on
  global ones (``rope_wave_length``), the two halves of a head as the real and imaginary parts (``chunk(x, 2)``):
  ``[x1 cos - x2 sin, x1 sin + x2 cos]``. (The 4B-27B ``rope_scaling_factor=8`` on global layers does not apply to
  the 270M / 1B.)

What the GGUF holds (llama.cpp; the file's own header gives the sizes, eps, window and global base):

- ``convert_hf_to_gguf.py`` ``Gemma3Model`` (commit 0024aa7417efd50a7c2a79e049dfbbbceb0beaaf) stores every
  ``*norm.weight`` as ``1 + w`` (``norm_shift``), q/k norms included, and writes no ``output.weight``;
  ``src/models/gemma3.cpp`` (commit 569a0092b98e73bd222490441234144e52afd2ef) multiplies by the stored weight as it
  is (``build_norm``), so the stored value *is* the authors' ``1 + w`` and is applied unchanged here;
- Q/K are not permuted by the converter for Gemma, and llama.cpp rotates them NEOX-style (halves):
  ``llama_model_rope_type`` lists ``LLM_ARCH_GEMMA3`` under "the pairs of head values are offset by n_rot/2"
  (``src/llama-model.cpp``, commit a5410f046c01d01330c8a42f13b64a211fedf2c3) -- the authors' layout, unpermuted;
- the header has ``rope.freq_base`` (the global base) and ``attention.sliding_window`` only: the local base 10 000,
  the pattern 6 and the attention scale ``1/sqrt(head_dim)`` (but 27B) are the architecture's (``LLM_ARCH_GEMMA3``
  in ``src/llama-model.cpp``, as in the authors' config);
- graph order (``gemma3.cpp``): ``attn_norm`` -> q/k/v -> ``attn_q_norm``/``attn_k_norm`` -> RoPE -> scale ->
  attention -> ``attn_output`` -> ``post_attention_norm`` -> + ; ``ffn_norm`` -> GELU-gated FFN ->
  ``post_ffw_norm`` -> + ; ``output_norm`` -> ``token_embd`` (no ``output.weight`` in the file: tied).

Gemma 3 270M (the model this is run on) postdates that gemma_pytorch commit, which has no config for it; its
values are the file's plus the Gemma 3 rules above (Google's config.json for it says the same:
``query_pre_attn_scalar`` 256 = head_dim, window 512, ``rope_local_base_freq`` 10 000, 5:1 layer types).

Shapes:
    ids ``(B, S)``; hidden states ``(B, S, Dm)``; q ``(B, H, S, D)``; k, v ``(B, Hkv, S, D)``;
    logits ``(B, S, V)`` (``logits`` yields vocabulary slices ``(B, S, chunk)``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from reference.gguf_tensors import GGUFTensors, layer_weights

Weights = Callable[[str, torch.dtype], torch.Tensor]  # a layer's tensors by name (``layer_weights``)

LOCAL_BASE = 10_000.0  # rope_wave_length[LOCAL_SLIDING]; not in the GGUF header
PATTERN = 6  # attn_types: five local layers, then a global one


@dataclass(frozen=True)
class Gemma3Config:
    """The sizes and constants of one Gemma 3 model (``from_gguf`` reads them from a file's header)."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    eps: float
    window: int | None  # None: every layer global (a changed config, to see what the window moves)
    global_base: float
    local_base: float = LOCAL_BASE
    pattern: int = PATTERN
    query_pre_attn_scalar: float | None = None  # None: head_dim

    @classmethod
    def from_gguf(cls, t: GGUFTensors) -> Gemma3Config:
        arch = t.value("general.architecture")
        if arch != "gemma3":
            raise ValueError(f"{t.path}: general.architecture {arch!r}, not 'gemma3'")
        key = lambda name: t.value(f"gemma3.{name}")
        layers, hidden, heads = key("block_count"), key("embedding_length"), key("attention.head_count")
        head_dim = key("attention.key_length")
        return cls(
            layers=layers,
            hidden=hidden,
            heads=heads,
            kv_heads=key("attention.head_count_kv"),
            head_dim=head_dim,
            eps=float(key("attention.layer_norm_rms_epsilon")),
            window=key("attention.sliding_window"),
            global_base=float(key("rope.freq_base")),
            query_pre_attn_scalar=hidden // heads if layers == 62 else None,  # the 27B (get_config_for_27b_v3)
        )

    def is_global(self, layer: int) -> bool:
        return layer % self.pattern == self.pattern - 1


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``x / rms(x) * weight`` over the last dimension; ``weight`` as the GGUF stores it (the authors' ``1 + w``)."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def rope(x: torch.Tensor, positions: torch.Tensor, base: float) -> torch.Tensor:
    """Rotate ``(B, H, S, D)`` by ``positions`` ``(S,)``, halves layout: pair ``(i, i + D/2)`` turns by
    ``position * base ** (-2i / D)``."""
    d = x.shape[-1]
    inv_freq = base ** (-torch.arange(0, d, 2, dtype=x.dtype) / d)  # (F,)
    angles = positions.to(x.dtype)[:, None] * inv_freq  # (S, F)
    cos, sin = angles.cos(), angles.sin()
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, scale: float, window: int | None) -> torch.Tensor:
    """Causal softmax attention, GQA, optionally sliding: key ``j`` is seen by query ``i`` when
    ``i - window < j <= i``. q ``(B, H, S, D)``, k/v ``(B, Hkv, S, D)`` -> ``(B, H, S, D)``."""
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1)  # (B, H, S, D)
    v = v.repeat_interleave(group, dim=1)
    s = q.shape[2]
    i = torch.arange(s)[:, None]
    j = torch.arange(s)[None, :]
    allowed = j <= i
    if window is not None:
        allowed &= i - j < window
    scores = (q * scale) @ k.transpose(-1, -2)  # (B, H, S, S)
    scores = scores.masked_fill(~allowed, float("-inf"))
    return scores.softmax(dim=-1) @ v


def block(x: torch.Tensor, weight: Weights, layer: int, config: Gemma3Config, positions: torch.Tensor) -> torch.Tensor:
    """One decoder layer (``Gemma2DecoderLayer``): ``(B, S, Dm) -> (B, S, Dm)``; ``weight(name, dtype)`` gives the
    layer's ``blk.{layer}.{name}.weight``."""
    c = config
    w = lambda name: weight(f"{name}.weight", x.dtype)
    b, s, _ = x.shape

    h = rms_norm(x, w("attn_norm"), c.eps)
    q = (h @ w("attn_q").T).view(b, s, c.heads, c.head_dim).transpose(1, 2)  # (B, H, S, D)
    k = (h @ w("attn_k").T).view(b, s, c.kv_heads, c.head_dim).transpose(1, 2)  # (B, Hkv, S, D)
    v = (h @ w("attn_v").T).view(b, s, c.kv_heads, c.head_dim).transpose(1, 2)
    q = rms_norm(q, w("attn_q_norm"), c.eps)
    k = rms_norm(k, w("attn_k_norm"), c.eps)
    glob = c.is_global(layer)
    base = c.global_base if glob else c.local_base
    q, k = rope(q, positions, base), rope(k, positions, base)
    scale = (c.query_pre_attn_scalar or c.head_dim) ** -0.5
    a = attention(q, k, v, scale=scale, window=None if glob else c.window)  # (B, H, S, D)
    a = a.transpose(1, 2).reshape(b, s, c.heads * c.head_dim) @ w("attn_output").T  # (B, S, Dm)
    x = x + rms_norm(a, w("post_attention_norm"), c.eps)

    h = rms_norm(x, w("ffn_norm"), c.eps)  # pre_feedforward_layernorm
    h = (F.gelu(h @ w("ffn_gate").T, approximate="tanh") * (h @ w("ffn_up").T)) @ w("ffn_down").T
    return x + rms_norm(h, w("post_ffw_norm"), c.eps)


def hidden_states(
    t: GGUFTensors, ids: torch.Tensor, runs: Sequence[tuple[Gemma3Config, torch.dtype]] | None = None
) -> list[torch.Tensor]:
    """The final-normed hidden states ``(B, S, Dm)`` of token ids ``(B, S)`` (positions ``0 .. S-1``), one per
    ``(config, dtype)`` run, each computed in its dtype throughout (float64; float32 to measure what rounding alone
    moves; a changed config to see what a wrong window or base would move). The runs go layer by layer side by side,
    so each layer's weights are decoded once. Default: ``[(Gemma3Config.from_gguf(t), torch.float64)]``."""
    runs = runs or [(Gemma3Config.from_gguf(t), torch.float64)]
    b, s = ids.shape
    xs = []
    for c, dtype in runs:
        x = t("token_embd.weight", ids.flatten(), dtype=dtype).view(b, s, c.hidden)
        xs.append(x * torch.tensor(math.sqrt(c.hidden), dtype=dtype))
    positions = torch.arange(s)
    for layer in range(runs[0][0].layers):
        weight = layer_weights(t, f"blk.{layer}.")
        xs = [block(x, weight, layer, c, positions) for x, (c, _) in zip(xs, runs, strict=True)]
    norm = t("output_norm.weight")
    return [rms_norm(x, norm.to(x.dtype), c.eps) for x, (c, _) in zip(xs, runs, strict=True)]


def logits(
    t: GGUFTensors, hidden: Sequence[torch.Tensor], *, chunk: int = 8192
) -> Iterator[tuple[int, list[torch.Tensor]]]:
    """``(start, [h @ E[start:start + chunk].T for h in hidden])`` over the vocabulary: the tied head in slices
    ``(B, S, chunk)``, each slice of ``E`` decoded once for all ``hidden``, so the full ``(B, S, V)`` float64 logits
    are never held at once."""
    vocab = int(t.infos["token_embd.weight"].shape[-1])
    for start in range(0, vocab, chunk):
        rows = torch.arange(start, min(start + chunk, vocab))
        head = t("token_embd.weight", rows, dtype=torch.float32)
        yield start, [h @ head.to(h.dtype).T for h in hidden]
