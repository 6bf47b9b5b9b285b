"""What the lab GPT's two local-attention fields share, ``attention_chunk_size`` (Llama 4's chunks) and
``sliding_window`` (Mistral's windows): config round trips, old configs load, no parameters added, bad values
refused, and a hybrid with either trains; the numbers of a spec (``N``, ``C``, ``W``) are ASCII digits without a
leading zero, and local sizes fit int64."""

import json

import pytest
import torch

from posenc.lab.common.gpt import GPT, ModelConfig, split_chunk, split_encoding, split_local, split_window

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
                                                 ("sliding_window", "rope/nope:2")])
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


def test_spec_numbers_are_ascii_digits_without_a_leading_zero():
    """``rope@016`` would be ``rope@16`` under another name (another CSV label, the same run folder); ``rope~²`` and
    ``rope@٤`` are digits to ``str.isdigit`` but not to ``int`` (or not ASCII): all refused by name."""
    assert split_local("rope/nope:10@16~8") == ("rope/nope:10", 16, 8, False)
    assert split_encoding("rope/nope:10") == ("rope", "nope", 10)
    for bad in ("rope@016", "rope@³", "rope@٤", "rope@1.5", "rope@+4", "rope@ 4"):
        with pytest.raises(ValueError, match=r"SPEC@C .*C a positive whole number written in the digits 0-9 without a"):
            split_chunk(bad)
    for bad in ("rope~08", "rope~²", "rope~٨", "rope~0"):
        with pytest.raises(ValueError, match=r"SPEC~W .*W a positive whole number written in the digits 0-9"):
            split_window(bad)
    for bad in ("rope/nope:04", "rope/nope:²", "rope/nope:٤", "rope/nope:4x"):
        with pytest.raises(ValueError, match=r"BASE/OTHER:N .*N written in the digits 0-9 without a leading zero"):
            split_encoding(bad)


def test_local_sizes_fit_int64():
    ModelConfig(encoding="rope", sliding_window=2**63 - 1, attention_chunk_size=2**63 - 1, **TINY)
    for field in ("sliding_window", "attention_chunk_size"):
        with pytest.raises(ValueError, match=rf"^{field}=9223372036854775808 is invalid: expected a positive integer "
                                             r"up to 2\*\*63 - 1"):
            ModelConfig(encoding="rope", **{field: 2**63}, **TINY)
