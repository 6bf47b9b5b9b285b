"""The lab GPT with sliding-window attention, ``ModelConfig(sliding_window=W)``: the non-NoPE layers see the W most
recent positions (``posenc.attention(window=W)``: Mistral's windows with ``encoding="rope"``, RNoPE-SWA with
``"rope/nope:N"``), the NoPE layers attend globally; the ``SPEC~W`` and ``SPEC+sinks`` suffixes (config round trips:
test_gpt_local.py)."""


import pytest
import torch

import posenc
from posenc.lab.common.gpt import GPT, ModelConfig, split_local, split_window

TINY = {"dim": 32, "n_layers": 2, "n_heads": 4, "max_len": 16}


def test_only_the_non_nope_layers_are_windowed():
    config = ModelConfig(encoding="rope/nope:2", sliding_window=4, **{**TINY, "n_layers": 4})
    assert config.layer_windows == (4, None, 4, None)
    assert [b.attn.window for b in GPT(config).blocks] == [4, None, 4, None]
    assert ModelConfig(encoding="rope", sliding_window=8, **TINY).layer_windows == (8, 8)
    assert ModelConfig(encoding="nope", sliding_window=8, **TINY).layer_windows == (None, None)
    assert ModelConfig(encoding="rope/nope:2", **TINY).layer_windows == (None, None)
    both = ModelConfig(encoding="rope", sliding_window=3, attention_chunk_size=8, **TINY)
    assert [(b.attn.chunk_size, b.attn.window) for b in GPT(both).blocks] == [(8, 3), (8, 3)]


@torch.no_grad()
@pytest.mark.parametrize("backend", ["eager", "sdpa", "flex"])
def test_each_layer_is_posenc_attention_with_its_window(backend):
    """Layer 1 (RoPE) == ``posenc.attention(..., window=4)`` on eager; layer 2 (NoPE) == global attention; another
    window gives another output (the window reaches the attention)."""
    config = ModelConfig(encoding="rope/nope:2", sliding_window=4, backend=backend, **TINY)
    model = GPT(config).eval()
    x, pos = torch.randn(2, 16, TINY["dim"]), torch.arange(16)
    for block, encoding, window in zip(model.blocks, model.layer_encodings(), (4, None), strict=True):
        attn = block.attn
        q, k, v = attn.qkv(x).view(2, 16, 3, 4, 8).permute(2, 0, 3, 1, 4)  # 3 x (B, H, S, D)
        y = posenc.attention(q, k, v, encoding=encoding, q_positions=pos, causal=True, backend="eager", window=window)
        want = attn.proj(y.transpose(1, 2).reshape(2, 16, TINY["dim"]))
        torch.testing.assert_close(attn(x, pos, encoding), want, rtol=1e-5, atol=1e-6)
        other = posenc.attention(q, k, v, encoding=encoding, q_positions=pos, causal=True, window=2 if window else 4)
        assert not torch.allclose(attn.proj(other.transpose(1, 2).reshape(2, 16, TINY["dim"])), want, atol=1e-5)


@torch.no_grad()
def test_a_token_reaches_only_w_positions_per_windowed_layer():
    """Token 1 changed: one windowed layer moves positions 1..W exactly and none after; two windowed layers reach
    1..2W-1 at most; with a global NoPE layer after the windowed one (RNoPE-SWA) every later position moves."""
    w = 4
    tokens = torch.randint(0, 256, (1, 16))
    changed = tokens.clone()
    changed[0, 1] = (tokens[0, 1] + 1) % 256

    def after_first_block(model, t):
        return model.blocks[0](model.wte(t) * model.embed_scale, torch.arange(16), model.layer_encodings()[0])

    swa = GPT(ModelConfig(encoding="rope/nope:2", sliding_window=w, **TINY)).eval()
    a, b = after_first_block(swa, tokens), after_first_block(swa, changed)
    torch.testing.assert_close(a[:, 1 + w :], b[:, 1 + w :], rtol=0, atol=0)
    assert (a[0, 1 : 1 + w] - b[0, 1 : 1 + w]).abs().amax(-1).min() > 0
    assert (swa(tokens)[0, 1 + w :] - swa(changed)[0, 1 + w :]).abs().amax(-1).min() > 0  # the NoPE layer carries it
    mistral = GPT(ModelConfig(encoding="rope", sliding_window=w, **TINY)).eval()
    reach = 1 + 2 * (w - 1)  # the last position two windowed layers can carry token 1 to
    torch.testing.assert_close(mistral(tokens)[:, reach + 1 :], mistral(changed)[:, reach + 1 :], rtol=0, atol=0)
    assert (mistral(tokens)[0, reach] - mistral(changed)[0, reach]).abs().max() > 0


def test_the_spec_suffix():
    assert split_window("rope/nope:4~16") == ("rope/nope:4", 16)
    assert split_window("rope~8") == ("rope", 8) and split_window("rope") == ("rope", None)
    assert split_local("rope/nope_temperature:4@16~8") == ("rope/nope_temperature:4", 16, 8, False)
    assert split_local("rope@16") == ("rope", 16, None, False) and split_local("rope") == ("rope", None, None, False)
    assert split_local("rope~16+sinks") == ("rope", None, 16, True) and split_local("nope+sinks")[3]
    for bad in ("rope~", "~4", "rope~0", "rope~x", "rope~-2", "rope~4~4", "rope~4@16"):
        with pytest.raises(ValueError, match=r"SPEC~W|SPEC@C"):
            split_local(bad)
    for bad in ("+sinks", "rope+sink", "rope+sinks+sinks", "rope+sinks~4", "rope+x"):
        with pytest.raises(ValueError, match=r"SPEC\+sinks"):
            split_local(bad)
