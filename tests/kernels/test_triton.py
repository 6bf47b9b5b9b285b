"""The Triton RoPE kernel == the eager path, forward and gradients; on CPU through Triton's interpreter.

Without CUDA, ``TRITON_INTERPRET=1`` is set before Triton is imported, so the kernel runs (slowly, numpy-backed) on
CPU tensors: shapes stay tiny. With CUDA the same tests run the compiled kernel, and the ``gpu`` tests add real
sizes, the ``RotaryEmbedding`` hook and Inductor.
"""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before the first `import triton`
pytest.importorskip("triton")

import posenc  # noqa: E402
from posenc import kernels  # noqa: E402
from posenc.kernels import triton_rope  # noqa: E402
from posenc.kernels.triton_rope import rotary_qk  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _eager(x, cos, sin, layout):
    """The eager reference in float32, rounded once to x's dtype."""
    if cos.dim() == 3:
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)  # (B, S, F) -> (B, 1, S, F)
    return posenc.apply_rotary(x.float(), cos, sin, layout=layout).to(x.dtype)


def _tables(positions, rotary_dim, factor=1.0):
    inv_freq = posenc.default_inv_freq(rotary_dim, device=DEVICE)
    return posenc.rope_cos_sin(positions.to(DEVICE), inv_freq, attention_factor=factor)


def _qk(b=2, h=4, hkv=2, s=5, t=None, d=16, dtype=torch.float32, grad=False):
    q = torch.randn(b, h, s, d, device=DEVICE).to(dtype).requires_grad_(grad)
    k = torch.randn(b, hkv, s if t is None else t, d, device=DEVICE).to(dtype).requires_grad_(grad)
    return q, k


def _close(actual, expected):
    if actual.dtype == torch.bfloat16:  # the kernel may fuse a multiply-add: one bf16 rounding step apart at most
        torch.testing.assert_close(actual.float(), expected.float(), rtol=8e-3, atol=1e-2)
    elif actual.dtype == torch.float16:  # the same, one float16 rounding step (2^-10 relative)
        torch.testing.assert_close(actual.float(), expected.float(), rtol=1e-3, atol=2e-3)
    else:
        torch.testing.assert_close(actual, expected)


@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("rotary_dim", [16, 8, 6])
@pytest.mark.parametrize("positions", ["shared", "batched"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_forward_matches_eager(layout, rotary_dim, positions, dtype):
    q, k = _qk(dtype=dtype, h=3, hkv=1)  # GQA: different head counts in one launch
    pos = torch.tensor([[0, 5, 40, 3, 2], [9, 1, 7, 100_000, 4]]) if positions == "batched" else torch.arange(5) + 7
    cos, sin = _tables(pos, rotary_dim, factor=1.25)
    out_q, out_k = rotary_qk(q, k, cos, sin, layout=layout)
    assert out_q.shape == q.shape and out_k.shape == k.shape and out_q.dtype == dtype
    _close(out_q, _eager(q, cos, sin, layout))
    _close(out_k, _eager(k, cos, sin, layout))
    torch.testing.assert_close(out_q[..., rotary_dim:], q[..., rotary_dim:], rtol=0, atol=0)  # pass-through copied


def test_keys_with_their_own_positions_and_length_and_strided_inputs():
    """Decoding: 2 queries against 6 cached keys at other positions; q is a transposed (B, S, H, D) view."""
    q = torch.randn(2, 2, 4, 16, device=DEVICE).transpose(1, 2)  # (B, S, H, D) -> (B, H, S, D) view
    k = torch.randn(2, 2, 6, 16, device=DEVICE)
    q_cos, q_sin = _tables(torch.tensor([6, 7]), 16)
    k_cos, k_sin = _tables(torch.arange(6).expand(2, 6), 16)  # (B, T, F) from expanded positions
    out_q, out_k = rotary_qk(q, k, q_cos, q_sin, k_cos, k_sin, layout="interleaved")
    _close(out_q, _eager(q, q_cos, q_sin, "interleaved"))
    _close(out_k, _eager(k, k_cos, k_sin, "interleaved"))


@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("rotary_dim", [16, 8])
def test_gradients_match_eager(layout, rotary_dim):
    q, k = _qk(h=3, hkv=1, grad=True)
    pos = torch.tensor([[0, 5, 40, 3, 2], [9, 1, 7, 11, 4]])
    cos, sin = _tables(pos, rotary_dim)
    grads = torch.randn_like(q), torch.randn_like(k)

    out_q, out_k = rotary_qk(q, k, cos, sin, layout=layout)
    got = torch.autograd.grad((out_q * grads[0]).sum() + (out_k * grads[1]).sum(), (q, k))
    ref_q, ref_k = _eager(q, cos, sin, layout), _eager(k, cos, sin, layout)
    want = torch.autograd.grad((ref_q * grads[0]).sum() + (ref_k * grads[1]).sum(), (q, k))
    torch.testing.assert_close(got, want)


def test_gradient_of_one_output_only():
    q, k = _qk(grad=True)
    cos, sin = _tables(torch.arange(5), 16)
    (g,) = torch.autograd.grad(rotary_qk(q, k, cos, sin)[0].sum(), q)
    (want,) = torch.autograd.grad(_eager(q, cos, sin, "half").sum(), q)
    torch.testing.assert_close(g, want)


@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_packed_documents_restart_positions(layout):
    lengths = [4, 1, 6, 3]
    total = sum(lengths)
    q, k = _qk(b=1, h=2, hkv=1, s=total, grad=True)
    cu = torch.tensor([0, 4, 5, 11, 14], dtype=torch.int32, device=DEVICE)
    cos, sin = _tables(torch.arange(8), 12)  # (P, F) per in-document position, P >= the longest document
    out_q, out_k = rotary_qk(q, k, cos, sin, layout=layout, cu_seqlens=cu)

    positions, _ = posenc.packed_positions(lengths)  # independent: positions restarting per document
    ref_cos, ref_sin = _tables(positions, 12)
    ref_q, ref_k = _eager(q, ref_cos, ref_sin, layout), _eager(k, ref_cos, ref_sin, layout)
    _close(out_q, ref_q)
    _close(out_k, ref_k)
    grads = torch.randn_like(q), torch.randn_like(k)
    got = torch.autograd.grad((out_q * grads[0]).sum() + (out_k * grads[1]).sum(), (q, k))
    want = torch.autograd.grad((ref_q * grads[0]).sum() + (ref_k * grads[1]).sum(), (q, k))
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_inplace_overwrites_q_and_k_and_leaves_the_tail(layout, dtype):
    q, k = _qk(dtype=dtype, h=3, hkv=2)
    cos, sin = _tables(torch.tensor([[3, 1, 4, 1, 5], [9, 2, 6, 5, 3]]), 10)
    want_q, want_k = rotary_qk(q, k, cos, sin, layout=layout)
    q0, k0, ptrs = q.clone(), k.clone(), (q.data_ptr(), k.data_ptr())
    out_q, out_k = rotary_qk(q, k, cos, sin, layout=layout, inplace=True)
    assert out_q is q and out_k is k and (q.data_ptr(), k.data_ptr()) == ptrs
    torch.testing.assert_close(q, want_q, rtol=0, atol=0)
    torch.testing.assert_close(k, want_k, rtol=0, atol=0)
    torch.testing.assert_close(q[..., 10:], q0[..., 10:], rtol=0, atol=0)
    torch.testing.assert_close(k[..., 10:], k0[..., 10:], rtol=0, atol=0)


def test_bad_input_names_the_parameter():
    q, k = _qk(grad=True)
    cos, sin = _tables(torch.arange(5), 16)
    with pytest.raises(ValueError, match="inplace"):
        rotary_qk(q, k, cos, sin, inplace=True)
    with pytest.raises(ValueError, match="layout"):
        rotary_qk(q, k, cos, sin, layout="neox")
    with pytest.raises(ValueError, match="cos.shape"):
        rotary_qk(q, k, cos[:3], sin[:3])
    with pytest.raises(ValueError, match="cos.shape"):
        rotary_qk(q, k, cos.double(), sin.double())
    with pytest.raises(ValueError, match="k"):
        rotary_qk(q, k.double(), cos, sin)
    with pytest.raises(ValueError, match="cu_seqlens"):
        rotary_qk(q[:1], k[:1], cos, sin, cu_seqlens=torch.tensor([0, 2, 4], dtype=torch.int32, device=DEVICE))


def test_custom_op_registration():
    """Schema, fake (meta) kernel and autograd registration agree with the real kernel."""
    q, k = _qk(s=3, grad=True)
    cos, sin = _tables(torch.arange(3), 8)
    torch.library.opcheck(triton_rope._rotary_qk, (q, k, cos, sin, cos, sin, None, "half", False))


def test_compiles_without_graph_breaks():
    """``torch.compile(fullgraph=True)`` traces the op (AOT autograd: fake kernel + backward) without a break."""
    q, k = _qk(h=2, hkv=1, grad=True)
    positions = torch.tensor([[2, 3, 4, 5, 6], [0, 1, 2, 3, 4]], device=DEVICE)
    inv_freq = posenc.default_inv_freq(16, device=DEVICE)

    def step(q, k, positions):
        cos, sin = posenc.rope_cos_sin(positions, inv_freq)
        out_q, out_k = rotary_qk(q, k, cos, sin, layout="interleaved")
        return (out_q * out_q.detach()).sum() + out_k.sum()

    backend = "inductor" if DEVICE == "cuda" else "aot_eager"  # Inductor on CPU would compile C++: too slow here
    torch._dynamo.reset()
    got = torch.compile(step, fullgraph=True, backend=backend)(q, k, positions)
    g = torch.autograd.grad(got, (q, k))
    want = step(q, k, positions)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(g, torch.autograd.grad(want, (q, k)))


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_gpu_real_sizes_and_rotary_embedding_hook(layout, dtype, monkeypatch):
    """The compiled kernel at model sizes, through ``RotaryEmbedding`` (automatic on CUDA) vs the eager path."""
    emb = posenc.RotaryEmbedding(128, layout=layout, partial_rotary_factor=0.75).cuda()
    q = torch.randn(2, 32, 1000, 128, device="cuda", dtype=dtype, requires_grad=True)
    k = torch.randn(2, 8, 1000, 128, device="cuda", dtype=dtype, requires_grad=True)
    positions = torch.randint(0, 1_000_000, (2, 1000), device="cuda")
    calls, launch = [], triton_rope._launch
    monkeypatch.setattr(triton_rope, "_launch", lambda *a, **kw: calls.append(1) or launch(*a, **kw))
    out_q, out_k = emb(q, k, positions)
    assert calls
    grads = torch.randn_like(out_q), torch.randn_like(out_k)
    got = torch.autograd.grad((out_q * grads[0]).float().sum() + (out_k * grads[1]).float().sum(), (q, k))
    monkeypatch.setattr(kernels, "use_triton", False)
    ref_q, ref_k = emb(q, k, positions)
    want = torch.autograd.grad((ref_q * grads[0]).float().sum() + (ref_k * grads[1]).float().sum(), (q, k))
    _close(out_q, ref_q)
    _close(out_k, ref_k)
    for a, b in zip(got, want, strict=True):
        _close(a, b)
