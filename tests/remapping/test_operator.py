"""``remap_attention``: the branch-and-merge operator against the float64 references, the fused and written-out
paths against each other, and what the design promises -- grouped-query attention, batches, KV-cache decoding ==
full forward, chunked prefill, packed documents, padding, torch.compile, any RoPE scaling, no L x L tensor."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

import posenc
from largest_tensor import LargestTensor
from posenc.remapping import SelfExtend, remap_attention
from reference import remapping as ref
from tolerances import gamma, rotated_softmax_atol, unit_roundoff


def qkv(b, h, hkv, s, d, *, t=None, dtype=torch.float64, seed=0, dv=0):
    g = torch.Generator().manual_seed(seed)
    t = s if t is None else t
    return (
        torch.randn(b, h, s, d, generator=g, dtype=dtype),
        torch.randn(b, hkv, t, d, generator=g, dtype=dtype),
        torch.randn(b, hkv, t, d + dv, generator=g, dtype=dtype),
    )


def rope(d=16, **kw):
    return posenc.build("rope", head_dim=d, base=kw.pop("base", 100.0), **kw)


@pytest.mark.parametrize(
    "b, h, hkv, s, d, window, group, block, layout",
    [
        (1, 2, 2, 23, 8, 4, 3, 256, "half"),
        (2, 4, 2, 37, 16, 5, 3, 8, "half"),
        (2, 6, 3, 41, 16, 8, 4, 7, "interleaved"),
        (1, 4, 1, 30, 12, 1, 2, 16, "half"),
    ],
)
def test_self_extend_matches_the_written_out_reference(b, h, hkv, s, d, window, group, block, layout):
    q, k, v = qkv(b, h, hkv, s, d)
    enc = rope(d, layout=layout)
    out = remap_attention(q, k, v, method=SelfExtend(window=window, group=group), encoding=enc, block=block)
    expected = ref.self_extend(q, k, v, enc.inv_freq, window=window, group=group, layout=layout)
    assert_close(out, expected, atol=rotated_softmax_atol(q, k, v, torch.float64, max_position=s), rtol=0)


@pytest.mark.parametrize("backend", ["eager", "sdpa"])
def test_float32_within_the_bound_of_the_float64_reference(backend):
    q, k, v = qkv(2, 4, 2, 50, 16, dtype=torch.float32, seed=1)
    enc = rope(16)
    method = SelfExtend(window=6, group=4)
    out = remap_attention(q, k, v, method=method, encoding=enc, backend=backend, block=16)
    expected = ref.self_extend(q, k, v, enc.inv_freq, window=6, group=4)
    assert out.dtype == torch.float32
    assert_close(out.double(), expected, atol=rotated_softmax_atol(q, k, v, torch.float32, max_position=50), rtol=0)


def half_span_atol(q, k, expected_abs, dtype, *, max_position, scale=None):
    """Elementwise bound on ``span_dtype=dtype`` (bf16/fp16 spans) against the float64 reference.

    A score ``q~ . k~`` of rotated vectors rounded to ``dtype`` (relative ``u`` each) and summed in float32 moves by
    at most ``(2 u + u^2 + gamma_32(D + 1) + 2 (max_position + 8) u_32) |q| |k|`` (Cauchy-Schwarz: ``sum |q_i k_i|
    <= |q| |k|``, and the rotation keeps both norms), times the scale. The probabilities then move by a factor within
    ``exp(+-2 E)``, so the output by ``expm1(2 E) sum p |v|``; the values' rounding, the weights' rounding before they
    weigh them, the normalisation and each span's output rounding add ``u sum p |v|`` each (4 u, and 2 u of slack).
    ``expected_abs`` is the reference run on ``|v|``: ``sum p |v|`` for each output element."""
    u, u32 = unit_roundoff(dtype), unit_roundoff(torch.float32)
    d = q.shape[-1]
    scale = d**-0.5 if scale is None else scale
    norms = float(q.norm(dim=-1).max()) * float(k.norm(dim=-1).max())
    score = scale * norms * (2 * u + u * u + gamma(d + 1) + 2 * (max_position + 8) * u32)
    return expected_abs * (torch.expm1(torch.tensor(2 * score, dtype=torch.float64)) + 6 * u) + 1e-6


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("backend", ["eager", "sdpa"])
def test_half_spans_within_their_bound_of_the_float64_reference(dtype, backend):
    """The spans in bf16/fp16 (what a bf16 model runs): within the rounding bound, and that bound tighter than what a
    region one token off moves."""
    q, k, v = qkv(2, 4, 2, 60, 16, dtype=torch.float32, seed=3)
    q, k = q * 0.5, k * 0.5  # a model's scores: a few units, not tens
    enc, method = rope(16), SelfExtend(window=6, group=4)
    out = remap_attention(q, k, v, method=method, encoding=enc, backend=backend, block=16, span_dtype=dtype)
    assert out.dtype == torch.float32
    expected = ref.self_extend(q, k, v, enc.inv_freq, window=6, group=4)
    bound = half_span_atol(q, k, ref.self_extend(q, k, v.abs(), enc.inv_freq, window=6, group=4), dtype,
                           max_position=60)
    assert bool(((out.double() - expected).abs() <= bound).all())
    off_by_one = ref.self_extend(q, k, v, enc.inv_freq, window=7, group=4)
    assert bool(((off_by_one - expected).abs() > bound).any())  # the bound can tell a wrong region


def test_half_spans_of_half_inputs_come_back_in_their_dtype():
    q, k, v = (x.bfloat16() for x in qkv(1, 2, 1, 20, 8, dtype=torch.float32))
    out = remap_attention(q, k, v, method=SelfExtend(window=4, group=2), encoding=rope(8), span_dtype=torch.bfloat16)
    assert out.dtype == torch.bfloat16


def test_partial_rotary_and_a_frequency_scaling_are_the_encodings():
    """A YaRN-scaled, partially rotary RoPE: each branch rotates with it (attention factor included)."""
    d = 16
    enc = posenc.build(
        "rope",
        head_dim=d,
        base=100.0,
        partial_rotary_factor=0.5,
        scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16},
    )
    q, k, v = qkv(1, 2, 2, 33, d)
    out = remap_attention(q, k, v, method=SelfExtend(window=5, group=2), encoding=enc)
    expected = ref.self_extend(q, k, v, enc.inv_freq, window=5, group=2, attention_factor=enc.attention_factor)
    assert_close(out, expected, atol=rotated_softmax_atol(q, k, v, torch.float64, max_position=33), rtol=0)


def test_group_one_is_plain_rope_attention_with_any_scaling():
    enc = posenc.build(
        "rope", head_dim=16, base=100.0, scaling={"rope_type": "dynamic", "factor": 2.0, "max_position_embeddings": 8}
    )
    q, k, v = qkv(2, 4, 2, 29, 16)
    out = remap_attention(q, k, v, method=SelfExtend(window=3, group=1), encoding=enc, block=5)
    plain = posenc.attention(q, k, v, encoding=enc)
    assert_close(out, plain, atol=rotated_softmax_atol(q, k, v, torch.float64, max_position=29), rtol=0)


def test_attention_entry_point_routes_remap():
    q, k, v = qkv(1, 2, 1, 20, 8)
    enc, method = rope(8), SelfExtend(window=4, group=2)
    assert_close(
        posenc.attention(q, k, v, encoding=enc, remap=method),
        remap_attention(q, k, v, encoding=enc, method=method),
        atol=0,
        rtol=0,
    )


def test_chunked_prefill_equals_the_full_forward():
    """Keys cached un-rotated; each chunk's queries are the last of its keys: the full call's rows (decoding one
    token at a time is checked for every method in ``test_methods.py``)."""
    q, k, v = qkv(2, 4, 2, 40, 16)
    enc, method = rope(16), SelfExtend(window=6, group=3)
    full = remap_attention(q, k, v, method=method, encoding=enc, block=8)
    tol = rotated_softmax_atol(q, k, v, torch.float64, max_position=40)
    chunks = [
        remap_attention(q[:, :, a:e], k[:, :, :e], v[:, :, :e], method=method, encoding=enc, block=4)
        for a, e in ((0, 13), (13, 27), (27, 40))
    ]  # default positions: queries are the last keys
    assert_close(torch.cat(chunks, dim=2), full, atol=tol, rtol=0)


def test_packed_documents_equal_each_document_alone():
    q, k, v = qkv(1, 2, 2, 30, 8)
    enc, method = rope(8), SelfExtend(window=4, group=2)
    pos, ids = posenc.packed_positions([18, 12])
    packed = remap_attention(
        q, k, v, method=method, encoding=enc, q_positions=pos, k_positions=pos, document_ids=ids, block=7
    )
    tol = rotated_softmax_atol(q, k, v, torch.float64, max_position=18)
    for a, e in ((0, 18), (18, 30)):
        alone = remap_attention(q[:, :, a:e], k[:, :, a:e], v[:, :, a:e], method=method, encoding=enc)
        assert_close(packed[:, :, a:e], alone, atol=tol, rtol=0)


def test_key_mask_left_padding_equals_the_unpadded_row():
    q, k, v = qkv(1, 2, 2, 25, 8)
    enc, method = rope(8), SelfExtend(window=4, group=2)
    pad = 6
    z = lambda x: torch.cat([torch.randn(1, x.shape[1], pad, x.shape[-1], dtype=x.dtype), x], dim=2)  # noqa: E731
    qp, kp, vp = z(q), z(k), z(v)
    positions = torch.arange(25 + pad) - pad  # padding at negative positions, masked anyway
    keep = (positions >= 0)[None]
    out = remap_attention(
        qp, kp, vp, method=method, encoding=enc, q_positions=positions, k_positions=positions, key_mask=keep
    )
    alone = remap_attention(q, k, v, method=method, encoding=enc)
    assert_close(out[:, :, pad:], alone, atol=rotated_softmax_atol(q, k, v, torch.float64, max_position=25), rtol=0)


def test_compiled_equals_eager():
    q, k, v = qkv(1, 4, 2, 48, 16, dtype=torch.float32)
    enc, method = rope(16), SelfExtend(window=8, group=3)

    def run(q, k, v):
        return remap_attention(q, k, v, method=method, encoding=enc, block=16)

    compiled = torch.compile(run)
    tol = 2 * rotated_softmax_atol(q, k, v, torch.float32, max_position=48)  # each within the bound of float64
    assert_close(compiled(q, k, v), run(q, k, v), atol=tol, rtol=0)


def test_no_tensor_grows_with_the_square_of_the_length():
    """At S = T = 2048 with blocks of 64 rows, nothing holds S x T values: the largest tensor is one block's
    scores, heads x 64 x T."""
    s, h, block = 2048, 2, 64
    q, k, v = qkv(1, h, 1, s, 8, dtype=torch.float32)
    with torch.no_grad(), LargestTensor() as seen:
        remap_attention(q, k, v, method=SelfExtend(window=128, group=4), encoding=rope(8), block=block)
    assert seen.numel <= h * block * s + 1
    assert seen.numel < s * s // 4


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(method="self_extend"), "method"),
        (dict(encoding=posenc.build("alibi", num_heads=2)), "encoding"),
        (dict(q_positions=torch.arange(10.0)), "q_positions.dtype"),
        (dict(block=0), "block"),
        (dict(backend="flex"), "backend"),
        (dict(span_dtype=torch.int8), "span_dtype"),
        (dict(key_mask=torch.ones(10)), "key_mask.dtype"),
        (dict(document_ids=torch.zeros(9, dtype=torch.long)), "document_ids.shape"),
        (dict(scale=0.0), "scale"),
    ],
)
def test_bad_input_names_the_parameter(kwargs, match):
    q, k, v = qkv(1, 2, 2, 10, 8, dtype=torch.float32)
    args = {"method": SelfExtend(window=2, group=2), "encoding": rope(8), **kwargs}
    with pytest.raises(ValueError, match=match):
        remap_attention(q, k, v, **args)


def test_attention_refuses_remap_without_causal():
    q, k, v = qkv(1, 2, 2, 10, 8, dtype=torch.float32)
    with pytest.raises(ValueError, match="causal"):
        posenc.attention(q, k, v, encoding=rope(8), remap=SelfExtend(window=2, group=2), causal=False)
