"""The lab GPT with encodings chosen per layer, ``"BASE/OTHER:N"``: placement (== transformers' NoPE/RoPE hybrids),
forward, swaps of BASE's encoding, config round trips, and the errors."""

import json

import pytest
import torch
from transformers import Llama4TextConfig, SmolLM3Config

import posenc
from posenc.hf.layers import layer_encodings as hf_layer_encodings
from posenc.lab.common.gpt import GPT, ModelConfig, layer_names, split_encoding
from posenc.lab.common.scaling import ROPE_SCALINGS
from posenc.lab.length import evaluate as ev

TINY = {"dim": 32, "n_layers": 4, "n_heads": 4, "max_len": 16}


@pytest.mark.parametrize(("n_layers", "interval"), [(n, i) for n in (2, 3, 4, 7, 8, 12) for i in (2, 3, 4) if i <= n])
def test_layers_are_placed_as_transformers_places_nope(n_layers, interval):
    """``rope/nope:N`` == SmolLM3's ``no_rope_layer_interval=N`` (1 in ``no_rope_layers`` means RoPE)."""
    smollm3 = SmolLM3Config(num_hidden_layers=n_layers, no_rope_layer_interval=interval)
    want = tuple("rope" if flag else "nope" for flag in smollm3.no_rope_layers)
    assert layer_names(f"rope/nope:{interval}", n_layers=n_layers) == want
    assert ModelConfig(encoding=f"rope/nope:{interval}", **{**TINY, "n_layers": n_layers}).layer_encodings == want
    assert hf_layer_encodings(smollm3) == want
    llama4 = Llama4TextConfig(num_hidden_layers=n_layers, no_rope_layer_interval=interval)
    assert hf_layer_encodings(llama4) == layer_names(f"rope/nope_temperature:{interval}", n_layers=n_layers)


def test_each_block_gets_its_layers_encoding():
    model = GPT(ModelConfig(encoding="rope/nope:2", **TINY))
    encodings = model.layer_encodings()
    assert [type(e) for e in encodings] == [posenc.RotaryEmbedding, posenc.NoPE] * 2
    assert encodings[0] is encodings[2] is model.encoding and encodings[1] is encodings[3] is model.nth_encoding
    assert model.config.base_encoding == "rope"
    plain = GPT(ModelConfig(encoding="rope", **TINY))
    assert plain.nth_encoding is None and plain.layer_encodings() == [plain.encoding] * 4


@torch.no_grad()
def test_forward_runs_each_block_with_its_own_encoding():
    """The hybrid == the same blocks run by hand with RoPE in layers 1, 3 and nothing in 2, 4 (NoPE: no rotation)."""
    model = GPT(ModelConfig(encoding="rope/nope:2", **TINY)).eval()
    tokens = torch.randint(0, 256, (2, 16))
    pos = torch.arange(16)

    def by_hand(encodings):
        x = model.wte(tokens) * model.embed_scale
        for block, encoding in zip(model.blocks, encodings, strict=True):
            x = block(x, pos, encoding)
        return torch.nn.functional.linear(model.ln_f(x), model.wte.weight)

    rope, nope = posenc.RotaryEmbedding(TINY["dim"] // TINY["n_heads"]), posenc.NoPE()
    torch.testing.assert_close(model(tokens), by_hand([rope, nope, rope, nope]), rtol=0, atol=0)
    assert not torch.allclose(model(tokens), by_hand([rope] * 4), atol=1e-4)


def test_nope_layers_never_rotate(monkeypatch):
    calls = []
    rotate = posenc.RotaryEmbedding.rotate

    def spy(self, q, k, q_pos, k_pos):
        calls.append(q.shape)
        return rotate(self, q, k, q_pos, k_pos)

    monkeypatch.setattr(posenc.RotaryEmbedding, "rotate", spy)
    GPT(ModelConfig(encoding="rope/nope:4", **{**TINY, "n_layers": 8}))(torch.randint(0, 256, (1, 16)))
    assert len(calls) == 6  # layers 4 and 8 are NoPE


def test_a_hybrid_trains_and_is_causal():
    options = {"nope_temperature": {"floor_scale": 4}}
    model = GPT(ModelConfig(encoding="rope/nope_temperature:2", encoding_config=options, **TINY))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    tokens = torch.arange(17).repeat(4, 1) % 5 + 97  # a learnable pattern
    losses = []
    for _ in range(8):
        logits = model(tokens[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
        optimizer.zero_grad()
        loss.backward()
        for name, p in model.named_parameters():
            assert p.grad is not None and torch.isfinite(p.grad).all(), name
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]
    model.eval()
    long = torch.randint(0, 256, (1, 64))  # 4x the training length: the temperature is past 1 there
    changed = long.clone()
    changed[0, 40] = (changed[0, 40] + 1) % 256
    with torch.no_grad():
        a, b = model(long), model(changed)
    torch.testing.assert_close(a[:, :40], b[:, :40], rtol=0, atol=0)
    assert not torch.allclose(a[:, 40:], b[:, 40:])


@torch.no_grad()
def test_rope_extensions_swap_every_rope_layer_and_only_those():
    model = GPT(ModelConfig(encoding="rope/nope:2", **TINY)).eval()
    nope = model.nth_encoding
    swap = ev.extended_encoding(model, "linear", train_len=16, eval_len=64)
    assert isinstance(swap, posenc.RotaryEmbedding) and swap.config.scaling.factor == 4.0
    before = model(torch.randint(0, 256, (1, 64)))
    model.set_encoding(swap)
    assert model.layer_encodings() == [swap, nope, swap, nope]
    assert not torch.allclose(model(torch.randint(0, 256, (1, 64))), before)
    assert ev.extension_names("rope/nope:4") == ev.extension_names("rope") == ("none", *ROPE_SCALINGS)
    assert ev.extension_names("alibi/nope:2") == ("none", "interpolate")
    assert ev.extension_names("nope/rope:4") == ("none",)  # extensions act on BASE's layers only
    with pytest.raises(ValueError, match=r"encoding='rope/nope:2' is invalid: .*'LearnedPositions' adds positions"):
        model.set_encoding(posenc.build("learned", dim=32, max_len=16))


@torch.no_grad()
def test_per_layer_encodings_are_owned_by_their_layers_and_survive_a_swap():
    """A kind whose parameters are per layer (``Encoding.per_layer``: SSMax) is built once per layer and held by its
    block; ``set_encoding`` swaps one module into every BASE layer while keeping each layer's own, and
    ``set_encoding(None)`` (``model.encoding`` as it was: how the lab's evaluation restores it) goes back to them;
    the state dict has one entry per layer and reloads."""
    cfg = ModelConfig(encoding="ssmax/nope:2", **TINY)
    model = GPT(cfg).eval()
    own = model.layer_encodings()
    assert own[0] is model.blocks[0].encoding and own[2] is model.blocks[2].encoding and own[0] is not own[2]
    assert own[1] is own[3] is model.nth_encoding and model.encoding is None
    assert model.blocks[1].encoding is None  # NoPE's layers share the model's one
    own[2].s.fill_(0.9)
    tokens = torch.randint(0, 256, (1, 16))
    before = model(tokens)
    trained = model.encoding
    swap = posenc.build("ssmax", num_heads=TINY["n_heads"])
    model.set_encoding(swap)
    assert model.layer_encodings() == [swap, own[1], swap, own[3]]
    assert not torch.allclose(model(tokens), before)
    model.set_encoding(trained)
    assert model.layer_encodings() == own
    torch.testing.assert_close(model(tokens), before, rtol=0, atol=0)
    assert [k for k in model.state_dict() if "encoding" in k] == ["blocks.0.encoding.s", "blocks.2.encoding.s"]
    again = GPT(cfg, seed=5)
    again.load_state_dict(model.state_dict())
    torch.testing.assert_close(again.eval()(tokens), before, rtol=0, atol=0)
    with pytest.raises(ValueError, match=r"encoding=None is invalid: .*no encoding of their own to go back to"):
        GPT(ModelConfig(encoding="rope", **TINY)).set_encoding(None)


def test_config_and_weights_round_trip_through_json():
    cfg = ModelConfig(
        encoding="rope/t5:2",
        encoding_config={"rope": {"base": 500.0}, "t5": {"bidirectional": False}},
        n_kv_heads=2,
        **TINY,
    )
    back = ModelConfig.from_dict(json.loads(json.dumps(cfg.to_dict())))
    assert back == cfg and back.layer_encodings == ("rope", "t5", "rope", "t5")
    a, b = GPT(cfg, seed=3), GPT(back, seed=3)
    assert a.encoding.config.base == 500.0 and a.nth_encoding.config.bidirectional is False
    assert any(k.startswith("nth_encoding.") for k in a.state_dict())  # T5's table, shared by the T5 layers
    b.load_state_dict(a.state_dict())
    tokens = torch.randint(0, 256, (1, 16))
    torch.testing.assert_close(b(tokens), a(tokens), rtol=0, atol=0)


def test_split_encoding():
    assert split_encoding("rope") == ("rope", None, None)
    assert split_encoding("rope/nope_temperature:4") == ("rope", "nope_temperature", 4)


@pytest.mark.parametrize(
    ("encoding", "match"),
    [
        ("rope/nope:0", r"encoding='rope/nope:0' is invalid: expected an interval N from 2 to n_layers=4"),
        ("rope/nope:1", r"interval N from 2 to n_layers=4 .*N=1 leaves no rope layer"),
        ("rope/nope:5", r"N > n_layers no nope layer"),
        ("rope/nope", r"encoding='rope/nope' is invalid: expected BASE/OTHER:N"),
        ("rope:4", r"expected BASE/OTHER:N"),
        ("rope/nope:-2", r"expected BASE/OTHER:N"),
        ("rope/nope/alibi:2", r"expected BASE/OTHER:N"),
        ("rope/nopee:2", r"names from \[.*\] in BASE/OTHER:N; 'nopee' is not one"),
        ("rope/rope:2", r"two different encodings .*just 'rope'"),
    ],
)
def test_spec_errors(encoding, match):
    with pytest.raises(ValueError, match=match):
        ModelConfig(encoding=encoding, **TINY)


@pytest.mark.parametrize("absolute", ["sinusoidal", "learned"])
def test_absolute_encodings_cannot_be_chosen_per_layer(absolute):
    for spec in (f"rope/{absolute}:2", f"{absolute}/nope:2"):
        with pytest.raises(ValueError, match=rf"encoding='{spec}' is invalid: .*'{absolute}' adds positions"):
            GPT(ModelConfig(encoding=spec, **TINY))
    GPT(ModelConfig(encoding=absolute, **TINY))  # as the one encoding of every layer: fine


def test_per_layer_errors():
    with pytest.raises(ValueError, match=r"n_layers=1 leaves no room for two"):
        ModelConfig(encoding="rope/nope:2", **{**TINY, "n_layers": 1})
    with pytest.raises(ValueError, match=r"encoding_config=\{'base': 500.0\} is invalid: .*per name"):
        ModelConfig(encoding="rope/nope:2", encoding_config={"base": 500.0}, **TINY)
    with pytest.raises(ValueError, match=r"encoding_config=.* is invalid: .*\{'rope': \{...\}, 'nope': \{...\}\}"):
        ModelConfig(encoding="rope/nope:2", encoding_config={"alibi": {}}, **TINY)
    with pytest.raises(ValueError, match=r"1-D token positions"):
        GPT(ModelConfig(encoding="rope/rope_axial:2", **TINY))
    with pytest.raises(ValueError, match=r"only the keys"):
        GPT(ModelConfig(encoding="rope/nope_temperature:2", encoding_config={"nope_temperature": {"base": 2}}, **TINY))


@torch.no_grad()
def test_a_checkpoint_from_before_per_layer_ssmax_loads_into_every_layer(tmp_path):
    """Weights saved when one SSMax module was shared by its layers (key ``nth_encoding.s``, and ``encoding.s`` for
    BASE) load through ``load_checkpoint``: each of those layers gets the shared ``s``, so the model computes what
    the old one did (every layer at that ``s``); the optimizer state of such a run no longer fits and says so."""
    from posenc.lab.common.checkpoint import load_checkpoint, save_checkpoint

    cfg = ModelConfig(encoding="rope/ssmax:2", **TINY)
    model = GPT(cfg).eval()
    shared = torch.linspace(0.2, 0.8, TINY["n_heads"])
    for i in (1, 3):
        model.blocks[i].encoding.s.copy_(shared)
    tokens = torch.randint(0, 256, (1, 16))
    want = model(tokens)
    old = {k: v for k, v in model.state_dict().items() if ".encoding." not in k} | {"nth_encoding.s": shared}

    class Old(torch.nn.Module):  # the old layout's state dict, saved as the lab saves a model
        def state_dict(self, *args, **kwargs):  # noqa: ANN002, ANN003, ANN202
            return dict(old)

    save_checkpoint(tmp_path / "old.safetensors", model=Old(), step=3)
    fresh = GPT(cfg, seed=7).eval()
    assert load_checkpoint(tmp_path / "old.safetensors", model=fresh)["step"] == 3
    torch.testing.assert_close(fresh(tokens), want, rtol=0, atol=0)
    assert fresh.blocks[1].encoding.s.data_ptr() != fresh.blocks[3].encoding.s.data_ptr()
    optimizer = torch.optim.AdamW(fresh.parameters())
    with pytest.raises(ValueError, match="no optimizer state|optimizer state does not fit"):
        load_checkpoint(tmp_path / "old.safetensors", model=fresh, optimizer=optimizer)
