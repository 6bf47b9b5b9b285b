"""Rotary position embedding (RoPE) as pure functions of tensors.

Paper: Su et al. 2021, "RoFormer: Enhanced Transformer with Rotary Position Embedding" (arXiv:2104.09864).
Reference implementations checked against: Hugging Face transformers ``apply_rotary_pos_emb`` (``layout="half"``,
GPT-NeoX / Llama-HF channel order) and GPT-J's ``rotate_every_two`` (``layout="interleaved"``, equal to Meta
llama's complex-number form).

Shapes:
    B batch, H heads, S positions, D head dim, F = rotary dims / 2.
    inv_freq  (F,)                  float32
    positions (S,) or (B, S)        integer, float32 or float64, finite (``posenc._checks.check_positions``)
    cos, sin  (S, F) or (B, S, F)   float32 (float64 for float64 inputs)
    x         (..., S, D)           any floating dtype; the first 2F channels rotate, the rest pass through

Numerics: angles are computed in float64 where the device has it (float32 on MPS) and cos/sin are kept in
float32, so a bf16 model at position 1e6 is rotated by the right angle; the result is cast to ``x.dtype``.
"""

from __future__ import annotations

from typing import cast

import torch

from posenc import kernels
from posenc._checks import (
    broadcasts_to,
    check_choice,
    check_number,
    check_positions,
    check_positive_int,
    check_same_device,
    fail,
)
from posenc.kernels import cpu as cpu_kernel
from posenc.kernels import native

LAYOUTS = ("half", "interleaved")


def default_inv_freq(dim: int, *, base: float = 10000.0, device: torch.device | str | None = None) -> torch.Tensor:
    """The RoPE frequencies ``base ** (-2i / dim)`` for ``i < dim // 2``, as float32.

    Computed in float64 and rounded once, so they agree with every float32 implementation to an ulp.

    Shapes:
        returns (dim // 2,)
    """
    check_positive_int("dim", dim)
    check_number("base", base, above=1.0)  # base <= 1 gives frequencies that grow with the channel index
    exponent = torch.arange(0, dim, 2, dtype=torch.float64, device=device) / dim
    return (1.0 / (float(base) ** exponent)).to(torch.float32)


def angle_dtype(device: torch.device, requested: torch.dtype) -> torch.dtype:
    """The dtype angles are computed in: float64, except float32 on devices without float64 (Apple MPS)."""
    if requested == torch.float64 or device.type != "mps":
        return torch.float64
    return torch.float32


def table_dtype(x_dtype: torch.dtype) -> torch.dtype:
    """The dtype of cos/sin tables for inputs of ``x_dtype``: float64 for float64, else float32 (never half)."""
    return torch.float64 if x_dtype == torch.float64 else torch.float32


def rope_angles(positions: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """Angles ``positions * inv_freq``, in float64 (float32 on devices without float64).

    Shapes:
        positions (S,) or (B, S); inv_freq (F,) -> (S, F) or (B, S, F)
    """
    check_positions(positions)
    check_inv_freq(inv_freq)
    return angles_of(positions, inv_freq)


def angles_of(positions: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """``rope_angles`` for arguments already checked (``check_positions``): the shared arithmetic, no validation."""
    dtype = angle_dtype(positions.device, inv_freq.dtype)
    return positions.to(dtype).unsqueeze(-1) * inv_freq.to(device=positions.device, dtype=dtype)  # (..., S, F)


def check_inv_freq(inv_freq: object, name: str = "inv_freq", positions: torch.Tensor | None = None) -> None:
    """Frequencies are a floating point ``(F,)`` tensor, or per token ``(*positions.shape, F)`` when ``positions``
    is given (length-dependent scalings with a length per document); any other shape would broadcast silently."""
    ok = isinstance(inv_freq, torch.Tensor) and inv_freq.is_floating_point()
    t = cast(torch.Tensor, inv_freq)  # a tensor wherever ok holds
    per_token = positions is not None and ok and t.dim() == positions.dim() + 1
    if per_token:
        ok = t.shape[:-1] == cast(torch.Tensor, positions).shape
    elif ok:
        ok = t.dim() == 1
    if not ok:
        shape = tuple(inv_freq.shape) if isinstance(inv_freq, torch.Tensor) else type(inv_freq).__name__
        tokens = "" if positions is None else f" or ({', '.join(map(str, positions.shape))}, F) per token"
        fail(f"{name}.shape", shape, f"(F,){tokens} floating point frequencies, one per rotated channel pair")


def rope_cos_sin(
    positions: torch.Tensor,
    inv_freq: torch.Tensor,
    *,
    attention_factor: float | torch.Tensor = 1.0,
    dtype: torch.dtype = torch.float32,
    per_token: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Cosine and sine tables for ``positions``, scaled by ``attention_factor`` (HF's convention).

    ``per_token=True`` takes one set of frequencies per token, ``inv_freq`` of shape ``(*positions.shape, F)``
    (length-dependent scalings with a length per packed document); it must be asked for, so that a 2-D table passed
    by mistake is refused rather than read that way.

    ``dtype`` is float32 (the default) or float64: trig tables are never kept in half precision. On CPU, float32
    tables come from the C kernel where it is built (``posenc.kernels.native``): the same numbers, in one pass.

    Shapes:
        positions (S,) or (B, S); inv_freq (F,), or per token (S, F) / (B, S, F) -> cos, sin (S, F) or (B, S, F)
    """
    if dtype not in (torch.float32, torch.float64):
        fail("dtype", dtype, "torch.float32 or torch.float64 (trig tables are never kept in half precision)")
    if not isinstance(attention_factor, torch.Tensor):
        check_number("attention_factor", attention_factor, above=0.0)
    check_positions(positions)
    check_inv_freq(inv_freq, positions=positions if per_token else None)
    fused = _native_cos_sin(positions, inv_freq, attention_factor, dtype)
    if fused is not None:
        return fused
    angles = angles_of(positions, inv_freq)
    out_dtype = dtype
    cos, sin = angles.cos(), angles.sin()
    if not (isinstance(attention_factor, float) and attention_factor == 1.0):
        cos, sin = cos * attention_factor, sin * attention_factor
    return cos.to(out_dtype), sin.to(out_dtype)


def _native_cos_sin(
    positions: torch.Tensor, inv_freq: torch.Tensor, attention_factor: float | torch.Tensor, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The C kernel's float32 tables for plain CPU calls (the same numbers in one pass); None where the torch ops
    run instead: other devices or dtypes, autograd, tracing or compiling, or no kernel."""
    if not (kernels.use_native and dtype == torch.float32) or torch.compiler.is_compiling() or torch.jit.is_tracing():
        return None
    if positions.device.type != "cpu" or inv_freq.device.type != "cpu" or inv_freq.dim() != 1:
        return None
    if torch.is_grad_enabled() and (positions.requires_grad or inv_freq.requires_grad):
        return None
    factor = attention_factor
    if isinstance(factor, torch.Tensor):
        if factor.numel() != 1 or factor.device.type != "cpu" or (torch.is_grad_enabled() and factor.requires_grad):
            return None
        factor = factor.item()
    return native.cos_sin_table(positions, inv_freq, float(factor))


def _pair_views(x: torch.Tensor, layout: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The two members of each rotated pair: ``(x[i], x[i + F])`` for half, ``(x[2i], x[2i + 1])`` interleaved."""
    if layout == "half":
        f = x.shape[-1] // 2
        return x[..., :f], x[..., f:]
    return x[..., 0::2], x[..., 1::2]


def _spread(t: torch.Tensor, layout: str) -> torch.Tensor:
    """Lay a per-pair table ``(..., F)`` out over the rotated channels ``(..., 2F)``; small, never x-sized."""
    return torch.cat((t, t), dim=-1) if layout == "half" else t.repeat_interleave(2, dim=-1)


def _rotate_expr(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str) -> torch.Tensor:
    """Differentiable, traceable form (autograd through cos/sin, ``torch.compile`` fuses it to one loop)."""
    a, b = _pair_views(x, layout)
    ra, rb = a * cos - b * sin, b * cos + a * sin
    if layout == "half":
        return torch.cat((ra, rb), dim=-1)
    return torch.stack((ra, rb), dim=-1).flatten(-2)  # (..., F, 2) -> (..., 2F)


def _rotate_into(out: torch.Tensor, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str) -> None:
    """Write the rotation of ``x`` into ``out`` with no x-sized temporaries (eager fast path, float32/64 only).

    Interleaved pairs are adjacent in memory, so the rotation is one complex multiply. Half-layout pairs are F
    apart: one multiply by the spread cosine, then two in-place multiply-adds on the halves.
    """
    f = cos.shape[-1]
    if layout == "interleaved" and _complex_viewable(x) and _complex_viewable(out):
        cis = torch.complex(cos, sin)  # (..., S, F), small
        torch.mul(
            torch.view_as_complex(x.unflatten(-1, (f, 2))), cis, out=torch.view_as_complex(out.unflatten(-1, (f, 2)))
        )
        return
    torch.mul(x, _spread(cos, layout), out=out)
    out_a, out_b = _pair_views(out, layout)
    x_a, x_b = _pair_views(x, layout)
    out_a.addcmul_(x_b, sin, value=-1.0)
    out_b.addcmul_(x_a, sin)


def _complex_viewable(t: torch.Tensor) -> bool:
    return t.stride(-1) == 1 and t.storage_offset() % 2 == 0 and all(s % 2 == 0 for s in t.stride()[:-1])


class _Rotate(torch.autograd.Function):
    """Fast-path rotation whose backward is the inverse rotation (cos, -sin): no saved activations."""

    @staticmethod
    def forward(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str) -> torch.Tensor:
        return _rotate_fast(x, cos, sin, layout)

    @staticmethod
    def setup_context(ctx, inputs, output):  # noqa: ANN001
        _, cos, sin, layout = inputs
        ctx.save_for_backward(cos, sin)
        ctx.layout = layout

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # noqa: ANN001
        cos, sin = ctx.saved_tensors
        # The inverse rotation, through the dispatching entry so double backward (create_graph) stays differentiable.
        return _rotate(grad, cos, -sin, ctx.layout), None, None, None


# Low-precision inputs are rotated in float32 one cache-sized piece at a time: no x-sized float32 copy.
_CHUNK_BYTES = 4 << 20


def _rotate_fast(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str) -> torch.Tensor:
    if x.device.type == "cpu" and kernels.use_cpu and cpu_kernel.worth_it(x):
        return cpu_kernel.rotary(x, cos, sin, layout=layout)  # blocked, one pass over memory
    rd = 2 * cos.shape[-1]
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    if rd < x.shape[-1]:
        out[..., rd:].copy_(x[..., rd:])
    if x.dtype in (torch.float32, torch.float64):
        _rotate_into(out[..., :rd], x[..., :rd], cos.to(x.dtype), sin.to(x.dtype), layout)
        return out
    cos, sin = cos.float(), sin.float()
    pieces = list(_pieces(x[..., :rd], out[..., :rd], cos, sin))
    largest = max(piece[0].numel() for piece in pieces)
    buf_in, buf_out = torch.empty(2, largest, dtype=torch.float32, device=x.device)
    for xs, outs, cs, ss in pieces:
        xin, xout = buf_in[: xs.numel()].view(xs.shape), buf_out[: xs.numel()].view(xs.shape)
        xin.copy_(xs)
        _rotate_into(xout, xin, cs, ss, layout)
        outs.copy_(xout)
    return out


def _pieces(x: torch.Tensor, out: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """Split ``x``/``out`` (..., S, 2F) along their leading dims into pieces of about ``_CHUNK_BYTES`` in float32,
    each with its cos/sin. Falls back to one piece where the tables or strides don't allow views."""
    s, d = x.shape[-2], x.shape[-1]
    if x.dim() <= 2 or x.numel() * 4 <= _CHUNK_BYTES:
        yield x, out, cos, sin
        return
    if cos.dim() > 2 and any(n != 1 for n in cos.shape[:-2]):  # per-row tables, e.g. (B, 1, S, F)
        if cos.dim() == x.dim():
            for b in range(x.shape[0]):
                i = b if cos.shape[0] > 1 else 0
                yield from _pieces(x[b], out[b], cos[i], sin[i])
        else:
            yield x, out, cos, sin
        return
    try:
        xv, outv = x.view(-1, s, d), out.view(-1, s, d)  # (N, S, 2F) views, no copy
    except RuntimeError:
        yield x, out, cos, sin
        return
    cos2, sin2 = cos.reshape(cos.shape[-2:]), sin.reshape(sin.shape[-2:])  # leading dims are all 1
    rows = max(1, _CHUNK_BYTES // (s * d * 4))
    for i in range(0, xv.shape[0], rows):
        yield xv[i : i + rows], outv[i : i + rows], cos2, sin2


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *, layout: str = "half") -> torch.Tensor:
    """Rotate the first ``2F`` channels of ``x`` by the angles whose cosine and sine are given.

    Channel pairs are ``(i, i + F)`` for ``layout="half"`` (GPT-NeoX, HF Llama) and ``(2i, 2i + 1)`` for
    ``layout="interleaved"`` (GPT-J, Meta llama). Channels past ``2F`` are returned unchanged (partial rotary).

    Shapes:
        x (..., S, D); cos, sin broadcastable to (..., S, F) with 2F <= D -> (..., S, D), dtype of x
    """
    check_choice("layout", layout, LAYOUTS)
    if cos.shape != sin.shape:
        fail("sin.shape", tuple(sin.shape), f"the shape of cos, {tuple(cos.shape)}")
    f = cos.shape[-1]
    if 2 * f > x.shape[-1]:
        fail("x.shape[-1]", x.shape[-1], f">= 2 * cos.shape[-1] = {2 * f} (the rotated channels)")
    if not x.is_floating_point():
        fail("x.dtype", x.dtype, "a floating point dtype")
    # The C kernels read raw pointers: tables from another device would be read as host memory.
    check_same_device("cos", cos, x.device, "x's device")
    check_same_device("sin", sin, x.device, "x's device")
    pairs = (*x.shape[:-1], f)
    fits = broadcasts_to(cos.shape, pairs)
    if not fits:
        fail("cos.shape", tuple(cos.shape), f"broadcastable to x's pairs {pairs} without enlarging them")
    return _rotate(x, cos, sin, layout)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str) -> torch.Tensor:
    """Pick the path: traced/differentiable-in-cos expression, fast path with autograd, or plain fast path."""
    expression = torch.compiler.is_compiling() or kernels.transformed(x, cos, sin)
    if expression or (torch.is_grad_enabled() and (cos.requires_grad or sin.requires_grad)):
        rd = 2 * cos.shape[-1]
        compute = torch.promote_types(x.dtype, torch.float32)
        rotated = _rotate_expr(x[..., :rd].to(compute), cos.to(compute), sin.to(compute), layout).to(x.dtype)
        return torch.cat((rotated, x[..., rd:]), dim=-1) if rd < x.shape[-1] else rotated
    if torch.is_grad_enabled() and x.requires_grad:
        return _Rotate.apply(x, cos, sin, layout)
    return _rotate_fast(x, cos, sin, layout)
