"""The lab GPT with Llama 4's iRoPE arrangement, ``ModelConfig(attention_chunk_size=C)``: the non-NoPE layers attend
within chunks of C positions (``posenc.attention(chunk_size=C)``), the NoPE layers globally (config round trips:
test_gpt_local.py)."""


import pytest
import torch

import posenc
from posenc.lab.common.gpt import GPT, ModelConfig, split_chunk

TINY = {"dim": 32, "n_layers": 2, "n_heads": 4, "max_len": 16}


def test_only_the_non_nope_layers_are_chunked():
    config = ModelConfig(encoding="rope/nope_temperature:2", attention_chunk_size=4, **{**TINY, "n_layers": 4})
    assert config.layer_chunk_sizes == (4, None, 4, None)
    assert [b.attn.chunk_size for b in GPT(config).blocks] == [4, None, 4, None]
    assert ModelConfig(encoding="rope", attention_chunk_size=8, **TINY).layer_chunk_sizes == (8, 8)
    assert ModelConfig(encoding="nope", attention_chunk_size=8, **TINY).layer_chunk_sizes == (None, None)
    assert ModelConfig(encoding="rope/nope:2", **TINY).layer_chunk_sizes == (None, None)


@torch.no_grad()
@pytest.mark.parametrize("backend", ["eager", "sdpa", "flex"])
def test_each_layer_is_posenc_attention_with_its_chunk(backend):
    """Layer 1 (RoPE) == ``posenc.attention(..., chunk_size=4)``; layer 2 (NoPE + temperature) == global attention."""
    config = ModelConfig(encoding="rope/nope_temperature:2", attention_chunk_size=4, backend=backend, **TINY)
    model = GPT(config).eval()
    x, pos = torch.randn(2, 16, TINY["dim"]), torch.arange(16)
    for block, encoding, chunk in zip(model.blocks, model.layer_encodings(), (4, None), strict=True):
        attn = block.attn
        q, k, v = attn.qkv(x).view(2, 16, 3, 4, 8).permute(2, 0, 3, 1, 4)  # 3 x (B, H, S, D)
        y = posenc.attention(
            q, k, v, encoding=encoding, q_positions=pos, causal=True, backend="eager", chunk_size=chunk
        )
        want = attn.proj(y.transpose(1, 2).reshape(2, 16, TINY["dim"]))
        torch.testing.assert_close(attn(x, pos, encoding), want, rtol=1e-5, atol=1e-6)
        other = posenc.attention(q, k, v, encoding=encoding, q_positions=pos, causal=True, chunk_size=2 if chunk else 4)
        assert not torch.allclose(attn.proj(other.transpose(1, 2).reshape(2, 16, TINY["dim"])), want, atol=1e-5)


@torch.no_grad()
def test_an_earlier_chunk_reaches_later_ones_only_through_the_nope_layers():
    """A token in chunk 0 changes the chunked RoPE layer's output only within chunk 0; the NoPE layer after it
    carries it on to every later position. With RoPE in both layers, later chunks never see it."""
    tokens = torch.randint(0, 256, (1, 16))
    changed = tokens.clone()
    changed[0, 1] = (tokens[0, 1] + 1) % 256

    def after_first_block(model, t):
        return model.blocks[0](model.wte(t) * model.embed_scale, torch.arange(16), model.layer_encodings()[0])

    irope = GPT(ModelConfig(encoding="rope/nope_temperature:2", attention_chunk_size=4, **TINY)).eval()
    a, b = after_first_block(irope, tokens), after_first_block(irope, changed)
    torch.testing.assert_close(a[:, 4:], b[:, 4:], rtol=0, atol=0)
    assert not torch.allclose(a[:, 1:4], b[:, 1:4])
    assert (irope(tokens)[0, 4:] - irope(changed)[0, 4:]).abs().amax(-1).min() > 0  # every later position moves
    chunked = GPT(ModelConfig(encoding="rope", attention_chunk_size=4, **TINY)).eval()
    torch.testing.assert_close(chunked(tokens)[:, 4:], chunked(changed)[:, 4:], rtol=0, atol=0)
    glob = GPT(ModelConfig(encoding="rope", **TINY)).eval()  # the same weights attending globally
    assert (glob(tokens)[0, 4:] - glob(changed)[0, 4:]).abs().amax(-1).min() > 0


def test_the_spec_suffix():
    assert split_chunk("rope/nope_temperature:4@16") == ("rope/nope_temperature:4", 16)
    assert split_chunk("rope@8") == ("rope", 8) and split_chunk("rope") == ("rope", None)
    for bad in ("rope@", "@4", "rope@0", "rope@x", "rope@-2"):
        with pytest.raises(ValueError, match="SPEC@C"):
            split_chunk(bad)
