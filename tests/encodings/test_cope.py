"""CoPE module: registry and config, the reference's init, posenc.attention against the equations written out
(tests/reference/cope.py), sdpa == eager forward and backward, gradients to the table, KV-cache decoding, chunked
queries and packed documents against the full forward, token positions ignored, and the backends and masks it
refuses."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

import posenc
from posenc.attention import _resolve_backend
from posenc.encodings.cope import CoPE, CoPEConfig
from posenc.functional.cope import cope_bias
from reference import cope as ref
from tolerances import sum_atol, unit_roundoff

B, H, HKV, D, DV = 2, 4, 2, 8, 5
TOL = {"atol": 2e-5, "rtol": 2e-5}


def _cope(max_position=6, *, per_head=False, dtype=torch.float32):
    enc = CoPE(D, max_position=max_position, num_heads=H, per_head=per_head).to(dtype)
    with torch.no_grad():
        enc.embeddings.copy_(torch.randn(enc.embeddings.shape, generator=torch.Generator().manual_seed(5)))
    return enc


def _qkv(s, t, *, hkv=HKV, b=B, dtype=torch.float32, requires_grad=False):
    g = torch.Generator().manual_seed(3)
    q = torch.randn(b, H, s, D, generator=g, dtype=dtype)
    k = torch.randn(b, hkv, t, D, generator=g, dtype=dtype)
    v = torch.randn(b, hkv, t, DV, generator=g, dtype=dtype)
    return [x.requires_grad_(requires_grad) for x in (q, k, v)]


# ---------------------------------------------------------------------------------------------------------------
# Registry, config, init


def test_build_takes_the_model_facts():
    enc = posenc.build("cope", dim=32, num_heads=H, head_dim=D, max_len=64)
    assert isinstance(enc, CoPE)
    assert enc.config == CoPEConfig(head_dim=D, max_position=64, num_heads=H, per_head=False)  # p_max = max_len
    assert enc.embeddings.shape == (65, D) and (enc.embeddings == 0).all()  # the reference's zeros
    assert posenc.build("cope", head_dim=D, max_len=64, max_position=16).config.max_position == 16
    per_head = posenc.build("cope", num_heads=H, head_dim=D, max_position=3, per_head=True)
    assert per_head.embeddings.shape == (H, 4, D)
    again = CoPE.from_config(per_head.config.to_dict())
    assert again.config == per_head.config and again.embeddings.shape == per_head.embeddings.shape
    assert (enc.has_bias, enc.needs_keys, enc.causal_only) == (True, True, True)


def test_config_errors():
    with pytest.raises(ValueError, match=r"max_position=None.*p_max.*max_len"):
        CoPE(D)
    with pytest.raises(ValueError, match=r"max_position=0 is invalid"):
        CoPE(D, max_position=0)
    with pytest.raises(ValueError, match=r"max_position=0 is invalid"):
        CoPE(D, max_position=0, max_len=64)  # the user's 0 is not replaced by max_len
    with pytest.raises(ValueError, match=r"max_len=0 is invalid"):
        CoPE(D, max_len=0)
    with pytest.raises(ValueError, match=r"head_dim=0 is invalid"):
        CoPE(0, max_position=4)
    with pytest.raises(ValueError, match=r"num_heads=None.*per_head=True"):
        CoPE(D, max_position=4, per_head=True)
    with pytest.raises(ValueError, match=r"per_head=1 is invalid"):
        CoPE(D, max_position=4, num_heads=H, per_head=1)
    with pytest.raises(ValueError, match=r"num_heads=0 is invalid"):
        CoPEConfig(head_dim=D, max_position=4, num_heads=0)
    with pytest.raises(ValueError, match=r"config\['max_len'\]"):
        CoPEConfig.from_dict({"head_dim": D, "max_position": 4, "max_len": 9})


# ---------------------------------------------------------------------------------------------------------------
# Attention against the equations


@pytest.mark.parametrize("backend", ["eager", "sdpa"])
@pytest.mark.parametrize("per_head", [False, True])
@pytest.mark.parametrize(("s", "t", "hkv"), [(7, 7, 2), (3, 7, 1), (6, 6, 4)])
def test_attention_equals_the_equations(backend, per_head, s, t, hkv):
    enc = _cope(max_position=4, per_head=per_head, dtype=torch.float64)
    q, k, v = _qkv(s, t, hkv=hkv, dtype=torch.float64)
    got = posenc.attention(q, k, v, encoding=enc, backend=backend, scale=0.6)
    want = ref.attention(q, k, v, enc.embeddings.detach(), scale=0.6)
    assert_close(got, want, rtol=1e-10, atol=1e-10)


def test_packed_attention_equals_the_equations():
    enc = _cope(max_position=3, dtype=torch.float64)
    q, k, v = _qkv(8, 8, dtype=torch.float64)
    docs = torch.tensor([[0, 0, 0, 1, 1, 1, 1, 1], [0, 1, 1, 1, 1, 2, 2, 2]])
    got = posenc.attention(q, k, v, encoding=enc, document_ids=docs, backend="eager")
    assert_close(got, ref.attention(q, k, v, enc.embeddings.detach(), scale=D**-0.5, document_ids=docs))


def test_bias_hook_is_the_functional_bias():
    enc = _cope()
    q, k, _ = _qkv(5, 7)
    mask = torch.rand(B, 1, 5, 7, generator=torch.Generator().manual_seed(1)) > 0.2
    pos = torch.arange(7)
    got = enc.bias(pos[2:], pos, q=q, k=k, scale=0.3, mask=mask)
    assert_close(got, cope_bias(q, k, enc.embeddings, scale=0.3, mask=mask), rtol=0, atol=0)
    assert_close(enc(q, k, scale=0.3, mask=mask), got, rtol=0, atol=0)
    assert_close(enc.bias(pos[2:], pos, q=q, k=k), cope_bias(q, k, enc.embeddings, scale=D**-0.5), rtol=0, atol=0)


def test_token_positions_are_ignored():
    """CoPE counts gates, not tokens: any positions (shifted, per-document, float) give the same bias."""
    enc = _cope()
    q, k, _ = _qkv(5, 7)
    base = enc.bias(torch.arange(2, 7), torch.arange(7), q=q, k=k)
    for q_pos, k_pos in [
        (torch.arange(2, 7) + 1000, torch.arange(7) + 1000),
        (torch.zeros(B, 5, dtype=torch.long), torch.zeros(B, 7, dtype=torch.long)),
        (torch.rand(5) * 50, torch.rand(7) * 50),
    ]:
        assert_close(enc.bias(q_pos, k_pos, q=q, k=k), base, rtol=0, atol=0)
    assert_close(enc.bias(None, None, q=q, k=k), base, rtol=0, atol=0)
    with pytest.raises(ValueError, match=r"q_pos\.dtype=torch\.bfloat16 is invalid"):  # checked like any encoding's
        enc.bias(torch.arange(2, 7).bfloat16(), torch.arange(7), q=q, k=k)
    with pytest.raises(ValueError, match=r"k_pos\[3\]=nan is invalid"):
        enc.bias(torch.arange(2, 7), torch.arange(7.0).index_fill(0, torch.tensor(3), float("nan")), q=q, k=k)


def test_positions_method_counts():
    enc = _cope(max_position=4)
    q = torch.full((1, H, 6, D), 3.0)
    k = torch.full((1, 1, 6, D), 3.0)  # q . k / sqrt(D) = 25.5: every gate ~1
    i, j = torch.arange(6)[:, None], torch.arange(6)[None, :]
    want = torch.where(j <= i, (i - j + 1).clamp(max=4), 0).float().expand(1, H, 6, 6)
    # each gate is within an ulp of 1 (1 - 8e-12 rounds to 1): a count of <= 6 gates, within 6 u + its summation
    assert_close(enc.positions(q, k), want, rtol=0, atol=6 * unit_roundoff() + sum_atol(6, 6.0))


# ---------------------------------------------------------------------------------------------------------------
# Backends, gradients


def test_sdpa_matches_eager_forward_and_backward():
    enc = _cope()
    q, k, v = _qkv(9, 9, requires_grad=True)
    docs = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1, 1])
    results = []
    for backend in ("eager", "sdpa"):
        out = posenc.attention(q, k, v, encoding=enc, backend=backend, document_ids=docs)
        weight = torch.linspace(-1, 1, out.numel()).view_as(out)
        results.append((out, torch.autograd.grad((out * weight).sum(), [q, k, v, enc.embeddings])))
    assert_close(results[1][0], results[0][0], **TOL)
    for g_sdpa, g_eager in zip(results[1][1], results[0][1], strict=True):
        assert_close(g_sdpa, g_eager, **TOL)
    assert results[0][1][3].abs().sum() > 0  # the table learns


def test_attention_gradcheck():
    """Through attention, in float64: the queries and keys reach the scores both directly and through the gates
    (tests/functional/test_cope.py gradchecks the table too)."""
    enc = _cope(max_position=2, dtype=torch.float64)
    q, k, v = _qkv(3, 4, b=1, hkv=2, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda q, k, v: posenc.attention(q, k, v, encoding=enc, backend="eager"), [q, k, v])
    assert torch.autograd.gradcheck(lambda q, k, v: posenc.attention(q, k, v, encoding=enc, backend="sdpa"), [q, k, v])


def test_flex_is_refused_and_auto_picks_sdpa():
    enc = _cope()
    q, k, v = _qkv(6, 6)
    expected = r"backend='flex' is invalid: expected 'eager', 'sdpa' or 'auto' here: CoPE's bias reads every key"
    with pytest.raises(ValueError, match=expected), torch.no_grad():
        posenc.attention(q, k, v, encoding=enc, backend="flex")
    assert _resolve_backend("auto", enc, q, k, v) == "sdpa"
    big = [torch.zeros(()).expand(1, H, 4096, D) for _ in range(3)]  # a bias past FLEX_MIN_BIAS_BYTES
    with torch.no_grad():
        assert _resolve_backend("auto", enc, *big) == "sdpa"
        assert_close(posenc.attention(q, k, v, encoding=enc), posenc.attention(q, k, v, encoding=enc, backend="eager"))


def test_causal_false_is_refused():
    q, k, v = _qkv(6, 6)
    with pytest.raises(ValueError, match=r"causal=False is invalid: expected True: CoPE is defined over the causal"):
        posenc.attention(q, k, v, encoding=_cope(), causal=False, backend="eager")


def test_bias_needs_the_keys():
    enc = _cope()
    q, k, _ = _qkv(6, 6)
    pos = torch.arange(6)
    with pytest.raises(ValueError, match=r"k='NoneType' is invalid: expected the keys .*sigmoid\(q \. k\)"):
        enc.bias(pos, pos, q=q)
    with pytest.raises(ValueError, match=r"q='NoneType' is invalid: expected the queries"):
        enc.bias(pos, pos, k=k)
    with pytest.raises(ValueError, match=r"num_heads=4 is invalid.*3"):
        enc.bias(pos, pos, q=q[:, :3], k=k[:, :1])
    with pytest.raises(ValueError, match=r"q\.shape\[-1\]=6 is invalid: expected head_dim = 8"):
        enc.bias(pos, pos, q=q[..., :6], k=k[..., :6])


# ---------------------------------------------------------------------------------------------------------------
# KV cache, chunks, packing: each equals the full forward


@pytest.mark.parametrize("backend", ["eager", "sdpa"])
def test_decode_and_chunks_equal_full_forward(backend):
    enc = _cope(max_position=5)
    q, k, v = _qkv(16, 16)
    with torch.no_grad():
        full = posenc.attention(q, k, v, encoding=enc, backend=backend)
        steps = [
            posenc.attention(q[:, :, a:b], k[:, :, :b], v[:, :, :b], encoding=enc, backend=backend)
            for a, b in [(0, 10), (10, 11), (11, 12), (12, 15), (15, 16)]
        ]
    assert_close(torch.cat(steps, dim=2), full, **TOL)


@pytest.mark.parametrize("backend", ["eager", "sdpa"])
def test_packed_documents_equal_each_document_alone(backend):
    enc = _cope(max_position=5)
    lengths = (6, 9, 4)
    q, k, v = _qkv(sum(lengths), sum(lengths), b=1)
    positions, docs = posenc.packed_positions(lengths)
    with torch.no_grad():
        packed = posenc.attention(q, k, v, encoding=enc, q_positions=positions, document_ids=docs, backend=backend)
        alone, start = [], 0
        for n in lengths:
            part = slice(start, start + n)
            alone.append(posenc.attention(q[:, :, part], k[:, :, part], v[:, :, part], encoding=enc, backend=backend))
            start += n
    assert_close(packed, torch.cat(alone, dim=2), **TOL)


def test_low_precision_model_keeps_float32_math():
    enc = _cope()
    q, k, v = _qkv(10, 10)
    with torch.no_grad():
        enc.embeddings.copy_(enc.embeddings.bfloat16().float())
        ref_out = posenc.attention(q, k, v, encoding=enc, backend="eager")
        low = _cope().to(torch.bfloat16)
        low.embeddings.copy_(enc.embeddings)
        out = posenc.attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), encoding=low, backend="eager")
        assert low.bias(None, None, q=q.bfloat16(), k=k.bfloat16()).dtype == torch.float32
    assert out.dtype == torch.bfloat16
    assert_close(out.float(), ref_out, atol=4e-2, rtol=4e-2)
