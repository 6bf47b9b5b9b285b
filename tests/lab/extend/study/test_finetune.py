"""Fine-tuning in a short window with plain, PoSE or random positions (``posenc.lab.extend.targets.finetune``): the
batches, a lab model and a tiny transformers Llama end to end, resume after an interruption, and bad input."""

from __future__ import annotations

import json
import os
import re
import signal
from pathlib import Path

import pytest
import torch

from lab.extend.study.test_study import ORIGINAL, TINY, _hf_folder, _lab_run, _needs_extend_context
from posenc.lab.common import train as train_module
from posenc.lab.common.checkpoint import read_checkpoint
from posenc.lab.common.gpt import GPT
from posenc.lab.extend.settings.config import ExtendConfig
from posenc.lab.extend.study.run import run_extend
from posenc.lab.extend.targets.finetune import POSE_SPAN, finetune_batch, read_losses

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def rope_run(tmp_path_factory, corpus) -> Path:
    return _lab_run(tmp_path_factory.mktemp("rope"), "rope", corpus)


# ---------------------------------------------------------------------------------------------------------------------
# Batches


@pytest.mark.parametrize("kind", ["plain", "pose", "random"])
def test_batches_read_the_text_with_its_true_next_tokens_at_the_promised_positions(kind):
    tokens = torch.arange(10_000, 10_500)  # token i is 10_000 + i: every id says where it was read
    window, target = 16, 200
    g = torch.Generator().manual_seed(1)
    for _ in range(50):
        x, y, mask, pos = finetune_batch(tokens, window=window, target=target, positions=kind, batch=3, generator=g)
        assert mask is None and x.shape == y.shape == pos.shape == (3, window) and pos.dtype == torch.int64
        assert torch.equal(y, x + 1)  # every target is the token after its input in the text
        assert bool((pos[:, 1:] > pos[:, :-1]).all()) and int(pos.min()) >= 0 and int(pos.max()) < target
        steps = x[:, 1:] - x[:, :-1]
        if kind == "pose":  # two chunks of contiguous text within a span of POSE_SPAN windows, positions from 0
            assert bool((pos[:, 0] == 0).all()) and bool(((steps != 1).sum(1) <= 1).all())
            assert bool((x[:, -1] - x[:, 0] < POSE_SPAN * window).all())
        else:  # one contiguous window
            assert bool((steps == 1).all())
        if kind == "plain":
            assert torch.equal(pos, torch.arange(window).expand(3, -1))


def test_pose_and_random_positions_reach_beyond_the_window_plain_never_does():
    tokens = torch.arange(2000)
    reach = {}
    for kind in ("plain", "pose", "random"):
        g = torch.Generator().manual_seed(0)
        batches = [
            finetune_batch(tokens, window=16, target=256, positions=kind, batch=8, generator=g) for _ in range(20)
        ]
        reach[kind] = max(int((p[:, -1] - p[:, 0]).max()) for *_, p in batches)  # the largest relative distance
    assert reach["plain"] == 15 and reach["pose"] > 128 and reach["random"] > 128


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"positions": "skip"}, "positions"),
        ({"window": 0}, "window"),
        ({"target": 8}, "target"),
        ({"tokens": torch.arange(16)}, "tokens"),
        ({"batch": 0}, "batch"),
    ],
)
def test_bad_batch_arguments_name_the_parameter(kwargs, name):
    args = {"tokens": torch.arange(100), "window": 16, "target": 64, "positions": "pose", "batch": 1}
    with pytest.raises(ValueError, match=rf"^{name}="):
        finetune_batch(**{**args, **kwargs}, generator=torch.Generator())


# ---------------------------------------------------------------------------------------------------------------------
# A lab model end to end


def test_lab_model_finetuned_in_a_short_window_sees_positions_up_to_the_target(rope_run, corpus, tmp_path, monkeypatch):
    seen: list[int] = []  # the highest position of each training forward, in order
    forward = GPT.forward

    def spy(self, tokens, positions=None):
        if self.training:  # the fine-tuning batches (evaluation runs in eval mode at 0..S-1)
            seen.append(int(positions.max()))
            assert tokens.shape[1] == 16
        return forward(self, tokens, positions)

    monkeypatch.setattr(GPT, "forward", spy)
    cfg = ExtendConfig(
        model=str(rope_run), methods=("yarn",), factors=(4.0,), lengths=(ORIGINAL, 128), corpus=str(corpus),
        finetune_steps=3, finetune_window=16, finetune_positions=("plain", "pose", "random"),
        **{**TINY, "trials": 1, "depths": (0.5,)},
    )
    out = tmp_path / "out"
    rows = run_extend(cfg, out, progress=False)
    tuned = {(r["method"], r["finetune_positions"]) for r in rows if r["finetune_steps"]}
    assert tuned == {(m, p) for m in ("none", "yarn") for p in ("plain", "pose", "random")}
    assert {r["finetune_positions"] for r in rows if not r["finetune_steps"]} == {"plain"}
    # six fine-tunes (none and yarn x three kinds), in this order: plain, pose, random for each
    assert len(seen) == 6 * 3
    highest = [max(seen[i : i + 3]) for i in range(0, 18, 3)]
    for i, kind in enumerate(["plain", "plain", "pose", "pose", "random", "random"]):
        assert (highest[i] <= 15) if kind == "plain" else (16 <= highest[i] < 128), (kind, highest)
    for name in ("none-x4-ft3", "yarn-x4-ft3", "yarn-x4-ft3-pose", "yarn-x4-ft3-random"):
        assert len(read_losses(out / "runs" / f"finetune-{name}")) == 1  # log_every 10 > 3 steps: the last one
    assert (out / "finetune.png").stat().st_size > 10_000
    report = (out / "report.md").read_text()
    assert "## Fine-tuning" in report and "| yarn x4 +ft3 pose |" in report and "16-byte windows" in report


# ---------------------------------------------------------------------------------------------------------------------
# A tiny transformers Llama: checkpoints, resume after Ctrl-C, the loss curve, --save


def _hf_cfg(folder: Path, corpus: Path, **kwargs) -> ExtendConfig:
    settings = {
        "methods": ("yarn",), "factors": (2.0,), "lengths": (64, 128), "finetune_steps": 4, "finetune_lr": 1e-2,
        "finetune_window": 32, "finetune_positions": ("pose",), **TINY, "trials": 1, "depths": (0.5,),
    }
    return ExtendConfig(model=str(folder), corpus=str(corpus), **{**settings, **kwargs})


def test_hf_finetune_interrupted_and_resumed_equals_an_uninterrupted_one(corpus, tmp_path, monkeypatch):
    _needs_extend_context()
    folder = _hf_folder(tmp_path / "llama")
    cfg = _hf_cfg(folder, corpus)
    whole = run_extend(cfg, tmp_path / "whole", progress=False)
    run = "runs/finetune-yarn-x2-ft4-pose"
    assert [s for s, _ in read_losses(tmp_path / "whole" / run)] == [1, 2, 3, 4]  # one line per step
    assert (tmp_path / "whole" / "finetune.png").is_file()

    check = train_module._check_batch

    def ctrl_c_at_step_2(batch, step):
        if step == 2:
            os.kill(os.getpid(), signal.SIGINT)  # the loop finishes the step, checkpoints, then stops
        return check(batch, step)

    monkeypatch.setattr(train_module, "_check_batch", ctrl_c_at_step_2)
    with pytest.raises(KeyboardInterrupt):
        run_extend(cfg, tmp_path / "cut", progress=False)
    _, header = read_checkpoint(tmp_path / "cut" / run / "checkpoint.safetensors")
    assert header["step"] == 3 and not (tmp_path / "cut" / run / "done.json").exists()
    monkeypatch.setattr(train_module, "_check_batch", check)
    resumed = run_extend(cfg, tmp_path / "cut", resume=True, progress=False)

    final = [read_checkpoint(tmp_path / d / run / "checkpoint.safetensors")[0] for d in ("whole", "cut")]
    weights = [k for k in final[0] if k.startswith("model.")]
    assert weights and all(torch.equal(final[0][k], final[1][k]) for k in weights)
    key = lambda r: (r["metric"], r["method"], r["finetune_steps"], r["length"], r["depth"])  # noqa: E731
    assert {key(r): r["ppl"] for r in whole} == {key(r): r["ppl"] for r in resumed}
    assert read_losses(tmp_path / "whole" / run) == read_losses(tmp_path / "cut" / run)


def test_hf_save_writes_the_finetuned_model(corpus, tmp_path):
    _needs_extend_context()
    transformers = pytest.importorskip("transformers")
    folder = _hf_folder(tmp_path / "llama")
    cfg = _hf_cfg(folder, corpus, finetune_positions=("random",))
    run_extend(cfg, tmp_path / "out", progress=False, save=tmp_path / "saved")
    saved = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "saved")
    original = transformers.AutoModelForCausalLM.from_pretrained(folder)
    assert saved.config.rope_parameters["rope_type"] == "yarn"
    weights, tuned = read_checkpoint(
        tmp_path / "out" / "runs" / "finetune-yarn-x2-ft4-random" / "checkpoint.safetensors"
    )
    for name, value in saved.state_dict().items():
        assert torch.equal(value, weights[f"model.model.{name}"]), name  # the fine-tuned weights, as trained
    assert not torch.equal(saved.state_dict()["lm_head.weight"], original.state_dict()["lm_head.weight"])


# ---------------------------------------------------------------------------------------------------------------------
# Bad input: refused before any weight loads


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"finetune_window": 16}, r"^finetune_window=16 is invalid: .*left out unless finetune_steps"),
        ({"finetune_positions": ("pose",)}, r"^finetune_positions=\('pose',\) is invalid: .*left out unless"),
        ({"finetune_steps": 2, "finetune_positions": ("pose",)}, r"^finetune_positions=\['pose'\] .*--finetune-window"),
        ({"finetune_steps": 2, "finetune_positions": ("skip",)}, r"^finetune_positions='skip' is invalid"),
        ({"finetune_steps": 2, "finetune_positions": ("pose", "pose")}, r"^finetune_positions=.* each kind once"),
        ({"finetune_steps": 2, "finetune_positions": ()}, r"^finetune_positions=\(\) is invalid"),
        ({"finetune_steps": 2, "finetune_window": 0}, r"^finetune_window=0 is invalid"),
        ({"finetune_steps": 2, "dtype": "bfloat16"}, r"^dtype='bfloat16' is invalid: expected float32"),
    ],
)
def test_bad_finetune_settings_are_refused_by_the_config(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ExtendConfig(model="smollm2", **kwargs)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"finetune_window": 65}, r"^finetune_window=65 is invalid: expected at most the shortest target context, 64"),
        (
            {"finetune_window": 64, "finetune_positions": ("random",)},
            r"^finetune_window=64 is invalid: expected a window shorter than the target 64",
        ),
        ({"finetune_window": 32, "finetune_corpus": "tiny.txt"}, r"^finetune_corpus=.*at least 33 tokens"),
    ],
)
def test_a_window_the_targets_or_the_text_cannot_hold_is_refused_before_loading(
    rope_run, corpus, tmp_path, monkeypatch, kwargs, match
):
    (tmp_path / "tiny.txt").write_text("short text\n")
    if "finetune_corpus" in kwargs:
        kwargs = {**kwargs, "finetune_corpus": str(tmp_path / "tiny.txt")}
    cfg = ExtendConfig(model=str(rope_run), methods=("yarn",), factors=(2.0,), lengths=(ORIGINAL, 64),
                       corpus=str(corpus), finetune_steps=2, **kwargs, **TINY)
    with pytest.raises(ValueError, match=match):
        run_extend(cfg, tmp_path / "out", progress=False)
    assert not (tmp_path / "out" / "results.csv").exists()


def test_finetuning_on_the_evaluation_text_itself_is_refused(rope_run, corpus, tmp_path):
    cfg = ExtendConfig(model=str(rope_run), methods=("yarn",), factors=(2.0,), lengths=(ORIGINAL, 64),
                       corpus=str(corpus), finetune_steps=2, finetune_corpus=str(corpus), **TINY)
    with pytest.raises(ValueError, match=r"^finetune_corpus=.*a text other than --corpus"):
        run_extend(cfg, tmp_path / "out", progress=False)


def test_save_of_several_finetuned_models_is_refused_before_loading(corpus, tmp_path):
    _needs_extend_context()
    folder = _hf_folder(tmp_path / "llama")
    cfg = _hf_cfg(folder, corpus, finetune_positions=("plain", "pose"))
    with pytest.raises(ValueError, match=r"^save=.*exactly one of --finetune-positions"):
        run_extend(cfg, tmp_path / "out", progress=False, save=tmp_path / "saved")
    assert not (tmp_path / "saved").exists() and not (tmp_path / "out" / "results.csv").exists()


def test_a_finetune_that_does_not_fit_in_memory_is_refused_before_loading(corpus, tmp_path, monkeypatch):
    _needs_extend_context()
    from posenc.lab.extend.study import plan
    from posenc.lab.extend.targets.hf import HFTarget

    folder = _hf_folder(tmp_path / "llama")
    loads = []
    monkeypatch.setattr(HFTarget, "load", lambda self: loads.append(1))
    need = plan.finetune_memory_needed  # the forward alone fits; the fine-tune's grads, Adam and activations do not
    monkeypatch.setattr(
        plan, "available_memory", lambda device: int(need(*_dims(folder), 32, weight_bytes=4)["total"]) - 1
    )
    with pytest.raises(ValueError, match=r"^finetune_window=32 is invalid: .*fits in memory.*--finetune-window"):
        run_extend(_hf_cfg(folder, corpus), tmp_path / "out", progress=False)
    assert not loads


def _dims(folder: Path) -> tuple:
    import transformers

    from posenc.lab.extend.targets.cost import ModelDims

    config = transformers.AutoConfig.from_pretrained(folder)
    with torch.device("meta"):
        params = sum(p.numel() for p in transformers.AutoModelForCausalLM.from_config(config).parameters())
    return (ModelDims.of(config, params),)


def test_cli_refuses_finetune_positions_without_steps_in_one_line(capsys):
    from posenc.cli import main

    code = main(["extend", "smollm2", "--finetune-positions", "pose", "--out", "unused-out"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("posenc extend: finetune_positions=('pose',) is invalid: expected left out unless")
    assert not Path("unused-out").exists()


def test_pose_positions_with_a_remapping_method_are_refused_before_loading(corpus, tmp_path):
    _needs_extend_context()
    folder = _hf_folder(tmp_path / "llama")
    cfg = _hf_cfg(folder, corpus, methods=("self_extend",))
    with pytest.raises(ValueError, match=r"^finetune_positions=\['pose'\] is invalid: expected 'plain' for remapping"):
        run_extend(cfg, tmp_path / "out", progress=False)


# ---------------------------------------------------------------------------------------------------------------------
# ALiBi: a transformers ALiBi model takes no position ids (refused); a lab ALiBi model reads them (allowed)


def _bloom_folder(folder: Path) -> Path:
    pytest.importorskip("transformers")
    from hf.tiny import tiny_model
    from lab.extend.needles.test_passkey import byte_bpe_tokenizer

    tokenizer = byte_bpe_tokenizer(folder)
    tiny_model("bloom", vocab_size=len(tokenizer)).save_pretrained(folder)
    return folder


@pytest.fixture
def no_weights(monkeypatch):
    """Any weight read fails the test: the refusal must come before the load."""
    from posenc.lab.extend.targets.hf import HFTarget

    def load(self):
        raise AssertionError("weights were loaded before the settings were refused")

    monkeypatch.setattr(HFTarget, "load", load)


ALIBI_REFUSAL = (
    "is invalid: expected --finetune-positions plain for an ALiBi model (bloom): ALiBi models take no position ids "
    "(their bias depends only on the token distance), so PoSE's skipped positions and random ones cannot reach them"
)


@pytest.mark.parametrize("kind", ["bloom", "mpt"])
def test_transformers_alibi_models_drop_position_ids(kind):
    """Why they are refused: the logits at PoSE's skipped positions are bit for bit those at 0..S-1 (if a
    transformers release starts reading position_ids, this fails and the refusal must go)."""
    pytest.importorskip("transformers")
    from hf.tiny import logits, tiny_model

    model = tiny_model(kind)
    ids = torch.randint(0, 64, (1, 16), generator=torch.Generator().manual_seed(0))
    skipped = torch.cat([torch.arange(8), torch.arange(40, 48)])[None]  # (1, 16)
    assert torch.equal(logits(model, ids, position_ids=skipped), logits(model, ids))


@pytest.mark.parametrize("positions", ["pose", "random", "plain,pose,random"])
def test_cli_refuses_pose_and_random_for_a_transformers_alibi_model_in_one_line(
    positions, corpus, tmp_path, capsys, no_weights
):
    """BLOOM accepts position_ids and drops them: a PoSE or random fine-tune would be a plain one (bit for bit)."""
    folder = _bloom_folder(tmp_path / "bloom")
    capsys.readouterr()  # transformers' bar while writing the folder
    from posenc.cli import main

    out = tmp_path / "out"
    code = main([
        "extend", str(folder), "--corpus", str(corpus), "--device", "cpu", "--original-len", "32", "--lengths",
        "32,64", "--factors", "2", "--finetune-steps", "2", "--finetune-window", "16", "--finetune-positions",
        positions, "--out", str(out),
    ])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    listed = positions.split(",")
    assert err.startswith(f"posenc extend: finetune_positions={listed!r} {ALIBI_REFUSAL}"), err
    assert "use plain fine-tuning" in err
    assert not out.exists()


def test_library_refuses_pose_and_random_for_a_transformers_alibi_model(corpus, tmp_path, no_weights):
    folder = _bloom_folder(tmp_path / "bloom")
    settings = dict(model=str(folder), corpus=str(corpus), original_len=32, methods=("linear",), factors=(2.0,),
                    lengths=(32, 64), finetune_steps=2, finetune_window=16, **{**TINY, "depths": (0.5,)})
    cfg = ExtendConfig(**settings, finetune_positions=("random",))
    with pytest.raises(ValueError, match="^" + re.escape(f"finetune_positions=['random'] {ALIBI_REFUSAL}")):
        run_extend(cfg, tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()

    # The target's own fine-tune (which builds the batches) refuses too, before it reads a batch or the model.
    from posenc.lab.extend.targets.hf import HFTarget

    target = HFTarget(ExtendConfig(**settings), tmp_path / "out", "cpu", False)
    for kind in ("pose", "random"):
        with pytest.raises(ValueError, match=rf"^finetune_positions=\['{kind}'\] is invalid: .*ALiBi model"):
            target.finetune(None, "linear-x2-ft2", 64, kind)
    assert not (tmp_path / "out").exists()


def test_a_lab_alibi_model_reads_its_positions_so_pose_stays_allowed(corpus, tmp_path, monkeypatch):
    """A lab GPT's ALiBi bias is -m (i - j) of the positions it is given: a PoSE skip changes what it computes (a
    shift of every position does not), so pose and random fine-tuning are meaningful there and not refused."""
    alibi_run = _lab_run(tmp_path / "alibi", "alibi", corpus, steps=5)
    from posenc.lab.common.train import load_model

    model = load_model(alibi_run, device="cpu").eval()
    tokens = torch.randint(0, 256, (1, 16), generator=torch.Generator().manual_seed(0))
    plain = torch.arange(16)
    skipped = torch.cat([torch.arange(8), torch.arange(40, 48)])  # PoSE: two chunks, the second 32 further on
    with torch.no_grad():
        at_plain, shifted, at_pose = (model(tokens, p) for p in (plain, plain + 100, skipped))
    assert torch.equal(shifted, at_plain)  # distances alone matter: integer differences, the same float ops
    assert torch.equal(at_pose[0, :8], at_plain[0, :8])  # the first chunk: the same positions, causal
    # The second chunk's queries see the first chunk 32 further away; were positions ignored, these logits would be
    # the plain ones bit for bit (equal distances give equal bits, as the shift shows).
    assert not torch.equal(at_pose[0, 8:], at_plain[0, 8:])

    seen: list[int] = []
    forward = GPT.forward

    def spy(self, tokens, positions=None):
        if self.training:
            seen.append(int(positions.max()))
        return forward(self, tokens, positions)

    monkeypatch.setattr(GPT, "forward", spy)
    cfg = ExtendConfig(model=str(alibi_run), methods=("linear",), factors=(4.0,), lengths=(ORIGINAL, 128),
                       corpus=str(corpus), finetune_steps=1, finetune_window=16, finetune_positions=("pose",),
                       **{**TINY, "trials": 1, "depths": (0.5,)})
    rows = run_extend(cfg, tmp_path / "out", progress=False)
    assert {r["finetune_positions"] for r in rows if r["finetune_steps"]} == {"pose"}
    assert seen and max(seen) >= 16  # the fine-tune's positions went past its 16-byte window


def test_a_study_written_before_finetune_positions_existed_resumes(rope_run, corpus, tmp_path):
    """Its results.csv has no finetune_positions column and its extend.json none of the fine-tuning window
    settings: resume reads the rows as plain positions and measures nothing again."""
    cfg = ExtendConfig(model=str(rope_run), methods=("yarn",), factors=(2.0,), lengths=(ORIGINAL, 64),
                       corpus=str(corpus), finetune_steps=2, **{**TINY, "depths": (0.5,)})
    out = tmp_path / "out"
    rows = run_extend(cfg, out, progress=False)
    settings = json.loads((out / "extend.json").read_text())
    assert not {"finetune_window", "finetune_positions", "finetune_corpus"} & set(settings)  # defaults left out
    lines = (out / "results.csv").read_text().splitlines()
    column = lines[0].split(",").index("finetune_positions")
    old = [",".join(c for i, c in enumerate(line.split(",")) if i != column) for line in lines]  # the older layout
    (out / "results.csv").write_text("\n".join(old) + "\n")
    before = (out / "results.csv").stat().st_mtime_ns
    again = run_extend(cfg, out, resume=True, progress=False)
    key = lambda r: (r["metric"], r["method"], r["finetune_steps"], r["finetune_positions"], r["length"], r["depth"])  # noqa: E731
    assert {key(r): r["ppl"] for r in again} == {key(r): r["ppl"] for r in rows}
    assert (out / "results.csv").stat().st_mtime_ns == before  # nothing measured, nothing written


def test_resume_with_a_setting_left_out_names_it(rope_run, corpus, tmp_path):
    cfg = ExtendConfig(model=str(rope_run), methods=("yarn",), factors=(2.0,), lengths=(ORIGINAL, 64),
                       corpus=str(corpus), finetune_steps=2, finetune_window=16, **{**TINY, "depths": (0.5,)},
                       )
    run_extend(cfg, tmp_path / "out", progress=False)
    plain = ExtendConfig(**{**cfg.to_dict(), "finetune_window": None})
    with pytest.raises(ValueError, match=r"these differ: \['finetune_window'\]"):
        run_extend(plain, tmp_path / "out", resume=True, progress=False)
