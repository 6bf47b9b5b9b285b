"""The lab GPT's SSMax layers under a window or chunks (``ssmax~8``, ``ssmax@4``): each layer's ``n`` is the number of
keys its attention leaves a query (issue 46: it was ``p + 1``), runs saved with the old ``n`` are refused rather than
reloaded as another model, and an ``SSMax(window=)`` that contradicts its layer is refused."""

from __future__ import annotations

import json

import pytest
import torch
from torch.testing import assert_close

import posenc
from posenc.lab.common import gpt as gpt_module
from posenc.lab.common.gpt import GPT, KEY_COUNT_KEY, ModelConfig
from reference.key_count import key_count_attention, ssmax_factor

TINY = {"dim": 32, "n_layers": 2, "n_heads": 4, "max_len": 16}


@pytest.mark.parametrize(
    ("encoding", "local"),
    [
        ("ssmax", {"sliding_window": 5}),  # the lab's ssmax~5
        ("rope_ssmax_bias", {"attention_chunk_size": 6}),  # rope_ssmax_bias@6
        ("ssmax/nope:2", {"sliding_window": 4, "attention_chunk_size": 7}),  # ssmax/nope:2@7~4: NoPE layer global
    ],
)
def test_each_ssmax_layer_counts_the_keys_its_mask_leaves(encoding, local, monkeypatch):
    """Every attention call of the model, on its own inputs, equals the float64 reference whose ``n`` is counted from
    that layer's mask (``min(p + 1, W)``, ``(p mod C) + 1``)."""
    torch.manual_seed(0)
    model = GPT(ModelConfig(encoding=encoding, **local, **TINY)).double().eval()
    for enc in model.layer_encodings():
        if isinstance(enc, posenc.SSMax):
            with torch.no_grad():
                enc.s.copy_(torch.linspace(0.3, 1.2, 4))
                if enc.b is not None:
                    enc.b.copy_(torch.linspace(-0.4, 0.6, 4))
    calls = []
    real = posenc.attention

    def recorded(q, k, v, **kw):
        out = real(q, k, v, **kw)
        calls.append((q, k, v, kw, out))
        return out

    monkeypatch.setattr(gpt_module.posenc, "attention", recorded)
    with torch.no_grad():
        model(torch.randint(0, 256, (2, 20)))
    assert len(calls) == 2
    for q, k, v, kw, out in calls:
        enc = kw["encoding"]
        if not isinstance(enc, posenc.SSMax):
            assert kw["window"] is None and kw["chunk_size"] is None  # the NoPE layer of the hybrid: global
            continue
        rope = None
        if enc.rope is not None:
            rope = {"inv_freq": enc.rope.inv_freq, "layout": enc.rope.config.layout,
                    "attention_factor": enc.rope.attention_factor}
        factor = ssmax_factor(enc.s.detach(), 0.0 if enc.b is None else enc.b.detach())
        want = key_count_attention(q, k, v, factor, q_positions=kw["q_positions"], window=kw["window"],
                                   chunk_size=kw["chunk_size"], rope=rope)
        assert (kw["window"], kw["chunk_size"]) == (local.get("sliding_window"), local.get("attention_chunk_size"))
        assert_close(out, want, rtol=0, atol=1e-12)


def test_saved_configs_record_where_n_is_counted_and_old_ones_are_refused():
    """``config.json`` says ``key_count: mask`` for SSMax layers with a window or chunks; one saved before (no such
    key) trained with ``n = p + 1`` there and is refused by name; every other config loads as before."""
    windowed = ModelConfig(encoding="ssmax", sliding_window=8, **TINY)
    saved = json.loads(json.dumps(windowed.to_dict()))
    assert saved[KEY_COUNT_KEY] == "mask" and ModelConfig.from_dict(saved) == windowed
    old = {k: v for k, v in saved.items() if k != KEY_COUNT_KEY}
    want = (r"^run/config.json\['key_count'\]=None is invalid: expected 'mask': this model \(encoding='ssmax', "
            r"sliding_window=8\) was saved by a posenc that gave the SSMax of layers \[0, 1\] an n read from the "
            r"query's position \(p \+ 1\)")
    with pytest.raises(ValueError, match=want):
        ModelConfig.from_dict(old, where="run/config.json")
    chunked = ModelConfig(encoding="rope/ssmax:2", attention_chunk_size=4, **TINY)  # only layer 2 is SSMax
    assert chunked.key_count_layers() == [1]
    with pytest.raises(ValueError, match=r"attention_chunk_size=4\) .* layers \[1\]"):
        ModelConfig.from_dict({k: v for k, v in chunked.to_dict().items() if k != KEY_COUNT_KEY})
    with pytest.raises(ValueError, match=r"config\['key_count'\]='p \+ 1' is invalid: expected 'mask'"):
        ModelConfig.from_dict({**saved, KEY_COUNT_KEY: "p + 1"})
    for unchanged in (
        ModelConfig(encoding="ssmax", **TINY),  # global SSMax: n = p + 1 is the keys seen, before and now
        ModelConfig(encoding="rope", sliding_window=8, **TINY),
        ModelConfig(encoding="ssmax/nope:2", **TINY),
        ModelConfig(encoding="rope/nope_temperature:2", attention_chunk_size=4, **TINY),  # NoPE layers: global
        # SSMax(window=8) in a layer windowed by 8 and nothing else: n = min(p + 1, 8) before and now
        ModelConfig(encoding="ssmax", encoding_config={"window": 8}, sliding_window=8, **TINY),
    ):
        out = unchanged.to_dict()
        assert KEY_COUNT_KEY not in out and ModelConfig.from_dict(out) == unchanged
    with pytest.raises(ValueError, match=r"config\['key_count'\]='mask' is invalid: expected no such key"):
        ModelConfig.from_dict(
            {**ModelConfig(encoding="rope", sliding_window=8, **TINY).to_dict(), KEY_COUNT_KEY: "mask"}
        )


def test_to_dict_draws_nothing_from_the_global_random_stream():
    config = ModelConfig(encoding="fire/ssmax:2", sliding_window=4, **TINY)  # FIRE's MLP initialises randomly
    torch.manual_seed(3)
    config.to_dict()
    after = torch.rand(3)
    torch.manual_seed(3)
    assert torch.equal(torch.rand(3), after)


def test_a_saved_run_of_the_old_n_is_refused_by_load_model(tmp_path):
    from posenc.lab.common.train import TrainConfig, load_model, train

    config = ModelConfig(encoding="ssmax", sliding_window=4, **{**TINY, "n_layers": 1})
    x = torch.randint(0, 256, (2, 16))
    train(GPT(config), lambda step, rank, world: (x, x, None), TrainConfig(steps=1, batch_size=2, length=16),
          tmp_path / "run", progress=False)
    assert load_model(tmp_path / "run").config == config
    path = tmp_path / "run" / "config.json"
    saved = json.loads(path.read_text())
    del saved["model"][KEY_COUNT_KEY]  # as posenc wrote it before issue 46
    path.write_text(json.dumps(saved))
    with pytest.raises(ValueError, match=rf"^{path}\['model'\]\['key_count'\]=None is invalid: .* retrain it$"):
        load_model(tmp_path / "run")


def test_an_ssmax_window_that_contradicts_its_layer_is_refused_when_built():
    assert GPT(ModelConfig(encoding="ssmax", encoding_config={"window": 8}, sliding_window=8, **TINY))
    for local in ({}, {"sliding_window": 4}):
        with pytest.raises(ValueError, match=r"window=(None|4) is invalid: expected 8, the window this SSMax"):
            GPT(ModelConfig(encoding="ssmax", encoding_config={"window": 8}, **local, **TINY))
