"""What the lab GPT's two local-attention fields share, ``attention_chunk_size`` (Llama 4's chunks) and
``sliding_window`` (Mistral's windows): config round trips, old configs load, no parameters added, bad values
refused, and a hybrid with either trains."""

import json

import pytest
import torch

from posenc.lab.common.gpt import GPT, ModelConfig

TINY = {"dim": 32, "n_layers": 2, "n_heads": 4, "max_len": 16}
FIELDS = ["attention_chunk_size", "sliding_window"]


@pytest.mark.parametrize("field", FIELDS)
def test_config_round_trips_and_old_configs_load(field):
    config = ModelConfig(encoding="rope/nope:2", **{field: 16}, **TINY)
    assert json.loads(json.dumps(config.to_dict()))[field] == 16
    assert ModelConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config
    old = ModelConfig(encoding="rope/nope:2", **TINY).to_dict()
    assert field not in old  # the default is left out: earlier runs' config.json compare equal
    assert getattr(ModelConfig.from_dict(old), field) is None
    # the same weights with and without it (the field adds no parameters)
    plain, local = GPT(ModelConfig(**TINY)), GPT(ModelConfig(**{field: 4}, **TINY))
    assert all(torch.equal(p, q) for p, q in zip(plain.state_dict().values(), local.state_dict().values(), strict=True))
    for bad in (0, -1, 2.0, True):
        with pytest.raises(ValueError, match=f"{field}="):
            ModelConfig(**{field: bad}, **TINY)


@pytest.mark.parametrize(("field", "encoding"), [("attention_chunk_size", "rope/nope_temperature:2"),
                                                 ("sliding_window", "rope/nope:2")])  # fmt: skip
def test_a_local_hybrid_trains(field, encoding):
    torch.manual_seed(0)
    model = GPT(ModelConfig(encoding=encoding, **{field: 4}, **TINY))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    x = torch.randint(0, 256, (4, 17))
    losses = []
    for _ in range(20):
        loss = torch.nn.functional.cross_entropy(model(x[:, :-1]).flatten(0, 1), x[:, 1:].flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 1
