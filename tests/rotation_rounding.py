"""How far two float evaluations of one rotation may differ, and where the C kernel and torch round alike.

Each rotated channel is ``r = x1 * c - x2 * s`` (or ``x2 * c + x1 * s``), computed in ``C`` (float32, float64 for
float64 inputs) and stored in ``T`` (the input dtype). The C kernel (``posenc/kernels/rope.c``) and torch's ops
evaluate it with the same products but not always the same fusion:

- half layout: both fuse the second product into a multiply-add (``fmaf`` in rope.c; ``addcmul``, which torch's
  AVX2/AVX-512 kernels are compiled to fuse), so they round identically;
- interleaved: rope.c never fuses; torch's complex multiply does not fuse in its vectorised loop (two SIMD vectors
  a step) but does in the scalar loop over what is left (its AVX2/AVX-512 kernels are built with FMA contraction).
  They agree bit for bit only where every inner loop of torch's multiply is a whole number of steps: in these
  single-threaded calls the inner loops are multiples of ``F`` complex numbers, so ``F % step == 0`` suffices, with
  ``step`` = 8 (float32) or 4 (float64) on AVX2, 16 or 8 on AVX-512. Other CPU kernels (torch's ``DEFAULT``
  capability fuses nothing, so there the half layout differs instead) are held to the bound only.

The bound: unfused, ``fl(fl(x1 c) - fl(x2 s))`` is within ``u |x1 c| + u |x2 s| + u |r|`` of ``r`` (``u = eps / 2``
of ``C``); fused, ``fl(x1 c - fl(x2 s))`` within ``u |x2 s| + u |r|``. Two evaluations therefore differ by at most
``eps_C * (|x1 c| + |x2 s|) + eps_C * max|r|``, and rounding both to a narrower ``T`` adds at most
``eps_T * max|r|`` (``ulp(v) <= eps |v|``).
"""

from __future__ import annotations

import torch

#: Bytes per SIMD vector of torch's CPU kernels, for the capabilities whose rounding is known (see above).
_VECTOR_BYTES = {"AVX2": 32, "AVX512": 64}


def torch_rounds_like_native(dtype: torch.dtype, layout: str, rotary_dim: int) -> bool:
    """Whether torch's ops and the C kernel round every element alike (single-threaded calls; see the module)."""
    vector = _VECTOR_BYTES.get(torch.backends.cpu.get_cpu_capability())
    if vector is None:
        return False
    if layout == "half":
        return True
    real = 8 if dtype == torch.float64 else 4  # bytes of one real number in the compute dtype
    step = 2 * vector // (2 * real)  # complex numbers per step: two vectors of (real, imag) pairs
    return (rotary_dim // 2) % step == 0


def rotation_terms(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str) -> torch.Tensor:
    """``|x1 c| + |x2 s|`` and ``|x2 c| + |x1 s|`` for every rotated channel, in float64, laid out as ``x[..., :2F]``.

    Shapes:
        x (..., S, D); cos, sin broadcastable to (..., S, F) -> (..., S, 2F) float64
    """
    f = cos.shape[-1]
    xr = x[..., : 2 * f].double()
    x1, x2 = (xr[..., :f], xr[..., f:]) if layout == "half" else (xr[..., 0::2], xr[..., 1::2])
    c, s = cos.double().abs(), sin.double().abs()
    t1, t2 = x1.abs() * c + x2.abs() * s, x2.abs() * c + x1.abs() * s
    return torch.cat((t1, t2), dim=-1) if layout == "half" else torch.stack((t1, t2), dim=-1).flatten(-2)


def assert_rotations_agree(
    got: torch.Tensor, want: torch.Tensor, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str
) -> None:
    """``got`` and ``want`` (two evaluations of one rotation of ``x``) differ by at most the bound of the module;
    channels past ``2F`` are equal."""
    rd = 2 * cos.shape[-1]
    compute = torch.float64 if x.dtype == torch.float64 else torch.float32
    eps_c, eps_t = torch.finfo(compute).eps, torch.finfo(x.dtype).eps
    a, b = got[..., :rd].double(), want[..., :rd].double()
    peak = torch.maximum(a.abs(), b.abs())
    bound = eps_c * (rotation_terms(x, cos, sin, layout) + peak) + (eps_t * peak if eps_t > eps_c else 0.0)
    excess = (a - b).abs() - bound
    worst = int(excess.argmax()) if excess.numel() else 0
    assert not bool((excess > 0).any()), (
        f"differ by {float((a - b).abs().flatten()[worst])} > bound {float(bound.flatten()[worst])} at flat index "
        f"{worst}"
    )
    torch.testing.assert_close(got[..., rd:], want[..., rd:], rtol=0, atol=0)
