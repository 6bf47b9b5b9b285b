"""``posenc.functional.relative``: T5 buckets bit-equal to Hugging Face, Shaw terms equal to the paper's formulas."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch.testing import assert_close
from transformers.models.t5.modeling_t5 import T5Attention

from posenc.functional.relative import (
    check_t5_buckets,
    relative_positions,
    shaw_bias,
    shaw_relative_index,
    shaw_value_term,
    t5_bias,
    t5_relative_position_bucket,
)
from reference import shaw as ref

hf_bucket = T5Attention._relative_position_bucket

# (num_buckets, max_distance): T5's default, small/odd ones, the smallest valid per direction, a long-range one.
BUCKETS = [(32, 128), (16, 64), (8, 20), (33, 100), (64, 1024), (4, 2), (6, 7), (2, 2), (3, 5)]

# Every distance up to beyond the largest max_distance, then far ones up to int32's limit.
FAR = [10**4, 10**5, 10**6, 2**24 + 1, 2**31 - 1]
RELATIVE = torch.cat([torch.arange(-2100, 2101), torch.tensor(FAR), -torch.tensor(FAR)])


# Settings HF does not handle: exact = 0 raises ZeroDivisionError there; max_distance <= exact divides by
# log(max_distance / exact) <= 0 and returns buckets outside [0, num_buckets). posenc rejects both.
UNDEFINED = {(4, 2, False), (2, 2, True), (3, 5, True)}


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize(("num_buckets", "max_distance"), BUCKETS)
def test_bucket_equals_hf(num_buckets, max_distance, bidirectional, dtype):
    rel = RELATIVE.to(dtype)
    kw = dict(bidirectional=bidirectional, num_buckets=num_buckets, max_distance=max_distance)
    if (num_buckets, max_distance, bidirectional) in UNDEFINED:
        with pytest.raises(ValueError, match="num_buckets|max_distance"):
            check_t5_buckets(**kw)
        with pytest.raises(ValueError, match="num_buckets|max_distance"):
            t5_relative_position_bucket(rel, **kw)
        return
    got = t5_relative_position_bucket(rel, **kw)
    want = hf_bucket(rel, **kw)
    assert got.dtype == want.dtype == torch.int64
    assert torch.equal(got, want)
    assert int(got.min()) >= 0 and int(got.max()) < num_buckets


def test_bucket_equals_hf_on_a_2d_grid():
    """compute_bias's own input: memory_position - context_position over (S, T)."""
    rel = torch.arange(300)[None, :] - torch.arange(250)[:, None]  # (S, T)
    assert torch.equal(t5_relative_position_bucket(rel), hf_bucket(rel))


def test_bucket_directions():
    """Bidirectional: k > q in the upper half of the buckets; causal: every k >= q in distance 0's bucket."""
    rel = torch.arange(-50, 51)
    both = t5_relative_position_bucket(rel, num_buckets=32, max_distance=128)
    assert torch.equal(both[rel > 0] >= 16, torch.ones(50, dtype=torch.bool))
    assert torch.equal(both[rel <= 0] < 16, torch.ones(51, dtype=torch.bool))
    causal = t5_relative_position_bucket(rel, bidirectional=False, num_buckets=32, max_distance=128)
    assert torch.equal(causal[rel >= 0], torch.zeros(51, dtype=torch.long))
    assert torch.equal(causal[rel < 0][-16:], torch.arange(16, 0, -1))  # distances 16..1 -> exact buckets


@pytest.mark.parametrize("bidirectional", [True, False])
def test_t5_bias_equals_table_lookup(bidirectional):
    """Per-row positions (B, S) against shared keys (T,): row b is table[HF bucket(k - q_b)].T."""
    table = torch.randn(8, 3)
    q_pos = torch.tensor([[5, 6, 7, 100], [0, 1, 2, 3]])
    k_pos = torch.arange(0, 40, 3)
    got = t5_bias(q_pos, k_pos, table, bidirectional=bidirectional, num_buckets=8, max_distance=20)
    assert got.shape == (2, 3, 4, 14) and got.dtype == torch.float32 and got.is_contiguous()
    for b in range(2):
        rel = k_pos[None, :] - q_pos[b][:, None]  # (S, T)
        buckets = hf_bucket(rel, bidirectional=bidirectional, num_buckets=8, max_distance=20)
        assert torch.equal(got[b], table[buckets].permute(2, 0, 1))  # (S, T, H) -> (H, S, T)


def test_relative_positions_do_not_wrap_unsigned():
    q_pos, k_pos = torch.tensor([5], dtype=torch.uint8), torch.tensor([0, 9], dtype=torch.uint8)
    assert torch.equal(relative_positions(q_pos, k_pos), torch.tensor([[-5, 4]]))


@given(st.integers(1, 6), st.lists(st.integers(-40, 40), min_size=1, max_size=8), st.integers(-1000, 1000))
def test_shaw_relative_index_is_the_clipped_distance(k_max, k_list, q):
    got = shaw_relative_index(torch.tensor([q]), torch.tensor(k_list) + q, max_distance=k_max)
    want = [[ref.clip(k, k_max) + k_max for k in k_list]]
    assert got.tolist() == want


def _shaw_inputs(b=2, h=3, s=5, t=7, d=4, k_max=2):
    q = torch.randn(b, h, s, d, dtype=torch.float64)
    q_pos = torch.tensor([[3, 4, 5, 6, 7], [0, 2, 4, 6, 8]])[:b]
    k_pos = torch.arange(t) + 2
    return q, q_pos, k_pos, torch.randn(2 * k_max + 1, d, dtype=torch.float64)


def test_shaw_bias_matches_reference():
    q, q_pos, k_pos, w_k = _shaw_inputs()
    assert_close(shaw_bias(q, q_pos, k_pos, w_k, scale=0.7), ref.key_bias(q, q_pos, k_pos, w_k, 0.7))
    assert_close(shaw_bias(q, q_pos, k_pos, w_k), ref.key_bias(q, q_pos, k_pos, w_k, 4**-0.5))


def test_shaw_value_term_matches_reference():
    _, q_pos, k_pos, w_v = _shaw_inputs()
    weights = torch.softmax(torch.randn(2, 3, 5, 7, dtype=torch.float64), -1)
    assert_close(shaw_value_term(weights, q_pos, k_pos, w_v), ref.value_term(weights, q_pos, k_pos, w_v))


def test_errors_name_the_parameter():
    q, q_pos, k_pos, w = _shaw_inputs()
    with pytest.raises(ValueError, match=r"relative_position\.dtype"):
        t5_relative_position_bucket(torch.tensor([1.0]))
    with pytest.raises(ValueError, match=r"num_buckets=3 is invalid"):
        t5_relative_position_bucket(torch.tensor([1]), num_buckets=3)
    with pytest.raises(ValueError, match=r"max_distance=8 is invalid: expected an integer > 8"):
        t5_relative_position_bucket(torch.tensor([1]), num_buckets=32, max_distance=8)
    with pytest.raises(ValueError, match=r"table\.shape"):
        t5_bias(q_pos, k_pos, torch.randn(16, 3), num_buckets=32)
    with pytest.raises(ValueError, match=r"q_pos\.dtype"):
        t5_bias(q_pos.float(), k_pos, torch.randn(32, 3))
    with pytest.raises(ValueError, match=r"k_pos\.shape"):
        relative_positions(q_pos, torch.zeros(3, 7, dtype=torch.long))
    with pytest.raises(ValueError, match=r"k_pos\.shape"):
        relative_positions(q_pos, torch.zeros(2, 7, 1, dtype=torch.long))
    with pytest.raises(ValueError, match=r"table\.shape"):
        shaw_bias(q, q_pos, k_pos, torch.randn(4, 4))
    with pytest.raises(ValueError, match=r"q\.shape\[-1\]"):
        shaw_bias(q, q_pos, k_pos, torch.randn(5, 8))
    with pytest.raises(ValueError, match=r"q_pos\.shape"):
        shaw_bias(q, q_pos[:, :4], k_pos, w)
    with pytest.raises(ValueError, match=r"k_pos\.shape"):
        shaw_value_term(torch.rand(2, 3, 5, 7), q_pos, k_pos[:6], w)
    with pytest.raises(ValueError, match=r"max_distance=0 is invalid"):
        shaw_relative_index(q_pos, k_pos, max_distance=0)
