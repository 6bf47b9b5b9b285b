"""Slope interpolation on tiny BLOOM and MPT models through ``posenc.hf.extend_context(model, "linear", factor)``.

References: BLOOM as transformers builds it but with its slope function returning the interpolated slopes (so the
bias comes out of transformers' own code, padding-mask path included); the full bias tensor each block receives,
against posenc's ``alibi_slopes / factor`` times the key offsets written out here.
"""

from __future__ import annotations

import pytest
import torch
import transformers.models.bloom.modeling_bloom as bloom

from hf.test_extend_remap import SWITCHES
from hf.tiny import ORIGINAL, logits, tiny_model
from posenc.functional import alibi_slopes
from posenc.hf import extend_context
from tolerances import like_reference_atol, ulps

FACTOR = 4.0


def _capture(block, key):
    """Record the bias keyword a block receives (registered after extend_context's hook, so it sees the result)."""
    seen = []
    block.register_forward_pre_hook(lambda m, args, kwargs: seen.append(kwargs[key]), with_kwargs=True)
    return seen


@pytest.mark.parametrize("padded", [False, True])
def test_bloom_equals_bloom_with_interpolated_slopes(padded, ids, monkeypatch):
    model = tiny_model("bloom")
    mask = None
    if padded:  # left padding on the first row: BLOOM takes its positions from the mask's cumsum
        mask = torch.ones_like(ids)
        mask[0, :5] = 0
    kwargs = {} if mask is None else {"attention_mask": mask}
    before = logits(model, ids, **kwargs)
    report = extend_context(model, "linear", FACTOR)
    patched = logits(model, ids, **kwargs)

    slopes = bloom._get_alibi_slopes
    monkeypatch.setattr(bloom, "_get_alibi_slopes", lambda n, device: slopes(n, device) / FACTOR)
    reference = logits(tiny_model("bloom", model.state_dict()), ids, **kwargs)
    # The float32 rounding of this model on this machine, measured against float64 without padding (BLOOM's float64
    # masks give NaN): the two float32 models may differ by a few times that (tests/tolerances.like_reference_atol).
    unpadded = tiny_model("bloom", model.state_dict())
    atol = like_reference_atol(logits(unpadded, ids), logits(unpadded.double(), ids))
    torch.testing.assert_close(patched, reference, rtol=0, atol=atol)
    assert not torch.allclose(patched, before, rtol=1e-3, atol=1e-4)
    assert report["modules_patched"] == 2 and report["method"] == "linear"
    torch.testing.assert_close(report["slopes"]["new"], alibi_slopes(4) / FACTOR, **ulps(1))


@pytest.mark.parametrize("heads", [4, 6])
def test_bloom_bias_tensor(heads, ids):
    model = tiny_model("bloom", n_head=heads, hidden_size=8 * heads)
    extend_context(model, "linear", FACTOR)
    seen = _capture(model.transformer.h[0], "alibi")
    logits(model, ids)
    batch, length = ids.shape
    expected = (alibi_slopes(heads) / FACTOR)[:, None] * torch.arange(length)  # (H, T): BLOOM's m_h * k
    expected = expected[None].expand(batch, heads, length).reshape(batch * heads, 1, length)  # (B*H, 1, T)
    torch.testing.assert_close(seen[0], expected, rtol=2e-6, atol=0)


def test_mpt_bias_tensor_and_longer_inputs(ids):
    model = tiny_model("mpt")
    report = extend_context(model, "linear", FACTOR)
    length = int(ORIGINAL * FACTOR)
    assert model.config.max_seq_len == length  # MPT's bias table must cover the new length
    assert report["max_position_embeddings"] == {"old": ORIGINAL, "new": length}
    seen = _capture(model.transformer.blocks[0], "position_bias")
    out = logits(model, ids)  # 3x the original length: would not fit MPT's original bias table
    expected = (alibi_slopes(4) / FACTOR)[:, None, None] * torch.arange(1 - length, 1)  # (H, 1, L): MPT's -m_h (L-1-k)
    torch.testing.assert_close(seen[0], expected, rtol=2e-6, atol=0)
    unpatched = tiny_model("mpt", model.state_dict(), max_seq_len=length)
    assert not torch.allclose(out, logits(unpatched, ids), rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("kind", ["bloom", "mpt"])
def test_factor_one_changes_nothing_and_calls_replace(kind, ids):
    model = tiny_model(kind, **({"max_seq_len": 3 * ORIGINAL} if kind == "mpt" else {}))
    before = logits(model, ids)
    extend_context(model, "linear", 1.0, max_position_embeddings=3 * ORIGINAL)
    torch.testing.assert_close(logits(model, ids), before, rtol=0, atol=0)
    extend_context(model, "linear", 2.0, max_position_embeddings=3 * ORIGINAL)
    extend_context(model, "linear", FACTOR, max_position_embeddings=3 * ORIGINAL, replace=True)  # 4, not 2 * 4
    once = tiny_model(kind, model.state_dict(), **({"max_seq_len": 3 * ORIGINAL} if kind == "mpt" else {}))
    extend_context(once, "linear", FACTOR, max_position_embeddings=3 * ORIGINAL)
    torch.testing.assert_close(logits(model, ids), logits(once, ids), rtol=0, atol=0)


def test_alibi_errors():
    model = tiny_model("bloom")
    with pytest.raises(ValueError, match=r"method='yarn'.*slope interpolation.*bloom \(BloomForCausalLM\)"):
        extend_context(model, "yarn", 2.0)
    with pytest.raises(ValueError, match="factor=0.5"):
        extend_context(model, "linear", 0.5)
    with pytest.raises(ValueError, match="original_max_position_embeddings=64"):
        extend_context(model, "linear", 2.0, original_max_position_embeddings=64, max_position_embeddings=32)
    assert not model.transformer.h[0]._forward_pre_hooks  # nothing was installed


def test_block_called_without_its_bias_raises():
    model = tiny_model("bloom")
    extend_context(model, "linear", 2.0)
    hidden = torch.zeros(1, 4, 32)
    with pytest.raises(RuntimeError, match="refusing to run it unpatched"):
        model.transformer.h[0](hidden, None, None)


@pytest.mark.parametrize("kind", ["bloom", "mpt"])
@pytest.mark.parametrize("route", ["model", "get_decoder()"])
def test_the_interpolation_survives_set_attn_implementation(kind, route, ids):
    """BLOOM and MPT build their attention by hand: transformers keeps them eager (with a warning) whatever
    ``set_attn_implementation`` asks, and the hooks stay on the blocks."""
    model = tiny_model(kind)
    extend_context(model, "linear", FACTOR)
    expected = logits(model, ids)
    SWITCHES[route](model, "sdpa")
    assert model.config._attn_implementation == "eager"
    torch.testing.assert_close(logits(model, ids), expected, rtol=0, atol=0)
