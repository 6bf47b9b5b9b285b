"""attention_temperature / apply_temperature: Llama 4's formula, its defaults, exact positions, dtypes."""

import math

import pytest
import torch
from torch.testing import assert_close

from posenc.functional import apply_temperature, attention_temperature
from tolerances import ulps

FLOOR, STRENGTH = 4, 0.5


def test_temperature_values():
    positions = torch.tensor([0, 1, 2, 3, 6, 7, 8, 100, 4095])
    want = [math.log1p(math.floor((p + 1) / FLOOR)) * STRENGTH + 1 for p in positions.tolist()]
    got = attention_temperature(positions, floor_scale=FLOOR, attn_scale=STRENGTH)
    assert got.dtype == torch.float32
    assert_close(got, torch.tensor(want, dtype=torch.float32), rtol=0, atol=0)
    assert got[:3].tolist() == [1.0, 1.0, 1.0]  # no change before position floor_scale - 1
    # the defaults are Llama 4's: 8192 tokens a step, strength 0.1
    default = attention_temperature(torch.tensor([8190, 8191, 3 * 8192 - 1]))
    # float64 inside, rounded once to float32 like the expected values: equal but at a rounding tie, 1 ulp apart
    assert_close(default, torch.tensor([1.0, 1 + 0.1 * math.log(2), 1 + 0.1 * math.log(4)]), **ulps(1))


def test_positions_past_float32_precision_stay_exact():
    """Transformers computes in float32, where 2**24 + 1 rounds to 2**24; posenc floors in float64."""
    p = 2**24 + 1
    got = attention_temperature(torch.tensor([p]), floor_scale=p + 1, attn_scale=1.0)
    assert_close(got, torch.tensor([1 + math.log(2)]), **ulps(1))  # as above
    float32_result = torch.log1p(torch.floor((torch.tensor([p]).float() + 1.0) / (p + 1))) + 1.0
    assert float32_result.item() == 1.0  # what a float32 floor would have given
    got64 = attention_temperature(torch.tensor([p], dtype=torch.float64), floor_scale=p + 1, attn_scale=1.0)
    assert_close(got64, got, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.float32, torch.float64])
def test_exact_position_dtypes_agree(dtype):
    want = attention_temperature(torch.arange(50), floor_scale=FLOOR, attn_scale=STRENGTH)
    assert_close(attention_temperature(torch.arange(50).to(dtype), floor_scale=FLOOR, attn_scale=STRENGTH), want)


def test_apply_scales_each_query_row():
    q = torch.randn(2, 3, 10, 8, dtype=torch.bfloat16)
    pos = torch.arange(10)
    scale = attention_temperature(pos, floor_scale=FLOOR, attn_scale=STRENGTH)
    got = apply_temperature(q, pos, floor_scale=FLOOR, attn_scale=STRENGTH)
    assert got.dtype == torch.bfloat16
    assert_close(got, (q.float() * scale[:, None]).bfloat16(), rtol=0, atol=0)  # scaled in float32, rounded once
