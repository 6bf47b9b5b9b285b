"""DroPE in ``posenc extend`` (issue 50, point 1): ``--methods drope`` is measured once (no factor, labelled
``drope``), zero-shot as the "dropped without recalibration" ablation, and with ``--finetune-steps N`` recalibrated
as its authors do (plain LM loss, every parameter, plain positions, windows of at most the original context);
``--save`` writes the recalibrated model through ``posenc.hf.save_pretrained``, which ``load_causal_lm`` reloads as
DroPE. A tiny transformers Llama (original context 64) and a tiny lab GPT (DroPE in miniature: RoPE dropped, the
model recalibrated at its training length)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import posenc
from lab.extend.study.test_study import ORIGINAL, TINY, _cli, _hf_folder, _lab_run, _needs_extend_context
from posenc.lab.common.checkpoint import read_checkpoint
from posenc.lab.extend.settings.config import ExtendConfig, unit_factors
from posenc.lab.extend.settings.labels import label
from posenc.lab.extend.study.run import _units, run_extend

pytestmark = pytest.mark.usefixtures("one_thread")
HF_ORIGINAL = 64  # _hf_folder's max_position_embeddings


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> Path:
    _needs_extend_context()
    return _hf_folder(tmp_path_factory.mktemp("llama"))


def _cfg(folder: Path, corpus: Path, **kwargs) -> ExtendConfig:
    settings = {"methods": ("drope",), "factors": (2.0,), "lengths": (64, 128), **TINY, "trials": 1,
                "depths": (0.5,)}
    return ExtendConfig(model=str(folder), corpus=str(corpus), **{**settings, **kwargs})


# ---------------------------------------------------------------------------------------------------------------------
# The grid: drope once, at factor 1, whatever --factors says


def test_drope_is_one_model_labelled_drope_whatever_the_factors():
    cfg = ExtendConfig(model="smollm2", methods=("yarn", "drope"), factors=(2.0, 4.0), finetune_steps=3)
    assert unit_factors(cfg, "drope") == (1.0,) and unit_factors(cfg, "yarn") == (2.0, 4.0)
    assert _units(cfg, cfg.methods, "hf") == [
        ("none", 1.0, 0, "plain"), ("yarn", 2.0, 0, "plain"), ("yarn", 4.0, 0, "plain"), ("drope", 1.0, 0, "plain"),
        ("yarn", 2.0, 3, "plain"), ("yarn", 4.0, 3, "plain"), ("drope", 1.0, 3, "plain"),
    ]
    assert label("drope", 1.0, 0) == "drope" and label("drope", 1.0, 3) == "drope +ft3"
    ExtendConfig(model="smollm2", methods=("drope",), factors=(8.0,))  # the factor still sets the default lengths


def test_a_drope_study_takes_factor_1_for_its_control_at_the_original_context():
    """With drope alone the factors only set where `none` is fine-tuned (lab models): 1 is the original context, the
    recalibration's control (RoPE trained as long on the same windows). Beside a frequency method 1 stays refused."""
    cfg = ExtendConfig(model="smollm2", methods=("drope",), factors=(1,), finetune_steps=3)
    assert _units(cfg, cfg.methods, "lab") == [
        ("none", 1.0, 0, "plain"), ("drope", 1.0, 0, "plain"), ("none", 1.0, 3, "plain"), ("drope", 1.0, 3, "plain"),
    ]
    assert label("none", 1.0, 3) == "none +ft3"
    with pytest.raises(ValueError, match=r"^factors=1 is invalid: expected a factor > 1 for yarn"):
        ExtendConfig(model="smollm2", methods=("drope", "yarn"), factors=(1,))


def test_a_layer_type_drope_would_ignore_is_refused():
    """Nothing the user gives is silently dropped: a layer type other than all (DroPE drops RoPE from every layer)."""
    for layer_type in ("full_attention", "sliding_attention"):
        with pytest.raises(ValueError, match=f"layer_type='{layer_type}' is invalid: expected None or 'all' with"):
            ExtendConfig(model="smollm2", methods=("yarn", "drope"), layer_type=layer_type)
    ExtendConfig(model="smollm2", methods=("yarn", "drope"), layer_type="all")
    ExtendConfig(model="smollm2", methods=("yarn", "drope"), factors=(8.0,))  # the factor is yarn's


def test_pose_or_random_positions_with_drope_are_refused_naming_why():
    for kind in ("pose", "random"):
        with pytest.raises(ValueError, match=r"^finetune_positions=.* expected 'plain' with method 'drope': .*no "
                           "position id reaches attention"):
            ExtendConfig(model="smollm2", methods=("yarn", "drope"), finetune_steps=2, finetune_window=16,
                         finetune_positions=("plain", kind))


def test_a_window_beyond_the_original_context_is_refused_for_drope_before_loading(llama, corpus, tmp_path,
                                                                                   monkeypatch):
    from posenc.lab.extend.targets.hf import HFTarget

    loads = []
    monkeypatch.setattr(HFTarget, "load", lambda self: loads.append(1))
    cfg = _cfg(llama, corpus, methods=("yarn", "drope"), finetune_steps=2, finetune_window=HF_ORIGINAL + 1)
    match = rf"^finetune_window={HF_ORIGINAL + 1} is invalid: expected at most the original context, {HF_ORIGINAL}, "
    with pytest.raises(ValueError, match=match + "with method 'drope': DroPE is recalibrated at the context"):
        run_extend(cfg, tmp_path / "out", progress=False)
    assert not loads and not (tmp_path / "out" / "results.csv").exists()


def test_the_plan_says_zero_shot_drope_is_not_the_authors_and_where_it_is_recalibrated(llama, corpus, tmp_path,
                                                                                        capsys):
    cfg = _cfg(llama, corpus, methods=("yarn", "drope"))
    run_extend(cfg, tmp_path / "zero", progress=False, plan_only=True)
    text = " ".join(capsys.readouterr().out.split())
    assert "3 models (none, yarn x2, drope)" in text, text
    assert "zero-shot drope is RoPE dropped without recalibration (an ablation), not DroPE as its authors" in text
    run_extend(_cfg(llama, corpus, finetune_steps=2), tmp_path / "tuned", progress=False, plan_only=True)
    text = " ".join(capsys.readouterr().out.split())
    assert "drope +ft2" in text and f"(drope: recalibrated at the original context, {HF_ORIGINAL} tokens" in text
    assert not (tmp_path / "zero").exists() and not (tmp_path / "tuned").exists()


# ---------------------------------------------------------------------------------------------------------------------
# End to end on a tiny transformers Llama


def test_yarn_and_drope_recalibrated_at_the_original_context_end_to_end(llama, corpus, tmp_path):
    cfg = _cfg(llama, corpus, methods=("yarn", "drope"), finetune_steps=2, finetune_lr=1e-2)
    rows = run_extend(cfg, tmp_path / "out", progress=False)
    models = {(r["method"], r["factor"], r["finetune_steps"], r["finetune_positions"]) for r in rows}
    assert models == {("none", 1.0, 0, "plain"), ("yarn", 2.0, 0, "plain"), ("drope", 1.0, 0, "plain"),
                      ("yarn", 2.0, 2, "plain"), ("drope", 1.0, 2, "plain")}
    ppl = {(r["method"], r["finetune_steps"], r["length"]): r["ppl"] for r in rows if r["metric"] == "ppl"}
    assert all(v is not None and v > 0 for v in ppl.values())
    assert ppl[("drope", 0, 128)] != ppl[("none", 0, 128)]  # RoPE really dropped
    assert ppl[("drope", 2, 128)] != ppl[("drope", 0, 128)]  # and recalibrated
    run = tmp_path / "out" / "runs" / "finetune-drope-ft2"
    described = json.loads((run / "config.json").read_text())["model"]
    assert described["target"] == HF_ORIGINAL and described["window"] == HF_ORIGINAL  # the original context
    assert described["positions"] == "plain"
    yarn = json.loads((tmp_path / "out" / "runs" / "finetune-yarn-x2-ft2" / "config.json").read_text())["model"]
    assert yarn["target"] == yarn["window"] == 2 * HF_ORIGINAL  # the other methods as before
    report = " ".join((tmp_path / "out" / "report.md").read_text().split())
    assert "(drope once: it has no factor)" in report
    assert "`drope +ft2` is it recalibrated as its authors do" in report and "64-token windows" in report
    assert "zero-shot drope is RoPE dropped without recalibration (an ablation)" in report
    table = (tmp_path / "out" / "results.csv").read_text()
    assert "drope,1.0,2,plain" in table


def test_save_writes_the_recalibrated_model_and_load_causal_lm_reloads_it_with_identical_logits(llama, corpus,
                                                                                                tmp_path):
    from posenc.hf import extend_context, load_causal_lm
    from posenc.hf._drope_patch import dropped

    cfg = _cfg(llama, corpus, factors=(2.0, 4.0), finetune_steps=2, finetune_lr=1e-2, finetune_window=48)
    run_extend(cfg, tmp_path / "out", progress=False, save=tmp_path / "saved")
    reloaded, _ = load_causal_lm(tmp_path / "saved")
    assert dropped(reloaded)  # the record re-applied DroPE
    rebuilt, _ = load_causal_lm(llama)  # the study's recalibrated model: DroPE on the source, the fine-tuned weights
    extend_context(rebuilt, "drope")
    weights, _ = read_checkpoint(tmp_path / "out" / "runs" / "finetune-drope-ft2" / "checkpoint.safetensors")
    rebuilt.load_state_dict({k.removeprefix("model.model."): v for k, v in weights.items() if k.startswith("model.")})
    source, _ = load_causal_lm(llama)
    x = torch.arange(3, 3 + 100)[None] % reloaded.config.vocab_size  # (1, 100): past the original context
    with torch.inference_mode():
        got, want, plain = (m.eval()(input_ids=x).logits for m in (reloaded, rebuilt, source))
    assert torch.equal(got, want)
    assert not torch.allclose(got, plain)
    for name, value in reloaded.state_dict().items():
        assert torch.equal(value, weights[f"model.model.{name}"]), name  # the recalibrated weights, as trained


@pytest.mark.parametrize(
    ("kwargs", "save", "match"),
    [
        (
            {},
            "saved",
            r"^save=.* expected --finetune-steps N with --methods drope: RoPE dropped without "
            "recalibration is not a DroPE model",
        ),
        ({"finetune_steps": 2}, "saved.gguf", r"^save=.* no GGUF key turns RoPE off in every layer"),
        ({"methods": ("yarn", "drope"), "finetune_steps": 2}, "saved", r"^save=.* exactly one method and one factor"),
    ],
)
def test_save_of_drope_without_recalibration_or_to_gguf_is_refused_before_loading(
    llama, corpus, tmp_path, monkeypatch, kwargs, save, match
):
    from posenc.lab.extend.targets.hf import HFTarget

    monkeypatch.setattr(HFTarget, "load", lambda self: pytest.fail("weights were read"))
    with pytest.raises(ValueError, match=match):
        run_extend(_cfg(llama, corpus, **kwargs), tmp_path / "out", progress=False, save=tmp_path / save)
    assert not (tmp_path / save).exists() and not (tmp_path / "out" / "results.csv").exists()


# ---------------------------------------------------------------------------------------------------------------------
# Refused elsewhere: a lab model, --pick, posenc export


def test_a_lab_rope_model_is_dropped_and_recalibrated_at_its_original_context(tmp_path, corpus):
    """DroPE in miniature (issue 50, point 2): a lab GPT trained with RoPE, RoPE dropped from every layer (the model
    is then a NoPE one with the same weights), recalibrated in windows of its training length."""
    run = _lab_run(tmp_path / "rope", "rope", corpus, steps=2)
    cfg = ExtendConfig(model=str(run), methods=("drope",), factors=(2.0,), lengths=(ORIGINAL, 64), corpus=str(corpus),
                       finetune_steps=2, finetune_lr=1e-2, **TINY)
    rows = run_extend(cfg, tmp_path / "out", progress=False)
    ppl = {(r["method"], r["finetune_steps"], r["length"]): r["ppl"] for r in rows if r["metric"] == "ppl"}
    units = (("none", 0), ("none", 2), ("drope", 0), ("drope", 2))  # none +ft2: RoPE trained as long, the control
    assert set(ppl) == {(m, n, length) for m, n in units for length in (ORIGINAL, 64)}
    assert ppl[("drope", 0, 64)] != ppl[("none", 0, 64)] and ppl[("drope", 2, 64)] != ppl[("drope", 0, 64)]
    trained = json.loads((tmp_path / "out" / "runs" / "finetune-drope-ft2" / "config.json").read_text())["train"]
    assert trained["length"] == ORIGINAL  # recalibrated in windows of the training length
    report = " ".join((tmp_path / "out" / "report.md").read_text().split())
    assert "RoPE dropped from every layer (`model.set_encoding(posenc.build('nope'))`)" in report
    # zero-shot drope is the trained weights with a NoPE encoding: its perplexity is that model's
    from posenc.lab.extend.targets.lab import LabTarget

    target = LabTarget(cfg, tmp_path / "again", "cpu", progress=False)
    dropped, description = target.patched("drope", 1.0)
    assert type(dropped.encoding).__name__ == "NoPE" and description["encoding"] == {"name": "nope"}
    assert type(target.model.encoding).__name__ == "RotaryEmbedding"  # the target's own model keeps RoPE
    nope = target.copy()
    nope.set_encoding(posenc.build("nope"))
    x = torch.randint(0, 256, (2, 64), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(dropped(x), nope(x), rtol=0, atol=0)


def test_a_lab_passkey_model_is_recalibrated_on_its_task_and_the_report_says_so_not_plain_lm(tmp_path):
    """A lab model studied with --task passkey is fine-tuned on passkey rows (the loss on the key's digits), not on
    text: the report must not call that the authors' plain LM loss, in the DroPE sentence or the fine-tuning one."""
    cfg = ExtendConfig(model="new", task="passkey", train_len=104, train_steps=1, methods=("drope",), factors=(1.0,),
                       lengths=(104, 208), finetune_steps=1, **{**TINY, "depths": (0.5,)})
    rows = run_extend(cfg, tmp_path / "out", progress=False)
    assert {(r["method"], r["finetune_steps"]) for r in rows} == {("none", 0), ("none", 1), ("drope", 0), ("drope", 1)}
    report = " ".join((tmp_path / "out" / "report.md").read_text().split())
    assert "`drope +ft1` is it recalibrated on the task the model was trained on, not as its authors do" in report
    assert "plain LM loss on every parameter" not in report and "text: the training split" not in report
    assert "trained 1 steps on passkey rows in windows of the target length" in report


def test_a_lab_model_without_rope_refuses_drope_clearly(tmp_path, corpus):
    run = _lab_run(tmp_path / "alibi", "alibi", corpus, steps=2)
    cfg = ExtendConfig(model=str(run), methods=("drope",), factors=(2.0,), lengths=(ORIGINAL, 64), corpus=str(corpus),
                       **TINY)
    with pytest.raises(ValueError, match=r"^methods='drope' is invalid: expected a method of this lab model: DroPE"):
        run_extend(cfg, tmp_path / "out", progress=False)
    assert not (tmp_path / "out" / "results.csv").exists()


def test_pick_and_export_still_refuse_drope(llama, corpus, tmp_path):
    from posenc.lab.extend.pick.run import run_pick

    cfg = ExtendConfig(model=str(llama), methods=("drope",), corpus=str(corpus), device="cpu")
    with pytest.raises(ValueError, match=r"^methods='drope' is invalid: expected a method --pick races"):
        run_pick(cfg, 128, tmp_path / "pick", progress=False)
    code, text = _cli("export", str(llama), "--method", "drope", "--factor", "2", "--save", str(tmp_path / "f"))
    assert code == 2 and "nothing to export before that fine-tune" in text and "--finetune-steps N --save DIR" in text
    assert not (tmp_path / "f").exists()


def test_cli_runs_drope_with_yarn_at_a_factor(llama, corpus, tmp_path):
    code, text = _cli("extend", str(llama), "--corpus", str(corpus), "--lengths", "64,128", "--methods", "yarn,drope",
                      "--factors", "2", "--depths", "0.5", "--trials", "1", "--device", "cpu", "--eval-tokens", "256",
                      "--out", str(tmp_path / "out"), "--quiet")
    assert code == 0, text
    methods = {(r["method"], r["factor"]) for r in run_rows(tmp_path / "out")}
    assert methods == {("none", 1.0), ("yarn", 2.0), ("drope", 1.0)}


def run_rows(out: Path) -> list[dict]:
    from posenc.lab.extend.study.run import read_results

    return read_results(out / "results.csv")
