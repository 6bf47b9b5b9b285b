"""train(): learning, bit-exact resume, done.json short-circuit, checkpoint errors, metrics, schedule, masks,
interruption by SIGINT / SIGTERM and timed checkpoints."""

import json
import math
import os
import random
import signal
import types

import pytest
import torch

from posenc.lab.common import checkpoint as ckpt
from posenc.lab.common import train as train_module
from posenc.lab.common.gpt import GPT, ModelConfig
from posenc.lab.common.train import (
    CHECKPOINT_FILE,
    CONFIG_FILE,
    DONE_FILE,
    METRICS_FILE,
    TrainConfig,
    load_model,
    lr_at,
    make_optimizer,
    rank_rows,
    step_generator,
    train,
)

LENGTH = 16
MODEL = ModelConfig(dim=32, n_layers=1, n_heads=2, max_len=LENGTH, encoding="rope")


def pattern_batches(seed=0, batch=4):
    """A learnable stream: each row repeats a random 4-byte motif; deterministic in step."""

    def batch_fn(step, rank, world):
        g = step_generator(seed, step)
        motifs = torch.randint(97, 101, (batch, 4), generator=g)  # (B, 4)
        seq = motifs.repeat(1, (LENGTH + 1) // 4 + 1)[:, : LENGTH + 1]  # (B, L + 1)
        rows = rank_rows(batch, rank, world)
        return seq[rows, :-1], seq[rows, 1:], None

    return batch_fn


def crashing(batch_fn, at):
    def fn(step, rank, world):
        if step == at:
            raise RuntimeError("simulated crash")
        return batch_fn(step, rank, world)

    return fn


def never(step, rank, world):
    raise AssertionError("batch_fn must not be called")


def cfg(**kw):
    base = {"steps": 8, "batch_size": 4, "length": LENGTH, "lr": 1e-2, "warmup": 2, "log_every": 2}
    return TrainConfig(**{**base, **kw})


def assert_same_weights(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        torch.testing.assert_close(sa[k], sb[k], rtol=0, atol=0, msg=k)


def losses(run_dir):
    return [(r["step"], r["loss"]) for r in map(json.loads, (run_dir / METRICS_FILE).read_text().splitlines())]


def test_loss_falls(tmp_path):
    model = GPT(MODEL)
    out = train(model, pattern_batches(), cfg(steps=40, log_every=5), tmp_path, progress=False)
    rows = losses(tmp_path)
    assert [s for s, _ in rows] == list(range(5, 41, 5))
    assert rows[0][1] > 3.0  # about ln(256) at the start
    assert out["final_loss"] == rows[-1][1] < 1.5
    assert out["steps"] == 40 and out["tokens"] == 40 * 4 * LENGTH and out["cached"] is False
    assert (tmp_path / DONE_FILE).is_file() and (tmp_path / CHECKPOINT_FILE).is_file()
    config = json.loads((tmp_path / CONFIG_FILE).read_text())
    assert config["model"] == MODEL.to_dict() and TrainConfig.from_dict(config["train"]) == cfg(steps=40, log_every=5)


@pytest.mark.parametrize("encoding", ["rope", "learned", "t5"])
def test_resume_is_bit_exact(tmp_path, encoding):
    mcfg = ModelConfig(dim=32, n_layers=1, n_heads=2, max_len=LENGTH, encoding=encoding)
    tcfg = cfg(steps=8, checkpoint_every=4)
    straight = GPT(mcfg, seed=3)
    train(straight, pattern_batches(), tcfg, tmp_path / "straight", progress=False)

    interrupted = GPT(mcfg, seed=3)
    with pytest.raises(RuntimeError, match="simulated crash"):
        train(interrupted, crashing(pattern_batches(), at=6), tcfg, tmp_path / "resumed", progress=False)
    assert json.loads((tmp_path / "resumed" / METRICS_FILE).read_text().splitlines()[-1])["step"] == 6
    assert not (tmp_path / "resumed" / DONE_FILE).exists()

    random.random(), torch.rand(3)  # the process moved on; resuming restores the RNG streams
    resumed = GPT(mcfg, seed=99)  # a fresh process would not even share the init: the checkpoint restores it
    out = train(resumed, pattern_batches(), tcfg, tmp_path / "resumed", progress=False)
    assert out["resumed_from"] == 4
    assert_same_weights(straight, resumed)
    # the metrics after the checkpoint were rewritten, not duplicated, and the losses match bit for bit
    assert losses(tmp_path / "resumed") == losses(tmp_path / "straight")
    assert not torch.equal(GPT(mcfg, seed=3).blocks[0].mlp.fc.weight, resumed.blocks[0].mlp.fc.weight)


def test_done_short_circuits_and_loads_weights(tmp_path):
    trained = GPT(MODEL)
    first = train(trained, pattern_batches(), cfg(), tmp_path, progress=False)
    fresh = GPT(MODEL, seed=5)
    second = train(fresh, never, cfg(log_every=4), tmp_path, progress=False)  # bookkeeping may change
    assert second["cached"] is True
    assert {k: second[k] for k in first if k != "cached"} == {k: v for k, v in first.items() if k != "cached"}
    assert_same_weights(trained, fresh)
    assert_same_weights(trained, load_model(tmp_path))
    assert not load_model(tmp_path).training

    calls = []
    again = train(
        GPT(MODEL),
        lambda s, r, w: calls.append(s) or pattern_batches()(s, r, w),
        cfg(),
        tmp_path,
        resume=False,
        progress=False,
    )
    assert calls == list(range(8)) and again["cached"] is False and again["resumed_from"] == 0


def test_corrupt_checkpoint_is_a_clear_error(tmp_path):
    train(GPT(MODEL), pattern_batches(), cfg(checkpoint_every=4), tmp_path, progress=False)
    (tmp_path / DONE_FILE).unlink()
    path = tmp_path / CHECKPOINT_FILE
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(ValueError, match=r"checkpoint=.*checkpoint\.safetensors.*delete it or pass a fresh --out"):
        train(GPT(MODEL), pattern_batches(), cfg(), tmp_path, progress=False)
    with pytest.raises(ValueError, match="checkpoint"):
        load_model(tmp_path)


def test_incompatible_run_dir_is_a_clear_error(tmp_path):
    train(GPT(MODEL), pattern_batches(), cfg(), tmp_path, progress=False)
    with pytest.raises(ValueError, match="config.json.*delete .* or pass a fresh --out"):
        train(GPT(MODEL), never, cfg(lr=1e-3), tmp_path, progress=False)
    other = ModelConfig(dim=32, n_layers=1, n_heads=2, max_len=LENGTH, encoding="alibi")
    (tmp_path / DONE_FILE).unlink()
    with pytest.raises(ValueError, match="config.json"):
        train(GPT(other), never, cfg(), tmp_path, progress=False)
    # a checkpoint whose tensors don't fit the model (the config was edited by hand)
    config = json.loads((tmp_path / CONFIG_FILE).read_text())
    config["model"] = {**other.to_dict(), "encoding": "learned"}
    (tmp_path / CONFIG_FILE).write_text(json.dumps(config))
    with pytest.raises(ValueError, match="parameters differ"):
        load_model(tmp_path)


def test_score_mask_limits_the_loss(tmp_path):
    def masked(noise):
        def fn(step, rank, world):
            x, y, _ = pattern_batches()(step, rank, world)
            mask = torch.zeros_like(y, dtype=torch.bool)
            mask[:, LENGTH // 2 :] = True
            if noise:
                y = torch.where(mask, y, torch.randint(0, 256, y.shape, generator=step_generator(7, step)))
            return x, y, mask

        return fn

    a, b, c = GPT(MODEL), GPT(MODEL), GPT(MODEL)
    train(a, masked(False), cfg(steps=3), tmp_path / "a", progress=False)
    train(b, masked(True), cfg(steps=3), tmp_path / "b", progress=False)
    assert_same_weights(a, b)  # unscored targets do not matter
    train(c, pattern_batches(), cfg(steps=3), tmp_path / "c", progress=False)
    assert not torch.equal(a.blocks[0].mlp.fc.weight, c.blocks[0].mlp.fc.weight)


def test_progress_bar_and_metrics(tmp_path, capsys):
    train(GPT(MODEL), pattern_batches(), cfg(steps=4), tmp_path, progress=True)
    rows = [json.loads(line) for line in (tmp_path / METRICS_FILE).read_text().splitlines()]
    assert [r["step"] for r in rows] == [2, 4]
    for r in rows:
        assert {"step", "loss", "lr", "tokens_per_s", "elapsed", "grad_norm"} <= set(r)
        assert r["tokens_per_s"] > 0 and math.isfinite(r["loss"])
        assert r["lr"] == lr_at(r["step"] - 1, cfg(steps=4))  # the rate of the step just taken
    assert "rope" in capsys.readouterr().out


def test_lr_schedule():
    c = TrainConfig(steps=100, batch_size=1, length=8, lr=1.0, min_lr_ratio=0.1, warmup=10)
    lrs = [lr_at(s, c) for s in range(100)]
    assert lrs[0] == pytest.approx(0.1) and lrs[9] == pytest.approx(1.0)
    assert lrs[99] == pytest.approx(0.1)
    assert all(a >= b for a, b in zip(lrs[9:], lrs[10:], strict=False))
    assert TrainConfig(steps=50, batch_size=1, length=8).warmup_steps == 5
    assert lr_at(0, TrainConfig(steps=1, batch_size=1, length=8, lr=0.5)) == 0.5


def test_train_config_round_trip_and_errors():
    c = cfg(betas=[0.8, 0.9])
    assert c.betas == (0.8, 0.9)
    assert TrainConfig.from_dict(json.loads(json.dumps(c.to_dict()))) == c
    for bad, match in [
        ({"steps": 0}, "steps=0"),
        ({"lr": -1.0}, "lr=-1.0"),
        ({"min_lr_ratio": 2.0}, "min_lr_ratio"),
        ({"warmup": -1}, "warmup=-1"),
        ({"betas": (0.9,)}, "betas"),
        ({"checkpoint_every": -1}, "checkpoint_every"),
    ]:
        with pytest.raises(ValueError, match=match):
            cfg(**bad)
    with pytest.raises(ValueError, match="config\\['epochs'\\]"):
        TrainConfig.from_dict({**cfg().to_dict(), "epochs": 1})


def test_bad_batches(tmp_path):
    with pytest.raises(ValueError, match=r"batch_fn\(0, ...\)\[0\]"):
        train(GPT(MODEL), lambda s, r, w: (torch.zeros(4), torch.zeros(4), None), cfg(), tmp_path, progress=False)
    with pytest.raises(ValueError, match=r"batch_fn\(0, ...\)\[1\]"):  # float inputs take one label per row
        train(
            GPT(MODEL),
            lambda s, r, w: (torch.zeros(4, LENGTH), torch.zeros(4, LENGTH, dtype=torch.long), None),
            cfg(),
            tmp_path,
            progress=False,
        )
    with pytest.raises(ValueError, match="tokens.dtype"):  # and the GPT itself refuses float tokens
        train(
            GPT(MODEL),
            lambda s, r, w: (torch.zeros(4, LENGTH), torch.zeros(4, dtype=torch.long), None),
            cfg(),
            tmp_path,
            progress=False,
        )
    with pytest.raises(ValueError, match=r"batch_fn\(0, ...\)\[2\]"):
        x = torch.zeros(4, LENGTH, dtype=torch.long)
        train(GPT(MODEL), lambda s, r, w: (x, x, torch.ones(4, LENGTH)), cfg(), tmp_path, progress=False)
    with pytest.raises(ValueError, match="model"):
        train(torch.nn.Linear(2, 2), pattern_batches(), cfg(), tmp_path, progress=False)


def test_optimizer_state_and_rng_round_trip(tmp_path):
    model = GPT(MODEL)
    opt = make_optimizer(model, cfg())
    model(torch.randint(0, 256, (2, 8))).sum().backward()
    opt.step()
    tensors, meta = ckpt.flatten_optimizer_state(opt.state_dict())
    back = ckpt.unflatten_optimizer_state(tensors, json.loads(json.dumps(meta)))
    original = opt.state_dict()
    assert back["param_groups"] == original["param_groups"]
    for i, entries in original["state"].items():
        for key, value in entries.items():
            assert torch.equal(back["state"][i][key], value)

    path = tmp_path / "c.safetensors"
    ckpt.save_checkpoint(path, model=model, optimizer=opt, step=1, meta={"a": 1})
    expected = (torch.rand(4), random.random())
    state = ckpt.load_checkpoint(path, model=GPT(MODEL), optimizer=make_optimizer(GPT(MODEL), cfg()))
    assert state == {"step": 1, "meta": {"a": 1}}
    assert torch.equal(torch.rand(4), expected[0]) and random.random() == expected[1]
    assert not list(tmp_path.glob(".*.tmp"))  # the atomic write left no temporary file


# ---------------------------------------------------------------------------------------------------------------
# Interruption: SIGINT / SIGTERM stop after the step in progress with a checkpoint there; timed checkpoints


def signalling(batch_fn, at, sig=signal.SIGINT, times=1):
    """``batch_fn`` that sends ``sig`` to this process ``times`` times while it builds the batch of step ``at``."""

    def fn(step, rank, world):
        if step == at:
            for _ in range(times):
                os.kill(os.getpid(), sig)
        return batch_fn(step, rank, world)

    return fn


def saved_step(run_dir):
    return int(ckpt.read_checkpoint(run_dir / CHECKPOINT_FILE)[0]["step"])


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
@pytest.mark.parametrize("at", [4, 3])  # mid-window, and the last step of a metrics window
def test_a_signal_stops_after_its_step_with_a_checkpoint_and_resume_is_bit_exact(tmp_path, sig, at):
    tcfg = cfg(steps=8, checkpoint_every=0, log_every=2)  # no periodic checkpoint: the one found is the signal's
    straight = GPT(MODEL, seed=3)
    train(straight, pattern_batches(), tcfg, tmp_path / "straight", progress=False)

    run = tmp_path / "run"
    before = signal.getsignal(sig)
    with pytest.raises(KeyboardInterrupt):
        train(GPT(MODEL, seed=3), signalling(pattern_batches(), at, sig), tcfg, run, progress=False)
    assert signal.getsignal(sig) is before  # the loop's handler is gone
    assert saved_step(run) == at + 1 and not (run / DONE_FILE).exists()
    assert [s for s, _ in losses(run)] == [s for s in (2, 4, 6, 8) if s <= at + 1]

    random.random(), torch.rand(3)  # the process moved on; the checkpoint restores every random stream
    resumed = GPT(MODEL, seed=99)
    out = train(resumed, pattern_batches(), tcfg, run, progress=False)
    assert out["resumed_from"] == at + 1 and out["cached"] is False
    assert_same_weights(straight, resumed)
    # the metrics window the signal cut goes on where it stopped: the same lines, bit for bit
    assert losses(run) == losses(tmp_path / "straight")


def test_a_second_signal_raises_at_once(tmp_path):
    calls = []

    def fn(step, rank, world):
        calls.append(step)
        return pattern_batches()(step, rank, world)

    with pytest.raises(KeyboardInterrupt):
        train(GPT(MODEL), signalling(fn, 3, times=2), cfg(steps=8, checkpoint_every=0), tmp_path, progress=False)
    assert calls == [0, 1, 2]  # raised by the second signal, before step 3's batch was even made
    assert not (tmp_path / CHECKPOINT_FILE).exists()  # no waiting for the step to end, no checkpoint


def test_a_signal_in_the_last_step_finishes_the_run_then_raises(tmp_path, capsys):
    with pytest.raises(KeyboardInterrupt):
        train(GPT(MODEL), signalling(pattern_batches(), 7), cfg(steps=8), tmp_path, progress=True)
    assert (tmp_path / DONE_FILE).is_file() and saved_step(tmp_path) == 8
    assert f"rope: interrupted after its last step; saved in {tmp_path}" in capsys.readouterr().err
    assert train(GPT(MODEL), never, cfg(steps=8), tmp_path, progress=True)["cached"] is True
    assert "rope: already trained (8 steps), skipped" in capsys.readouterr().out


def test_resume_says_where_it_continues(tmp_path, capsys):
    with pytest.raises(KeyboardInterrupt):
        train(GPT(MODEL), signalling(pattern_batches(), 4), cfg(), tmp_path, progress=True, description="rope @16")
    assert f"rope @16: interrupted at step 5 of 8; saved in {tmp_path}" in capsys.readouterr().err
    train(GPT(MODEL), pattern_batches(), cfg(), tmp_path, progress=True, description="rope @16")
    assert "resuming rope @16 from step 5 of 8" in capsys.readouterr().out
    with pytest.raises(KeyboardInterrupt):
        train(GPT(MODEL), signalling(pattern_batches(), 4), cfg(), tmp_path / "quiet", progress=False)
    train(GPT(MODEL), pattern_batches(), cfg(), tmp_path / "quiet", progress=False)
    train(GPT(MODEL), pattern_batches(), cfg(), tmp_path / "quiet", progress=False)
    assert capsys.readouterr() == ("", "")  # without progress nothing is said


def test_outside_the_main_thread_signals_keep_their_handlers(tmp_path):
    import threading

    before = signal.getsignal(signal.SIGINT)
    seen = []

    def batches(step, rank, world):
        seen.append(signal.getsignal(signal.SIGINT))
        return pattern_batches()(step, rank, world)

    thread = threading.Thread(target=lambda: train(GPT(MODEL), batches, cfg(steps=2), tmp_path, progress=False))
    thread.start()
    thread.join()
    assert seen == [before, before] and (tmp_path / DONE_FILE).is_file()


class FakeClock:
    """``time.perf_counter`` as ``train`` sees it: ten seconds pass while each batch is made."""

    def __init__(self, monkeypatch):
        self.now = 0.0
        monkeypatch.setattr(train_module, "time", types.SimpleNamespace(perf_counter=lambda: self.now))

    def batches(self, batch_fn):
        def fn(step, rank, world):
            self.now += 10.0
            return batch_fn(step, rank, world)

        return fn


@pytest.mark.parametrize(
    ("seconds", "every", "expected"),
    [(25.0, 0, [3, 6, 8]), (0, 0, [8]), (25.0, 4, [3, 4, 7, 8]), (0, 3, [3, 6, 8])],
)
def test_timed_checkpoints(tmp_path, monkeypatch, seconds, every, expected):
    clock = FakeClock(monkeypatch)
    saved = []
    real = train_module.save_checkpoint
    monkeypatch.setattr(train_module, "save_checkpoint", lambda p, **kw: saved.append(kw["step"]) or real(p, **kw))
    tcfg = cfg(steps=8, checkpoint_every=every, checkpoint_seconds=seconds)
    train(GPT(MODEL), clock.batches(pattern_batches()), tcfg, tmp_path, progress=False)
    assert saved == expected  # 25 s or more after the last checkpoint (or the start), the periodic ones, the last


def test_a_crash_after_a_timed_checkpoint_resumes_bit_exact(tmp_path, monkeypatch):
    """A crash (or SIGKILL) loses only the steps since the last timed checkpoint, here inside a metrics window."""
    tcfg = cfg(steps=8, checkpoint_every=0, checkpoint_seconds=25.0, log_every=4)
    straight = GPT(MODEL, seed=1)
    train(straight, pattern_batches(), tcfg, tmp_path / "straight", progress=False)

    clock = FakeClock(monkeypatch)
    with pytest.raises(RuntimeError, match="simulated crash"):
        train(GPT(MODEL, seed=1), clock.batches(crashing(pattern_batches(), at=5)), tcfg, tmp_path / "run",
              progress=False)
    assert saved_step(tmp_path / "run") == 3
    monkeypatch.undo()
    resumed = GPT(MODEL, seed=1)
    assert train(resumed, pattern_batches(), tcfg, tmp_path / "run", progress=False)["resumed_from"] == 3
    assert_same_weights(straight, resumed)
    assert losses(tmp_path / "run") == losses(tmp_path / "straight")


def test_a_checkpoint_without_a_metrics_window_still_resumes(tmp_path):
    """Checkpoints written before the window was recorded: the first line after them averages the steps since."""
    run = tmp_path / "run"
    with pytest.raises(RuntimeError):
        train(GPT(MODEL), crashing(pattern_batches(), at=4), cfg(checkpoint_every=3), run, progress=False)
    tensors, header = ckpt.read_checkpoint(run / CHECKPOINT_FILE)
    assert header["meta"]["window"] == 1 and header["meta"]["window_loss"] > 0
    model = GPT(MODEL)
    optimizer = make_optimizer(model, cfg())
    ckpt.load_checkpoint(run / CHECKPOINT_FILE, model=model, optimizer=optimizer)
    ckpt.save_checkpoint(run / CHECKPOINT_FILE, model=model, optimizer=optimizer, step=3, meta={"elapsed": 1.0})
    assert train(GPT(MODEL), pattern_batches(), cfg(), run, progress=False)["resumed_from"] == 3
    assert [s for s, _ in losses(run)] == [2, 4, 6, 8] and all(math.isfinite(v) for _, v in losses(run))


def test_checkpoint_seconds_is_bookkeeping_and_checked(tmp_path):
    train(GPT(MODEL), pattern_batches(), cfg(steps=4, checkpoint_every=2), tmp_path, progress=False)
    (tmp_path / DONE_FILE).unlink()
    out = train(GPT(MODEL), pattern_batches(), cfg(steps=4, checkpoint_every=2, checkpoint_seconds=0), tmp_path,
                progress=False)
    assert out["resumed_from"] == 4  # another value continues the same run
    assert TrainConfig.from_dict(cfg(checkpoint_seconds=0).to_dict()).checkpoint_seconds == 0
    for bad in (-1.0, float("nan"), True, "30"):
        with pytest.raises(ValueError, match=r"checkpoint_seconds=.*seconds >= 0 \(0: no timed checkpoints\)"):
            cfg(checkpoint_seconds=bad)
