"""Fused RoPE for CPU tensors: the one-pass C kernel (``native``) where it is built, else rotate ``x`` one
cache-sized block at a time, straight into the output.

RoPE is memory-bound. The plain eager expression makes several ``x``-sized passes (halves, products, ``cat``); the
blocked path makes one pass over memory: each block of rows is read once, rotated while it sits in cache (a few in-cache
torch ops writing through ``out=`` views) and written once, into a fresh output or back into ``x`` (``inplace``).
Low-precision blocks are widened to float32 in a reused block-sized buffer and rounded once at the end.

Paper: Su et al. 2021, "RoFormer" (arXiv:2104.09864). Checked against ``posenc.functional.rope._rotate_expr`` (the
traced eager expression, itself checked against Hugging Face ``apply_rotary_pos_emb`` and GPT-J) in
``tests/kernels/test_cpu.py``.

Shapes:
    x (..., S, D); cos, sin (S, F), or (B, 1, S, F) / (B, S, F) broadcastable to x's pairs (..., S, F), 2F <= D.
    Channels past 2F pass through (copied, or left untouched in place).

Works on any device (only torch ops), but block sizes are tuned for CPU caches.
"""

from __future__ import annotations

import torch

from posenc import kernels
from posenc._checks import broadcasts_to, check_choice, check_same_device, fail
from posenc.kernels import native

LAYOUTS = ("half", "interleaved")

# Float32 bytes of one block: its later passes hit cache (L2/L3), and Python overhead per block stays small.
# Tuned on a 2-core AMD EPYC (1 MiB L2 per core, 32 MiB L3): 1-4 MiB were best, 4 MiB for bfloat16.
_CHUNK_BYTES = 4 << 20


def worth_it(x: torch.Tensor) -> bool:
    """The C kernel takes ``x`` (any size), or ``x`` is more than one block: below that, the blocked path is the
    plain eager ops with more Python overhead."""
    return (kernels.use_native and native.supports(x.dtype)) or x.numel() * 4 > _CHUNK_BYTES


def rotary(
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    *,
    layout: str = "half",
    inplace: bool = False,
) -> torch.Tensor:
    """Rotate the first ``2F`` channels of ``x`` by the angles with cosine ``cos`` and sine ``sin``.

    Same result as ``posenc.apply_rotary`` (to float32 round-off, bit-equal to its no-grad path). No autograd:
    the caller (``apply_rotary``'s ``_Rotate`` function) supplies the backward, the inverse rotation.

    Args:
        x: floating point input.
        cos, sin: float32 (or float64 for float64 ``x``) tables.
        layout: ``"half"`` pairs channel i with i + F, ``"interleaved"`` pairs 2i with 2i + 1.
        inplace: overwrite ``x`` and return it (channels past ``2F`` untouched).

    Shapes:
        x (..., S, D); cos, sin (S, F) or (B, 1, S, F) or (B, S, F) -> (..., S, D), dtype of x
    """
    check_choice("layout", layout, LAYOUTS)
    cos, sin = _check(x, cos, sin)
    out = x if inplace else torch.empty_like(x, memory_format=torch.contiguous_format)
    rd = 2 * cos.shape[-1]
    compute = torch.float64 if x.dtype == torch.float64 else torch.float32
    cos, sin = cos.to(compute), sin.to(compute)
    if kernels.use_native and native.rotary_into(x, out, cos, sin, layout=layout):
        return out
    wide = x.dtype == compute
    cos2 = _spread(cos, layout)  # (..., S, 2F), small
    blocks = list(_blocks(x, out, (cos, sin, cos2)))
    largest = max(b[0][..., :rd].numel() for b in blocks)
    # Reused per-block buffers: float32 copies of a low-precision block, or the saved half for in-place rotation.
    bufs = torch.empty(0 if wide and not inplace else 2, largest, dtype=compute, device=x.device)
    for xs, outs, (c, s, c2) in blocks:
        if not inplace and rd < x.shape[-1]:
            outs[..., rd:].copy_(xs[..., rd:])
        xr, outr = xs[..., :rd], outs[..., :rd]
        if wide and not inplace:
            _rotate_into(outr, xr, c, s, c2, layout)
        elif wide:
            _rotate_inplace(xr, c, s, layout, bufs[0][: xr.numel()].view(xr.shape))
        else:
            xin, xout = (b[: xr.numel()].view(xr.shape) for b in bufs)  # the block, in float32
            xin.copy_(xr)
            _rotate_into(xout, xin, c, s, c2, layout)
            outr.copy_(xout)
    return out


def rotary_(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *, layout: str = "half") -> torch.Tensor:
    """In-place ``rotary``: overwrites the first ``2F`` channels of ``x`` and returns ``x``."""
    return rotary(x, cos, sin, layout=layout, inplace=True)


def _check(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    if not x.is_floating_point():
        fail("x.dtype", x.dtype, "a floating point dtype")
    check_same_device("cos", cos, x.device, "x's device")
    check_same_device("sin", sin, x.device, "x's device")
    if cos.shape != sin.shape:
        fail("sin.shape", tuple(sin.shape), f"the shape of cos, {tuple(cos.shape)}")
    if 2 * cos.shape[-1] > x.shape[-1]:
        fail("x.shape[-1]", x.shape[-1], f">= 2 * cos.shape[-1] = {2 * cos.shape[-1]} (the rotated channels)")
    pairs = (*x.shape[:-1], cos.shape[-1])
    fits = x.dim() >= 2 and broadcasts_to(cos.shape, pairs)
    if not fits:
        fail("cos.shape", tuple(cos.shape), f"broadcastable to x's pairs {pairs} without enlarging them")
    if all(n == 1 for n in cos.shape[:-2]):
        return cos.reshape(cos.shape[-2:]), sin.reshape(cos.shape[-2:])  # (S, F): shared by every row
    lead = (1,) * (x.dim() - cos.dim())
    return cos.reshape(lead + cos.shape), sin.reshape(lead + cos.shape)  # x's rank, e.g. (B, 1, S, F)


def _blocks(x: torch.Tensor, out: torch.Tensor, tables: tuple[torch.Tensor, ...]):
    """Yield ``(x block, out block, table blocks)`` covering ``x``: slices of the position dim ``-2``, and of
    dim 0 too when one position across dim 0 is bigger than a block (many heads, few positions).

    Tables are ``(S, ·)`` or of ``x``'s rank with leading dims 1 or equal to ``x``'s (``_check``).
    """
    s_len = x.shape[-2]
    lead = x.shape[0] if x.dim() >= 3 else 1
    per_row = 4 * x.numel() // (s_len * lead) if x.numel() else 0  # float32 bytes of one (dim-0 index, position)
    if x.numel() * 4 <= _CHUNK_BYTES:
        yield x, out, tables
        return
    rows = _CHUNK_BYTES // (per_row * lead)
    step = lead
    if rows < 1:  # split dim 0 as well
        rows = max(1, min(s_len, _CHUNK_BYTES // per_row))
        step = max(1, _CHUNK_BYTES // (per_row * rows))
    for b in range(0, lead, step):
        for r in range(0, s_len, rows):
            xs, outs = x[..., r : r + rows, :], out[..., r : r + rows, :]
            ts = tuple(t[..., r : r + rows, :] for t in tables)
            if step < lead:
                xs, outs = xs[b : b + step], outs[b : b + step]
                ts = tuple(t[b : b + step] if t.dim() == x.dim() and t.shape[0] > 1 else t for t in ts)
            yield xs, outs, ts


def _spread(t: torch.Tensor, layout: str) -> torch.Tensor:
    """A per-pair table ``(..., F)`` laid out over the rotated channels ``(..., 2F)``; small, never x-sized."""
    return torch.cat((t, t), dim=-1) if layout == "half" else t.repeat_interleave(2, dim=-1)


def _pairs(x: torch.Tensor, layout: str) -> tuple[torch.Tensor, torch.Tensor]:
    if layout == "half":
        f = x.shape[-1] // 2
        return x[..., :f], x[..., f:]
    return x[..., 0::2], x[..., 1::2]


def _complex_view(t: torch.Tensor) -> torch.Tensor | None:
    """``(..., 2F)`` as complex ``(..., F)`` when adjacent channels are (real, imag) in memory, else None."""
    ok = t.stride(-1) == 1 and t.storage_offset() % 2 == 0 and all(s % 2 == 0 for s in t.stride()[:-1])
    return torch.view_as_complex(t.unflatten(-1, (t.shape[-1] // 2, 2))) if ok else None  # (..., F, 2) -> (..., F)


def _rotate_into(
    out: torch.Tensor, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cos2: torch.Tensor, layout: str
) -> None:
    """``out = rotate(x)``, three in-cache passes (one complex multiply for interleaved pairs)."""
    if layout == "interleaved":
        xc, oc = _complex_view(x), _complex_view(out)
        if xc is not None and oc is not None:
            torch.mul(xc, torch.complex(cos, sin), out=oc)
            return
    torch.mul(x, cos2, out=out)
    out_a, out_b = _pairs(out, layout)
    x_a, x_b = _pairs(x, layout)
    out_a.addcmul_(x_b, sin, value=-1.0)
    out_b.addcmul_(x_a, sin)


def _rotate_inplace(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str, buf: torch.Tensor) -> None:
    """``x = rotate(x)`` for float32/64 ``x``; ``buf`` (x's shape) keeps the first members of the pairs."""
    if layout == "interleaved":
        xc = _complex_view(x)
        if xc is not None:
            xc.mul_(torch.complex(cos, sin))
            return
    x_a, x_b = _pairs(x, layout)
    a = buf[..., : x_a.shape[-1]]
    a.copy_(x_a)
    x_a.mul_(cos).addcmul_(x_b, sin, value=-1.0)
    x_b.mul_(cos).addcmul_(a, sin)
