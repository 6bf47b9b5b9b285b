"""One attention for every encoding: ``eager`` (the reference), ``sdpa`` and ``flex`` backends (``BACKENDS``).

``attention(q, k, v, encoding=...)`` applies the encoding's hooks in one place -- ``rotate`` before the scores,
``bias``/``score_mod`` on the scores, ``value_term`` on the output -- so a model is written once for every
encoding. Masks come from indices, never positions: queries are the *last* ``S`` of the ``T`` keys (bottom-right
alignment, as in KV-cache decoding), so positions can be anything an encoding accepts. An encoding that reads the
keys (``needs_keys``: CoPE) runs on eager and sdpa only; one that reads how many keys a query sees
(``reads_key_count``) gets the count from the mask (``_Mask.key_counts``). docs/guides/attention.md has the rest.

References: FlexAttention (Dong et al. 2024, arXiv:2412.05496); attention sinks of GPT-OSS (OpenAI 2025,
"gpt-oss-120b & gpt-oss-20b Model Card", arXiv:2508.10925; after Xiao et al. 2024, arXiv:2309.17453), checked
against transformers' GPT-OSS ``eager_attention_forward`` / ``GptOssAttention`` and a float64 write-up of vLLM's
Triton unified attention with sinks (``tests/reference/vllm_sinks.py``); chunked local attention of Llama 4's iRoPE
(Meta 2025, "The Llama 4 herd"); sliding windows of Mistral 7B (Jiang et al. 2023, arXiv:2310.06825), Gemma 2/3's
local layers and GPT-OSS's even layers. The masks' checks are listed on ``_Mask``.
"""

from __future__ import annotations

import math
import warnings
from typing import TYPE_CHECKING, cast

import torch
import torch.nn.functional as F

from posenc._checks import (
    check_choice,
    check_number,
    check_positions,
    check_same_device,
    fail,
)
from posenc.documents import document_lengths
from posenc.encodings._base import Encoding, check_sequence_positions
from posenc.encodings.nope import NoPE
from posenc.remapping import RemapMethod, remap_attention

if TYPE_CHECKING:
    from torch.nn.attention.flex_attention import BlockMask

    from posenc.encodings.rotary import RotaryEmbedding

#: The backends, chosen by ``attention(backend=...)``:
#:
#: - ``eager``: explicit ``softmax(q k^T * scale + bias + mask) v`` in float32 (float64 for float64 inputs); runs
#:   every encoding, Shaw et al.'s value term included. The reference the other backends are tested against.
#: - ``sdpa``: ``torch.nn.functional.scaled_dot_product_attention``; the fused causal kernels without a bias, else the
#:   bias materialised ``(B|1, H, S, T)`` and rounded to the input dtype (as Hugging Face's ALiBi models do).
#: - ``flex``: compiled FlexAttention with the encoding's ``score_mod`` and a block-sparse mask: memory linear in
#:   length, the bias in float32. No backward and no float64 on CPU; narrow heads zero-padded
#:   (``CPU_FLEX_MIN_HEAD_DIM``, ``CUDA_FLEX_MIN_HEAD_DIM``); at most ``FLEX_KERNELS_KEPT`` kernels kept.
#: - ``auto``: ``eager`` for value terms; ``sdpa`` without a bias; with a bias, ``flex`` where it can run (CUDA, or
#:   CPU without gradients) once the materialised bias would exceed ``FLEX_MIN_BIAS_BYTES``, and at any size inside
#:   ``torch.compile``; ``sdpa`` otherwise. ``sinks``, ``chunk_size`` and ``window`` count as a bias here (sdpa
#:   materialises a mask for them).
BACKENDS = ("auto", "eager", "sdpa", "flex")

#: ``auto`` moves a bias encoding to ``flex`` once the materialised bias ``B*H*S*T*4`` bytes would exceed this:
#: below it, SDPA with the bias is fast and needs no compilation (FlexAttention compiles once per shape).
FLEX_MIN_BIAS_BYTES = 32 * 2**20

#: FlexAttention's block size: the block mask has one entry per 128 x 128 tile.
FLEX_BLOCK = 128

#: On CPU, q and k narrower than this are zero-padded to it before FlexAttention (scores unchanged): the compiled CPU
#: kernel of torch 2.13 returns wrong rows or NaN for head dims of 16 and below on AVX2-only processors (seen on an
#: AMD EPYC without AVX-512).
CPU_FLEX_MIN_HEAD_DIM = 32
#: On CUDA, q, k and v narrower than this are zero-padded to it before FlexAttention: Inductor's kernels refuse
#: head dims below 16 ("NYI: embedding dimension of the query, key, and value must be at least 16", torch 2.11 on an
#: H200, 2026-11-27). Zero channels of q and k leave every score as it is; those of v are sliced off the output.
CUDA_FLEX_MIN_HEAD_DIM = 16

#: The largest ``window`` and ``chunk_size``: positions are compared as int64 (a larger Python int overflows there).
MAX_SPAN = 2**63 - 1

#: ``key_counts`` builds the mask in slices of at most this many (query, key) pairs (a bool each): linear memory.
KEY_COUNT_TILE = 2**24

#: Compiled FlexAttention kernels one process keeps (one per shape, encoding and mask kind). Past torch's recompile
#: limit, torch runs FlexAttention *uncompiled* -- scores materialised ``S x T``, other roundings -- so at this many
#: posenc drops the kernels and compiles anew (see ``_compiled_flex``).
FLEX_KERNELS_KEPT = 64

#: Whether posenc compiles FlexAttention outside ``torch.compile`` (the default, and what to run). ``False`` runs
#: torch's uncompiled FlexAttention: the same ``score_mod`` and block mask over a materialised ``S x T`` score matrix,
#: no compilation per shape -- for debugging posenc's masks and score_mods, and for the tests of them that need not
#: pay a compilation per shape (``tests/conftest.py``; with bfloat16 inputs its roundings differ, see above).
FLEX_COMPILED = True


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    encoding: Encoding | None = None,
    q_positions: torch.Tensor | None = None,
    k_positions: torch.Tensor | None = None,
    causal: bool = True,
    document_ids: torch.Tensor | None = None,
    seq_len: int | float | torch.Tensor | None = None,
    scale: float | None = None,
    backend: str = "auto",
    remap: RemapMethod | None = None,
    sinks: torch.Tensor | None = None,
    chunk_size: int | None = None,
    window: int | None = None,
) -> torch.Tensor:
    """Scaled dot-product attention with a positional encoding.

    Args:
        q, k, v: queries, keys, values; see Shapes. Same dtype and device.
        encoding: any ``posenc.Encoding`` (``posenc.build(name, ...)``); None is NoPE. Its ``embed`` hook is not
            applied here: absolute encodings act on the token embeddings before the projections. One that reads the
            number of keys a query sees (SSMax, ``nope_temperature``) gets it counted from this call's mask;
            one defined over the causal past only (``causal_only``) refuses ``causal=False``.
        q_positions, k_positions: the tokens' positions, on q's device: integers, or finite float32/float64
            (float16/bfloat16 cannot hold positions past 2048/256 and are refused). Defaults: keys ``arange(T)``,
            queries the last ``S`` of them; one given and ``S == T`` -> the other is the same.
        causal: query ``i`` sees keys ``j <= i + T - S`` (queries are the last ``S`` keys).
        document_ids: packed sequences: a document id per key; a query sees only keys of its own document (queries
            take the ids of the last ``S`` keys). Positions reset per document are the caller's to pass.
        seq_len: the length whose frequencies a length-dependent encoding uses (RoPE with ``dynamic``/``longrope``
            scaling; every other encoding ignores it): a number or 0-d tensor (the global length on a
            context-parallel rank, the current length of a KV cache), or one per key ``(T,)``/``(B|1, T)``, queries
            taking the last ``S``. Default: each document's own length with ``document_ids``
            (``document_lengths``), else ``max(q_positions, k_positions) + 1``.
        scale: score scale, a positive finite number; default ``1 / sqrt(D)``.
        backend: one of ``BACKENDS`` (see there).
        remap: a remapping method (``posenc.remapping``: Self-Extend, Dual Chunk Attention, ReRoPE, LM-Infinite)
            with a ``RotaryEmbedding`` encoding: each (query, key) pair is rotated at the positions of the method's
            branch for it (``posenc.remapping.remap_attention``, causal only; backends ``auto``, ``eager``,
            ``sdpa``).
        sinks: learned attention sinks (GPT-OSS), one logit per query head, float: each softmax's denominator gets
            ``exp(sinks[h])`` and the output nothing for it, ``softmax([scores, sink])[..., :T] v``. Trainable
            (gradients reach it on every backend that has a backward). Exact on every backend; sdpa rounds them to
            q's dtype (eager and flex keep float32 sinks in float32, as vLLM does): use those where that matters.
        chunk_size: chunked local attention (Llama 4's RoPE layers, ``attention_chunk_size``): a query sees only keys
            in its own chunk of positions, ``q_pos // chunk_size == k_pos // chunk_size`` (floored), on top of
            ``causal`` and ``document_ids``. A positive integer; needs sequence positions ``(S,)``/``(B, S)``. Every
            backend; flex builds no ``S x T`` tensor.
        window: sliding-window attention (Mistral, Gemma 2/3's local layers, GPT-OSS's even layers;
            transformers' ``sliding_window``): a query at position ``p`` sees only keys at positions ``k`` with
            ``p - window < k <= p``, ``window`` keys counting its own, on top of ``causal`` and ``document_ids``. A
            positive integer; needs sequence positions ``(S,)``/``(B, S)`` and ``causal=True``. Combines with
            ``chunk_size`` and ``sinks``. Every backend; flex builds no ``S x T`` tensor.

    Shapes:
        q (B, H, S, D), k (B, Hkv, T, D), v (B, Hkv, T, Dv), sinks (H,) -> (B, H, S, Dv), in q's dtype. Hkv divides
        H (grouped-query attention: query head h reads key head h // (H / Hkv)). Positions as the encoding takes
        them; (S,) or (B, S) and (T,) or (B, T) with ``chunk_size`` or ``window``. document_ids (T,) or (B, T).
    """
    _check_qkv(q, k, v)
    check_choice("backend", backend, BACKENDS)
    if sinks is not None:
        _check_sinks(sinks, q)
    for name, span in (("chunk_size", chunk_size), ("window", window)):
        if span is not None:
            _check_span(name, span)
    if remap is not None:
        given = {"sinks": sinks, "chunk_size": chunk_size, "window": window}
        for name in (n for n, x in given.items() if x is not None):
            fail(name, "<given>", "None with remap= (remapping methods run their own branch masks and softmax)")
        if not causal:
            fail("causal", causal, "True with remap= (remapping methods are defined over the causal past)")
        if backend == "flex":
            fail("backend", backend, "'auto', 'eager' or 'sdpa' with remap=")
        return remap_attention(
            q,
            k,
            v,
            method=remap,
            encoding=cast("RotaryEmbedding", encoding),  # remap_attention refuses any other encoding
            q_positions=q_positions,
            k_positions=k_positions,
            document_ids=document_ids,
            seq_len=seq_len,
            scale=scale,
            backend=backend,
        )
    if not isinstance(causal, bool):
        fail("causal", causal, "True or False")
    if window is not None and not causal:
        # transformers' bidirectional windows differ by one key: |p - k| <= W (masking_utils) vs < W (Gemma 3).
        fail("window", window, "None with causal=False (a sliding window here is causal: p - window < k <= p)")
    if scale is not None:
        # SDPA's math kernel multiplies q and k by sqrt(scale) each: a scale <= 0 gives NaN there, not an error.
        check_number("scale", scale, above=0.0)
    if encoding is None:
        encoding = NoPE()
    if not isinstance(encoding, Encoding):
        fail("encoding", type(encoding).__name__, "a posenc.Encoding (posenc.build(name, ...)) or None")
    encoding.check_heads(q)
    if encoding.causal_only and not causal:
        fail("causal", causal, f"True: {type(encoding).__name__} is defined over the causal past only")
    encoding.check_mask(window=window, chunk_size=chunk_size)
    b, _, s, _ = q.shape
    t = k.shape[2]
    if causal and s > t:
        fail("q.shape[2]", s, f"at most the number of keys, {t}, with causal=True (queries are the last keys)")
    q_pos, k_pos = _positions(q_positions, k_positions, s, t, q.device)
    # One of them given and S == T: the other is the same tensor; errors name the argument the caller passed.
    q_name = "k_positions" if q_positions is None and k_positions is not None else "q_positions"
    k_name = "q_positions" if k_positions is None and q_positions is not None else "k_positions"
    encoding.check_positions(q_pos, s, b, q_name)
    encoding.check_positions(k_pos, t, b, k_name)
    for name, pos in ((q_name, q_pos), (k_name, k_pos)):
        check_positions(pos, name)  # exact and finite: the encoding's hooks then find them checked (no second sync)
        check_same_device(name, pos, q.device, "q's device")
    docs = None if document_ids is None else _check_documents(document_ids, b, t, q.device)
    chunks = None if chunk_size is None else _chunk_ids(q_pos, k_pos, q_name, k_name, s, t, b, chunk_size)
    windowed = None
    if window is not None:
        windowed = (*_sequence_positions(q_pos, k_pos, q_name, k_name, s, t, b, "window"), window)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)

    mask = _Mask(causal=causal, offset=t - s, docs=docs, s=s, t=t, chunks=chunks, window=windowed)

    if encoding.per_head_keys and k.shape[1] != q.shape[1]:
        k, v = _repeat_kv(k, q.shape[1]), _repeat_kv(v, q.shape[1])
    # SSMax's n, Llama 4's temperature: the keys each query sees, counted from the mask every backend applies
    counted = {"key_count": mask.key_counts(q.device)} if encoding.reads_key_count else {}
    if encoding.depends_on_length:
        if seq_len is None and docs is not None:
            seq_len = document_lengths(k_pos, docs)
        # depends_on_length: a rotary encoding whose rotate takes seq_len= (Encoding's hook does not)
        q, k = encoding.rotate(q, k, q_pos, k_pos, seq_len=seq_len, **counted)  # type: ignore[call-arg]
    else:
        if seq_len is not None:
            _check_ignored_seq_len(seq_len)
        q, k = encoding.rotate(q, k, q_pos, k_pos, **counted)
    backend = _resolve_backend(
        backend, encoding, q, k, v, sinks=sinks, chunked=chunks is not None, windowed=windowed is not None
    )
    if backend == "eager":
        return _eager(q, k, v, encoding, q_pos, k_pos, mask, scale, sinks)
    if backend == "sdpa":
        return _sdpa(q, k, v, encoding, q_pos, k_pos, mask, scale, sinks)
    return _flex(q, k, v, encoding, q_pos, k_pos, mask, scale, sinks)


def _check_span(name: str, value: object) -> None:
    """``window`` / ``chunk_size``: a positive whole number of positions that int64 positions can be compared with."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= MAX_SPAN:
        fail(name, value, "a positive integer up to 2**63 - 1 (positions are compared as int64)")


def _check_ignored_seq_len(seq_len: object) -> None:
    """``seq_len`` for an encoding that does not read it: still a length, so a typo does not pass unnoticed."""
    if isinstance(seq_len, torch.Tensor):
        if seq_len.dtype == torch.bool or seq_len.is_complex():
            fail("seq_len.dtype", seq_len.dtype, "an integer or floating point dtype")
    else:
        check_number("seq_len", seq_len, minimum=1.0)


# ---------------------------------------------------------------------------------------------------------------
# Validation


def _check_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, torch.Tensor):
            fail(name, type(x).__name__, "a torch.Tensor")
        if x.dim() != 4:
            fail(f"{name}.shape", tuple(x.shape), "4 dimensions (B, heads, length, head_dim)")
        if not x.is_floating_point():
            fail(f"{name}.dtype", x.dtype, "a floating-point dtype")
    for name, x in (("k", k), ("v", v)):
        if x.dtype != q.dtype:
            fail(f"{name}.dtype", x.dtype, f"q's dtype, {q.dtype}")
        if x.device != q.device:
            fail(f"{name}.device", x.device, f"q's device, {q.device}")
        if x.shape[0] != q.shape[0]:
            fail(f"{name}.shape[0]", x.shape[0], f"q's batch size, {q.shape[0]}")
    if k.shape[-1] != q.shape[-1]:
        fail("k.shape[-1]", k.shape[-1], f"q's head_dim, {q.shape[-1]}")
    if v.shape[1:3] != k.shape[1:3]:
        fail("v.shape", tuple(v.shape), f"k's heads and length, (B, {k.shape[1]}, {k.shape[2]}, Dv)")
    h, hkv = q.shape[1], k.shape[1]
    if hkv == 0 or h % hkv != 0:
        fail("k.shape[1]", hkv, f"a number of key/value heads that divides the {h} query heads")


def _positions(
    q_pos: torch.Tensor | None, k_pos: torch.Tensor | None, s: int, t: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    if q_pos is None and k_pos is None:
        k_pos = torch.arange(t, device=device)
        return k_pos[t - s :], k_pos
    if k_pos is None or q_pos is None:
        if s != t:
            missing = "k_positions" if k_pos is None else "q_positions"
            fail(missing, None, f"the positions of all {t if k_pos is None else s} tokens, since S={s} != T={t}")
        one = cast(torch.Tensor, k_pos if q_pos is None else q_pos)  # not both None: returned above
        return one, one
    return q_pos, k_pos


def _check_documents(docs: torch.Tensor, b: int, t: int, device: torch.device) -> torch.Tensor:
    check_sequence_positions(docs, t, b, "document_ids")
    if docs.is_floating_point() or docs.is_complex() or docs.dtype == torch.bool:
        fail("document_ids.dtype", docs.dtype, "an integer dtype (one id per key)")
    if docs.device != device:
        fail("document_ids.device", docs.device, f"q's device, {device}")
    return docs if docs.dim() == 2 else docs.unsqueeze(0)  # (B|1, T)


def _check_sinks(sinks: object, q: torch.Tensor) -> None:
    if not isinstance(sinks, torch.Tensor):
        fail("sinks", type(sinks).__name__, "a torch.Tensor of shape (H,), one logit per query head")
    if sinks.shape != (q.shape[1],):
        fail("sinks.shape", tuple(sinks.shape), f"({q.shape[1]},), one logit per query head")
    if not sinks.is_floating_point():
        fail("sinks.dtype", sinks.dtype, "a floating-point dtype")
    if sinks.device != q.device:
        fail("sinks.device", sinks.device, f"q's device, {q.device}")


def _sequence_positions(
    q_pos: torch.Tensor, k_pos: torch.Tensor, q_name: str, k_name: str, s: int, t: int, b: int, argument: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sequence positions, which ``argument`` (``chunk_size``, ``window``) reads: ``(B|1, S)`` and ``(B|1, T)``."""
    for name, pos, n in ((q_name, q_pos, s), (k_name, k_pos, t)):
        ok = (pos.dim() == 1 and pos.shape[0] == n) or (pos.dim() == 2 and pos.shape[1] == n and pos.shape[0] in (1, b))
        if not ok:
            fail(f"{name}.shape", tuple(pos.shape), f"({n},) or ({b}, {n}) with {argument}= (sequence positions)")
    return (q_pos if q_pos.dim() == 2 else q_pos[None]), (k_pos if k_pos.dim() == 2 else k_pos[None])


def _chunk_ids(
    q_pos: torch.Tensor, k_pos: torch.Tensor, q_name: str, k_name: str, s: int, t: int, b: int, chunk_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each query's and key's chunk, ``floor(position / chunk_size)``: ``(B|1, S)`` and ``(B|1, T)`` int64."""
    q_pos, k_pos = _sequence_positions(q_pos, k_pos, q_name, k_name, s, t, b, "chunk_size")
    q_ids, k_ids = (torch.div(p, chunk_size, rounding_mode="floor").long() for p in (q_pos, k_pos))
    return q_ids, k_ids


def _needs_grad(encoding: Encoding, *tensors: torch.Tensor | None) -> bool:
    if not torch.is_grad_enabled():
        return False
    return any(x is not None and x.requires_grad for x in tensors) or any(
        p.requires_grad for p in encoding.parameters()
    )


def _resolve_backend(
    backend: str,
    encoding: Encoding,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    sinks: torch.Tensor | None = None,
    chunked: bool = False,
    windowed: bool = False,
) -> str:
    value_term = encoding.has_value_term
    flex_ok, why = _flex_can_run(encoding, q, k, v, sinks)
    if backend == "auto":
        if value_term:
            return "eager"
        if not (encoding.has_bias or sinks is not None or chunked or windowed):
            return "sdpa"
        b, h, s, _ = q.shape
        big = b * h * s * k.shape[2] * 4 >= FLEX_MIN_BIAS_BYTES
        return "flex" if flex_ok and (big or torch.compiler.is_compiling()) else "sdpa"
    if value_term and backend != "eager":
        fail("backend", backend, f"'eager' or 'auto': {type(encoding).__name__} adds a value term only eager runs")
    if backend == "flex" and not flex_ok:
        fail("backend", backend, f"'eager', 'sdpa' or 'auto' here: {why}")
    return backend


def _flex_can_run(
    encoding: Encoding, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sinks: torch.Tensor | None = None
) -> tuple[bool, str]:
    if encoding.needs_keys:
        return False, f"{type(encoding).__name__}'s bias reads every key, which a FlexAttention score_mod cannot"
    if q.device.type == "cpu":
        if _needs_grad(encoding, q, k, v, sinks):
            return False, f"FlexAttention has no backward on CPU in torch {torch.__version__} (use torch.no_grad())"
        if q.dtype not in (torch.float32, torch.bfloat16, torch.float16):
            return False, f"FlexAttention on CPU takes float32, bfloat16 or float16, not {q.dtype}"
    return True, ""


def _repeat_kv(x: torch.Tensor, heads: int) -> torch.Tensor:
    """Key/value head ``g`` serves query heads ``g * r ... g * r + r - 1`` (Hugging Face's ``repeat_kv`` order)."""
    return x.repeat_interleave(heads // x.shape[1], dim=1)  # (B, Hkv, T, D) -> (B, H, T, D)


# ---------------------------------------------------------------------------------------------------------------
# Masks: causal (bottom-right aligned), document, chunk and sliding-window masks, as a dense boolean or a
# FlexAttention block mask.


class _Mask:
    """Which keys each query sees: ``j <= i + offset`` when causal, equal document ids, equal chunk ids, and key
    positions within the window, ``q_pos - k_pos < W``.

    Chunks and windows read *positions*, not indices, so they restart with per-document positions of a packed row
    and follow explicit positions of a KV cache (a cache holding only the last ``W - 1`` keys plus the new ones gives
    the same result). Dense boolean for eager/sdpa; for flex a ``mask_mod`` and a block mask from each 128-token
    tile's range (no ``S x T`` tensor). Checked against: chunks, transformers' ``create_chunked_causal_mask`` and
    Llama 4's ``eager_attention_forward``; windows, transformers' ``sliding_window_causal_mask_function`` /
    ``create_sliding_window_causal_mask`` (``kv_idx > q_idx - sliding_window``), Mistral's attention through its
    sliding-window cache, and the float64 vLLM reference with sinks. Windows are causal only: transformers'
    bidirectional ones disagree by a key (``|p - k| <= W`` in ``sliding_window_bidirectional_overlay``, ``< W`` in
    Gemma 3's).

    ``chunks``: ``(B|1, S)`` query and ``(B|1, T)`` key chunk ids (``floor(position / chunk_size)``) or None.
    ``window``: ``(B|1, S)`` query positions, ``(B|1, T)`` key positions and ``W``, or None.
    """

    def __init__(
        self,
        *,
        causal: bool,
        offset: int,
        docs: torch.Tensor | None,
        s: int,
        t: int,
        chunks: tuple[torch.Tensor, torch.Tensor] | None = None,
        window: tuple[torch.Tensor, torch.Tensor, int] | None = None,
    ) -> None:
        self.causal, self.offset, self.docs, self.s, self.t, self.chunks = causal, offset, docs, s, t, chunks
        self.window = window

    @property
    def local(self) -> bool:
        """Whether a chunk or window mask reads positions."""
        return self.chunks is not None or self.window is not None

    @property
    def trivial(self) -> bool:
        return not self.causal and self.docs is None and not self.local

    def dense(self, device: torch.device) -> torch.Tensor | None:
        """``(B|1, 1, S, T)`` boolean, True where attention is allowed; None when everything is."""
        if self.trivial:
            return None
        return self._rows(device, 0, self.s).unsqueeze(1)  # (B|1, 1, S, T)

    def _rows(self, device: torch.device, lo: int, hi: int) -> torch.Tensor:
        """Queries ``lo .. hi - 1`` of the mask: ``(B|1, hi - lo, T)`` boolean, True where attention is allowed."""
        i = torch.arange(lo, hi, device=device)[:, None]
        j = torch.arange(self.t, device=device)[None, :]
        allowed = torch.ones(1, hi - lo, self.t, dtype=torch.bool, device=device)
        if self.causal:
            allowed = allowed & (j <= i + self.offset)
        if self.docs is not None:
            q_docs = self.docs[:, self.t - self.s + lo : self.t - self.s + hi]
            allowed = allowed & (q_docs[:, :, None] == self.docs[:, None, :])  # (B|1, S', T)
        if self.chunks is not None:
            q_chunks, k_chunks = self.chunks
            allowed = allowed & (q_chunks[:, lo:hi, None] == k_chunks[:, None, :])  # (B|1, S', T)
        if self.window is not None:
            q_pos, k_pos, w = self.window
            allowed = allowed & (q_pos[:, lo:hi, None] - k_pos[:, None, :] < w)  # (B|1, S', T)
        return allowed

    def key_counts(self, device: torch.device) -> torch.Tensor:
        """How many keys each query sees: ``(S,)`` int64 when every row counts alike, else ``(B, S)``.

        Without documents, chunks or a window, ``T`` or (causal) ``i + offset + 1``; otherwise summed over the mask
        built ``KEY_COUNT_TILE`` pairs at a time, so memory stays linear in length (as FlexAttention's does).

        This is the ``key_count=`` that ``reads_key_count`` encodings (SSMax's ``s log n``, Llama 4's temperature)
        get: causal, documents, chunks and window together, so the factor follows what is masked, on every backend
        and in a KV-cache decode alike. A call given only some of a query's keys counts those. Sinks are not
        counted (a logit in the softmax's denominator, not a key; GPT-OSS's and vLLM's ``sliding_window`` counts
        only tokens too), so ``sinks -> -inf`` gives the layer without sinks exactly.
        """
        if self.docs is None and not self.local:
            if not self.causal:
                return torch.full((self.s,), self.t, dtype=torch.int64, device=device)
            return torch.arange(self.offset + 1, self.offset + self.s + 1, device=device)  # (S,)
        rows = max(1, KEY_COUNT_TILE // (self._batch() * self.t))
        tiles = [self._rows(device, lo, min(lo + rows, self.s)).sum(-1) for lo in range(0, self.s, rows)]
        counts = torch.cat(tiles, dim=-1)  # (B|1, S)
        return counts[0] if counts.shape[0] == 1 else counts

    def _batch(self) -> int:
        """Rows of the mask: B where documents, chunks or window positions differ per row, else 1."""
        parts = [self.docs] + list(self.chunks or ()) + list(self.window[:2] if self.window is not None else ())
        return max((x.shape[0] for x in parts if x is not None), default=1)

    def mask_mod(self, sink_key: bool = False):  # noqa: ANN201 - FlexAttention mask_mod
        """``sink_key``: one more key at index ``T`` (the attention sink) that every query sees."""
        inner = self._mask_mod()
        if not sink_key:
            return inner
        t = self.t

        def with_sink(b, h, q_idx, kv_idx):  # noqa: ANN001, ANN202
            return (kv_idx == t) | inner(b, h, q_idx, torch.clamp(kv_idx, max=t - 1))

        return with_sink

    def _mask_mod(self):  # noqa: ANN202
        causal, offset, docs, start = self.causal, self.offset, self.docs, self.t - self.s

        def causal_mod(b, h, q_idx, kv_idx):  # noqa: ANN001, ANN202
            return kv_idx <= q_idx + offset

        def everything(b, h, q_idx, kv_idx):  # noqa: ANN001, ANN202
            return kv_idx >= 0

        if docs is None and not self.local:
            return causal_mod if causal else everything
        one_row = docs is not None and docs.shape[0] == 1
        q_chunks, k_chunks = self.chunks if self.chunks is not None else (None, None)
        q_one = q_chunks is not None and q_chunks.shape[0] == 1
        k_one = k_chunks is not None and k_chunks.shape[0] == 1
        q_pos, k_pos, w = self.window if self.window is not None else (None, None, None)
        qp_one = q_pos is not None and q_pos.shape[0] == 1
        kp_one = k_pos is not None and k_pos.shape[0] == 1

        def doc_mod(b, h, q_idx, kv_idx):  # noqa: ANN001, ANN202
            same = causal_mod(b, h, q_idx, kv_idx) if causal else everything(b, h, q_idx, kv_idx)
            if docs is not None:
                row = 0 if one_row else b
                same = same & (docs[row, q_idx + start] == docs[row, kv_idx])
            if q_chunks is not None and k_chunks is not None:  # both or neither
                same = same & (q_chunks[0 if q_one else b, q_idx] == k_chunks[0 if k_one else b, kv_idx])
            if q_pos is not None and k_pos is not None and w is not None:  # all or none
                same = same & (q_pos[0 if qp_one else b, q_idx] - k_pos[0 if kp_one else b, kv_idx] < w)
            return same

        return doc_mod

    def block_mask(self, device: torch.device, sink_key: bool = False) -> BlockMask | None:
        """FlexAttention block mask built from per-tile bounds: O((S/128) * (T/128)), never an S x T tensor.

        Built even when every key is visible: without one, FlexAttention on CPU materialises an S x T mask.
        ``sink_key``: ``T + 1`` keys, the last (the attention sink) seen by every query.
        """
        from torch.nn.attention.flex_attention import BlockMask

        t = self.t + sink_key
        n_q, n_k = -(-self.s // FLEX_BLOCK), -(-t // FLEX_BLOCK)
        q_lo = torch.arange(n_q, device=device) * FLEX_BLOCK
        q_hi = torch.clamp(q_lo + FLEX_BLOCK, max=self.s) - 1
        k_lo = torch.arange(n_k, device=device) * FLEX_BLOCK
        k_hi = torch.clamp(k_lo + FLEX_BLOCK, max=t) - 1
        some = torch.ones(1, n_q, n_k, dtype=torch.bool, device=device)
        every = some.clone()
        if self.causal:
            some = some & (k_lo[None, :] <= q_hi[:, None] + self.offset)
            every = every & (k_hi[None, :] <= q_lo[:, None] + self.offset)
        if self.docs is not None:
            q_min, q_max = _tile_range(self.docs[:, self.t - self.s :], n_q)  # (B|1, n_q)
            k_min, k_max = _tile_range(self.docs, n_k)  # (B|1, n_k)
            some = some & (q_min[:, :, None] <= k_max[:, None, :]) & (k_min[:, None, :] <= q_max[:, :, None])
            every = every & (q_min == q_max)[:, :, None] & (k_min == k_max)[:, None, :]
            every = every & (q_min[:, :, None] == k_min[:, None, :])
        if self.chunks is not None:
            # Chunk ids need not rise along a packed row (positions restart per document): ranges, as for documents.
            q_min, q_max = _tile_range(self.chunks[0], n_q)  # (B|1, n_q)
            k_min, k_max = _tile_range(self.chunks[1], n_k)  # (B|1, n_k)
            some = some & (q_min[:, :, None] <= k_max[:, None, :]) & (k_min[:, None, :] <= q_max[:, :, None])
            every = every & (q_min == q_max)[:, :, None] & (k_min == k_max)[:, None, :]
            every = every & (q_min[:, :, None] == k_min[:, None, :])
        if self.window is not None:
            # Some pair of a tile is in the window when its closest pair is, every pair when its farthest pair is.
            q_min, q_max = _tile_range(self.window[0], n_q)  # (B|1, n_q)
            k_min, k_max = _tile_range(self.window[1], n_k)  # (B|1, n_k)
            some = some & (q_min[:, :, None] - k_max[:, None, :] < self.window[2])
            every = every & (q_max[:, :, None] - k_min[:, None, :] < self.window[2])
        if sink_key:  # the sink's tile is partial for every query tile
            sink_tile = torch.arange(n_k, device=device) == self.t // FLEX_BLOCK  # (n_k,)
            some, every = some | sink_tile, every & ~sink_tile
        partial = some & ~every  # (B|1, n_q, n_k)
        return BlockMask.from_kv_blocks(
            *_kv_blocks(partial),
            *_kv_blocks(every),
            BLOCK_SIZE=FLEX_BLOCK,
            mask_mod=self.mask_mod(sink_key),
            seq_lengths=(self.s, t),
        )


def _tile_range(docs: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Min and max value (document id, chunk id, position) of each 128-token tile: ``(B, L) -> (B, n), (B, n)``."""
    pad = n * FLEX_BLOCK - docs.shape[1]
    padded = torch.cat([docs, docs[:, -1:].expand(-1, pad)], dim=1)  # (B, n * 128): the last id repeated
    tiles = padded.view(docs.shape[0], n, FLEX_BLOCK)  # (B, n, 128)
    return tiles.amin(-1), tiles.amax(-1)


def _kv_blocks(tiles: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(B, n_q, n_k)`` selected tiles -> FlexAttention's counts ``(B, 1, n_q)`` and indices ``(B, 1, n_q, n_k)``."""
    counts = tiles.sum(-1, dtype=torch.int32)
    order = torch.argsort((~tiles).to(torch.int8), dim=-1, stable=True).to(torch.int32)  # selected tiles first
    return counts[:, None], order[:, None]


# ---------------------------------------------------------------------------------------------------------------
# Backends


def _eager(q, k, v, encoding, q_pos, k_pos, mask, scale, sinks=None):  # noqa: ANN001, ANN202
    dtype = torch.promote_types(q.dtype, torch.float32)
    heads = q.shape[1]
    kf, vf = _repeat_kv(k, heads).to(dtype), _repeat_kv(v, heads).to(dtype)
    scores = (q.to(dtype) @ kf.transpose(-1, -2)) * scale  # (B, H, S, T)
    bias = _bias(encoding, q, k, q_pos, k_pos, mask, scale)
    if bias is not None:
        scores = scores + bias.to(dtype)
    allowed = mask.dense(q.device)
    if allowed is not None:
        scores = scores.masked_fill(~allowed, float("-inf"))
    if sinks is None:
        weights = torch.softmax(scores, dim=-1)
    else:
        # GPT-OSS: the sink is one more logit per head in the softmax, dropped before the values.
        sink = sinks.to(dtype).view(1, -1, 1, 1).expand(*scores.shape[:-1], 1)  # (B, H, S, 1)
        weights = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]  # (B, H, S, T)
    out = weights @ vf  # (B, H, S, Dv)
    extra = encoding.value_term(weights, q_pos, k_pos)
    if extra is not None:
        if extra.shape[-1] != out.shape[-1]:
            fail("v.shape[-1]", v.shape[-1], f"{extra.shape[-1]}, the width of {type(encoding).__name__}'s value term")
        out = out + extra.to(dtype)
    return out.to(q.dtype)


def _sdpa(q, k, v, encoding, q_pos, k_pos, mask, scale, sinks=None):  # noqa: ANN001, ANN202
    gqa = k.shape[1] != q.shape[1]
    bias = _bias(encoding, q, k, q_pos, k_pos, mask, scale)
    plain_causal = mask.causal and mask.docs is None and not mask.local and mask.s == mask.t
    if bias is None and sinks is None and plain_causal:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=gqa)
    allowed = mask.dense(q.device)
    attn_mask = allowed
    if bias is not None or sinks is not None:
        attn_mask = q.new_zeros(1, 1, mask.s, mask.t) if bias is None else bias.to(q.dtype)
        if allowed is not None:
            attn_mask = attn_mask.masked_fill(~allowed, float("-inf"))
    if sinks is not None:
        # The sink as one more key: a zero key's logit is q . 0 * scale + mask = the sink exactly, a zero value adds
        # nothing. SDPA gives no log-sum-exp to rescale by, so the mask carries it: (B|1, H, S, T + 1), q's dtype.
        h = q.shape[1]
        attn_mask = attn_mask.expand(attn_mask.shape[0], h, mask.s, mask.t)  # (B|1, H, S, T)
        sink = sinks.to(q.dtype).view(1, h, 1, 1).expand(attn_mask.shape[0], h, mask.s, 1)  # (B|1, H, S, 1)
        attn_mask = torch.cat([attn_mask, sink], dim=-1)  # (B|1, H, S, T + 1)
        k = torch.cat([k, k.new_zeros(*k.shape[:2], 1, k.shape[3])], dim=2)  # (B, Hkv, T + 1, D)
        v = torch.cat([v, v.new_zeros(*v.shape[:2], 1, v.shape[3])], dim=2)  # (B, Hkv, T + 1, Dv)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, scale=scale, enable_gqa=gqa)


def _bias(encoding, q, k, q_pos, k_pos, mask, scale):  # noqa: ANN001, ANN202
    """The encoding's materialised bias; ``needs_keys`` encodings also get the keys and the dense mask."""
    if encoding.needs_keys:
        return encoding.bias(q_pos, k_pos, q=q, scale=scale, k=k, mask=mask.dense(q.device))
    return encoding.bias(q_pos, k_pos, q=q, scale=scale)


def _flex(q, k, v, encoding, q_pos, k_pos, mask, scale, sinks=None):  # noqa: ANN001, ANN202
    from torch.nn.attention.flex_attention import flex_attention

    score_mod = encoding.score_mod(q_pos, k_pos, q=q, scale=scale)
    if score_mod is None and type(encoding).bias is not Encoding.bias:
        fail("backend", "flex", f"'eager' or 'sdpa': {type(encoding).__name__} defines bias() but no score_mod()")
    if sinks is not None:
        # The sink as one more key, index T, whose score the score_mod replaces by the sink (exact) and whose zero
        # value adds nothing. Rescaling by FlexAttention's log-sum-exp would spare the K/V copy, but compiled CPU
        # FlexAttention has no return_lse in torch 2.13; this runs the same on every device.
        score_mod = _sink_score_mod(score_mod, sinks.to(torch.promote_types(q.dtype, torch.float32)), mask.t)
        k = torch.cat([k, k.new_zeros(*k.shape[:2], 1, k.shape[3])], dim=2)  # (B, Hkv, T + 1, D)
        v = torch.cat([v, v.new_zeros(*v.shape[:2], 1, v.shape[3])], dim=2)  # (B, Hkv, T + 1, Dv)
    # Compiled CPU FlexAttention (torch 2.13, AVX2-only CPUs such as AMD EPYC without AVX-512) returns wrong rows or
    # NaN for q/k head dims of 16 and below; CUDA's refuses q, k or v below 16. Zero channels of q and k leave every
    # score as it is (scale is explicit); zero channels of v add zero output channels, sliced off below.
    qk_min, v_min = _flex_min_head_dims(q.device.type)
    if q.shape[-1] < qk_min:
        q, k = F.pad(q, (0, qk_min - q.shape[-1])), F.pad(k, (0, qk_min - k.shape[-1]))  # (B, H, S, D) -> qk_min
    dv = v.shape[-1]
    if dv < v_min:
        v = F.pad(v, (0, v_min - dv))  # (B, Hkv, T, Dv) -> (B, Hkv, T, v_min)
    block_mask = mask.block_mask(q.device, sink_key=sinks is not None)
    kwargs = {"score_mod": score_mod, "block_mask": block_mask, "scale": scale, "enable_gqa": k.shape[1] != q.shape[1]}
    if not isinstance(FLEX_COMPILED, bool):
        fail("posenc.attention.FLEX_COMPILED", FLEX_COMPILED, "True or False")
    if torch.compiler.is_compiling() or not FLEX_COMPILED:
        out = flex_attention(q, k, v, **kwargs)
    else:
        out = _compiled_flex(flex_attention, q, k, v, **kwargs)
    return out[..., :dv] if out.shape[-1] != dv else out


def _flex_min_head_dims(device_type: str) -> tuple[int, int]:
    """The narrowest (q/k, v) head dims posenc hands to FlexAttention on this kind of device (narrower: padded)."""
    return (CPU_FLEX_MIN_HEAD_DIM, 0) if device_type == "cpu" else (CUDA_FLEX_MIN_HEAD_DIM, CUDA_FLEX_MIN_HEAD_DIM)


_COMPILED_FLEX = None
_FLEX_DROPS = 0


def _compiled_flex(flex_attention, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
    """``torch.compile(flex_attention)(*args, **kwargs)``, static shapes, with at most ``FLEX_KERNELS_KEPT`` kernels.

    Static shapes: one kernel per shape. Dynamic-shape CPU kernels fail to build in torch 2.13 (inductor emits an
    undeclared split-size variable; with automatic dynamic shapes, ``dynamic=None``, a decode of growing key length
    built for ALiBi alone but not with a window mask or sinks: C++ compile errors, tried 2026-11-26), and the fixed
    shapes of training and evaluation compile once. A process that meets many shapes (an evaluation over lengths and
    encodings, a long test session, a forced ``flex`` decode whose key length grows) would pass torch's recompile
    limit, after which torch runs FlexAttention uncompiled: an ``S x T`` score matrix and other roundings (with
    bfloat16 inputs a float32 sink reached the scores rounded to bfloat16: ``tests/test_attention_flex_kernels.py``),
    so results would depend on what ran before. Instead, when ``FLEX_KERNELS_KEPT`` kernels exist, they are dropped
    (dynamo's ``reset_code`` on FlexAttention's code object only: other compiled code keeps its kernels; another
    library's compiled FlexAttention shares that code object and recompiles too) and the call compiles anew, with a
    warning the first time in a process.
    """
    global _COMPILED_FLEX, _FLEX_DROPS
    kept = FLEX_KERNELS_KEPT
    if isinstance(kept, bool) or not isinstance(kept, int) or kept < 1:
        fail("posenc.attention.FLEX_KERNELS_KEPT", kept, "a whole number of kernels, at least 1")
    if _COMPILED_FLEX is None:
        _COMPILED_FLEX = torch.compile(flex_attention, dynamic=False)
    code = flex_attention.__code__
    if _flex_kernels(code) >= kept:
        torch._dynamo.eval_frame.reset_code(code)
        _FLEX_DROPS += 1
        if _FLEX_DROPS == 1:
            warnings.warn(
                f"posenc: {kept} compiled FlexAttention kernels (one per shape) in this process; "
                "dropped to compile anew rather than let torch run FlexAttention uncompiled. Each new shape costs a "
                "compilation: keep shapes fixed (pad to a few lengths), or use backend='sdpa' for decoding.",
                stacklevel=4,
            )
    accumulated = max(torch._dynamo.config.accumulated_recompile_limit, kept + 1)
    with torch._dynamo.config.patch(recompile_limit=kept + 1, accumulated_recompile_limit=accumulated):
        return _COMPILED_FLEX(*args, **kwargs)


def _flex_kernels(code) -> int:  # noqa: ANN001
    """How many compiled entries torch keeps for ``code`` (torch 2.11-2.13; 0, i.e. never drop, where a later torch
    renames the private functions this reads and resets with)."""
    frames = torch._dynamo.eval_frame
    if not (hasattr(frames, "_debug_get_cache_entry_list") and hasattr(frames, "reset_code")):
        return 0
    return len(frames._debug_get_cache_entry_list(code))


def _sink_score_mod(score_mod, sinks, t):  # noqa: ANN001, ANN202
    """The encoding's ``score_mod`` on keys ``0 .. T-1``; ``sinks[h]`` as the score of key ``T``, the sink."""

    def with_sink(score, b, h, q_idx, kv_idx):  # noqa: ANN001, ANN202
        if score_mod is not None:  # the sink's index clamped: an encoding's tables have T entries
            score = score_mod(score, b, h, q_idx, torch.clamp(kv_idx, max=t - 1))
        return torch.where(kv_idx == t, sinks[h].to(score.dtype), score)

    return with_sink
