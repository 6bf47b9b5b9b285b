"""Compile the Triton RoPE kernel for real NVIDIA GPUs on a machine without one (run as a script).

``TRITON_INTERPRET=1`` checks what the kernel computes, but the interpreter runs the Python body with numpy: it
never lowers the kernel to PTX and machine code, so a kernel can pass every interpreter test and still fail to
compile for a GPU (an op with no lowering, a type the backend refuses, a register or shared-memory overflow).
This script closes that gap without a GPU: it captures the exact launch arguments ``rotary_qk`` passes to the
kernel (CPU tensors stand in for CUDA ones: only dtypes, strides and values matter), specialises them as
Triton's launcher does (integers equal to 1 become constants, multiples of 16 and 16-byte-aligned pointers get
divisibility hints), and compiles the result down to a cubin with Triton's bundled LLVM and ptxas for each
target architecture.

Usage: python tests/kernels/triton_aot.py 80 90   -> one JSON line: {"<case>/sm_<arch>": "ok" | error text}
Run in a fresh process: with ``TRITON_INTERPRET=1`` set, ``@triton.jit`` builds interpreter functions instead.
"""

import json
import sys

import torch

CASES = {
    # name: (q shape (B, H, S, D), Hkv, rotary dim, dtype, layout, table kind, extra)
    "half-bf16-gqa": ((1, 8, 64, 128), 2, 128, torch.bfloat16, "half", "shared", ""),
    "interleaved-bf16-partial-batched": ((2, 4, 33, 128), 4, 64, torch.bfloat16, "interleaved", "batched", ""),
    "half-fp16-varlen": ((1, 4, 40, 64), 2, 64, torch.float16, "half", "varlen", ""),
    "interleaved-fp32-varlen-partial": ((1, 4, 40, 96), 1, 32, torch.float32, "interleaved", "varlen", ""),
    "half-bf16-inplace": ((1, 8, 64, 128), 2, 128, torch.bfloat16, "half", "shared", "inplace"),
    "half-bf16-strided": ((2, 8, 48, 128), 8, 128, torch.bfloat16, "half", "shared", "bshd"),
    "half-bf16-d256": ((1, 4, 32, 256), 2, 256, torch.bfloat16, "half", "shared", ""),
    "interleaved-fp64-d64": ((1, 4, 32, 64), 2, 64, torch.float64, "interleaved", "batched", ""),
}


def launches(case: str) -> list[tuple[tuple, dict]]:
    """The ``(args, kwargs)`` of every kernel launch ``rotary_qk`` makes for ``case`` (forward only: the backward
    is the same launch with the sine's sign, a runtime float, flipped)."""
    import posenc
    from posenc.kernels import triton_rope

    (b, h, s, d), hkv, rotary_dim, dtype, layout, tables, extra = CASES[case]
    if extra == "bshd":  # q and k as (B, S, H, D) memory, seen as (B, H, S, D): strides not multiples of D
        q = torch.randn(b, s, h, d, dtype=dtype).transpose(1, 2)
        k = torch.randn(b, s, hkv, d, dtype=dtype).transpose(1, 2)
    else:
        q, k = torch.randn(b, h, s, d, dtype=dtype), torch.randn(b, hkv, s, d, dtype=dtype)
    positions = torch.arange(s)
    cu_seqlens = None
    if tables == "batched":
        positions = torch.stack([positions + i for i in range(b)])  # (B, S)
    elif tables == "varlen":
        cu_seqlens = torch.tensor([0, 7, 30, s], dtype=torch.int32)
    cos, sin = posenc.rope_cos_sin(positions, posenc.default_inv_freq(rotary_dim))
    calls = []

    class Recorder:  # stands in for the jitted kernel: `kernel[grid](*args, **kwargs)` records its arguments
        def __getitem__(self, grid):
            return lambda *args, **kwargs: calls.append((args, kwargs))

    real, triton_rope._rope_qk_kernel = triton_rope._rope_qk_kernel, Recorder()
    try:
        triton_rope.rotary_qk(q, k, cos, sin, layout=layout, cu_seqlens=cu_seqlens, inplace=extra == "inplace")
    finally:
        triton_rope._rope_qk_kernel = real
    return calls


def compile_launch(args: tuple, kwargs: dict, arch: int) -> None:
    """Specialise one launch's arguments as Triton's launcher would and compile them for ``sm_<arch>``."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend
    from triton.runtime.jit import native_specialize_impl

    from posenc.kernels import triton_rope

    kernel = triton_rope._rope_qk_kernel
    target = GPUTarget("cuda", arch, 32)
    backend = make_backend(target)
    values = dict(zip(kernel.arg_names, args, strict=False)) | kwargs  # the constexprs come as kwargs
    signature, constexprs, attrs = {}, {}, {}
    for i, param in enumerate(kernel.params):
        value = values[param.name]
        if param.is_constexpr:
            signature[param.name], constexprs[(i,)] = "constexpr", value
            continue
        kind, attr = native_specialize_impl(type(backend), value, False, True, True)
        signature[param.name] = kind
        if kind == "constexpr":  # an integer equal to 1, baked in as Triton's launcher does
            constexprs[(i,)] = value
        elif attr:
            attrs[(i,)] = backend.parse_attr(attr)
    compiled = triton.compile(ASTSource(kernel, signature, constexprs, attrs), target=target)
    if not compiled.asm.get("cubin"):
        raise RuntimeError(f"no cubin for sm_{arch}")


def main(archs: list[int]) -> dict[str, str]:
    results = {}
    for case in CASES:
        for arch in archs:
            try:
                for args, kwargs in launches(case):
                    compile_launch(args, kwargs, arch)
                results[f"{case}/sm_{arch}"] = "ok"
            except Exception as exc:  # noqa: BLE001 - reported per case to the test, which fails on it
                results[f"{case}/sm_{arch}"] = f"{type(exc).__name__}: {str(exc)[-2000:]}"
    return results


if __name__ == "__main__":
    print(json.dumps(main([int(a) for a in sys.argv[1:]])))
