"""The lab's GPT: every sequence encoding trains through it; config round trips; init, causality, swapping."""

import json

import pytest
import torch

import posenc
from posenc.lab.common.gpt import GPT, ModelConfig, sequence_encodings

TINY = {"dim": 32, "n_layers": 2, "n_heads": 4, "max_len": 16}


def test_sequence_encodings_are_the_1d_ones():
    names = sequence_encodings()
    assert {"rope", "alibi", "nope", "sinusoidal", "learned", "t5", "shaw", "xpos"} <= set(names)
    assert not {"rope_axial", "mrope", "alibi_2d", "sinusoidal_2d"} & set(names)
    assert set(names) <= set(posenc.available())


@pytest.mark.parametrize("name", sequence_encodings())
def test_every_sequence_encoding_trains(name):
    model = GPT(ModelConfig(encoding=name, **TINY))
    tokens = torch.randint(0, 256, (3, 16))
    logits = model(tokens)
    assert logits.shape == (3, 16, 256) and logits.dtype == torch.float32
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens.roll(-1, 1).flatten())
    loss.backward()
    for pname, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), pname
        assert p.grad.abs().sum() > 0, pname
    # the encoding is built for this model and shared by every layer, registered once; or, where its parameters
    # are per layer (SSMax), one per layer, held by the blocks (an encoding may hold another inside it, as rope_ssmax
    # holds its RoPE: count the outermost ones)
    encodings = [m for m in model.modules() if isinstance(m, posenc.Encoding)]
    inner = {id(c) for m in encodings for c in m.modules() if c is not m}
    outermost = [m for m in encodings if id(m) not in inner]
    if model.layer_encodings()[0].per_layer:
        assert model.encoding is None and outermost == model.layer_encodings() == [b.encoding for b in model.blocks]
        assert len({id(m) for m in outermost}) == TINY["n_layers"]
    else:
        assert model.encoding is not None and outermost == [model.encoding]


@pytest.mark.parametrize("name", ["rope", "alibi", "learned", "rope/nope_temperature:2"])
def test_causal_and_default_positions(name):
    model = GPT(ModelConfig(encoding=name, **TINY)).eval()
    tokens = torch.randint(0, 256, (2, 16))
    changed = tokens.clone()
    changed[:, 10] = (changed[:, 10] + 1) % 256
    with torch.no_grad():
        a, b = model(tokens), model(changed)
        explicit = model(tokens, torch.arange(16))
    torch.testing.assert_close(a[:, :10], b[:, :10], rtol=0, atol=0)
    assert not torch.allclose(a[:, 10:], b[:, 10:])
    torch.testing.assert_close(a, explicit, rtol=0, atol=0)


def test_positions_matter_for_rope_not_nope():
    tokens = torch.randint(0, 256, (1, 16))
    shifted = torch.arange(16) + 5
    for name, moves in (("rope", False), ("nope", False), ("sinusoidal", True)):
        # float64: rounding (~1e-15 through two layers) is far below the 1e-9 that tells "no change" from "moved"
        model = GPT(ModelConfig(encoding=name, **TINY)).eval().double()
        with torch.no_grad():
            same = torch.allclose(model(tokens), model(tokens, shifted), rtol=0, atol=1e-9)
        # RoPE is relative (a shift changes nothing), NoPE has no positions, sinusoidal is absolute
        assert same != moves, name


def test_init_is_deterministic_and_leaves_the_global_rng_alone():
    cfg = ModelConfig(encoding="learned", **TINY)
    torch.manual_seed(123)
    before = torch.get_rng_state()
    a, b, c = GPT(cfg, seed=0), GPT(cfg, seed=0), GPT(cfg, seed=1)
    assert torch.equal(torch.get_rng_state(), before)
    for (name, x), y, z in zip(a.state_dict().items(), b.state_dict().values(), c.state_dict().values(), strict=True):
        assert torch.equal(x, y), name
        assert not torch.equal(x, z) or x.numel() == 0 or (x == 1).all(), name  # LayerNorm weights start at 1


def test_head_is_tied_and_state_dict_holds_each_tensor_once():
    model = GPT(ModelConfig(**TINY))
    sd = model.state_dict()
    assert not any("head" in k for k in sd)
    pointers = [t.untyped_storage().data_ptr() for t in sd.values()]
    assert len(set(pointers)) == len(pointers)


def test_gqa():
    model = GPT(ModelConfig(n_kv_heads=2, **TINY))
    assert model.blocks[0].attn.qkv.weight.shape == ((4 + 2 * 2) * 8, 32)
    assert model(torch.randint(0, 256, (2, 16))).shape == (2, 16, 256)


def test_set_encoding_swaps_for_every_layer():
    cfg = ModelConfig(encoding="rope", **TINY)
    model = GPT(cfg).eval()
    tokens = torch.randint(0, 256, (1, 16))
    with torch.no_grad():
        before = model(tokens)
        model.set_encoding(posenc.RotaryEmbedding(cfg.head_dim, scaling={"rope_type": "linear", "factor": 4.0}))
        after = model(tokens)
        model.set_encoding(posenc.RotaryEmbedding(cfg.head_dim))
        again = model(tokens)
    assert not torch.allclose(before, after)
    torch.testing.assert_close(before, again, rtol=0, atol=0)
    assert model.config == cfg
    with pytest.raises(ValueError, match="1-D token positions"):
        model.set_encoding(posenc.build("rope_axial", head_dim=8))
    with pytest.raises(ValueError, match="posenc.Encoding"):
        model.set_encoding(torch.nn.Identity())


def test_config_round_trip_through_json():
    cfg = ModelConfig(encoding="alibi", encoding_config={"symmetric": False}, n_kv_heads=2, **TINY)
    back = ModelConfig.from_dict(json.loads(json.dumps(cfg.to_dict())))
    assert back == cfg
    assert GPT(back).encoding.config == GPT(cfg).encoding.config


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"dim": 30}, "dim=30 is invalid: expected a multiple of n_heads"),
        ({"n_kv_heads": 3}, "n_kv_heads=3 is invalid"),
        ({"encoding": "ropee"}, "encoding='ropee' is invalid: expected one of"),
        ({"backend": "cuda"}, "backend='cuda' is invalid"),
        ({"n_layers": 0}, "n_layers=0 is invalid"),
        ({"encoding_config": {"f": object()}}, "JSON values"),
    ],
)
def test_config_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ModelConfig(**{**TINY, **kwargs})


def test_build_errors():
    with pytest.raises(ValueError, match="unknown_key|only the keys"):
        GPT(ModelConfig(encoding="rope", encoding_config={"unknown_key": 1}, **TINY))
    with pytest.raises(ValueError, match="1-D token positions"):
        GPT(ModelConfig(encoding="rope_axial", **TINY))
    with pytest.raises(ValueError, match="config"):
        GPT({"dim": 32})
    with pytest.raises(ValueError, match="config\\['bogus'\\]"):
        ModelConfig.from_dict({**TINY, "bogus": 1})


def test_forward_errors():
    model = GPT(ModelConfig(**TINY))
    with pytest.raises(ValueError, match="tokens.shape"):
        model(torch.zeros(16, dtype=torch.long))
    with pytest.raises(ValueError, match="tokens.dtype"):
        model(torch.zeros(1, 16))


def test_sinks_are_trainable_per_head_and_layer():
    """``sinks=True``: a logit per head and layer, 0 at the start, passed to ``posenc.attention(sinks=)`` and trained;
    the other weights are those of the same model without sinks; the default config dict has no ``sinks`` key (earlier
    runs' configs still compare equal on resume), a True one round-trips."""
    plain, sunk = GPT(ModelConfig(**TINY)), GPT(ModelConfig(sinks=True, **TINY))
    extra = {n: p for n, p in sunk.named_parameters() if n not in dict(plain.named_parameters())}
    assert sorted(extra) == ["blocks.0.attn.sinks", "blocks.1.attn.sinks"]
    assert all(p.shape == (TINY["n_heads"],) and not p.any() for p in extra.values())
    for name, p in plain.named_parameters():
        assert torch.equal(p, dict(sunk.named_parameters())[name]), name
    tokens = torch.randint(0, 256, (2, 16))
    loss = torch.nn.functional.cross_entropy(sunk(tokens).flatten(0, 1), tokens.roll(-1, 1).flatten())
    loss.backward()
    assert all(p.grad.abs().min() > 0 for p in extra.values())
    with torch.no_grad():
        sunk.blocks[0].attn.sinks.fill_(-float("inf"))  # a sink of weight exp(-inf) = 0 is no sink
        sunk.blocks[1].attn.sinks.fill_(-float("inf"))
        assert torch.allclose(sunk(tokens), plain(tokens), atol=1e-5)
    assert "sinks" not in ModelConfig(**TINY).to_dict()
    assert ModelConfig.from_dict(json.loads(json.dumps(sunk.config.to_dict()))) == sunk.config
    with pytest.raises(ValueError, match="sinks=1 is invalid"):
        ModelConfig(sinks=1, **TINY)


def test_encodings_learn_per_layer_where_their_authors_do():
    """Which learned encodings get one module per layer in the lab (``Encoding.per_layer``), as their reference
    code builds them: Shaw (tensor2tensor: a table per layer's scope), CoPE (facebookresearch/RAM: one per attention
    layer unless --cope-shared), FoPE (the authors' OLMo: one per block), SSMax (s per layer and head); shared by
    every layer: T5 (block 0's bias reused), KERPLE (chijames/KERPLE builds one and hands it to every layer), FIRE
    (no official code; shared as the T5-style implementations do), learned tables (one, at the input)."""
    per_layer = {n for n in sequence_encodings() if GPT(ModelConfig(encoding=n, **TINY)).layer_encodings()[0].per_layer}
    assert per_layer == {"shaw", "cope", "fope", "ssmax", "rope_ssmax", "ssmax_bias", "rope_ssmax_bias"}
