"""posenc.functional.cope: gates, positions and the bias against the equations written out (tests/reference/cope.py),
the limits the paper states (all gates 1 -> i - j + 1), interpolation, gradients (gradcheck through the gates and
the table), masks (KV-cache rows, documents) and bad input."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from posenc.functional.cope import (
    causal_mask,
    cope_bias,
    cope_gates,
    cope_positions,
    interpolate_logits,
)
from reference import cope as ref

EXACT64 = {"rtol": 1e-12, "atol": 1e-12}


def _qk(b=2, h=4, hkv=2, s=5, t=7, d=6, dtype=torch.float64, spread=1.0):
    g = torch.Generator().manual_seed(7)
    q = torch.randn(b, h, s, d, generator=g, dtype=dtype) * spread
    k = torch.randn(b, hkv, t, d, generator=g, dtype=dtype) * spread
    return q, k


def _table(rows, d=6, heads=None, dtype=torch.float64):
    g = torch.Generator().manual_seed(11)
    shape = (rows, d) if heads is None else (heads, rows, d)
    return torch.randn(*shape, generator=g, dtype=dtype)


@pytest.mark.parametrize("hkv", [1, 2, 4])
@pytest.mark.parametrize(("s", "t"), [(7, 7), (1, 7), (3, 7)])
@pytest.mark.parametrize("max_position", [2, 3, 20])  # clipped often, sometimes, never (a table past T)
@pytest.mark.parametrize("per_head", [False, True])
@pytest.mark.parametrize("scale", [None, 0.9])
def test_bias_equals_the_equations(hkv, s, t, max_position, per_head, scale):
    q, k = _qk(hkv=hkv, s=s, t=t, spread=1.5)
    table = _table(max_position + 1, heads=4 if per_head else None)
    got = cope_bias(q, k, table, scale=scale)
    want = ref.bias(q, k, table, scale=6**-0.5 if scale is None else scale)
    assert got.dtype == torch.float64 and got.shape == (2, 4, s, t)
    assert_close(got, want, **EXACT64)


def test_positions_and_gates_equal_the_equations():
    q, k = _qk(s=4, t=7)
    want = ref.positions(q, k, scale=0.5, max_position=4)
    assert_close(cope_positions(q, k, max_position=4, scale=0.5), want, **EXACT64)
    gates = cope_gates(q, k, scale=0.5)
    k_rep = k.repeat_interleave(2, dim=1)  # query head h reads key head h // 2
    full = torch.sigmoid(q @ k_rep.transpose(-1, -2) * 0.5)
    assert_close(gates, full * causal_mask(4, 7), **EXACT64)
    assert (gates[..., 0, 4:] == 0).all()  # query 0 sits at key 3: keys 4.. are its future


def test_float32_follows_the_float64_equations():
    q, k = _qk(dtype=torch.float32)
    table = _table(5, dtype=torch.float32)
    got = cope_bias(q, k, table, scale=0.4)
    assert got.dtype == torch.float32
    assert_close(got.double(), ref.bias(q, k, table, scale=0.4), rtol=1e-5, atol=1e-5)


def test_bfloat16_inputs_compute_in_float32():
    q, k = _qk(dtype=torch.float32)
    table = _table(5, dtype=torch.float32)
    q16, k16, t16 = q.bfloat16(), k.bfloat16(), table.bfloat16()
    got = cope_bias(q16, k16, t16, scale=0.4)
    assert got.dtype == torch.float32
    assert_close(got, cope_bias(q16.float(), k16.float(), t16.float(), scale=0.4), rtol=0, atol=0)


def test_open_gates_count_tokens():
    """Gates at 1 (q . k >> 0): p_ij = i - j + 1, the paper's token-based relative position; at 0: nothing."""
    s = t = 6
    q = torch.full((1, 1, s, 4), 10.0, dtype=torch.float64)
    k = torch.full((1, 1, t, 4), 10.0, dtype=torch.float64)
    i = torch.arange(s)[:, None]
    j = torch.arange(t)[None, :]
    want = torch.where(j <= i, (i - j + 1).clamp(max=4), 0).double()
    assert_close(cope_positions(q, k, max_position=4, scale=1.0)[0, 0], want, **EXACT64)
    closed = cope_positions(q, -k, max_position=4, scale=1.0)
    assert closed.max() < 1e-60


def test_bias_reads_the_interpolated_table():
    """One gate half open: p = 0.5 reads (e[0] + e[1]) / 2; integer counts read one row."""
    q = torch.tensor([[[[1.0, 0.0]]]], dtype=torch.float64)  # (1, 1, 1, 2)
    k = torch.zeros(1, 1, 1, 2, dtype=torch.float64)  # q . k = 0: gate 0.5
    table = torch.tensor([[2.0, 0.0], [4.0, 0.0], [8.0, 0.0]], dtype=torch.float64)
    assert cope_bias(q, k, table, scale=1.0).item() == pytest.approx(3.0)
    k2 = torch.full((1, 1, 3, 2), 40.0, dtype=torch.float64)
    q2 = torch.tensor([[[[1.0, 1.0]]]], dtype=torch.float64)  # gates 1: p = 3, 2, 1 clipped to 2, 2, 1
    assert cope_bias(q2, k2, table, scale=1.0)[0, 0, 0].tolist() == [8.0, 8.0, 4.0]


def test_interpolate_logits():
    logits = torch.tensor([[[[1.0, 3.0, 7.0]]]], dtype=torch.float64, requires_grad=True)
    p = torch.tensor([[[[0.0, 0.25, 1.0, 1.5, 2.0]]]], dtype=torch.float64, requires_grad=True)
    out = interpolate_logits(logits, p)
    assert out.tolist() == [[[[1.0, 1.5, 3.0, 5.0, 7.0]]]]
    (grad,) = torch.autograd.grad(out.sum(), p)
    # d/dp = logits[ceil p] - logits[floor p]: 0 at integers (ceil == floor, as in the reference), the slope between
    assert grad.tolist() == [[[[0.0, 2.0, 0.0, 4.0, 0.0]]]]


@pytest.mark.parametrize("per_head", [False, True])
def test_gradcheck_through_gates_and_table(per_head):
    q, k = _qk(b=1, h=2, hkv=1, s=3, t=5, d=3)
    table = _table(4, d=3, heads=2 if per_head else None)  # p_max = 3 < 5 keys: some counts clipped
    docs = torch.tensor([0, 0, 1, 1, 1])
    mask = (docs[2:, None] == docs[None, :])[None, None]  # (1, 1, 3, 5)
    inputs = [x.clone().requires_grad_() for x in (q, k, table)]
    assert torch.autograd.gradcheck(lambda q, k, e: cope_bias(q, k, e, scale=0.8, mask=mask), inputs)


def test_gradient_reaches_the_keys_only_through_the_gates():
    """The bias depends on k only through the positions: a nonzero gradient to k is the gates' gradient."""
    q, k = _qk(s=5, t=5)
    k.requires_grad_()
    table = _table(6)
    (grad,) = torch.autograd.grad(cope_bias(q, k, table).square().sum(), k)
    assert grad.abs().min() > 0
    flat = torch.zeros_like(table) + table[:1]  # every row equal: the position is irrelevant
    (grad_flat,) = torch.autograd.grad(cope_bias(q, k, flat).square().sum(), k)
    assert grad_flat.abs().max() < 1e-12


def test_decode_rows_equal_the_full_rows():
    """KV cache: the last S queries against all T keys give the full forward's last S rows."""
    q, k = _qk(s=9, t=9)
    table = _table(5)
    full = cope_bias(q, k, table)
    for a, b in [(0, 4), (4, 5), (5, 9), (8, 9)]:
        assert_close(cope_bias(q[:, :, a:b], k[:, :, :b], table), full[:, :, a:b, :b], **EXACT64)
    assert (full[:, :, 0, 1:] == 0).all()  # the future keys hold nothing


def test_documents_count_only_their_own_tokens():
    """Packed documents with a mask == each document alone, 0 across documents. (Within a contiguous document the
    keys between key and query are the document's own anyway; without the mask the cross-document entries count.)"""
    q, k = _qk(b=1, s=9, t=9, hkv=4)
    table = _table(12)
    docs = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1, 1])
    mask = (docs[:, None] == docs[None, :])[None, None]
    packed = cope_bias(q, k, table, mask=mask)
    first = cope_bias(q[:, :, :4], k[:, :, :4], table)
    second = cope_bias(q[:, :, 4:], k[:, :, 4:], table)
    assert_close(packed[:, :, :4, :4], first, **EXACT64)
    assert_close(packed[:, :, 4:, 4:], second, **EXACT64)
    assert (packed[:, :, 4:, :4] == 0).all() and (packed[:, :, :4, 4:] == 0).all()
    assert (cope_bias(q, k, table)[:, :, 4:, :4] != 0).all()


def test_mask_per_head_and_batch_row_follow_the_equations():
    q, k = _qk(b=2, h=4, hkv=4, s=4, t=6)
    table = _table(4)
    mask = torch.rand(2, 4, 4, 6, generator=torch.Generator().manual_seed(2)) > 0.3
    assert_close(
        cope_bias(q, k, table, scale=0.7, mask=mask), ref.bias(q, k, table, scale=0.7, visible=mask), **EXACT64
    )


def test_bad_input():
    q, k = _qk()
    table = _table(4)
    with pytest.raises(ValueError, match=r"k\.shape\[1\]=3 is invalid.*divides the 4 query heads"):
        cope_bias(q, k[:, :1].expand(-1, 3, -1, -1), table)
    with pytest.raises(ValueError, match=r"q\.shape\[2\]=9.*at most the number of keys, 7"):
        cope_bias(torch.randn(2, 4, 9, 6, dtype=torch.float64), k, table)
    with pytest.raises(ValueError, match=r"k\.shape=\(2, 2, 7, 5\).*head_dim"):
        cope_bias(q, k[..., :5], table)
    with pytest.raises(ValueError, match=r"q\.shape=\(4, 5, 6\)"):
        cope_bias(q[0], k, table)
    with pytest.raises(ValueError, match=r"embeddings\.shape=\(4, 5\).*p_max \+ 1, 6"):
        cope_bias(q, k, table[:, :5])
    with pytest.raises(ValueError, match=r"embeddings\.shape=\(1, 6\).*p_max >= 1"):
        cope_bias(q, k, table[:1])
    with pytest.raises(ValueError, match=r"embeddings\.shape=\(3, 4, 6\)"):
        cope_bias(q, k, table.expand(3, -1, -1))
    with pytest.raises(ValueError, match=r"mask=torch\.int64.*torch\.bool"):
        cope_bias(q, k, table, mask=torch.ones(1, 1, 5, 7, dtype=torch.long))
    with pytest.raises(ValueError, match=r"mask\.shape=\(5, 7\).*\(B, H, S, T\) = \(2, 4, 5, 7\)"):
        cope_bias(q, k, table, mask=torch.ones(5, 7, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"scale=nan"):
        cope_bias(q, k, table, scale=float("nan"))
    with pytest.raises(ValueError, match=r"max_position=0 is invalid"):
        cope_positions(q, k, max_position=0)
    with pytest.raises(ValueError, match=r"max_position=True is invalid"):
        cope_positions(q, k, max_position=True)
