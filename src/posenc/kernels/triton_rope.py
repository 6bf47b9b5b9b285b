"""RoPE on q and k in one Triton launch, forward and backward, registered with ``torch.library``.

One program rotates ``BLOCK_S`` tokens of one head; the grid's head axis covers the ``H`` query heads and then the
``Hkv`` key heads (GQA), so q and k go through one launch. The backward of a rotation is the rotation by the
negative angle: the same kernel with the sine negated, no saved activations. Why angles come from host-built
tables: ``rotary_qk``.

Paper: Su et al. 2021, "RoFormer" (arXiv:2104.09864). Checked against ``posenc.apply_rotary`` (itself checked
against Hugging Face ``apply_rotary_pos_emb`` and GPT-J) in ``tests/kernels/test_triton.py``, forward and gradients.

Shapes:
    q (B, H, S, D), k (B, Hkv, T, D), any strides; F = rotary dims / 2, 2F <= D (the rest passes through).
    tables: q_cos, q_sin (S, F) or (B, S, F) float32, one row per token (positions (S,) or (B, S));
    with ``cu_seqlens`` (N + 1,) int32 (B == 1, packed documents): (P, F) indexed by the position inside each
    document (token t of document i sits at position t - cu_seqlens[i]; P >= the longest document).

Importing this module imports Triton: ``posenc.kernels`` only imports it on first use.
"""

import math
from typing import Optional, cast

import torch
import triton
import triton.language as tl

from posenc._checks import check_choice, fail

LAYOUTS = ("half", "interleaved")
BLOCK_S = 16


@triton.jit
def _rope_tile(
    x_ptr, o_ptr, cos_ptr, sin_ptr, cu_ptr,
    b, h, s_block, S, n_seq, sign,
    sx_b, sx_h, sx_s, sx_d, so_b, so_h, so_s, so_d, st_b, st_s, st_f,
    F: tl.constexpr, D: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_F: tl.constexpr, BLOCK_P: tl.constexpr,
    INTERLEAVED: tl.constexpr, VARLEN: tl.constexpr, SEARCH_STEPS: tl.constexpr, COPY_TAIL: tl.constexpr,
):
    s = s_block * BLOCK_S + tl.arange(0, BLOCK_S)  # (BLOCK_S,) token index
    f = tl.arange(0, BLOCK_F)  # (BLOCK_F,) pair index
    ms = s < S
    m = ms[:, None] & (f < F)[None, :]  # (BLOCK_S, BLOCK_F)
    row = s
    if VARLEN:
        # Document of each token: the largest i with cu_seqlens[i] <= s (binary search over the N starts).
        # (Built from ``s``, not ``tl.zeros``: a jit'd stdlib helper the interpreter can't run if Triton was
        # imported before TRITON_INTERPRET was set.)
        lo = s * 0
        hi = s * 0 + (n_seq - 1)
        for _ in range(SEARCH_STEPS):
            mid = (lo + hi + 1) // 2
            start = tl.load(cu_ptr + mid, mask=ms, other=0)
            lo = tl.where(start <= s, mid, lo)
            hi = tl.where(start <= s, hi, mid - 1)
        row = s - tl.load(cu_ptr + lo, mask=ms, other=0)
    t = b * st_b + row[:, None].to(tl.int64) * st_s + f[None, :] * st_f  # (BLOCK_S, BLOCK_F) table offsets
    c = tl.load(cos_ptr + t, mask=m, other=0.0)
    sn = tl.load(sin_ptr + t, mask=m, other=0.0) * sign
    s64 = s[:, None].to(tl.int64)
    xp = x_ptr + b * sx_b + h * sx_h + s64 * sx_s  # (BLOCK_S, 1) row starts
    op = o_ptr + b * so_b + h * so_h + s64 * so_s
    if INTERLEAVED:
        # Whole rows in one contiguous (vectorised) load, then split into even/odd channels in registers;
        # loading x[2f] and x[2f + 1] separately compiles to 16-bit scalar accesses.
        ch = tl.arange(0, 2 * BLOCK_F)  # (2 BLOCK_F,) channel index
        mc = ms[:, None] & (ch < 2 * F)[None, :]  # (BLOCK_S, 2 BLOCK_F)
        x = tl.load(xp + ch[None, :] * sx_d, mask=mc, other=0.0).to(tl.float32)
        xa, xb = tl.split(tl.reshape(x, (BLOCK_S, BLOCK_F, 2)))  # (BLOCK_S, BLOCK_F, 2) -> 2 x (BLOCK_S, BLOCK_F)
        ra = xa * c - xb * sn
        rb = xb * c + xa * sn
        rot = tl.reshape(tl.join(ra, rb), (BLOCK_S, 2 * BLOCK_F))  # (BLOCK_S, BLOCK_F, 2) -> (BLOCK_S, 2 BLOCK_F)
        tl.store(op + ch[None, :] * so_d, rot.to(o_ptr.dtype.element_ty), mask=mc)
    else:
        xa = tl.load(xp + f[None, :] * sx_d, mask=m, other=0.0).to(tl.float32)
        xb = tl.load(xp + (f + F)[None, :] * sx_d, mask=m, other=0.0).to(tl.float32)
        ra = xa * c - xb * sn
        rb = xb * c + xa * sn
        tl.store(op + f[None, :] * so_d, ra.to(o_ptr.dtype.element_ty), mask=m)
        tl.store(op + (f + F)[None, :] * so_d, rb.to(o_ptr.dtype.element_ty), mask=m)
    if COPY_TAIL:
        p = 2 * F + tl.arange(0, BLOCK_P)  # (BLOCK_P,) pass-through channels
        mp = ms[:, None] & (p < D)[None, :]
        tail = tl.load(xp + p[None, :] * sx_d, mask=mp)
        tl.store(op + p[None, :] * so_d, tail, mask=mp)


@triton.jit
def _rope_qk_kernel(
    q_ptr, k_ptr, qo_ptr, ko_ptr, qc_ptr, qs_ptr, kc_ptr, ks_ptr, cu_ptr,
    H, S_q, S_k, n_seq, sign,
    sq_b, sq_h, sq_s, sq_d, sk_b, sk_h, sk_s, sk_d,
    sqo_b, sqo_h, sqo_s, sqo_d, sko_b, sko_h, sko_s, sko_d,
    sqt_b, sqt_s, sqt_f, skt_b, skt_s, skt_f,
    F: tl.constexpr, D: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_F: tl.constexpr, BLOCK_P: tl.constexpr,
    INTERLEAVED: tl.constexpr, VARLEN: tl.constexpr, SEARCH_STEPS: tl.constexpr, COPY_TAIL: tl.constexpr,
):
    s_block = tl.program_id(0)
    head = tl.program_id(1)
    b = tl.program_id(2).to(tl.int64)
    if head < H:
        _rope_tile(
            q_ptr, qo_ptr, qc_ptr, qs_ptr, cu_ptr, b, head.to(tl.int64), s_block, S_q, n_seq, sign,
            sq_b, sq_h, sq_s, sq_d, sqo_b, sqo_h, sqo_s, sqo_d, sqt_b, sqt_s, sqt_f,
            F, D, BLOCK_S, BLOCK_F, BLOCK_P, INTERLEAVED, VARLEN, SEARCH_STEPS, COPY_TAIL,
        )
    else:
        _rope_tile(
            k_ptr, ko_ptr, kc_ptr, ks_ptr, cu_ptr, b, (head - H).to(tl.int64), s_block, S_k, n_seq, sign,
            sk_b, sk_h, sk_s, sk_d, sko_b, sko_h, sko_s, sko_d, skt_b, skt_s, skt_f,
            F, D, BLOCK_S, BLOCK_F, BLOCK_P, INTERLEAVED, VARLEN, SEARCH_STEPS, COPY_TAIL,
        )


def _table_strides(t: torch.Tensor) -> tuple[int, int, int]:
    """``(batch, position, pair)`` strides of a ``(S, F)`` (batch stride 0) or ``(B, S, F)`` table."""
    return cast("tuple[int, int, int]", (0, *t.stride()) if t.dim() == 2 else tuple(t.stride()))


def _launch(q, k, q_out, k_out, q_cos, q_sin, k_cos, k_sin, cu_seqlens, layout, inverse, copy_tail) -> None:  # noqa: ANN001
    b, h, s_q, d = q.shape
    hkv, s_k = k.shape[1], k.shape[2]
    f = q_cos.shape[-1]
    if q.numel() + k.numel() == 0:
        return
    n_seq = 1 if cu_seqlens is None else cu_seqlens.numel() - 1
    cu = q_cos if cu_seqlens is None else cu_seqlens  # any pointer; unread without VARLEN
    grid = (triton.cdiv(max(s_q, s_k), BLOCK_S), h + hkv, b)
    _rope_qk_kernel[grid](
        q, k, q_out, k_out, q_cos, q_sin, k_cos, k_sin, cu,
        h, s_q, s_k, n_seq, -1.0 if inverse else 1.0,
        *q.stride(), *k.stride(), *q_out.stride(), *k_out.stride(), *_table_strides(q_cos), *_table_strides(k_cos),
        F=f, D=d, BLOCK_S=BLOCK_S, BLOCK_F=triton.next_power_of_2(f),
        BLOCK_P=triton.next_power_of_2(max(1, d - 2 * f)), INTERLEAVED=layout == "interleaved",
        VARLEN=cu_seqlens is not None, SEARCH_STEPS=max(1, math.ceil(math.log2(n_seq + 1))),
        COPY_TAIL=copy_tail and 2 * f < d,
    )


@torch.library.custom_op("posenc::rotary_qk", mutates_args=())
def _rotary_qk(
    q: torch.Tensor,
    k: torch.Tensor,
    q_cos: torch.Tensor,
    q_sin: torch.Tensor,
    k_cos: torch.Tensor,
    k_sin: torch.Tensor,
    cu_seqlens: Optional[torch.Tensor],  # noqa: UP045 - torch.library's schema inference reads typing.Optional
    layout: str,
    inverse: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    q_out = torch.empty_like(q, memory_format=torch.contiguous_format)
    k_out = torch.empty_like(k, memory_format=torch.contiguous_format)
    _launch(q, k, q_out, k_out, q_cos, q_sin, k_cos, k_sin, cu_seqlens, layout, inverse, copy_tail=True)
    return q_out, k_out


@_rotary_qk.register_fake
def _(q, k, q_cos, q_sin, k_cos, k_sin, cu_seqlens, layout, inverse):  # noqa: ANN001, ANN202
    return (
        torch.empty_like(q, memory_format=torch.contiguous_format),
        torch.empty_like(k, memory_format=torch.contiguous_format),
    )


def _setup_context(ctx, inputs, output) -> None:  # noqa: ANN001
    _, _, q_cos, q_sin, k_cos, k_sin, cu_seqlens, layout, inverse = inputs
    ctx.save_for_backward(q_cos, q_sin, k_cos, k_sin, cu_seqlens)
    ctx.layout, ctx.inverse = layout, inverse


def _backward(ctx, grad_q, grad_k):  # noqa: ANN001, ANN202
    q_cos, q_sin, k_cos, k_sin, cu_seqlens = ctx.saved_tensors
    # The adjoint of a rotation is the rotation by the negative angle: the same op, sine negated (differentiable).
    gq, gk = _rotary_qk(grad_q, grad_k, q_cos, q_sin, k_cos, k_sin, cu_seqlens, ctx.layout, not ctx.inverse)
    return gq, gk, None, None, None, None, None, None, None


_rotary_qk.register_autograd(_backward, setup_context=_setup_context)


@torch.library.custom_op("posenc::rotary_qk_", mutates_args=("q", "k"))
def _rotary_qk_(
    q: torch.Tensor,
    k: torch.Tensor,
    q_cos: torch.Tensor,
    q_sin: torch.Tensor,
    k_cos: torch.Tensor,
    k_sin: torch.Tensor,
    cu_seqlens: Optional[torch.Tensor],  # noqa: UP045
    layout: str,
    inverse: bool,
) -> None:
    _launch(q, k, q, k, q_cos, q_sin, k_cos, k_sin, cu_seqlens, layout, inverse, copy_tail=False)


@_rotary_qk_.register_fake
def _(q, k, q_cos, q_sin, k_cos, k_sin, cu_seqlens, layout, inverse) -> None:  # noqa: ANN001
    return None


def rotary_qk(
    q: torch.Tensor,
    k: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    k_cos: torch.Tensor | None = None,
    k_sin: torch.Tensor | None = None,
    *,
    layout: str = "half",
    cu_seqlens: torch.Tensor | None = None,
    inplace: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate queries and keys in one launch; differentiable (except ``inplace``), ``torch.compile``-traceable.

    Angles come from float32 cos/sin tables built on the host (``rope_cos_sin``: float64 angles rounded once), not from
    ``inv_freq`` inside the kernel: float32 angles are ~0.06 rad off at position 1e6 (``test_rotary_properties``
    asserts the float64-reference tolerance catches this), every scaling and attention factor comes for free, and the
    result equals the eager path to float32 round-off. The tables are small next to q and k: ``4F`` bytes per token
    read, against ``(H + Hkv) * D`` elements of q and k read and written.

    Args:
        q, k: queries ``(B, H, S, D)`` and keys ``(B, Hkv, T, D)``, same dtype and device.
        cos, sin: float32 tables for the queries: ``(S, F)`` / ``(B, S, F)`` per token, or ``(P, F)`` per
            in-document position with ``cu_seqlens``.
        k_cos, k_sin: the keys' tables (default: the queries').
        layout: ``"half"`` (GPT-NeoX / HF) or ``"interleaved"`` (GPT-J / Meta llama).
        cu_seqlens: ``(N + 1,)`` int32 document boundaries of a packed batch (``B == 1``, ``S == T``), starting
            at 0 and ending at ``S``; positions restart at 0 in each document.
        inplace: overwrite ``q`` and ``k`` (channels past ``2F`` untouched) and return them; no autograd.

    Shapes:
        q (B, H, S, D), k (B, Hkv, T, D) -> the same shapes and dtypes (fresh outputs are contiguous).
    """
    check_choice("layout", layout, LAYOUTS)
    k_cos, k_sin = (cos, sin) if k_cos is None else (k_cos, k_sin)
    _check(q, k, cos, sin, k_cos, k_sin, cu_seqlens)
    if inplace:
        if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad):
            fail("inplace", True, "False when q or k requires grad (the in-place kernel has no autograd)")
        _rotary_qk_(q, k, cos, sin, k_cos, k_sin, cu_seqlens, layout, False)
        return q, k
    return _rotary_qk(q, k, cos, sin, k_cos, k_sin, cu_seqlens, layout, False)


def _check(q, k, cos, sin, k_cos, k_sin, cu_seqlens) -> None:  # noqa: ANN001
    for name, x in (("q", q), ("k", k)):
        if not isinstance(x, torch.Tensor) or x.dim() != 4:
            fail(f"{name}.shape", tuple(getattr(x, "shape", ())), "(B, heads, S, D)")
    if k.dtype != q.dtype or k.device != q.device or k.shape[0] != q.shape[0] or k.shape[-1] != q.shape[-1]:
        fail("k", f"{tuple(k.shape)} {k.dtype}", f"(B, Hkv, T, D) with B, D, dtype and device of q {tuple(q.shape)}")
    if not q.is_floating_point():
        fail("q.dtype", q.dtype, "a floating point dtype")
    if not torch.compiler.is_compiling() and q.numel() and q.data_ptr() == k.data_ptr():
        fail("k", "the storage of q", "separate tensors")
    varlen = cu_seqlens is not None
    for name, t, x in (("cos", cos, q), ("sin", sin, q), ("k_cos", k_cos, k), ("k_sin", k_sin, k)):
        f = t.shape[-1] if t.dim() else 0
        rows_ok = t.dim() == 2 and (varlen or t.shape[0] == x.shape[2])
        rows_ok = rows_ok or (not varlen and t.dim() == 3 and t.shape[:2] == (x.shape[0], x.shape[2]))
        if not rows_ok or t.dtype != torch.float32 or t.device != q.device or not 0 < 2 * f <= q.shape[-1]:
            allowed = "(P, F)" if varlen else f"({x.shape[2]}, F) or ({x.shape[0]}, {x.shape[2]}, F)"
            fail(f"{name}.shape", tuple(t.shape), f"a float32 table {allowed} on {q.device} with 2F <= {q.shape[-1]}")
    if cos.shape[-1] != k_cos.shape[-1] or sin.shape != cos.shape or k_sin.shape != k_cos.shape:
        fail("sin.shape", tuple(sin.shape), f"the rotary pairs of cos, {tuple(cos.shape)}, for q and k")
    if varlen:
        if cu_seqlens.dim() != 1 or cu_seqlens.numel() < 2 or cu_seqlens.dtype != torch.int32:
            fail("cu_seqlens", tuple(cu_seqlens.shape), "an int32 tensor (N + 1,) of document boundaries")
        if q.shape[0] != 1 or q.shape[2] != k.shape[2]:
            fail("q.shape", tuple(q.shape), f"(1, H, S, D) with S == T = {k.shape[2]} for a packed batch")
        if not torch.compiler.is_compiling() and (int(cu_seqlens[0]) != 0 or int(cu_seqlens[-1]) != q.shape[2]):
            fail("cu_seqlens", cu_seqlens.tolist(), f"boundaries from 0 to S = {q.shape[2]}")
