"""Every length-dependent scaling (dynamic NTK, LongRoPE) under every remapping method, through
``posenc.attention(..., remap=)``: inputs shorter and longer than the original length run at the frequencies of
their own length (the remapped positions a branch rotates at may exceed it: never a reason to refuse), against the
float64 references of ``tests/reference/remapping.py`` at those frequencies; packed documents each at their own
length (== each document alone); the length checks read the sequence positions, not the remapped ones."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

import posenc
from posenc.remapping import METHODS, remap_method
from posenc.scalings import DynamicNTKScaling, LongRoPEScaling
from remapping.test_methods import logit_factor, qkv, reference
from tolerances import rotated_softmax_atol

ORIGINAL, D = 16, 8
#: The target each method is derived for: 3x, STRING its longest (2L - W); inputs past it run all the same.
TARGETS = {"string": 30}


def method_of(name):
    return remap_method(name, original=ORIGINAL, target=TARGETS.get(name, 48))


def scalings():
    long = tuple(1.0 + 0.5 * i for i in range(D // 2))
    return {
        "dynamic": DynamicNTKScaling(factor=2.0, max_position_embeddings=ORIGINAL),
        "longrope": LongRoPEScaling(
            short_factor=(1.0,) * (D // 2), long_factor=long, original_max_position_embeddings=ORIGINAL, factor=3.0
        ),
    }


def rope(scaling):
    return posenc.build("rope", head_dim=D, base=100.0, scaling=scalings()[scaling])


def at_length(enc, length):
    """A static RoPE with the frequencies (and attention factor) ``enc`` uses at ``length``."""
    inv_freq, factor = enc._frequencies(torch.tensor(float(length), dtype=torch.float64), device=None)
    return inv_freq, float(factor)


def expected(method, q, k, v, enc, length):
    inv_freq, factor = at_length(enc, length)
    return reference(method, q, k, v, enc, inv_freq=inv_freq, attention_factor=factor)


@pytest.mark.parametrize("scaling", ["dynamic", "longrope"])
@pytest.mark.parametrize("name", sorted(METHODS))
@pytest.mark.parametrize("length", [5, 10, 40])
def test_short_and_long_inputs_run_at_their_own_length(scaling, name, length):
    """5 and 10 tokens (below the original 16: unscaled / short factors; LM-Infinite's far queries are rotated at
    its window 16 > 10, which once raised), 40 (scaled) == the reference at the frequencies of that length."""
    method = method_of(name)
    enc = rope(scaling)
    q, k, v = qkv(2, 4, 2, length, D, seed=length)
    out = posenc.attention(q, k, v, encoding=enc, remap=method)
    _, factor = at_length(enc, length)
    tol = rotated_softmax_atol(
        q, k, v, torch.float64, max_position=length, logit_factor=factor**2 * logit_factor(method, length)
    )
    assert_close(out, expected(method, q, k, v, enc, length), atol=tol, rtol=0)


@pytest.mark.parametrize("scaling", ["dynamic", "longrope"])
@pytest.mark.parametrize("name", sorted(METHODS))
def test_packed_documents_each_at_their_own_length(scaling, name):
    """Documents of 10, 40 and 25 tokens packed in one row with ``document_ids`` and restarting positions: each
    equals itself alone (its own frequencies and, for DCA, its own length factor)."""
    method = method_of(name)
    enc = rope(scaling)
    lengths = [10, 40, 25]
    positions, docs = posenc.packed_positions(lengths)
    q, k, v = qkv(1, 4, 2, sum(lengths), D, seed=11)
    packed = posenc.attention(q, k, v, encoding=enc, remap=method, q_positions=positions, document_ids=docs)
    start = 0
    for n in lengths:
        rows = slice(start, start + n)
        alone = posenc.attention(q[:, :, rows], k[:, :, rows], v[:, :, rows], encoding=enc, remap=method)
        _, factor = at_length(enc, n)
        tol = rotated_softmax_atol(
            q, k, v, torch.float64, max_position=n, logit_factor=factor**2 * logit_factor(method, n)
        )
        assert_close(packed[:, :, rows], alone, atol=tol, rtol=0)
        start += n


def test_the_length_factor_changes_the_output():
    """The DCA factor is not a no-op past L (the test above could not tell a missing factor from a present one if
    both gave the same numbers)."""
    q, k, v = qkv(1, 2, 2, 64, D, seed=2)
    enc = posenc.build("rope", head_dim=D, base=100.0)
    chunkllama = remap_method("dca", original=ORIGINAL, target=64)
    none = remap_method("dca", original=ORIGINAL, target=64, mscale=0)
    served = remap_method("dca_vllm", original=ORIGINAL, target=64)
    outs = [posenc.attention(q, k, v, encoding=enc, remap=m) for m in (chunkllama, none, served)]
    assert float((outs[0] - outs[1]).abs().max()) > 1e-3
    assert float((outs[0] - outs[2]).abs().max()) > 1e-3


def test_a_length_below_a_sequence_position_is_refused():
    """The length is checked against the positions of the sequence (here 39), not against a remapped one."""
    q, k, v = qkv(1, 2, 2, 40, D)
    method = remap_method("lm_infinite", original=ORIGINAL, target=48)
    with pytest.raises(ValueError, match="seq_len"):
        posenc.attention(q, k, v, encoding=rope("dynamic"), remap=method, seq_len=30)
    posenc.attention(q, k, v, encoding=rope("dynamic"), remap=method, seq_len=40)
